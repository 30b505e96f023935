//! The categories array: each category, its criteria and the whole-rubric checks across them.

use super::{Loc, Validator, idx};
use crate::format::checks::{check_levels, find_meta_word, is_blank};
use crate::format::notes::{self, Note};
use crate::format::report::{Arg, ShortText, ViolationCode};
use crate::json::{Cursor, Kind};
use crate::rubric::{Criterion, Dimension, MAX_CRITERIA, MAX_TOTAL_CRITERIA, Rubric};

impl<'a> Validator<'a, '_> {
    /// Walks the categories array; the rubric is built in `slot` and left there when at least
    /// one category was recognised.
    pub(super) fn categories(&mut self, mut cur: Cursor<'a, '_>, slot: &mut Option<Rubric<'a>>) {
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

/// Runs `f`, which walks the container at `cur` and leaves `cur` just after it: the walkers
/// consume every value and the closing bracket, so on checked text (all [`validate`] walks)
/// this is exact, and each value is walked once instead of being skipped first and walked
/// after. Debug builds (tests, fuzzing) check that against [`Cursor::skip_value`] when `verify`
/// (the string index is the validator's own); should a walk ever fail to advance, `cur` is
/// skipped past the container, so callers always make progress.
///
/// [`validate`]: super::validate
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
