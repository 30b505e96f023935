//! Verdicts of a named judge (an LLM or a human annotator): a pairwise win, tie or loss of one
//! system against another, or the choice of the best among `N` systems (the paper's human
//! evaluation, Appendix G, and its judge-based comparisons). Read from a line's `verdict`,
//! counted per judge and system set, and shown as shares with intervals.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::stats::{Interval, newcombe_paired, wilson95};
use super::tables::{Cell, Column, Kind, Table};
use crate::json::LineError;

/// Most systems in one choice.
pub const MAX_SYSTEMS: usize = 16;
/// Most distinct (judge, system set) groups in one report.
pub const MAX_VERDICT_SETS: usize = 64;
/// Longest judge or system name (characters).
pub const MAX_NAME_CHARS: usize = 200;

/// What the judge said.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Pick {
    /// Pairwise, from the view of the first of the two (sorted) systems: 0 win, 1 tie, 2 loss.
    Pairwise(u8),
    /// The index of the chosen system among the (sorted) systems.
    Choice(u8),
}

/// One verdict.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerdictObs {
    /// Who judged.
    pub judge: String,
    /// The systems judged, sorted (so `A vs B` and `B vs A` are one set).
    pub systems: Vec<String>,
    /// The verdict.
    pub pick: Pick,
}

fn name(v: Option<&Value>, key: &str) -> Result<String, LineError> {
    match v {
        Some(Value::String(s)) if !s.trim().is_empty() => {
            if s.trim().chars().count() > MAX_NAME_CHARS {
                Err(LineError::schema(format!(
                    "\"verdict.{key}\" is longer than {MAX_NAME_CHARS} characters"
                )))
            } else {
                Ok(s.trim().to_owned())
            }
        }
        Some(Value::String(_)) => Err(LineError::new(
            "empty_group",
            format!("\"verdict.{key}\" is empty; name it"),
        )),
        None => Err(LineError::schema(format!(
            "\"verdict\" needs \"{key}\" (missing key)"
        ))),
        Some(_) => Err(LineError::schema(format!(
            "\"verdict.{key}\" must be a string"
        ))),
    }
}

/// Reads the line's `verdict`: `{"judge", "a", "b", "result": "win"|"tie"|"loss"}` (the result
/// for `a`) or `{"judge", "systems": [..], "choice"}`.
pub fn read(m: &Map<String, Value>) -> Result<Option<VerdictObs>, LineError> {
    let v = match m.get("verdict") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(v)) => v,
        Some(_) => return Err(LineError::schema("\"verdict\" must be an object")),
    };
    for k in v.keys() {
        if !["judge", "a", "b", "result", "systems", "choice"].contains(&k.as_str()) {
            return Err(LineError::schema(format!(
                "\"verdict\" has an unknown member {k:?} (judge, a, b, result for a pairwise \
                 verdict; judge, systems, choice for a choice)"
            )));
        }
    }
    let judge = name(v.get("judge"), "judge")?;
    let pairwise = v.contains_key("a") || v.contains_key("b") || v.contains_key("result");
    let choice = v.contains_key("systems") || v.contains_key("choice");
    match (pairwise, choice) {
        (true, true) | (false, false) => Err(LineError::schema(
            "\"verdict\" is either pairwise (\"a\", \"b\", \"result\") or a choice \
             (\"systems\", \"choice\")",
        )),
        (true, false) => {
            let a = name(v.get("a"), "a")?;
            let b = name(v.get("b"), "b")?;
            if a == b {
                return Err(LineError::schema(
                    "\"verdict.a\" and \"verdict.b\" are the same",
                ));
            }
            let r = match v.get("result").and_then(Value::as_str) {
                Some("win") => 0u8,
                Some("tie") => 1,
                Some("loss") => 2,
                _ => {
                    return Err(LineError::schema(
                        "\"verdict.result\" must be \"win\", \"tie\" or \"loss\" (for \"a\")",
                    ));
                }
            };
            let (systems, pick) = if a < b {
                (vec![a, b], r)
            } else {
                (vec![b, a], 2 - r)
            };
            Ok(Some(VerdictObs {
                judge,
                systems,
                pick: Pick::Pairwise(pick),
            }))
        }
        (false, true) => {
            let list = match v.get("systems") {
                Some(Value::Array(a)) => a,
                _ => {
                    return Err(LineError::schema(
                        "\"verdict.systems\" must be an array of system names",
                    ));
                }
            };
            if !(2..=MAX_SYSTEMS).contains(&list.len()) {
                return Err(LineError::schema(format!(
                    "\"verdict.systems\" must name 2 to {MAX_SYSTEMS} systems"
                )));
            }
            let mut systems = Vec::with_capacity(list.len());
            for x in list {
                let s = name(Some(x), "systems[]")?;
                if systems.contains(&s) {
                    return Err(LineError::schema(format!(
                        "\"verdict.systems\" names {s:?} twice"
                    )));
                }
                systems.push(s);
            }
            systems.sort();
            let c = name(v.get("choice"), "choice")?;
            let i = systems.iter().position(|s| *s == c).ok_or_else(|| {
                LineError::schema(format!(
                    "\"verdict.choice\" {c:?} is not one of \"verdict.systems\""
                ))
            })?;
            Ok(Some(VerdictObs {
                judge,
                systems,
                pick: Pick::Choice(i as u8),
            }))
        }
    }
}

/// Counts of one (judge, system set, kind).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VerdictAcc {
    /// Pairwise: win, tie, loss of the first system. Choice: selections per system.
    pub counts: Vec<u64>,
}

impl VerdictAcc {
    /// Verdicts counted.
    pub fn n(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// Key of a verdict group: judge, systems, pairwise?
pub type VerdictKey = (String, Vec<String>, bool);

/// All verdict groups, in key order.
#[derive(Clone, Debug, Default)]
pub struct Verdicts {
    /// The groups.
    pub groups: BTreeMap<VerdictKey, VerdictAcc>,
}

impl Verdicts {
    fn key(v: &VerdictObs) -> VerdictKey {
        let pairwise = matches!(v.pick, Pick::Pairwise(_));
        (v.judge.clone(), v.systems.clone(), pairwise)
    }

    /// `Err` when counting `v` would open one group too many.
    pub fn check(&self, v: &VerdictObs) -> Result<(), (&'static str, String)> {
        if !self.groups.contains_key(&Self::key(v)) && self.groups.len() >= MAX_VERDICT_SETS {
            return Err((
                "too_many_verdict_sets",
                format!(
                    "more than {MAX_VERDICT_SETS} distinct (judge, systems) verdict sets; a report \
                     shows at most {MAX_VERDICT_SETS}"
                ),
            ));
        }
        Ok(())
    }

    /// Counts `v` (after [`Verdicts::check`]; a group beyond the limit is not opened).
    pub fn add(&mut self, v: &VerdictObs) {
        if self.check(v).is_err() {
            return;
        }
        let pairwise = matches!(v.pick, Pick::Pairwise(_));
        let g = self
            .groups
            .entry(Self::key(v))
            .or_insert_with(|| VerdictAcc {
                counts: vec![0; if pairwise { 3 } else { v.systems.len() }],
            });
        let i = match v.pick {
            Pick::Pairwise(r) | Pick::Choice(r) => usize::from(r),
        };
        if let Some(c) = g.counts.get_mut(i) {
            *c += 1;
        }
    }
}

fn col(name: &str, kind: Kind) -> Column {
    Column {
        name: name.to_owned(),
        kind,
    }
}

fn share(k: u64, n: u64) -> Cell {
    if n == 0 {
        Cell::Empty
    } else {
        Cell::Rate(k as f64 / n as f64, wilson95(k, n))
    }
}

/// The difference of two shares of one set of verdicts (dependent: each verdict picks at most
/// one of the two), by Newcombe's paired interval with no verdict picking both.
pub fn share_difference(ka: u64, kb: u64, n: u64) -> Option<(f64, Interval)> {
    let rest = n.checked_sub(ka + kb)?;
    let ci = newcombe_paired(0, ka, kb, rest)?;
    Some(((ka as f64 - kb as f64) / n as f64, ci))
}

/// The verdict table: per judge and set, each system's share (choices) or the first system's
/// win, tie and loss shares (pairwise), with Wilson intervals; then the net difference
/// (win minus loss, or each compared pair's share difference) with Newcombe's paired interval.
pub fn table(v: &Verdicts, compare: &[(String, String)]) -> Table {
    let mut rows = Vec::new();
    for ((judge, systems, pairwise), g) in &v.groups {
        let n = g.n();
        let set = systems.join(if *pairwise { " vs " } else { ", " });
        let mut push = |what: String, k: Option<u64>, cell: Cell, method: &str| {
            rows.push(vec![
                Cell::Text(judge.clone()),
                Cell::Text(set.clone()),
                Cell::Text(what),
                Cell::Int(n),
                k.map_or(Cell::Empty, Cell::Int),
                cell,
                Cell::Text(method.to_owned()),
            ]);
        };
        if *pairwise {
            let first = &systems[0];
            for (i, o) in ["win", "tie", "loss"].iter().enumerate() {
                push(
                    format!("{first}: {o}"),
                    Some(g.counts[i]),
                    share(g.counts[i], n),
                    "wilson",
                );
            }
            if let Some((d, ci)) = share_difference(g.counts[0], g.counts[2], n) {
                push(
                    format!("{first}: win - loss"),
                    None,
                    Cell::Mean(d, Some(ci)),
                    "newcombe_paired",
                );
            }
        } else {
            for (s, &k) in systems.iter().zip(&g.counts) {
                push(s.clone(), Some(k), share(k, n), "wilson");
            }
            for (a, b) in compare {
                let (Some(ia), Some(ib)) = (
                    systems.iter().position(|s| s == a),
                    systems.iter().position(|s| s == b),
                ) else {
                    continue;
                };
                if let Some((d, ci)) = share_difference(g.counts[ia], g.counts[ib], n) {
                    push(
                        format!("{a} - {b}"),
                        None,
                        Cell::Mean(d, Some(ci)),
                        "newcombe_paired",
                    );
                }
            }
        }
    }
    Table {
        name: "verdicts",
        title: "Verdicts of judges and annotators".to_owned(),
        caption: "Per judge and set of systems: the share of verdicts choosing each system (a \
                  choice among N) or the first system's win, tie and loss shares (pairwise), \
                  with 95% Wilson intervals; differences of two shares of the same verdicts \
                  (win minus loss; a --compare pair's shares) with Newcombe's paired interval."
            .to_owned(),
        columns: vec![
            col("judge", Kind::Plain),
            col("systems", Kind::Plain),
            col("measure", Kind::Plain),
            col("verdicts", Kind::Plain),
            col("count", Kind::Plain),
            col("share", Kind::Interval),
            col("method", Kind::Plain),
        ],
        rows,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn rd(s: &str) -> Result<Option<VerdictObs>, LineError> {
        let v: Value = serde_json::from_str(s).unwrap();
        read(v.as_object().unwrap())
    }

    #[test]
    fn reading_verdicts() {
        let p = rd(r#"{"verdict":{"judge":"gpt","a":"MICA","b":"CARE","result":"win"}}"#)
            .unwrap()
            .unwrap();
        assert_eq!(p.systems, ["CARE", "MICA"]);
        assert_eq!(p.pick, Pick::Pairwise(2), "MICA's win is CARE's loss");
        let c = rd(
            r#"{"verdict":{"judge":"h1","systems":["RLVER","MICA","CARE(R)"],"choice":"MICA"}}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(c.systems, ["CARE(R)", "MICA", "RLVER"]);
        assert_eq!(c.pick, Pick::Choice(1));
        assert_eq!(rd(r#"{"x":1}"#).unwrap(), None);
        for bad in [
            r#"{"verdict":{"a":"x","b":"y","result":"win"}}"#,
            r#"{"verdict":{"judge":"j","a":"x","b":"x","result":"win"}}"#,
            r#"{"verdict":{"judge":"j","a":"x","b":"y","result":"draw"}}"#,
            r#"{"verdict":{"judge":"j","systems":["x"],"choice":"x"}}"#,
            r#"{"verdict":{"judge":"j","systems":["x","y"],"choice":"z"}}"#,
            r#"{"verdict":{"judge":"j","systems":["x","x"],"choice":"x"}}"#,
            r#"{"verdict":{"judge":"j","a":"x","b":"y","result":"win","choice":"x"}}"#,
            r#"{"verdict":{"judge":"j","winner":"x"}}"#,
            r#"{"verdict":"x"}"#,
        ] {
            assert!(rd(bad).is_err(), "{bad}");
        }
        assert_eq!(
            rd(r#"{"verdict":{"judge":" ","a":"x","b":"y","result":"win"}}"#)
                .unwrap_err()
                .code,
            "empty_group"
        );
    }

    #[test]
    fn share_differences() {
        let (d, ci) = share_difference(224, 104, 435).unwrap();
        assert!((d - 120.0 / 435.0).abs() < 1e-15);
        assert!(ci.lo > 0.0 && ci.hi < 1.0 && ci.lo < d && d < ci.hi);
        assert_eq!(share_difference(3, 3, 5), None);
    }
}
