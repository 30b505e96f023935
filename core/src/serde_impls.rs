//! `Serialize`/`Deserialize` (feature `serde`) where a derive does not fit: a float field that
//! may be infinite, the short text of a violation, a violation's static note, and the rubric
//! (borrowed and owned) in the rubric JSON shape of the format contract. The derives sit on
//! the types themselves; enums serialize by their stable names (`crate::names`).

use core::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::ser::{SerializeSeq, SerializeStruct, Serializer};
use serde::{Deserialize, Serialize};

use crate::format::{Arg, ShortText, Violation, ViolationCode, notes};
use crate::rubric::{Category, Criterion, Dimension, Rubric};

/// An `f64` field that may legitimately be infinite or NaN (loss statistics, the clamps of the
/// loss options). Binary formats carry the value as is. Human-readable formats (JSON) have no
/// infinity, so a non-finite value is written as the string `"inf"`, `"-inf"` or `"NaN"` and
/// read back exactly; finite values stay numbers.
pub(crate) mod float {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
        if !s.is_human_readable() || x.is_finite() {
            return s.serialize_f64(*x);
        }
        s.serialize_str(if x.is_nan() {
            "NaN"
        } else if *x > 0.0 {
            "inf"
        } else {
            "-inf"
        })
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        if d.is_human_readable() {
            d.deserialize_any(FloatVisitor)
        } else {
            d.deserialize_f64(FloatVisitor)
        }
    }

    struct FloatVisitor;

    impl Visitor<'_> for FloatVisitor {
        type Value = f64;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a number, or \"inf\", \"-inf\" or \"NaN\"")
        }

        fn visit_f64<E: de::Error>(self, v: f64) -> Result<f64, E> {
            Ok(v)
        }

        fn visit_i64<E: de::Error>(self, v: i64) -> Result<f64, E> {
            Ok(v as f64)
        }

        fn visit_u64<E: de::Error>(self, v: u64) -> Result<f64, E> {
            Ok(v as f64)
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<f64, E> {
            match v {
                "inf" => Ok(f64::INFINITY),
                "-inf" => Ok(f64::NEG_INFINITY),
                "NaN" => Ok(f64::NAN),
                _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
            }
        }
    }
}

// ---- format: short text and violations ---------------------------------------------------

impl Serialize for ShortText {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("ShortText", 2)?;
        st.serialize_field("text", self.as_str())?;
        st.serialize_field("truncated", &self.is_truncated())?;
        st.end()
    }
}

/// The wire form of [`ShortText`]; the text is read through a visitor, so escaped JSON strings
/// need no allocation.
#[derive(Deserialize)]
#[serde(rename = "ShortText")]
struct ShortTextWire {
    text: ShortTextStr,
    truncated: bool,
}

struct ShortTextStr(ShortText);

impl<'de> Deserialize<'de> for ShortTextStr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ShortTextStr;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string of at most 32 bytes")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ShortTextStr, E> {
                let t = ShortText::new(v);
                if t.is_truncated() {
                    return Err(E::invalid_length(v.len(), &self));
                }
                Ok(ShortTextStr(t))
            }
        }
        d.deserialize_str(V)
    }
}

impl<'de> Deserialize<'de> for ShortText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let w = ShortTextWire::deserialize(d)?;
        Ok(w.text.0.with_truncated(w.truncated))
    }
}

/// A violation's note, read back as the validator's own `&'static str`.
struct StaticNote(&'static str);

impl<'de> Deserialize<'de> for StaticNote {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = StaticNote;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("one of the notes of care-core's validator")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<StaticNote, E> {
                notes::lookup(v)
                    .map(StaticNote)
                    .ok_or_else(|| E::invalid_value(de::Unexpected::Str(v), &self))
            }
        }
        d.deserialize_str(V)
    }
}

impl Serialize for Violation {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("Violation", 7)?;
        st.serialize_field("code", &self.code)?;
        st.serialize_field("category", &self.category)?;
        st.serialize_field("dimension", &self.dimension)?;
        st.serialize_field("criterion", &self.criterion)?;
        st.serialize_field("offset", &self.offset)?;
        st.serialize_field("note", self.note)?;
        st.serialize_field("arg", &self.arg)?;
        st.end()
    }
}

/// The wire form of [`Violation`] (the same fields, the note read through [`StaticNote`]).
#[derive(Deserialize)]
#[serde(rename = "Violation")]
struct ViolationWire {
    code: ViolationCode,
    category: Option<u8>,
    dimension: Option<Dimension>,
    criterion: Option<u8>,
    offset: Option<usize>,
    note: StaticNote,
    arg: Arg,
}

impl<'de> Deserialize<'de> for Violation {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let w = ViolationWire::deserialize(d)?;
        Ok(Violation {
            code: w.code,
            category: w.category,
            dimension: w.dimension,
            criterion: w.criterion,
            offset: w.offset,
            note: w.note.0,
            arg: w.arg,
        })
    }
}

// ---- rubric: the rubric JSON of the format contract ------------------------------------------

/// A rubric serializes as rubric JSON: `{"categories": [{"category", "weight_rationale",
/// "category_weight", "criteria": [{"title", "description"}]}]}`, the present categories in
/// canonical order, keys in the contract's order. A rubric that passed the contract therefore
/// serializes (with `serde_json`) to a text that passes it again.
impl Serialize for Rubric<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Categories<'r, 'a>(&'r Rubric<'a>);
        impl Serialize for Categories<'_, '_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let present = self.0.categories().iter().filter(|c| c.present).count();
                let mut seq = s.serialize_seq(Some(present))?;
                for (d, c) in Dimension::ALL.into_iter().zip(self.0.categories()) {
                    if c.present {
                        seq.serialize_element(&CategoryRef(d, c))?;
                    }
                }
                seq.end()
            }
        }
        let mut st = s.serialize_struct("Rubric", 1)?;
        st.serialize_field("categories", &Categories(self))?;
        st.end()
    }
}

struct CategoryRef<'r, 'a>(Dimension, &'r Category<'a>);

impl Serialize for CategoryRef<'_, '_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("Category", 4)?;
        st.serialize_field("category", self.0.json_name())?;
        st.serialize_field("weight_rationale", self.1.rationale)?;
        st.serialize_field("category_weight", &self.1.weight)?;
        st.serialize_field("criteria", self.1.criteria())?;
        st.end()
    }
}

impl Serialize for Criterion<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("Criterion", 2)?;
        st.serialize_field("title", self.title)?;
        st.serialize_field("description", self.description)?;
        st.end()
    }
}

#[cfg(feature = "alloc")]
mod owned {
    use alloc::string::String;
    use alloc::vec::Vec;

    use super::*;
    use crate::rubric::RubricBuf;

    impl Serialize for RubricBuf {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            self.rubric().serialize(s)
        }
    }

    #[derive(Deserialize)]
    #[serde(rename = "Rubric", deny_unknown_fields)]
    struct RubricWire {
        categories: Vec<CategoryWire>,
    }

    #[derive(Deserialize)]
    #[serde(rename = "Category", deny_unknown_fields)]
    struct CategoryWire {
        category: String,
        weight_rationale: String,
        category_weight: f64,
        criteria: Vec<CriterionWire>,
    }

    #[derive(Deserialize)]
    #[serde(rename = "Criterion", deny_unknown_fields)]
    struct CriterionWire {
        title: String,
        description: String,
    }

    /// Reads the rubric JSON that [`Rubric`]'s `Serialize` writes. Structure is checked
    /// (known category names, each at most once, at most
    /// [`MAX_CRITERIA`](crate::rubric::MAX_CRITERIA) criteria per category); the format
    /// contract is not (weights, level anchors...): that is [`crate::validate`]'s job.
    impl<'de> Deserialize<'de> for RubricBuf {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            let w = RubricWire::deserialize(d)?;
            let mut r = Rubric::new();
            for c in &w.categories {
                let dim = Dimension::from_json_name(&c.category).ok_or_else(|| {
                    de::Error::invalid_value(
                        de::Unexpected::Str(&c.category),
                        &"Cognitive Empathy, Affective Empathy or Proactive Empathy",
                    )
                })?;
                if r.category(dim).present {
                    return Err(de::Error::custom(format_args!(
                        "category {} given twice",
                        dim.json_name()
                    )));
                }
                r.set_category(dim, c.category_weight, &c.weight_rationale);
                for k in &c.criteria {
                    r.push_criterion(dim, &k.title, &k.description)
                        .map_err(|_| {
                            de::Error::invalid_length(
                                c.criteria.len(),
                                &"at most MAX_CRITERIA (16) criteria per category",
                            )
                        })?;
                }
            }
            Ok(RubricBuf::from(&r))
        }
    }
}
