//! The one error type of `care-core`.
//!
//! Every fallible function of the crate returns [`Error`]. Each variant has a stable snake_case
//! [`Error::code`] (used by the CLI's JSON output) and a stable number [`Error::number`] (the C ABI's
//! `care_result`), grouped by hundreds: 1xx arguments, 2xx parse and format, 3xx rubric invariants
//! and scores, 4xx numerics. Numbers are never reused or renumbered; new variants take the next free
//! number of their group.

use core::fmt;

#[cfg(doc)]
use crate::Named;

/// Why an operation of `care-core` failed. Small and `Copy`, like `serde_json_core::de::Error`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Error {
    // ---- 1xx: arguments -------------------------------------------------------------------
    /// Two inputs that must have matching lengths do not.
    LengthMismatch,
    /// An argument is outside its documented domain (for example `tau <= 0`, `eps < 0`); for
    /// options, the struct's `check()` says which field ([`InvalidOption`]).
    InvalidArgument,
    /// A caller-provided output or scratch buffer is too small.
    BufferTooSmall,
    /// An empty input where at least one element is required.
    Empty,

    // ---- 2xx: parse and format ------------------------------------------------------------
    /// The text is not one JSON value.
    NotJson,
    /// Non-whitespace text before or after the JSON value.
    TrailingText,
    /// Wrong JSON type, missing key or unknown key.
    Schema,
    /// The input exceeds a fixed capacity (criteria, violations, scratch buffer).
    Capacity,
    /// The input is not valid UTF-8.
    InvalidUtf8,
    /// The rubric parsed but breaks the format contract (see the validation report).
    FormatViolation,
    /// The judge output holds no JSON object with `criterion_scores`.
    NoJudgeJson,

    // ---- 3xx: rubric invariants and scores ------------------------------------------------
    /// Weights that are negative, non-finite, or sum to zero where a positive sum is required.
    InvalidWeights,
    /// A criterion has no score and the missing-score policy is `error`.
    MissingScore,
    /// A score outside `0..=5` or non-integral, and the out-of-range policy is `error`.
    ScoreOutOfRange,
    /// A strategy label that maps to no dimension, and the unknown-label policy is `error`.
    UnknownLabel,
    /// A judge score names a criterion that the rubric does not have.
    UnknownCriterion,
    /// The score layout does not match the rubric's criteria (count per dimension).
    ScoreShape,

    // ---- 4xx: numerics and layouts --------------------------------------------------------
    /// Group or sequence offsets that are not a non-decreasing CSR array starting at 0 and
    /// ending at the input length, or a group size of 0 / not dividing the input length.
    InvalidLayout,
    /// A group has exactly one valid sample and the singleton policy is `error`.
    SingletonGroup,
    /// A non-finite value where only finite values are allowed.
    NonFinite,
}

impl Error {
    /// Every variant, in number order (for tables, tests and the C header check).
    pub const ALL: [Error; 20] = [
        Error::LengthMismatch,
        Error::InvalidArgument,
        Error::BufferTooSmall,
        Error::Empty,
        Error::NotJson,
        Error::TrailingText,
        Error::Schema,
        Error::Capacity,
        Error::InvalidUtf8,
        Error::FormatViolation,
        Error::NoJudgeJson,
        Error::InvalidWeights,
        Error::MissingScore,
        Error::ScoreOutOfRange,
        Error::UnknownLabel,
        Error::UnknownCriterion,
        Error::ScoreShape,
        Error::InvalidLayout,
        Error::SingletonGroup,
        Error::NonFinite,
    ];

    /// The stable codes, in the order of [`Error::ALL`].
    pub const NAMES: [&'static str; 20] = crate::names::names_of!(Error, Error::ALL, code);

    /// The stable snake_case code (CLI output, logs); the error's [`Named`] name.
    pub const fn code(self) -> &'static str {
        match self {
            Error::LengthMismatch => "length_mismatch",
            Error::InvalidArgument => "invalid_argument",
            Error::BufferTooSmall => "buffer_too_small",
            Error::Empty => "empty",
            Error::NotJson => "not_json",
            Error::TrailingText => "trailing_text",
            Error::Schema => "schema",
            Error::Capacity => "capacity",
            Error::InvalidUtf8 => "invalid_utf8",
            Error::FormatViolation => "format_violation",
            Error::NoJudgeJson => "no_judge_json",
            Error::InvalidWeights => "invalid_weights",
            Error::MissingScore => "missing_score",
            Error::ScoreOutOfRange => "score_out_of_range",
            Error::UnknownLabel => "unknown_label",
            Error::UnknownCriterion => "unknown_criterion",
            Error::ScoreShape => "score_shape",
            Error::InvalidLayout => "invalid_layout",
            Error::SingletonGroup => "singleton_group",
            Error::NonFinite => "non_finite",
        }
    }

    /// The stable number (the C ABI's `care_result`); never renumbered.
    pub const fn number(self) -> u32 {
        match self {
            Error::LengthMismatch => 101,
            Error::InvalidArgument => 102,
            Error::BufferTooSmall => 103,
            Error::Empty => 104,
            Error::NotJson => 201,
            Error::TrailingText => 202,
            Error::Schema => 203,
            Error::Capacity => 204,
            Error::InvalidUtf8 => 205,
            Error::FormatViolation => 206,
            Error::NoJudgeJson => 207,
            Error::InvalidWeights => 301,
            Error::MissingScore => 302,
            Error::ScoreOutOfRange => 303,
            Error::UnknownLabel => 304,
            Error::UnknownCriterion => 305,
            Error::ScoreShape => 306,
            Error::InvalidLayout => 401,
            Error::SingletonGroup => 402,
            Error::NonFinite => 403,
        }
    }

    /// A one-line, human-readable description.
    pub const fn message(self) -> &'static str {
        match self {
            Error::LengthMismatch => "input lengths do not match",
            Error::InvalidArgument => "argument outside its valid domain",
            Error::BufferTooSmall => "output or scratch buffer too small",
            Error::Empty => "input is empty",
            Error::NotJson => "text is not one JSON value",
            Error::TrailingText => "text before or after the JSON value",
            Error::Schema => "wrong JSON type, missing key or unknown key",
            Error::Capacity => "input exceeds a fixed capacity",
            Error::InvalidUtf8 => "input is not valid UTF-8",
            Error::FormatViolation => "rubric breaks the format contract",
            Error::NoJudgeJson => "judge output holds no criterion_scores object",
            Error::InvalidWeights => "weights are negative, non-finite or sum to zero",
            Error::MissingScore => "a criterion has no score",
            Error::ScoreOutOfRange => "score outside 0..=5 or not an integer",
            Error::UnknownLabel => "strategy label maps to no dimension",
            Error::UnknownCriterion => "score names a criterion the rubric does not have",
            Error::ScoreShape => "scores do not match the rubric's criteria",
            Error::InvalidLayout => "invalid group or sequence layout",
            Error::SingletonGroup => "group with a single valid sample",
            Error::NonFinite => "non-finite value",
        }
    }
}

impl Error {
    /// The error whose [`Error::code`] is exactly `code`.
    pub fn from_code(code: &str) -> Option<Error> {
        Error::ALL.into_iter().find(|e| e.code() == code)
    }

    // The `Named` vocabulary, as inherent functions so that `impl_named!` applies.
    const fn name(self) -> &'static str {
        self.code()
    }
    const fn help(self) -> &'static str {
        self.message()
    }
    fn from_name(code: &str) -> Option<Error> {
        Error::from_code(code)
    }
}

crate::names::impl_named!(Error, "error code");

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message(), self.code())
    }
}

impl core::error::Error for Error {}

/// Which field of an options struct is outside its domain, and what the domain is: the
/// specific message behind [`Error::InvalidArgument`] for options.
///
/// Every options struct of the crate has `check()`, which returns the first field outside its
/// domain, and `validate()`, the same check as an [`Error`] (for `?`); every function that takes
/// options calls it before it reads anything else. `Display` gives `"<field> must be
/// <expected>"`, for example `tau must be finite and > 0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct InvalidOption {
    /// The field, as the options struct names it (`"tau"`, `"eps_low"`, `"min_criteria"`).
    pub field: &'static str,
    /// What the field must be (`"finite and > 0"`).
    pub expected: &'static str,
}

impl InvalidOption {
    /// `Err` naming `field` and its domain unless `ok`.
    pub(crate) const fn require(
        ok: bool,
        field: &'static str,
        expected: &'static str,
    ) -> core::result::Result<(), InvalidOption> {
        if ok {
            Ok(())
        } else {
            Err(InvalidOption { field, expected })
        }
    }
}

impl fmt::Display for InvalidOption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} must be {}", self.field, self.expected)
    }
}

impl core::error::Error for InvalidOption {}

impl From<InvalidOption> for Error {
    fn from(_: InvalidOption) -> Self {
        Error::InvalidArgument
    }
}

/// The domains options fields are checked against (one wording for every struct).
pub(crate) mod domain {
    /// `x.is_finite() && x >= 0`.
    pub const FINITE_NON_NEGATIVE: &str = "finite and >= 0";
    /// `x.is_finite() && x > 0`.
    pub const FINITE_POSITIVE: &str = "finite and > 0";
    /// `x.is_finite()`.
    pub const FINITE: &str = "finite";
    /// `x > 0`, `+inf` allowed.
    pub const POSITIVE: &str = "> 0 (inf turns it off)";
    /// `!x.is_nan()`.
    pub const NOT_NAN: &str = "a number (not NaN)";
    /// `0 <= x <= 1` (NaN is outside).
    pub const UNIT: &str = "in [0, 1]";

    pub fn finite_non_negative(x: f64) -> bool {
        x.is_finite() && x >= 0.0
    }
    pub fn finite_positive(x: f64) -> bool {
        x.is_finite() && x > 0.0
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = core::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_codes_are_unique_and_grouped() {
        for (i, a) in Error::ALL.iter().enumerate() {
            for b in &Error::ALL[i + 1..] {
                assert_ne!(a.number(), b.number());
                assert_ne!(a.code(), b.code());
            }
            assert!((100..500).contains(&a.number()));
        }
        let mut sorted = Error::ALL;
        sorted.sort_by_key(|e| e.number());
        assert_eq!(sorted, Error::ALL, "ALL is in number order");
    }
}
