//! Chat templates for Python: the core's one table of template families
//! (`care_core::template`), so a reward computed in-process reads a templated prompt and strips
//! a response's end tokens exactly as `care serve` does.

use care_core::Error;
use care_core::template::{
    ChatTurn, MAX_PROMPT_MESSAGES, TemplateChoice, TemplateError, TemplateFamily,
    check_end_suffixes, detect_template, parse_prompt,
};
use pyo3::prelude::*;

use crate::error::{core_err, invalid};

/// A prompt read back: its family (`None` when it is not templated) and its `(role, content)`
/// messages.
type ReadPrompt = (Option<&'static str>, Vec<(&'static str, String)>);

fn choice(template: &str) -> PyResult<TemplateChoice> {
    TemplateChoice::from_name(template).ok_or_else(|| {
        invalid(format!(
            "template={template:?}: use {} or one of {}",
            TemplateChoice::KEYWORDS.join(", "),
            TemplateFamily::NAMES.join(", ")
        ))
    })
}

/// A template error as `CareError`: sizes are `capacity`, the rest `invalid_argument`; the
/// message says where and what (`template_mismatch` ...).
fn template_err(what: &str, e: TemplateError) -> PyErr {
    let kind = match e {
        TemplateError::TooLong { .. } | TemplateError::TooManyMessages { .. } => Error::Capacity,
        TemplateError::Malformed { .. } | TemplateError::BadEndSuffix { .. } => {
            Error::InvalidArgument
        }
    };
    core_err(&format!("{what}: {e} [{}]", e.code()), kind)
}

/// `read_prompt(prompt, template="auto") -> (family | None, [(role, content), ...])`.
///
/// `auto` reads the prompt with the family whose turn marker it shows; a prompt without any
/// gives `(None, [("user", prompt)])`, as `template="none"` always does. A prompt that shows a
/// family's markers but does not follow its template raises (`invalid_argument`, the message
/// says where), as do sizes over the caps (`capacity`).
#[pyfunction]
#[pyo3(signature = (prompt, template = "auto"))]
pub fn read_prompt(prompt: &str, template: &str) -> PyResult<ReadPrompt> {
    let family = match choice(template)? {
        TemplateChoice::Off => None,
        TemplateChoice::Auto => detect_template(prompt),
        TemplateChoice::Family(f) => Some(f),
    };
    let Some(family) = family else {
        return Ok((None, vec![("user", prompt.to_owned())]));
    };
    let mut turns = vec![ChatTurn::default(); MAX_PROMPT_MESSAGES];
    let n = parse_prompt(prompt, family, &mut turns).map_err(|e| template_err("read_prompt", e))?;
    let messages = turns
        .get(..n)
        .unwrap_or(&[])
        .iter()
        .map(|t| (t.role.name(), t.content.to_owned()))
        .collect();
    Ok((Some(family.name()), messages))
}

/// `strip_end_tokens(response, template="auto", extra=()) -> (text, removed)`: the response
/// without the run of end tokens it ends with (the family's; every family's for `auto`; only
/// `extra` for `none`) and what was removed.
#[pyfunction]
#[pyo3(signature = (response, template = "auto", extra = Vec::new()))]
pub fn strip_end_tokens(
    response: &str,
    template: &str,
    extra: Vec<String>,
) -> PyResult<(String, String)> {
    check_end_suffixes(&extra).map_err(|e| template_err("strip_end_tokens", e))?;
    let one;
    let families: &[TemplateFamily] = match choice(template)? {
        TemplateChoice::Auto => &TemplateFamily::ALL,
        TemplateChoice::Off => &[],
        TemplateChoice::Family(f) => {
            one = [f];
            &one
        }
    };
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let s = care_core::template::strip_end_tokens(response, families, &extra);
    Ok((s.text.to_owned(), s.removed.to_owned()))
}
