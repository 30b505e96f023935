//! The output-format check of a profile: ordered spans wrapped in tags.
//!
//! With spans `s_1 .. s_n` and tag templates (Kardia-R1: `<|{name}_begin|>`, `<|{name}_end|>`),
//! an output is well-formed when every span appears exactly once (one begin tag, one end tag
//! after it), the spans come one after another in profile order, each holds text that is not
//! blank after trimming ASCII whitespace, and nothing but ASCII whitespace lies outside them.
//! `r_fmt` is 1 exactly then. Every violation is reported with a stable code, like the rubric
//! validator's; the span slices are borrowed from the output (zero copy).
//!
//! Tags are found by one left-to-right scan that takes the first tag starting at each position
//! and continues after it (tags never overlap; the profile parser rejects templates where one
//! tag is part of another). A span is *located* when it has a begin tag and an end tag after
//! the first begin tag; its extent runs from that begin tag to the first such end tag. Text
//! outside is what lies outside every located extent and every tag.

use core::fmt::{self, Write};

use super::Profile;
use crate::format::{Arg, ShortText};
use crate::json;

/// Most violations an [`OutputReport`] holds; more set [`OutputReport::overflowed`].
pub const MAX_OUTPUT_VIOLATIONS: usize = 32;

/// The stable codes of the output-format check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
#[non_exhaustive]
pub enum OutputCode {
    /// The output is not valid UTF-8.
    InvalidUtf8 = 1,
    /// A span's begin or end tag is missing.
    MissingSpan = 2,
    /// A span's begin or end tag appears more than once.
    DuplicateSpan = 3,
    /// A span starts before the previous one ends, or its end tag comes before its begin tag.
    SpanOrder = 4,
    /// A span holds nothing but whitespace.
    EmptySpan = 5,
    /// Non-whitespace text outside the spans.
    TextOutside = 6,
}

impl OutputCode {
    /// Every code in number order.
    pub const ALL: [OutputCode; 6] = [
        OutputCode::InvalidUtf8,
        OutputCode::MissingSpan,
        OutputCode::DuplicateSpan,
        OutputCode::SpanOrder,
        OutputCode::EmptySpan,
        OutputCode::TextOutside,
    ];

    /// The stable codes, in the order of [`OutputCode::ALL`].
    pub const NAMES: [&'static str; 6] =
        crate::names::names_of!(OutputCode, OutputCode::ALL, as_str);

    /// The stable snake_case code (its [`crate::Named`] name).
    pub const fn as_str(self) -> &'static str {
        match self {
            OutputCode::InvalidUtf8 => "invalid_utf8",
            OutputCode::MissingSpan => "missing_span",
            OutputCode::DuplicateSpan => "duplicate_span",
            OutputCode::SpanOrder => "span_order",
            OutputCode::EmptySpan => "empty_span",
            OutputCode::TextOutside => "text_outside",
        }
    }

    /// The stable number (1..=6, the future C enum value); never renumbered.
    pub const fn number(self) -> u8 {
        self as u8
    }

    /// The code whose [`OutputCode::as_str`] is `s`.
    pub fn from_str_code(s: &str) -> Option<OutputCode> {
        OutputCode::ALL.into_iter().find(|c| c.as_str() == s)
    }

    /// How to fix it, one clause (the end of every message).
    pub const fn hint(self) -> &'static str {
        match self {
            OutputCode::InvalidUtf8 => "write valid UTF-8 text",
            OutputCode::MissingSpan => {
                "write every span once, as its begin tag, the text, then its end tag"
            }
            OutputCode::DuplicateSpan => "write every span exactly once",
            OutputCode::SpanOrder => {
                "write the spans one after another in the required order, each end tag after its begin tag"
            }
            OutputCode::EmptySpan => "write non-blank text inside every span",
            OutputCode::TextOutside => "write nothing but whitespace outside the spans",
        }
    }
}

impl OutputCode {
    // The `Named` vocabulary, as inherent functions so that `impl_named!` applies.
    const fn name(self) -> &'static str {
        self.as_str()
    }
    const fn help(self) -> &'static str {
        self.hint()
    }
    fn from_name(s: &str) -> Option<OutputCode> {
        OutputCode::from_str_code(s)
    }
}

crate::names::impl_named!(OutputCode, "output code");

impl fmt::Display for OutputCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// One violation of the output format.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OutputViolation {
    /// The stable code.
    pub code: OutputCode,
    /// Index of the span it concerns, when it concerns one.
    pub span: Option<u8>,
    /// Byte offset in the output, when it applies.
    pub offset: Option<usize>,
    /// What is wrong (static text).
    pub note: &'static str,
    /// The variable part: the tag concerned, or the start of the stray text.
    pub arg: Arg,
}

impl OutputViolation {
    /// Writes the one-line retry message (same text as `Display`).
    pub fn write_message<W: Write + ?Sized>(&self, w: &mut W) -> fmt::Result {
        write!(w, "{}: {}", self.code.as_str(), self.note)?;
        if let Arg::Text(t) = self.arg {
            write!(w, " \"{}", t.as_str().escape_debug())?;
            if t.is_truncated() {
                w.write_str("...")?;
            }
            w.write_str("\"")?;
        }
        if let Some(o) = self.offset {
            write!(w, " (byte {o})")?;
        }
        write!(w, "; {}.", self.code.hint())
    }
}

impl fmt::Display for OutputViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_message(f)
    }
}

/// Every violation found, span by span, then the text outside in output order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OutputReport {
    violations: heapless::Vec<OutputViolation, MAX_OUTPUT_VIOLATIONS>,
    overflow: bool,
}

impl OutputReport {
    /// The violations kept (at most [`MAX_OUTPUT_VIOLATIONS`]).
    pub fn violations(&self) -> &[OutputViolation] {
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

    /// Number of kept violations with `code`.
    pub fn count(&self, code: OutputCode) -> usize {
        self.violations.iter().filter(|v| v.code == code).count()
    }

    /// Whether any kept violation has `code`.
    pub fn has(&self, code: OutputCode) -> bool {
        self.count(code) > 0
    }

    /// Writes every message, one per line (feedback for a retry prompt).
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

    fn push(&mut self, v: OutputViolation) {
        if self.violations.push(v).is_err() {
            self.overflow = true;
        }
    }
}

impl fmt::Display for OutputReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_feedback(f)
    }
}

/// The result of [`Profile::check_output`].
#[derive(Clone, Debug, PartialEq)]
pub struct OutputCheck<'t> {
    /// Trimmed content of each located span, profile order.
    spans: [Option<&'t str>; super::MAX_SPANS],
    judge: Option<&'t str>,
    report: OutputReport,
}

impl<'t> OutputCheck<'t> {
    /// `r_fmt`: 1 when the output has the profile's format (always, without a format), else 0.
    pub fn format_reward(&self) -> f64 {
        if self.report.is_ok() { 1.0 } else { 0.0 }
    }

    /// Whether the output is well-formed (`r_fmt = 1`).
    pub fn is_ok(&self) -> bool {
        self.report.is_ok()
    }

    /// Whether the judge must be called: only for a well-formed output (a malformed one scores
    /// 0 whatever the judge says).
    pub fn judge_needed(&self) -> bool {
        self.is_ok()
    }

    /// What the judge sees: the judge span (trimmed), or the whole output for a profile
    /// without an output format. `None` when the judge is not needed, or when a profile without
    /// a format gets an output that is not UTF-8.
    pub fn judge_text(&self) -> Option<&'t str> {
        if self.judge_needed() {
            self.judge
        } else {
            None
        }
    }

    /// The trimmed content of span `k`, when the span was located (also in a malformed output,
    /// for diagnostics).
    pub fn span(&self, k: usize) -> Option<&'t str> {
        self.spans.get(k).copied().flatten()
    }

    /// Every violation found.
    pub fn report(&self) -> &OutputReport {
        &self.report
    }
}

/// A tag: template before, span name, template after.
#[derive(Clone, Copy)]
struct Tag<'p> {
    parts: [&'p str; 3],
}

impl Tag<'_> {
    /// The end offset when this tag starts at `b[i..]`.
    fn at(&self, b: &[u8], i: usize) -> Option<usize> {
        let mut j = i;
        for p in self.parts {
            let end = j.checked_add(p.len())?;
            if b.get(j..end)? != p.as_bytes() {
                return None;
            }
            j = end;
        }
        Some(j)
    }

    fn text(&self) -> ShortText {
        ShortText::from_chars(self.parts.iter().flat_map(|p| p.chars()))
    }
}

/// The tags of a profile's spans and the scanner over an output.
struct Tags<'p> {
    n: usize,
    open: [Tag<'p>; super::MAX_SPANS],
    close: [Tag<'p>; super::MAX_SPANS],
    /// First bytes of the begin and end templates (non-empty: the parser checks it).
    first: (u8, u8),
}

/// One tag occurrence: start, end, span, whether it is an end tag.
type Hit = (usize, usize, usize, bool);

impl<'p> Tags<'p> {
    fn new(p: &Profile<'p>) -> Option<Tags<'p>> {
        let (ob, oa, cb, ca) = p.span_tags()?;
        let empty = Tag { parts: [""; 3] };
        let mut t = Tags {
            n: p.span_count().min(super::MAX_SPANS),
            open: [empty; super::MAX_SPANS],
            close: [empty; super::MAX_SPANS],
            first: (*ob.as_bytes().first()?, *cb.as_bytes().first()?),
        };
        for k in 0..t.n {
            let name = p.span_name(k)?;
            t.open[k] = Tag {
                parts: [ob, name, oa],
            };
            t.close[k] = Tag {
                parts: [cb, name, ca],
            };
        }
        Some(t)
    }

    /// The next tag occurrence starting at or after `from`.
    fn next(&self, b: &[u8], from: usize) -> Option<Hit> {
        let (f0, f1) = self.first;
        let mut i = from;
        loop {
            let p = if f0 == f1 {
                json::find_byte(b, i, f0)?
            } else {
                i + b.get(i..)?.iter().position(|&c| c == f0 || c == f1)?
            };
            for k in 0..self.n {
                if let Some(e) = self.open[k].at(b, p) {
                    return Some((p, e, k, false));
                }
                if let Some(e) = self.close[k].at(b, p) {
                    return Some((p, e, k, true));
                }
            }
            i = p + 1;
        }
    }
}

#[derive(Clone, Copy, Default)]
struct Seen {
    count: u32,
    first: Option<(usize, usize)>,
    second: Option<usize>,
}

impl Seen {
    fn add(&mut self, s: usize, e: usize) {
        self.count = self.count.saturating_add(1);
        if self.first.is_none() {
            self.first = Some((s, e));
        } else if self.second.is_none() {
            self.second = Some(s);
        }
    }
}

fn is_blank(b: &[u8]) -> bool {
    b.iter().all(u8::is_ascii_whitespace)
}

pub(super) fn check<'t>(p: &Profile<'_>, output: &'t [u8]) -> OutputCheck<'t> {
    let mut out = OutputCheck {
        spans: [None; super::MAX_SPANS],
        judge: None,
        report: OutputReport::default(),
    };
    let text = match core::str::from_utf8(output) {
        Ok(t) => t,
        Err(e) => {
            if p.has_output_format() {
                out.report.push(OutputViolation {
                    code: OutputCode::InvalidUtf8,
                    span: None,
                    offset: Some(e.valid_up_to()),
                    note: "the output is not valid UTF-8",
                    arg: Arg::None,
                });
            }
            return out;
        }
    };
    // A profile has tags exactly when it has an output format (the parser guarantees a
    // non-empty text before `{name}` in both templates).
    let Some(tags) = Tags::new(p) else {
        // No output format: nothing to check, the judge sees everything.
        out.judge = Some(text);
        return out;
    };
    let b = text.as_bytes();
    let n = tags.n;

    // Pass 1: count every tag, remember the first and second occurrence, and the first end tag
    // after the first begin tag of the same span.
    let mut opens = [Seen::default(); super::MAX_SPANS];
    let mut closes = [Seen::default(); super::MAX_SPANS];
    let mut close_after: [Option<(usize, usize)>; super::MAX_SPANS] = [None; super::MAX_SPANS];
    let mut i = 0usize;
    while let Some((s, e, k, is_close)) = tags.next(b, i) {
        if is_close {
            closes[k].add(s, e);
            if opens[k].first.is_some() && close_after[k].is_none() {
                close_after[k] = Some((s, e));
            }
        } else {
            opens[k].add(s, e);
        }
        i = e;
    }

    // Per span: missing, duplicated, end before begin, empty; then the order of located spans.
    let mut extents: heapless::Vec<(usize, usize), { super::MAX_SPANS }> = heapless::Vec::new();
    let mut prev_end: Option<usize> = None;
    for k in 0..n {
        let span = u8::try_from(k).ok();
        let mut push = |code, offset, note, tag: &Tag<'_>| {
            out.report.push(OutputViolation {
                code,
                span,
                offset,
                note,
                arg: Arg::Text(tag.text()),
            });
        };
        let (o, c) = (opens[k], closes[k]);
        match (o.count, c.count) {
            (0, 0) => push(
                OutputCode::MissingSpan,
                None,
                "missing span (neither tag found):",
                &tags.open[k],
            ),
            (0, _) => push(
                OutputCode::MissingSpan,
                None,
                "missing begin tag",
                &tags.open[k],
            ),
            (_, 0) => push(
                OutputCode::MissingSpan,
                None,
                "missing end tag",
                &tags.close[k],
            ),
            _ => {}
        }
        if o.count > 1 {
            push(
                OutputCode::DuplicateSpan,
                o.second,
                "begin tag appears more than once:",
                &tags.open[k],
            );
        }
        if c.count > 1 {
            push(
                OutputCode::DuplicateSpan,
                c.second,
                "end tag appears more than once:",
                &tags.close[k],
            );
        }
        let (Some((os, oe)), Some(_)) = (o.first, c.first) else {
            continue;
        };
        let Some((cs, ce)) = close_after[k] else {
            push(
                OutputCode::SpanOrder,
                c.first.map(|x| x.0),
                "end tag comes before its begin tag:",
                &tags.close[k],
            );
            continue;
        };
        let content = b.get(oe..cs).unwrap_or(&[]);
        if is_blank(content) {
            push(
                OutputCode::EmptySpan,
                Some(oe),
                "nothing but whitespace after",
                &tags.open[k],
            );
        }
        if let Some(pe) = prev_end
            && os < pe
        {
            push(
                OutputCode::SpanOrder,
                Some(os),
                "span starts before the end of the span that must come before it:",
                &tags.open[k],
            );
        }
        // Comparing each located span with the previous one suffices (extents are non-empty,
        // so in-order neighbours are in order overall) and reports an inversion once.
        prev_end = Some(ce);
        out.spans[k] = text
            .get(oe..cs)
            .map(|s| s.trim_matches(|c: char| c.is_ascii_whitespace()));
        // Cannot overflow: at most one extent per span.
        let _ = extents.push((os, ce));
    }

    // Pass 2: text outside the located extents and the tags.
    extents.sort_unstable();
    let mut merged: heapless::Vec<(usize, usize), { super::MAX_SPANS }> = heapless::Vec::new();
    for &(s, e) in &extents {
        match merged.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => {
                let _ = merged.push((s, e));
            }
        }
    }
    let mut pos = 0usize;
    loop {
        let ext = merged
            .iter()
            .find(|x| x.1 > pos)
            .map(|&(s, e)| (s.max(pos), e));
        let tag = tags.next(b, pos).map(|h| (h.0, h.1));
        let block = match (ext, tag) {
            (Some(x), Some(t)) => Some(if t.0 < x.0 { t } else { x }),
            (x, t) => x.or(t),
        };
        let gap_end = block.map_or(b.len(), |x| x.0);
        if let Some(off) = b
            .get(pos..gap_end)
            .and_then(|g| g.iter().position(|c| !c.is_ascii_whitespace()))
            .map(|p| pos + p)
        {
            out.report.push(OutputViolation {
                code: OutputCode::TextOutside,
                span: None,
                offset: Some(off),
                note: "text outside the spans:",
                arg: Arg::Text(ShortText::new(
                    text.get(off..gap_end)
                        .unwrap_or("")
                        .trim_end_matches(|c: char| c.is_ascii_whitespace()),
                )),
            });
        }
        match block {
            // Always advances: a block ends after it starts, and starts at or after `pos`.
            Some((_, e)) if e > pos => pos = e,
            _ => break,
        }
    }
    out.judge = p
        .judge_span()
        .and_then(|k| out.spans.get(k).copied().flatten());
    out
}
