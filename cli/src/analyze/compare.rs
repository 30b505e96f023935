//! Comparisons of two variants (`--compare A,B`): per view, the difference `A - B` with a 95%
//! interval. Independent samples: Newcombe's hybrid score interval for rates, Welch's interval
//! for means, a Welch-type interval for slopes. Paired samples, when every observation of both
//! variants in a view's group carries an `id` and the ids match one to one: Newcombe's paired
//! interval for rates, the t interval of the paired differences for means.
//!
//! Pairing needs the observations themselves, so they are kept, for the compared variants only,
//! by `id` (at most [`MAX_PAIRED_KEYS`]; beyond that, comparisons fall back to the independent
//! intervals and the report says so).

use std::collections::{BTreeMap, HashMap};

use super::accum::{Acc, VariantAcc, WeightAcc};
use super::record::{Outcome, Record};
use super::stats::{
    Interval, Regression, Welford, newcombe, newcombe_paired, slope_difference, welch,
};
use super::tables::{Cell, Column, DIM_NAMES, Kind, Table, used_labels, variant_name};

/// Most `(kind, id)` observations kept for pairing.
pub const MAX_PAIRED_KEYS: usize = 200_000;

/// What a compared variant's line said, by kind.
#[derive(Clone, Debug, PartialEq)]
pub enum Obs {
    /// A preference pair: outcome (win, tie, loss, unscored as 0..=3) and `r_pref`.
    Pair(u8, Option<f64>),
    /// A valid rubric: weights, turn, emotion.
    Rubric([f64; 3], Option<u32>, Option<u8>),
    /// A response's tactic set (bit `i`: label id `i`).
    Tactics(u32),
}

/// One variant's observation under a key.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Slot {
    /// The observation.
    pub obs: Option<Obs>,
    /// The key came twice for this variant and kind: not pairable.
    pub dup: bool,
}

const PAIR: u8 = 0;
const RUBRIC: u8 = 1;
const TACTICS: u8 = 2;

/// Observations of the compared variants by `(kind, id)`.
#[derive(Clone, Debug, Default)]
pub struct PairStore {
    /// The compared variants (the slots of each entry, in this order).
    pub variants: Vec<Option<String>>,
    entries: HashMap<(u8, String), Vec<Slot>>,
    /// More keys than [`MAX_PAIRED_KEYS`] came: pairing is off.
    pub overflow: bool,
}

impl PairStore {
    /// Keeps what `rec` says, when its variant is compared and it has a key.
    pub fn add(&mut self, rec: &Record) {
        let (Some(key), Some(slot)) = (
            rec.key.as_ref(),
            self.variants.iter().position(|v| *v == rec.variant),
        ) else {
            return;
        };
        let mut obs = Vec::new();
        if let Some(p) = &rec.pair {
            let o = match p.outcome {
                Outcome::Win => 0,
                Outcome::Tie => 1,
                Outcome::Loss => 2,
                Outcome::Unscored => 3,
            };
            obs.push((PAIR, Obs::Pair(o, p.r_pref)));
        }
        if let Some(r) = &rec.rubric
            && r.valid
            && let Some(w) = r.weights
        {
            obs.push((RUBRIC, Obs::Rubric(w, rec.turn, rec.emotion)));
        }
        if let Some(t) = &rec.tactics {
            let mask = t.iter().fold(0u32, |m, &i| m | (1 << (i & 31)));
            obs.push((TACTICS, Obs::Tactics(mask)));
        }
        let n = self.variants.len();
        for (kind, o) in obs {
            let k = (kind, key.clone());
            if !self.entries.contains_key(&k) && self.entries.len() >= MAX_PAIRED_KEYS {
                self.overflow = true;
                continue;
            }
            let slots = self
                .entries
                .entry(k)
                .or_insert_with(|| vec![Slot::default(); n]);
            if let Some(s) = slots.get_mut(slot) {
                if s.obs.is_some() {
                    s.dup = true;
                } else {
                    s.obs = Some(o);
                }
            }
        }
    }

    /// The pairs `(A's, B's)` of kind `kind` whose both sides pass `keep`, grouped by `group`;
    /// a group holding a duplicated key of either variant is marked (not pairable).
    fn matched<G: Ord, F>(&self, kind: u8, ia: usize, ib: usize, group: F) -> BTreeMap<G, Matched>
    where
        F: Fn(&Obs) -> Option<G>,
    {
        let mut out: BTreeMap<G, Matched> = BTreeMap::new();
        if self.overflow {
            return out;
        }
        for ((k, _), slots) in &self.entries {
            if *k != kind {
                continue;
            }
            let (Some(a), Some(b)) = (slots.get(ia), slots.get(ib)) else {
                continue;
            };
            for s in [a, b] {
                if s.dup
                    && let Some(g) = s.obs.as_ref().and_then(&group)
                {
                    out.entry(g).or_default().dup = true;
                }
            }
            if let (Some(oa), Some(ob)) = (&a.obs, &b.obs)
                && let (Some(ga), Some(gb)) = (group(oa), group(ob))
                && ga == gb
            {
                out.entry(ga)
                    .or_default()
                    .pairs
                    .push((oa.clone(), ob.clone()));
            }
        }
        // HashMap order is arbitrary: sort each group's pairs so every statistic is computed
        // in one order and the report's bytes do not depend on it.
        for m in out.values_mut() {
            m.pairs
                .sort_by(|x, y| order(&x.0, &y.0).then(order(&x.1, &y.1)));
        }
        out
    }
}

fn order(a: &Obs, b: &Obs) -> std::cmp::Ordering {
    let key = |o: &Obs| -> Vec<f64> {
        match o {
            Obs::Pair(x, r) => vec![f64::from(*x), r.unwrap_or(f64::NAN)],
            Obs::Rubric(w, t, e) => vec![
                w[0],
                w[1],
                w[2],
                t.map_or(-1.0, f64::from),
                e.map_or(-1.0, f64::from),
            ],
            Obs::Tactics(m) => vec![f64::from(*m)],
        }
    };
    let (x, y) = (key(a), key(b));
    x.iter()
        .zip(&y)
        .map(|(p, q)| p.total_cmp(q))
        .find(|o| o.is_ne())
        .unwrap_or(std::cmp::Ordering::Equal)
}

/// The matched observations of one group.
#[derive(Clone, Debug, Default)]
struct Matched {
    pairs: Vec<(Obs, Obs)>,
    dup: bool,
}

impl Matched {
    /// Paired when every observation of both sides is matched (`n_a == n_b == pairs`), none
    /// repeats a key, and there are at least two.
    fn paired(&self, na: u64, nb: u64) -> bool {
        let k = self.pairs.len() as u64;
        !self.dup && k >= 2 && k == na && k == nb
    }
}

/// One row of the comparison table.
#[derive(Clone, Debug)]
pub struct Row {
    /// The view compared (`preference`, `weights_by_turn`, ...).
    pub view: &'static str,
    /// The group within the view (a turn, an emotion, `all`).
    pub group: String,
    /// What is compared (`win`, `Cognitive`, a label).
    pub measure: String,
    /// Variant A's value.
    pub a: Option<f64>,
    /// Variant B's value.
    pub b: Option<f64>,
    /// `A - B` and its 95% interval.
    pub diff: Option<(f64, Option<Interval>)>,
    /// The interval's method.
    pub method: &'static str,
    /// A's observations.
    pub na: u64,
    /// B's observations.
    pub nb: u64,
    /// Paired observations, when paired.
    pub pairs: Option<u64>,
}

/// A rate difference: paired (Newcombe's paired interval on the 2x2 of `hit`) or not.
#[allow(clippy::too_many_arguments)]
fn rate_row(
    view: &'static str,
    group: String,
    measure: String,
    (ka, na): (u64, u64),
    (kb, nb): (u64, u64),
    matched: Option<&Matched>,
    hit: impl Fn(&Obs) -> bool,
) -> Row {
    let (a, b) = (
        (na > 0).then(|| ka as f64 / na as f64),
        (nb > 0).then(|| kb as f64 / nb as f64),
    );
    let paired = matched.filter(|m| m.paired(na, nb));
    let (diff, method, pairs) = match paired {
        Some(m) => {
            let mut t = [0u64; 4];
            for (x, y) in &m.pairs {
                t[match (hit(x), hit(y)) {
                    (true, true) => 0,
                    (true, false) => 1,
                    (false, true) => 2,
                    (false, false) => 3,
                }] += 1;
            }
            let n = m.pairs.len() as f64;
            let d = (t[1] as f64 - t[2] as f64) / n;
            (
                Some((d, newcombe_paired(t[0], t[1], t[2], t[3]))),
                "newcombe_paired",
                Some(m.pairs.len() as u64),
            )
        }
        None => (
            a.zip(b).map(|(a, b)| (a - b, newcombe(ka, na, kb, nb))),
            "newcombe",
            None,
        ),
    };
    Row {
        view,
        group,
        measure,
        a,
        b,
        diff,
        method,
        na,
        nb,
        pairs,
    }
}

/// A mean difference: paired t on the differences of matched values, or Welch.
fn mean_row(
    view: &'static str,
    group: String,
    measure: String,
    (wa, wb): (&Welford, &Welford),
    matched: Option<&Matched>,
    value: impl Fn(&Obs) -> Option<f64>,
) -> Row {
    let paired = matched.filter(|m| m.paired(wa.n, wb.n));
    let (diff, method, pairs) = match paired {
        Some(m) => {
            let mut d = Welford::default();
            for (x, y) in &m.pairs {
                if let (Some(x), Some(y)) = (value(x), value(y)) {
                    d.push(x - y);
                }
            }
            (d.mean().map(|m| (m, d.ci95())), "paired_t", Some(d.n))
        }
        None => (
            wa.mean()
                .zip(wb.mean())
                .map(|(a, b)| (a - b, welch(wa, wb))),
            "welch",
            None,
        ),
    };
    Row {
        view,
        group,
        measure,
        a: wa.mean(),
        b: wb.mean(),
        diff,
        method,
        na: wa.n,
        nb: wb.n,
        pairs,
    }
}

fn weight_rows(
    rows: &mut Vec<Row>,
    view: &'static str,
    group: String,
    (a, b): (&WeightAcc, &WeightAcc),
    matched: Option<&Matched>,
) {
    for (d, dim) in DIM_NAMES.iter().enumerate() {
        rows.push(mean_row(
            view,
            group.clone(),
            (*dim).to_owned(),
            (&a.w[d], &b.w[d]),
            matched,
            |o| match o {
                Obs::Rubric(w, _, _) => Some(w[d]),
                _ => None,
            },
        ));
    }
}

/// The least-squares fit of each dimension's weight on the turn, from the per-turn moments.
pub fn turn_fits(v: &VariantAcc) -> [Regression; 3] {
    let mut fits = [Regression::default(); 3];
    for (t, a) in &v.by_turn {
        for (f, w) in fits.iter_mut().zip(&a.w) {
            f.push_group(f64::from(*t), w);
        }
    }
    fits
}

/// The valence groups of a variant: each valence's rubrics merged from its emotions.
pub fn by_valence(acc: &Acc, v: &VariantAcc) -> Vec<WeightAcc> {
    let val = &acc.valence;
    let mut out = vec![WeightAcc::default(); val.names.len()];
    for (e, a) in v.by_emotion.iter().enumerate() {
        if let Some(slot) = val.of(e).and_then(|i| out.get_mut(i)) {
            slot.merge(a);
        }
    }
    out
}

/// The comparison rows of variants `ia` and `ib` (positions in the report).
pub fn rows_for(acc: &Acc, ia: usize, ib: usize) -> Vec<Row> {
    let (va, vb) = (&acc.variants[ia].1, &acc.variants[ib].1);
    let (sa, sb) = (
        acc.pairs
            .variants
            .iter()
            .position(|v| *v == acc.variants[ia].0),
        acc.pairs
            .variants
            .iter()
            .position(|v| *v == acc.variants[ib].0),
    );
    let store = sa.zip(sb);
    let matched = |kind: u8, f: &dyn Fn(&Obs) -> Option<String>| -> BTreeMap<String, Matched> {
        store.map_or_else(BTreeMap::new, |(a, b)| acc.pairs.matched(kind, a, b, f))
    };
    let mut rows = Vec::new();

    // Preference recovery (Table 4): win, tie and loss rates over scored pairs, mean r_pref.
    let (pa, pb) = (&va.pairs, &vb.pairs);
    if pa.scored() > 0 && pb.scored() > 0 {
        let m = matched(PAIR, &|o| match o {
            Obs::Pair(x, _) if *x < 3 => Some(String::new()),
            _ => None,
        });
        let m = m.get("");
        for (i, name) in ["win", "tie", "loss"].iter().enumerate() {
            rows.push(rate_row(
                "preference",
                "all".to_owned(),
                (*name).to_owned(),
                (pa.outcomes[i], pa.scored()),
                (pb.outcomes[i], pb.scored()),
                m,
                |o| matches!(o, Obs::Pair(x, _) if usize::from(*x) == i),
            ));
        }
        if pa.r_pref.n > 0 && pb.r_pref.n > 0 {
            let mr = matched(PAIR, &|o| match o {
                Obs::Pair(_, Some(_)) => Some(String::new()),
                _ => None,
            });
            rows.push(mean_row(
                "preference",
                "all".to_owned(),
                "mean_r_pref".to_owned(),
                (&pa.r_pref, &pb.r_pref),
                mr.get(""),
                |o| match o {
                    Obs::Pair(_, r) => *r,
                    _ => None,
                },
            ));
        }
    }

    // Weights: all valid rubrics, by turn, by emotion, by valence.
    if va.weights.n() > 0 && vb.weights.n() > 0 {
        let m = matched(RUBRIC, &|_| Some(String::new()));
        weight_rows(
            &mut rows,
            "weights",
            "all".to_owned(),
            (&va.weights, &vb.weights),
            m.get(""),
        );
    }
    let by_turn = matched(RUBRIC, &|o| match o {
        Obs::Rubric(_, Some(t), _) => Some(format!("{t:010}")),
        _ => None,
    });
    for (t, a) in &va.by_turn {
        if let Some(b) = vb.by_turn.get(t) {
            weight_rows(
                &mut rows,
                "weights_by_turn",
                t.to_string(),
                (a, b),
                by_turn.get(&format!("{t:010}")),
            );
        }
    }
    let by_emotion = matched(RUBRIC, &|o| match o {
        Obs::Rubric(_, _, Some(e)) => Some(format!("{e:03}")),
        _ => None,
    });
    for (e, name) in acc.emotions.iter().enumerate() {
        let (a, b) = (&va.by_emotion[e], &vb.by_emotion[e]);
        if a.n() > 0 && b.n() > 0 {
            weight_rows(
                &mut rows,
                "weights_by_emotion",
                name.clone(),
                (a, b),
                by_emotion.get(&format!("{e:03}")),
            );
        }
    }
    let val = &acc.valence;
    let by_val = matched(RUBRIC, &|o| match o {
        Obs::Rubric(_, _, Some(e)) => val.of(usize::from(*e)).map(|v| format!("{v:03}")),
        _ => None,
    });
    let (xa, xb) = (by_valence(acc, va), by_valence(acc, vb));
    for (i, name) in val.names.iter().enumerate() {
        if xa[i].n() > 0 && xb[i].n() > 0 {
            weight_rows(
                &mut rows,
                "weights_by_valence",
                name.clone(),
                (&xa[i], &xb[i]),
                by_val.get(&format!("{i:03}")),
            );
        }
    }

    // Trend: the slope of each dimension's weight over turns.
    let (fa, fb) = (turn_fits(va), turn_fits(vb));
    for (d, dim) in DIM_NAMES.iter().enumerate() {
        if let (Some(a), Some(b)) = (fa[d].slope(), fb[d].slope()) {
            rows.push(Row {
                view: "trend",
                group: "all".to_owned(),
                measure: format!("{dim} slope per turn"),
                a: Some(a),
                b: Some(b),
                diff: Some((a - b, slope_difference(&fa[d], &fb[d]))),
                method: "slope_welch",
                na: fa[d].n,
                nb: fb[d].n,
                pairs: None,
            });
        }
    }

    // Strategy occurrence (Figure 5): each label's share of responses.
    let (ta, tb) = (&va.tactics, &vb.tactics);
    if ta.responses > 0 && tb.responses > 0 {
        let m = matched(TACTICS, &|_| Some(String::new()));
        for id in used_labels(acc) {
            let name = acc
                .label_set
                .get(id)
                .map_or_else(|| format!("#{id}"), |l| l.name.to_owned());
            let i = usize::from(id);
            rows.push(rate_row(
                "strategy",
                "all".to_owned(),
                name,
                (ta.uses[i], ta.responses),
                (tb.uses[i], tb.responses),
                m.get(""),
                |o| matches!(o, Obs::Tactics(mask) if mask & (1 << i) != 0),
            ));
        }
    }

    // Format health: the valid share of all rubrics.
    let (ra, rb) = (&va.rubrics, &vb.rubrics);
    if ra.total > 0 && rb.total > 0 {
        rows.push(rate_row(
            "format",
            "all".to_owned(),
            "valid_share".to_owned(),
            (ra.valid, ra.total),
            (rb.valid, rb.total),
            None,
            |_| false,
        ));
    }
    rows
}

fn col(name: &str, kind: Kind) -> Column {
    Column {
        name: name.to_owned(),
        kind,
    }
}

/// The position of variant `name` in the report.
pub fn position(acc: &Acc, name: &str) -> Option<usize> {
    acc.variants
        .iter()
        .position(|(v, _)| v.as_deref() == Some(name))
}

/// The comparison table: every `--compare` pair that has data, every view.
pub fn table(acc: &Acc) -> Table {
    let mut out = Vec::new();
    for (a, b) in &acc.settings.compare {
        let (Some(ia), Some(ib)) = (position(acc, a), position(acc, b)) else {
            continue;
        };
        for r in rows_for(acc, ia, ib) {
            let num = |x: Option<f64>| x.filter(|v| v.is_finite()).map_or(Cell::Empty, Cell::Num);
            out.push(vec![
                Cell::Text(variant_name(&acc.variants[ia].0)),
                Cell::Text(variant_name(&acc.variants[ib].0)),
                Cell::Text(r.view.to_owned()),
                Cell::Text(r.group),
                Cell::Text(r.measure),
                num(r.a),
                num(r.b),
                match r.diff {
                    Some((d, ci)) if d.is_finite() => {
                        Cell::Mean(d, ci.filter(|c| c.lo.is_finite() && c.hi.is_finite()))
                    }
                    _ => Cell::Empty,
                },
                Cell::Text(r.method.to_owned()),
                Cell::Int(r.na),
                Cell::Int(r.nb),
                r.pairs.map_or(Cell::Empty, Cell::Int),
            ]);
        }
    }
    Table {
        name: "comparison",
        title: "Comparisons".to_owned(),
        caption: "For each --compare pair (A, B), per view and group, the value of each variant \
                  and the difference A - B with a 95% interval: rates by Newcombe's hybrid score \
                  interval (newcombe) or, when every observation of both is paired by \"id\", \
                  Newcombe's paired interval (newcombe_paired); means by Welch's interval (welch) \
                  or the t interval of the paired differences (paired_t); slopes over turns by a \
                  Welch-type interval (slope_welch). \"pairs\" counts the paired observations."
            .to_owned(),
        columns: vec![
            col("a", Kind::Plain),
            col("b", Kind::Plain),
            col("view", Kind::Plain),
            col("group", Kind::Plain),
            col("measure", Kind::Plain),
            col("value_a", Kind::Plain),
            col("value_b", Kind::Plain),
            col("difference", Kind::Interval),
            col("method", Kind::Plain),
            col("n_a", Kind::Plain),
            col("n_b", Kind::Plain),
            col("pairs", Kind::Plain),
        ],
        rows: out,
    }
}

/// Notes on the comparisons: variants named but absent, and pairing switched off.
pub fn notes(acc: &Acc) -> Vec<String> {
    let mut out = Vec::new();
    for (a, b) in &acc.settings.compare {
        for v in [a, b] {
            if position(acc, v).is_none() {
                out.push(format!(
                    "--compare {a},{b}: no line names the variant {v:?}, so there is nothing to \
                     compare."
                ));
            }
        }
    }
    if acc.pairs.overflow {
        out.push(format!(
            "More than {MAX_PAIRED_KEYS} observations of compared variants carry an \"id\": \
             pairing is off and every comparison uses the intervals for independent samples."
        ));
    }
    out
}
