//! A small zero-copy JSON scanner (crate-private).
//!
//! Two stages: [`scan_value`] checks the syntax of one value iteratively (no recursion, nesting
//! bounded by [`MAX_DEPTH`], so hostile inputs such as 100k open brackets return an error instead
//! of overflowing the stack), then a [`Cursor`] walks the checked text and hands out borrowed
//! strings and numbers. The syntax pass can record where every string ends in a [`StringIndex`]
//! (simdjson's idea of a structural index, on a small fixed scale): a cursor given that index
//! finds a string's end by lookup instead of scanning its bytes a second time, which matters
//! because rubric text is mostly long descriptions. The cursor never panics and always makes progress, even on text that was
//! not checked, so a bug in the caller degrades into a wrong report, never a crash.
//!
//! Surrogate escapes are checked like serde_json does: a `\uD800`..`\uDBFF` escape must be
//! followed at once by a `\uDC00`..`\uDFFF` escape (the pair decodes to one character above
//! U+FFFF), and any other surrogate escape (a lone high one, a lone low one, a high one followed
//! by anything else) is a syntax error at the offset of the offending backslash. Callers report
//! it as they report every syntax error (`not_json` in rubric validation; the judge-output
//! parser skips the candidate object).

use crate::format::notes::{self, Note};

/// Deepest nesting of arrays and objects accepted (a rubric needs 5).
pub(crate) const MAX_DEPTH: usize = 64;

/// A syntax error: where and what.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SyntaxError {
    pub offset: usize,
    pub what: Note,
    /// The nesting limit was hit (a capacity problem, not malformed JSON).
    pub too_deep: bool,
}

fn err(offset: usize, what: Note) -> SyntaxError {
    SyntaxError {
        offset,
        what,
        too_deep: false,
    }
}

pub(crate) fn is_ws(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | b'\r')
}

pub(crate) fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while b.get(i).is_some_and(|&c| is_ws(c)) {
        i += 1;
    }
    i
}

/// Scans a string starting at the opening quote `b[i]`; returns the offset after the closing
/// quote and whether it contains escapes.
pub(crate) fn scan_string(b: &[u8], i: usize) -> Result<(usize, bool), SyntaxError> {
    let mut j = i + 1;
    let mut escaped = false;
    loop {
        j = skip_plain(b, j);
        let Some(&c) = b.get(j) else {
            return Err(err(i, notes::UNTERMINATED_STRING));
        };
        match c {
            b'"' => return Ok((j + 1, escaped)),
            b'\\' => {
                escaped = true;
                match b.get(j + 1) {
                    Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => j += 2,
                    Some(b'u') => {
                        if b.get(j + 2..j + 6).is_none() {
                            return Err(err(j, notes::TRUNCATED_U_ESCAPE));
                        }
                        let at = j;
                        let cp = hex4(b, j + 2).ok_or(err(at, notes::INVALID_U_ESCAPE))?;
                        j += 6;
                        // A surrogate escape is only meaningful as a high-low pair (RFC 8259
                        // §7). The grammar admits a lone one but it names no character (§8.2:
                        // "unpredictable"), so, like serde_json, reject it at its backslash.
                        if (0xDC00..0xE000).contains(&cp) {
                            return Err(err(at, notes::LONE_LOW_SURROGATE));
                        }
                        if (0xD800..0xDC00).contains(&cp) {
                            let lo = match b.get(j..j + 2) {
                                Some(b"\\u") => hex4(b, j + 2),
                                _ => None,
                            };
                            if !lo.is_some_and(|lo| (0xDC00..0xE000).contains(&lo)) {
                                return Err(err(at, notes::LONE_HIGH_SURROGATE));
                            }
                            j += 6;
                        }
                    }
                    _ => return Err(err(j, notes::INVALID_ESCAPE)),
                }
            }
            0..=0x1f => return Err(err(j, notes::CONTROL_CHARACTER)),
            _ => j += 1,
        }
    }
}

// SWAR ("SIMD within a register") helpers for the two byte searches below, eight bytes per
// step without `unsafe`. `has_less(v, n)` is non-zero iff some byte of `v` is below `n`
// (n <= 128; bytes >= 0x80, i.e. non-ASCII UTF-8, never match), and its lowest set bit is
// exact: borrows only propagate upwards from a matching byte, so it names the first match.
const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH: u64 = 0x8080_8080_8080_8080;

const fn has_less(v: u64, n: u64) -> u64 {
    v.wrapping_sub(ONES.wrapping_mul(n)) & !v & HIGH
}

/// Non-zero iff some byte of `v` equals `c` (lowest set bit exact, as for [`has_less`]).
const fn has_byte(v: u64, c: u8) -> u64 {
    has_less(v ^ ONES.wrapping_mul(c as u64), 1)
}

/// The little-endian word of `b[j..j + 8]`, `None` for a shorter tail.
#[inline]
fn word_at(b: &[u8], j: usize) -> Option<u64> {
    let chunk = b.get(j..j + 8)?;
    <[u8; 8]>::try_from(chunk).ok().map(u64::from_le_bytes)
}

/// Skips string bytes that need no attention (anything but `"`, `\\` and control characters),
/// eight at a time: rubric text is mostly long plain descriptions, and a byte-at-a-time scan
/// was the validator's largest cost. Returns the offset of the first byte of interest when it
/// is in a whole 8-byte word (the lowest set bit of the mask is exact, so no byte of the word is
/// looked at twice), else the start of the tail shorter than 8 bytes, which the caller looks at
/// byte by byte.
#[inline]
fn skip_plain(b: &[u8], mut j: usize) -> usize {
    while let Some(v) = word_at(b, j) {
        let m = has_less(v, 0x20) | has_byte(v, b'"') | has_byte(v, b'\\');
        if m != 0 {
            return j + (m.trailing_zeros() / 8) as usize;
        }
        j += 8;
    }
    j
}

/// The offset of the first `needle` in `b[from..]`, eight bytes at a time (the level-anchor
/// check looks for `[` in every description, and descriptions are most of a rubric's bytes).
#[inline]
pub(crate) fn find_byte(b: &[u8], from: usize, needle: u8) -> Option<usize> {
    let rest = b.get(from..)?;
    // `chunks_exact` proves every word in bounds once, instead of a check per word.
    let mut words = rest.chunks_exact(8);
    let mut j = from;
    for w in &mut words {
        let mut a = [0u8; 8];
        a.copy_from_slice(w);
        let hit = has_byte(u64::from_le_bytes(a), needle);
        if hit != 0 {
            return Some(j + (hit.trailing_zeros() / 8) as usize);
        }
        j += 8;
    }
    words
        .remainder()
        .iter()
        .position(|&c| c == needle)
        .map(|p| j + p)
}

/// The value of the four hex digits at `b[at..at + 4]`; `None` when short or not hex.
fn hex4(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at + 4)?
        .iter()
        .try_fold(0u32, |v, &c| Some(v * 16 + char::from(c).to_digit(16)?))
}

fn scan_digits(b: &[u8], mut j: usize) -> usize {
    while b.get(j).is_some_and(u8::is_ascii_digit) {
        j += 1;
    }
    j
}

/// Scans a number starting at `b[i]`; returns the offset after it.
pub(crate) fn scan_number(b: &[u8], i: usize) -> Result<usize, SyntaxError> {
    let mut j = i;
    if b.get(j) == Some(&b'-') {
        j += 1;
    }
    match b.get(j) {
        Some(b'0') => j += 1,
        Some(b'1'..=b'9') => j = scan_digits(b, j),
        _ => return Err(err(j, notes::INVALID_NUMBER)),
    }
    if b.get(j) == Some(&b'.') {
        let k = scan_digits(b, j + 1);
        if k == j + 1 {
            return Err(err(j, notes::FRACTION_DIGITS));
        }
        j = k;
    }
    if matches!(b.get(j), Some(b'e' | b'E')) {
        j += 1;
        if matches!(b.get(j), Some(b'+' | b'-')) {
            j += 1;
        }
        let k = scan_digits(b, j);
        if k == j {
            return Err(err(j, notes::EXPONENT_DIGITS));
        }
        j = k;
    }
    Ok(j)
}

#[derive(Clone, Copy)]
enum State {
    Value,
    ValueOrEnd,
    Key,
    KeyOrEnd,
    After,
}

/// Checks that one JSON value starts at `i` (after optional whitespace); returns the offset just
/// after it. Nothing after the value is looked at.
pub(crate) fn scan_value(b: &[u8], i: usize) -> Result<usize, SyntaxError> {
    scan_value_indexed(b, i, &mut StringIndex::<0>::new())
}

/// [`scan_value`] that also records the strings it meets in `index` (in text order, as many as
/// fit; the index is cleared first), and the extent of each container that is a direct child
/// of the value (see [`StringIndex::child_end`]). On error the index holds what came before
/// the error.
pub(crate) fn scan_value_indexed<const N: usize>(
    b: &[u8],
    i: usize,
    index: &mut StringIndex<N>,
) -> Result<usize, SyntaxError> {
    index.clear();
    // Bit k of `stack` is 1 when the container at depth k+1 is an object.
    let mut stack: u64 = 0;
    let mut depth: usize = 0;
    let mut i = i;
    let mut state = State::Value;
    // Where the open child container of the value (depth 2) started.
    let mut child_start = 0usize;
    loop {
        i = skip_ws(b, i);
        let Some(&c) = b.get(i) else {
            return Err(err(i, notes::UNEXPECTED_END));
        };
        match state {
            State::Value | State::ValueOrEnd => {
                if matches!(state, State::ValueOrEnd) && c == b']' {
                    i += 1;
                    depth = depth.saturating_sub(1);
                    if depth == 1 {
                        index.record_child(child_start, i);
                    }
                    state = State::After;
                } else {
                    match c {
                        b'{' | b'[' => {
                            if depth >= MAX_DEPTH {
                                return Err(SyntaxError {
                                    offset: i,
                                    what: notes::TOO_DEEP,
                                    too_deep: true,
                                });
                            }
                            let is_obj = c == b'{';
                            if depth == 1 {
                                child_start = i;
                            }
                            if is_obj {
                                stack |= 1 << depth;
                            } else {
                                stack &= !(1 << depth);
                            }
                            depth += 1;
                            i += 1;
                            state = if is_obj {
                                State::KeyOrEnd
                            } else {
                                State::ValueOrEnd
                            };
                            continue;
                        }
                        b'"' => {
                            let (end, escaped) = scan_string(b, i)?;
                            index.record(i, end, escaped);
                            i = end;
                        }
                        b'-' | b'0'..=b'9' => i = scan_number(b, i)?,
                        b't' | b'f' | b'n' => {
                            let lit: &[u8] = match c {
                                b't' => b"true",
                                b'f' => b"false",
                                _ => b"null",
                            };
                            if b.get(i..i + lit.len()) != Some(lit) {
                                return Err(err(i, notes::INVALID_LITERAL));
                            }
                            i += lit.len();
                        }
                        _ => return Err(err(i, notes::EXPECTED_VALUE)),
                    }
                    state = State::After;
                }
            }
            State::Key | State::KeyOrEnd => {
                if matches!(state, State::KeyOrEnd) && c == b'}' {
                    i += 1;
                    depth = depth.saturating_sub(1);
                    if depth == 1 {
                        index.record_child(child_start, i);
                    }
                    state = State::After;
                } else if c == b'"' {
                    let (end, escaped) = scan_string(b, i)?;
                    index.record(i, end, escaped);
                    i = skip_ws(b, end);
                    if b.get(i) != Some(&b':') {
                        return Err(err(i, notes::EXPECTED_COLON));
                    }
                    i += 1;
                    state = State::Value;
                    continue;
                } else {
                    return Err(err(i, notes::EXPECTED_KEY));
                }
            }
            State::After => {
                let in_obj = depth > 0 && stack & (1 << (depth - 1)) != 0;
                match (c, in_obj) {
                    (b',', true) => state = State::Key,
                    (b',', false) => state = State::Value,
                    (b'}', true) | (b']', false) => {
                        depth = depth.saturating_sub(1);
                        if depth == 1 {
                            index.record_child(child_start, i + 1);
                        }
                        state = State::After;
                    }
                    _ => return Err(err(i, notes::EXPECTED_COMMA)),
                }
                i += 1;
                if depth == 0 && matches!(state, State::After) {
                    return Ok(i);
                }
                continue;
            }
        }
        if depth == 0 && matches!(state, State::After) {
            return Ok(i);
        }
    }
}

/// Where one string of checked text starts and ends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Span {
    /// Offset of the opening quote.
    start: u32,
    /// Offset just after the closing quote.
    end: u32,
    /// The string holds at least one escape.
    escaped: bool,
}

#[cfg(test)]
impl Span {
    /// Offsets of the opening quote and just after the closing quote.
    pub fn range(&self) -> (usize, usize) {
        (self.start as usize, self.end as usize)
    }
}

/// Child containers whose extent a [`StringIndex`] keeps (a rubric object has one: its
/// `categories` array).
const CHILD_CAPACITY: usize = 8;

/// The first `N` strings of a checked value, in text order (so sorted by start), filled by
/// [`scan_value_indexed`], and the extents of the first containers that are direct children of
/// the value. Strings past capacity, or in text longer than `u32::MAX` bytes, are simply not
/// recorded: a cursor falls back to scanning them, so the index only ever saves work and never
/// changes a result. Likewise for containers.
#[derive(Clone, Debug)]
pub(crate) struct StringIndex<const N: usize> {
    spans: heapless::Vec<Span, N>,
    /// (start at the opening bracket, end just after the closing one).
    children: heapless::Vec<(u32, u32), CHILD_CAPACITY>,
}

impl<const N: usize> StringIndex<N> {
    pub fn new() -> Self {
        StringIndex {
            spans: heapless::Vec::new(),
            children: heapless::Vec::new(),
        }
    }

    pub fn clear(&mut self) {
        self.spans.clear();
        self.children.clear();
    }

    #[inline]
    pub fn record_child(&mut self, start: usize, end: usize) {
        if N == 0 {
            return;
        }
        if let (Ok(start), Ok(end)) = (u32::try_from(start), u32::try_from(end)) {
            let _ = self.children.push((start, end));
        }
    }

    /// The offset just after the container that opens at `start`, when it is a recorded
    /// direct child of the scanned value: skipping it costs nothing instead of a walk over
    /// all its bytes (a rubric's top-level walk skips `categories`, most of the text, before
    /// reading it).
    pub fn child_end(&self, start: usize) -> Option<usize> {
        let start = u32::try_from(start).ok()?;
        self.children
            .iter()
            .find(|&&(s, _)| s == start)
            .map(|&(_, e)| e as usize)
    }

    #[inline]
    pub fn record(&mut self, start: usize, end: usize, escaped: bool) {
        if N == 0 {
            return; // plain `scan_value`: folded away
        }
        if let (Ok(start), Ok(end)) = (u32::try_from(start), u32::try_from(end)) {
            // Full: later strings are scanned again by the cursor.
            let _ = self.spans.push(Span {
                start,
                end,
                escaped,
            });
        }
    }

    pub fn spans(&self) -> &[Span] {
        &self.spans
    }

    /// Whether every string and child recorded here is recorded the same way in `other`.
    pub fn within<const M: usize>(&self, other: &StringIndex<M>) -> bool {
        self.spans.iter().all(|s| {
            other
                .spans
                .binary_search_by_key(&s.start, |o| o.start)
                .is_ok_and(|k| other.spans.get(k) == Some(s))
        }) && self.children.iter().all(|c| other.children.contains(c))
    }

    /// Where the last recorded string ends (0 when none is recorded).
    pub fn last_end(&self) -> usize {
        self.spans.last().map_or(0, |s| s.end as usize)
    }
}

/// A JSON string as it appears in the text (between the quotes), not yet decoded.
#[derive(Clone, Copy, Debug)]
pub(crate) struct JStr<'a> {
    pub raw: &'a str,
    pub escaped: bool,
    /// Offset of the opening quote in the whole input.
    pub offset: usize,
}

impl<'a> JStr<'a> {
    /// The decoded characters.
    pub fn chars(&self) -> JChars<'a> {
        JChars {
            s: self.raw.chars(),
        }
    }

    /// Decoded length in bytes.
    pub fn decoded_len(&self) -> usize {
        if self.escaped {
            self.chars().map(char::len_utf8).sum()
        } else {
            self.raw.len()
        }
    }

    /// `true` when the decoded string equals `s` exactly.
    pub fn eq_str(&self, s: &str) -> bool {
        if !self.escaped {
            return self.raw == s;
        }
        self.chars().eq(s.chars())
    }

    /// [`trimmed_eq`] of the decoded string and `t`; on a string without escapes, a
    /// comparison of the two trimmed `&str` (the same relation: `str::trim` trims
    /// `char::is_whitespace`, and ASCII case folding by byte or by char agree on UTF-8).
    pub fn trimmed_eq_str(&self, t: &str, ignore_ascii_case: bool) -> bool {
        if self.escaped {
            return trimmed_eq(self.chars(), t.chars(), ignore_ascii_case);
        }
        let (a, b) = (self.raw.trim(), t.trim());
        if ignore_ascii_case {
            a.eq_ignore_ascii_case(b)
        } else {
            a == b
        }
    }

    /// The string itself when it has no escapes, else decoded into the front of `scratch`
    /// (which then shrinks). `None` when `scratch` is too small.
    pub fn materialize(&self, scratch: &mut &'a mut [u8]) -> Option<&'a str> {
        if !self.escaped {
            return Some(self.raw);
        }
        let n = self.decoded_len();
        if scratch.len() < n {
            return None;
        }
        let buf = core::mem::take(scratch);
        let (head, tail) = buf.split_at_mut(n);
        *scratch = tail;
        let mut k = 0;
        for c in self.chars() {
            let w = c.len_utf8();
            let dst = head.get_mut(k..k + w)?;
            c.encode_utf8(dst);
            k += w;
        }
        let head: &'a [u8] = head;
        core::str::from_utf8(head).ok()
    }
}

/// Decoding iterator over a JSON string body. Only built for strings that passed
/// `scan_string`, so every surrogate escape it meets is half of a valid pair; the U+FFFD
/// fallbacks below keep it total (no panic) should it ever see unchecked text.
#[derive(Clone, Debug)]
pub(crate) struct JChars<'a> {
    s: core::str::Chars<'a>,
}

impl JChars<'_> {
    fn hex4(&mut self) -> Option<u32> {
        let mut v = 0u32;
        for _ in 0..4 {
            v = v * 16 + self.s.next()?.to_digit(16)?;
        }
        Some(v)
    }
}

impl Iterator for JChars<'_> {
    type Item = char;
    fn next(&mut self) -> Option<char> {
        let c = self.s.next()?;
        if c != '\\' {
            return Some(c);
        }
        Some(match self.s.next()? {
            'n' => '\n',
            't' => '\t',
            'r' => '\r',
            'b' => '\u{8}',
            'f' => '\u{c}',
            'u' => {
                let Some(hi) = self.hex4() else {
                    return Some('\u{FFFD}');
                };
                if (0xD800..0xDC00).contains(&hi) {
                    // A high surrogate: combine with a following \uDC00..\uDFFF if there is one.
                    let mut look = self.clone();
                    if look.s.next() == Some('\\')
                        && look.s.next() == Some('u')
                        && let Some(lo) = look.hex4()
                        && (0xDC00..0xE000).contains(&lo)
                    {
                        *self = look;
                        let cp = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
                        return Some(char::from_u32(cp).unwrap_or('\u{FFFD}'));
                    }
                    '\u{FFFD}'
                } else {
                    char::from_u32(hi).unwrap_or('\u{FFFD}')
                }
            }
            other => other, // '"', '\\', '/'
        })
    }
}

/// The JSON type of the value at the cursor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Object,
    Array,
    String,
    Number,
    Bool,
    Null,
    /// End of input or a byte that starts no value (only on unchecked text).
    Invalid,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Object => "an object",
            Kind::Array => "an array",
            Kind::String => "a string",
            Kind::Number => "a number",
            Kind::Bool => "a boolean",
            Kind::Null => "null",
            Kind::Invalid => "invalid JSON",
        }
    }
}

/// A position in JSON text; walks values without recursion. `'i` borrows the string index of
/// the text (empty for a cursor without one).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cursor<'a, 'i> {
    pub text: &'a str,
    pub pos: usize,
    /// Strings of `text` recorded by the syntax pass, sorted by start.
    spans: &'i [Span],
    /// Where in `spans` the next string probably is: cursors walk forward, so the string after
    /// the last one looked up is the usual next one, and a hit costs one comparison.
    hint: usize,
}

/// A cursor without a string index.
pub(crate) type PlainCursor<'a> = Cursor<'a, 'static>;

impl<'a> Cursor<'a, 'static> {
    /// A cursor without a string index.
    pub fn new(text: &'a str, pos: usize) -> Self {
        Cursor {
            text,
            pos,
            spans: &[],
            hint: 0,
        }
    }
}

impl<'a, 'i> Cursor<'a, 'i> {
    /// A cursor that looks strings up in `spans` (from [`scan_value_indexed`] over `text`).
    pub fn with_index(text: &'a str, pos: usize, spans: &'i [Span]) -> Self {
        Cursor {
            text,
            pos,
            spans,
            hint: 0,
        }
    }

    /// The string starting at `b[i]` (a quote): the offset after its closing quote and whether
    /// it has escapes, from the index when it holds the string, else by scanning it.
    #[inline]
    fn string_end(&mut self, i: usize) -> Result<(usize, bool), SyntaxError> {
        if self.spans.is_empty() {
            return scan_string(self.b(), i);
        }
        let at = |s: &Span| usize::try_from(s.start).ok() == Some(i);
        let found = match self.spans.get(self.hint) {
            Some(s) if at(s) => Some(self.hint),
            _ => u32::try_from(i)
                .ok()
                .and_then(|key| self.spans.binary_search_by_key(&key, |s| s.start).ok()),
        };
        if let Some(k) = found
            && let Some(s) = self.spans.get(k)
            && let Ok(end) = usize::try_from(s.end)
            // The index belongs to this text only when the span's bytes are a string here;
            // this check keeps a mismatched index from ever producing a bad slice.
            && end > i + 1
            && self.b().get(end - 1) == Some(&b'"')
        {
            self.hint = k + 1;
            return Ok((end, s.escaped));
        }
        scan_string(self.b(), i)
    }

    fn b(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    pub fn peek(&mut self) -> Option<u8> {
        self.pos = skip_ws(self.b(), self.pos);
        self.b().get(self.pos).copied()
    }

    pub fn kind(&mut self) -> Kind {
        match self.peek() {
            Some(b'{') => Kind::Object,
            Some(b'[') => Kind::Array,
            Some(b'"') => Kind::String,
            Some(b'-' | b'0'..=b'9') => Kind::Number,
            Some(b't' | b'f') => Kind::Bool,
            Some(b'n') => Kind::Null,
            _ => Kind::Invalid,
        }
    }

    /// Skips one value (any type). Always advances at least one byte when not at the end.
    pub fn skip_value(&mut self) {
        let b = self.b();
        let mut i = skip_ws(b, self.pos);
        let Some(&first) = b.get(i) else {
            self.pos = i;
            return;
        };
        match first {
            b'"' => i = self.string_end(i).map_or(b.len(), |(e, _)| e),
            b'{' | b'[' => {
                // Bracket counting is enough on checked text; strings are skipped whole so
                // brackets inside them do not count.
                let mut depth = 0usize;
                while let Some(&c) = b.get(i) {
                    match c {
                        b'"' => {
                            i = self.string_end(i).map_or(b.len(), |(e, _)| e);
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth = depth.saturating_sub(1);
                            if depth == 0 {
                                i += 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
            }
            _ => {
                i += 1;
                while b
                    .get(i)
                    .is_some_and(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-' | b'+'))
                {
                    i += 1;
                }
            }
        }
        self.pos = i;
    }

    /// Reads a string value at the cursor.
    pub fn string(&mut self) -> Option<JStr<'a>> {
        if self.peek() != Some(b'"') {
            return None;
        }
        let start = self.pos;
        let (end, escaped) = self.string_end(start).ok()?;
        self.pos = end;
        let raw = self.text.get(start + 1..end - 1)?;
        Some(JStr {
            raw,
            escaped,
            offset: start,
        })
    }

    /// Reads a number value at the cursor as its text.
    pub fn number(&mut self) -> Option<&'a str> {
        if !matches!(self.peek(), Some(b'-' | b'0'..=b'9')) {
            return None;
        }
        let start = self.pos;
        let end = scan_number(self.b(), start).ok()?;
        self.pos = end;
        self.text.get(start..end)
    }

    /// Consumes `{` or `[` when it is next.
    pub fn enter(&mut self, open: u8) -> bool {
        if self.peek() == Some(open) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    /// The next key of the object being walked (consuming `,` before and `:` after it); `None`
    /// at the closing `}` (consumed) or on anything unexpected.
    pub fn next_key(&mut self) -> Option<JStr<'a>> {
        if self.peek() == Some(b',') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'}') => {
                self.pos += 1;
                None
            }
            Some(b'"') => {
                let k = self.string()?;
                if self.peek() == Some(b':') {
                    self.pos += 1;
                }
                Some(k)
            }
            _ => None,
        }
    }

    /// `true` when another array item follows (consuming a `,` before it); consumes the
    /// closing `]` and returns `false` at the end.
    pub fn next_item(&mut self) -> bool {
        if self.peek() == Some(b',') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b']') => {
                self.pos += 1;
                false
            }
            None | Some(b'}') => false,
            Some(_) => true,
        }
    }
}

/// Compares two character sequences after trimming whitespace at both ends, optionally
/// ASCII-case-insensitively, without allocating.
pub(crate) fn trimmed_eq(
    a: impl Iterator<Item = char>,
    b: impl Iterator<Item = char>,
    ignore_ascii_case: bool,
) -> bool {
    let mut a = a.skip_while(|c| c.is_whitespace());
    let mut b = b.skip_while(|c| c.is_whitespace());
    loop {
        match (a.next(), b.next()) {
            (None, None) => return true,
            (Some(x), Some(y)) if x == y || (ignore_ascii_case && x.eq_ignore_ascii_case(&y)) => {}
            (x, y) => {
                // They differ here: equal after trimming only if both rests are whitespace.
                let ws = |c: Option<char>| c.is_none_or(char::is_whitespace);
                return ws(x) && ws(y) && a.all(char::is_whitespace) && b.all(char::is_whitespace);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    /// The SWAR skip stops exactly at the first byte of interest when a whole word holds it,
    /// else at most 7 bytes before it (the tail), and skips everything else (plain ASCII, DEL
    /// and non-ASCII bytes included).
    #[test]
    fn skip_plain_stops_at_the_first_special_byte() {
        for special in [b'"', b'\\', 0x00, 0x1f, b'\n'] {
            // Fillers next to the special bytes (0x21, 0x23, 0x5b, 0x5d, 0x20) would show a
            // false positive of the masks.
            for filler in [b'a', b' ', 0x21, 0x23, 0x5b, 0x5d, 0x7f, 0x80, 0xc3, 0xff] {
                for len in 0..40 {
                    for at in 0..len {
                        let mut buf = vec![filler; len];
                        buf[at] = special;
                        // A second special byte later in the same word changes nothing.
                        if at + 2 < len {
                            buf[at + 2] = b'"';
                        }
                        let j = skip_plain(&buf, 0);
                        let in_whole_word = at / 8 * 8 + 8 <= len;
                        assert!(
                            if in_whole_word {
                                j == at
                            } else {
                                j <= at && at - j < 8
                            },
                            "special {special:#x} at {at} of {len}, stop {j}"
                        );
                    }
                    let plain = vec![filler; len];
                    let j = skip_plain(&plain, 0);
                    assert!(j <= len && j + 8 > len, "plain {len}: stop {j}");
                }
            }
        }
    }

    /// `find_byte` agrees with a byte-by-byte search for every position of the needle, with
    /// and without earlier bytes that differ from it only in the high bit or by one.
    #[test]
    fn find_byte_matches_a_plain_search() {
        for len in 0..40 {
            for from in 0..=len {
                for at in 0..len {
                    for filler in [b'a', b'Z', 0xdb, 0x5c, 0x5a, 0x00] {
                        let mut buf = vec![filler; len];
                        buf[at] = b'[';
                        if at + 1 < len {
                            buf[at + 1] = b'[';
                        }
                        let want = buf[from..]
                            .iter()
                            .position(|&c| c == b'[')
                            .map(|p| p + from);
                        assert_eq!(find_byte(&buf, from, b'['), want, "{len} {from} {at}");
                    }
                }
                assert_eq!(find_byte(&vec![b'x'; len], from, b'['), None);
            }
        }
        assert_eq!(find_byte(b"ab", 5, b'a'), None);
    }

    /// The index records the extent of exactly the containers that are direct children of the
    /// scanned value (empty ones, nested ones and ones after strings with brackets included),
    /// each ending where `Cursor::skip_value` ends it; grandchildren and the value itself are
    /// not recorded, and a failed scan keeps only the children closed before the error.
    #[test]
    fn child_extents_are_the_direct_children_and_agree_with_skip() {
        let text = r#" {"a":[],"b":{"c":[1,{"d":[]}]},"s":"]}[{","e":[[],{}] , "f":1,"g":{}}"#;
        let mut index = StringIndex::<64>::new();
        let start = skip_ws(text.as_bytes(), 0);
        let end = scan_value_indexed(text.as_bytes(), start, &mut index).unwrap();
        assert_eq!(end, text.len());
        let mut children = Vec::new();
        let mut c = Cursor::new(text, start);
        c.enter(b'{');
        while c.next_key().is_some() {
            let at = skip_ws(text.as_bytes(), c.pos);
            c.skip_value();
            if matches!(text.as_bytes()[at], b'{' | b'[') {
                children.push((at, c.pos));
            }
        }
        assert_eq!(children.len(), 4);
        for &(at, end) in &children {
            assert_eq!(index.child_end(at), Some(end), "child at {at}");
        }
        for (i, ch) in text.char_indices() {
            if matches!(ch, '{' | '[') && !children.iter().any(|&(at, _)| at == i) {
                assert_eq!(index.child_end(i), None, "not a child at {i}");
            }
        }
        let broken = r#"{"a":[1],"b":{"c":[}"#;
        assert!(scan_value_indexed(broken.as_bytes(), 0, &mut index).is_err());
        assert_eq!(index.child_end(5), Some(8));
        assert_eq!(index.child_end(13), None);
    }

    #[test]
    fn scan_accepts_and_rejects() {
        for ok in [
            "{}",
            "[]",
            "0",
            "-1.5e+3",
            "\"a\\u00e9\"",
            "{\"a\":[1,{\"b\":null}],\"c\":true}",
            " [ 1 , 2 ] ",
        ] {
            let s = skip_ws(ok.as_bytes(), 0);
            let end = scan_value(ok.as_bytes(), s).unwrap_or_else(|e| panic!("{ok}: {e:?}"));
            assert!(ok[end..].trim().is_empty(), "{ok}");
        }
        for bad in [
            "{",
            "[1,]",
            "{\"a\"}",
            "{\"a\":1,}",
            "01",
            "1.",
            "tru",
            "\"\\x\"",
            "{1:2}",
            "[1 2]",
            "",
            "-",
        ] {
            // Either a syntax error, or a shorter value followed by leftovers ("01" is "0").
            let r = scan_value(bad.as_bytes(), 0);
            assert!(r.map_or(true, |end| !bad[end..].trim().is_empty()), "{bad}");
        }
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        let deep = "[".repeat(100_000);
        let e = scan_value(deep.as_bytes(), 0).unwrap_err();
        assert!(e.too_deep);
        let ok = "[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH);
        assert_eq!(scan_value(ok.as_bytes(), 0), Ok(ok.len()));
    }

    #[test]
    fn decode_escapes() {
        let text = r#""a\"b\\c\/\n\u00e9\ud83d\ude00\uFFFDx""#;
        let mut c = Cursor::new(text, 0);
        let s = c.string().unwrap();
        let d: std::string::String = s.chars().collect();
        assert_eq!(d, "a\"b\\c/\né😀\u{FFFD}x");
        assert_eq!(s.decoded_len(), d.len());
        let mut buf = [0u8; 64];
        let mut scratch: &mut [u8] = &mut buf;
        assert_eq!(s.materialize(&mut scratch), Some(d.as_str()));
        let mut tiny = [0u8; 3];
        let mut scratch: &mut [u8] = &mut tiny;
        assert_eq!(s.materialize(&mut scratch), None);
    }

    /// Scans `text` as one value; on error also checks that the cursor refuses the string.
    fn scan_err(text: &str) -> SyntaxError {
        assert!(Cursor::new(text, 0).string().is_none(), "{text}");
        scan_value(text.as_bytes(), 0).unwrap_err()
    }

    #[test]
    fn lone_high_surrogate_is_rejected() {
        // At the end of the string, before a plain character, and before a short escape.
        for (text, at) in [
            (r#""\ud800""#, 1),
            (r#""ab\uD800x""#, 3),
            (r#""\udbff\n""#, 1),
            (r#""\ud800\""#, 1),
        ] {
            let e = scan_err(text);
            assert_eq!(e.offset, at, "{text}");
            assert!(
                e.what.as_str().contains("lone high surrogate"),
                "{text}: {e:?}"
            );
            assert!(!e.too_deep);
        }
        // Inside a container the error keeps the absolute offset of the escape.
        let text = r#"{"k": ["x", "\ud83d"]}"#;
        let e = scan_value(text.as_bytes(), 0).unwrap_err();
        assert_eq!(e.offset, text.find('\\').unwrap());
    }

    #[test]
    fn lone_low_surrogate_is_rejected() {
        for (text, at) in [(r#""\udc00""#, 1), (r#""x\uDFFFy""#, 2)] {
            let e = scan_err(text);
            assert_eq!(e.offset, at, "{text}");
            assert!(
                e.what.as_str().contains("lone low surrogate"),
                "{text}: {e:?}"
            );
        }
        // A low surrogate after a complete pair is lone too (the pair consumed its partner).
        let e = scan_err(r#""\ud83d\ude00\ude00""#);
        assert_eq!(e.offset, 13);
        // Two low surrogates in a row (reversed pair): the first is already lone.
        assert_eq!(scan_err(r#""\udc00\ud800""#).offset, 1);
    }

    #[test]
    fn high_surrogate_followed_by_non_low_escape_is_rejected() {
        // A BMP escape, a second high surrogate, a truncated or non-hex \u: the error points
        // at the high surrogate, not at what follows.
        for text in [
            r#""\ud800\u0041""#,
            r#""\ud800\ud800""#,
            r#""\udbff\uE000""#,
            r#""\ud800\u12""#,
            r#""\ud800\uzzzz""#,
        ] {
            let e = scan_err(text);
            assert_eq!(e.offset, 1, "{text}");
            assert!(
                e.what.as_str().contains("lone high surrogate"),
                "{text}: {e:?}"
            );
        }
    }

    #[test]
    fn valid_surrogate_pair_decodes() {
        for (text, want) in [
            (r#""\ud83d\ude00""#, "😀"),
            (r#""\uD800\uDC00""#, "\u{10000}"),
            (r#""a\udbff\udfffb""#, "a\u{10FFFF}b"),
            (r#""\ud83d\ude00\ud83d\ude00""#, "😀😀"),
        ] {
            assert_eq!(scan_value(text.as_bytes(), 0), Ok(text.len()), "{text}");
            let s = Cursor::new(text, 0).string().unwrap();
            let d: std::string::String = s.chars().collect();
            assert_eq!(d, want, "{text}");
            assert!(s.eq_str(want));
            assert_eq!(s.decoded_len(), want.len());
        }
        // Non-surrogate escapes next to the surrogate range stay valid on their own.
        for text in [r#""\ud7ff""#, r#""\ue000""#, r#""\uffff""#] {
            assert_eq!(scan_value(text.as_bytes(), 0), Ok(text.len()), "{text}");
        }
    }

    /// The `&str` fast path of `trimmed_eq_str` is the iterator comparison.
    #[test]
    fn trimmed_eq_str_agrees_with_trimmed_eq() {
        let words = [
            "",
            " ",
            "ab",
            " ab ",
            "AB",
            "a b",
            "\u{a0}ab",
            "ab\u{2003}",
            "ÄB",
            "äb",
            "é",
            "E",
            "\tab\n",
        ];
        for x in words {
            for y in words {
                let s = JStr {
                    raw: x,
                    escaped: false,
                    offset: 0,
                };
                for ci in [false, true] {
                    assert_eq!(
                        s.trimmed_eq_str(y, ci),
                        trimmed_eq(x.chars(), y.chars(), ci),
                        "{x:?} {y:?} {ci}"
                    );
                }
            }
        }
    }

    #[test]
    fn trimmed_comparison() {
        assert!(trimmed_eq(" ab ".chars(), "ab".chars(), false));
        assert!(trimmed_eq("ab  ".chars(), "ab \t".chars(), false));
        assert!(!trimmed_eq("ab c".chars(), "ab".chars(), false));
        assert!(!trimmed_eq("AB".chars(), "ab".chars(), false));
        assert!(trimmed_eq("AB".chars(), " ab".chars(), true));
        assert!(!trimmed_eq("a b".chars(), "ab".chars(), true));
    }

    /// Walks every key and string value of `text` (an object of strings and arrays of
    /// strings), returning what the cursor read.
    fn read_all(mut c: Cursor<'_, '_>) -> Vec<(String, usize, bool)> {
        let mut got = Vec::new();
        let mut push = |s: JStr<'_>| got.push((s.raw.to_string(), s.offset, s.escaped));
        assert!(c.enter(b'{'));
        while let Some(k) = c.next_key() {
            push(k);
            if c.enter(b'[') {
                while c.next_item() {
                    push(c.string().unwrap());
                }
            } else {
                push(c.string().unwrap());
            }
        }
        got
    }

    /// The string index only saves work: a cursor reads the same strings with a full index, a
    /// partial one (capacity smaller than the number of strings) and none.
    #[test]
    fn indexed_cursor_reads_what_a_plain_cursor_reads() {
        let text = r#"{"a": "x\"y", "bb": ["1", "", "\u00e9"], "c": "plain text"}"#;
        let plain = read_all(Cursor::new(text, 0));
        assert_eq!(plain.len(), 8);
        let mut full = StringIndex::<16>::new();
        assert_eq!(
            scan_value_indexed(text.as_bytes(), 0, &mut full),
            Ok(text.len())
        );
        assert_eq!(full.spans().len(), 8);
        assert_eq!(read_all(Cursor::with_index(text, 0, full.spans())), plain);
        let mut partial = StringIndex::<3>::new();
        assert_eq!(
            scan_value_indexed(text.as_bytes(), 0, &mut partial),
            Ok(text.len())
        );
        assert_eq!(partial.spans().len(), 3);
        assert_eq!(
            read_all(Cursor::with_index(text, 0, partial.spans())),
            plain
        );
        // The index of some other text (never built by this crate) gives wrong strings but no
        // panic and no slice outside the text: the cursor still makes progress to the end.
        let other = r#"{"zzzzzzzzzzzzzzzzzzzzzzzzz": 1}"#;
        let mut wrong = StringIndex::<4>::new();
        assert!(scan_value_indexed(other.as_bytes(), 0, &mut wrong).is_ok());
        let mut c = Cursor::with_index(text, 0, wrong.spans());
        c.skip_value();
        assert!(c.pos > 0 && c.pos <= text.len());
        let mut c = Cursor::with_index(text, 1, wrong.spans());
        assert!(c.string().is_none_or(|s| s.raw.len() < text.len()));
    }

    #[test]
    fn cursor_walks_objects() {
        let text = r#"{"a": [1, "x", {"k": []}], "b": -2.5e1, "c": null}"#;
        let mut c = Cursor::new(text, 0);
        assert!(c.enter(b'{'));
        let k = c.next_key().unwrap();
        assert!(k.eq_str("a"));
        assert_eq!(c.kind(), Kind::Array);
        c.skip_value();
        assert!(c.next_key().unwrap().eq_str("b"));
        assert_eq!(c.number(), Some("-2.5e1"));
        assert!(c.next_key().unwrap().eq_str("c"));
        assert_eq!(c.kind(), Kind::Null);
        c.skip_value();
        assert!(c.next_key().is_none());
        assert_eq!(c.pos, text.len());
    }
}
