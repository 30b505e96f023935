//! The format contract and `r_fmt` (SPEC §2, §3).
//!
//! [`validate`] parses rubric JSON without allocating and reports **every** violation of the
//! contract (up to [`MAX_VIOLATIONS`], then an overflow flag), each with a stable code, its
//! location and a one-line message that can be pasted into a retry prompt. It also returns the
//! rubric whenever the text parsed far enough to recover at least one category, so that a
//! rubric that breaks the contract can still be scored (SPEC §7, Eq. 4).
//!
//! The module is split along its seams: the report types ([`Report`], [`Violation`],
//! [`ViolationCode`], [`Validation`]), the [`FormatPolicy`], the validator itself, and the checks
//! of a single text (level anchors, meta words).

mod checks;
pub(crate) mod notes;
mod policy;
mod report;
mod validator;

pub use checks::{LEVEL_SUFFIX, META_WORDS, find_meta_word};
pub use policy::FormatPolicy;
pub use report::{Arg, MAX_VIOLATIONS, Report, ShortText, Validation, Violation, ViolationCode};
pub use validator::{
    SyntaxIndex, format_reward, validate, validate_indexed_into, validate_str, validate_str_into,
};
