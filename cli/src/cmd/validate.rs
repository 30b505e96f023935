//! `care validate`: the format contract (SPEC §3) on generated rubrics.

use std::cell::RefCell;

use care_core::{FormatPolicy, SyntaxIndex, Validation, validate_indexed_into, validate_str_into};

use super::rubric::{Scratch, write_shape, write_violations};
use crate::input::Line;
use crate::json::{LineError, Obj};
use crate::scan;

/// Resolved options: the core's [`FormatPolicy`].
pub type Options = FormatPolicy;

/// The members of an input line (besides `id` and `meta`).
pub const MEMBERS: &[&str] = &["text"];

/// A line is `{"text": "<raw generator output>"}` (other members such as `id` allowed) or a
/// rubric object, validated as the line's own text. Writes `format_reward`, `violations` and,
/// when the text parsed, `weights` and `criteria`.
pub fn run(policy: &Options, line: &Line<'_>, o: &mut Obj<'_>) -> Result<(), LineError> {
    let text = match line.get("text") {
        Some(_) => line
            .string("text")
            .ok_or_else(|| LineError::schema("\"text\" must be a string"))?,
        None => line.text(),
    };
    write_validation(policy, text, None, o)
}

/// Validates the rubric `text` and writes what [`run`] documents; `index`: what the line's scan
/// learned about `text` when `text` is the line itself, so it is not scanned again.
fn write_validation(
    policy: &Options,
    text: &str,
    index: Option<&SyntaxIndex>,
    o: &mut Obj<'_>,
) -> Result<(), LineError> {
    // Decoding JSON escapes never makes a string longer, so the text's length always suffices.
    let mut scratch = Scratch::take(text.len());
    // Written in place: a `Validation` is kilobytes, and this runs once per line.
    let mut v = Validation::default();
    match index {
        Some(index) => {
            // The scan's index must say what the validator's own pass would (tests, fuzzing).
            debug_assert!(index.matches(text), "scan index disagrees on {text:?}");
            validate_indexed_into(text, index, policy, scratch.buf(), &mut v)?;
        }
        None => validate_str_into(text, policy, scratch.buf(), &mut v)?,
    }
    // r_fmt is 0 or 1; printed as an integer so that `== 1` works in every JSON tool.
    o.u64("format_reward", u64::from(v.r_fmt() == 1.0));
    write_violations(o, &v.report);
    if let Some(r) = &v.rubric {
        write_shape(o, r);
    }
    Ok(())
}

/// Per-thread memory of [`run_fast`]: the scanner's, the buffer the `"text"` string is decoded
/// into, and the index of the line's own value (used when the line is the rubric).
#[derive(Default)]
struct Fast {
    scan: scan::Scratch,
    decoded: String,
    index: SyntaxIndex,
}

thread_local! {
    static FAST: RefCell<Fast> = RefCell::new(Fast::default());
}

/// Decoded strings longer than this are not kept for the next line.
const KEEP_DECODED: usize = 1 << 20;

/// The whole output line for input line `line` with text `text`, written after one pass over
/// the line ([`scan::scan_line_indexed`]: the strict check, the members, the decoded `"text"`
/// string into a reused buffer, and the index the validator reads a rubric object line by, all
/// at once; no `Value` tree, no second parse).
/// `None` when the scanner declines the line: the caller takes the reference path, which writes
/// exactly what this would have (`cli/tests/fast_path.rs` checks that).
pub fn run_fast(
    policy: &Options,
    line: u64,
    text: &str,
    out: &mut String,
) -> Option<Result<(), LineError>> {
    FAST.with(|cell| {
        let mut guard = cell.try_borrow_mut().ok()?;
        let fast = &mut *guard;
        if !scan::scan_line_indexed(
            text,
            &mut fast.scan,
            Some(("text", &mut fast.decoded)),
            scan::IndexTarget::Line,
            &mut fast.index,
        ) {
            return None;
        }
        // Only the common members: `{"text": .., "id": ..}`, or a rubric object (`categories`)
        // with an optional `id`. Any other member is one the reference path may check or echo
        // (`meta`, a misspelled member), so it decides.
        let (mut id, mut raw_text, mut categories) = (None, None, false);
        for m in fast.scan.members(text) {
            match m.key {
                "id" => id = Some(m.value),
                "text" => raw_text = Some(m.value),
                "categories" => categories = true,
                _ => return None,
            }
        }
        if raw_text.is_some() && categories {
            return None;
        }
        let (rubric, index) = match raw_text {
            // Not a string: the reference path writes the schema error.
            Some(raw) if !raw.starts_with('"') => return None,
            // Without escapes the decoded text is the literal's inside: borrow that.
            Some(raw) if fast.decoded.len() + 2 == raw.len() => (raw.get(1..raw.len() - 1)?, None),
            // Decoded by the scan (a `String`: built from the line's own characters).
            Some(_) => (fast.decoded.as_str(), None),
            // The line is the rubric, and the scan indexed it.
            None => (text, Some(&fast.index)),
        };
        let r = Obj::try_write(out, |o| {
            o.u64("line", line);
            if let Some(id) = id {
                o.raw("id", id);
            }
            write_validation(policy, rubric, index, o)
        });
        if fast.decoded.capacity() > KEEP_DECODED {
            fast.decoded = String::new();
        }
        Some(r)
    })
}
