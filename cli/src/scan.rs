//! The one-pass strict check of the common line: a conservative, allocation-free mirror of
//! [`crate::json::check_strict`].
//!
//! [`scan_line`] walks a line once and either *accepts* it, handing back the top-level members
//! as spans of the line's text, or *declines*. It accepts only lines that `check_strict`
//! accepts (the syntax serde_json takes, no duplicate key at any depth, finite numbers, nesting
//! within the limit), and it declines everything it cannot settle cheaply: any syntax error, a
//! key written with escapes, an object with more than [`MAX_KEYS`] keys, nesting deeper than
//! [`MAX_DEPTH`], a surrogate `\u` escape, a number long enough that it might overflow `f64`.
//! A declined line goes down the reference path (`check_strict` and serde_json), which gives it
//! its exact error message, so declining costs time, never a different answer. The relation
//! "accepted here implies accepted there, with the same members" is tested against serde_json
//! on the fuzz seeds and on random mutations (`cli/tests/fast_path.rs`).
//!
//! Strings are skipped eight bytes at a time (a word-wide test for `"`, `\` and control bytes),
//! which matters because a rubric line is mostly long descriptions.
//!
//! The scan can also index one value of the line for the rubric validator
//! ([`scan_line_indexed`]): where its strings and direct children start and end, so that
//! `care_core::validate_indexed_into` reads a rubric object without scanning its bytes again.

use care_core::SyntaxIndex;

/// Deepest nesting accepted (serde_json's limit, which the reference path applies, is 128; a
/// rubric needs 5).
pub const MAX_DEPTH: usize = 64;

/// Most keys in one object accepted (duplicates are found by comparing with every earlier key
/// of the object, so this bounds the quadratic cost; the reference path hashes).
pub const MAX_KEYS: usize = 32;

/// Longest number accepted, in bytes: any JSON number of at most 200 mantissa digits and a
/// two-digit exponent is below `1e300`, so finite as an `f64`.
const MAX_NUMBER_DIGITS: usize = 200;

/// One top-level member of an accepted line: the key (it has no escapes, so the raw text is the
/// key) and the value's exact text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member<'a> {
    /// The key, without quotes.
    pub key: &'a str,
    /// The value's text, exactly as in the line (a string keeps its quotes and escapes).
    pub value: &'a str,
}

/// Reusable memory of [`scan_line`] (keep one per thread), and after an accepted scan the
/// top-level members of the line, as offsets into it.
#[derive(Debug, Default)]
pub struct Scratch {
    keys: Vec<(u32, u32)>,
    opens: Vec<(u8, u32)>,
    /// Key start, key end, value start, value end.
    members: Vec<[u32; 4]>,
}

impl Scratch {
    /// The top-level members of `text`, the line last accepted by [`scan_line`] with this
    /// scratch, in line order (none when the line is not an object).
    pub fn members<'s, 'a: 's>(&'s self, text: &'a str) -> impl Iterator<Item = Member<'a>> + 's {
        self.members.iter().map(move |&[ks, ke, vs, ve]| Member {
            key: text.get(ks as usize..ke as usize).unwrap_or(""),
            value: text.get(vs as usize..ve as usize).unwrap_or(""),
        })
    }

    /// The text of the top-level member `key` (see [`Scratch::members`]).
    pub fn member<'a>(&self, text: &'a str, key: &str) -> Option<&'a str> {
        self.members(text).find(|m| m.key == key).map(|m| m.value)
    }
}

/// Scans `text` (one line, no newline); `true` when it is accepted, with its top-level members
/// in `scratch` ([`Scratch::members`]). `false`: declined (no members).
pub fn scan_line(text: &str, scratch: &mut Scratch) -> bool {
    scan_inner(text, scratch, None, None)
}

/// [`scan_line`] that also decodes the string value of the top-level member `key` into `out`
/// in the same pass (cleared first; left empty when there is no such string member), so the
/// bytes of that string are read once. Returns what [`scan_line`] returns.
pub fn scan_line_decoding(text: &str, scratch: &mut Scratch, key: &str, out: &mut String) -> bool {
    out.clear();
    let ok = scan_inner(text, scratch, Some((key.as_bytes(), &mut *out)), None);
    if !ok {
        out.clear();
    }
    ok
}

/// Which value of an accepted line [`scan_line_indexed`] indexes for the validator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexTarget<'k> {
    /// The line's own value (a rubric object per line).
    Line,
    /// The value of this top-level member (the `"rubric"` of a `care score` line).
    Member(&'k str),
}

/// [`scan_line_decoding`] (pass `decode: None` for plain [`scan_line`]) that also fills `index`
/// with what the validator's syntax pass would learn about `target`: its extent, its strings
/// and its direct children, as offsets into the target's own text. After an accepted scan the
/// index describes the target exactly (when the target exists: an index with no value otherwise),
/// so `care_core::validate_indexed_into` skips the second pass over those bytes.
pub fn scan_line_indexed(
    text: &str,
    scratch: &mut Scratch,
    decode: Option<(&str, &mut String)>,
    target: IndexTarget<'_>,
    index: &mut SyntaxIndex,
) -> bool {
    index.clear();
    let decode = decode.map(|(k, out)| {
        out.clear();
        (k.as_bytes(), out)
    });
    let target = match target {
        IndexTarget::Line => Target::Line,
        IndexTarget::Member(k) => Target::Member(k.as_bytes()),
    };
    let ok = scan_inner(text, scratch, decode, Some((target, index)));
    if !ok {
        index.clear();
    }
    ok
}

fn scan_inner(
    text: &str,
    scratch: &mut Scratch,
    decode: Option<(&[u8], &mut String)>,
    index: Option<(Target<'_>, &mut SyntaxIndex)>,
) -> bool {
    scratch.keys.clear();
    scratch.opens.clear();
    scratch.members.clear();
    if text.len() >= u32::MAX as usize {
        return false;
    }
    let mut s = Scanner {
        s: text,
        b: text.as_bytes(),
        i: 0,
        keys: &mut scratch.keys,
        opens: &mut scratch.opens,
        decode,
        rec: index.map(|(target, index)| Recorder {
            target,
            index,
            at: None,
            child: 0,
            done: false,
        }),
    };
    let ok = s.document(&mut scratch.members);
    if !ok {
        scratch.members.clear();
    }
    ok
}

thread_local! {
    static REFERENCE_ONLY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with the fast path off on this thread: every line goes through the reference path
/// (`check_strict` and serde_json). For the differential tests and benchmarks.
pub fn with_reference_path<R>(f: impl FnOnce() -> R) -> R {
    let was = REFERENCE_ONLY.replace(true);
    let r = f();
    REFERENCE_ONLY.set(was);
    r
}

/// Whether the fast path may be taken on this thread (see [`with_reference_path`]).
pub fn fast_path_on() -> bool {
    !REFERENCE_ONLY.get()
}

/// The decoded text of a JSON string literal `raw` (quotes included) that [`scan_line`]
/// accepted: borrowed when it has no escapes, else decoded into `buf` (cleared first).
pub fn decode_string<'s>(raw: &'s str, buf: &'s mut String) -> &'s str {
    let inner = raw
        .strip_prefix('"')
        .and_then(|r| r.strip_suffix('"'))
        .unwrap_or("");
    if !inner.as_bytes().contains(&b'\\') {
        return inner;
    }
    buf.clear();
    buf.reserve(inner.len());
    let b = inner.as_bytes();
    // Copy runs between escapes; a rubric's text escapes every quote, so runs are short and an
    // inline search beats a `memchr` call per run: eight bytes at a time (in an accepted
    // literal's inside the only byte `special` flags is `\`), then byte by byte in the tail.
    let (mut run, mut j) = (0, 0);
    loop {
        j = skip_plain(b, j);
        let Some(&c) = b.get(j) else { break };
        if c != b'\\' {
            j += 1;
            continue;
        }
        buf.push_str(inner.get(run..j).unwrap_or(""));
        let (ch, used) = match b.get(j + 1) {
            Some(b'n') => ('\n', 2),
            Some(b't') => ('\t', 2),
            Some(b'r') => ('\r', 2),
            Some(b'b') => ('\u{8}', 2),
            Some(b'f') => ('\u{c}', 2),
            Some(b'u') => {
                // Accepted lines hold only non-surrogate `\u` escapes of four hex digits.
                let cp = inner
                    .get(j + 2..j + 6)
                    .and_then(|h| u32::from_str_radix(h, 16).ok())
                    .and_then(char::from_u32)
                    .unwrap_or(char::REPLACEMENT_CHARACTER);
                (cp, 6)
            }
            // `"`, `\` and `/` stand for themselves.
            Some(&c) => (char::from(c), 2),
            None => break,
        };
        buf.push(ch);
        j += used;
        run = j;
    }
    buf.push_str(inner.get(run..).unwrap_or(""));
    buf
}

struct Scanner<'b, 'k> {
    /// The line, and its bytes.
    s: &'b str,
    b: &'b [u8],
    i: usize,
    /// Keys (start, end) of every object being read, innermost last.
    keys: &'k mut Vec<(u32, u32)>,
    /// Open containers: (`{` or `[`, index in `keys` where its keys start).
    opens: &'k mut Vec<(u8, u32)>,
    /// The top-level key whose string value is decoded while it is scanned, and where to.
    decode: Option<(&'k [u8], &'k mut String)>,
    /// The value being indexed for the validator, if any.
    rec: Option<Recorder<'k>>,
}

#[derive(Clone, Copy)]
enum Target<'k> {
    Line,
    Member(&'k [u8]),
}

/// Records the target value's strings and direct children into a [`SyntaxIndex`] while the
/// scanner reads them.
struct Recorder<'k> {
    target: Target<'k>,
    index: &'k mut SyntaxIndex,
    /// While the target is being read: its first byte, the nesting level it sits at, and the
    /// offset its own text starts at in the line (what recorded offsets are relative to).
    at: Option<(usize, usize, usize)>,
    /// The target was read (an accepted line has it once at most).
    done: bool,
    /// Where the open direct child of the target started.
    child: usize,
}

const LO: u64 = 0x0101_0101_0101_0101;
const HI: u64 = 0x8080_8080_8080_8080;

/// Bit 7 of each byte of the result is set for the first byte of `w` that is `"`, `\` or below
/// 0x20 (and possibly for later bytes; the lowest set bit is exact).
#[inline]
fn special(w: u64) -> u64 {
    let quote = w ^ (LO * u64::from(b'"'));
    let slash = w ^ (LO * u64::from(b'\\'));
    let zero = |x: u64| x.wrapping_sub(LO) & !x;
    (zero(quote) | zero(slash) | w.wrapping_sub(LO * 0x20) & !w) & HI
}

/// The first quote, backslash or control byte at or after `j`, eight bytes at a time; where
/// fewer than eight bytes are left, the start of that tail (the callers go on byte by byte).
#[inline]
fn skip_plain(b: &[u8], mut j: usize) -> usize {
    while let Some(chunk) = b.get(j..j + 8) {
        let mut w = [0u8; 8];
        w.copy_from_slice(chunk);
        let m = special(u64::from_le_bytes(w));
        if m != 0 {
            return j + (m.trailing_zeros() / 8) as usize;
        }
        j += 8;
    }
    j
}

impl Scanner<'_, '_> {
    #[inline]
    fn ws(&mut self) {
        while let Some(&c) = self.b.get(self.i) {
            if !matches!(c, b' ' | b'\t' | b'\n' | b'\r') {
                break;
            }
            self.i += 1;
        }
    }

    #[inline]
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    /// The whole line: one value between optional whitespace; the top-level members when the
    /// value is an object. Iterative (an explicit stack), so hostile nesting costs no stack.
    fn document(&mut self, members: &mut Vec<[u32; 4]>) -> bool {
        self.ws();
        let top_object = self.peek() == Some(b'{');
        // The top-level member being read: (key start, key end, value start).
        let mut pending: Option<(usize, usize, usize)> = None;
        loop {
            // A value is expected here.
            let Some(c) = self.peek() else { return false };
            if self.opens.len() <= 1 {
                self.target_starts(top_object, pending);
            }
            match c {
                b'{' | b'[' => {
                    if self.opens.len() >= MAX_DEPTH {
                        return false;
                    }
                    self.child_opens();
                    self.i += 1;
                    self.opens.push((c, self.keys.len() as u32));
                    self.ws();
                    let close = if c == b'{' { b'}' } else { b']' };
                    if self.peek() == Some(close) {
                        self.i += 1;
                        self.opens.pop();
                        self.child_closes();
                    } else if c == b'{' {
                        if !self.key() {
                            return false;
                        }
                        if self.opens.len() == 1 && top_object {
                            pending = self
                                .keys
                                .last()
                                .map(|&(s, e)| (s as usize, e as usize, self.i));
                        }
                        continue;
                    } else {
                        continue;
                    }
                }
                b'"' => {
                    let decode_here = self.opens.len() == 1
                        && top_object
                        && pending.is_some_and(|(ks, ke, _)| {
                            self.decode
                                .as_ref()
                                .is_some_and(|(k, _)| self.b.get(ks..ke) == Some(*k))
                        });
                    let ok = match self.decode.take() {
                        Some((k, out)) if decode_here => {
                            let ok = self.string_into(out).is_some();
                            self.decode = Some((k, out));
                            ok
                        }
                        d => {
                            self.decode = d;
                            self.string().is_some()
                        }
                    };
                    if !ok {
                        return false;
                    }
                }
                b't' => {
                    if !self.literal(b"true") {
                        return false;
                    }
                }
                b'f' => {
                    if !self.literal(b"false") {
                        return false;
                    }
                }
                b'n' => {
                    if !self.literal(b"null") {
                        return false;
                    }
                }
                b'-' | b'0'..=b'9' => {
                    if !self.number() {
                        return false;
                    }
                }
                _ => return false,
            }
            // A value ended; close containers and find the next value.
            loop {
                let end = self.i;
                self.target_ends(end);
                self.ws();
                let Some(&(open, key_mark)) = self.opens.last() else {
                    // The root value ended: only whitespace may follow.
                    return self.i == self.b.len();
                };
                if self.opens.len() == 1
                    && top_object
                    && let Some((ks, ke, vs)) = pending.take()
                {
                    members.push([ks as u32, ke as u32, vs as u32, end as u32]);
                }
                match (open, self.peek()) {
                    (_, Some(b',')) => {
                        self.i += 1;
                        self.ws();
                        if open == b'{' {
                            if !self.key() {
                                return false;
                            }
                            if self.opens.len() == 1 && top_object {
                                pending = self
                                    .keys
                                    .last()
                                    .map(|&(s, e)| (s as usize, e as usize, self.i));
                            }
                        }
                        break;
                    }
                    (b'{', Some(b'}')) | (b'[', Some(b']')) => {
                        self.i += 1;
                        self.keys.truncate(key_mark as usize);
                        self.opens.pop();
                        self.child_closes();
                    }
                    _ => return false,
                }
            }
        }
    }

    /// `"key"` `:` inside an object: checks the key is new in its object, records it, and
    /// leaves `i` at the value (whitespace skipped).
    fn key(&mut self) -> bool {
        if self.peek() != Some(b'"') {
            return false;
        }
        let start = self.i + 1;
        match self.string() {
            Some(false) => {}
            // Escaped keys need decoding to compare: the reference path does that.
            _ => return false,
        }
        let end = self.i - 1;
        let mark = self.opens.last().map_or(0, |&(_, m)| m as usize);
        let this = self.b.get(start..end).unwrap_or(&[]);
        let earlier = self.keys.get(mark..).unwrap_or(&[]);
        if earlier.len() >= MAX_KEYS
            || earlier
                .iter()
                .any(|&(s, e)| self.b.get(s as usize..e as usize) == Some(this))
        {
            return false;
        }
        self.keys.push((start as u32, end as u32));
        self.ws();
        if self.peek() != Some(b':') {
            return false;
        }
        self.i += 1;
        self.ws();
        true
    }

    /// A string at `i` (the opening quote); `Some(has escapes)` and `i` after the closing
    /// quote, or `None` (declined).
    fn string(&mut self) -> Option<bool> {
        let b = self.b;
        let start = self.i;
        let mut j = self.i + 1;
        let mut escaped = false;
        loop {
            j = skip_plain(b, j);
            let c = *b.get(j)?;
            match c {
                b'"' => {
                    self.i = j + 1;
                    if let Some(r) = &mut self.rec
                        && let Some((_, _, base)) = r.at
                    {
                        r.index.string(start - base, self.i - base, escaped);
                    }
                    return Some(escaped);
                }
                b'\\' => {
                    escaped = true;
                    match b.get(j + 1)? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => j += 2,
                        b'u' => {
                            let hex = b.get(j + 2..j + 6)?;
                            let mut cp = 0u32;
                            for &h in hex {
                                cp = cp * 16 + char::from(h).to_digit(16)?;
                            }
                            // Surrogates (pairs or lone ones): the reference path decides.
                            if (0xD800..0xE000).contains(&cp) {
                                return None;
                            }
                            j += 6;
                        }
                        _ => return None,
                    }
                }
                c if c < 0x20 => return None,
                _ => j += 1,
            }
        }
    }

    /// [`Scanner::string`] that appends the decoded string to `out` as it goes: each run of
    /// plain bytes (found eight at a time) in one copy, each escape as the character it stands
    /// for. The runs are `&str` slices of the line that start and end next to ASCII bytes, so
    /// `out` is valid UTF-8 by construction and never checked again.
    fn string_into(&mut self, out: &mut String) -> Option<()> {
        let (s, b) = (self.s, self.b);
        let mut j = self.i + 1;
        let mut run = j;
        loop {
            j = skip_plain(b, j);
            let c = *b.get(j)?;
            match c {
                b'"' => {
                    out.push_str(s.get(run..j)?);
                    self.i = j + 1;
                    return Some(());
                }
                b'\\' => {
                    out.push_str(s.get(run..j)?);
                    let (ch, used) = match *b.get(j + 1)? {
                        e @ (b'"' | b'\\' | b'/') => (char::from(e), 2),
                        b'b' => ('\u{8}', 2),
                        b'f' => ('\u{c}', 2),
                        b'n' => ('\n', 2),
                        b'r' => ('\r', 2),
                        b't' => ('\t', 2),
                        b'u' => {
                            let hex = b.get(j + 2..j + 6)?;
                            let mut cp = 0u32;
                            for &h in hex {
                                cp = cp * 16 + char::from(h).to_digit(16)?;
                            }
                            // Surrogates (pairs or lone ones): the reference path decides.
                            (char::from_u32(cp)?, 6)
                        }
                        _ => return None,
                    };
                    out.push(ch);
                    j += used;
                    run = j;
                }
                c if c < 0x20 => return None,
                // A plain byte of the tail shorter than a word.
                _ => j += 1,
            }
        }
    }

    /// At the start of a value at nesting level 0 or 1: starts recording when it is the target.
    #[inline]
    fn target_starts(&mut self, top_object: bool, pending: Option<(usize, usize, usize)>) {
        let Some(r) = &mut self.rec else { return };
        if r.done || r.at.is_some() {
            return;
        }
        let level = self.opens.len();
        let base = match r.target {
            Target::Line if level == 0 => 0,
            Target::Member(k)
                if level == 1
                    && top_object
                    && pending.is_some_and(|(ks, ke, _)| self.b.get(ks..ke) == Some(k)) =>
            {
                self.i
            }
            _ => return,
        };
        r.at = Some((self.i, level, base));
    }

    /// After a value that ended at `end`: when it is the target, records its extent and stops.
    #[inline]
    fn target_ends(&mut self, end: usize) {
        if let Some(r) = &mut self.rec
            && let Some((start, level, base)) = r.at
            && self.opens.len() == level
        {
            r.index.value(start - base, end - base);
            r.at = None;
            r.done = true;
        }
    }

    /// Before a container opens at `i`: notes where, when it is a direct child of the target.
    #[inline]
    fn child_opens(&mut self) {
        if let Some(r) = &mut self.rec
            && let Some((_, level, _)) = r.at
            && self.opens.len() == level + 1
        {
            r.child = self.i;
        }
    }

    /// After a container closed (`i` just past it): records it when it was a direct child of
    /// the target.
    #[inline]
    fn child_closes(&mut self) {
        if let Some(r) = &mut self.rec
            && let Some((_, level, base)) = r.at
            && self.opens.len() == level + 1
        {
            r.index.child(r.child - base, self.i - base);
        }
    }

    fn literal(&mut self, word: &[u8]) -> bool {
        if self.b.get(self.i..self.i + word.len()) == Some(word) {
            self.i += word.len();
            true
        } else {
            false
        }
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`, short enough to be finite.
    fn number(&mut self) -> bool {
        let b = self.b;
        let start = self.i;
        let mut j = self.i;
        if b.get(j) == Some(&b'-') {
            j += 1;
        }
        let digits = |j: &mut usize| {
            let s = *j;
            while b.get(*j).is_some_and(u8::is_ascii_digit) {
                *j += 1;
            }
            *j - s
        };
        match b.get(j) {
            Some(b'0') => j += 1,
            Some(b'1'..=b'9') => {
                digits(&mut j);
            }
            _ => return false,
        }
        if b.get(j) == Some(&b'.') {
            j += 1;
            if digits(&mut j) == 0 {
                return false;
            }
        }
        if j - start > MAX_NUMBER_DIGITS {
            return false;
        }
        if matches!(b.get(j), Some(b'e' | b'E')) {
            j += 1;
            if matches!(b.get(j), Some(b'+' | b'-')) {
                j += 1;
            }
            let n = digits(&mut j);
            if n == 0 || n > 2 {
                return false;
            }
        }
        self.i = j;
        true
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn scan(text: &str) -> Option<Vec<(String, String)>> {
        let mut s = Scratch::default();
        scan_line(text, &mut s).then(|| {
            s.members(text)
                .map(|x| (x.key.to_owned(), x.value.to_owned()))
                .collect()
        })
    }

    #[test]
    fn members_are_exact_spans() {
        let got =
            scan(r#" {"id" : 1e2 , "a":[1, {"b":[]}] ,"s":"x\ny\u00e9", "o": {} } "#).unwrap();
        let want = [
            ("id", "1e2"),
            ("a", r#"[1, {"b":[]}]"#),
            ("s", r#""x\ny\u00e9""#),
            ("o", "{}"),
        ];
        assert_eq!(got.len(), want.len());
        for ((k, v), (wk, wv)) in got.iter().zip(want) {
            assert_eq!((k.as_str(), v.as_str()), (wk, wv));
        }
        assert_eq!(scan("[1,2]").unwrap(), []);
        assert_eq!(scan("  -0.5e-07 ").unwrap(), []);
    }

    #[test]
    fn declines_what_the_reference_must_judge() {
        for bad in [
            "",
            " ",
            "{",
            "{}}",
            "{} x",
            "[1,]",
            "{\"a\":1,}",
            "{\"a\" 1}",
            "{1:2}",
            "01",
            "1.",
            ".5",
            "-",
            "1e",
            "1e+",
            "+1",
            "1e999",
            "tru",
            "nul",
            "[1 2]",
            "\"a\u{1}\"",
            r#""\x""#,
            r#""\u12""#,
            r#""\ud800""#,
            r#""\ud83d\ude00""#,
            r#"{"a":1,"a":2}"#,
            r#"{"x":{"a":1,"a":2}}"#,
            r#"{"a\u0062":1}"#,
            "\"abc",
        ] {
            assert!(scan(bad).is_none(), "{bad:?}");
        }
        let deep = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        assert!(scan(&deep).is_none());
        let ok = "[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH);
        assert!(scan(&ok).is_some());
        let many: Vec<String> = (0..=MAX_KEYS).map(|k| format!("\"k{k}\":{k}")).collect();
        assert!(scan(&format!("{{{}}}", many.join(","))).is_none());
        assert!(scan(&format!("{{{}}}", many[..MAX_KEYS].join(","))).is_some());
        // Same key in sibling objects is fine; the key list is per object.
        assert!(scan(r#"[{"a":1},{"a":2}]"#).is_some());
        assert!(scan(r#"{"a":{"a":1},"b":{"a":2}}"#).is_some());
    }

    #[test]
    fn strings_decode_in_the_scan_like_serde_json() {
        let mut s = Scratch::default();
        let mut out = String::new();
        for raw in [
            r#""plain and long enough to take the word loop""#,
            r#""a\nb\t\"\\\/\b\f\r\u00e9\u20ac and é more text after the escapes""#,
            r#""""#,
        ] {
            let want: String = serde_json::from_str(raw).unwrap();
            let line = format!(r#"{{"id":"\n","text":{raw},"x":["text"]}}"#);
            assert!(scan_line_decoding(&line, &mut s, "text", &mut out));
            assert_eq!(out, want);
        }
        // Only the top-level member is decoded, and nothing when it is no string.
        assert!(scan_line_decoding(
            r#"{"a":{"text":"x"},"text":1}"#,
            &mut s,
            "text",
            &mut out
        ));
        assert!(out.is_empty());
        assert!(!scan_line_decoding(
            r#"{"text":"\ud800"}"#,
            &mut s,
            "text",
            &mut out
        ));
    }

    /// Both decoders (in the scan and of an accepted literal) give serde_json's string for
    /// literals of every length with escapes at every offset of the eight-byte words: runs of
    /// plain ASCII and multi-byte characters between `\"`, `\\`, `\n`, `\u` escapes.
    #[test]
    fn long_strings_with_escapes_anywhere_decode_like_serde_json() {
        let pieces = [
            "a", "bcdefgh", "é", "語", "\"", "\\", "\n", "\t", "\u{1}", "\u{2028}", "/", " ",
        ];
        let mut x = 0x243F_6A88_85A3_08D3u64;
        let mut s = Scratch::default();
        let (mut out, mut buf) = (String::new(), String::new());
        for _ in 0..5000 {
            let mut want = String::new();
            for _ in 0..(x % 40) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                want.push_str(pieces[(x % pieces.len() as u64) as usize]);
            }
            let mut raw = serde_json::to_string(&want).unwrap();
            if x.is_multiple_of(3) {
                // serde_json writes `\u` only for controls; spell some characters that way.
                raw = raw.replace('é', "\\u00e9");
            }
            assert_eq!(decode_string(&raw, &mut buf), want, "{raw}");
            let line = format!(r#"{{"text":{raw}}}"#);
            assert!(
                scan_line_decoding(&line, &mut s, "text", &mut out),
                "{line}"
            );
            assert_eq!(out, want, "{raw}");
        }
    }

    #[test]
    fn strings_decode_like_serde_json() {
        let mut buf = String::new();
        for raw in [r#""plain""#, r#""a\nb\t\"\\\/\b\f\r\u00e9\u20ac""#, r#""""#] {
            let want: String = serde_json::from_str(raw).unwrap();
            assert_eq!(decode_string(raw, &mut buf), want);
        }
    }
}
