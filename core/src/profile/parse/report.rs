//! The report of profile validation: stable codes, paths, violations.

use core::fmt::{self, Write};

use super::MAX_PROFILE_VIOLATIONS;
use crate::format::Arg;

/// The stable codes of profile validation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
#[non_exhaustive]
pub enum ProfileCode {
    /// The text is not one JSON value (or not UTF-8).
    NotJson = 1,
    /// Non-whitespace text after the JSON value.
    TrailingText = 2,
    /// Wrong JSON type, missing, unknown or duplicate key, or a value outside its word list.
    Schema = 3,
    /// More dimensions, criteria, spans, labels or vetoes than this library stores, a name
    /// longer than [`MAX_NAME_BYTES`], or a string too long for the scratch buffer.
    ///
    /// [`MAX_NAME_BYTES`]: super::super::MAX_NAME_BYTES
    Capacity = 4,
    /// A blank name, title, description, span name or label.
    EmptyText = 5,
    /// Two dimensions, criteria of one dimension, spans or emotion labels with the same name, or
    /// two vetoes of one dimension.
    DuplicateName = 6,
    /// A dimension or emotion weight outside `[0, 1]`.
    WeightRange = 7,
    /// Dimension weights that do not sum to 1 within [`PROFILE_WEIGHT_TOLERANCE`].
    ///
    /// [`PROFILE_WEIGHT_TOLERANCE`]: super::PROFILE_WEIGHT_TOLERANCE
    WeightSum = 8,
    /// A criterion weight that is zero, not finite or too large, or a dimension without a
    /// positive one.
    CriterionWeight = 9,
    /// A dimension of a fixed rubric without criteria.
    CriteriaCount = 10,
    /// A score range that is not `0 <= min < max <= 100` in integers, or a veto outside it.
    ScoreRange = 11,
    /// A veto, judge span or emotion span that names nothing the profile defines.
    UnknownName = 12,
    /// A tag template without exactly one `{name}` or without text before it, or tags of which
    /// one contains another.
    Template = 13,
    /// A generated rubric whose dimensions are not the three CARE dimensions in order, whose
    /// scale is not 0..5, or whose dimensions carry weights or criteria.
    Generated = 14,
    /// An emotion label that is not lowercase, trimmed and without a trailing `.`.
    LabelFormat = 15,
    /// A span name with characters other than ASCII letters, digits, `_` and `-`.
    NameFormat = 16,
}

impl ProfileCode {
    /// Every code in number order.
    pub const ALL: [ProfileCode; 16] = [
        ProfileCode::NotJson,
        ProfileCode::TrailingText,
        ProfileCode::Schema,
        ProfileCode::Capacity,
        ProfileCode::EmptyText,
        ProfileCode::DuplicateName,
        ProfileCode::WeightRange,
        ProfileCode::WeightSum,
        ProfileCode::CriterionWeight,
        ProfileCode::CriteriaCount,
        ProfileCode::ScoreRange,
        ProfileCode::UnknownName,
        ProfileCode::Template,
        ProfileCode::Generated,
        ProfileCode::LabelFormat,
        ProfileCode::NameFormat,
    ];

    /// The stable snake_case code.
    pub const fn as_str(self) -> &'static str {
        match self {
            ProfileCode::NotJson => "not_json",
            ProfileCode::TrailingText => "trailing_text",
            ProfileCode::Schema => "schema",
            ProfileCode::Capacity => "capacity",
            ProfileCode::EmptyText => "empty_text",
            ProfileCode::DuplicateName => "duplicate_name",
            ProfileCode::WeightRange => "weight_range",
            ProfileCode::WeightSum => "weight_sum",
            ProfileCode::CriterionWeight => "criterion_weight",
            ProfileCode::CriteriaCount => "criteria_count",
            ProfileCode::ScoreRange => "score_range",
            ProfileCode::UnknownName => "unknown_name",
            ProfileCode::Template => "template",
            ProfileCode::Generated => "generated",
            ProfileCode::LabelFormat => "label_format",
            ProfileCode::NameFormat => "name_format",
        }
    }

    /// The stable number (1..=16, the future C enum value); never renumbered.
    pub const fn number(self) -> u8 {
        self as u8
    }

    /// The code whose [`ProfileCode::as_str`] is `s`.
    pub fn from_str_code(s: &str) -> Option<ProfileCode> {
        ProfileCode::ALL.into_iter().find(|c| c.as_str() == s)
    }

    /// How to fix it, one clause (the end of every message).
    pub const fn hint(self) -> &'static str {
        match self {
            ProfileCode::NotJson => "write exactly one JSON object",
            ProfileCode::TrailingText => "write only the JSON object",
            ProfileCode::Schema => "follow the profile schema (docs/PROFILES.md)",
            ProfileCode::Capacity => "make the profile smaller",
            ProfileCode::EmptyText => "write non-blank text",
            ProfileCode::DuplicateName => {
                "give each one a distinct name (names compare trimmed and ASCII-case-insensitively)"
            }
            ProfileCode::WeightRange => "use a weight between 0 and 1",
            ProfileCode::WeightSum => "make the dimension weights sum to 1",
            ProfileCode::CriterionWeight => {
                "give each criterion a finite non-zero weight (at most 1e6 in size) and each dimension at least one positive one"
            }
            ProfileCode::CriteriaCount => "give every dimension of a fixed rubric a criterion",
            ProfileCode::ScoreRange => "use integer scores with 0 <= min < max <= 100",
            ProfileCode::UnknownName => "name a dimension or span that the profile defines",
            ProfileCode::Template => {
                "write {name} once, with some text before it, so that no tag contains another"
            }
            ProfileCode::Generated => {
                "a generated rubric has the dimensions Cognitive Empathy, Affective Empathy, Proactive Empathy in that order, scores 0..5, and no weights or criteria"
            }
            ProfileCode::LabelFormat => {
                "write labels lowercase, trimmed, without a trailing period"
            }
            ProfileCode::NameFormat => "use ASCII letters, digits, '_' and '-' in span names",
        }
    }
}

impl ProfileCode {
    /// The stable codes, in the order of [`ProfileCode::ALL`].
    pub const NAMES: [&'static str; 16] =
        crate::names::names_of!(ProfileCode, ProfileCode::ALL, as_str);

    // The `Named` vocabulary, as inherent functions so that `impl_named!` applies.
    const fn name(self) -> &'static str {
        self.as_str()
    }
    const fn help(self) -> &'static str {
        self.hint()
    }
    fn from_name(s: &str) -> Option<ProfileCode> {
        ProfileCode::from_str_code(s)
    }
}

crate::names::impl_named!(ProfileCode, "profile code");

impl fmt::Display for ProfileCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// Where in the profile a violation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum ProfilePath {
    /// The document (or a top-level key, named in the message).
    #[default]
    Root,
    /// A top-level member: `"scores"`, `"output"`, `"emotion"`.
    Member(&'static str),
    /// `dimensions[i]`.
    Dimension(u8),
    /// `dimensions[i].criteria[j]`.
    Criterion(u8, u8),
    /// `output.spans[k]`.
    Span(u8),
    /// `emotion.labels`, the `i`-th label.
    Label(u8),
    /// `vetoes[i]`.
    Veto(u8),
}

impl fmt::Display for ProfilePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ProfilePath::Root => f.write_str("profile"),
            ProfilePath::Member(m) => f.write_str(m),
            ProfilePath::Dimension(i) => write!(f, "dimensions[{i}]"),
            ProfilePath::Criterion(i, j) => write!(f, "dimensions[{i}].criteria[{j}]"),
            ProfilePath::Span(k) => write!(f, "output.spans[{k}]"),
            ProfilePath::Label(i) => write!(f, "emotion.labels (label {i})"),
            ProfilePath::Veto(i) => write!(f, "vetoes[{i}]"),
        }
    }
}

/// One violation of the profile schema.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProfileViolation {
    /// The stable code.
    pub code: ProfileCode,
    /// Where.
    pub path: ProfilePath,
    /// Byte offset in the text, when it applies.
    pub offset: Option<usize>,
    /// What is wrong (static text).
    pub note: &'static str,
    /// The variable part of the message.
    pub arg: Arg,
}

impl ProfileViolation {
    /// Writes the one-line message (same text as `Display`).
    pub fn write_message<W: Write + ?Sized>(&self, w: &mut W) -> fmt::Result {
        write!(w, "{}: {}: {}", self.code.as_str(), self.path, self.note)?;
        match self.arg {
            Arg::None => {}
            Arg::Number(x) => write!(w, " {x}")?,
            Arg::Count(n) => write!(w, " {n}")?,
            Arg::Text(t) => {
                write!(w, " \"{}", t.as_str().escape_debug())?;
                if t.is_truncated() {
                    w.write_str("...")?;
                }
                w.write_str("\"")?;
            }
        }
        if let Some(o) = self.offset {
            write!(w, " (byte {o})")?;
        }
        write!(w, "; {}.", self.code.hint())
    }
}

impl fmt::Display for ProfileViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_message(f)
    }
}

/// Every violation found, in document order (whole-profile checks last).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProfileReport {
    violations: heapless::Vec<ProfileViolation, MAX_PROFILE_VIOLATIONS>,
    overflow: bool,
}

impl ProfileReport {
    /// The violations kept.
    pub fn violations(&self) -> &[ProfileViolation] {
        &self.violations
    }

    /// `true` when more violations were found than could be kept.
    pub fn overflowed(&self) -> bool {
        self.overflow
    }

    /// `true` when there is no violation.
    pub fn is_ok(&self) -> bool {
        self.violations.is_empty() && !self.overflow
    }

    /// Number of kept violations with `code`.
    pub fn count(&self, code: ProfileCode) -> usize {
        self.violations.iter().filter(|v| v.code == code).count()
    }

    /// Whether any kept violation has `code`.
    pub fn has(&self, code: ProfileCode) -> bool {
        self.count(code) > 0
    }

    /// Writes every message, one per line.
    pub fn write_feedback<W: Write + ?Sized>(&self, w: &mut W) -> fmt::Result {
        for v in &self.violations {
            v.write_message(w)?;
            w.write_char('\n')?;
        }
        if self.overflow {
            w.write_str("(more violations were found than reported)\n")?;
        }
        Ok(())
    }

    pub(super) fn push(&mut self, v: ProfileViolation) {
        if self.violations.push(v).is_err() {
            self.overflow = true;
        }
    }
}

impl fmt::Display for ProfileReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_feedback(f)
    }
}
