//! The pass over the whole text: the envelope (`<think>`, code fences), the syntax pass and the
//! top-level rubric object.

use super::index::skip_child;
use super::{Loc, STRING_INDEX_CAPACITY, SyntaxIndex, Validator};
use crate::format::notes;
use crate::format::report::{Arg, ShortText, ViolationCode};
use crate::json::{self, Cursor, Kind};
use crate::rubric::Rubric;

impl<'a> Validator<'a, '_> {
    /// Validates `text`; the rubric, when one is recovered, is built in `slot` (left `None`
    /// otherwise), so that it is never copied on the way out.
    pub(super) fn run_str(&mut self, text: &'a str, slot: &mut Option<Rubric<'a>>) {
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
    ///
    /// [`validate_indexed_into`]: super::validate_indexed_into
    pub(super) fn run_indexed(
        &mut self,
        text: &'a str,
        index: &SyntaxIndex,
        slot: &mut Option<Rubric<'a>>,
    ) {
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
}

impl<'a, 'i> Cursor<'a, 'i> {
    /// A copy of the cursor positioned inside the container that starts here.
    pub(super) fn clone_and_enter(&self) -> Cursor<'a, 'i> {
        let mut c = *self;
        c.enter(b'{');
        if c.pos == self.pos {
            c.enter(b'[');
        }
        c
    }
}
