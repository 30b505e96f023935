//! Profile JSON: parsing and validation with every violation reported.
//!
//! Like [`crate::format::validate`] for rubrics: one pass over the JSON (the crate's zero-copy
//! scanner, no recursion, no allocation) that reports **every** violation (up to
//! [`MAX_PROFILE_VIOLATIONS`], then an overflow flag), each with a stable code, where it is and
//! a one-line message. A profile with any violation is rejected as a whole: a half-valid
//! profile would score with rules nobody wrote. The schema is documented in `docs/PROFILES.md`.

use core::fmt::{self, Write};

use super::{
    CritLayout, DimLayout, EmotionLayout, MAX_DIMENSIONS, MAX_EMOTION_LABELS, MAX_EMOTION_SYNONYMS,
    MAX_NAME_BYTES, MAX_PROFILE_CRITERIA, MAX_SCALE, MAX_SPANS, MAX_VETOES, Profile, ProfileLayout,
    RubricSource, SpansLayout, StrRef, Veto,
};
use crate::format::{Arg, ShortText};
use crate::json::{self, JStr, Kind, PlainCursor};
use crate::rubric::Dimension;

/// Most violations a [`ProfileReport`] holds; more set [`ProfileReport::overflowed`].
pub const MAX_PROFILE_VIOLATIONS: usize = 64;

/// Longest profile text (offsets are `u32`); a longer one is a `capacity` violation, found
/// before any scratch is used, so callers size no scratch for it.
pub const MAX_PROFILE_TEXT_BYTES: usize = u32::MAX as usize;

/// Allowed `|sum(w) - 1|` of a fixed profile's dimension weights (as for rubrics).
pub const PROFILE_WEIGHT_TOLERANCE: f64 = 1e-3;

/// Largest `|weight|` of a criterion.
pub const MAX_CRITERION_WEIGHT: f64 = 1e6;

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
    Capacity = 4,
    /// A blank name, title, description, span name or label.
    EmptyText = 5,
    /// Two dimensions, criteria of one dimension, spans or emotion labels with the same name, or
    /// two vetoes of one dimension.
    DuplicateName = 6,
    /// A dimension or emotion weight outside `[0, 1]`.
    WeightRange = 7,
    /// Dimension weights that do not sum to 1 within [`PROFILE_WEIGHT_TOLERANCE`].
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

    fn push(&mut self, v: ProfileViolation) {
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

/// The result of [`parse_profile`]: the profile when the text has no violation, and the report.
#[derive(Clone, Debug, PartialEq)]
pub struct ProfileValidation<'a> {
    /// The profile, when there is no violation at all.
    pub profile: Option<Profile<'a>>,
    /// Every violation found.
    pub report: ProfileReport,
}

/// Parses and validates profile JSON.
///
/// Strings without escapes are borrowed from `text`; strings with escapes are decoded into
/// `scratch` (decoding never makes a string longer, so `text.len()` bytes always suffice; a
/// string that does not fit is a `capacity` violation). Never panics, never allocates.
pub fn parse_profile<'a>(text: &'a [u8], scratch: &'a mut [u8]) -> ProfileValidation<'a> {
    let mut p = Parser {
        text: "",
        scratch,
        used: 0,
        report: ProfileReport::default(),
        layout: ProfileLayout::default(),
        span_names: heapless::Vec::new(),
    };
    match core::str::from_utf8(text) {
        Ok(t) => {
            p.text = t;
            p.run();
        }
        Err(e) => p.push(
            ProfileCode::NotJson,
            ProfilePath::Root,
            Some(e.valid_up_to()),
            "the text is not valid UTF-8",
            Arg::None,
        ),
    }
    let Parser {
        text,
        scratch,
        used,
        report,
        layout,
        ..
    } = p;
    let scratch: &'a [u8] = scratch;
    let decoded = scratch
        .get(..used)
        .and_then(|d| core::str::from_utf8(d).ok());
    let profile = match decoded {
        Some(d) if report.is_ok() => Some(Profile::from_parts(text, d, layout)),
        _ => None,
    };
    ProfileValidation { profile, report }
}

struct Parser<'a> {
    text: &'a str,
    scratch: &'a mut [u8],
    used: usize,
    report: ProfileReport,
    layout: ProfileLayout,
    /// The valid names of `output.spans` (also when the output section has other faults).
    span_names: heapless::Vec<StrRef, MAX_SPANS>,
}

/// The top-level keys, in the order they are processed (later ones refer to earlier ones).
const TOP_KEYS: [&str; 8] = [
    "name",
    "description",
    "rubric",
    "scores",
    "dimensions",
    "output",
    "emotion",
    "vetoes",
];

fn is_blank(s: &str) -> bool {
    s.trim().is_empty()
}

fn names_equal(a: &str, b: &str) -> bool {
    a.trim().eq_ignore_ascii_case(b.trim())
}

impl<'a> Parser<'a> {
    fn push(
        &mut self,
        code: ProfileCode,
        path: ProfilePath,
        offset: Option<usize>,
        note: &'static str,
        arg: Arg,
    ) {
        self.report.push(ProfileViolation {
            code,
            path,
            offset,
            note,
            arg,
        });
    }

    fn get(&self, r: StrRef) -> &str {
        let a = r.start as usize;
        let b = a + r.len as usize;
        if r.decoded {
            self.scratch
                .get(a..b)
                .and_then(|s| core::str::from_utf8(s).ok())
                .unwrap_or("")
        } else {
            self.text.get(a..b).unwrap_or("")
        }
    }

    fn run(&mut self) {
        let text = self.text;
        let b = text.as_bytes();
        if b.len() > MAX_PROFILE_TEXT_BYTES {
            self.push(
                ProfileCode::Capacity,
                ProfilePath::Root,
                None,
                "the text is longer than 4 GiB",
                Arg::None,
            );
            return;
        }
        let start = json::skip_ws(b, 0);
        if start >= b.len() {
            self.push(
                ProfileCode::NotJson,
                ProfilePath::Root,
                Some(start),
                "the text is empty",
                Arg::None,
            );
            return;
        }
        let end = match json::scan_value(b, start) {
            Ok(end) => end,
            Err(e) => {
                let code = if e.too_deep {
                    ProfileCode::Capacity
                } else {
                    ProfileCode::NotJson
                };
                self.push(
                    code,
                    ProfilePath::Root,
                    Some(e.offset),
                    e.what.as_str(),
                    Arg::None,
                );
                return;
            }
        };
        let after = json::skip_ws(b, end);
        if after < b.len() {
            self.push(
                ProfileCode::TrailingText,
                ProfilePath::Root,
                Some(after),
                "text after the JSON value",
                Arg::None,
            );
        }
        let mut cur = PlainCursor::new(text, start);
        if cur.kind() != Kind::Object {
            let k = cur.kind();
            self.push(
                ProfileCode::Schema,
                ProfilePath::Root,
                Some(cur.pos),
                "the profile must be a JSON object, found",
                Arg::Text(ShortText::new(k.name())),
            );
            return;
        }
        let mut members: [Option<PlainCursor<'a>>; TOP_KEYS.len()] = [None; TOP_KEYS.len()];
        self.members(&mut cur, ProfilePath::Root, &TOP_KEYS, &mut members);
        let [
            name,
            description,
            rubric,
            scores,
            dimensions,
            output,
            emotion,
            vetoes,
        ] = members;
        match name {
            Some(mut c) => {
                if let Some(r) = self.name(
                    &mut c,
                    ProfilePath::Root,
                    "\"name\" must be a string, found",
                ) {
                    self.layout.name = r;
                }
            }
            None => self.missing(ProfilePath::Root, "name"),
        }
        if let Some(mut c) = description
            && let Some(r) = self.string(
                &mut c,
                ProfilePath::Root,
                "\"description\" must be a string, found",
            )
        {
            self.layout.description = r;
        }
        if let Some(mut c) = rubric {
            self.rubric(&mut c);
        }
        self.layout.min = 0;
        self.layout.max = 5;
        if let Some(mut c) = scores {
            self.scores(&mut c);
        }
        match dimensions {
            Some(mut c) => self.dimensions(&mut c),
            None => self.missing(ProfilePath::Root, "dimensions"),
        }
        if let Some(mut c) = output {
            self.output(&mut c);
        }
        if let Some(mut c) = emotion {
            self.emotion(&mut c);
        }
        if let Some(mut c) = vetoes {
            self.vetoes(&mut c);
        }
    }

    /// Walks the object at `cur`, storing a cursor on the value of each key of `keys`;
    /// unknown and duplicate keys are violations.
    fn members<const N: usize>(
        &mut self,
        cur: &mut PlainCursor<'a>,
        path: ProfilePath,
        keys: &[&str; N],
        out: &mut [Option<PlainCursor<'a>>; N],
    ) {
        cur.enter(b'{');
        while let Some(k) = cur.next_key() {
            match keys.iter().position(|n| k.eq_str(n)) {
                Some(i) if out[i].is_none() => out[i] = Some(*cur),
                Some(_) => self.key_problem(path, &k, "duplicate key"),
                None => self.key_problem(path, &k, "unknown key"),
            }
            cur.skip_value();
        }
    }

    fn key_problem(&mut self, path: ProfilePath, k: &JStr<'a>, note: &'static str) {
        self.push(
            ProfileCode::Schema,
            path,
            Some(k.offset),
            note,
            Arg::Text(ShortText::from_chars(k.chars())),
        );
    }

    fn missing(&mut self, path: ProfilePath, key: &'static str) {
        self.push(
            ProfileCode::Schema,
            path,
            None,
            "missing key",
            Arg::Text(ShortText::new(key)),
        );
    }

    fn wrong_type(&mut self, c: &mut PlainCursor<'a>, path: ProfilePath, note: &'static str) {
        let k = c.kind();
        self.push(
            ProfileCode::Schema,
            path,
            Some(c.pos),
            note,
            Arg::Text(ShortText::new(k.name())),
        );
    }

    /// Stores a JSON string (decoding escapes into the scratch buffer).
    fn store(&mut self, s: &JStr<'a>, path: ProfilePath) -> Option<StrRef> {
        if !s.escaped {
            return StrRef::new(s.offset + 1, s.raw.len(), false);
        }
        let n = s.decoded_len();
        let Some(dst) = self.scratch.get_mut(self.used..self.used + n) else {
            self.push(
                ProfileCode::Capacity,
                path,
                Some(s.offset),
                "string too long for the scratch buffer",
                Arg::None,
            );
            return None;
        };
        let mut k = 0usize;
        for ch in s.chars() {
            let w = ch.len_utf8();
            if let Some(d) = dst.get_mut(k..k + w) {
                ch.encode_utf8(d);
            }
            k += w;
        }
        let r = StrRef::new(self.used, n, true);
        self.used += n;
        r
    }

    /// A string value (`None` after reporting a wrong type with `note`).
    fn string(
        &mut self,
        c: &mut PlainCursor<'a>,
        path: ProfilePath,
        note: &'static str,
    ) -> Option<StrRef> {
        match c.string() {
            Some(s) => self.store(&s, path),
            None => {
                self.wrong_type(c, path, note);
                None
            }
        }
    }

    /// A name: a non-blank string of at most [`MAX_NAME_BYTES`] bytes.
    fn name(
        &mut self,
        c: &mut PlainCursor<'a>,
        path: ProfilePath,
        note: &'static str,
    ) -> Option<StrRef> {
        let at = c.pos;
        let r = self.string(c, path, note)?;
        let s = self.get(r);
        if is_blank(s) {
            self.push(
                ProfileCode::EmptyText,
                path,
                Some(at),
                "blank name",
                Arg::None,
            );
            return None;
        }
        if s.len() > MAX_NAME_BYTES {
            self.push(
                ProfileCode::Capacity,
                path,
                Some(at),
                "name longer than 64 bytes:",
                Arg::Text(ShortText::new(s)),
            );
            return None;
        }
        Some(r)
    }

    fn number(
        &mut self,
        c: &mut PlainCursor<'a>,
        path: ProfilePath,
        note: &'static str,
    ) -> Option<f64> {
        match c.number() {
            Some(n) => Some(n.parse::<f64>().unwrap_or(f64::NAN)),
            None => {
                self.wrong_type(c, path, note);
                None
            }
        }
    }

    /// An integer in `0..=MAX_SCALE` (reported as `score_range` otherwise).
    fn small_int(
        &mut self,
        c: &mut PlainCursor<'a>,
        path: ProfilePath,
        note: &'static str,
    ) -> Option<u8> {
        let at = c.pos;
        let v = self.number(c, path, note)?;
        let ok = v.is_finite() && libm::round(v) == v && (0.0..=f64::from(MAX_SCALE)).contains(&v);
        if !ok {
            self.push(
                ProfileCode::ScoreRange,
                path,
                Some(at),
                "not an integer in 0..=100:",
                Arg::Number(v),
            );
            return None;
        }
        Some(v as u8)
    }

    fn rubric(&mut self, c: &mut PlainCursor<'a>) {
        let at = c.pos;
        let Some(s) = c.string() else {
            self.wrong_type(c, ProfilePath::Root, "\"rubric\" must be a string, found");
            return;
        };
        if s.eq_str("fixed") {
            self.layout.rubric = RubricSource::Fixed;
        } else if s.eq_str("generated") {
            self.layout.rubric = RubricSource::Generated;
        } else {
            self.push(
                ProfileCode::Schema,
                ProfilePath::Root,
                Some(at),
                "\"rubric\" must be \"fixed\" or \"generated\", found",
                Arg::Text(ShortText::from_chars(s.chars())),
            );
        }
    }

    fn scores(&mut self, c: &mut PlainCursor<'a>) {
        let path = ProfilePath::Member("scores");
        if c.kind() != Kind::Object {
            self.wrong_type(c, path, "\"scores\" must be an object, found");
            return;
        }
        let mut m = [None; 2];
        self.members(c, path, &["min", "max"], &mut m);
        let [min, max] = m;
        let min = match min {
            Some(mut c) => self.small_int(&mut c, path, "\"min\" must be a number, found"),
            None => {
                self.missing(path, "min");
                None
            }
        };
        let max = match max {
            Some(mut c) => self.small_int(&mut c, path, "\"max\" must be a number, found"),
            None => {
                self.missing(path, "max");
                None
            }
        };
        if let (Some(lo), Some(hi)) = (min, max) {
            if lo >= hi {
                self.push(
                    ProfileCode::ScoreRange,
                    path,
                    None,
                    "min must be below max; max is",
                    Arg::Count(u32::from(hi)),
                );
            } else {
                self.layout.min = lo;
                self.layout.max = hi;
            }
        }
    }

    fn dimensions(&mut self, c: &mut PlainCursor<'a>) {
        if c.kind() != Kind::Array {
            self.wrong_type(
                c,
                ProfilePath::Root,
                "\"dimensions\" must be an array, found",
            );
            return;
        }
        let generated = self.layout.rubric == RubricSource::Generated;
        // Every weight is a number (in range or not): their sum is then checked too.
        let mut weights_ok = true;
        let mut weight_sum = 0.0f64;
        let mut n = 0usize;
        c.enter(b'[');
        while c.next_item() {
            let path = ProfilePath::Dimension(idx(n));
            n += 1;
            if c.kind() != Kind::Object {
                self.wrong_type(c, path, "a dimension must be an object, found");
                c.skip_value();
                continue;
            }
            let mut item = *c;
            c.skip_value();
            let mut m = [None; 3];
            self.members(&mut item, path, &["name", "weight", "criteria"], &mut m);
            let [name, weight, criteria] = m;
            let name = match name {
                Some(mut c) => self.name(&mut c, path, "\"name\" must be a string, found"),
                None => {
                    self.missing(path, "name");
                    None
                }
            };
            if let Some(r) = name {
                let s = self.get(r);
                let dup = self
                    .layout
                    .dims
                    .iter()
                    .any(|d| names_equal(self.get(d.name), s));
                if dup {
                    self.push(
                        ProfileCode::DuplicateName,
                        path,
                        None,
                        "dimension name given before:",
                        Arg::Text(ShortText::new(s)),
                    );
                }
            }
            let mut dim = DimLayout {
                name: name.unwrap_or_default(),
                first: u8::try_from(self.layout.criteria.len()).unwrap_or(u8::MAX),
                ..DimLayout::default()
            };
            if generated {
                if weight.is_some() || criteria.is_some() {
                    self.push(
                        ProfileCode::Generated,
                        path,
                        None,
                        "a generated rubric's dimension has no \"weight\" or \"criteria\"",
                        Arg::None,
                    );
                }
            } else {
                match weight {
                    Some(mut c) => {
                        let w = self.number(&mut c, path, "\"weight\" must be a number, found");
                        if let Some(w) = w {
                            weight_sum += w;
                        }
                        match w {
                            Some(w) if (0.0..=1.0).contains(&w) => dim.weight = w,
                            Some(w) => {
                                self.push(
                                    ProfileCode::WeightRange,
                                    path,
                                    None,
                                    "weight outside [0, 1]:",
                                    Arg::Number(w),
                                );
                            }
                            None => weights_ok = false,
                        }
                    }
                    None => {
                        weights_ok = false;
                        self.missing(path, "weight");
                    }
                }
                match criteria {
                    Some(mut c) => {
                        if c.kind() == Kind::Array {
                            self.criteria(&mut c, n - 1, &mut dim);
                        } else {
                            self.wrong_type(&mut c, path, "\"criteria\" must be an array, found");
                        }
                    }
                    None => self.missing(path, "criteria"),
                }
            }
            if self.layout.dims.push(dim).is_err() {
                self.push(
                    ProfileCode::Capacity,
                    path,
                    None,
                    "more dimensions than a profile holds:",
                    Arg::Count(MAX_DIMENSIONS as u32),
                );
                break;
            }
        }
        if n == 0 {
            self.push(
                ProfileCode::Schema,
                ProfilePath::Root,
                None,
                "\"dimensions\" must hold at least one dimension",
                Arg::None,
            );
            return;
        }
        if generated {
            let care = self.layout.dims.len() == 3
                && self
                    .layout
                    .dims
                    .iter()
                    .zip(Dimension::ALL)
                    .all(|(d, c)| self.get(d.name) == c.json_name());
            if !care {
                self.push(
                    ProfileCode::Generated,
                    ProfilePath::Root,
                    None,
                    "a generated rubric needs the three CARE dimensions in order",
                    Arg::None,
                );
            }
            if (self.layout.min, self.layout.max) != (0, 5) {
                self.push(
                    ProfileCode::Generated,
                    ProfilePath::Member("scores"),
                    None,
                    "a generated rubric is scored 0..5",
                    Arg::None,
                );
            }
        } else if weights_ok && self.layout.dims.len() == n {
            let sum = weight_sum;
            if sum.is_nan() || (sum - 1.0).abs() > PROFILE_WEIGHT_TOLERANCE {
                self.push(
                    ProfileCode::WeightSum,
                    ProfilePath::Root,
                    None,
                    "dimension weights sum to",
                    Arg::Number(sum),
                );
            }
        }
    }

    fn criteria(&mut self, c: &mut PlainCursor<'a>, d: usize, dim: &mut DimLayout) {
        let first = self.layout.criteria.len();
        let mut n = 0usize;
        let mut full = false;
        c.enter(b'[');
        while c.next_item() {
            let path = ProfilePath::Criterion(idx(d), idx(n));
            n += 1;
            if c.kind() != Kind::Object {
                self.wrong_type(c, path, "a criterion must be an object, found");
                c.skip_value();
                continue;
            }
            let mut item = *c;
            c.skip_value();
            let mut m = [None; 3];
            self.members(&mut item, path, &["title", "description", "weight"], &mut m);
            let [title, description, weight] = m;
            let mut crit = CritLayout {
                weight: 1.0,
                ..CritLayout::default()
            };
            match title {
                Some(mut c) => {
                    let at = c.pos;
                    if let Some(r) = self.string(&mut c, path, "\"title\" must be a string, found")
                    {
                        let s = self.get(r);
                        if is_blank(s) {
                            self.push(
                                ProfileCode::EmptyText,
                                path,
                                Some(at),
                                "blank title",
                                Arg::None,
                            );
                        } else if self
                            .layout
                            .criteria
                            .get(first..)
                            .unwrap_or(&[])
                            .iter()
                            .any(|x| names_equal(self.get(x.title), s))
                        {
                            self.push(
                                ProfileCode::DuplicateName,
                                path,
                                Some(at),
                                "criterion title given before in this dimension:",
                                Arg::Text(ShortText::new(s)),
                            );
                        }
                        crit.title = r;
                    }
                }
                None => self.missing(path, "title"),
            }
            match description {
                Some(mut c) => {
                    let at = c.pos;
                    if let Some(r) =
                        self.string(&mut c, path, "\"description\" must be a string, found")
                    {
                        if is_blank(self.get(r)) {
                            self.push(
                                ProfileCode::EmptyText,
                                path,
                                Some(at),
                                "blank description",
                                Arg::None,
                            );
                        }
                        crit.description = r;
                    }
                }
                None => self.missing(path, "description"),
            }
            if let Some(mut c) = weight
                && let Some(w) = self.number(&mut c, path, "\"weight\" must be a number, found")
            {
                if w == 0.0 || !w.is_finite() || w.abs() > MAX_CRITERION_WEIGHT {
                    self.push(
                        ProfileCode::CriterionWeight,
                        path,
                        None,
                        "criterion weight must be finite, non-zero and at most 1e6 in size:",
                        Arg::Number(w),
                    );
                }
                crit.weight = w;
            }
            if self.layout.criteria.push(crit).is_err() && !full {
                full = true;
                self.push(
                    ProfileCode::Capacity,
                    path,
                    None,
                    "more criteria than a profile holds:",
                    Arg::Count(MAX_PROFILE_CRITERIA as u32),
                );
            }
        }
        let stored = self.layout.criteria.get(first..).unwrap_or(&[]);
        dim.count = u8::try_from(stored.len()).unwrap_or(u8::MAX);
        let w0 = stored.first().map_or(0.0, |c| c.weight);
        dim.equal_weights = w0 > 0.0 && stored.iter().all(|c| c.weight == w0);
        let path = ProfilePath::Dimension(idx(d));
        if n == 0 {
            self.push(
                ProfileCode::CriteriaCount,
                path,
                None,
                "a dimension of a fixed rubric needs at least one criterion",
                Arg::None,
            );
        } else if !full && !stored.iter().any(|c| c.weight > 0.0) {
            self.push(
                ProfileCode::CriterionWeight,
                path,
                None,
                "no criterion has a positive weight",
                Arg::None,
            );
        }
    }

    fn output(&mut self, c: &mut PlainCursor<'a>) {
        let path = ProfilePath::Member("output");
        if c.kind() != Kind::Object {
            self.wrong_type(c, path, "\"output\" must be an object, found");
            return;
        }
        let mut m = [None; 5];
        self.members(
            c,
            path,
            &["format", "spans", "open", "close", "judge"],
            &mut m,
        );
        let [format, spans, open, close, judge] = m;
        let Some(mut fc) = format else {
            self.missing(path, "format");
            return;
        };
        let at = fc.pos;
        let Some(f) = fc.string() else {
            self.wrong_type(&mut fc, path, "\"format\" must be a string, found");
            return;
        };
        if f.eq_str("none") {
            if spans.is_some() || open.is_some() || close.is_some() || judge.is_some() {
                self.push(
                    ProfileCode::Schema,
                    path,
                    None,
                    "format \"none\" takes no \"spans\", \"open\", \"close\" or \"judge\"",
                    Arg::None,
                );
            }
            return;
        }
        if !f.eq_str("spans") {
            self.push(
                ProfileCode::Schema,
                path,
                Some(at),
                "\"format\" must be \"none\" or \"spans\", found",
                Arg::Text(ShortText::from_chars(f.chars())),
            );
            return;
        }
        let mut layout = SpansLayout::default();
        let mut ok = true;
        match spans {
            Some(mut c) => {
                if c.kind() == Kind::Array {
                    ok &= self.span_names(&mut c, &mut layout);
                } else {
                    ok = false;
                    self.wrong_type(&mut c, path, "\"spans\" must be an array, found");
                }
            }
            None => {
                ok = false;
                self.missing(path, "spans");
            }
        }
        let template = |p: &mut Self, c: Option<PlainCursor<'a>>, key: &'static str| {
            let Some(mut c) = c else {
                p.missing(path, key);
                return None;
            };
            let at = c.pos;
            let note = if key == "open" {
                "\"open\" must be a string, found"
            } else {
                "\"close\" must be a string, found"
            };
            let r = p.string(&mut c, path, note)?;
            let s = p.get(r);
            let Some(i) = s.find("{name}") else {
                p.push(
                    ProfileCode::Template,
                    path,
                    Some(at),
                    "template without {name}:",
                    Arg::Text(ShortText::new(s)),
                );
                return None;
            };
            let (before, after) = (i, s.len() - i - "{name}".len());
            if s.get(i + 6..).is_some_and(|t| t.contains("{name}")) {
                p.push(
                    ProfileCode::Template,
                    path,
                    Some(at),
                    "template with {name} more than once:",
                    Arg::Text(ShortText::new(s)),
                );
                return None;
            }
            if before == 0 {
                p.push(
                    ProfileCode::Template,
                    path,
                    Some(at),
                    "template with no text before {name}:",
                    Arg::Text(ShortText::new(s)),
                );
                return None;
            }
            if before > MAX_NAME_BYTES || after > MAX_NAME_BYTES {
                p.push(
                    ProfileCode::Capacity,
                    path,
                    Some(at),
                    "template part longer than 64 bytes:",
                    Arg::Text(ShortText::new(s)),
                );
                return None;
            }
            Some((
                StrRef::new(r.start as usize, before, r.decoded)?,
                StrRef::new(r.start as usize + i + 6, after, r.decoded)?,
            ))
        };
        let o = template(self, open, "open");
        let cl = template(self, close, "close");
        let templates_ok = match (o, cl) {
            (Some(o), Some(cl)) => {
                layout.open = o;
                layout.close = cl;
                true
            }
            _ => {
                ok = false;
                false
            }
        };
        match judge {
            Some(mut c) => {
                let at = c.pos;
                if let Some(r) = self.string(&mut c, path, "\"judge\" must be a string, found") {
                    let s = self.get(r);
                    match layout.names.iter().position(|n| self.get(*n) == s) {
                        Some(k) => layout.judge = idx(k),
                        None => {
                            ok = false;
                            if !layout.names.is_empty() {
                                self.push(
                                    ProfileCode::UnknownName,
                                    path,
                                    Some(at),
                                    "\"judge\" names no span:",
                                    Arg::Text(ShortText::new(s)),
                                );
                            }
                        }
                    }
                } else {
                    ok = false;
                }
            }
            None => {
                ok = false;
                self.missing(path, "judge");
            }
        }
        // Checked whenever both templates and some span names are usable, whatever else is
        // wrong: every violation of every class is reported in one pass.
        if templates_ok && !layout.names.is_empty() && self.tags_ambiguous(&layout) {
            ok = false;
        }
        // The valid span names stay known to `emotion` even when the output section is
        // rejected, so a fault here is not reported again there as an unknown span.
        self.span_names = layout.names.clone();
        if ok {
            self.layout.spans = Some(layout);
        }
    }

    /// Reads the span names; `false` when any is invalid.
    fn span_names(&mut self, c: &mut PlainCursor<'a>, layout: &mut SpansLayout) -> bool {
        let mut ok = true;
        let mut k = 0usize;
        c.enter(b'[');
        while c.next_item() {
            let path = ProfilePath::Span(idx(k));
            k += 1;
            let at = c.pos;
            let Some(r) = self.name(c, path, "a span name must be a string, found") else {
                ok = false;
                continue;
            };
            let s = self.get(r);
            if !s
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            {
                ok = false;
                self.push(
                    ProfileCode::NameFormat,
                    path,
                    Some(at),
                    "span name with other characters than ASCII letters, digits, '_' and '-':",
                    Arg::Text(ShortText::new(s)),
                );
                continue;
            }
            if layout.names.iter().any(|n| names_equal(self.get(*n), s)) {
                ok = false;
                self.push(
                    ProfileCode::DuplicateName,
                    path,
                    Some(at),
                    "span name given before:",
                    Arg::Text(ShortText::new(s)),
                );
                continue;
            }
            if layout.names.push(r).is_err() {
                ok = false;
                self.push(
                    ProfileCode::Capacity,
                    path,
                    Some(at),
                    "more spans than a profile holds:",
                    Arg::Count(MAX_SPANS as u32),
                );
                break;
            }
        }
        if k == 0 {
            ok = false;
            self.push(
                ProfileCode::Schema,
                ProfilePath::Member("output"),
                None,
                "\"spans\" must hold at least one span name",
                Arg::None,
            );
        }
        ok
    }

    /// Reports (and returns `true`) when one tag equals or contains another, which would make
    /// the output check ambiguous.
    fn tags_ambiguous(&mut self, layout: &SpansLayout) -> bool {
        const TAG_BYTES: usize = 3 * MAX_NAME_BYTES;
        let mut tags: heapless::Vec<([u8; TAG_BYTES], usize), { 2 * MAX_SPANS }> =
            heapless::Vec::new();
        for &n in &layout.names {
            for (a, b) in [layout.open, layout.close] {
                let mut buf = [0u8; TAG_BYTES];
                let mut len = 0usize;
                for part in [self.get(a), self.get(n), self.get(b)] {
                    for &byte in part.as_bytes() {
                        if let Some(slot) = buf.get_mut(len) {
                            *slot = byte;
                        }
                        len += 1;
                    }
                }
                let _ = tags.push((buf, len.min(TAG_BYTES)));
            }
        }
        for (i, (a, la)) in tags.iter().enumerate() {
            for (j, (b, lb)) in tags.iter().enumerate() {
                let (a, b) = (a.get(..*la).unwrap_or(&[]), b.get(..*lb).unwrap_or(&[]));
                if i != j && (a.len() <= b.len()) && b.windows(a.len().max(1)).any(|w| w == a) {
                    let t = core::str::from_utf8(a).unwrap_or("");
                    self.push(
                        ProfileCode::Template,
                        ProfilePath::Member("output"),
                        None,
                        "a tag appears inside another tag:",
                        Arg::Text(ShortText::new(t)),
                    );
                    return true;
                }
            }
        }
        false
    }

    fn emotion(&mut self, c: &mut PlainCursor<'a>) {
        let path = ProfilePath::Member("emotion");
        if c.kind() != Kind::Object {
            self.wrong_type(c, path, "\"emotion\" must be an object, found");
            return;
        }
        let mut m = [None; 3];
        self.members(c, path, &["span", "weight", "labels"], &mut m);
        let [span, weight, labels] = m;
        let mut e = EmotionLayout::default();
        let mut ok = true;
        match span {
            Some(mut c) => {
                let at = c.pos;
                match self.string(&mut c, path, "\"span\" must be a string, found") {
                    Some(r) => {
                        let s = self.get(r);
                        let found = self.span_names.iter().position(|n| self.get(*n) == s);
                        match found {
                            Some(k) => e.span = idx(k),
                            None => {
                                ok = false;
                                self.push(
                                    ProfileCode::UnknownName,
                                    path,
                                    Some(at),
                                    "\"span\" names no output span:",
                                    Arg::Text(ShortText::new(s)),
                                );
                            }
                        }
                    }
                    None => ok = false,
                }
            }
            None => {
                ok = false;
                self.missing(path, "span");
            }
        }
        match weight {
            Some(mut c) => match self.number(&mut c, path, "\"weight\" must be a number, found") {
                Some(w) if (0.0..=1.0).contains(&w) => e.weight = w,
                Some(w) => {
                    ok = false;
                    self.push(
                        ProfileCode::WeightRange,
                        path,
                        None,
                        "emotion weight outside [0, 1]:",
                        Arg::Number(w),
                    );
                }
                None => ok = false,
            },
            None => {
                ok = false;
                self.missing(path, "weight");
            }
        }
        match labels {
            Some(mut c) => {
                if c.kind() == Kind::Object {
                    ok &= self.labels(&mut c, &mut e);
                } else {
                    ok = false;
                    self.wrong_type(&mut c, path, "\"labels\" must be an object, found");
                }
            }
            None => {
                ok = false;
                self.missing(path, "labels");
            }
        }
        if ok {
            self.layout.emotion = Some(e);
        }
    }

    /// Checks one label or synonym; `Some` when it is valid and new.
    fn label(&mut self, s: &JStr<'a>, path: ProfilePath, e: &EmotionLayout) -> Option<StrRef> {
        let r = self.store(s, path)?;
        let t = self.get(r);
        let arg = Arg::Text(ShortText::new(t));
        if is_blank(t) {
            self.push(
                ProfileCode::EmptyText,
                path,
                Some(s.offset),
                "blank label",
                Arg::None,
            );
            return None;
        }
        if t.len() > MAX_NAME_BYTES {
            self.push(
                ProfileCode::Capacity,
                path,
                Some(s.offset),
                "label longer than 64 bytes:",
                arg,
            );
            return None;
        }
        if super::normalize_label(t) != t || t.bytes().any(|b| b.is_ascii_uppercase()) {
            self.push(
                ProfileCode::LabelFormat,
                path,
                Some(s.offset),
                "label not in normalized form:",
                arg,
            );
            return None;
        }
        let seen = e
            .labels
            .iter()
            .map(|l| l.0)
            .chain(e.synonyms.iter().copied())
            .any(|x| self.get(x).eq_ignore_ascii_case(t));
        if seen {
            self.push(
                ProfileCode::DuplicateName,
                path,
                Some(s.offset),
                "label given before:",
                arg,
            );
            return None;
        }
        Some(r)
    }

    fn labels(&mut self, c: &mut PlainCursor<'a>, e: &mut EmotionLayout) -> bool {
        let mut ok = true;
        let mut i = 0usize;
        c.enter(b'{');
        while let Some(k) = c.next_key() {
            let path = ProfilePath::Label(idx(i));
            i += 1;
            let canonical = self.label(&k, path, e);
            ok &= canonical.is_some();
            if c.kind() != Kind::Array {
                ok = false;
                self.wrong_type(c, path, "synonyms must be an array of strings, found");
                c.skip_value();
                continue;
            }
            let first = e.synonyms.len();
            let mut list = *c;
            c.skip_value();
            list.enter(b'[');
            while list.next_item() {
                let Some(s) = list.string() else {
                    ok = false;
                    self.wrong_type(&mut list, path, "a synonym must be a string, found");
                    list.skip_value();
                    continue;
                };
                match self.label(&s, path, e) {
                    Some(r) => {
                        if e.synonyms.push(r).is_err() {
                            ok = false;
                            self.push(
                                ProfileCode::Capacity,
                                path,
                                Some(s.offset),
                                "more synonyms than a profile holds:",
                                Arg::Count(MAX_EMOTION_SYNONYMS as u32),
                            );
                        }
                    }
                    None => ok = false,
                }
            }
            let count = u8::try_from(e.synonyms.len() - first).unwrap_or(u8::MAX);
            if let Some(r) = canonical
                && e.labels.push((r, idx(first), count)).is_err()
            {
                ok = false;
                self.push(
                    ProfileCode::Capacity,
                    path,
                    Some(k.offset),
                    "more labels than a profile holds:",
                    Arg::Count(MAX_EMOTION_LABELS as u32),
                );
            }
        }
        ok
    }

    fn vetoes(&mut self, c: &mut PlainCursor<'a>) {
        if c.kind() != Kind::Array {
            self.wrong_type(c, ProfilePath::Root, "\"vetoes\" must be an array, found");
            return;
        }
        let mut i = 0usize;
        c.enter(b'[');
        while c.next_item() {
            let path = ProfilePath::Veto(idx(i));
            i += 1;
            if c.kind() != Kind::Object {
                self.wrong_type(c, path, "a veto must be an object, found");
                c.skip_value();
                continue;
            }
            let mut item = *c;
            c.skip_value();
            let mut m = [None; 2];
            self.members(&mut item, path, &["dimension", "min_score"], &mut m);
            let [dimension, min_score] = m;
            let dim = match dimension {
                Some(mut c) => {
                    let at = c.pos;
                    self.string(&mut c, path, "\"dimension\" must be a string, found")
                        .and_then(|r| {
                            let s = self.get(r);
                            let found = self.layout.dims.iter().position(|d| self.get(d.name) == s);
                            if found.is_none() {
                                self.push(
                                    ProfileCode::UnknownName,
                                    path,
                                    Some(at),
                                    "veto names no dimension:",
                                    Arg::Text(ShortText::new(s)),
                                );
                            }
                            found
                        })
                }
                None => {
                    self.missing(path, "dimension");
                    None
                }
            };
            let min = match min_score {
                Some(mut c) => {
                    let v = self.small_int(&mut c, path, "\"min_score\" must be a number, found");
                    match v {
                        Some(v) if (self.layout.min..=self.layout.max).contains(&v) => Some(v),
                        Some(v) => {
                            self.push(
                                ProfileCode::ScoreRange,
                                path,
                                None,
                                "min_score outside the score range:",
                                Arg::Count(u32::from(v)),
                            );
                            None
                        }
                        None => None,
                    }
                }
                None => {
                    self.missing(path, "min_score");
                    None
                }
            };
            let (Some(d), Some(min)) = (dim, min) else {
                continue;
            };
            let d = idx(d);
            if self.layout.vetoes.iter().any(|v| v.dimension == d) {
                self.push(
                    ProfileCode::DuplicateName,
                    path,
                    None,
                    "a second veto of one dimension",
                    Arg::None,
                );
                continue;
            }
            if self
                .layout
                .vetoes
                .push(Veto {
                    dimension: d,
                    min_score: min,
                })
                .is_err()
            {
                self.push(
                    ProfileCode::Capacity,
                    path,
                    None,
                    "more vetoes than a profile holds:",
                    Arg::Count(MAX_VETOES as u32),
                );
                break;
            }
        }
    }
}

fn idx(i: usize) -> u8 {
    u8::try_from(i).unwrap_or(u8::MAX)
}
