//! The validator: one pass over the rubric JSON that recovers the rubric and reports every
//! violation of the contract.

use super::checks::{check_levels, find_meta_word, is_blank};
use super::notes::{self, Note};
use super::policy::FormatPolicy;
use super::report::{Arg, Report, ShortText, Validation, Violation, ViolationCode};
use crate::Result;
use crate::json::{self, Cursor, JStr, Kind};
use crate::rubric::{Criterion, Dimension, MAX_CRITERIA, MAX_TOTAL_CRITERIA, Rubric};

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

/// What a caller's syntax pass learned about one JSON value in a text, for
/// [`validate_indexed_into`]: the value's extent, where its strings start and end, and the
/// extent of the containers that are its direct children. Offsets are bytes into the text
/// given to [`validate_indexed_into`].
///
/// Fill it while checking the text: [`SyntaxIndex::string`] for every string in text order
/// (keys included), [`SyntaxIndex::child`] for each container directly inside the value, and
/// [`SyntaxIndex::value`] last. What is not recorded costs the validator a scan of those bytes,
/// never a different result: strings past the first 128, a string that starts before the
/// previous one ended (out of order), containers past the first 8 and offsets past
/// `u32::MAX` are dropped.
#[derive(Clone, Debug)]
pub struct SyntaxIndex {
    value: Option<(usize, usize)>,
    strings: json::StringIndex<STRING_INDEX_CAPACITY>,
}

impl Default for SyntaxIndex {
    fn default() -> Self {
        Self::new()
    }
}

impl SyntaxIndex {
    /// An empty index.
    #[must_use]
    pub fn new() -> Self {
        SyntaxIndex {
            value: None,
            strings: json::StringIndex::new(),
        }
    }

    /// Forgets everything recorded, for the next text.
    pub fn clear(&mut self) {
        self.value = None;
        self.strings.clear();
    }

    /// Records a string: `start` at its opening quote, `end` just after its closing quote, and
    /// whether it holds an escape.
    #[inline]
    pub fn string(&mut self, start: usize, end: usize, escaped: bool) {
        let in_order = self.strings.spans().is_empty() || start >= self.strings.last_end();
        if in_order && start < end {
            self.strings.record(start, end, escaped);
        }
    }

    /// Records a container that is a direct child of the value: `start` at its opening bracket,
    /// `end` just after its closing one.
    #[inline]
    pub fn child(&mut self, start: usize, end: usize) {
        if start < end {
            self.strings.record_child(start, end);
        }
    }

    /// Records the checked value: `start` at its first byte, `end` just after its last.
    pub fn value(&mut self, start: usize, end: usize) {
        self.value = (start < end).then_some((start, end));
    }

    /// Whether this index says only what the validator's own syntax pass says about `text`: the
    /// value at the recorded start is one JSON value that ends at the recorded end, and every
    /// recorded string and child is one that pass records, at the same place. It costs that
    /// pass; for tests and debug checks of a caller's syntax pass.
    #[must_use]
    pub fn matches(&self, text: &str) -> bool {
        let Some((start, end)) = self.value else {
            return false;
        };
        let mut own = json::StringIndex::<STRING_INDEX_CAPACITY>::new();
        json::scan_value_indexed(text.as_bytes(), start, &mut own) == Ok(end)
            && self.strings.within(&own)
    }
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

    /// Validates `text`; the rubric, when one is recovered, is built in `slot` (left `None`
    /// otherwise), so that it is never copied on the way out.
    fn run_str(&mut self, text: &'a str, slot: &mut Option<Rubric<'a>>) {
        let (lo, hi) = self.strip_envelope_text(text);
        let region = text.get(..hi).unwrap_or("");
        let b = region.as_bytes();
        let start = json::skip_ws(b, lo);
        if start >= hi {
            self.push(
                ViolationCode::NotJson,
                Loc::default(),
                Some(start),
                notes::EMPTY_TEXT,
                Arg::None,
            );
            return;
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
                            notes::TEXT_BEFORE,
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
                        return;
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
                notes::TEXT_AFTER,
                Arg::None,
            );
        }
        let cur = Cursor::with_index(region, start, index.spans());
        self.top(cur, &index, slot);
    }

    /// [`Validator::run_str`] with the caller's syntax pass in place of its own (see
    /// [`validate_indexed_into`]).
    fn run_indexed(&mut self, text: &'a str, index: &SyntaxIndex, slot: &mut Option<Rubric<'a>>) {
        let (lo, hi) = self.strip_envelope_text(text);
        let b = text.as_bytes();
        let Some((start, end)) = index
            .value
            .filter(|&(s, e)| e <= hi && json::skip_ws(b, lo) == s && s < e)
        else {
            self.own_index = true;
            return self.run_str(text, slot);
        };
        let region = text.get(..hi).unwrap_or("");
        let after = json::skip_ws(region.as_bytes(), end);
        if after < hi {
            self.push(
                ViolationCode::TrailingText,
                Loc::default(),
                Some(after),
                notes::TEXT_AFTER,
                Arg::None,
            );
        }
        let cur = Cursor::with_index(region, start, index.strings.spans());
        self.top(cur, &index.strings, slot);
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

    /// The rubric object at `cur`; `index` is the syntax pass's, whose child extents let the
    /// top-level walk step over `categories` without reading it (it is walked afterwards).
    fn top(
        &mut self,
        mut cur: Cursor<'a, '_>,
        index: &json::StringIndex<STRING_INDEX_CAPACITY>,
        slot: &mut Option<Rubric<'a>>,
    ) {
        if cur.kind() != Kind::Object {
            let k = cur.kind();
            self.push(
                ViolationCode::Schema,
                Loc::default(),
                Some(cur.pos),
                notes::RUBRIC_NOT_OBJECT,
                Arg::Text(ShortText::new(k.name())),
            );
            return;
        }
        let mut categories: Option<Cursor<'a, '_>> = None;
        let mut envelope_rubric: Option<Cursor<'a, '_>> = None;
        let mut seen_analysis = false;
        cur.enter(b'{');
        while let Some(k) = cur.next_key() {
            if k.eq_str("categories") {
                if categories.is_some() {
                    self.key_problem(Loc::default(), &k, notes::DUPLICATE_KEY);
                } else {
                    categories = Some(cur);
                }
            } else if self.policy.allow_envelope && k.eq_str("rubric") && envelope_rubric.is_none()
            {
                envelope_rubric = Some(cur);
            } else if self.policy.allow_envelope && k.eq_str("analysis") && !seen_analysis {
                seen_analysis = true;
            } else {
                self.key_problem(Loc::default(), &k, notes::UNKNOWN_KEY);
            }
            skip_child(&mut cur, index, self.own_index);
        }
        if categories.is_none()
            && let Some(mut r) = envelope_rubric
        {
            if r.kind() != Kind::Object {
                self.push(
                    ViolationCode::Schema,
                    Loc::default(),
                    Some(r.pos),
                    notes::ENVELOPE_RUBRIC_NOT_OBJECT,
                    Arg::None,
                );
                return;
            }
            r.enter(b'{');
            while let Some(k) = r.next_key() {
                if k.eq_str("categories") && categories.is_none() {
                    categories = Some(r);
                } else {
                    self.key_problem(Loc::default(), &k, notes::UNKNOWN_KEY_IN_RUBRIC);
                }
                r.skip_value();
            }
        }
        let Some(mut cats) = categories else {
            self.push(
                ViolationCode::Schema,
                Loc::default(),
                None,
                notes::MISSING_KEY,
                Arg::Text(ShortText::new("categories")),
            );
            return;
        };
        if cats.kind() != Kind::Array {
            self.push(
                ViolationCode::Schema,
                Loc::default(),
                Some(cats.pos),
                notes::CATEGORIES_NOT_ARRAY,
                Arg::None,
            );
            return;
        }
        self.categories(cats.clone_and_enter(), slot);
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

    /// Walks the categories array; the rubric is built in `slot` and left there when at least
    /// one category was recognised.
    fn categories(&mut self, mut cur: Cursor<'a, '_>, slot: &mut Option<Rubric<'a>>) {
        let rubric = slot.insert(Rubric::new());
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
                    notes::CATEGORY_NOT_OBJECT,
                    Arg::Text(ShortText::new(k.name())),
                );
                cur.skip_value();
                continue;
            }
            let parsed = walk(&mut cur, self.own_index, |c| self.category(c, loc));
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
                    notes::CATEGORY_TWICE,
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
                    notes::CATEGORY_OUT_OF_ORDER,
                    Arg::Text(ShortText::new(m.json_name())),
                );
            }
            max_dim_seen = max_dim_seen.max(Some(d));
            if let Some(w) = weight_ok.get_mut(d.index()) {
                *w = parsed.weight.is_some();
            }
            rubric.set_category(d, parsed.weight.unwrap_or(0.0), parsed.rationale);
            rubric.set_weight_text(d, parsed.weight_text);
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
                    notes::CATEGORY_MISSING,
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
                    notes::WEIGHTS_SUM_TO,
                    Arg::Number(sum),
                );
            }
        }
        self.duplicate_titles(rubric, &pos_of);
        if pos_of.iter().all(Option::is_none) {
            *slot = None;
        }
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
                    notes::DUPLICATE_TITLE,
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
                self.key_problem(loc, &k, notes::UNKNOWN_KEY);
                c.skip_value();
                continue;
            };
            if seen.get(ki).copied().unwrap_or(false) {
                self.key_problem(loc, &k, notes::DUPLICATE_KEY);
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
                                notes::UNKNOWN_CATEGORY,
                                Arg::Text(ShortText::from_chars(s.chars())),
                            );
                        }
                    }
                    None => self.wrong_type(c, loc, notes::CATEGORY_NOT_STRING),
                },
                1 => match c.string() {
                    Some(s) => {
                        let t = self.text(loc, &s);
                        if is_blank(t) && s.chars().all(char::is_whitespace) {
                            self.push(
                                ViolationCode::EmptyText,
                                loc,
                                Some(s.offset),
                                notes::BLANK_RATIONALE,
                                Arg::None,
                            );
                        }
                        self.meta(loc, t);
                        out.rationale = t;
                    }
                    None => self.wrong_type(c, loc, notes::RATIONALE_NOT_STRING),
                },
                2 => match c.number() {
                    Some(n) => {
                        let w = n.parse::<f64>().unwrap_or(f64::NAN);
                        if !(0.0..=1.0).contains(&w) {
                            self.push(
                                ViolationCode::WeightRange,
                                loc,
                                None,
                                notes::WEIGHT_OUT_OF_RANGE,
                                Arg::Number(w),
                            );
                        }
                        out.weight = Some(w);
                        out.weight_text = n;
                    }
                    None => self.wrong_type(c, loc, notes::WEIGHT_NOT_NUMBER),
                },
                _ => {
                    if c.kind() == Kind::Array {
                        walk(c, self.own_index, |c| self.criteria(c, loc, &mut out));
                    } else {
                        self.wrong_type(c, loc, notes::CRITERIA_NOT_ARRAY);
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
                    notes::MISSING_KEY,
                    Arg::Text(ShortText::new(name)),
                );
            }
        }
        if order_bad && self.policy.require_key_order {
            self.push(
                ViolationCode::KeyOrder,
                loc,
                None,
                notes::CATEGORY_KEY_ORDER,
                Arg::None,
            );
        }
        out
    }

    fn wrong_type(&mut self, c: &mut Cursor<'a, '_>, loc: Loc, note: Note) {
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
                    notes::CRITERION_NOT_OBJECT,
                    Arg::Text(ShortText::new(k.name())),
                );
                cur.skip_value();
                continue;
            }
            let crit = walk(cur, self.own_index, |c| self.criterion(c, cloc));
            if out.criteria.push(crit).is_err() && !capacity_reported {
                capacity_reported = true;
                self.push(
                    ViolationCode::Capacity,
                    cloc,
                    None,
                    notes::TOO_MANY_CRITERIA,
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
                notes::CRITERIA_COUNT,
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
                self.key_problem(loc, &k, notes::UNKNOWN_KEY);
                c.skip_value();
                continue;
            };
            if seen.get(ki).copied().unwrap_or(false) {
                self.key_problem(loc, &k, notes::DUPLICATE_KEY);
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
                    notes::TITLE_NOT_STRING
                } else {
                    notes::DESCRIPTION_NOT_STRING
                };
                self.wrong_type(c, loc, note);
                continue;
            };
            let t = self.text(loc, &s);
            if is_blank(t) && s.chars().all(char::is_whitespace) {
                let note = if ki == 0 {
                    notes::BLANK_TITLE
                } else {
                    notes::BLANK_DESCRIPTION
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
                    notes::MISSING_KEY,
                    Arg::Text(ShortText::new(name)),
                );
            }
        }
        if order_bad && self.policy.require_key_order {
            self.push(
                ViolationCode::KeyOrder,
                loc,
                None,
                notes::CRITERION_KEY_ORDER,
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
                notes::META_WORD,
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

/// Skips the value at `cur`, a member of the top-level object: in one step when the syntax pass
/// recorded its extent (debug builds check that against [`Cursor::skip_value`]), else by
/// walking over it.
fn skip_child<const N: usize>(
    cur: &mut Cursor<'_, '_>,
    index: &json::StringIndex<N>,
    verify: bool,
) {
    let _ = cur.peek();
    match index.child_end(cur.pos) {
        Some(end) => {
            debug_assert!(
                !verify
                    || end == {
                        let mut s = *cur;
                        s.skip_value();
                        s.pos
                    },
                "child extent and skip disagree at {}",
                cur.pos
            );
            cur.pos = end;
        }
        None => cur.skip_value(),
    }
}

/// Runs `f`, which walks the container at `cur` and leaves `cur` just after it: the walkers
/// consume every value and the closing bracket, so on checked text (all [`validate`] walks)
/// this is exact, and each value is walked once instead of being skipped first and walked
/// after. Debug builds (tests, fuzzing) check that against [`Cursor::skip_value`] when `verify`
/// (the string index is the validator's own); should a walk ever fail to advance, `cur` is
/// skipped past the container, so callers always make progress.
fn walk<'a, 'i, R>(
    cur: &mut Cursor<'a, 'i>,
    verify: bool,
    f: impl FnOnce(&mut Cursor<'a, 'i>) -> R,
) -> R {
    let start = *cur;
    let r = f(cur);
    let skipped = || {
        let mut s = start;
        s.skip_value();
        s
    };
    debug_assert!(
        !verify || cur.pos == skipped().pos,
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
    weight_text: &'a str,
    rationale: &'a str,
    criteria: heapless::Vec<Criterion<'a>, MAX_CRITERIA>,
}
