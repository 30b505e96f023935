//! The format contract and `r_fmt` (SPEC §2, §3).
//!
//! [`validate`] parses rubric JSON without allocating and reports **every** violation of the
//! contract (up to [`MAX_VIOLATIONS`], then an overflow flag), each with a stable code, its
//! location and a one-line message that can be pasted into a retry prompt. It also returns the
//! rubric whenever the text parsed far enough to recover at least one category, so that a
//! rubric that breaks the contract can still be scored (SPEC §7, Eq. 4).

use core::fmt::{self, Write};

use crate::json::{self, Cursor, JStr, Kind};
use crate::rubric::{Criterion, Dimension, MAX_CRITERIA, MAX_TOTAL_CRITERIA, Rubric};

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

    /// The stable snake_case code of SPEC §3.
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

    /// The code whose [`ViolationCode::as_str`] is `s`.
    pub fn from_str_code(s: &str) -> Option<ViolationCode> {
        ViolationCode::ALL.into_iter().find(|c| c.as_str() == s)
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

impl fmt::Display for ViolationCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
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
}

impl fmt::Debug for ShortText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

/// The variable part of a violation message.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
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
    fn new(code: ViolationCode, note: &'static str) -> Self {
        Violation {
            code,
            category: None,
            dimension: None,
            criterion: None,
            offset: None,
            note,
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
pub struct Report {
    violations: heapless::Vec<Violation, MAX_VIOLATIONS>,
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

    fn push(&mut self, v: Violation) {
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

/// The options of the format contract. [`FormatPolicy::PAPER`] (the `Default`) is the policy
/// behind `r_fmt`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FormatPolicy {
    /// Strip a leading `<think>...</think>` block, or everything up to a lone `</think>`.
    pub allow_think: bool,
    /// Accept one ```` ```json ```` code fence around the value.
    pub allow_code_fence: bool,
    /// Accept the envelope `{"analysis": ..., "rubric": {...}}`.
    pub allow_envelope: bool,
    /// Allowed `|sum(w) - 1|`.
    pub weight_tolerance: f64,
    /// Require categories in the order Cognitive, Affective, Proactive.
    pub require_order: bool,
    /// Require the key order of categories and criteria.
    pub require_key_order: bool,
    /// Fewest criteria per category.
    pub min_criteria: u8,
    /// Most criteria per category.
    pub max_criteria: u8,
    /// Lint for meta words (gold, reference, ...).
    pub meta_words: bool,
}

impl FormatPolicy {
    /// The paper's contract (SPEC §3 defaults).
    pub const PAPER: FormatPolicy = FormatPolicy {
        allow_think: false,
        allow_code_fence: false,
        allow_envelope: false,
        weight_tolerance: 1e-3,
        require_order: true,
        require_key_order: true,
        min_criteria: 2,
        max_criteria: 4,
        meta_words: false,
    };

    /// The paper's contract (same as [`FormatPolicy::PAPER`]).
    pub const fn paper() -> Self {
        Self::PAPER
    }

    /// A lenient policy for reading model output that is not being rewarded: think blocks,
    /// code fences and the envelope accepted; everything else as [`FormatPolicy::PAPER`].
    pub const fn lenient() -> Self {
        FormatPolicy {
            allow_think: true,
            allow_code_fence: true,
            allow_envelope: true,
            ..Self::PAPER
        }
    }
}

impl Default for FormatPolicy {
    fn default() -> Self {
        Self::PAPER
    }
}

/// The result of [`validate`]: the rubric when it parsed far enough, and the report.
#[derive(Clone, Debug, PartialEq)]
pub struct Validation<'a> {
    /// The rubric, when the text is JSON with a `categories` array holding at least one
    /// recognised category (it may still break the contract; see `report`).
    pub rubric: Option<Rubric<'a>>,
    /// Every violation found.
    pub report: Report,
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

/// `r_fmt` of `text` under `policy`: `validate(text, policy, scratch).r_fmt()`.
pub fn format_reward(text: &[u8], policy: &FormatPolicy, scratch: &mut [u8]) -> f64 {
    validate(text, policy, scratch).r_fmt()
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
pub fn validate<'a>(
    text: &'a [u8],
    policy: &FormatPolicy,
    scratch: &'a mut [u8],
) -> Validation<'a> {
    match core::str::from_utf8(text) {
        Ok(text) => validate_str(text, policy, scratch),
        Err(e) => {
            let mut v = Violation::new(ViolationCode::NotJson, "the text is not valid UTF-8");
            v.offset = Some(e.valid_up_to());
            let mut report = Report::default();
            report.push(v);
            Validation {
                rubric: None,
                report,
            }
        }
    }
}

/// [`validate`] for text that is already a `&str` (decoded JSON, a `String`): the same checks
/// and report, without checking the UTF-8 a second time.
pub fn validate_str<'a>(
    text: &'a str,
    policy: &FormatPolicy,
    scratch: &'a mut [u8],
) -> Validation<'a> {
    let mut v = Validator {
        report: Report::default(),
        policy,
        scratch,
    };
    let rubric = v.run_str(text);
    Validation {
        rubric,
        report: v.report,
    }
}

/// Strings indexed by the syntax pass: a paper rubric has 67 (1 + 3 x (6 + 4 x 4)); strings
/// past this are scanned twice, which costs time, never correctness.
const STRING_INDEX_CAPACITY: usize = 128;

struct Validator<'a, 'p> {
    report: Report,
    policy: &'p FormatPolicy,
    scratch: &'a mut [u8],
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

fn is_blank(s: &str) -> bool {
    s.trim().is_empty()
}

impl<'a> Validator<'a, '_> {
    fn push(
        &mut self,
        code: ViolationCode,
        loc: Loc,
        offset: Option<usize>,
        note: &'static str,
        arg: Arg,
    ) {
        self.report.push(Violation {
            code,
            category: loc.category,
            dimension: loc.dimension,
            criterion: loc.criterion,
            offset,
            note,
            arg,
        });
    }

    fn run_str(&mut self, text: &'a str) -> Option<Rubric<'a>> {
        let (lo, hi) = self.strip_envelope_text(text);
        let region = text.get(..hi).unwrap_or("");
        let b = region.as_bytes();
        let start = json::skip_ws(b, lo);
        if start >= hi {
            self.push(
                ViolationCode::NotJson,
                Loc::default(),
                Some(start),
                "the text is empty",
                Arg::None,
            );
            return None;
        }
        // Strings the syntax pass meets are indexed, so the walk below never scans one again.
        let mut index = json::StringIndex::<STRING_INDEX_CAPACITY>::new();
        let (start, end) = match json::scan_value_indexed(b, start, &mut index) {
            Ok(end) => (start, end),
            Err(e) => {
                // Lenient recovery: JSON after some leading prose is still a rubric (reported as
                // trailing_text), which gives the retry prompt better feedback than not_json.
                let retry = if b.get(start) == Some(&b'{') {
                    None
                } else {
                    b.get(start..)
                        .and_then(|t| t.iter().position(|&c| c == b'{'))
                        .map(|p| start + p)
                        .and_then(|s| {
                            json::scan_value_indexed(b, s, &mut index)
                                .ok()
                                .map(|end| (s, end))
                        })
                };
                match retry {
                    Some((s, end)) => {
                        self.push(
                            ViolationCode::TrailingText,
                            Loc::default(),
                            Some(start),
                            "text before the JSON value",
                            Arg::None,
                        );
                        (s, end)
                    }
                    None => {
                        let code = if e.too_deep {
                            ViolationCode::Capacity
                        } else {
                            ViolationCode::NotJson
                        };
                        self.push(code, Loc::default(), Some(e.offset), e.what, Arg::None);
                        return None;
                    }
                }
            }
        };
        let after = json::skip_ws(b, end);
        if after < hi {
            self.push(
                ViolationCode::TrailingText,
                Loc::default(),
                Some(after),
                "text after the JSON value",
                Arg::None,
            );
        }
        let cur = Cursor::with_index(region, start, index.spans());
        self.top(cur)
    }

    /// Applies `allow_think` and `allow_code_fence`; returns the byte range to parse.
    fn strip_envelope_text(&self, text: &str) -> (usize, usize) {
        let mut lo = 0usize;
        let mut hi = text.len();
        if self.policy.allow_think {
            let t = text.trim_start();
            let lead = text.len() - t.len();
            if t.starts_with("<think>") {
                if let Some(p) = t.find("</think>") {
                    lo = lead + p + "</think>".len();
                }
            } else if let Some(p) = text.find("</think>") {
                lo = p + "</think>".len();
            }
        }
        if self.policy.allow_code_fence {
            let body = text.get(lo..hi).unwrap_or("");
            let t = body.trim();
            let off = lo + (body.len() - body.trim_start().len());
            // Drop the info string (`json`) up to the end of the fence line.
            if let Some(rest) = t.strip_prefix("```")
                && let Some(inner) = rest.strip_suffix("```")
                && let Some(nl) = inner.find('\n')
            {
                let info = inner.get(..nl).unwrap_or("").trim();
                if info.is_empty() || info.eq_ignore_ascii_case("json") {
                    lo = off + 3 + nl + 1;
                    hi = off + 3 + inner.len();
                }
            }
        }
        (lo, hi.max(lo))
    }

    fn top(&mut self, mut cur: Cursor<'a, '_>) -> Option<Rubric<'a>> {
        if cur.kind() != Kind::Object {
            let k = cur.kind();
            self.push(
                ViolationCode::Schema,
                Loc::default(),
                Some(cur.pos),
                "the rubric must be a JSON object, found",
                Arg::Text(ShortText::new(k.name())),
            );
            return None;
        }
        let mut categories: Option<Cursor<'a, '_>> = None;
        let mut envelope_rubric: Option<Cursor<'a, '_>> = None;
        let mut seen_analysis = false;
        cur.enter(b'{');
        while let Some(k) = cur.next_key() {
            if k.eq_str("categories") {
                if categories.is_some() {
                    self.key_problem(Loc::default(), &k, "duplicate key");
                } else {
                    categories = Some(cur);
                }
            } else if self.policy.allow_envelope && k.eq_str("rubric") && envelope_rubric.is_none()
            {
                envelope_rubric = Some(cur);
            } else if self.policy.allow_envelope && k.eq_str("analysis") && !seen_analysis {
                seen_analysis = true;
            } else {
                self.key_problem(Loc::default(), &k, "unknown key");
            }
            cur.skip_value();
        }
        if categories.is_none()
            && let Some(mut r) = envelope_rubric
        {
            if r.kind() != Kind::Object {
                self.push(
                    ViolationCode::Schema,
                    Loc::default(),
                    Some(r.pos),
                    "\"rubric\" must be an object",
                    Arg::None,
                );
                return None;
            }
            r.enter(b'{');
            while let Some(k) = r.next_key() {
                if k.eq_str("categories") && categories.is_none() {
                    categories = Some(r);
                } else {
                    self.key_problem(Loc::default(), &k, "unknown key in \"rubric\"");
                }
                r.skip_value();
            }
        }
        let Some(mut cats) = categories else {
            self.push(
                ViolationCode::Schema,
                Loc::default(),
                None,
                "missing key",
                Arg::Text(ShortText::new("categories")),
            );
            return None;
        };
        if cats.kind() != Kind::Array {
            self.push(
                ViolationCode::Schema,
                Loc::default(),
                Some(cats.pos),
                "\"categories\" must be an array",
                Arg::None,
            );
            return None;
        }
        self.categories(cats.clone_and_enter())
    }

    fn key_problem(&mut self, loc: Loc, k: &JStr<'a>, note: &'static str) {
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
                    "string too long for the scratch buffer",
                    Arg::None,
                );
                ""
            }
        }
    }

    fn categories(&mut self, mut cur: Cursor<'a, '_>) -> Option<Rubric<'a>> {
        let mut rubric = Rubric::new();
        let mut pos_of: [Option<u8>; 3] = [None; 3];
        let mut weight_ok = [false; 3];
        let mut max_dim_seen: Option<Dimension> = None;
        let mut i = 0usize;
        while cur.next_item() {
            let loc = Loc {
                category: Some(idx(i)),
                ..Loc::default()
            };
            i += 1;
            if cur.kind() != Kind::Object {
                let k = cur.kind();
                self.push(
                    ViolationCode::Schema,
                    loc,
                    Some(cur.pos),
                    "a category must be an object, found",
                    Arg::Text(ShortText::new(k.name())),
                );
                cur.skip_value();
                continue;
            }
            let parsed = walk(&mut cur, |c| self.category(c, loc));
            let Some(d) = parsed.dimension else { continue };
            let Some(slot) = pos_of.get_mut(d.index()) else {
                continue;
            };
            if slot.is_some() {
                self.push(
                    ViolationCode::DuplicateCategory,
                    Loc {
                        dimension: Some(d),
                        ..loc
                    },
                    None,
                    "category given more than once:",
                    Arg::Text(ShortText::new(d.json_name())),
                );
                continue;
            }
            *slot = loc.category;
            if self.policy.require_order
                && let Some(m) = max_dim_seen
                && d < m
            {
                self.push(
                    ViolationCode::CategoryOrder,
                    Loc {
                        dimension: Some(d),
                        ..loc
                    },
                    None,
                    "category out of order, it must come before",
                    Arg::Text(ShortText::new(m.json_name())),
                );
            }
            max_dim_seen = max_dim_seen.max(Some(d));
            if let Some(w) = weight_ok.get_mut(d.index()) {
                *w = parsed.weight.is_some();
            }
            rubric.set_category(d, parsed.weight.unwrap_or(0.0), parsed.rationale);
            for c in &parsed.criteria {
                // Cannot fail: `parsed.criteria` has the same capacity as a rubric dimension.
                let _ = rubric.push_criterion(d, c.title, c.description);
            }
        }
        for d in Dimension::ALL {
            if pos_of.get(d.index()).is_some_and(Option::is_none) {
                self.push(
                    ViolationCode::MissingCategory,
                    Loc {
                        dimension: Some(d),
                        ..Loc::default()
                    },
                    None,
                    "category missing",
                    Arg::None,
                );
            }
        }
        if weight_ok.iter().all(|&x| x) {
            let sum: f64 = rubric.weights().iter().sum();
            let dev = (sum - 1.0).abs();
            // Not `dev > tol`: a NaN sum or a NaN tolerance must fail the check, not pass it.
            let within = matches!(
                dev.partial_cmp(&self.policy.weight_tolerance),
                Some(core::cmp::Ordering::Less | core::cmp::Ordering::Equal)
            );
            if !within {
                self.push(
                    ViolationCode::WeightSum,
                    Loc::default(),
                    None,
                    "category weights sum to",
                    Arg::Number(sum),
                );
            }
        }
        self.duplicate_titles(&rubric, &pos_of);
        if pos_of.iter().all(Option::is_none) {
            return None;
        }
        Some(rubric)
    }

    fn duplicate_titles(&mut self, rubric: &Rubric<'a>, pos_of: &[Option<u8>; 3]) {
        // Trim each title once (not once per pair); blank titles are never duplicates (they
        // are reported as empty_text).
        let mut titles: heapless::Vec<(Dimension, usize, &str), MAX_TOTAL_CRITERIA> =
            heapless::Vec::new();
        for d in Dimension::ALL {
            for (k, c) in rubric.criteria(d).iter().enumerate() {
                // Cannot fail: a rubric holds at most MAX_TOTAL_CRITERIA criteria.
                let _ = titles.push((d, k, c.title.trim()));
            }
        }
        for (j, &(d, k, title)) in titles.iter().enumerate() {
            let dup = titles
                .iter()
                .take(j)
                .any(|&(_, _, earlier)| earlier.eq_ignore_ascii_case(title));
            if dup && !title.is_empty() {
                self.push(
                    ViolationCode::DuplicateTitle,
                    Loc {
                        category: pos_of.get(d.index()).copied().flatten(),
                        dimension: Some(d),
                        criterion: Some(idx(k)),
                    },
                    None,
                    "duplicate title",
                    Arg::Text(ShortText::new(title)),
                );
            }
        }
    }

    /// Walks the category object at `c`, leaving `c` after it.
    fn category(&mut self, c: &mut Cursor<'a, '_>, loc0: Loc) -> ParsedCategory<'a> {
        const KEYS: [&str; 4] = [
            "category",
            "weight_rationale",
            "category_weight",
            "criteria",
        ];
        let mut out = ParsedCategory::default();
        // First pass: the name, so that every violation inside can name its dimension.
        let mut loc = loc0;
        {
            let mut c = *c;
            c.enter(b'{');
            while let Some(k) = c.next_key() {
                if k.eq_str("category") {
                    if let Some(s) = c.clone().string() {
                        let d = Dimension::ALL.into_iter().find(|d| s.eq_str(d.json_name()));
                        loc.dimension = d;
                    }
                    break;
                }
                c.skip_value();
            }
        }
        c.enter(b'{');
        let mut seen = [false; 4];
        let mut last = 0usize;
        let mut order_bad = false;
        while let Some(k) = c.next_key() {
            let Some(ki) = KEYS.iter().position(|n| k.eq_str(n)) else {
                self.key_problem(loc, &k, "unknown key");
                c.skip_value();
                continue;
            };
            if seen.get(ki).copied().unwrap_or(false) {
                self.key_problem(loc, &k, "duplicate key");
                c.skip_value();
                continue;
            }
            if let Some(s) = seen.get_mut(ki) {
                *s = true;
            }
            if ki < last {
                order_bad = true;
            }
            last = last.max(ki);
            match ki {
                0 => match c.string() {
                    Some(s) => {
                        out.dimension = loc.dimension;
                        if out.dimension.is_none() {
                            self.push(
                                ViolationCode::UnknownCategory,
                                loc,
                                Some(s.offset),
                                "unknown category",
                                Arg::Text(ShortText::from_chars(s.chars())),
                            );
                        }
                    }
                    None => self.wrong_type(c, loc, "\"category\" must be a string, found"),
                },
                1 => match c.string() {
                    Some(s) => {
                        let t = self.text(loc, &s);
                        if is_blank(t) && s.chars().all(char::is_whitespace) {
                            self.push(
                                ViolationCode::EmptyText,
                                loc,
                                Some(s.offset),
                                "blank weight_rationale",
                                Arg::None,
                            );
                        }
                        self.meta(loc, t);
                        out.rationale = t;
                    }
                    None => self.wrong_type(c, loc, "\"weight_rationale\" must be a string, found"),
                },
                2 => match c.number() {
                    Some(n) => {
                        let w = n.parse::<f64>().unwrap_or(f64::NAN);
                        if !(0.0..=1.0).contains(&w) {
                            self.push(
                                ViolationCode::WeightRange,
                                loc,
                                None,
                                "category_weight outside [0, 1]:",
                                Arg::Number(w),
                            );
                        }
                        out.weight = Some(w);
                    }
                    None => self.wrong_type(c, loc, "\"category_weight\" must be a number, found"),
                },
                _ => {
                    if c.kind() == Kind::Array {
                        walk(c, |c| self.criteria(c, loc, &mut out));
                    } else {
                        self.wrong_type(c, loc, "\"criteria\" must be an array, found");
                    }
                }
            }
        }
        for (ki, name) in KEYS.iter().enumerate() {
            if !seen.get(ki).copied().unwrap_or(true) {
                self.push(
                    ViolationCode::Schema,
                    loc,
                    None,
                    "missing key",
                    Arg::Text(ShortText::new(name)),
                );
            }
        }
        if order_bad && self.policy.require_key_order {
            self.push(
                ViolationCode::KeyOrder,
                loc,
                None,
                "keys must be in the order category, weight_rationale, category_weight, criteria",
                Arg::None,
            );
        }
        out
    }

    fn wrong_type(&mut self, c: &mut Cursor<'a, '_>, loc: Loc, note: &'static str) {
        let k = c.kind();
        let pos = c.pos;
        self.push(
            ViolationCode::Schema,
            loc,
            Some(pos),
            note,
            Arg::Text(ShortText::new(k.name())),
        );
        c.skip_value();
    }

    /// Walks the criteria array at `cur`, leaving `cur` after it.
    fn criteria(&mut self, cur: &mut Cursor<'a, '_>, loc: Loc, out: &mut ParsedCategory<'a>) {
        cur.enter(b'[');
        let mut n = 0usize;
        let mut capacity_reported = false;
        while cur.next_item() {
            let cloc = Loc {
                criterion: Some(idx(n)),
                ..loc
            };
            n += 1;
            if cur.kind() != Kind::Object {
                let k = cur.kind();
                self.push(
                    ViolationCode::Schema,
                    cloc,
                    Some(cur.pos),
                    "a criterion must be an object, found",
                    Arg::Text(ShortText::new(k.name())),
                );
                cur.skip_value();
                continue;
            }
            let crit = walk(cur, |c| self.criterion(c, cloc));
            if out.criteria.push(crit).is_err() && !capacity_reported {
                capacity_reported = true;
                self.push(
                    ViolationCode::Capacity,
                    cloc,
                    None,
                    "more criteria than this library stores per category:",
                    Arg::Count(MAX_CRITERIA as u32),
                );
            }
        }
        let (lo, hi) = (
            usize::from(self.policy.min_criteria),
            usize::from(self.policy.max_criteria),
        );
        if n < lo || n > hi {
            self.push(
                ViolationCode::CriteriaCount,
                loc,
                None,
                "wrong number of criteria:",
                Arg::Count(u32::try_from(n).unwrap_or(u32::MAX)),
            );
        }
    }

    /// Walks the criterion object at `c`, leaving `c` after it.
    fn criterion(&mut self, c: &mut Cursor<'a, '_>, loc: Loc) -> Criterion<'a> {
        const KEYS: [&str; 2] = ["title", "description"];
        let mut crit = Criterion {
            title: "",
            description: "",
        };
        c.enter(b'{');
        let mut seen = [false; 2];
        let mut order_bad = false;
        while let Some(k) = c.next_key() {
            let Some(ki) = KEYS.iter().position(|n| k.eq_str(n)) else {
                self.key_problem(loc, &k, "unknown key");
                c.skip_value();
                continue;
            };
            if seen.get(ki).copied().unwrap_or(false) {
                self.key_problem(loc, &k, "duplicate key");
                c.skip_value();
                continue;
            }
            if ki == 0 && seen.get(1).copied().unwrap_or(false) {
                order_bad = true;
            }
            if let Some(s) = seen.get_mut(ki) {
                *s = true;
            }
            let Some(s) = c.string() else {
                let note = if ki == 0 {
                    "\"title\" must be a string, found"
                } else {
                    "\"description\" must be a string, found"
                };
                self.wrong_type(c, loc, note);
                continue;
            };
            let t = self.text(loc, &s);
            if is_blank(t) && s.chars().all(char::is_whitespace) {
                let note = if ki == 0 {
                    "blank title"
                } else {
                    "blank description"
                };
                self.push(
                    ViolationCode::EmptyText,
                    loc,
                    Some(s.offset),
                    note,
                    Arg::None,
                );
            }
            self.meta(loc, t);
            if ki == 0 {
                crit.title = t;
            } else {
                crit.description = t;
                if let Err(note) = check_levels(t) {
                    self.push(
                        ViolationCode::LevelFormat,
                        loc,
                        Some(s.offset),
                        note.0,
                        note.1,
                    );
                }
            }
        }
        for (ki, name) in KEYS.iter().enumerate() {
            if !seen.get(ki).copied().unwrap_or(true) {
                self.push(
                    ViolationCode::Schema,
                    loc,
                    None,
                    "missing key",
                    Arg::Text(ShortText::new(name)),
                );
            }
        }
        if order_bad && self.policy.require_key_order {
            self.push(
                ViolationCode::KeyOrder,
                loc,
                None,
                "keys must be in the order title, description",
                Arg::None,
            );
        }
        crit
    }

    fn meta(&mut self, loc: Loc, t: &str) {
        if !self.policy.meta_words {
            return;
        }
        if let Some(w) = find_meta_word(t) {
            self.push(
                ViolationCode::MetaWord,
                loc,
                None,
                "forbidden meta word",
                Arg::Text(ShortText::new(w)),
            );
        }
    }
}

impl<'a, 'i> Cursor<'a, 'i> {
    /// A copy of the cursor positioned inside the container that starts here.
    fn clone_and_enter(&self) -> Cursor<'a, 'i> {
        let mut c = *self;
        c.enter(b'{');
        if c.pos == self.pos {
            c.enter(b'[');
        }
        c
    }
}

/// Runs `f`, which walks the container at `cur` and leaves `cur` just after it: the walkers
/// consume every value and the closing bracket, so on checked text (all [`validate`] walks)
/// this is exact, and each value is walked once instead of being skipped first and walked
/// after. Debug builds (tests, fuzzing) check that against [`Cursor::skip_value`]; should a walk
/// ever fail to advance, `cur` is skipped past the container, so callers always make progress.
fn walk<'a, 'i, R>(cur: &mut Cursor<'a, 'i>, f: impl FnOnce(&mut Cursor<'a, 'i>) -> R) -> R {
    let start = *cur;
    let r = f(cur);
    let skipped = || {
        let mut s = start;
        s.skip_value();
        s
    };
    debug_assert_eq!(
        cur.pos,
        skipped().pos,
        "walk and skip disagree at {}",
        start.pos
    );
    if cur.pos <= start.pos {
        *cur = skipped();
    }
    r
}

#[derive(Default)]
struct ParsedCategory<'a> {
    dimension: Option<Dimension>,
    weight: Option<f64>,
    rationale: &'a str,
    criteria: heapless::Vec<Criterion<'a>, MAX_CRITERIA>,
}

/// The required end of every description.
pub const LEVEL_SUFFIX: &str = "value: 0, 1, 2, 3, 4, 5";

/// Checks the level anchors of a description (SPEC §3 `level_format`); the error is the first
/// problem found.
fn check_levels(desc: &str) -> Result<(), (&'static str, Arg)> {
    const ANCHORS: [&str; 6] = ["[0]", "[1]", "[2]", "[3]", "[4]", "[5]"];
    let trimmed = desc.trim_end();
    let Some(body) = trimmed.strip_suffix(LEVEL_SUFFIX) else {
        return Err((
            "description must end with",
            Arg::Text(ShortText::new(LEVEL_SUFFIX)),
        ));
    };
    // One pass over the body finds every anchor (`[` digit `]`; three bytes cannot overlap
    // another match), then the anchors are judged in order, so the first problem reported is
    // the same as searching for `[0]`, then `[1]`, ... one at a time.
    let mut pos = [0usize; 6];
    let mut seen = [0u32; 6];
    let bytes = body.as_bytes();
    let mut from = 0usize;
    while let Some(p) = json::find_byte(bytes, from, b'[') {
        from = p + 1;
        if let Some(&[d @ b'0'..=b'5', b']']) = bytes.get(p + 1..p + 3) {
            let k = usize::from(d - b'0');
            if let (Some(n), Some(slot)) = (seen.get_mut(k), pos.get_mut(k)) {
                if *n == 0 {
                    *slot = p;
                }
                *n += 1;
            }
            from = p + 3;
        }
    }
    for (k, a) in ANCHORS.iter().enumerate() {
        match seen.get(k).copied().unwrap_or(0) {
            0 => return Err(("missing anchor", Arg::Text(ShortText::new(a)))),
            1 => {}
            _ => {
                return Err((
                    "anchor appears more than once:",
                    Arg::Text(ShortText::new(a)),
                ));
            }
        }
    }
    for k in 0..6 {
        let start = pos.get(k).copied().unwrap_or(0) + 3;
        let end = if k == 5 {
            body.len()
        } else {
            pos.get(k + 1).copied().unwrap_or(0)
        };
        let anchor = ANCHORS.get(k).copied().unwrap_or("");
        if end < start {
            return Err((
                "anchors out of order at",
                Arg::Text(ShortText::new(ANCHORS.get(k + 1).copied().unwrap_or(""))),
            ));
        }
        if body.get(start..end).is_none_or(is_blank) {
            return Err(("no text after anchor", Arg::Text(ShortText::new(anchor))));
        }
    }
    Ok(())
}

/// The forbidden meta words of SPEC §3 (matched whole-word, case-insensitively, with any
/// whitespace between the words of a phrase).
pub const META_WORDS: [&str; 7] = [
    "gold",
    "reference",
    "ideal",
    "ground truth",
    "target response",
    "target answer",
    "target reply",
];

/// The first meta word found in `text`, if any.
pub fn find_meta_word(text: &str) -> Option<&'static str> {
    let b = text.as_bytes();
    let is_word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    for start in 0..b.len() {
        if start > 0 && b.get(start - 1).is_some_and(|&c| is_word(c)) {
            continue;
        }
        for w in META_WORDS {
            if let Some(end) = match_phrase(b, start, w.as_bytes())
                && !b.get(end).is_some_and(|&c| is_word(c))
            {
                return Some(w);
            }
        }
    }
    None
}

/// Matches `phrase` at `b[start..]` ASCII-case-insensitively, a space in the phrase matching a
/// run of whitespace; returns the end offset.
fn match_phrase(b: &[u8], start: usize, phrase: &[u8]) -> Option<usize> {
    let mut i = start;
    for &p in phrase {
        if p == b' ' {
            let j = json::skip_ws(b, i);
            if j == i {
                return None;
            }
            i = j;
        } else {
            if !b.get(i)?.eq_ignore_ascii_case(&p) {
                return None;
            }
            i += 1;
        }
    }
    Some(i)
}
