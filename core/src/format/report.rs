//! The report types of the format contract: violation codes, violations, the report, and the
//! result of a validation.

use core::fmt::{self, Write};

use super::notes::Note;
use crate::rubric::{Dimension, Rubric};

/// Most violations a [`Report`] holds; more set [`Report::overflowed`].
pub const MAX_VIOLATIONS: usize = 64;

/// The stable violation codes of SPEC §3 (also the C enum: see [`ViolationCode::number`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
#[non_exhaustive]
pub enum ViolationCode {
    /// The text is not one JSON value.
    NotJson = 1,
    /// Non-whitespace text before or after the JSON value.
    TrailingText = 2,
    /// Wrong JSON type, missing key, unknown or duplicate key.
    Schema = 3,
    /// A category name that is not one of the three.
    UnknownCategory = 4,
    /// A category given twice.
    DuplicateCategory = 5,
    /// A category missing.
    MissingCategory = 6,
    /// Categories not in the order Cognitive, Affective, Proactive.
    CategoryOrder = 7,
    /// Keys of a category or criterion out of the required order.
    KeyOrder = 8,
    /// `category_weight` outside `[0, 1]`.
    WeightRange = 9,
    /// Weights do not sum to 1 within the tolerance.
    WeightSum = 10,
    /// Criteria per category outside `min_criteria..=max_criteria`.
    CriteriaCount = 11,
    /// A description without the `[0]`..`[5]` anchors or the `value:` suffix.
    LevelFormat = 12,
    /// Two criteria with the same (trimmed, case-insensitive) title.
    DuplicateTitle = 13,
    /// A blank title, description or rationale.
    EmptyText = 14,
    /// The input exceeds a fixed capacity of this library.
    Capacity = 15,
    /// A forbidden meta word (lint, off by default).
    MetaWord = 16,
}

impl ViolationCode {
    /// Every code in number order.
    pub const ALL: [ViolationCode; 16] = [
        ViolationCode::NotJson,
        ViolationCode::TrailingText,
        ViolationCode::Schema,
        ViolationCode::UnknownCategory,
        ViolationCode::DuplicateCategory,
        ViolationCode::MissingCategory,
        ViolationCode::CategoryOrder,
        ViolationCode::KeyOrder,
        ViolationCode::WeightRange,
        ViolationCode::WeightSum,
        ViolationCode::CriteriaCount,
        ViolationCode::LevelFormat,
        ViolationCode::DuplicateTitle,
        ViolationCode::EmptyText,
        ViolationCode::Capacity,
        ViolationCode::MetaWord,
    ];

    /// The stable codes, in the order of [`ViolationCode::ALL`].
    pub const NAMES: [&'static str; 16] =
        crate::names::names_of!(ViolationCode, ViolationCode::ALL, as_str);

    /// The stable snake_case code of SPEC §3 (its [`crate::Named`] name).
    pub const fn as_str(self) -> &'static str {
        match self {
            ViolationCode::NotJson => "not_json",
            ViolationCode::TrailingText => "trailing_text",
            ViolationCode::Schema => "schema",
            ViolationCode::UnknownCategory => "unknown_category",
            ViolationCode::DuplicateCategory => "duplicate_category",
            ViolationCode::MissingCategory => "missing_category",
            ViolationCode::CategoryOrder => "category_order",
            ViolationCode::KeyOrder => "key_order",
            ViolationCode::WeightRange => "weight_range",
            ViolationCode::WeightSum => "weight_sum",
            ViolationCode::CriteriaCount => "criteria_count",
            ViolationCode::LevelFormat => "level_format",
            ViolationCode::DuplicateTitle => "duplicate_title",
            ViolationCode::EmptyText => "empty_text",
            ViolationCode::Capacity => "capacity",
            ViolationCode::MetaWord => "meta_word",
        }
    }

    /// The stable number (1..=16, the C enum value); never renumbered.
    pub const fn number(self) -> u8 {
        self as u8
    }

    /// The code with number `n`.
    pub fn from_number(n: u8) -> Option<ViolationCode> {
        ViolationCode::ALL.into_iter().find(|c| c.number() == n)
    }

    /// The code whose [`ViolationCode::as_str`] is exactly `s`.
    pub fn from_str_code(s: &str) -> Option<ViolationCode> {
        ViolationCode::ALL.into_iter().find(|c| c.as_str() == s)
    }

    // The `Named` vocabulary, as inherent functions so that `impl_named!` applies.
    const fn name(self) -> &'static str {
        self.as_str()
    }
    const fn help(self) -> &'static str {
        self.hint()
    }
    fn from_name(s: &str) -> Option<ViolationCode> {
        ViolationCode::from_str_code(s)
    }

    /// How to fix it, one clause (used at the end of every message).
    pub const fn hint(self) -> &'static str {
        match self {
            ViolationCode::NotJson => "output exactly one JSON object",
            ViolationCode::TrailingText => {
                "output only the JSON object, with nothing before or after it"
            }
            ViolationCode::Schema => {
                "follow the schema {\"categories\":[{\"category\",\"weight_rationale\",\"category_weight\",\"criteria\":[{\"title\",\"description\"}]}]}"
            }
            ViolationCode::UnknownCategory => {
                "use exactly the names Cognitive Empathy, Affective Empathy, Proactive Empathy"
            }
            ViolationCode::DuplicateCategory => "give each category exactly once",
            ViolationCode::MissingCategory => "include all three categories",
            ViolationCode::CategoryOrder => {
                "order the categories Cognitive Empathy, Affective Empathy, Proactive Empathy"
            }
            ViolationCode::KeyOrder => {
                "write keys in the order category, weight_rationale, category_weight, criteria (criteria: title, description)"
            }
            ViolationCode::WeightRange => "use a category_weight between 0 and 1",
            ViolationCode::WeightSum => "make the three category_weight values sum to 1.0",
            ViolationCode::CriteriaCount => "give each category the allowed number of criteria",
            ViolationCode::LevelFormat => {
                "write [0] to [5] once each, in order, each followed by text, and end with `value: 0, 1, 2, 3, 4, 5`"
            }
            ViolationCode::DuplicateTitle => "give every criterion a distinct title",
            ViolationCode::EmptyText => "write non-blank text",
            ViolationCode::Capacity => "make the rubric smaller",
            ViolationCode::MetaWord => {
                "avoid the words gold, reference, ideal, ground truth, target response/answer/reply"
            }
        }
    }
}

crate::names::impl_named!(ViolationCode, "violation code");

impl fmt::Display for ViolationCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// A short copy of input text kept in a violation (a key name, a word), truncated on a char
/// boundary to 32 bytes so that violations stay `Copy` and own no borrow.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ShortText {
    buf: [u8; 32],
    len: u8,
    truncated: bool,
}

impl ShortText {
    /// Copies up to 32 bytes of the characters of `chars`.
    pub fn from_chars(chars: impl Iterator<Item = char>) -> Self {
        let mut t = ShortText::default();
        let mut k = 0usize;
        for c in chars {
            let w = c.len_utf8();
            match t.buf.get_mut(k..k + w) {
                Some(dst) => {
                    c.encode_utf8(dst);
                    k += w;
                }
                None => {
                    t.truncated = true;
                    break;
                }
            }
        }
        t.len = k as u8; // k <= 32
        t
    }

    /// Copies up to 32 bytes of `s`.
    pub fn new(s: &str) -> Self {
        Self::from_chars(s.chars())
    }

    /// The text (possibly truncated).
    pub fn as_str(&self) -> &str {
        let b = self.buf.get(..usize::from(self.len)).unwrap_or(&[]);
        core::str::from_utf8(b).unwrap_or("")
    }

    /// Whether the original was longer than 32 bytes.
    pub fn is_truncated(&self) -> bool {
        self.truncated
    }

    /// The same text with the truncation flag set as given (for deserialization).
    #[cfg(feature = "serde")]
    pub(crate) fn with_truncated(mut self, truncated: bool) -> Self {
        self.truncated = truncated;
        self
    }
}

impl fmt::Debug for ShortText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

/// The variable part of a violation message.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
pub enum Arg {
    /// Nothing.
    #[default]
    None,
    /// A number (a weight, a sum).
    Number(f64),
    /// A count (criteria, nesting depth).
    Count(u32),
    /// Quoted input text (a key, a category name, a word).
    Text(ShortText),
}

/// One violation of the format contract.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Violation {
    /// The stable code.
    pub code: ViolationCode,
    /// Position of the category in the `categories` array, when it applies.
    pub category: Option<u8>,
    /// The dimension of that category, when it is known.
    pub dimension: Option<Dimension>,
    /// Position of the criterion in its category's `criteria` array, when it applies.
    pub criterion: Option<u8>,
    /// Byte offset in the input, when it applies (`not_json`, `trailing_text`, keys).
    pub offset: Option<usize>,
    /// What is wrong (static text).
    pub note: &'static str,
    /// The variable part of the message.
    pub arg: Arg,
}

impl Violation {
    pub(super) fn new(code: ViolationCode, note: Note) -> Self {
        Violation {
            code,
            category: None,
            dimension: None,
            criterion: None,
            offset: None,
            note: note.as_str(),
            arg: Arg::None,
        }
    }

    /// Writes the one-line retry message (same text as `Display`).
    pub fn write_message<W: Write + ?Sized>(&self, w: &mut W) -> fmt::Result {
        write!(w, "{}: ", self.code.as_str())?;
        if let Some(c) = self.category {
            write!(w, "categories[{c}]")?;
            if let Some(d) = self.dimension {
                write!(w, " ({})", d.json_name())?;
            }
            if let Some(k) = self.criterion {
                write!(w, ".criteria[{k}]")?;
            }
            w.write_str(": ")?;
        } else if let Some(d) = self.dimension {
            write!(w, "{}: ", d.json_name())?;
        }
        w.write_str(self.note)?;
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

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_message(f)
    }
}

/// All violations found, in input order (whole-rubric checks last).
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Report {
    violations: heapless::Vec<Violation, MAX_VIOLATIONS>,
    #[cfg_attr(feature = "serde", serde(rename = "overflowed"))]
    overflow: bool,
}

impl Report {
    /// The violations kept (at most [`MAX_VIOLATIONS`]).
    pub fn violations(&self) -> &[Violation] {
        &self.violations
    }

    /// `true` when more violations were found than could be kept.
    pub fn overflowed(&self) -> bool {
        self.overflow
    }

    /// `true` when there is no violation at all.
    pub fn is_ok(&self) -> bool {
        self.violations.is_empty() && !self.overflow
    }

    /// `r_fmt`: 1 when there is no violation, else 0.
    pub fn r_fmt(&self) -> f64 {
        if self.is_ok() { 1.0 } else { 0.0 }
    }

    /// Number of kept violations with `code`.
    pub fn count(&self, code: ViolationCode) -> usize {
        self.violations.iter().filter(|v| v.code == code).count()
    }

    /// Whether any kept violation has `code`.
    pub fn has(&self, code: ViolationCode) -> bool {
        self.count(code) > 0
    }

    /// Writes every message, one per line, ready for a retry prompt's validator feedback.
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

    /// Empties the report (for [`super::validate_str_into`], which writes into a used one).
    pub(super) fn clear(&mut self) {
        self.violations.clear();
        self.overflow = false;
    }

    pub(super) fn push(&mut self, v: Violation) {
        if self.violations.push(v).is_err() {
            self.overflow = true;
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_feedback(f)
    }
}

/// The result of [`validate`](super::validate): the rubric when it parsed far enough, and the report.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Validation<'a> {
    /// The rubric, when the text is JSON with a `categories` array holding at least one
    /// recognised category (it may still break the contract; see `report`).
    pub rubric: Option<Rubric<'a>>,
    /// Every violation found.
    pub report: Report,
}

impl Default for Validation<'_> {
    /// No rubric and an empty report (what [`super::validate_str_into`] starts from).
    fn default() -> Self {
        Validation {
            rubric: None,
            report: Report::default(),
        }
    }
}

impl Validation<'_> {
    /// `r_fmt`: 1 when the text passed every check, else 0.
    pub fn r_fmt(&self) -> f64 {
        if self.rubric.is_some() {
            self.report.r_fmt()
        } else {
            0.0
        }
    }

    /// `true` when a rubric was recovered and there is no violation.
    pub fn is_valid(&self) -> bool {
        self.rubric.is_some() && self.report.is_ok()
    }
}
