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

/// Where the candidate response stands in the judge prompt.
///
/// The judge calls of one GRPO group differ only in the response. Servers with prefix caching
/// (vLLM's automatic prefix caching, SGLang's radix cache) prefill a shared prompt prefix once,
/// so a layout that puts everything the group shares before the response prefills the rubric
/// (the longest part) once per group instead of once per response. Both layouts hold the same
/// sections with the same text; the answer is parsed the same way under either.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum JudgePromptLayout {
    /// Instructions, the rubric, the output shape, the dialogue context, the seeker's latest
    /// turn, then the candidate response last (`shared_prefix`, the default).
    #[default]
    SharedPrefix,
    /// The paper's order: instructions, dialogue context, the seeker's latest turn, the
    /// candidate response, then the rubric and the output shape (`paper`).
    Paper,
}

crate::names::named_enum!(JudgePromptLayout, "judge prompt layout", {
    SharedPrefix => "shared_prefix", "Instructions, rubric and dialogue first, the response last (prefix-cache friendly)";
    Paper => "paper", "The paper's order: dialogue, response, then the rubric";
});

/// Renders the judge prompt in the paper's order: dialogue context, the seeker's current turn,
/// the candidate response, every criterion with its anchors, and the required output shape
/// ([`JudgePromptLayout::Paper`]; [`render_judge_prompt_with`] takes the layout).
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
    render_judge_prompt_with(
        w,
        rubric,
        context,
        seeker_turn,
        response,
        JudgePromptLayout::Paper,
    )
}

/// Renders the judge prompt in `layout`: the same sections as [`render_judge_prompt`], with
/// the candidate response last under [`JudgePromptLayout::SharedPrefix`].
///
/// # Errors
/// Only the writer's own errors.
pub fn render_judge_prompt_with<W: Write + ?Sized>(
    w: &mut W,
    rubric: &Rubric<'_>,
    context: &[&str],
    seeker_turn: &str,
    response: &str,
    layout: JudgePromptLayout,
) -> fmt::Result {
    let rubric_sections = |w: &mut W| -> fmt::Result {
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
    };
    match layout {
        JudgePromptLayout::Paper => {
            write_prompt_head(w, context, seeker_turn, response, 0, 5)?;
            rubric_sections(w)
        }
        JudgePromptLayout::SharedPrefix => {
            write_prompt_intro(w, 0, 5)?;
            w.write_str("\n\n## Rubric\n")?;
            rubric_sections(w)?;
            write_prompt_dialogue_last(w, context, seeker_turn, response)
        }
    }
}

/// The first sentence of every judge prompt.
pub(crate) fn write_prompt_intro<W: Write + ?Sized>(w: &mut W, lo: u8, hi: u8) -> fmt::Result {
    write!(
        w,
        "You are a strict judge of emotional-support responses. Score the candidate supporter \
         response against every criterion of the rubric below, using each criterion's level \
         descriptions [{lo}] to [{hi}].",
    )
}

fn write_prompt_context<W: Write + ?Sized>(w: &mut W, context: &[&str]) -> fmt::Result {
    w.write_str("## Dialogue context\n")?;
    if context.is_empty() {
        w.write_str("(none)\n")?;
    }
    for line in context {
        w.write_str(line.trim_end())?;
        w.write_char('\n')?;
    }
    Ok(())
}

/// The paper layout's judge prompt up to its rubric sections (shared by every rubric profile).
pub(crate) fn write_prompt_head<W: Write + ?Sized>(
    w: &mut W,
    context: &[&str],
    seeker_turn: &str,
    response: &str,
    lo: u8,
    hi: u8,
) -> fmt::Result {
    write_prompt_intro(w, lo, hi)?;
    w.write_str("\n\n")?;
    write_prompt_context(w, context)?;
    write!(
        w,
        "\n## Seeker's latest turn\n{}\n\n## Candidate supporter response\n{}\n\n## Rubric\n",
        seeker_turn.trim_end(),
        response.trim_end()
    )
}

/// The shared-prefix layout's end, after the output shape: the dialogue, then the response
/// (shared by every rubric profile).
pub(crate) fn write_prompt_dialogue_last<W: Write + ?Sized>(
    w: &mut W,
    context: &[&str],
    seeker_turn: &str,
    response: &str,
) -> fmt::Result {
    w.write_char('\n')?;
    write_prompt_context(w, context)?;
    write!(
        w,
        "\n## Seeker's latest turn\n{}\n\n## Candidate supporter response\n{}\n",
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

/// Parses a judge answer into `out` (flat rubric order, length `rubric.total_criteria()`).
///
/// Strips a `<think>` block (or everything up to a lone `</think>`), prefers the last fenced
/// json block, else the first balanced object holding a `criterion_scores` array (found in one
/// linear pass, whatever precedes it; "first" is defined precisely below); matches items by
/// `(category, trimmed title)`, exact first, then ASCII-case-insensitive.
///
/// The first judge object: reading left to right, every `{` starts a candidate. A candidate
/// that is a complete JSON object (nesting at most 64) with a `criterion_scores` array is the
/// answer; a complete object without one is skipped whole (objects inside it are not tried).
/// A candidate that is not valid JSON (or is cut off, or nests deeper than 64) leaves the
/// complete objects it held as candidates, in text order; braces inside its JSON strings are
/// not candidates; reading goes on at the byte where it broke. In a fenced block the same
/// search runs inside the block.
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
    let body = match rfind_ascii(text, "</think>") {
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
        // The item is walked once: every value is read or skipped and `next_key` consumes the
        // closing brace, so on the checked judge object the walk ends just after the item
        // (debug builds check that against `skip_value`).
        let mut item = cur;
        item.enter(b'{');
        let (mut cat, mut title, mut score): (
            Option<JStr<'_>>,
            Option<JStr<'_>>,
            Option<PlainCursor<'_>>,
        ) = (None, None, None);
        while let Some(k) = item.next_key() {
            let read = if k.eq_str("category") && cat.is_none() {
                cat = item.string();
                cat.is_some()
            } else if k.eq_str("criterion_title") && title.is_none() {
                title = item.string();
                title.is_some()
            } else {
                if k.eq_str("score") && score.is_none() {
                    score = Some(item);
                }
                false
            };
            if !read {
                item.skip_value();
            }
        }
        debug_assert_eq!(
            item.pos,
            {
                let mut s = cur;
                s.skip_value();
                s.pos
            },
            "item walk and skip disagree"
        );
        // Progress even if a walk ever stopped short: never before the item's first byte.
        cur.pos = item.pos.max(cur.pos + 1);
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

/// `hay.find(needle)` for a non-empty ASCII `needle`: the candidates are found by their first
/// byte eight bytes at a time ([`json::find_byte`]), which beats the generic substring search on
/// a judge answer, where the needle's first byte is rare. (An ASCII byte never occurs inside a
/// multi-byte UTF-8 character, so every byte match is a match of `str::find`.)
fn find_ascii(hay: &str, needle: &str) -> Option<usize> {
    let (b, n) = (hay.as_bytes(), needle.as_bytes());
    let first = *n.first()?;
    let mut from = 0;
    while let Some(p) = json::find_byte(b, from, first) {
        if b.get(p..p + n.len()) == Some(n) {
            return Some(p);
        }
        from = p + 1;
    }
    None
}

/// `hay.rfind(needle)` for a non-empty ASCII `needle`, in one forward pass like
/// [`find_ascii`] (the last match wins).
fn rfind_ascii(hay: &str, needle: &str) -> Option<usize> {
    let mut last = None;
    let mut from = 0;
    while let Some(p) = hay.get(from..).and_then(|t| find_ascii(t, needle)) {
        last = Some(from + p);
        from += p + 1;
    }
    last
}

/// The `criterion_scores` array (cursor inside it) of the preferred candidate object.
fn find_scores(body: &str) -> Option<PlainCursor<'_>> {
    // 1. The last fenced block whose info string is `json` (or empty).
    let mut last_fenced: Option<(usize, usize)> = None;
    let mut rest = 0usize;
    while let Some(open) = body
        .get(rest..)
        .and_then(|s| find_ascii(s, "```"))
        .map(|p| rest + p)
    {
        let info_end = body
            .get(open..)
            .and_then(|s| s.find('\n'))
            .map_or(body.len(), |p| open + p);
        let info = body.get(open + 3..info_end).unwrap_or("").trim();
        let Some(close) = body
            .get(info_end..)
            .and_then(|s| find_ascii(s, "```"))
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
        && let Some(start) = first_object_with_scores(inner, a)
    {
        return scores_array(Cursor::new(inner, start));
    }
    // 2. The first balanced object holding `criterion_scores`.
    let start = first_object_with_scores(body, 0)?;
    scores_array(Cursor::new(body, start))
}

/// The start of the first judge object of `text[from..]` (SPEC §8 fallback), in one pass.
///
/// What "first" means: reading from `from`, every `{` starts a candidate, read as JSON with
/// nesting up to [`json::MAX_DEPTH`]; braces inside the JSON strings of a candidate are text,
/// not candidates.
///
/// * A candidate that is a complete object holding a `criterion_scores` array is the answer.
/// * A complete object without one is skipped whole: objects nested in it are not candidates.
/// * A candidate that breaks (invalid JSON, cut off by the end of the text, or nested deeper
///   than the limit) leaves the complete objects it held as candidates, in text order, with
///   the same rules; after them, reading goes on at the byte where it broke, or, when it broke
///   inside a string that fails to scan, just after that string's opening quote (the braces of
///   a string that is not one are text).
///
/// This is the classic "try each `{` in turn, skip past complete objects" search, except that
/// braces inside the strings of a broken candidate are not tried again. That exception is
/// what makes one pass enough: every byte is read once, whatever the number of brace snippets
/// before the answer. All candidates that are open at once share one parse (an inner
/// candidate's own parse is the outer one's from that point on), kept in a stack of
/// [`json::MAX_DEPTH`] frames; a candidate pushed past the limit drops the outermost frame,
/// which is exactly the candidate that became too deep.
fn first_object_with_scores(text: &str, from: usize) -> Option<usize> {
    let b = text.as_bytes();
    let mut i = from;
    let mut st = Frames::new();
    loop {
        // Prose between candidates: only a `{` matters.
        let start = json::find_byte(b, i, b'{')?;
        st.clear();
        if let Some(found) = st.push(start, true) {
            return Some(found);
        }
        i = start + 1;
        let mut state = State::KeyOrEnd;
        // One candidate family: runs until the outermost open candidate completes or breaks.
        let broke_at = loop {
            i = json::skip_ws(b, i);
            let Some(&c) = b.get(i) else {
                break b.len();
            };
            match state {
                State::Value | State::ValueOrEnd => match c {
                    b']' if matches!(state, State::ValueOrEnd) => {
                        i += 1;
                        match st.close() {
                            Close::Found(found) => return Some(found),
                            Close::Done => break usize::MAX,
                            Close::Open => state = State::After,
                        }
                    }
                    b'{' | b'[' => {
                        let judge_slot = matches!(state, State::Value) && st.pending_key;
                        st.pending_key = false;
                        if c == b'[' && judge_slot {
                            st.mark_judge();
                        }
                        if let Some(found) = st.push(i, c == b'{') {
                            return Some(found);
                        }
                        i += 1;
                        state = if c == b'{' {
                            State::KeyOrEnd
                        } else {
                            State::ValueOrEnd
                        };
                    }
                    b'"' => match json::scan_string(b, i) {
                        Ok((end, _)) => {
                            i = end;
                            st.pending_key = false;
                            state = State::After;
                        }
                        Err(e) => break string_break(b, i, e.offset),
                    },
                    b'-' | b'0'..=b'9' => match json::scan_number(b, i) {
                        Ok(end) => {
                            i = end;
                            st.pending_key = false;
                            state = State::After;
                        }
                        Err(e) => break e.offset,
                    },
                    b't' | b'f' | b'n' => {
                        let lit: &[u8] = match c {
                            b't' => b"true",
                            b'f' => b"false",
                            _ => b"null",
                        };
                        if b.get(i..i + lit.len()) != Some(lit) {
                            break i;
                        }
                        i += lit.len();
                        st.pending_key = false;
                        state = State::After;
                    }
                    _ => break i,
                },
                State::Key | State::KeyOrEnd => match c {
                    b'}' if matches!(state, State::KeyOrEnd) => {
                        i += 1;
                        match st.close() {
                            Close::Found(found) => return Some(found),
                            Close::Done => break usize::MAX,
                            Close::Open => state = State::After,
                        }
                    }
                    b'"' => {
                        let (end, escaped) = match json::scan_string(b, i) {
                            Ok(v) => v,
                            Err(e) => break string_break(b, i, e.offset),
                        };
                        let key = JStr {
                            raw: text.get(i + 1..end - 1).unwrap_or(""),
                            escaped,
                            offset: i,
                        };
                        i = json::skip_ws(b, end);
                        if b.get(i) != Some(&b':') {
                            break i;
                        }
                        i += 1;
                        st.pending_key = key.eq_str("criterion_scores");
                        state = State::Value;
                    }
                    _ => break i,
                },
                State::After => {
                    let in_obj = st.top_is_object();
                    match (c, in_obj) {
                        (b',', true) => state = State::Key,
                        (b',', false) => state = State::Value,
                        (b'}', true) | (b']', false) => match st.close() {
                            Close::Found(found) => return Some(found),
                            Close::Done => {
                                i += 1;
                                break usize::MAX;
                            }
                            Close::Open => {}
                        },
                        _ => break i,
                    }
                    i += 1;
                }
            }
        };
        if broke_at != usize::MAX {
            // Every open candidate broke here: the first complete judge object they held wins.
            if let Some(found) = st.first_recorded() {
                return Some(found);
            }
            i = broke_at;
        }
    }
}

/// Where reading resumes after a string at `start` failed to scan with an error at `offset`
/// (a control character or a bad escape): just after its opening quote, since a string that
/// fails is not a string of the candidate and its braces are text that may start candidates
/// (the scan to the error saw no quote, so these bytes are read at most twice); or at the end
/// for an unterminated string (the scanner reports those at the opening quote; no byte after
/// it can start a judge object, as a judge object needs a quote that would have ended the
/// string).
fn string_break(b: &[u8], start: usize, offset: usize) -> usize {
    if offset == start { b.len() } else { start + 1 }
}

/// What the candidate scanner expects next (the states of `json::scan_value`).
#[derive(Clone, Copy)]
enum State {
    Value,
    ValueOrEnd,
    Key,
    KeyOrEnd,
    After,
}

/// One open array or object of a candidate family.
#[derive(Clone, Copy, Default)]
struct Frame {
    start: usize,
    object: bool,
    /// An object that has a `criterion_scores` member whose value is an array.
    judge: bool,
    /// Start of the first complete judge object this frame holds (directly, or inside complete
    /// arrays), `usize::MAX` for none: a candidate should this frame and every open object
    /// around it break.
    first_judge: usize,
}

/// The open frames of a candidate family, innermost last, at most [`json::MAX_DEPTH`] (a ring:
/// pushing one more drops the outermost).
struct Frames {
    ring: [Frame; json::MAX_DEPTH],
    base: usize,
    len: usize,
    /// Open frames that are objects (candidates that may still complete).
    objects: usize,
    /// The last key read was `criterion_scores` and its value is next.
    pending_key: bool,
}

enum Close {
    /// A complete object is the answer.
    Found(usize),
    /// The outermost open frame completed without an answer: back to prose.
    Done,
    /// Frames remain open.
    Open,
}

impl Frames {
    fn new() -> Self {
        Frames {
            ring: [Frame::default(); json::MAX_DEPTH],
            base: 0,
            len: 0,
            objects: 0,
            pending_key: false,
        }
    }

    fn clear(&mut self) {
        self.base = 0;
        self.len = 0;
        self.objects = 0;
        self.pending_key = false;
    }

    fn slot(&mut self, k: usize) -> Option<&mut Frame> {
        self.ring.get_mut((self.base + k) % json::MAX_DEPTH)
    }

    fn top(&mut self) -> Option<&mut Frame> {
        let k = self.len.checked_sub(1)?;
        self.slot(k)
    }

    fn top_is_object(&mut self) -> bool {
        self.top().is_some_and(|f| f.object)
    }

    fn mark_judge(&mut self) {
        if let Some(f) = self.top() {
            f.judge = true;
        }
    }

    /// Opens a frame; `Some` when that drops the outermost one, and with it a recorded answer.
    fn push(&mut self, start: usize, object: bool) -> Option<usize> {
        if self.len == json::MAX_DEPTH {
            // The outermost candidate is now too deep: it breaks, the others go on.
            let outer = self.slot(0).map(|f| *f).unwrap_or_default();
            if outer.first_judge != usize::MAX {
                return Some(outer.first_judge);
            }
            self.objects -= usize::from(outer.object);
            self.base = (self.base + 1) % json::MAX_DEPTH;
            self.len -= 1;
        }
        let k = self.len;
        if let Some(f) = self.slot(k) {
            *f = Frame {
                start,
                object,
                judge: false,
                first_judge: usize::MAX,
            };
        }
        self.len += 1;
        self.objects += usize::from(object);
        None
    }

    /// Closes the innermost frame (its closing bracket was just read).
    fn close(&mut self) -> Close {
        let Some(done) = self.top().map(|f| *f) else {
            return Close::Done;
        };
        self.len -= 1;
        self.objects -= usize::from(done.object);
        // What the completed frame contributes to its parent: itself when it is an answer,
        // nothing when it is another complete object (skipped whole), its own record when it
        // is an array (arrays are not candidates).
        let found = if done.object {
            if done.judge { done.start } else { usize::MAX }
        } else {
            done.first_judge
        };
        if found != usize::MAX && self.objects == 0 {
            // No open object around it can complete and swallow it: every candidate before it
            // broke or held nothing, so it is the answer.
            return Close::Found(found);
        }
        match self.top() {
            None => Close::Done,
            Some(parent) => {
                if parent.first_judge == usize::MAX {
                    parent.first_judge = found;
                }
                Close::Open
            }
        }
    }

    /// The first recorded answer, outermost frame first (what a break of every open frame
    /// leaves: a frame's records precede everything inside its still-open child).
    fn first_recorded(&mut self) -> Option<usize> {
        (0..self.len)
            .filter_map(|k| self.slot(k).map(|f| f.first_judge))
            .find(|&s| s != usize::MAX)
    }
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    extern crate std;
    use std::string::String;
    use std::vec::Vec;

    use super::*;
    use crate::json::{StringIndex, scan_value_indexed};

    /// The definition of "first judge object" written the slow, obvious way: try each `{` in
    /// turn with the full syntax check, skip past complete objects, step one byte past a
    /// broken candidate, and never try a brace inside a string of a broken candidate.
    fn reference(text: &str, from: usize) -> Option<usize> {
        let b = text.as_bytes();
        let mut excluded: Vec<(usize, usize)> = Vec::new();
        let mut idx = StringIndex::<1024>::new();
        let mut i = from;
        loop {
            let s = (i..b.len())
                .find(|&k| b[k] == b'{' && !excluded.iter().any(|&(a, e)| a < k && k < e))?;
            match scan_value_indexed(b, s, &mut idx) {
                Ok(end) => {
                    if scores_array(Cursor::new(text, s)).is_some() {
                        return Some(s);
                    }
                    i = end;
                }
                Err(_) => {
                    excluded.extend(idx.spans().iter().map(|sp| sp.range()));
                    i = s + 1;
                }
            }
        }
    }

    /// `find_ascii` and `rfind_ascii` are `str::find` and `str::rfind`: every position of the
    /// needle (overlapping ones included: four backticks in a row), near non-ASCII text and partial
    /// matches, on both sides of the eight-byte words.
    #[test]
    fn ascii_searches_are_the_str_searches() {
        let pieces = [
            "`", "``", "```", "</think>", "</thin", "<", "é", "語", "x", "\n", " ",
        ];
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        for _ in 0..20_000 {
            let mut hay = String::new();
            for _ in 0..(x % 24) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                hay.push_str(pieces[(x % pieces.len() as u64) as usize]);
            }
            for needle in ["```", "</think>", "<", "x"] {
                assert_eq!(
                    find_ascii(&hay, needle),
                    hay.find(needle),
                    "{hay:?} {needle}"
                );
                assert_eq!(
                    rfind_ascii(&hay, needle),
                    hay.rfind(needle),
                    "{hay:?} {needle}"
                );
            }
        }
    }

    const PIECES: [&str; 24] = [
        "{",
        "}",
        "[",
        "]",
        "\"",
        ":",
        ",",
        " ",
        "\n",
        "\\",
        "x",
        "1",
        "-",
        "true",
        "nul",
        "\"criterion_scores\"",
        "\"criterion_scores\":[",
        "\"a\"",
        "\"a\":",
        "{}",
        "{\"criterion_scores\":[]}",
        "{\"criterion_scores\":1}",
        "\"\\u0041\"",
        "\"{\"",
    ];

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4000))]
        /// Relation: the one-pass search returns the same candidate as the slow definition,
        /// on text made of JSON fragments, prose and judge objects in any order.
        #[test]
        fn one_pass_search_equals_the_definition(
            picks in proptest::collection::vec(0..PIECES.len(), 0..48),
        ) {
            let text: String = picks.iter().map(|&k| PIECES[k]).collect();
            proptest::prop_assert_eq!(first_object_with_scores(&text, 0), reference(&text, 0), "{:?}", text);
        }

        /// The same relation on text built from whole structural pieces (wrappers, commas,
        /// closers, several judge objects), where broken candidates hold many complete ones.
        #[test]
        fn one_pass_search_equals_the_definition_on_structures(
            picks in proptest::collection::vec(0..STRUCTURE.len(), 0..40),
        ) {
            let text: String = picks.iter().map(|&k| STRUCTURE[k]).collect();
            proptest::prop_assert_eq!(first_object_with_scores(&text, 0), reference(&text, 0), "{:?}", text);
        }
    }

    const STRUCTURE: [&str; 12] = [
        "{\"a\":",
        "[",
        ",",
        "]",
        "}",
        "{\"criterion_scores\":[]}",
        "{\"criterion_scores\":[1]}",
        "{\"b\":1}",
        " x ",
        "\"{\"",
        "{\"criterion_scores\":1}",
        "{\"criterion_scores\":[",
    ];

    /// Regression (found by `one_pass_search_equals_the_definition`): a candidate that breaks
    /// inside a string that fails to scan (here a raw newline) must leave that string's braces
    /// as candidates. Reading on from the newline skipped the `{` at 3, whose candidate holds
    /// the key string `"{"` that excludes the `{` at 6, so the search took the candidate at 6,
    /// whose key string then excluded the judge object at 8.
    #[test]
    fn braces_of_a_string_that_fails_to_scan_start_candidates() {
        let text = "\"{\"{\n\"{\"{\"criterion_scores\":[]}";
        assert_eq!(reference(text, 0), Some(8));
        assert_eq!(first_object_with_scores(text, 0), Some(8));
        // A bad escape breaks the string the same way.
        let text = "{\"a\\q{\"criterion_scores\":[]}";
        assert_eq!(first_object_with_scores(text, 0), reference(text, 0));
        assert_eq!(first_object_with_scores(text, 0), Some(5));
    }

    #[test]
    fn deep_nesting_drops_only_the_too_deep_candidates() {
        let judge = "{\"criterion_scores\":[]}";
        for depth in [1usize, 62, 63, 64, 65, 100, 300] {
            // Unclosed wrappers: every wrapper breaks at the end, the judge inside wins.
            let open = "{\"a\":".repeat(depth);
            let text = std::format!("{open}{judge}");
            let want = Some(open.len());
            assert_eq!(first_object_with_scores(&text, 0), want, "depth {depth}");
            assert_eq!(reference(&text, 0), want, "depth {depth}");
            // Closed wrappers: the outermost that fits the limit completes and is skipped
            // whole (it holds no criterion_scores member itself).
            let text = std::format!("{open}{judge}{}", "}".repeat(depth));
            assert_eq!(
                first_object_with_scores(&text, 0),
                reference(&text, 0),
                "depth {depth}"
            );
            // Arrays as wrappers, then a judge object after the wrappers broke.
            let text = std::format!("{{\"a\":{} x {judge}", "[".repeat(depth));
            assert_eq!(
                first_object_with_scores(&text, 0),
                reference(&text, 0),
                "arrays {depth}"
            );
        }
    }
}
