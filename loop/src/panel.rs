//! Judge panels: the arithmetic and the output of judging one response with several judges.
//!
//! A panel is a list of judges (distinct models, or one model at distinct sampling parameters),
//! each with a weight and a number of samples (`docs/REWARD_LOOP.md`, "Judge panels"). Every
//! (judge, sample) is its own judge call, cached under its own key. Each judgment is rewarded by
//! the profile exactly as a single judge's would be; a judge's reward and scores are the means
//! over its valid samples; each criterion's score of the panel is the weighted [`aggregate`]
//! over the judges that gave valid scores, when they reach the quorum, and the panel's reward
//! is the profile's reward of those real-valued scores
//! ([`crate::profile::RubricProfile::score_real`]).
//!
//! This module holds what does not need the engine: the aggregates, the spread, the agreement
//! statistic (Krippendorff's alpha for interval data, [`Alpha`]), the criterion order of a
//! shuffled prompt ([`criterion_order`]), the output structs and the panel's metrics.

use std::fmt::Write as _;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::config::Aggregate;
use crate::engine::{CallCounts, ErrorOut};
use crate::llm::ChatMessage;
use crate::metrics::Labels;

/// Response statuses a panel adds.
pub mod status {
    /// Fewer judges than the quorum gave valid scores; `error.message` names the judges that
    /// failed and why.
    pub const NO_QUORUM: &str = "no_quorum";
    /// The judges' rewards spread by more than `panel.max_spread` and `panel.on_spread` is
    /// `null`.
    pub const JUDGES_DISAGREE: &str = "judges_disagree";
}

/// The weighted aggregate of `values` (`(value, weight)`, weights finite and above 0).
///
/// Sorted by value, each value covers `[C_{k-1}, C_k)` of `[0, W]`, where `C_k` sums the
/// weights up to it and `W` all of them. `mean` is `sum w x / W`; `trimmed_mean` with fraction
/// `t` is the mean over `[tW, (1-t)W]`, each value counting with the length of its interval
/// inside (the interquartile mean at `t = 0.25`; the ordinary trimmed mean whenever `t n` is a
/// whole number and the weights are equal); `median` is the value at `W / 2`, or the mean of
/// the two values that meet there. `None` for no values.
///
/// The result lies between the smallest and the largest value, as it does in exact arithmetic:
/// a rounded weighted mean that passes them by an ulp is clamped back (a mean of scores that
/// are all 5 is 5, inside the score range, whatever the weights).
pub fn aggregate(values: &[(f64, f64)], how: Aggregate, trim: f64) -> Option<f64> {
    let (lo, hi) = values
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v.0), hi.max(v.0))
        });
    // Not `f64::clamp`, which panics on NaN bounds; a NaN result stays NaN.
    aggregate_raw(values, how, trim).map(|x| {
        if x.is_nan() || lo > hi {
            x
        } else {
            x.max(lo).min(hi)
        }
    })
}

fn aggregate_raw(values: &[(f64, f64)], how: Aggregate, trim: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let total: f64 = values.iter().map(|v| v.1).sum();
    match how {
        Aggregate::Mean => Some(values.iter().map(|(x, w)| x * w).sum::<f64>() / total),
        Aggregate::TrimmedMean if trim > 0.0 => {
            let mut v = values.to_vec();
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
            let (lo, hi) = (trim * total, (1.0 - trim) * total);
            let (mut acc, mut num, mut den) = (0.0, 0.0, 0.0);
            for (x, w) in v {
                let inside = (acc + w).min(hi) - acc.max(lo);
                if inside > 0.0 {
                    num += x * inside;
                    den += inside;
                }
                acc += w;
            }
            (den > 0.0).then(|| num / den)
        }
        Aggregate::TrimmedMean => aggregate_raw(values, Aggregate::Mean, 0.0),
        Aggregate::Median => {
            let mut v = values.to_vec();
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
            let half = total / 2.0;
            // Sums of weights are rounded: "exactly half" is within a few ulps of the total.
            let eps = total * 1e-12;
            let mut acc = 0.0;
            for (k, (x, w)) in v.iter().enumerate() {
                acc += w;
                if (acc - half).abs() <= eps {
                    // The weights split evenly here: the mean of the two values that meet.
                    return Some(v.get(k + 1).map_or(*x, |next| (x + next.0) / 2.0));
                }
                if acc > half {
                    return Some(*x);
                }
            }
            v.last().map(|l| l.0)
        }
    }
}

/// `max - min` of `values` (0 for fewer than two).
pub fn spread(values: impl IntoIterator<Item = f64>) -> f64 {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    let mut any = false;
    for x in values {
        lo = lo.min(x);
        hi = hi.max(x);
        any = true;
    }
    if any { hi - lo } else { 0.0 }
}

/// Krippendorff's alpha for interval data, accumulated one unit at a time.
///
/// A unit is one thing the judges rated (a response's reward, or one criterion of a response),
/// its values the ratings of the judges that gave one; only units with at least two values are
/// pairable, and only their values count. With `n` pairable values in all, `m_u` in unit `u`:
///
/// ```text
/// D_o   = (1/n) * sum_u 1/(m_u - 1) * sum_{i != j in u} (v_i - v_j)^2      observed disagreement
/// D_e   = 1/(n (n - 1)) * sum_{i != j over all n values} (v_i - v_j)^2     expected disagreement
/// alpha = 1 - D_o / D_e
/// ```
///
/// computed as `alpha = 1 - (n - 1) / n * sum_u (m_u M_u / (m_u - 1)) / M`, where `M_u` is the
/// sum of squared deviations from the mean inside unit `u` and `M` that of all `n` values
/// (`sum_{i != j} (v_i - v_j)^2 = 2 m M` for any `m` values), so that units can be added one at
/// a time in constant memory. 1 is perfect agreement, 0 agreement at chance level; undefined
/// (`None`) before two pairable units or while every value is the same.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Alpha {
    units: u64,
    n: u64,
    mean: f64,
    m2: f64,
    within: f64,
}

impl Alpha {
    /// Adds one unit (fewer than two values: not pairable, ignored).
    pub fn add_unit(&mut self, values: &[f64]) {
        let m = values.len();
        if m < 2 {
            return;
        }
        let mean_u = values.iter().sum::<f64>() / m as f64;
        let m2_u: f64 = values.iter().map(|x| (x - mean_u) * (x - mean_u)).sum();
        self.within += m as f64 * m2_u / (m as f64 - 1.0);
        self.units += 1;
        for &x in values {
            // Welford: the pooled sum of squared deviations without cancellation.
            self.n += 1;
            let d = x - self.mean;
            self.mean += d / self.n as f64;
            self.m2 += d * (x - self.mean);
        }
    }

    /// Pairable units added.
    pub fn units(&self) -> u64 {
        self.units
    }

    /// Pairable values added.
    pub fn values(&self) -> u64 {
        self.n
    }

    /// Alpha, when defined.
    pub fn value(&self) -> Option<f64> {
        if self.units < 2 || self.m2 <= 0.0 {
            return None;
        }
        let n = self.n as f64;
        Some(1.0 - (n - 1.0) / n * self.within / self.m2)
    }
}

/// The seed of a judge call's criterion order: a hash of the judge's model and sampling
/// parameters, the sample index and the unshuffled messages (which hold the rubric, the
/// dialogue and the response). The same call always gets the same order, so it stays cacheable.
pub fn order_seed(model: &str, sampling: &str, sample: u32, messages: &[ChatMessage]) -> u64 {
    let mut h = Sha256::new();
    let mut field = |b: &[u8]| {
        h.update((b.len() as u64).to_le_bytes());
        h.update(b);
    };
    field(b"care-loop/criterion-order/v1");
    field(model.as_bytes());
    field(sampling.as_bytes());
    field(&sample.to_le_bytes());
    for m in messages {
        field(m.role.as_bytes());
        field(m.content.as_bytes());
    }
    let d = h.finalize();
    let mut b = [0u8; 8];
    b.copy_from_slice(d.get(..8).unwrap_or(&[0; 8]));
    u64::from_le_bytes(b)
}

/// The order in which a shuffled prompt lists the criteria: `order[i]` is the flat index
/// (rubric order) of the criterion listed `i`-th. The criteria of one dimension stay together:
/// the dimensions are shuffled as blocks, then the criteria inside each (`counts` per
/// dimension, in order). Fisher-Yates driven by splitmix64 from `seed`: the same order on every
/// platform. (A profile whose prompt lists its dimensions in a fixed order keeps that order and
/// uses the order inside each dimension: [`crate::profile::RubricProfile::judge_messages_ordered`].)
pub fn criterion_order(counts: &[usize], seed: u64) -> Vec<usize> {
    let mut state = seed;
    let mut next = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut shuffle = |v: &mut [usize]| {
        for i in (1..v.len()).rev() {
            // Multiply-shift: an index in 0..=i without division (bias below 2^-50 here).
            let j = ((u128::from(next()) * (i as u128 + 1)) >> 64) as usize;
            v.swap(i, j);
        }
    };
    let mut starts = Vec::with_capacity(counts.len());
    let mut first = 0usize;
    for &n in counts {
        starts.push(first);
        first += n;
    }
    let mut dims: Vec<usize> = (0..counts.len()).collect();
    shuffle(&mut dims);
    let mut order = Vec::with_capacity(first);
    for d in dims {
        let (start, n) = (
            starts.get(d).copied().unwrap_or(0),
            counts.get(d).copied().unwrap_or(0),
        );
        let mut block: Vec<usize> = (start..start + n).collect();
        shuffle(&mut block);
        order.extend(block);
    }
    order
}

/// The dimensions of `order` in the order it lists them, each with its criteria in order, when
/// `order` is a permutation of the flat criteria of `counts` that keeps each dimension's
/// criteria together (what [`criterion_order`] gives).
pub fn order_blocks(counts: &[usize], order: &[usize]) -> Option<Vec<(usize, Vec<usize>)>> {
    let total: usize = counts.iter().sum();
    if order.len() != total {
        return None;
    }
    let mut dim_of = Vec::with_capacity(total);
    for (d, &n) in counts.iter().enumerate() {
        dim_of.extend(std::iter::repeat_n(d, n));
    }
    let mut seen = vec![false; total];
    let mut blocks: Vec<(usize, Vec<usize>)> = Vec::new();
    for &i in order {
        let d = *dim_of.get(i)?;
        let slot = seen.get_mut(i)?;
        if *slot {
            return None;
        }
        *slot = true;
        match blocks.last_mut() {
            Some((last, crits)) if *last == d => crits.push(i),
            _ => {
                if blocks.iter().any(|(b, _)| *b == d) {
                    return None;
                }
                blocks.push((d, vec![i]));
            }
        }
    }
    Some(blocks)
}

/// The sampling part of the cache key of sample `sample`: sample 0 is the judge's own key
/// (so that a single judge keeps the cache keys it always had); a later sample appends its
/// index (a sampling key is JSON or a fixed word, so it never ends like that by itself).
pub fn sample_sampling_key(sampling: &str, sample: u32) -> String {
    if sample == 0 {
        sampling.to_owned()
    } else {
        format!("{sampling}/sample={sample}")
    }
}

/// One judge's part in a response's result.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct JudgeResult {
    /// The judge's name.
    pub judge: String,
    /// `ok` when at least one sample gave valid scores, else the first failed sample's status
    /// (`judge_invalid` or `judge_error`).
    pub status: &'static str,
    /// The mean of the valid samples' rewards.
    pub reward: Option<f64>,
    /// The mean of the valid samples' raw scores, per dimension (criteria in rubric order).
    pub scores: Option<Vec<Vec<f64>>>,
    /// Samples asked.
    pub samples: u32,
    /// Samples that gave valid scores.
    pub samples_ok: u32,
    /// Judge answers asked over all samples (retries of unusable answers included).
    pub judge_attempts: u32,
    /// Calls answered by the LLM for this judgment.
    pub calls: u64,
    /// Calls answered from the cache.
    pub cached: u64,
    /// Calls that failed after their HTTP retries.
    pub failed: u64,
    /// Prompt tokens the LLM reported for these calls.
    pub prompt_tokens: u64,
    /// Completion tokens the LLM reported for these calls.
    pub completion_tokens: u64,
    /// Why the judge has no scores (its first failed sample's error).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorOut>,
}

impl JudgeResult {
    /// A result with no sample yet.
    pub fn new(judge: &str, samples: u32) -> Self {
        JudgeResult {
            judge: judge.to_owned(),
            status: crate::engine::response_status::OK,
            reward: None,
            scores: None,
            samples,
            samples_ok: 0,
            judge_attempts: 0,
            calls: 0,
            cached: 0,
            failed: 0,
            prompt_tokens: 0,
            completion_tokens: 0,
            error: None,
        }
    }

    /// Adds the cost of one sample's calls.
    pub fn add_cost(&mut self, c: &CallCounts) {
        self.calls += c.judge;
        self.cached += c.cached;
        self.failed += c.failed;
        self.prompt_tokens += c.prompt_tokens;
        self.completion_tokens += c.completion_tokens;
    }
}

/// The panel's part in a response's result (absent for a single judge without samples or
/// shuffling, whose output is what it always was).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PanelResult {
    /// Judges with valid scores.
    pub judges_ok: usize,
    /// Judges needed.
    pub quorum: usize,
    /// `max - min` of the valid judges' rewards (0 with fewer than two).
    pub reward_spread: f64,
    /// `max - min` of the valid judges' scores of each criterion, per dimension.
    pub score_spread: Option<Vec<Vec<f64>>>,
    /// `reward_spread` is above `panel.max_spread`.
    pub flagged: bool,
    /// Every judge, in configuration order.
    pub judges: Vec<JudgeResult>,
}

/// The panel's series (registered by [`crate::metrics::Metrics`]; the judge label takes the
/// configured names, at most [`crate::config::MAX_PANEL_JUDGES`] of them).
#[derive(Debug, Clone)]
pub struct PanelMetrics {
    judge_calls: Family<Labels, Counter>,
    judge_tokens: Family<Labels, Counter>,
    judge_results: Family<Labels, Counter>,
    flagged: Counter,
    spread: Family<Labels, Histogram, fn() -> Histogram>,
    agreement: Family<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    agreement_units: Family<Labels, Gauge>,
}

fn spread_histogram() -> Histogram {
    Histogram::new([0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0])
}

impl Default for PanelMetrics {
    fn default() -> Self {
        PanelMetrics {
            judge_calls: Family::default(),
            judge_tokens: Family::default(),
            judge_results: Family::default(),
            flagged: Counter::default(),
            spread: Family::new_with_constructor(spread_histogram),
            agreement: Family::default(),
            agreement_units: Family::default(),
        }
    }
}

impl PanelMetrics {
    /// Registers every series in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "judge_calls",
            "Judge calls of a panel, by judge and source (llm, cache, failed)",
            self.judge_calls.clone(),
        );
        registry.register(
            "judge_tokens",
            "Tokens the LLM reported for a panel's judge calls, by judge and kind (prompt, completion)",
            self.judge_tokens.clone(),
        );
        registry.register(
            "panel_judge_results",
            "Judges' results per response, by judge and status (ok, judge_invalid, judge_error)",
            self.judge_results.clone(),
        );
        registry.register(
            "panel_flagged",
            "Responses whose judges' rewards spread by more than panel.max_spread",
            self.flagged.clone(),
        );
        registry.register(
            "panel_reward_spread",
            "Spread (max - min) of the judges' rewards per response, by aggregate",
            self.spread.clone(),
        );
        registry.register(
            "panel_agreement",
            "Krippendorff's alpha (interval) between the judges since the start, by level (reward: units are responses; score: units are a response's criteria); NaN while undefined",
            self.agreement.clone(),
        );
        registry.register(
            "panel_agreement_units",
            "Pairable units (rated by two judges or more) in panel_agreement, by level",
            self.agreement_units.clone(),
        );
        for level in ["reward", "score"] {
            self.agreement
                .get_or_create(&vec![("level", level.to_owned())])
                .set(f64::NAN);
        }
    }

    /// The calls of one judgment of `judge`.
    pub fn judge_cost(&self, judge: &str, c: &CallCounts) {
        for (source, n) in [("llm", c.judge), ("cache", c.cached), ("failed", c.failed)] {
            if n > 0 {
                self.judge_calls
                    .get_or_create(&vec![
                        ("judge", judge.to_owned()),
                        ("source", source.to_owned()),
                    ])
                    .inc_by(n);
            }
        }
        for (kind, n) in [
            ("prompt", c.prompt_tokens),
            ("completion", c.completion_tokens),
        ] {
            if n > 0 {
                self.judge_tokens
                    .get_or_create(&vec![
                        ("judge", judge.to_owned()),
                        ("kind", kind.to_owned()),
                    ])
                    .inc_by(n);
            }
        }
    }

    /// One response's panel result.
    pub fn response(&self, p: &PanelResult, aggregate: Aggregate) {
        for j in &p.judges {
            self.judge_results
                .get_or_create(&vec![
                    ("judge", j.judge.clone()),
                    ("status", j.status.to_owned()),
                ])
                .inc();
        }
        if p.flagged {
            self.flagged.inc();
        }
        if p.judges_ok >= 2 {
            let name = match aggregate {
                Aggregate::Mean => "mean",
                Aggregate::Median => "median",
                Aggregate::TrimmedMean => "trimmed_mean",
            };
            self.spread
                .get_or_create(&vec![("aggregate", name.to_owned())])
                .observe(p.reward_spread);
        }
    }

    /// The run's agreement so far.
    pub fn agreement(&self, level: &'static str, a: &Alpha) {
        let labels = vec![("level", level.to_owned())];
        self.agreement
            .get_or_create(&labels)
            .set(a.value().unwrap_or(f64::NAN));
        self.agreement_units
            .get_or_create(&labels)
            .set(i64::try_from(a.units()).unwrap_or(i64::MAX));
    }
}

/// OpenRLHF `extra_logs` of a panel, one number per sample (`None`: not judged by the panel):
/// `care_panel_spread` (the reward spread, 0 when not judged) and `care_panel_flagged` (1 or 0).
pub fn extra_logs(
    per_sample: &[Option<&PanelResult>],
) -> serde_json::Map<String, serde_json::Value> {
    let spread: Vec<f64> = per_sample
        .iter()
        .map(|p| p.map_or(0.0, |p| p.reward_spread))
        .collect();
    let flagged: Vec<f64> = per_sample
        .iter()
        .map(|p| {
            if p.is_some_and(|p| p.flagged) {
                1.0
            } else {
                0.0
            }
        })
        .collect();
    let mut m = serde_json::Map::new();
    m.insert("care_panel_spread".to_owned(), spread.into());
    m.insert("care_panel_flagged".to_owned(), flagged.into());
    m
}

/// The message of a response below the quorum: how many judges gave scores and why each of
/// the others did not.
pub fn no_quorum_message(judges: &[JudgeResult], quorum: usize) -> String {
    let ok = judges.iter().filter(|j| j.reward.is_some()).count();
    let mut s = format!(
        "{ok} of {} judges gave valid scores, the quorum is {quorum}; failed:",
        judges.len()
    );
    let mut first = true;
    for j in judges.iter().filter(|j| j.reward.is_none()) {
        let _ = write!(
            s,
            "{} {} ({}{})",
            if first { "" } else { ";" },
            j.judge,
            j.status,
            j.error
                .as_ref()
                .map_or(String::new(), |e| format!(": {}: {}", e.code, e.message))
        );
        first = false;
    }
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn eq(a: &[(f64, f64)], how: Aggregate, t: f64, want: f64) {
        let got = aggregate(a, how, t).unwrap();
        assert!((got - want).abs() < 1e-12, "{how:?} {a:?}: {got} != {want}");
    }

    #[test]
    fn aggregates_match_their_textbook_definitions_at_equal_weights() {
        let v = |xs: &[f64]| xs.iter().map(|&x| (x, 1.0)).collect::<Vec<_>>();
        eq(&v(&[3.0, 1.0, 2.0]), Aggregate::Mean, 0.0, 2.0);
        eq(&v(&[3.0, 1.0, 10.0]), Aggregate::Median, 0.0, 3.0);
        eq(&v(&[4.0, 1.0, 2.0, 10.0]), Aggregate::Median, 0.0, 3.0);
        // Trimmed mean with t n whole: drop that many values at each end.
        eq(
            &v(&[1.0, 2.0, 3.0, 100.0]),
            Aggregate::TrimmedMean,
            0.25,
            2.5,
        );
        eq(
            &v(&[0.0, 1.0, 2.0, 3.0, 50.0]),
            Aggregate::TrimmedMean,
            0.2,
            2.0,
        );
        // The interquartile mean of 3 values: the middle counts whole, the ends a quarter.
        eq(
            &v(&[1.0, 2.0, 9.0]),
            Aggregate::TrimmedMean,
            0.25,
            (0.25 * 1.0 + 2.0 + 0.25 * 9.0) / 1.5,
        );
        eq(&v(&[5.0, 7.0]), Aggregate::TrimmedMean, 0.0, 6.0);
        assert_eq!(aggregate(&[], Aggregate::Mean, 0.0), None);
    }

    #[test]
    fn an_aggregate_stays_between_its_values() {
        // Weighted means of equal values can round past them; the aggregate never does.
        for w in [0.1, 0.3, 0.7, 1.1, 2.9, 3.3] {
            let v = [(5.0, w), (5.0, 0.2), (5.0, 1.7)];
            for how in [Aggregate::Mean, Aggregate::Median, Aggregate::TrimmedMean] {
                assert_eq!(aggregate(&v, how, 0.25), Some(5.0), "{how:?} {w}");
            }
        }
        let nan = aggregate(&[(f64::NAN, 1.0), (1.0, 1.0)], Aggregate::Mean, 0.0).unwrap();
        assert!(nan.is_nan(), "a NaN score is not hidden");
        assert!(
            aggregate(&[(f64::NAN, 1.0)], Aggregate::Mean, 0.0)
                .unwrap()
                .is_nan()
        );
    }

    #[test]
    fn weights_act_as_repetitions() {
        // Relation: an integer weight k is the value repeated k times.
        let w = [(1.0, 2.0), (4.0, 1.0), (9.0, 3.0)];
        let rep = [
            (1.0, 1.0),
            (1.0, 1.0),
            (4.0, 1.0),
            (9.0, 1.0),
            (9.0, 1.0),
            (9.0, 1.0),
        ];
        for (how, t) in [
            (Aggregate::Mean, 0.0),
            (Aggregate::Median, 0.0),
            (Aggregate::TrimmedMean, 0.25),
            (Aggregate::TrimmedMean, 1.0 / 6.0),
        ] {
            let (a, b) = (
                aggregate(&w, how, t).unwrap(),
                aggregate(&rep, how, t).unwrap(),
            );
            assert!((a - b).abs() < 1e-12, "{how:?} {t}: {a} vs {b}");
        }
        // Scaling every weight changes nothing.
        let scaled: Vec<_> = w.iter().map(|&(x, k)| (x, k * 0.37)).collect();
        for how in [Aggregate::Mean, Aggregate::Median, Aggregate::TrimmedMean] {
            let (a, b) = (
                aggregate(&w, how, 0.25).unwrap(),
                aggregate(&scaled, how, 0.25).unwrap(),
            );
            assert!((a - b).abs() < 1e-12, "{how:?}");
        }
    }

    #[test]
    fn alpha_reproduces_krippendorffs_published_example() {
        // Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability", the example with
        // four observers, twelve units and missing values: interval alpha = 0.849.
        let units: [&[f64]; 12] = [
            &[1.0, 1.0, 1.0],
            &[2.0, 2.0, 3.0, 2.0],
            &[3.0, 3.0, 3.0, 3.0],
            &[3.0, 3.0, 3.0, 3.0],
            &[2.0, 2.0, 2.0, 2.0],
            &[1.0, 2.0, 3.0, 4.0],
            &[4.0, 4.0, 4.0, 4.0],
            &[1.0, 1.0, 2.0, 1.0],
            &[2.0, 2.0, 2.0, 2.0],
            &[5.0, 5.0, 5.0],
            &[1.0, 1.0],
            &[3.0],
        ];
        let mut a = Alpha::default();
        for u in units {
            a.add_unit(u);
        }
        assert_eq!(a.units(), 11, "the unit with one value is not pairable");
        assert_eq!(a.values(), 40);
        let alpha = a.value().unwrap();
        assert!((alpha - 0.849).abs() < 5e-4, "{alpha}");
        let mut same = Alpha::default();
        same.add_unit(&[2.0, 2.0]);
        same.add_unit(&[2.0, 2.0]);
        assert_eq!(same.value(), None, "no variation: undefined");
    }

    #[test]
    fn the_order_keeps_dimensions_together_reaches_every_place_and_is_deterministic() {
        let counts = [3, 2, 4];
        let o = criterion_order(&counts, 42);
        assert_eq!(o, criterion_order(&counts, 42));
        let blocks = order_blocks(&counts, &o).unwrap();
        assert_eq!(blocks.len(), 3);
        let mut all: Vec<usize> = o.clone();
        all.sort_unstable();
        assert_eq!(all, (0..9).collect::<Vec<_>>());
        // Every place of the list is reached by the first criterion, and every place within
        // its dimension.
        let (mut place, mut within) = ([false; 9], [false; 3]);
        for seed in 0..256 {
            let o = criterion_order(&counts, seed);
            place[o.iter().position(|&x| x == 0).unwrap()] = true;
            let b = order_blocks(&counts, &o).unwrap();
            let (_, crits) = b.iter().find(|(d, _)| *d == 0).unwrap();
            within[crits.iter().position(|&x| x == 0).unwrap()] = true;
        }
        assert_eq!(place, [true; 9]);
        assert_eq!(within, [true; 3]);
        // Dimensions of one criterion each (Kardia-R1's five) are shuffled as blocks.
        let mut first = [false; 5];
        for seed in 0..128 {
            first[criterion_order(&[1; 5], seed)[0]] = true;
        }
        assert_eq!(first, [true; 5]);
        assert_eq!(order_blocks(&counts, &[0, 3, 1, 2, 4, 5, 6, 7, 8]), None);
        assert_eq!(order_blocks(&counts, &[0, 0, 1, 3, 4, 5, 6, 7, 8]), None);
        assert_eq!(order_blocks(&counts, &[0, 1]), None);
        let m = vec![ChatMessage::new("user", "p")];
        assert_ne!(order_seed("a", "s", 0, &m), order_seed("b", "s", 0, &m));
        assert_ne!(order_seed("a", "s", 0, &m), order_seed("a", "s", 1, &m));
        assert_eq!(sample_sampling_key("k", 0), "k");
        assert_ne!(sample_sampling_key("k", 1), "k");
    }
}
