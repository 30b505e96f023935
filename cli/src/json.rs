//! Strict JSON input and ordered JSON output, one line at a time.
//!
//! Input is checked with `serde_json` through a visitor that builds nothing and rejects
//! duplicate object keys (serde_json silently keeps the last one, which would let `{"rewards":
//! [..], "rewards": [..]}` mean two different things to two tools); the subcommands then read
//! typed values straight from the line's text ([`crate::input`]), so a line never becomes a
//! tree of `serde_json::Value`s many times its size. Nesting is bounded by serde_json's
//! recursion limit (128), so a hostile line cannot overflow the stack.
//!
//! Output is written by hand with [`Obj`] and [`Arr`] so that keys keep the order the CLI
//! documents (`"line"` first) without enabling serde_json's `preserve_order` for the whole
//! workspace, and so that floats print with the shortest digits that round-trip. Before each
//! member or element they call [`watch`], which lets the streaming engine bound the output of a
//! line as it grows (see [`set_output_watch`]).

use core::fmt::Write as _;
use std::borrow::Cow;
use std::cell::Cell;
use std::collections::HashSet;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// Why one input line could not be processed: a stable snake_case code and a one-line message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineError {
    /// Stable code: a `care_core::Error::code()` string or one of the CLI's own
    /// (`line_too_long`, `duplicate_key`, `internal_error`).
    pub code: &'static str,
    /// One human-readable line.
    pub message: String,
}

impl LineError {
    /// A line error with the given code and message.
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        LineError {
            code,
            message: message.into(),
        }
    }

    /// A `schema` error: the line is JSON, but not of the shape the subcommand reads.
    pub fn schema(message: impl Into<String>) -> Self {
        LineError::new(care_core::Error::Schema.code(), message)
    }

    /// A line error from a core error, with context prepended to the core's message.
    pub fn core(err: care_core::Error, context: &str) -> Self {
        if context.is_empty() {
            LineError::new(err.code(), err.message())
        } else {
            LineError::new(err.code(), format!("{context}: {}", err.message()))
        }
    }
}

impl From<care_core::Error> for LineError {
    fn from(err: care_core::Error) -> Self {
        LineError::core(err, "")
    }
}

/// Decodes one line as UTF-8 and checks that it does not start with a byte order mark.
pub fn line_text(bytes: &[u8]) -> Result<&str, LineError> {
    let text = core::str::from_utf8(bytes).map_err(|e| {
        LineError::new(
            care_core::Error::InvalidUtf8.code(),
            format!("invalid UTF-8 at byte {}", e.valid_up_to()),
        )
    })?;
    if text.starts_with('\u{feff}') {
        return Err(LineError::new(
            care_core::Error::NotJson.code(),
            "line starts with a byte order mark (U+FEFF); save the file as UTF-8 without BOM",
        ));
    }
    Ok(text)
}

/// Checks one JSON value strictly without building it: the syntax (serde_json's), no duplicate
/// key in any object at any depth, finite numbers, nesting at most 128 deep. Nothing is
/// allocated but the key sets of the objects being read, so a line's check costs about its
/// own size; [`crate::input::Line`] then reads the members it needs straight from the text.
pub fn check_strict(text: &str) -> Result<(), LineError> {
    check_strict_top(text).map(|_| ())
}

/// [`check_strict`] that also returns the top-level members whose values are strings,
/// decoded (borrowed from `text` when they hold no escapes): the check decodes them anyway,
/// and a second decoding pass over a rubric's text would be a visible share of `care validate`.
pub(crate) fn check_strict_top(text: &str) -> Result<TopStrings<'_>, LineError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let top = de
        .deserialize_any(TopVisitor)
        .map_err(|e| json_error_in(text, e))?;
    de.end().map_err(|e| json_error_in(text, e))?;
    Ok(top)
}

/// [`json_error`], with a hint when `text` looks like one line of a pretty-printed (multi-line)
/// JSON document: a value left open at the end of the line (`{`, `"criteria": [`), or a line
/// that starts inside one (`"title": "x",`, `},`). Each such line is an error of its own, so
/// without the hint a pretty-printed file gives a screen of `not_json` lines and no reason.
fn json_error_in(text: &str, err: serde_json::Error) -> LineError {
    let line = text.trim();
    let fragment = (err.is_eof() && line.ends_with(['{', '[', ',', ':']))
        || line.starts_with(['}', ']'])
        || (line.starts_with('"') && line.contains("\":"));
    let mut e = json_error(err);
    if fragment && e.code == care_core::Error::NotJson.code() {
        e.message.push_str(
            "; the input must be JSON Lines, one JSON object per line \
             (a pretty-printed file converts with `jq -c . FILE`)",
        );
    }
    e
}

/// The string-valued top-level members of a line, decoded, in line order.
pub(crate) type TopStrings<'a> = Vec<(Cow<'a, str>, Cow<'a, str>)>;

/// The root value: checked like any value; for an object, its string members are kept.
struct TopVisitor;

impl<'de> Visitor<'de> for TopVisitor {
    type Value = TopStrings<'de>;

    fn expecting(&self, f: &mut core::fmt::Formatter) -> core::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        StrictVisitor.visit_f64(v).map(|()| Vec::new())
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        StrictVisitor.visit_seq(seq).map(|()| Vec::new())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut keys = KeySet::default();
        let mut strings = Vec::new();
        while let Some(key) = map.next_key_seed(KeySeed)? {
            if !keys.insert(key.clone()) {
                return Err(de::Error::custom(format_args!("{DUPLICATE_KEY} {key:?}")));
            }
            if let Some(text) = map.next_value_seed(MemberSeed)? {
                strings.push((key, text));
            }
        }
        Ok(strings)
    }
}

/// A top-level member's value: checked; `Some` with the decoded text when it is a string.
struct MemberSeed;

impl<'de> DeserializeSeed<'de> for MemberSeed {
    type Value = Option<Cow<'de, str>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(MemberVisitor)
    }
}

struct MemberVisitor;

impl<'de> Visitor<'de> for MemberVisitor {
    type Value = Option<Cow<'de, str>>;

    fn expecting(&self, f: &mut core::fmt::Formatter) -> core::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        StrictVisitor.visit_f64(v).map(|()| None)
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Some(Cow::Borrowed(v)))
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Some(Cow::Owned(v.to_owned())))
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        StrictVisitor.visit_seq(seq).map(|()| None)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        StrictVisitor.visit_map(map).map(|()| None)
    }
}

/// Parses one JSON value strictly ([`check_strict`]) into a `serde_json::Value`: for `care
/// analyze`, which reads small records. The streaming subcommands read typed values straight
/// from the line's text instead ([`crate::input::Line`]), without the tree.
pub fn parse_strict(text: &str) -> Result<serde_json::Value, LineError> {
    check_strict(text)?;
    // A tree costs tens of bytes per value whatever the value's own size (`0,` is two bytes
    // of text, a 32-byte `Value` and its slot), so a line of `--max-line-bytes` could take
    // many times its size; a bound on the count keeps the tree small next to the line.
    let n = value_count_bound(text);
    if n > MAX_TREE_VALUES {
        return Err(LineError::new(
            care_core::Error::Capacity.code(),
            format!(
                "the line holds about {n} JSON values, more than the {MAX_TREE_VALUES} a \
                 record read as a tree may have (records of care's own output hold far fewer)"
            ),
        ));
    }
    serde_json::from_str(text).map_err(|e| json_error_in(text, e))
}

/// The most JSON values [`parse_strict`] builds a tree of: a few MiB of `Value`s.
pub const MAX_TREE_VALUES: usize = 1 << 16;

/// An upper bound on the number of values in the JSON text `text`: one, plus one per `,`,
/// `[` and `{` outside strings.
fn value_count_bound(text: &str) -> usize {
    let (mut n, mut in_string, mut escaped) = (1usize, false, false);
    for &b in text.as_bytes() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
        } else {
            match b {
                b'"' => in_string = true,
                b',' | b'[' | b'{' => n += 1,
                _ => {}
            }
        }
    }
    n
}

/// Maps a serde_json error to a line error (`duplicate_key` for our own check, else `not_json`).
fn json_error(err: serde_json::Error) -> LineError {
    let msg = err.to_string();
    if err.classify() == serde_json::error::Category::Data && msg.starts_with(DUPLICATE_KEY) {
        LineError::new("duplicate_key", msg)
    } else if err.is_eof() && err.line() == 1 && err.column() == 0 {
        LineError::new(care_core::Error::NotJson.code(), "empty line")
    } else {
        LineError::new(
            care_core::Error::NotJson.code(),
            format!("invalid JSON: {msg}"),
        )
    }
}

const DUPLICATE_KEY: &str = "duplicate key";

/// Reads any JSON value and keeps nothing, refusing duplicate object keys at every depth.
struct StrictSeed;

impl<'de> DeserializeSeed<'de> for StrictSeed {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(StrictVisitor)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = ();

    fn expecting(&self, f: &mut core::fmt::Formatter) -> core::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        // serde_json already refuses overflow (`1e999`); keep the check local anyway.
        if v.is_finite() {
            Ok(())
        } else {
            Err(E::custom("number is not finite"))
        }
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(StrictSeed)?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut keys = KeySet::default();
        while let Some(key) = map.next_key_seed(KeySeed)? {
            if !keys.insert(key.clone()) {
                return Err(de::Error::custom(format_args!("{DUPLICATE_KEY} {key:?}")));
            }
            map.next_value_seed(StrictSeed)?;
        }
        Ok(())
    }
}

/// The keys of one object: a short list for the usual handful, a hash set past that (an
/// object with a million keys must not cost a million squared comparisons).
#[derive(Default)]
struct KeySet<'de> {
    few: Vec<Cow<'de, str>>,
    many: HashSet<Cow<'de, str>>,
}

impl<'de> KeySet<'de> {
    const FEW: usize = 16;

    /// `false` when `key` was already there.
    fn insert(&mut self, key: Cow<'de, str>) -> bool {
        if self.many.is_empty() {
            if self.few.contains(&key) {
                return false;
            }
            if self.few.len() < Self::FEW {
                self.few.push(key);
                return true;
            }
            self.many.extend(self.few.drain(..));
        }
        self.many.insert(key)
    }
}

/// Deserializes an object key or a string without copying it when it has no escapes.
pub(crate) struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Cow<'de, str>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Cow<'de, str>, D::Error> {
        d.deserialize_str(KeyVisitor)
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = Cow<'de, str>;
    fn expecting(&self, f: &mut core::fmt::Formatter) -> core::fmt::Result {
        f.write_str("a string")
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Borrowed(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(v))
    }
}

thread_local! {
    /// Output length past which [`watch`] calls the hook (`usize::MAX`: never).
    static WATCH_AT: Cell<usize> = const { Cell::new(usize::MAX) };
    static WATCH_HOOK: Cell<Option<WatchHook>> = const { Cell::new(None) };
}

/// Called with the output buffer once it is longer than the last watch point; returns the next
/// watch point. It may wait (to keep the memory of all pending output bounded) and may truncate
/// the buffer (a line over its output limit).
pub type WatchHook = fn(&mut String) -> usize;

/// Installs (or with `None` removes) this thread's output hook, first called once the buffer
/// is longer than `at` bytes. The engine installs one on its worker threads; everywhere else
/// (tests, fuzzing, [`crate::process_line`]) writing is unwatched.
pub fn set_output_watch(hook: Option<WatchHook>, at: usize) {
    WATCH_HOOK.set(hook);
    WATCH_AT.set(if hook.is_some() { at } else { usize::MAX });
}

/// The output check of [`Obj`] and [`Arr`], before every member and element: one comparison
/// unless the buffer passed the watch point.
#[inline]
fn watch(buf: &mut String) {
    if buf.len() > WATCH_AT.get() {
        watch_slow(buf);
    }
}

#[cold]
fn watch_slow(buf: &mut String) {
    let next = WATCH_HOOK.get().map_or(usize::MAX, |hook| hook(buf));
    WATCH_AT.set(next);
}

/// Appends a JSON string literal (quoted, escaped) to `buf`.
pub fn push_str(buf: &mut String, s: &str) {
    buf.push('"');
    // Keys and most messages need no escape: one byte test each, then one copy. 0xE2 is the
    // first byte of U+2028 and U+2029 (escaped below); any other byte is copied as is.
    if !s
        .bytes()
        .any(|c| c < 0x20 || c == b'"' || c == b'\\' || c == 0xE2)
    {
        buf.push_str(s);
        buf.push('"');
        return;
    }
    let mut start = 0;
    for (i, c) in s.char_indices() {
        let esc: Option<&str> = match c {
            '"' => Some("\\\""),
            '\\' => Some("\\\\"),
            '\n' => Some("\\n"),
            '\r' => Some("\\r"),
            '\t' => Some("\\t"),
            c if (c as u32) < 0x20 || c == '\u{2028}' || c == '\u{2029}' => None,
            _ => continue,
        };
        buf.push_str(&s[start..i]);
        match esc {
            Some(e) => buf.push_str(e),
            None => {
                let _ = write!(buf, "\\u{:04x}", c as u32);
            }
        }
        start = i + c.len_utf8();
    }
    buf.push_str(&s[start..]);
    buf.push('"');
}

/// Appends an `f64` with the shortest digits that round-trip; non-finite values become `null`
/// (JSON has no NaN or infinity).
pub fn push_f64(buf: &mut String, v: f64) {
    if !v.is_finite() {
        buf.push_str("null");
    } else if push_short_decimal(buf, v) {
        // Weights and rewards are mostly short decimals (0.4, 0.25, 3.5).
    } else if v == 0.0 || (1e-6..1e17).contains(&v.abs()) {
        // Rust's float Display prints the shortest round-tripping digits, never an exponent.
        let _ = write!(buf, "{v}");
    } else {
        // Outside that range Display would print hundreds of zeros; LowerExp is also shortest.
        let _ = write!(buf, "{v:e}");
    }
}

/// Powers of ten up to the most decimals [`push_short_decimal`] tries.
const POW10: [f64; 7] = [1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6];

/// Appends `v` as Rust's `Display` does when `v` is exactly the double nearest to a decimal of
/// at most six fractional digits (`n / 10^k`, `k` the fewest such digits) with `|v|` in
/// `1e-6..1e9`; `false` (nothing written) otherwise.
///
/// Why this is the same text: `Display` prints the shortest digits that round-trip. `n / 10^k`
/// round-trips (its nearest double is `v`, checked with one correctly rounded division of two
/// integers below 2^53), and any other decimal with as few digits lies on the same `10^-k`
/// grid, so at least `10^-k` away from it, far more than the rounding interval of `v` (`v *
/// 10^k < 1e15 < 2^53`, so an ulp of `v` is below `10^-k / 4`): the digits are unique.
fn push_short_decimal(buf: &mut String, v: f64) -> bool {
    let a = v.abs();
    if !(1e-6..1e9).contains(&a) {
        return false;
    }
    for (k, &p) in POW10.iter().enumerate() {
        let scaled = (a * p).round();
        // `scaled` < 1e15: exact as an integer, and so is the cast.
        if scaled / p != a {
            continue;
        }
        let mut ib = itoa::Buffer::new();
        let d = ib.format(scaled as u64);
        let len = d.len();
        if v < 0.0 {
            buf.push('-');
        }
        if k == 0 {
            buf.push_str(d);
        } else if len > k {
            // ASCII digits: every index is a char boundary.
            buf.push_str(d.get(..len - k).unwrap_or_default());
            buf.push('.');
            buf.push_str(d.get(len - k..).unwrap_or_default());
        } else {
            buf.push_str("0.");
            for _ in len..k {
                buf.push('0');
            }
            buf.push_str(d);
        }
        return true;
    }
    false
}

/// Appends `v` in decimal (the text of `Display`, without the formatting machinery: every
/// output line has a line number).
pub fn push_u64(buf: &mut String, v: u64) {
    buf.push_str(itoa::Buffer::new().format(v));
}

/// Appends an `f32` with the shortest digits that round-trip *as an f32* (so `0.1f32` prints
/// `0.1`, not `0.10000000149011612`); non-finite values become `null`.
pub fn push_f32(buf: &mut String, v: f32) {
    if !v.is_finite() {
        buf.push_str("null");
    } else if v == 0.0 || (1e-6..1e17).contains(&v.abs()) {
        let _ = write!(buf, "{v}");
    } else {
        let _ = write!(buf, "{v:e}");
    }
}

/// Writes a JSON object's members in call order. Created by [`Obj::write`].
#[derive(Debug)]
pub struct Obj<'a> {
    buf: &'a mut String,
    first: bool,
}

impl<'a> Obj<'a> {
    /// Writes `{`, lets `f` add members, writes `}`.
    pub fn write(buf: &'a mut String, f: impl FnOnce(&mut Obj<'_>)) {
        buf.push('{');
        let mut o = Obj { buf, first: true };
        f(&mut o);
        o.buf.push('}');
    }

    /// Like [`Obj::write`] for a fallible `f`; on error the closing `}` is not written and the
    /// caller is expected to discard the partial output.
    pub fn try_write<E>(
        buf: &'a mut String,
        f: impl FnOnce(&mut Obj<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        buf.push('{');
        let mut o = Obj { buf, first: true };
        f(&mut o)?;
        o.buf.push('}');
        Ok(())
    }

    fn key(&mut self, k: &str) -> &mut String {
        watch(self.buf);
        if !self.first {
            self.buf.push(',');
        }
        self.first = false;
        push_str(self.buf, k);
        self.buf.push(':');
        self.buf
    }

    /// A float member.
    pub fn f64(&mut self, k: &str, v: f64) -> &mut Self {
        push_f64(self.key(k), v);
        self
    }
    /// An `f32` member (printed with f32 round-trip digits).
    pub fn f32(&mut self, k: &str, v: f32) -> &mut Self {
        push_f32(self.key(k), v);
        self
    }
    /// An unsigned integer member.
    pub fn u64(&mut self, k: &str, v: u64) -> &mut Self {
        push_u64(self.key(k), v);
        self
    }
    /// A boolean member.
    pub fn bool(&mut self, k: &str, v: bool) -> &mut Self {
        self.key(k).push_str(if v { "true" } else { "false" });
        self
    }
    /// A string member.
    pub fn str(&mut self, k: &str, v: &str) -> &mut Self {
        push_str(self.key(k), v);
        self
    }
    /// A member whose value is already-serialized JSON text.
    pub fn raw(&mut self, k: &str, json: &str) -> &mut Self {
        self.key(k).push_str(json);
        self
    }
    /// A `null` member.
    pub fn null(&mut self, k: &str) -> &mut Self {
        self.key(k).push_str("null");
        self
    }
    /// An optional unsigned integer member (`null` when absent).
    pub fn opt_u64(&mut self, k: &str, v: Option<u64>) -> &mut Self {
        match v {
            Some(v) => self.u64(k, v),
            None => self.null(k),
        }
    }
    /// A nested object member.
    pub fn obj(&mut self, k: &str, f: impl FnOnce(&mut Obj<'_>)) -> &mut Self {
        Obj::write(self.key(k), f);
        self
    }
    /// A nested array member.
    pub fn arr(&mut self, k: &str, f: impl FnOnce(&mut Arr<'_>)) -> &mut Self {
        Arr::write(self.key(k), f);
        self
    }
    /// An array of `f32` member.
    pub fn f32s(&mut self, k: &str, v: &[f32]) -> &mut Self {
        self.arr(k, |a| {
            for &x in v {
                a.f32(x);
            }
        })
    }
    /// An array of `f64` member.
    pub fn f64s(&mut self, k: &str, v: &[f64]) -> &mut Self {
        self.arr(k, |a| {
            for &x in v {
                a.f64(x);
            }
        })
    }
}

/// Writes a JSON array's elements in call order. Created by [`Arr::write`].
#[derive(Debug)]
pub struct Arr<'a> {
    buf: &'a mut String,
    first: bool,
}

impl<'a> Arr<'a> {
    /// Writes `[`, lets `f` add elements, writes `]`.
    pub fn write(buf: &'a mut String, f: impl FnOnce(&mut Arr<'_>)) {
        buf.push('[');
        let mut a = Arr { buf, first: true };
        f(&mut a);
        a.buf.push(']');
    }

    fn sep(&mut self) -> &mut String {
        watch(self.buf);
        if !self.first {
            self.buf.push(',');
        }
        self.first = false;
        self.buf
    }

    /// A float element.
    pub fn f64(&mut self, v: f64) -> &mut Self {
        push_f64(self.sep(), v);
        self
    }
    /// An `f32` element.
    pub fn f32(&mut self, v: f32) -> &mut Self {
        push_f32(self.sep(), v);
        self
    }
    /// An unsigned integer element.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        push_u64(self.sep(), v);
        self
    }
    /// A string element.
    pub fn str(&mut self, v: &str) -> &mut Self {
        push_str(self.sep(), v);
        self
    }
    /// A `null` element.
    pub fn null(&mut self) -> &mut Self {
        self.sep().push_str("null");
        self
    }
    /// A boolean element.
    pub fn bool(&mut self, v: bool) -> &mut Self {
        self.sep().push_str(if v { "true" } else { "false" });
        self
    }
    /// A nested array element.
    pub fn arr(&mut self, f: impl FnOnce(&mut Arr<'_>)) -> &mut Self {
        Arr::write(self.sep(), f);
        self
    }
    /// A nested array of `f64` element.
    pub fn f64s(&mut self, v: &[f64]) -> &mut Self {
        Arr::write(self.sep(), |a| {
            for &x in v {
                a.f64(x);
            }
        });
        self
    }
    /// A nested object element.
    pub fn obj(&mut self, f: impl FnOnce(&mut Obj<'_>)) -> &mut Self {
        Obj::write(self.sep(), f);
        self
    }
}

/// Appends the error line `{"line":n,"error":{"code":..,"message":..}}` (no newline).
pub fn push_error_line(buf: &mut String, line: u64, err: &LineError) {
    Obj::write(buf, |o| {
        o.u64("line", line).obj("error", |e| {
            e.str("code", err.code).str("message", &err.message);
        });
    });
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    /// The text of `push_f64` for finite values in the `Display` range: what it was before the
    /// short-decimal path (`format!("{v}")`).
    fn display_f64(v: f64) -> String {
        let mut s = String::new();
        push_f64(&mut s, v);
        s
    }

    /// The short-decimal path writes exactly `Display`'s text: every decimal of up to six
    /// fractional digits on a grid through 0..1e9 (both signs), the doubles next to them
    /// (which must fall through), and pseudo-random doubles over many magnitudes.
    #[test]
    fn short_decimals_print_as_display_does() {
        let check = |v: f64| {
            if v == 0.0 || (1e-6..1e17).contains(&v.abs()) {
                assert_eq!(display_f64(v), format!("{v}"), "{v:e}");
            }
        };
        for k in 0..=7u32 {
            let p = 10f64.powi(k as i32);
            for n in (0..200_000u64).chain((0..2000).map(|i| i * 7_919_113 + 12_345)) {
                let v = n as f64 / p;
                for x in [
                    v,
                    -v,
                    f64::from_bits(v.to_bits() + 1),
                    f64::from_bits(v.to_bits().saturating_sub(1)),
                ] {
                    check(x);
                }
            }
        }
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = f64::from_bits(x);
            if v.is_finite() {
                check(v);
            }
            // Numbers that look like short decimals after scaling (x * 1e-3 is rarely exact).
            check((x % 1_000_000_007) as f64 * 1e-3);
        }
    }

    #[test]
    fn integers_print_as_display_does() {
        for v in [
            0,
            1,
            9,
            10,
            99,
            100,
            12345,
            u64::from(u32::MAX),
            u64::MAX - 1,
            u64::MAX,
        ] {
            let mut s = String::new();
            push_u64(&mut s, v);
            assert_eq!(s, v.to_string());
        }
    }

    /// The copy-at-once path of `push_str` gives what the escaping loop gives: strings with
    /// and without each character that needs an escape, and the other bytes of U+2028's
    /// neighbours (0xE2 starts both U+2028 and characters that are copied as they are).
    #[test]
    fn strings_print_escaped_with_and_without_the_fast_path() {
        for s in [
            "",
            "format_reward",
            "plain text with \u{e9} and \u{8a9e}",
            "quote \" inside",
            "back\\slash",
            "nl\n cr\r tab\t",
            "ctl \u{1} \u{1f}",
            "ls \u{2028} ps \u{2029}",
            "\u{2022} bullet and \u{20ac} euro",
        ] {
            let mut got = String::new();
            push_str(&mut got, s);
            let back: String = serde_json::from_str(&got).unwrap();
            assert_eq!(back, s, "{got}");
            assert!(
                !got.contains('\u{2028}') && !got.contains('\u{2029}'),
                "{got}"
            );
            let plain = !s
                .chars()
                .any(|c| (c as u32) < 0x20 || matches!(c, '"' | '\\' | '\u{2028}' | '\u{2029}'));
            assert_eq!(got == format!("\"{s}\""), plain, "{got}");
        }
    }

    #[test]
    fn the_value_count_bound_is_at_least_the_count_and_ignores_strings() {
        // (text, values in it)
        let cases = [
            ("0", 1),
            ("[]", 1),
            ("[1,2,3]", 4),
            ("{\"a\":[1,{\"b\":2}],\"c\":\"x,[{\"}", 6),
            ("[\"a\\\",[\", 1]", 3),
        ];
        for (text, values) in cases {
            let n = value_count_bound(text);
            assert!(n >= values, "{text}: {n} < {values}");
            assert!(n <= values + 1, "{text}: {n} counts string contents");
        }
    }

    #[test]
    fn a_tree_of_too_many_values_is_a_capacity_error_before_it_is_built() {
        let ok = format!("[{}0]", "0,".repeat(MAX_TREE_VALUES - 2));
        assert!(parse_strict(&ok).is_ok());
        let big = format!("[{}0]", "0,".repeat(MAX_TREE_VALUES));
        let e = parse_strict(&big).unwrap_err();
        assert_eq!(e.code, "capacity");
        assert!(e.message.contains("JSON values"), "{}", e.message);
    }

    #[test]
    fn floats_round_trip_with_shortest_digits() {
        let cases = [
            0.1,
            0.925,
            1.0 / 3.0,
            1e300,
            -1e-300,
            5e-324,
            -0.0,
            123456.789,
        ];
        for v in cases {
            let mut s = String::new();
            push_f64(&mut s, v);
            let back: f64 = s.parse().unwrap();
            assert_eq!(back.to_bits(), v.to_bits(), "{s}");
            assert!(serde_json::from_str::<f64>(&s).is_ok(), "{s} is JSON");
        }
        let mut s = String::new();
        push_f64(&mut s, 1e300);
        assert_eq!(s, "1e300");
        s.clear();
        push_f32(&mut s, 0.1);
        assert_eq!(s, "0.1");
        s.clear();
        push_f64(&mut s, f64::NAN);
        assert_eq!(s, "null");
    }

    proptest::proptest! {
        /// Relation: for every finite f64, parsing what push_f64 prints gives the same bits,
        /// and the text is valid JSON.
        #[test]
        fn push_f64_round_trips(bits in proptest::num::u64::ANY) {
            let v = f64::from_bits(bits);
            let mut s = String::new();
            push_f64(&mut s, v);
            if v.is_finite() {
                proptest::prop_assert_eq!(s.parse::<f64>().unwrap().to_bits(), bits);
                proptest::prop_assert!(serde_json::from_str::<serde_json::Value>(&s).is_ok(), "{}", s);
            } else {
                proptest::prop_assert_eq!(s, "null");
            }
        }

        /// Relation: for every finite f32, parsing what push_f32 prints as f32 gives the same
        /// bits.
        #[test]
        fn push_f32_round_trips(bits in proptest::num::u32::ANY) {
            let v = f32::from_bits(bits);
            let mut s = String::new();
            push_f32(&mut s, v);
            if v.is_finite() {
                proptest::prop_assert_eq!(s.parse::<f32>().unwrap().to_bits(), bits);
            } else {
                proptest::prop_assert_eq!(s, "null");
            }
        }

        /// Relation: push_str output parses back (as JSON) to the input string.
        #[test]
        fn push_str_round_trips(text in "\\PC*|[\\x00-\\x1f\"\\\\\u{2028}\u{2029}]*") {
            let mut s = String::new();
            push_str(&mut s, &text);
            proptest::prop_assert!(!s.contains('\n'));
            proptest::prop_assert_eq!(serde_json::from_str::<String>(&s).unwrap(), text);
        }
    }

    #[test]
    fn f32_round_trips_as_f32() {
        for v in [0.1f32, 1.0e-7, 3.4e38, -0.0, 0.70710677] {
            let mut s = String::new();
            push_f32(&mut s, v);
            assert_eq!(s.parse::<f32>().unwrap().to_bits(), v.to_bits(), "{s}");
        }
    }

    #[test]
    fn strings_escape_to_valid_json() {
        let raw = "a\"b\\c\n\u{0}\u{1f}\u{2028}é";
        let mut s = String::new();
        push_str(&mut s, raw);
        assert_eq!(serde_json::from_str::<String>(&s).unwrap(), raw);
    }

    #[test]
    fn strict_parse_rejects_duplicates_at_any_depth() {
        let e = check_strict(r#"{"a":{"b":1,"b":2}}"#).unwrap_err();
        assert_eq!(e.code, "duplicate_key");
        assert!(check_strict(r#"{"a":{"b":1,"c":2}}"#).is_ok());
        // Escaped and plain spellings of one key are the same key.
        let e = check_strict(r#"{"ab":1,"a\u0062":2}"#).unwrap_err();
        assert_eq!(e.code, "duplicate_key");
        // Past the short list, the hash set still finds duplicates.
        let many: Vec<String> = (0..40).map(|k| format!("\"k{k}\":{k}")).collect();
        let ok = format!("{{{}}}", many.join(","));
        assert!(check_strict(&ok).is_ok());
        let dup = format!("{{{},\"k3\":0}}", many.join(","));
        assert_eq!(check_strict(&dup).unwrap_err().code, "duplicate_key");
    }

    #[test]
    fn hostile_inputs_are_errors_not_panics() {
        let deep = "[".repeat(100_000) + &"]".repeat(100_000);
        assert_eq!(check_strict(&deep).unwrap_err().code, "not_json");
        assert_eq!(check_strict("1e999").unwrap_err().code, "not_json");
        assert_eq!(check_strict(r#""\ud800""#).unwrap_err().code, "not_json");
        assert_eq!(check_strict("\"a\u{0}b\"").unwrap_err().code, "not_json");
        assert_eq!(check_strict("{} x").unwrap_err().code, "not_json");
        assert_eq!(line_text(b"\xef\xbb\xbf{}").unwrap_err().code, "not_json");
        assert_eq!(
            line_text(b"{\"a\":\"\xff\"}").unwrap_err().code,
            "invalid_utf8"
        );
        // -0 is a number; callers decide what it means.
        assert!(check_strict("-0").is_ok());
    }

    #[test]
    fn objects_keep_member_order() {
        let mut s = String::new();
        Obj::write(&mut s, |o| {
            o.u64("line", 3).f64("z", 0.5).arr("a", |a| {
                a.u64(1).str("x");
            });
        });
        assert_eq!(s, r#"{"line":3,"z":0.5,"a":[1,"x"]}"#);
    }
}
