//! Strict JSON input and ordered JSON output, one line at a time.
//!
//! Input is parsed with `serde_json` into a [`Value`], but through a visitor that rejects
//! duplicate object keys (serde_json silently keeps the last one, which would let `{"rewards":
//! [..], "rewards": [..]}` mean two different things to two tools). Nesting is bounded by
//! serde_json's recursion limit (128), so a hostile line cannot overflow the stack.
//!
//! Output is written by hand with [`Obj`] and [`Arr`] so that keys keep the order the CLI
//! documents (`"line"` first) without enabling serde_json's `preserve_order` for the whole
//! workspace, and so that floats print with the shortest digits that round-trip.

use core::fmt::Write as _;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

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

/// Parses one JSON value strictly: duplicate keys are an error, numbers must be finite.
pub fn parse_strict(text: &str) -> Result<Value, LineError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let value = StrictSeed.deserialize(&mut de).map_err(json_error)?;
    de.end().map_err(json_error)?;
    Ok(value)
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

/// Deserializes any JSON value, refusing duplicate object keys at every depth.
struct StrictSeed;

impl<'de> DeserializeSeed<'de> for StrictSeed {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(StrictVisitor)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut core::fmt::Formatter) -> core::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        // serde_json already refuses overflow (`1e999`); keep the check local anyway.
        Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("number is not finite"))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(StrictSeed)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                return Err(de::Error::custom(format_args!("{DUPLICATE_KEY} {key:?}")));
            }
            let v = map.next_value_seed(StrictSeed)?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

/// Appends a JSON string literal (quoted, escaped) to `buf`.
pub fn push_str(buf: &mut String, s: &str) {
    buf.push('"');
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
    } else if v == 0.0 || (1e-6..1e17).contains(&v.abs()) {
        // Rust's float Display prints the shortest round-tripping digits, never an exponent.
        let _ = write!(buf, "{v}");
    } else {
        // Outside that range Display would print hundreds of zeros; LowerExp is also shortest.
        let _ = write!(buf, "{v:e}");
    }
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
        let _ = write!(self.key(k), "{v}");
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
        let _ = write!(self.sep(), "{v}");
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
        let e = parse_strict(r#"{"a":{"b":1,"b":2}}"#).unwrap_err();
        assert_eq!(e.code, "duplicate_key");
        assert!(parse_strict(r#"{"a":{"b":1,"c":2}}"#).is_ok());
    }

    #[test]
    fn hostile_inputs_are_errors_not_panics() {
        let deep = "[".repeat(100_000) + &"]".repeat(100_000);
        assert_eq!(parse_strict(&deep).unwrap_err().code, "not_json");
        assert_eq!(parse_strict("1e999").unwrap_err().code, "not_json");
        assert_eq!(parse_strict(r#""\ud800""#).unwrap_err().code, "not_json");
        assert_eq!(parse_strict("\"a\u{0}b\"").unwrap_err().code, "not_json");
        assert_eq!(parse_strict("{} x").unwrap_err().code, "not_json");
        assert_eq!(line_text(b"\xef\xbb\xbf{}").unwrap_err().code, "not_json");
        assert_eq!(
            line_text(b"{\"a\":\"\xff\"}").unwrap_err().code,
            "invalid_utf8"
        );
        // -0 is a number; callers decide what it means.
        assert!(parse_strict("-0").is_ok());
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
