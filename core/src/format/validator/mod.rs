//! The validator: one pass over the rubric JSON that recovers the rubric and reports every
//! violation of the contract.

mod categories;
mod index;
mod top;

pub use index::SyntaxIndex;

use super::notes::{self, Note};
use super::policy::FormatPolicy;
use super::report::{Arg, Report, ShortText, Validation, Violation, ViolationCode};
use crate::Result;
use crate::json::JStr;
use crate::rubric::Dimension;

/// `r_fmt` of `text` under `policy`: `validate(text, policy, scratch)?.r_fmt()`.
///
/// # Errors
/// As [`validate`]: only an invalid `policy`.
pub fn format_reward(text: &[u8], policy: &FormatPolicy, scratch: &mut [u8]) -> Result<f64> {
    Ok(validate(text, policy, scratch)?.r_fmt())
}

/// Validates rubric JSON against the format contract and recovers the rubric.
///
/// Whole-rubric checks avoid cascades: `weight_sum` is judged only when all three categories
/// are present with numeric weights, and `missing_category` is reported once per dimension.
///
/// Strings without escapes are borrowed from `text`; strings with escapes are decoded into
/// `scratch` (a string that does not fit is reported as `capacity` and left empty). Decoding
/// never makes a string longer, so a scratch buffer of `text.len()` bytes always suffices. Never
/// panics, never allocates; time is linear in the input (plus a quadratic title check bounded by
/// the criteria capacity).
///
/// # Errors
/// [`crate::Error::InvalidArgument`] when `policy` is invalid ([`FormatPolicy::check`] says
/// which field). Everything wrong with the text is in the report, never an error.
pub fn validate<'a>(
    text: &'a [u8],
    policy: &FormatPolicy,
    scratch: &'a mut [u8],
) -> Result<Validation<'a>> {
    match core::str::from_utf8(text) {
        Ok(text) => validate_str(text, policy, scratch),
        Err(e) => {
            policy.validate()?;
            let mut v = Violation::new(ViolationCode::NotJson, notes::NOT_UTF8);
            v.offset = Some(e.valid_up_to());
            let mut report = Report::default();
            report.push(v);
            Ok(Validation {
                rubric: None,
                report,
            })
        }
    }
}

/// [`validate`] for text that is already a `&str` (decoded JSON, a `String`): the same checks
/// and report, without checking the UTF-8 a second time.
///
/// # Errors
/// As [`validate`]: only an invalid `policy`.
pub fn validate_str<'a>(
    text: &'a str,
    policy: &FormatPolicy,
    scratch: &'a mut [u8],
) -> Result<Validation<'a>> {
    let mut out = Validation::default();
    validate_str_into(text, policy, scratch, &mut out)?;
    Ok(out)
}

/// [`validate_str`] that writes the result into `out` (all of it: the rubric and the report
/// are replaced) instead of returning it. A [`Validation`] is several kilobytes (the report
/// holds up to [`MAX_VIOLATIONS`](super::MAX_VIOLATIONS) violations, the rubric up to
/// [`MAX_TOTAL_CRITERIA`] criteria); callers that validate one rubric after another, such as
/// the command line on JSON Lines, keep one on their stack and save the copies of returning it.
///
/// # Errors
/// As [`validate`]: only an invalid `policy`, and then `out` is left as it was.
///
/// [`MAX_TOTAL_CRITERIA`]: crate::rubric::MAX_TOTAL_CRITERIA
pub fn validate_str_into<'a>(
    text: &'a str,
    policy: &FormatPolicy,
    scratch: &'a mut [u8],
    out: &mut Validation<'a>,
) -> Result<()> {
    validate_into(text, None, policy, scratch, out)
}

/// [`validate_str_into`] for a `text` whose syntax the caller has already checked: `index` says
/// what that check learned (see [`SyntaxIndex`]), and the validator's own syntax pass is
/// skipped, so a caller that scans the bytes anyway (the command line's strict line check)
/// reads them once. The report and the rubric are the ones [`validate_str_into`] gives.
///
/// The index is trusted, not checked: a syntax error the caller's pass missed is not reported,
/// and a string recorded at the wrong place reads as the text there. It is never trusted with
/// memory: every recorded offset is checked against `text` before use, so a wrong index gives a
/// wrong report, never a panic, in every build. [`SyntaxIndex::matches`] checks a caller's index
/// against the validator's own pass (for the caller's tests). An index without a value, or whose
/// value lies outside `text` or outside what the policy's envelope options leave of it
/// (`allow_think`, `allow_code_fence`), is ignored and `text` gets the full syntax pass.
///
/// # Errors
/// As [`validate`]: only an invalid `policy`, and then `out` is left as it was.
pub fn validate_indexed_into<'a>(
    text: &'a str,
    index: &SyntaxIndex,
    policy: &FormatPolicy,
    scratch: &'a mut [u8],
    out: &mut Validation<'a>,
) -> Result<()> {
    validate_into(text, Some(index), policy, scratch, out)
}

/// Both `_into` entry points: the validator's own syntax pass, or the caller's `index`.
fn validate_into<'a>(
    text: &'a str,
    index: Option<&SyntaxIndex>,
    policy: &FormatPolicy,
    scratch: &'a mut [u8],
    out: &mut Validation<'a>,
) -> Result<()> {
    policy.validate()?;
    out.report.clear();
    out.rubric = None;
    let mut v = Validator {
        report: &mut out.report,
        policy,
        scratch,
        own_index: index.is_none(),
    };
    match index {
        Some(index) => v.run_indexed(text, index, &mut out.rubric),
        None => v.run_str(text, &mut out.rubric),
    }
    Ok(())
}

/// Strings indexed by the syntax pass: a paper rubric has 67 (1 + 3 x (6 + 4 x 4)); strings
/// past this are scanned twice, which costs time, never correctness.
const STRING_INDEX_CAPACITY: usize = 128;

struct Validator<'a, 'p> {
    /// Where violations go (the caller's [`Validation`], written in place).
    report: &'p mut Report,
    policy: &'p FormatPolicy,
    scratch: &'a mut [u8],
    /// The string index is the validator's own (debug builds then check every walk against a
    /// skip); a caller's index ([`validate_indexed_into`]) is not checked, so that a wrong one
    /// gives a wrong report and never a panic, in every build.
    own_index: bool,
}

/// Where a violation is, for the helpers below.
#[derive(Clone, Copy, Default)]
struct Loc {
    category: Option<u8>,
    dimension: Option<Dimension>,
    criterion: Option<u8>,
}

fn idx(i: usize) -> u8 {
    u8::try_from(i).unwrap_or(u8::MAX)
}

impl<'a> Validator<'a, '_> {
    fn push(&mut self, code: ViolationCode, loc: Loc, offset: Option<usize>, note: Note, arg: Arg) {
        self.report.push(Violation {
            code,
            category: loc.category,
            dimension: loc.dimension,
            criterion: loc.criterion,
            offset,
            note: note.as_str(),
            arg,
        });
    }

    fn key_problem(&mut self, loc: Loc, k: &JStr<'a>, note: Note) {
        self.push(
            ViolationCode::Schema,
            loc,
            Some(k.offset),
            note,
            Arg::Text(ShortText::from_chars(k.chars())),
        );
    }

    fn text(&mut self, loc: Loc, s: &JStr<'a>) -> &'a str {
        match s.materialize(&mut self.scratch) {
            Some(t) => t,
            None => {
                self.push(
                    ViolationCode::Capacity,
                    loc,
                    Some(s.offset),
                    notes::STRING_TOO_LONG,
                    Arg::None,
                );
                ""
            }
        }
    }
}
