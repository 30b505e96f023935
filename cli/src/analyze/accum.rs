//! The report's sufficient statistics, folded from [`Record`]s in input order.
//!
//! Memory is bounded by the number of groups (variants, turns, emotions, labels), never by the
//! number of lines: each group keeps counts and streaming means ([`Welford`]), no rows.

use std::collections::BTreeMap;

use super::compare::PairStore;
use super::health::{Buckets, DEFAULT_BUCKETS, HealthAcc, Reservoir, Thresholds};
use super::record::{
    LABEL_IDS, MAX_CRITERIA, Options, Outcome, PairObs, Record, RubricObs, RubricStatus,
    VIOLATION_SLOTS,
};
use super::stats::Welford;
use super::verdict::Verdicts;
use super::vocab::{LabelSet, Valence};

/// Rubrics kept per (variant, turn) for the crossing bootstrap: a uniform sample beyond.
pub const TURN_SAMPLE: usize = 256;
/// Distinct unknown label names the report lists (the rest are counted together).
pub const MAX_UNKNOWN_NAMES: usize = 64;

/// What shapes the report beyond reading lines: comparisons, valence, health thresholds,
/// turn buckets, and the bootstrap.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Variant pairs to compare, `(A, B)`: differences are `A - B`.
    pub compare: Vec<(String, String)>,
    /// Emotion to valence; `None`: the default map for the run's emotion vocabulary.
    pub valence: Option<Valence>,
    /// Health thresholds and the judge's scale.
    pub thresholds: Thresholds,
    /// Turn buckets of the health views.
    pub buckets: Buckets,
    /// Seed of every random draw (reservoirs, bootstrap).
    pub seed: u64,
    /// Bootstrap replicates of the crossing turn.
    pub bootstrap: u32,
}

/// The default number of bootstrap replicates.
pub const DEFAULT_BOOTSTRAP: u32 = 1000;

impl Default for Settings {
    fn default() -> Self {
        Settings {
            compare: Vec::new(),
            valence: None,
            thresholds: Thresholds::default(),
            buckets: Buckets::parse(DEFAULT_BUCKETS).unwrap_or(Buckets(Vec::new())),
            seed: 0,
            bootstrap: DEFAULT_BOOTSTRAP,
        }
    }
}

/// Most distinct variants in one report; a line naming one more is skipped with
/// `too_many_variants` (each variant is a column of every table and a panel of every chart).
pub const MAX_VARIANTS: usize = 64;

/// The dominant dimension of a weight vector: 0, 1, 2 for the strict maximum, [`TIE`] when the
/// maximum is shared (compared exactly on the stored weights).
pub fn dominant(w: [f64; 3]) -> usize {
    let max = w[0].max(w[1]).max(w[2]);
    let mut at = w.iter().enumerate().filter(|(_, x)| **x == max);
    match (at.next(), at.next()) {
        (Some((i, _)), None) => i,
        _ => TIE,
    }
}

/// Index of "tie" in a dominant-dimension count array.
pub const TIE: usize = 3;

/// Mean weights and dominant-dimension counts of a group of valid rubrics.
#[derive(Clone, Debug, Default)]
pub struct WeightAcc {
    /// Streaming mean and variance per dimension.
    pub w: [Welford; 3],
    /// Rubrics whose strict maximum is Cog, Aff, Pro, and ties ([`TIE`]).
    pub dominant: [u64; 4],
}

impl WeightAcc {
    /// Adds one valid rubric's weights.
    pub fn push(&mut self, w: [f64; 3]) {
        for (acc, x) in self.w.iter_mut().zip(w) {
            acc.push(x);
        }
        self.dominant[dominant(w)] += 1;
    }

    /// Rubrics in the group.
    pub fn n(&self) -> u64 {
        self.w[0].n
    }

    /// Folds another group in (the union of both).
    pub fn merge(&mut self, other: &WeightAcc) {
        for (a, b) in self.w.iter_mut().zip(&other.w) {
            a.merge(b);
        }
        for (a, b) in self.dominant.iter_mut().zip(&other.dominant) {
            *a += b;
        }
    }
}

/// Bins of the weight-sum error `sum(w) - 1`; see [`wsum_bin`].
pub const WSUM_BINS: usize = 7;

/// The bin of `e = sum(w) - 1` under tolerance `tol`: 3 is `|e| <= tol` (passes the check);
/// below it `e < -0.1`, `-0.1 <= e < -0.01`, `-0.01 <= e < -tol`; above it the mirror images.
pub fn wsum_bin(e: f64, tol: f64) -> usize {
    let a = e.abs();
    if a.is_nan() {
        return WSUM_BINS - 1;
    }
    if a <= tol {
        return 3;
    }
    let k = if a > 0.1 {
        0
    } else if a > 0.01 {
        1
    } else {
        2
    };
    if e < 0.0 { k } else { 6 - k }
}

/// Rubric validation counts of one variant.
#[derive(Clone, Debug, Default)]
pub struct RubricAcc {
    /// Rubric observations.
    pub total: u64,
    /// `"rubric": null` (generation failed).
    pub missing: u64,
    /// Text that did not parse.
    pub unparsed: u64,
    /// Parsed rubrics.
    pub parsed: u64,
    /// Valid rubrics (`r_fmt = 1`).
    pub valid: u64,
    /// Per violation number: rubrics with the code at least once, and occurrences.
    pub codes: [(u64, u64); VIOLATION_SLOTS],
    /// Per dimension, parsed rubrics by criteria count `0..=MAX_CRITERIA`.
    pub criteria: [[u64; MAX_CRITERIA + 1]; 3],
    /// Parsed rubrics per weight-sum error bin.
    pub wsum: [u64; WSUM_BINS],
    /// Signed weight-sum error of parsed rubrics.
    pub wsum_err: Welford,
    /// Largest `|sum(w) - 1|`.
    pub wsum_max_abs: f64,
}

/// Win, tie, loss and unscored counts and the mean `r_pref` of one variant.
#[derive(Clone, Debug, Default)]
pub struct PairAcc {
    /// Counts by [`Outcome`] (win, tie, loss, unscored).
    pub outcomes: [u64; 4],
    /// `r_pref` of the pairs that have it.
    pub r_pref: Welford,
}

impl PairAcc {
    /// Pairs with an outcome other than unscored.
    pub fn scored(&self) -> u64 {
        self.outcomes[0] + self.outcomes[1] + self.outcomes[2]
    }
}

/// Tactic occurrence: responses and, per label id, responses using it.
#[derive(Clone, Debug)]
pub struct TacticAcc {
    /// Responses (lines with `tactics`).
    pub responses: u64,
    /// Responses whose tactic set holds label id `i`.
    pub uses: [u64; LABEL_IDS],
}

impl Default for TacticAcc {
    fn default() -> Self {
        TacticAcc {
            responses: 0,
            uses: [0; LABEL_IDS],
        }
    }
}

impl TacticAcc {
    fn push(&mut self, ids: &[u8]) {
        self.responses += 1;
        for &i in ids {
            if let Some(u) = self.uses.get_mut(usize::from(i)) {
                *u += 1;
            }
        }
    }
}

/// Everything kept for one variant.
#[derive(Clone, Debug, Default)]
pub struct VariantAcc {
    /// Format health.
    pub rubrics: RubricAcc,
    /// Valid rubrics, all turns and emotions.
    pub weights: WeightAcc,
    /// Valid rubrics by turn.
    pub by_turn: BTreeMap<u32, WeightAcc>,
    /// Valid rubrics by emotion index.
    pub by_emotion: Vec<WeightAcc>,
    /// Valid rubrics without `turn` / without `emotion` (not in those views).
    pub valid_without_turn: u64,
    /// See `valid_without_turn`.
    pub valid_without_emotion: u64,
    /// Preference pairs.
    pub pairs: PairAcc,
    /// Tactics of all responses.
    pub tactics: TacticAcc,
    /// Tactics by emotion index.
    pub tactics_by_emotion: Vec<TacticAcc>,
    /// Responses without `emotion` (not in the heatmap).
    pub responses_without_emotion: u64,
    /// Unknown tactic labels left out (`--unknown-label ignore`).
    pub unknown_tactics: u64,
    /// Reward health (lines from `care reward` or `care serve --log`).
    pub health: Option<HealthAcc>,
    /// A sample of the valid rubrics of each turn, for the crossing bootstrap.
    pub turn_samples: BTreeMap<u32, Reservoir<[f64; 3]>>,
}

/// One skipped line, kept as an example for the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skip {
    /// 1-based input line.
    pub line: u64,
    /// Stable error code.
    pub code: String,
    /// The message.
    pub message: String,
}

/// How many skipped lines the report quotes.
pub const SKIP_EXAMPLES: usize = 20;

/// All variants, in the order they first appear, and what was skipped.
#[derive(Clone, Debug, Default)]
pub struct Acc {
    /// Emotion labels (from the options; the index space of `by_emotion`).
    pub emotions: Vec<String>,
    /// Weight-sum tolerance of the format policy (bins of the weight-sum error).
    pub tolerance: f64,
    /// `(variant, stats)`; `None` is the lines that name no variant.
    pub variants: Vec<(Option<String>, VariantAcc)>,
    /// Lines read.
    pub lines: u64,
    /// Lines skipped, by code.
    pub skipped: BTreeMap<String, u64>,
    /// The first [`SKIP_EXAMPLES`] skipped lines.
    pub examples: Vec<Skip>,
    /// The strategy label set of the run.
    pub label_set: LabelSet,
    /// Comparisons, valence, thresholds, buckets, bootstrap.
    pub settings: Settings,
    /// The emotion-to-valence map of the run.
    pub valence: Valence,
    /// Verdicts by judge and system set.
    pub verdicts: Verdicts,
    /// Observations of compared variants by pairing key.
    pub pairs: PairStore,
    /// Unknown tactic labels left out, by name (at most [`MAX_UNKNOWN_NAMES`]).
    pub unknown_names: BTreeMap<String, u64>,
    /// Unknown labels beyond those names (and beyond the names a line keeps).
    pub unknown_other: u64,
}

impl Acc {
    /// An empty accumulator for `emotions` and the weight-sum tolerance `tolerance`.
    pub fn new(emotions: Vec<String>, tolerance: f64) -> Self {
        Acc {
            emotions,
            tolerance,
            ..Acc::default()
        }
    }

    /// An empty accumulator for a run with `opts` and `settings`.
    pub fn for_run(opts: &Options, settings: Settings) -> Self {
        let mut pairs = PairStore::default();
        for (a, b) in &settings.compare {
            for v in [a, b] {
                if !pairs
                    .variants
                    .iter()
                    .any(|x| x.as_deref() == Some(v.as_str()))
                {
                    pairs.variants.push(Some(v.clone()));
                }
            }
        }
        let valence = settings.valence.clone().unwrap_or_else(|| {
            // The default entries of the emotions the vocabulary has; cannot fail.
            Valence::new(&opts.emotions, "").unwrap_or_default()
        });
        Acc {
            emotions: opts.emotions.names().to_vec(),
            tolerance: opts.format.weight_tolerance,
            label_set: opts.label_set.clone(),
            settings,
            valence,
            pairs,
            ..Acc::default()
        }
    }

    /// Ends the input: closes what streaming left open (the last log group).
    pub fn finish(&mut self) {
        for (_, v) in &mut self.variants {
            if let Some(h) = &mut v.health {
                h.finish();
            }
        }
    }

    /// Lines skipped in all.
    pub fn skipped_lines(&self) -> u64 {
        self.skipped.values().sum()
    }

    /// Records a skipped line.
    pub fn skip(&mut self, line: u64, code: &str, message: &str) {
        self.lines += 1;
        *self.skipped.entry(code.to_owned()).or_default() += 1;
        if self.examples.len() < SKIP_EXAMPLES {
            self.examples.push(Skip {
                line,
                code: code.to_owned(),
                message: message.to_owned(),
            });
        }
    }

    /// Folds one record in; `Err((code, message))` when the line must be skipped after all
    /// (a group limit of the report).
    pub fn add(&mut self, rec: &Record) -> Result<(), (&'static str, String)> {
        let n_emotions = self.emotions.len();
        if rec.emotion.is_some_and(|e| usize::from(e) >= n_emotions) {
            return Err(("internal_error", "emotion index out of range".to_owned()));
        }
        if let Some(verdict) = &rec.verdict {
            self.verdicts.check(verdict)?;
        }
        let pos = match self.variants.iter().position(|(v, _)| *v == rec.variant) {
            Some(p) => p,
            None if self.variants.len() >= MAX_VARIANTS => {
                return Err((
                    "too_many_variants",
                    format!(
                        "more than {MAX_VARIANTS} distinct variants; a report compares at most \
                         {MAX_VARIANTS} (split the input by variant)"
                    ),
                ));
            }
            None => {
                let acc = VariantAcc {
                    by_emotion: vec![WeightAcc::default(); n_emotions],
                    tactics_by_emotion: vec![TacticAcc::default(); n_emotions],
                    ..VariantAcc::default()
                };
                self.variants.push((rec.variant.clone(), acc));
                self.variants.len() - 1
            }
        };
        if let Some(verdict) = &rec.verdict {
            self.verdicts.add(verdict);
        }
        let tol = self.tolerance;
        self.lines += 1;
        self.pairs.add(rec);
        for name in &rec.unknown_names {
            if self.unknown_names.contains_key(name) || self.unknown_names.len() < MAX_UNKNOWN_NAMES
            {
                *self.unknown_names.entry(name.clone()).or_default() += 1;
            } else {
                self.unknown_other += 1;
            }
        }
        self.unknown_other +=
            u64::from(rec.unknown_tactics).saturating_sub(rec.unknown_names.len() as u64);
        let settings = &self.settings;
        let Some((_, v)) = self.variants.get_mut(pos) else {
            return Err(("internal_error", "variant index out of range".to_owned()));
        };
        if let Some(h) = &rec.health {
            let buckets = &settings.buckets;
            let acc = v
                .health
                .get_or_insert_with(|| HealthAcc::new(buckets.0.len(), settings.seed ^ pos as u64));
            acc.add(
                h,
                rec.turn,
                rec.turn.and_then(|t| buckets.of(t)),
                settings.thresholds.scale(),
            );
        }
        if let (Some(r), Some(t)) = (&rec.rubric, rec.turn)
            && r.valid
            && let Some(w) = r.weights
        {
            let seed = settings.seed ^ ((pos as u64) << 32) ^ u64::from(t);
            v.turn_samples
                .entry(t)
                .or_insert_with(|| Reservoir::new(TURN_SAMPLE, seed))
                .push(w);
        }
        if let Some(r) = &rec.rubric {
            add_rubric(v, r, rec, tol);
        }
        if let Some(p) = &rec.pair {
            add_pair(&mut v.pairs, p);
        }
        if let Some(ids) = &rec.tactics {
            v.tactics.push(ids);
            match rec
                .emotion
                .and_then(|e| v.tactics_by_emotion.get_mut(usize::from(e)))
            {
                Some(t) => t.push(ids),
                None => v.responses_without_emotion += 1,
            }
        }
        v.unknown_tactics += u64::from(rec.unknown_tactics);
        Ok(())
    }
}

fn add_rubric(v: &mut VariantAcc, r: &RubricObs, rec: &Record, tol: f64) {
    let a = &mut v.rubrics;
    a.total += 1;
    match r.status {
        RubricStatus::Missing => a.missing += 1,
        RubricStatus::Unparsed => a.unparsed += 1,
        RubricStatus::Parsed => a.parsed += 1,
    }
    for &(code, count) in &r.codes {
        if let Some(slot) = a.codes.get_mut(usize::from(code)) {
            slot.0 += 1;
            slot.1 += u64::from(count);
        }
    }
    if let (Some(w), Some(c)) = (r.weights, r.criteria) {
        for (hist, &k) in a.criteria.iter_mut().zip(&c) {
            if let Some(slot) = hist.get_mut(usize::from(k)) {
                *slot += 1;
            }
        }
        // Summed as the validator sums them, so "within tolerance" agrees with `weight_sum`.
        let e = w.iter().sum::<f64>() - 1.0;
        a.wsum[wsum_bin(e, tol)] += 1;
        // Finite weights can still overflow the sum (category_weight 1e308 is a JSON number);
        // such a rubric is in the top bin and the maximum, not in the mean.
        if e.is_finite() {
            a.wsum_err.push(e);
        }
        a.wsum_max_abs = a.wsum_max_abs.max(e.abs());
    }
    if r.valid {
        a.valid += 1;
        if let Some(w) = r.weights {
            v.weights.push(w);
            match rec.turn {
                Some(t) => v.by_turn.entry(t).or_default().push(w),
                None => v.valid_without_turn += 1,
            }
            match rec
                .emotion
                .and_then(|e| v.by_emotion.get_mut(usize::from(e)))
            {
                Some(acc) => acc.push(w),
                None => v.valid_without_emotion += 1,
            }
        }
    }
}

fn add_pair(a: &mut PairAcc, p: &PairObs) {
    let i = match p.outcome {
        Outcome::Win => 0,
        Outcome::Tie => 1,
        Outcome::Loss => 2,
        Outcome::Unscored => 3,
    };
    a.outcomes[i] += 1;
    if let Some(r) = p.r_pref {
        a.r_pref.push(r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dominant_is_the_strict_maximum() {
        assert_eq!(dominant([0.5, 0.3, 0.2]), 0);
        assert_eq!(dominant([0.3, 0.4, 0.3]), 1);
        assert_eq!(dominant([0.2, 0.3, 0.5]), 2);
        assert_eq!(dominant([0.4, 0.4, 0.2]), TIE);
        assert_eq!(dominant([0.2, 0.4, 0.4]), TIE);
        assert_eq!(dominant([1.0 / 3.0; 3]), TIE);
        // A second-highest tie does not matter.
        assert_eq!(dominant([0.5, 0.25, 0.25]), 0);
    }

    #[test]
    fn weight_sum_bins() {
        let tol = 1e-3;
        assert_eq!(wsum_bin(0.0, tol), 3);
        assert_eq!(wsum_bin(-1e-3, tol), 3);
        assert_eq!(wsum_bin(1e-3, tol), 3);
        assert_eq!(wsum_bin(-0.005, tol), 2);
        assert_eq!(wsum_bin(-0.05, tol), 1);
        assert_eq!(wsum_bin(-0.5, tol), 0);
        assert_eq!(wsum_bin(0.005, tol), 4);
        assert_eq!(wsum_bin(0.05, tol), 5);
        assert_eq!(wsum_bin(0.5, tol), 6);
        assert_eq!(wsum_bin(f64::NAN, tol), 6, "NaN never passes the check");
    }
}
