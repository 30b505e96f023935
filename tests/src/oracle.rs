//! An independent reference for the rubric format contract, built on `serde_json` (std).
//!
//! It decodes the bytes into [`J`], a JSON tree that keeps object keys in order and keeps
//! duplicates (so that `key_order` and duplicate keys can be judged, which `serde_json::Value`
//! cannot), then checks the `paper` policy of SPEC §3 rule by rule. Nothing here is shared with
//! `care-core`: the JSON syntax, string unescaping, float parsing, trimming and the level-anchor
//! check are all done separately, so that agreement between the two means something.
//!
//! [`compare`] runs both and returns the first disagreement, for the differential fuzz target
//! and the tests.

use care_core::{Dimension, FormatPolicy, ViolationCode, validate};
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// A JSON value with ordered, possibly duplicated object keys.
#[derive(Clone, Debug, PartialEq)]
pub enum J {
    /// `null`.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// Any number, as the nearest `f64` (serde_json with `float_roundtrip`).
    Num(f64),
    /// A decoded string.
    Str(String),
    /// An array.
    Arr(Vec<J>),
    /// An object: keys in text order, duplicates kept.
    Obj(Vec<(String, J)>),
}

impl J {
    /// Nesting depth of arrays and objects (a scalar is 0).
    pub fn depth(&self) -> usize {
        match self {
            J::Arr(v) => 1 + v.iter().map(J::depth).max().unwrap_or(0),
            J::Obj(v) => 1 + v.iter().map(|(_, x)| x.depth()).max().unwrap_or(0),
            _ => 0,
        }
    }
}

struct JVisitor;

impl<'de> Visitor<'de> for JVisitor {
    type Value = J;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E>(self) -> Result<J, E> {
        Ok(J::Null)
    }
    fn visit_bool<E>(self, b: bool) -> Result<J, E> {
        Ok(J::Bool(b))
    }
    fn visit_u64<E>(self, n: u64) -> Result<J, E> {
        // `as` rounds to nearest, ties to even: the same f64 that parsing the digits gives.
        Ok(J::Num(n as f64))
    }
    fn visit_i64<E>(self, n: i64) -> Result<J, E> {
        Ok(J::Num(n as f64))
    }
    fn visit_f64<E>(self, n: f64) -> Result<J, E> {
        Ok(J::Num(n))
    }
    fn visit_str<E>(self, s: &str) -> Result<J, E> {
        Ok(J::Str(s.to_owned()))
    }
    fn visit_string<E>(self, s: String) -> Result<J, E> {
        Ok(J::Str(s))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<J, A::Error> {
        let mut v = Vec::new();
        while let Some(x) = seq.next_element::<J>()? {
            v.push(x);
        }
        Ok(J::Arr(v))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<J, A::Error> {
        let mut v = Vec::new();
        while let Some((k, x)) = map.next_entry::<String, J>()? {
            v.push((k, x));
        }
        Ok(J::Obj(v))
    }
}

impl<'de> Deserialize<'de> for J {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<J, D::Error> {
        d.deserialize_any(JVisitor)
    }
}

/// Why `serde_json` rejected the bytes, sorted by how `care-core` is expected to react.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JsonReject {
    /// Malformed JSON (syntax, invalid UTF-8, early end): `care-core` must say `not_json` or
    /// `trailing_text` (or `capacity` when its own nesting limit comes first).
    Syntax,
    /// A number whose magnitude overflows `f64` (`1e999`): valid JSON grammar, which
    /// `care-core` reads as an infinite weight (`weight_range`) instead.
    NumberOutOfRange,
    /// A `\uD800`-style escape without its pair: like serde_json, `care-core` rejects it as a
    /// syntax error at the escape (`not_json`, or `trailing_text` after lenient recovery).
    LoneSurrogate,
    /// Nesting beyond serde_json's limit of 128 (`care-core`'s own limit is 64).
    TooDeep,
}

fn classify(e: &serde_json::Error) -> JsonReject {
    let m = e.to_string();
    if m.contains("number out of range") {
        JsonReject::NumberOutOfRange
    } else if m.contains("surrogate") || m.contains("hex escape") {
        // "lone leading surrogate in hex escape", "unexpected end of hex escape" (a high
        // surrogate followed by something that is not `\u`), "invalid unicode code point" is
        // a plain syntax error below.
        JsonReject::LoneSurrogate
    } else if m.contains("recursion limit") {
        JsonReject::TooDeep
    } else {
        JsonReject::Syntax
    }
}

/// One dimension of a reference rubric.
#[derive(Clone, Debug, PartialEq)]
pub struct RefCategory {
    /// `category_weight`.
    pub weight: f64,
    /// `weight_rationale`, decoded.
    pub rationale: String,
    /// `(title, description)` pairs, decoded, in order.
    pub criteria: Vec<(String, String)>,
}

/// What the reference says about some bytes.
#[derive(Clone, Debug, PartialEq)]
pub enum RefOutcome {
    /// serde_json rejected the bytes.
    NotJson(JsonReject),
    /// JSON, but the `paper` contract is broken; the text names the first rule broken.
    Invalid(String),
    /// A valid rubric, categories in canonical order (Cog, Aff, Pro).
    Valid([RefCategory; 3]),
}

/// The required trimmed end of a description.
const SUFFIX: &str = "value: 0, 1, 2, 3, 4, 5";

fn blank(s: &str) -> bool {
    s.trim().is_empty()
}

/// SPEC §3 `level_format`, written from the SPEC: anchors `[0]`..`[5]` each exactly once, in
/// increasing order, each followed by non-blank text, and the trimmed end is the suffix.
pub fn levels_ok(desc: &str) -> bool {
    let Some(body) = desc.trim_end().strip_suffix(SUFFIX) else {
        return false;
    };
    let mut starts = Vec::with_capacity(6);
    for k in 0..6 {
        let anchor = format!("[{k}]");
        let found: Vec<usize> = body
            .match_indices(anchor.as_str())
            .map(|(p, _)| p)
            .collect();
        if found.len() != 1 {
            return false;
        }
        starts.push(found[0]);
    }
    if starts.windows(2).any(|w| w[0] >= w[1]) {
        return false;
    }
    (0..6).all(|k| {
        let from = starts[k] + 3;
        let to = if k == 5 { body.len() } else { starts[k + 1] };
        body.get(from..to).is_some_and(|t| !blank(t))
    })
}

fn keys_exactly<'j>(obj: &'j [(String, J)], want: &[&str]) -> Result<Vec<&'j J>, String> {
    let got: Vec<&str> = obj.iter().map(|(k, _)| k.as_str()).collect();
    if got != want {
        return Err(format!("keys {got:?}, want {want:?}"));
    }
    Ok(obj.iter().map(|(_, v)| v).collect())
}

fn string(j: &J, what: &str) -> Result<String, String> {
    match j {
        J::Str(s) if !blank(s) => Ok(s.clone()),
        J::Str(_) => Err(format!("blank {what}")),
        _ => Err(format!("{what} is not a string")),
    }
}

fn check(root: &J) -> Result<[RefCategory; 3], String> {
    let J::Obj(top) = root else {
        return Err("top level is not an object".into());
    };
    let v = keys_exactly(top, &["categories"])?;
    let J::Arr(cats) = v[0] else {
        return Err("categories is not an array".into());
    };
    if cats.len() != 3 {
        return Err(format!("{} categories", cats.len()));
    }
    let mut out = Vec::with_capacity(3);
    for (cat, d) in cats.iter().zip(Dimension::ALL) {
        let J::Obj(fields) = cat else {
            return Err("a category is not an object".into());
        };
        let v = keys_exactly(
            fields,
            &[
                "category",
                "weight_rationale",
                "category_weight",
                "criteria",
            ],
        )?;
        if *v[0] != J::Str(d.json_name().to_owned()) {
            return Err(format!(
                "category {:?} where {} belongs",
                v[0],
                d.json_name()
            ));
        }
        let rationale = string(v[1], "weight_rationale")?;
        let J::Num(weight) = *v[2] else {
            return Err("category_weight is not a number".into());
        };
        if !(0.0..=1.0).contains(&weight) {
            return Err(format!("weight {weight} outside [0, 1]"));
        }
        let J::Arr(items) = v[3] else {
            return Err("criteria is not an array".into());
        };
        if !(2..=4).contains(&items.len()) {
            return Err(format!("{} criteria", items.len()));
        }
        let mut criteria = Vec::new();
        for it in items {
            let J::Obj(kv) = it else {
                return Err("a criterion is not an object".into());
            };
            let v = keys_exactly(kv, &["title", "description"])?;
            let title = string(v[0], "title")?;
            let description = string(v[1], "description")?;
            if !levels_ok(&description) {
                return Err(format!("level format of {description:?}"));
            }
            criteria.push((title, description));
        }
        out.push(RefCategory {
            weight,
            rationale,
            criteria,
        });
    }
    let sum: f64 = out.iter().map(|c| c.weight).sum();
    if (sum - 1.0).abs() > 1e-3 {
        return Err(format!("weights sum to {sum}"));
    }
    let titles: Vec<&str> = out
        .iter()
        .flat_map(|c| c.criteria.iter().map(|(t, _)| t.trim()))
        .collect();
    for (i, a) in titles.iter().enumerate() {
        if titles[..i].iter().any(|b| b.eq_ignore_ascii_case(a)) {
            return Err(format!("duplicate title {a:?}"));
        }
    }
    out.try_into()
        .map_err(|_| "three categories expected".to_owned())
}

/// Parses `bytes` with serde_json and checks the `paper` format contract.
pub fn reference(bytes: &[u8]) -> RefOutcome {
    match serde_json::from_slice::<J>(bytes) {
        Err(e) => RefOutcome::NotJson(classify(&e)),
        Ok(j) => match check(&j) {
            Ok(r) => RefOutcome::Valid(r),
            Err(why) => RefOutcome::Invalid(why),
        },
    }
}

/// Runs `care-core`'s validator (paper policy, scratch of `bytes.len()`) and the reference on
/// the same bytes; `Err` describes the first disagreement:
///
/// * validity: the core's `is_valid()` must equal the reference's `Valid`;
/// * fields: when both accept, every weight (bit for bit, up to the sign of zero), rationale,
///   title and description must be equal;
/// * syntax: when serde_json accepts the bytes as one JSON value no deeper than 64, the core
///   must not report `not_json` or `trailing_text`; when serde_json finds a syntax error, the
///   core must report `not_json`, `trailing_text` or `capacity`.
///
/// Lone surrogate escapes count as syntax errors on both sides. Known, documented divergences
/// are not reported: numbers beyond `f64` (the core reads infinity, then `weight_range`) and
/// nesting between the two libraries' depth limits.
pub fn compare(bytes: &[u8]) -> Result<(), String> {
    let mut scratch = vec![0u8; bytes.len()];
    let v = validate(bytes, &FormatPolicy::PAPER, &mut scratch).map_err(|e| e.to_string())?;
    let reference = reference(bytes);
    let syntax_flagged = v.report.has(ViolationCode::NotJson)
        || v.report.has(ViolationCode::TrailingText)
        || v.report.has(ViolationCode::Capacity);
    match &reference {
        RefOutcome::NotJson(why @ (JsonReject::Syntax | JsonReject::LoneSurrogate))
            if !syntax_flagged =>
        {
            return Err(format!(
                "serde_json: {why:?}; care-core reported no syntax problem: {}",
                v.report
            ));
        }
        RefOutcome::NotJson(_) => {}
        RefOutcome::Invalid(_) | RefOutcome::Valid(_) => {
            let depth = serde_json::from_slice::<J>(bytes).map_or(0, |j| j.depth());
            let core_syntax =
                v.report.has(ViolationCode::NotJson) || v.report.has(ViolationCode::TrailingText);
            if depth <= 64 && core_syntax {
                return Err(format!(
                    "serde_json accepts the JSON; care-core says: {}",
                    v.report
                ));
            }
        }
    }
    match (&reference, v.is_valid(), v.rubric.as_ref()) {
        (RefOutcome::Valid(cats), true, Some(r)) => {
            for (d, c) in Dimension::ALL.into_iter().zip(cats) {
                let got = r.category(d);
                if got.weight != c.weight {
                    return Err(format!("{d:?} weight {} vs {}", got.weight, c.weight));
                }
                if got.rationale != c.rationale {
                    return Err(format!(
                        "{d:?} rationale {:?} vs {:?}",
                        got.rationale, c.rationale
                    ));
                }
                let mine: Vec<(String, String)> = got
                    .criteria()
                    .iter()
                    .map(|k| (k.title.to_owned(), k.description.to_owned()))
                    .collect();
                if mine != c.criteria {
                    return Err(format!("{d:?} criteria {mine:?} vs {:?}", c.criteria));
                }
            }
            Ok(())
        }
        (RefOutcome::Valid(_), false, _) => Err(format!(
            "the reference accepts; care-core rejects: {}",
            v.report
        )),
        (RefOutcome::Valid(_), true, None) => Err("care-core valid without a rubric".into()),
        (_, true, _) => Err(format!(
            "care-core accepts; the reference rejects: {reference:?}"
        )),
        (_, false, _) => Ok(()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn levels_check_matches_the_spec_examples() {
        assert!(levels_ok(
            "[0] a [1] b [2] c [3] d [4] e [5] f value: 0, 1, 2, 3, 4, 5"
        ));
        assert!(levels_ok(
            "[0] a [1] b [2] c [3] d [4] e [5] f value: 0, 1, 2, 3, 4, 5 \n"
        ));
        assert!(!levels_ok("[0] a [1] b [2] c [3] d [4] e [5] f"));
        assert!(!levels_ok(
            "[0] a [2] b [1] c [3] d [4] e [5] f value: 0, 1, 2, 3, 4, 5"
        ));
        assert!(!levels_ok(
            "[0] [1] b [2] c [3] d [4] e [5] f value: 0, 1, 2, 3, 4, 5"
        ));
        assert!(!levels_ok(
            "[0] a [0] a [1] b [2] c [3] d [4] e [5] f value: 0, 1, 2, 3, 4, 5"
        ));
        assert!(!levels_ok(
            "[0] a [1] b [2] c [3] d [4] e [5]  value: 0, 1, 2, 3, 4, 5"
        ));
    }

    #[test]
    fn serde_json_rejections_are_classified() {
        let r = |s: &str| {
            serde_json::from_slice::<J>(s.as_bytes())
                .map(|_| ())
                .map_err(|e| classify(&e))
        };
        assert_eq!(r("1e999"), Err(JsonReject::NumberOutOfRange));
        assert_eq!(r(r#""\ud800""#), Err(JsonReject::LoneSurrogate));
        assert_eq!(r(r#""\ud800x""#), Err(JsonReject::LoneSurrogate));
        assert_eq!(r(r#""\udc00""#), Err(JsonReject::LoneSurrogate));
        assert_eq!(r(r#""\ud800\u0041""#), Err(JsonReject::LoneSurrogate));
        assert_eq!(r(r#""\ud83d\ude00""#), Ok(()));
        assert_eq!(r(&"[".repeat(200)), Err(JsonReject::TooDeep));
        assert_eq!(r("{"), Err(JsonReject::Syntax));
        assert_eq!(r("-0"), Ok(()));
    }

    #[test]
    fn duplicate_keys_are_kept_in_order() {
        let j: J = serde_json::from_str(r#"{"b":1,"a":2,"b":3}"#).unwrap();
        let J::Obj(kv) = j else { panic!() };
        let keys: Vec<&str> = kv.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["b", "a", "b"]);
    }
}
