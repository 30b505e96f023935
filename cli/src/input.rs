//! Typed access to one input line, with `schema` errors that name the offending key.
//!
//! A line is checked once ([`crate::json::check_strict`]), then only its top-level members are
//! split out, as borrowed raw JSON text ([`RawValue`]). Each subcommand reads the members it
//! needs straight into typed vectors (`Vec<f32>` for a log-prob array, not a tree of
//! `serde_json::Value`s): the memory a line needs stays a small multiple of its length
//! (a `Value` per number costs 16 to 48 times the number's text), and a member is echoed or
//! validated as the exact text it has in the line (the `"id"`, a rubric object).

use std::borrow::Cow;
use std::cell::{Cell, OnceCell};

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use care_core::SyntaxIndex;

use crate::json::{KeySeed, LineError, TopStrings, check_strict_top};

/// The members of a JSON object, as raw text borrowed from the line, in line order (keys are
/// unique: the strict check refused duplicates).
#[derive(Debug, Default)]
pub struct Members<'a> {
    list: Vec<Member<'a>>,
}

/// One member: its key, the exact text of its value, and that text as a [`RawValue`], made on
/// first use for members split out by the one-pass scanner ([`crate::scan`]): a subcommand
/// that only needs a member's text (the rubric of `care score`) never has serde_json read it.
#[derive(Debug)]
struct Member<'a> {
    key: Cow<'a, str>,
    text: &'a str,
    raw: OnceCell<Option<&'a RawValue>>,
}

impl<'a> Member<'a> {
    fn raw(&self) -> Option<&'a RawValue> {
        // The text was checked strictly, so this never fails; `None` would read as absent.
        *self
            .raw
            .get_or_init(|| serde_json::from_str(self.text).ok())
    }
}

impl<'a> Members<'a> {
    /// The members of `raw` when it is an object, `None` for any other value.
    pub fn of(raw: &'a RawValue) -> Option<Self> {
        Self::parse(raw.get())
    }

    /// The members of the checked JSON text `text` when it is an object.
    fn parse(text: &'a str) -> Option<Self> {
        if !text.trim_start().starts_with('{') {
            return None;
        }
        let mut de = serde_json::Deserializer::from_str(text);
        de.deserialize_map(MembersVisitor).ok()
    }

    /// The member `key`.
    pub fn get(&self, key: &str) -> Option<&'a RawValue> {
        self.find(key).and_then(Member::raw)
    }

    /// The exact text of member `key`'s value.
    pub fn text(&self, key: &str) -> Option<&'a str> {
        self.find(key).map(|m| m.text)
    }

    fn find(&self, key: &str) -> Option<&Member<'a>> {
        self.list.iter().find(|m| m.key == key)
    }

    /// The members in line order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &'a RawValue)> + '_ {
        self.list
            .iter()
            .filter_map(|m| m.raw().map(|r| (m.key.as_ref(), r)))
    }

    /// The members' keys in input order (reads no value, unlike [`Members::iter`]).
    pub fn keys(&self) -> impl Iterator<Item = &str> + '_ {
        self.list.iter().map(|m| m.key.as_ref())
    }

    /// Whether the member `key` is present (even as `null`).
    pub fn contains_key(&self, key: &str) -> bool {
        self.find(key).is_some()
    }
}

struct MembersVisitor;

impl<'de> Visitor<'de> for MembersVisitor {
    type Value = Members<'de>;
    fn expecting(&self, f: &mut core::fmt::Formatter) -> core::fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members<'de>, A::Error> {
        let mut list = Vec::new();
        while let Some(key) = map.next_key_seed(KeySeed)? {
            let raw = map.next_value::<&'de RawValue>()?;
            list.push(Member {
                key,
                text: raw.get(),
                raw: OnceCell::from(Some(raw)),
            });
        }
        Ok(Members { list })
    }
}

/// One input line: its text, checked strictly, and its top-level members when it is an object.
#[derive(Debug)]
pub struct Line<'a> {
    text: &'a str,
    members: Option<Members<'a>>,
    /// The string-valued members, decoded once by the check.
    strings: TopStrings<'a>,
    /// What the one-pass check learned about the member `"rubric"` when it is an object (see
    /// [`Line::rubric_index`]).
    rubric_index: Option<Box<SyntaxIndex>>,
}

impl<'a> Line<'a> {
    /// Checks `text` (see [`check_strict`]) and splits out its top-level members.
    ///
    /// The check is [`crate::scan::scan_line`] (one pass, no allocation) when it accepts the
    /// line, and the reference check (`check_strict`, which writes the exact error) otherwise.
    pub fn parse(text: &'a str) -> Result<Self, LineError> {
        if crate::scan::fast_path_on()
            && let Some((members, strings, rubric_index)) = fast_parse(text)
        {
            return Ok(Line {
                text,
                members,
                strings,
                rubric_index,
            });
        }
        let strings = check_strict_top(text)?;
        Ok(Line {
            text,
            members: Members::parse(text),
            strings,
            rubric_index: None,
        })
    }

    /// The index of the member `"rubric"` (offsets into its exact text, [`Line::raw_text`]) that
    /// the one-pass check made while reading it, when that member is an object, for
    /// `care_core::validate_indexed_into`: the rubric's bytes are then read once. `None` on the
    /// reference path and for any other line.
    pub fn rubric_index(&self) -> Option<&SyntaxIndex> {
        self.rubric_index.as_deref()
    }

    /// The line's text.
    pub fn text(&self) -> &'a str {
        self.text
    }

    /// The member `key` of the line's object (`None` when absent or the line is no object).
    pub fn get(&self, key: &str) -> Option<&'a RawValue> {
        self.members.as_ref().and_then(|m| m.get(key))
    }

    /// The line's top-level members (`None` when the line is no object).
    pub fn members(&self) -> Option<&Members<'a>> {
        self.members.as_ref()
    }

    /// The exact text of member `key`'s value (without reading it as a [`RawValue`]).
    pub fn raw_text(&self, key: &str) -> Option<&'a str> {
        self.members.as_ref().and_then(|m| m.text(key))
    }

    /// The decoded text of member `key` when it is a JSON string (see [`string`]).
    pub fn string(&self, key: &str) -> Option<&str> {
        self.strings
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_ref())
    }
}

thread_local! {
    static SCAN: std::cell::RefCell<(crate::scan::Scratch, SyntaxIndex)> = Default::default();
}

/// What the one-pass check gives a [`Line`]: its members, its decoded top-level strings, and
/// the index of its `"rubric"` object.
type FastParts<'a> = (
    Option<Members<'a>>,
    TopStrings<'a>,
    Option<Box<SyntaxIndex>>,
);

/// The top-level members of `text` (`None` when it is no object), its string-valued ones
/// decoded (borrowed when they have no escapes) and the index of a `"rubric"` object member,
/// when [`crate::scan::scan_line_indexed`] accepts it; `None` when it declines.
fn fast_parse(text: &str) -> Option<FastParts<'_>> {
    SCAN.with(|cell| {
        let mut guard = cell.try_borrow_mut().ok()?;
        let (scratch, index) = &mut *guard;
        let target = crate::scan::IndexTarget::Member("rubric");
        if !crate::scan::scan_line_indexed(text, scratch, None, target, index) {
            return None;
        }
        let rubric_index = scratch
            .member(text, "rubric")
            .is_some_and(|v| v.starts_with('{'))
            .then(|| Box::new(index.clone()));
        let mut buf = String::new();
        let mut strings = Vec::new();
        let mut list = Vec::new();
        for m in scratch.members(text) {
            if m.value.starts_with('"') {
                let v = if m.value.contains('\\') {
                    Cow::Owned(crate::scan::decode_string(m.value, &mut buf).to_owned())
                } else {
                    // An accepted string literal: its quotes enclose the text.
                    Cow::Borrowed(m.value.get(1..m.value.len() - 1).unwrap_or(""))
                };
                strings.push((Cow::Borrowed(m.key), v));
            }
            // Accepted keys have no escapes: the raw key is the key.
            list.push(Member {
                key: Cow::Borrowed(m.key),
                text: m.value,
                raw: OnceCell::new(),
            });
        }
        let members = text
            .trim_start()
            .starts_with('{')
            .then_some(Members { list });
        Some((members, strings, rubric_index))
    })
}

/// The members of an input line that must be a JSON object.
pub fn object<'l, 'a>(line: &'l Line<'a>) -> Result<&'l Members<'a>, LineError> {
    line.members
        .as_ref()
        .ok_or_else(|| LineError::schema("the line must be a JSON object"))
}

/// Members that every input object may carry besides those its subcommand reads: `"id"`
/// (echoed byte for byte at the top level) and `"meta"` (the caller's own data: echoed byte for
/// byte at the top level, never read). Nested objects (the `responses` of a group) may carry
/// them too; there they are ignored.
pub const PASSTHROUGH: [&str; 2] = ["id", "meta"];

/// Refuses a member that is neither in `known` nor in [`PASSTHROUGH`]: a misspelled optional
/// member (`"maks"` for `"mask"`) would otherwise be ignored and silently change the result.
/// The `schema` error names the member, the closest known one, and where user data goes.
/// `at` is the object's place for nested objects (`"responses"[2] `), empty at the top level.
pub fn check_members(m: &Members<'_>, known: &[&str], at: &str) -> Result<(), LineError> {
    let Some(key) = m
        .keys()
        .find(|k| !known.contains(k) && !PASSTHROUGH.contains(k))
    else {
        return Ok(());
    };
    let closest = known
        .iter()
        .chain(&PASSTHROUGH)
        .min_by_key(|c| edit_distance(key, c))
        .map_or(String::new(), |c| format!("did you mean \"{c}\"? "));
    let list = known
        .iter()
        .map(|k| format!("\"{k}\""))
        .collect::<Vec<_>>()
        .join(", ");
    Err(LineError::schema(format!(
        "{at}unknown member {key:?} ({closest}known members: {list}; put your own data under \"meta\")"
    )))
}

/// The Levenshtein distance between `a` and `b` in characters (one row of the table: the
/// names compared are short).
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let next = (diag + usize::from(ca != cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diag = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// `"n values"` (`"1 value"`), for messages about array sizes.
pub fn values(n: usize) -> String {
    if n == 1 {
        "1 value".to_owned()
    } else {
        format!("{n} values")
    }
}

/// A `length_mismatch` error unless the array `name` (`len` entries) has as many entries as
/// `base` (`base_len`): `"logp_old" has 1 value but "logp" has 2 values`.
pub fn same_length(name: &str, len: usize, base: &str, base_len: usize) -> Result<(), LineError> {
    if len == base_len {
        return Ok(());
    }
    Err(LineError::new(
        care_core::Error::LengthMismatch.code(),
        format!(
            "\"{name}\" has {} but \"{base}\" has {}; they must have one entry each",
            values(len),
            values(base_len)
        ),
    ))
}

/// An `invalid_layout` error that says what is wrong with the layout `layout` of `n` values
/// named `values` (`offsets` names the offsets array or the group size); `Ok` with the number
/// of groups when the layout is valid.
pub fn check_layout(
    layout: care_core::grpo::GroupLayout<'_>,
    n: usize,
    offsets: &str,
    values: &str,
) -> Result<usize, LineError> {
    match layout.fault(n) {
        None => layout.validate(n).map_err(LineError::from),
        Some(f) => Err(LineError::new(
            care_core::Error::InvalidLayout.code(),
            f.named(&format!("\"{offsets}\""), &format!("\"{values}\""))
                .to_string(),
        )),
    }
}

/// A required member.
pub fn required<'a>(m: &Members<'a>, key: &str) -> Result<&'a RawValue, LineError> {
    m.get(key)
        .ok_or_else(|| LineError::schema(format!("missing key \"{key}\"")))
}

/// An optional member; an explicit `null` counts as absent.
pub fn optional<'a>(m: &Members<'a>, key: &str) -> Option<&'a RawValue> {
    m.get(key).filter(|v| v.get() != "null")
}

/// The decoded text of a JSON string value (borrowed when it has no escapes); `None` for any
/// other value.
pub fn string(v: &RawValue) -> Option<Cow<'_, str>> {
    if !v.get().starts_with('"') {
        return None;
    }
    let mut de = serde_json::Deserializer::from_str(v.get());
    KeySeed.deserialize(&mut de).ok()
}

/// One element of an array of scalars, as far as the typed readers care.
#[derive(Clone, Copy)]
enum Scalar {
    Null,
    Bool(bool),
    U64(u64),
    I64(i64),
    F64(f64),
    /// A string, array or object.
    Other,
}

impl Scalar {
    /// The number as `f64`, exactly as `serde_json::Value::as_f64` gives it.
    fn as_f64(self) -> Option<f64> {
        match self {
            Scalar::U64(u) => Some(u as f64),
            Scalar::I64(i) => Some(i as f64),
            Scalar::F64(f) => Some(f),
            _ => None,
        }
    }
}

struct ScalarSeed;

impl<'de> DeserializeSeed<'de> for ScalarSeed {
    type Value = Scalar;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Scalar, D::Error> {
        d.deserialize_any(ScalarVisitor)
    }
}

struct ScalarVisitor;

impl<'de> Visitor<'de> for ScalarVisitor {
    type Value = Scalar;
    fn expecting(&self, f: &mut core::fmt::Formatter) -> core::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E>(self) -> Result<Scalar, E> {
        Ok(Scalar::Null)
    }
    fn visit_bool<E>(self, v: bool) -> Result<Scalar, E> {
        Ok(Scalar::Bool(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Scalar, E> {
        Ok(Scalar::U64(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Scalar, E> {
        Ok(Scalar::I64(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Scalar, E> {
        Ok(Scalar::F64(v))
    }
    fn visit_str<E>(self, _: &str) -> Result<Scalar, E> {
        Ok(Scalar::Other)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Scalar, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Scalar::Other)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Scalar, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Scalar::Other)
    }
}

/// Reads the array `v` element by element with `f`; stops at the first element `f` refuses.
/// `Err(None)`: `v` is not an array; `Err(Some(i))`: element `i` was refused.
fn elements<'a, T>(
    v: &'a RawValue,
    f: impl FnMut(&'a RawValue) -> Option<T>,
) -> Result<Vec<T>, Option<usize>> {
    if !v.get().starts_with('[') {
        return Err(None);
    }
    let bad = Cell::new(None);
    let mut de = serde_json::Deserializer::from_str(v.get());
    de.deserialize_seq(ElementsVisitor { f, bad: &bad })
        .map_err(|_| bad.get())
}

struct ElementsVisitor<'b, F> {
    f: F,
    bad: &'b Cell<Option<usize>>,
}

impl<'de, 'b, T, F: FnMut(&'de RawValue) -> Option<T>> Visitor<'de> for ElementsVisitor<'b, F> {
    type Value = Vec<T>;
    fn expecting(&self, f: &mut core::fmt::Formatter) -> core::fmt::Result {
        f.write_str("an array")
    }
    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<Vec<T>, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(raw) = seq.next_element::<&'de RawValue>()? {
            match (self.f)(raw) {
                Some(x) => out.push(x),
                None => {
                    self.bad.set(Some(out.len()));
                    return Err(de::Error::custom("refused element"));
                }
            }
        }
        Ok(out)
    }
}

/// Reads the array `v` of scalars, element by element, without a `RawValue` per element.
/// `Err(None)`: `v` is not an array; `Err(Some(i))`: element `i` was refused.
fn scalars<T>(v: &RawValue, f: impl FnMut(Scalar) -> Option<T>) -> Result<Vec<T>, Option<usize>> {
    if !v.get().starts_with('[') {
        return Err(None);
    }
    let bad = Cell::new(0usize);
    let mut de = serde_json::Deserializer::from_str(v.get());
    de.deserialize_seq(ScalarsVisitor { f, bad: &bad })
        .map_err(|_| Some(bad.get()))
}

/// The `schema` error of [`scalars`] for member `key`.
fn array_error(key: &str, what: &str) -> impl FnOnce(Option<usize>) -> LineError {
    move |bad| match bad {
        None => LineError::schema(format!("\"{key}\" must be an array")),
        Some(i) => LineError::schema(format!("\"{key}\"[{i}] must be {what}")),
    }
}

struct ScalarsVisitor<'b, F> {
    f: F,
    bad: &'b Cell<usize>,
}

impl<'de, 'b, T, F: FnMut(Scalar) -> Option<T>> Visitor<'de> for ScalarsVisitor<'b, F> {
    type Value = Vec<T>;
    fn expecting(&self, f: &mut core::fmt::Formatter) -> core::fmt::Result {
        f.write_str("an array")
    }
    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<Vec<T>, A::Error> {
        let mut out = Vec::new();
        while let Some(s) = seq.next_element_seed(ScalarSeed)? {
            match (self.f)(s) {
                Some(x) => out.push(x),
                None => {
                    self.bad.set(out.len());
                    return Err(de::Error::custom("refused element"));
                }
            }
        }
        Ok(out)
    }
}

/// One value that must be a number or `null`: `Some(None)` for `null`, `Some(Some(x))` for a
/// number (as `f64`, like `serde_json::Value::as_f64`), `None` for anything else.
pub fn number_or_null(v: &RawValue) -> Option<Option<f64>> {
    let mut de = serde_json::Deserializer::from_str(v.get());
    match ScalarSeed.deserialize(&mut de).ok()? {
        Scalar::Null => Some(None),
        s => s.as_f64().map(Some),
    }
}

/// An array of numbers as `f32` (NaN where `null` is allowed and given).
///
/// The out-of-range rule of every `f32` input: a number is rounded to the nearest `f32`, and one
/// that rounds to infinity (`|x| > 3.4028235e38` after rounding, such as `1e39`) is an error
/// [`f32_range_error`] naming the member and the index, never an infinity passed on.
pub fn f32_array(v: &RawValue, key: &str, allow_null: bool) -> Result<Vec<f32>, LineError> {
    let what = if allow_null {
        "a number or null"
    } else {
        "a number"
    };
    let overflow = Cell::new(None);
    scalars(v, |s| match s {
        Scalar::Null if allow_null => Some(f32::NAN),
        _ => {
            let f = s.as_f64()?;
            let x = f as f32;
            if x.is_infinite() {
                overflow.set(Some(f));
                return None;
            }
            Some(x)
        }
    })
    .map_err(|bad| match (bad, overflow.get()) {
        (Some(i), Some(f)) => f32_range_error(&format!("\"{key}\"[{i}]"), f),
        _ => array_error(key, what)(bad),
    })
}

/// The error for a finite input number `value` at `place` (`"rewards"[3]`) that does not fit
/// in `f32`: code `non_finite` (as `f32` it would be infinite), message saying the cause.
pub fn f32_range_error(place: &str, value: f64) -> LineError {
    LineError::new(
        care_core::Error::NonFinite.code(),
        format!("{place} = {value:e} exceeds the f32 range (|x| <= 3.4028235e38)"),
    )
}

/// An array of non-negative integers that fit in `u32` (offsets).
pub fn u32_array(v: &RawValue, key: &str) -> Result<Vec<u32>, LineError> {
    scalars(v, |s| match s {
        Scalar::U64(u) => u32::try_from(u).ok(),
        _ => None,
    })
    .map_err(array_error(key, "an integer in 0..=4294967295"))
}

/// A mask array: `true`/`false` or `0`/`1` per element, as bytes (1 = counted / valid).
pub fn mask_array(v: &RawValue, key: &str) -> Result<Vec<u8>, LineError> {
    scalars(v, |s| match s {
        Scalar::Bool(b) => Some(u8::from(b)),
        Scalar::U64(0) => Some(0),
        Scalar::U64(1) => Some(1),
        _ => None,
    })
    .map_err(array_error(key, "true, false, 0 or 1"))
}

/// A non-negative integer member.
pub fn usize_value(v: &RawValue, key: &str) -> Result<usize, LineError> {
    let mut de = serde_json::Deserializer::from_str(v.get());
    match ScalarSeed.deserialize(&mut de) {
        Ok(Scalar::U64(u)) => usize::try_from(u).ok(),
        _ => None,
    }
    .ok_or_else(|| LineError::schema(format!("\"{key}\" must be a non-negative integer")))
}

/// An array of strings (decoded; borrowed from the line when they hold no escapes).
pub fn str_array<'a>(v: &'a RawValue, key: &str) -> Result<Vec<Cow<'a, str>>, LineError> {
    elements(v, string).map_err(array_error(key, "a string"))
}

/// The elements of an array, as raw text (for arrays of objects read one by one).
pub fn raw_array<'a>(v: &'a RawValue, key: &str) -> Result<Vec<&'a RawValue>, LineError> {
    elements(v, Some).map_err(|_| LineError::schema(format!("\"{key}\" must be an array")))
}

/// The score matrix `[[cog..],[aff..],[pro..]]`: three arrays of numbers or `null` (missing).
pub fn score_matrix(v: &RawValue, key: &str) -> Result<[Vec<Option<f64>>; 3], LineError> {
    let dims = raw_array(v, key)?;
    if dims.len() != 3 {
        return Err(LineError::schema(format!(
            "\"{key}\" must hold 3 arrays (Cognitive, Affective, Proactive), found {}",
            dims.len()
        )));
    }
    let mut out: [Vec<Option<f64>>; 3] = Default::default();
    for (d, (dim, slot)) in dims.iter().zip(out.iter_mut()).enumerate() {
        *slot = scalars(dim, |s| match s {
            Scalar::Null => Some(None),
            _ => s.as_f64().map(Some),
        })
        .map_err(|bad| match bad {
            None => LineError::schema(format!("\"{key}\"[{d}] must be an array")),
            Some(i) => LineError::schema(format!("\"{key}\"[{d}][{i}] must be a number or null")),
        })?;
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    fn line(text: &str) -> Line<'_> {
        Line::parse(text).unwrap()
    }

    #[test]
    fn members_are_the_exact_text_of_the_line() {
        let l = line(r#" { "id" : 1e2 , "a":[1, 2] ,"s":"x\ny", "o": {"k": -0} } "#);
        assert_eq!(l.get("id").unwrap().get(), "1e2");
        assert_eq!(l.get("a").unwrap().get(), "[1, 2]");
        assert_eq!(l.get("o").unwrap().get(), r#"{"k": -0}"#);
        assert_eq!(string(l.get("s").unwrap()).unwrap(), "x\ny");
        assert!(l.get("nope").is_none());
        assert!(line("[1]").get("a").is_none());
        assert!(object(&line("3")).is_err());
    }

    #[test]
    fn typed_arrays_read_like_serde_json_values() {
        let l = line(
            r#"{"f":[1, -2, 0.5, 18446744073709551615, null],"u":[0, 4294967295],"m":[true,0,1,false],"g":7,"t":["a","b\u0041"]}"#,
        );
        let m = object(&l).unwrap();
        let f = f32_array(m.get("f").unwrap(), "f", true).unwrap();
        assert_eq!(&f[..4], &[1.0, -2.0, 0.5, 18446744073709551615u64 as f32]);
        assert!(f[4].is_nan());
        assert_eq!(
            f32_array(m.get("f").unwrap(), "f", false)
                .unwrap_err()
                .message,
            "\"f\"[4] must be a number"
        );
        assert_eq!(u32_array(m.get("u").unwrap(), "u").unwrap(), [0, u32::MAX]);
        assert_eq!(mask_array(m.get("m").unwrap(), "m").unwrap(), [1, 0, 1, 0]);
        assert_eq!(usize_value(m.get("g").unwrap(), "g").unwrap(), 7);
        assert_eq!(str_array(m.get("t").unwrap(), "t").unwrap(), ["a", "bA"]);
        for (text, msg) in [
            (
                r#"{"u":[1, 4294967296]}"#,
                "\"u\"[1] must be an integer in 0..=4294967295",
            ),
            (
                r#"{"u":[-1]}"#,
                "\"u\"[0] must be an integer in 0..=4294967295",
            ),
            (
                r#"{"u":[1.0]}"#,
                "\"u\"[0] must be an integer in 0..=4294967295",
            ),
            (r#"{"u":3}"#, "\"u\" must be an array"),
        ] {
            let l = line(text);
            let e = u32_array(object(&l).unwrap().get("u").unwrap(), "u").unwrap_err();
            assert_eq!(e.message, msg, "{text}");
        }
        for bad in ["[2]", "[-0]", "[1.0]", "[\"1\"]", "[[1]]"] {
            let text = format!(r#"{{"m":{bad}}}"#);
            let l = line(&text);
            let e = mask_array(object(&l).unwrap().get("m").unwrap(), "m").unwrap_err();
            assert_eq!(e.message, "\"m\"[0] must be true, false, 0 or 1", "{bad}");
        }
        for bad in ["-1", "1.0", "\"1\"", "null", "18446744073709551616"] {
            let text = format!(r#"{{"g":{bad}}}"#);
            let l = line(&text);
            assert!(usize_value(object(&l).unwrap().get("g").unwrap(), "g").is_err());
        }
        let l = line(r#"{"t":["a",1]}"#);
        let e = str_array(object(&l).unwrap().get("t").unwrap(), "t").unwrap_err();
        assert_eq!(e.message, "\"t\"[1] must be a string");
    }

    #[test]
    fn unknown_members_name_the_closest_known_one() {
        assert_eq!(edit_distance("maks", "mask"), 2);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("logp_olds", "logp_old"), 1);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        let known = ["logp", "logp_old", "mask"];
        let ok = line(r#"{"logp":[],"id":1,"meta":{"x":1},"mask":null}"#);
        assert!(check_members(object(&ok).unwrap(), &known, "").is_ok());
        let bad = line(r#"{"logp":[],"maks":[1]}"#);
        let e = check_members(object(&bad).unwrap(), &known, "").unwrap_err();
        assert_eq!(e.code, "schema");
        assert_eq!(
            e.message,
            "unknown member \"maks\" (did you mean \"mask\"? known members: \"logp\", \"logp_old\", \"mask\"; put your own data under \"meta\")"
        );
        let nested = line(r#"{"logp_olds":[]}"#);
        let e = check_members(object(&nested).unwrap(), &known, "\"responses\"[1]: ").unwrap_err();
        assert!(
            e.message.starts_with(
                "\"responses\"[1]: unknown member \"logp_olds\" (did you mean \"logp_old\"?"
            ),
            "{}",
            e.message
        );
    }

    #[test]
    fn f32_inputs_out_of_range_are_errors_naming_the_element() {
        // 3.4028235e38 is f32::MAX; 3.40282356e38 still rounds to it; 3.5e38 and 1e39 do not.
        let l = line(r#"{"a":[3.4028235e38, -3.40282356e38, 1e-50],"b":[0, null, -1e39]}"#);
        let m = object(&l).unwrap();
        let a = f32_array(m.get("a").unwrap(), "a", false).unwrap();
        assert_eq!(a, [f32::MAX, f32::MIN, 0.0]);
        let e = f32_array(m.get("b").unwrap(), "b", true).unwrap_err();
        assert_eq!(e.code, "non_finite");
        assert_eq!(
            e.message,
            "\"b\"[2] = -1e39 exceeds the f32 range (|x| <= 3.4028235e38)"
        );
    }

    #[test]
    fn score_matrix_messages_name_the_element() {
        let ok = line(r#"{"s":[[1,null],[],[2.5]]}"#);
        let s = score_matrix(object(&ok).unwrap().get("s").unwrap(), "s").unwrap();
        assert_eq!(s, [vec![Some(1.0), None], vec![], vec![Some(2.5)]]);
        for (text, msg) in [
            (
                r#"{"s":[[1],[2]]}"#,
                "\"s\" must hold 3 arrays (Cognitive, Affective, Proactive), found 2",
            ),
            (r#"{"s":[[1],2,[]]}"#, "\"s\"[1] must be an array"),
            (
                r#"{"s":[[1],[],["x"]]}"#,
                "\"s\"[2][0] must be a number or null",
            ),
            (r#"{"s":{}}"#, "\"s\" must be an array"),
        ] {
            let l = line(text);
            let e = score_matrix(object(&l).unwrap().get("s").unwrap(), "s").unwrap_err();
            assert_eq!(e.message, msg, "{text}");
        }
    }
}
