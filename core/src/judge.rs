//! Judge I/O (SPEC §8): render the rubric-conditioned judge prompt, parse the judge's scores.
//!
//! The parser is lenient about the envelope (think blocks, code fences, prose around the JSON)
//! and strict about the content (known criteria only, integral scores). Its output is a flat
//! score slice in the rubric's canonical order, `NaN` where the judge gave no usable score, ready
//! for [`crate::reward::policy_reward`] or [`crate::batch::policy_reward_group`].

use core::fmt::{self, Write};

use crate::json::{self, Cursor, JStr, Kind, PlainCursor};
use crate::rubric::{Dimension, MAX_TOTAL_CRITERIA, Rubric};
use crate::{Error, Result};

/// Renders the judge prompt: dialogue context, the seeker's current turn, the candidate
/// response, every criterion with its anchors, and the required output shape.
///
/// # Errors
/// Only the writer's own errors.
pub fn render_judge_prompt<W: Write + ?Sized>(
    w: &mut W,
    rubric: &Rubric<'_>,
    context: &[&str],
    seeker_turn: &str,
    response: &str,
) -> fmt::Result {
    write_prompt_head(w, context, seeker_turn, response, 0, 5)?;
    for d in Dimension::ALL {
        let crits = rubric.criteria(d);
        if crits.is_empty() {
            continue;
        }
        write!(w, "\n### {}\n", d.json_name())?;
        for c in crits {
            write_prompt_criterion(w, c.title, c.description, false)?;
        }
    }
    write_prompt_tail(w, 0, 5, false)
}

/// The judge prompt up to its rubric sections (shared by every rubric profile).
pub(crate) fn write_prompt_head<W: Write + ?Sized>(
    w: &mut W,
    context: &[&str],
    seeker_turn: &str,
    response: &str,
    lo: u8,
    hi: u8,
) -> fmt::Result {
    write!(
        w,
        "You are a strict judge of emotional-support responses. Score the candidate supporter \
         response against every criterion of the rubric below, using each criterion's level \
         descriptions [{lo}] to [{hi}].\n\n## Dialogue context\n",
    )?;
    if context.is_empty() {
        w.write_str("(none)\n")?;
    }
    for line in context {
        w.write_str(line.trim_end())?;
        w.write_char('\n')?;
    }
    write!(
        w,
        "\n## Seeker's latest turn\n{}\n\n## Candidate supporter response\n{}\n\n## Rubric\n",
        seeker_turn.trim_end(),
        response.trim_end()
    )
}

/// One criterion of a rubric section; a pitfall (a criterion with a negative weight) says that
/// its score measures how strongly the problem shows.
pub(crate) fn write_prompt_criterion<W: Write + ?Sized>(
    w: &mut W,
    title: &str,
    levels: &str,
    pitfall: bool,
) -> fmt::Result {
    write!(
        w,
        "- criterion_title: {}\n  levels: {}\n",
        title.trim(),
        levels.trim()
    )?;
    if pitfall {
        w.write_str(
            "  pitfall: score how strongly the response shows this problem (higher is worse)\n",
        )?;
    }
    Ok(())
}

/// The required output shape, for integer scores `lo..=hi`.
pub(crate) fn write_prompt_tail<W: Write + ?Sized>(
    w: &mut W,
    lo: u8,
    hi: u8,
    pitfalls: bool,
) -> fmt::Result {
    w.write_str(
        "\n## Output\nReturn only JSON of the form \
         {\"criterion_scores\":[{\"category\":\"...\",\"criterion_title\":\"...\",\"score\":0}]} \
         with exactly one item per criterion above, category and criterion_title copied exactly \
         as given, and each score an integer in ",
    )?;
    if hi.saturating_sub(lo) <= 10 {
        w.write_char('{')?;
        for v in lo..=hi {
            if v > lo {
                w.write_str(", ")?;
            }
            write!(w, "{v}")?;
        }
        w.write_char('}')?;
    } else {
        write!(w, "{lo}..={hi}")?;
    }
    if pitfalls {
        w.write_str(" (higher is better, except for pitfall criteria)")?;
    } else {
        w.write_str(" (higher is better)")?;
    }
    w.write_str(". No rationale, no total.\n")
}

/// What the judge-output parser found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct JudgeReport {
    /// Criteria that received a score.
    pub matched: u32,
    /// Of those, matched only ASCII-case-insensitively.
    pub case_insensitive: u32,
    /// Rubric criteria without a score (`NaN` in the output).
    pub missing: u32,
    /// Items naming an already scored criterion (the first score is kept).
    pub duplicates: u32,
    /// Items naming no criterion of the rubric.
    pub unknown: u32,
    /// Items whose score is not a number or numeric string (left `NaN`).
    pub invalid_scores: u32,
    /// Matched scores that are non-integral or outside `0..=5` (passed through as given; the
    /// scoring's [`crate::reward::RangePolicy`] decides).
    pub out_of_range: u32,
    /// Items that are not objects or lack a key.
    pub malformed_items: u32,
}

impl JudgeReport {
    /// `true` when every criterion got an in-range score and nothing odd was seen.
    pub fn is_clean(&self) -> bool {
        self.missing == 0
            && self.duplicates == 0
            && self.unknown == 0
            && self.invalid_scores == 0
            && self.out_of_range == 0
            && self.malformed_items == 0
    }
}

/// Most candidate objects tried when looking for the JSON (bounds the work on hostile input).
const MAX_CANDIDATES: usize = 64;

/// Parses a judge answer into `out` (flat rubric order, length `rubric.total_criteria()`).
///
/// Strips a `<think>` block (or everything up to a lone `</think>`), prefers the last fenced
/// json block, else the first balanced object holding `criterion_scores`; matches items by
/// `(category, trimmed title)`, exact first, then ASCII-case-insensitive.
///
/// # Errors
/// [`Error::ScoreShape`] when `out` has the wrong length; [`Error::InvalidUtf8`];
/// [`Error::NoJudgeJson`] when no object with a `criterion_scores` array is found (then `out`
/// is all `NaN`).
pub fn parse_judge_output(
    text: &[u8],
    rubric: &Rubric<'_>,
    out: &mut [f64],
) -> Result<JudgeReport> {
    if out.len() != rubric.total_criteria() {
        return Err(Error::ScoreShape);
    }
    parse_scores_with(text, out, (0.0, 5.0), |cat, title| {
        match_criterion(rubric, cat, title)
    })
}

/// The judge-output parser for any rubric: `matcher` maps an item's `(category, title)` to the
/// flat index of its criterion (and whether only a case-insensitive match hit); scores outside
/// `range` or non-integral are counted as `out_of_range`. `out` has one slot per criterion.
pub(crate) fn parse_scores_with(
    text: &[u8],
    out: &mut [f64],
    range: (f64, f64),
    mut matcher: impl FnMut(&JStr<'_>, &JStr<'_>) -> Option<(usize, bool)>,
) -> Result<JudgeReport> {
    out.fill(f64::NAN);
    let text = core::str::from_utf8(text).map_err(|_| Error::InvalidUtf8)?;
    let body = match text.rfind("</think>") {
        Some(p) => text.get(p + "</think>".len()..).unwrap_or(""),
        None => text,
    };
    let arr = find_scores(body).ok_or(Error::NoJudgeJson)?;
    let mut rep = JudgeReport::default();
    let mut cur = arr;
    while cur.next_item() {
        if cur.kind() != Kind::Object {
            rep.malformed_items += 1;
            cur.skip_value();
            continue;
        }
        let mut item = cur;
        cur.skip_value();
        item.enter(b'{');
        let (mut cat, mut title, mut score): (
            Option<JStr<'_>>,
            Option<JStr<'_>>,
            Option<PlainCursor<'_>>,
        ) = (None, None, None);
        while let Some(k) = item.next_key() {
            if k.eq_str("category") && cat.is_none() {
                cat = item.string();
            } else if k.eq_str("criterion_title") && title.is_none() {
                title = item.string();
            } else if k.eq_str("score") && score.is_none() {
                score = Some(item);
            }
            item.skip_value();
        }
        let (Some(cat), Some(title), Some(score)) = (cat, title, score) else {
            rep.malformed_items += 1;
            continue;
        };
        let Some((flat, ci)) = matcher(&cat, &title) else {
            rep.unknown += 1;
            continue;
        };
        let Some(slot) = out.get_mut(flat) else {
            rep.unknown += 1;
            continue;
        };
        // Only finite scores are ever stored, so a slot that is not NaN was already scored.
        if !slot.is_nan() {
            rep.duplicates += 1;
            continue;
        }
        let Some(v) = read_score(score) else {
            rep.invalid_scores += 1;
            continue;
        };
        *slot = v;
        rep.matched += 1;
        rep.case_insensitive += u32::from(ci);
        if !((range.0..=range.1).contains(&v) && libm::round(v) == v) {
            rep.out_of_range += 1;
        }
    }
    rep.missing = out.iter().filter(|x| x.is_nan()).count() as u32;
    Ok(rep)
}

/// The `criterion_scores` array (cursor inside it) of the preferred candidate object.
fn find_scores(body: &str) -> Option<PlainCursor<'_>> {
    // 1. The last fenced block whose info string is `json` (or empty).
    let mut last_fenced: Option<(usize, usize)> = None;
    let mut rest = 0usize;
    while let Some(open) = body
        .get(rest..)
        .and_then(|s| s.find("```"))
        .map(|p| rest + p)
    {
        let info_end = body
            .get(open..)
            .and_then(|s| s.find('\n'))
            .map_or(body.len(), |p| open + p);
        let info = body.get(open + 3..info_end).unwrap_or("").trim();
        let Some(close) = body
            .get(info_end..)
            .and_then(|s| s.find("```"))
            .map(|p| info_end + p)
        else {
            break;
        };
        if info.is_empty() || info.eq_ignore_ascii_case("json") {
            last_fenced = Some((info_end, close));
        }
        rest = close + 3;
    }
    if let Some((a, b)) = last_fenced
        && let Some(inner) = body.get(..b)
        && let Some(c) = first_object_with_scores(inner, a)
    {
        return Some(c);
    }
    // 2. The first balanced object holding `criterion_scores`.
    first_object_with_scores(body, 0)
}

fn first_object_with_scores(text: &str, from: usize) -> Option<PlainCursor<'_>> {
    let b = text.as_bytes();
    let mut i = from;
    for _ in 0..MAX_CANDIDATES {
        let start = i + b.get(i..)?.iter().position(|&c| c == b'{')?;
        match json::scan_value(b, start) {
            Ok(end) => {
                if let Some(arr) = scores_array(Cursor::new(text, start)) {
                    return Some(arr);
                }
                i = end;
            }
            Err(_) => i = start + 1,
        }
    }
    None
}

fn scores_array(mut c: PlainCursor<'_>) -> Option<PlainCursor<'_>> {
    c.enter(b'{');
    while let Some(k) = c.next_key() {
        if k.eq_str("criterion_scores") && c.kind() == Kind::Array {
            c.enter(b'[');
            return Some(c);
        }
        c.skip_value();
    }
    None
}

/// Finds the criterion: returns its flat index and whether only a case-insensitive match hit.
fn match_criterion(rubric: &Rubric<'_>, cat: &JStr<'_>, title: &JStr<'_>) -> Option<(usize, bool)> {
    let dim = Dimension::ALL
        .into_iter()
        .find(|d| cat.trimmed_eq_str(d.json_name(), false))
        .or_else(|| {
            Dimension::ALL
                .into_iter()
                .find(|d| cat.trimmed_eq_str(d.json_name(), true))
        })?;
    let crits = rubric.criteria(dim);
    let (i, ci) = match crits
        .iter()
        .position(|c| title.trimmed_eq_str(c.title, false))
    {
        Some(i) => (i, false),
        None => (
            crits
                .iter()
                .position(|c| title.trimmed_eq_str(c.title, true))?,
            true,
        ),
    };
    let flat = rubric.flat_index(dim, i)?;
    (flat < MAX_TOTAL_CRITERIA).then_some((flat, ci))
}

/// A score: a JSON number, or a string holding one; `None` when neither or not finite.
fn read_score(mut c: PlainCursor<'_>) -> Option<f64> {
    let v = match c.kind() {
        Kind::Number => c.number()?.parse::<f64>().ok()?,
        Kind::String => {
            let s = c.string()?;
            let mut buf = [0u8; 32];
            let mut scratch: &mut [u8] = &mut buf;
            let t = s.materialize(&mut scratch)?;
            let t = t.trim();
            // Only plain decimal numbers: Rust's parser would also accept "inf" and "NaN".
            if !t
                .bytes()
                .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'+' | b'e' | b'E'))
            {
                return None;
            }
            t.parse::<f64>().ok()?
        }
        _ => return None,
    };
    v.is_finite().then_some(v)
}
