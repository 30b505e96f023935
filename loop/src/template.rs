//! Chat templates in the loop: a turn given as a templated prompt becomes its dialogue, and every
//! response loses the end-of-turn tokens its template ends it with, before the profile's format
//! check and the judge see it. The table of families is `care_core::template`; this module
//! applies the configuration (`chat_template`, `end_suffixes`) and reports what it did.
//!
//! * The dialogue: a turn's `context` when it has one, else its `prompt` read with the family the
//!   configuration names (`auto`: the one whose turn marker the prompt shows). A prompt that is
//!   not templated (`plain`), or that shows a family's markers but does not follow its template
//!   (`unrecognised`, a half-templated or nested prompt), is one user message, as with
//!   `chat_template: "none"` (`off`); the turn's `template` member and the
//!   `care_prompt_templates_total` metric say which.
//! * The responses: the family of a parsed (or configured) template loses its tokens; without a
//!   known family (`auto` and no templated prompt) every family's; under `none` only the extra
//!   `end_suffixes`. What was removed is the response's `stripped` member, verbatim.

use care_core::template::{
    ChatRole, ChatTurn, MAX_PROMPT_BYTES, MAX_PROMPT_MESSAGES, TemplateChoice, TemplateFamily,
    check_end_suffixes, detect_template, parse_prompt, strip_end_tokens,
};
use serde::Serialize;

use crate::llm::ChatMessage;
use crate::metrics::Metrics;

/// How a turn's prompt was read (`template` in a result line).
pub mod template_status {
    /// Read with the template of `family`: the dialogue is its messages.
    pub const PARSED: &str = "parsed";
    /// No family's turn marker: not a templated prompt; one user message.
    pub const PLAIN: &str = "plain";
    /// A family's markers, but not its template (half-templated, nested, or ending with the
    /// assistant): one user message, as without templates.
    pub const UNRECOGNISED: &str = "unrecognised";
    /// `chat_template: "none"`: one user message.
    pub const OFF: &str = "off";
}

/// What reading a turn's prompt found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TemplateOut {
    /// The family read (or tried, for `unrecognised`); `null` for `plain` and `off`.
    pub family: Option<&'static str>,
    /// `parsed`, `plain`, `unrecognised` or `off` ([`template_status`]).
    pub status: &'static str,
    /// Why an `unrecognised` prompt does not follow its template.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Whose end tokens a turn's responses lose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResponseTokens {
    /// Only the extra suffixes (`chat_template: "none"`).
    ExtraOnly,
    /// This family's (and the extra suffixes).
    Family(TemplateFamily),
    /// Every family's (no templated prompt told the family).
    Any,
}

impl ResponseTokens {
    fn families(&self) -> &[TemplateFamily] {
        match self {
            ResponseTokens::ExtraOnly => &[],
            ResponseTokens::Family(f) => std::slice::from_ref(f),
            ResponseTokens::Any => &TemplateFamily::ALL,
        }
    }

    fn label(self) -> &'static str {
        match self {
            ResponseTokens::ExtraOnly => "none",
            ResponseTokens::Family(f) => f.name(),
            ResponseTokens::Any => "any",
        }
    }
}

/// A turn's dialogue and how its responses are cut.
#[derive(Clone, Debug)]
pub struct TurnText {
    /// The dialogue (not yet checked: `Dialogue::new` does that).
    pub messages: Vec<ChatMessage>,
    /// What reading the prompt found (`None` without a prompt).
    pub template: Option<TemplateOut>,
    /// Whose end tokens the responses lose.
    pub tokens: ResponseTokens,
}

/// The loop's template settings, checked.
#[derive(Clone, Debug)]
pub struct Templates {
    choice: TemplateChoice,
    suffixes: Vec<String>,
}

impl Templates {
    /// Checks `chat_template` (a name) and `end_suffixes` (their count and lengths).
    ///
    /// # Errors
    /// A message naming the field and what it accepts.
    pub fn new(chat_template: &str, end_suffixes: &[String]) -> Result<Templates, String> {
        let choice = TemplateChoice::from_name(chat_template).ok_or_else(|| {
            format!(
                "chat_template {chat_template:?}: use {} or one of {}",
                TemplateChoice::KEYWORDS.join(", "),
                TemplateFamily::NAMES.join(", ")
            )
        })?;
        check_end_suffixes(end_suffixes).map_err(|e| format!("end_suffixes: {e}"))?;
        Ok(Templates {
            choice,
            suffixes: end_suffixes.to_vec(),
        })
    }

    /// The dialogue of a turn from its `context` or its templated `prompt`, and whose end
    /// tokens its responses lose; counts the prompt in `metrics`.
    ///
    /// # Errors
    /// Neither a context nor a prompt, or a prompt longer than [`MAX_PROMPT_BYTES`].
    pub fn read(
        &self,
        context: Vec<ChatMessage>,
        prompt: Option<&str>,
        metrics: &Metrics,
    ) -> Result<TurnText, String> {
        let default_tokens = match self.choice {
            TemplateChoice::Auto => ResponseTokens::Any,
            TemplateChoice::Off => ResponseTokens::ExtraOnly,
            TemplateChoice::Family(f) => ResponseTokens::Family(f),
        };
        let Some(prompt) = prompt else {
            if context.is_empty() {
                return Err(
                    "give the dialogue: context (chat messages ending with the seeker's turn) or prompt (a chat-templated prompt)"
                        .to_owned(),
                );
            }
            return Ok(TurnText {
                messages: context,
                template: None,
                tokens: default_tokens,
            });
        };
        if prompt.len() > MAX_PROMPT_BYTES {
            return Err(format!(
                "prompt has {} bytes; at most {MAX_PROMPT_BYTES}",
                prompt.len()
            ));
        }
        let family = match self.choice {
            TemplateChoice::Off => None,
            TemplateChoice::Auto => detect_template(prompt),
            TemplateChoice::Family(f) => Some(f),
        };
        let (out, parsed, tokens) = match family {
            None => {
                let status = if self.choice == TemplateChoice::Off {
                    template_status::OFF
                } else {
                    template_status::PLAIN
                };
                let out = TemplateOut {
                    family: None,
                    status,
                    error: None,
                };
                (out, None, default_tokens)
            }
            Some(f) => match read_prompt(prompt, f) {
                Ok(m) => {
                    let out = TemplateOut {
                        family: Some(f.name()),
                        status: template_status::PARSED,
                        error: None,
                    };
                    (out, Some(m), ResponseTokens::Family(f))
                }
                Err(e) => {
                    let out = TemplateOut {
                        family: Some(f.name()),
                        status: template_status::UNRECOGNISED,
                        error: Some(e),
                    };
                    // The markers name the family: its tokens are the likely ones.
                    (out, None, ResponseTokens::Family(f))
                }
            },
        };
        metrics.prompt_template(out.family.unwrap_or("none"), out.status);
        let messages = if !context.is_empty() {
            context
        } else {
            parsed.unwrap_or_else(|| vec![ChatMessage::new("user", prompt)])
        };
        Ok(TurnText {
            messages,
            template: Some(out),
            tokens,
        })
    }

    /// `response` without the end tokens it ends with, and what was removed (`None` when
    /// nothing was); counts a removal in `metrics`.
    pub fn strip<'r>(
        &self,
        response: &'r str,
        tokens: ResponseTokens,
        metrics: &Metrics,
    ) -> (&'r str, Option<&'r str>) {
        let extra: Vec<&str> = self.suffixes.iter().map(String::as_str).collect();
        let s = strip_end_tokens(response, tokens.families(), &extra);
        if s.removed.is_empty() {
            (s.text, None)
        } else {
            metrics.response_stripped(tokens.label());
            (s.text, Some(s.removed))
        }
    }
}

/// The messages of a templated prompt of `family` that is a dialogue (it ends with the user's
/// turn), or why not.
fn read_prompt(prompt: &str, family: TemplateFamily) -> Result<Vec<ChatMessage>, String> {
    let mut turns = vec![ChatTurn::default(); MAX_PROMPT_MESSAGES];
    let n = parse_prompt(prompt, family, &mut turns).map_err(|e| e.to_string())?;
    let turns = turns.get(..n).unwrap_or(&[]);
    match turns.iter().rev().find(|t| t.role != ChatRole::System) {
        Some(t) if t.role == ChatRole::User => {}
        Some(_) => {
            return Err(
                "the prompt's last turn is the assistant's: a reward is for a reply to the user's turn"
                    .to_owned(),
            );
        }
        None => return Err("the prompt has no user turn".to_owned()),
    }
    Ok(turns
        .iter()
        .map(|t| ChatMessage::new(t.role.name(), t.content))
        .collect())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn m() -> Metrics {
        Metrics::new()
    }

    #[test]
    fn the_configuration_is_checked() {
        assert!(Templates::new("auto", &[]).is_ok());
        let e = Templates::new("qwen", &[]).unwrap_err();
        assert!(
            e.contains("chat_template \"qwen\"") && e.contains("chatml"),
            "{e}"
        );
        let e = Templates::new("auto", &[String::new()]).unwrap_err();
        assert!(e.starts_with("end_suffixes: end suffix 0"), "{e}");
    }

    #[test]
    fn a_prompt_is_read_as_configured() {
        let prompt = "<|im_start|>user\nI feel lost.<|im_end|>\n<|im_start|>assistant\n";
        let metrics = m();
        let auto = Templates::new("auto", &[]).unwrap();
        let t = auto.read(Vec::new(), Some(prompt), &metrics).unwrap();
        assert_eq!(t.messages, vec![ChatMessage::new("user", "I feel lost.")]);
        assert_eq!(t.template.unwrap().status, template_status::PARSED);
        assert_eq!(t.tokens, ResponseTokens::Family(TemplateFamily::ChatMl));
        // The wrong family: unrecognised, the prompt as one user message.
        let gemma = Templates::new("gemma", &[]).unwrap();
        let t = gemma.read(Vec::new(), Some(prompt), &metrics).unwrap();
        assert_eq!(t.messages, vec![ChatMessage::new("user", prompt)]);
        let out = t.template.unwrap();
        assert_eq!(
            (out.family, out.status),
            (Some("gemma"), template_status::UNRECOGNISED)
        );
        // Off: as without templates.
        let off = Templates::new("none", &[]).unwrap();
        let t = off.read(Vec::new(), Some(prompt), &metrics).unwrap();
        assert_eq!(t.messages, vec![ChatMessage::new("user", prompt)]);
        assert_eq!(t.tokens, ResponseTokens::ExtraOnly);
        // A prompt ending with the assistant's turn is no dialogue to reward.
        let ended = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n";
        let t = auto.read(Vec::new(), Some(ended), &metrics).unwrap();
        assert_eq!(t.template.unwrap().status, template_status::UNRECOGNISED);
        // A context wins over the prompt for the dialogue; the prompt still names the family.
        let ctx = vec![ChatMessage::new("user", "clean")];
        let t = auto.read(ctx.clone(), Some(prompt), &metrics).unwrap();
        assert_eq!(
            (t.messages, t.tokens),
            (ctx, ResponseTokens::Family(TemplateFamily::ChatMl))
        );
        assert!(
            auto.read(Vec::new(), None, &metrics)
                .unwrap_err()
                .contains("context")
        );
        let text = metrics.render();
        assert!(
            text.contains(r#"care_prompt_templates_total{family="chatml",status="parsed"} 2"#),
            "{text}"
        );
    }

    #[test]
    fn responses_lose_their_end_tokens_and_say_so() {
        let metrics = m();
        let t = Templates::new("auto", &["[DONE]".to_owned()]).unwrap();
        let r = "I hear you.<|im_end|>";
        assert_eq!(
            t.strip(r, ResponseTokens::Family(TemplateFamily::ChatMl), &metrics),
            ("I hear you.", Some("<|im_end|>"))
        );
        assert_eq!(t.strip(r, ResponseTokens::ExtraOnly, &metrics), (r, None));
        assert_eq!(
            t.strip("ok [DONE]", ResponseTokens::ExtraOnly, &metrics),
            ("ok", Some(" [DONE]"))
        );
        assert_eq!(
            t.strip("x</s>", ResponseTokens::Any, &metrics),
            ("x", Some("</s>"))
        );
        assert!(
            metrics
                .render()
                .contains(r#"care_responses_stripped_total{family="chatml"} 1"#)
        );
    }
}
