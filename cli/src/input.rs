//! Typed access to one parsed input line, with `schema` errors that name the offending key.

use serde_json::{Map, Value};

use crate::json::LineError;

/// The members of an input line that must be a JSON object.
pub fn object(v: &Value) -> Result<&Map<String, Value>, LineError> {
    v.as_object()
        .ok_or_else(|| LineError::schema("the line must be a JSON object"))
}

/// A required member.
pub fn required<'v>(m: &'v Map<String, Value>, key: &str) -> Result<&'v Value, LineError> {
    m.get(key)
        .ok_or_else(|| LineError::schema(format!("missing key \"{key}\"")))
}

/// An optional member; an explicit `null` counts as absent.
pub fn optional<'v>(m: &'v Map<String, Value>, key: &str) -> Option<&'v Value> {
    m.get(key).filter(|v| !v.is_null())
}

fn array<'v>(v: &'v Value, key: &str) -> Result<&'v [Value], LineError> {
    v.as_array()
        .map(Vec::as_slice)
        .ok_or_else(|| LineError::schema(format!("\"{key}\" must be an array")))
}

/// An array of numbers as `f32` (NaN where `null` is allowed and given).
pub fn f32_array(v: &Value, key: &str, allow_null: bool) -> Result<Vec<f32>, LineError> {
    array(v, key)?
        .iter()
        .enumerate()
        .map(|(i, x)| match x {
            Value::Null if allow_null => Ok(f32::NAN),
            _ => x.as_f64().map(|f| f as f32).ok_or_else(|| {
                let what = if allow_null {
                    "a number or null"
                } else {
                    "a number"
                };
                LineError::schema(format!("\"{key}\"[{i}] must be {what}"))
            }),
        })
        .collect()
}

/// An array of non-negative integers that fit in `u32` (offsets).
pub fn u32_array(v: &Value, key: &str) -> Result<Vec<u32>, LineError> {
    array(v, key)?
        .iter()
        .enumerate()
        .map(|(i, x)| {
            x.as_u64()
                .and_then(|u| u32::try_from(u).ok())
                .ok_or_else(|| {
                    LineError::schema(format!(
                        "\"{key}\"[{i}] must be an integer in 0..=4294967295"
                    ))
                })
        })
        .collect()
}

/// A mask array: `true`/`false` or `0`/`1` per element, as bytes (1 = counted / valid).
pub fn mask_array(v: &Value, key: &str) -> Result<Vec<u8>, LineError> {
    array(v, key)?
        .iter()
        .enumerate()
        .map(|(i, x)| match x {
            Value::Bool(b) => Ok(u8::from(*b)),
            Value::Number(n) if n.as_u64() == Some(0) => Ok(0),
            Value::Number(n) if n.as_u64() == Some(1) => Ok(1),
            _ => Err(LineError::schema(format!(
                "\"{key}\"[{i}] must be true, false, 0 or 1"
            ))),
        })
        .collect()
}

/// A non-negative integer member.
pub fn usize_value(v: &Value, key: &str) -> Result<usize, LineError> {
    v.as_u64()
        .and_then(|u| usize::try_from(u).ok())
        .ok_or_else(|| LineError::schema(format!("\"{key}\" must be a non-negative integer")))
}

/// An array of strings.
pub fn str_array<'v>(v: &'v Value, key: &str) -> Result<Vec<&'v str>, LineError> {
    array(v, key)?
        .iter()
        .enumerate()
        .map(|(i, x)| {
            x.as_str()
                .ok_or_else(|| LineError::schema(format!("\"{key}\"[{i}] must be a string")))
        })
        .collect()
}

/// The score matrix `[[cog..],[aff..],[pro..]]`: three arrays of numbers or `null` (missing).
pub fn score_matrix(v: &Value, key: &str) -> Result<[Vec<Option<f64>>; 3], LineError> {
    let dims = array(v, key)?;
    if dims.len() != 3 {
        return Err(LineError::schema(format!(
            "\"{key}\" must hold 3 arrays (Cognitive, Affective, Proactive), found {}",
            dims.len()
        )));
    }
    let mut out: [Vec<Option<f64>>; 3] = Default::default();
    for (d, (dim, slot)) in dims.iter().zip(out.iter_mut()).enumerate() {
        let scores = dim
            .as_array()
            .ok_or_else(|| LineError::schema(format!("\"{key}\"[{d}] must be an array")))?;
        for (i, s) in scores.iter().enumerate() {
            slot.push(match s {
                Value::Null => None,
                _ => Some(s.as_f64().ok_or_else(|| {
                    LineError::schema(format!("\"{key}\"[{d}][{i}] must be a number or null"))
                })?),
            });
        }
    }
    Ok(out)
}
