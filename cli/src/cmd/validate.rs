//! `care validate`: the format contract (SPEC §3) on generated rubrics.

use care_core::{FormatPolicy, validate_str};

use super::rubric::{Scratch, write_shape, write_violations};
use crate::input::Line;
use crate::json::{LineError, Obj};

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
    // Decoding JSON escapes never makes a string longer, so the text's length always suffices.
    let mut scratch = Scratch::take(text.len());
    let v = validate_str(text, policy, scratch.buf())?;
    // r_fmt is 0 or 1; printed as an integer so that `== 1` works in every JSON tool.
    o.u64("format_reward", u64::from(v.r_fmt() == 1.0));
    write_violations(o, &v.report);
    if let Some(r) = &v.rubric {
        write_shape(o, r);
    }
    Ok(())
}
