//! CARE rewards (SPEC §7): the policy reward (Eq. 5), the preference reward (Eq. 3) and the
//! generator reward (Eq. 4).
//!
//! Scores are passed as a flat `&[f64]` of **raw** judge scores (`0..=5`), criteria in canonical
//! dimension order (Cog, Aff, Pro), each dimension in rubric order; its length is the rubric's
//! [`Rubric::total_criteria`]. `NaN` means "the judge gave no score". Nothing here allocates.

use crate::align::{Alignment, alignment};
use crate::error::{InvalidOption, domain};
use crate::format::{FormatPolicy, Validation, validate};
use crate::names::named_enum;
use crate::rubric::Rubric;
use crate::simplex::{scoring_weights, uniform};
use crate::strategy::{StrategyCounts, UnknownLabelPolicy, strategy_counts};
use crate::{Error, Result};

/// The highest raw judge score; normalized score is `raw / MAX_SCORE`.
pub const MAX_SCORE: f64 = 5.0;

/// What to do when a criterion has no score (`NaN`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MissingPolicy {
    /// Fail with [`Error::MissingScore`] (default).
    #[default]
    Error,
    /// Score it 0.
    Zero,
    /// Drop it from its dimension's mean; a dimension left empty contributes 0.
    Skip,
}

named_enum!(MissingPolicy, "missing-score policy", {
    Error => "error", "Fail with missing_score";
    Zero => "zero", "Score it 0";
    Skip => "skip", "Drop it from its dimension's mean";
});

/// What to do with a score outside `0..=5` or not an integer (including `±inf`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RangePolicy {
    /// Fail with [`Error::ScoreOutOfRange`] (default).
    #[default]
    Error,
    /// Round to the nearest integer, then clamp to `0..=5`.
    Clamp,
}

named_enum!(RangePolicy, "out-of-range policy", {
    Error => "error", "Fail with score_out_of_range";
    Clamp => "clamp", "Round to the nearest integer, then clamp to 0..=5";
});

/// Options shared by every score-based reward.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(deny_unknown_fields)
)]
pub struct ScoreOptions {
    /// Missing-score policy.
    pub missing: MissingPolicy,
    /// Out-of-range / non-integral score policy.
    pub out_of_range: RangePolicy,
    /// Ablation: ignore the rubric's weights and use `1/3` each (paper Table 3).
    pub uniform_weights: bool,
}

impl ScoreOptions {
    /// Checks the fields. Every combination of the policies is valid, so this always succeeds;
    /// it exists (and the scoring functions call it) so that every options struct has the same
    /// shape and a field added later gets its check in one place.
    ///
    /// # Errors
    /// None today.
    pub const fn check(&self) -> core::result::Result<(), InvalidOption> {
        Ok(())
    }

    /// [`ScoreOptions::check`] as an [`Error`].
    ///
    /// # Errors
    /// None today.
    pub const fn validate(&self) -> Result<()> {
        Ok(())
    }
}

/// Which policies fired while scoring (no silent defaults). Counts add up across calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Fired {
    /// Missing scores replaced by 0 ([`MissingPolicy::Zero`]).
    pub missing_zeroed: u32,
    /// Missing scores dropped ([`MissingPolicy::Skip`]); for Eq. 3, criteria pairs dropped.
    pub missing_skipped: u32,
    /// Scores rounded and/or clamped ([`RangePolicy::Clamp`]).
    pub clamped: u32,
    /// The stored weights were not used as-is (off the simplex: L1-normalized or uniform).
    pub weights_adjusted: bool,
    /// Uniform weights were used ([`ScoreOptions::uniform_weights`]).
    pub uniform_weights: bool,
}

impl Fired {
    /// `true` when any policy changed the input.
    pub fn any(&self) -> bool {
        self.missing_zeroed > 0
            || self.missing_skipped > 0
            || self.clamped > 0
            || self.weights_adjusted
            || self.uniform_weights
    }

    /// Adds the counts of `other` (flags are or-ed).
    pub fn merge(&mut self, other: &Fired) {
        self.missing_zeroed = self.missing_zeroed.saturating_add(other.missing_zeroed);
        self.missing_skipped = self.missing_skipped.saturating_add(other.missing_skipped);
        self.clamped = self.clamped.saturating_add(other.clamped);
        self.weights_adjusted |= other.weights_adjusted;
        self.uniform_weights |= other.uniform_weights;
    }
}

/// Resolves one raw score under `opts`: `Ok(None)` when skipped, else the raw value in `0..=5`.
pub(crate) fn resolve_raw(raw: f64, opts: &ScoreOptions, fired: &mut Fired) -> Result<Option<f64>> {
    resolve_raw_in(raw, 0.0, MAX_SCORE, opts, fired)
}

/// [`resolve_raw`] for integer scores in `lo..=hi` (rubric profiles with their own scale).
pub(crate) fn resolve_raw_in(
    raw: f64,
    lo: f64,
    hi: f64,
    opts: &ScoreOptions,
    fired: &mut Fired,
) -> Result<Option<f64>> {
    if raw.is_nan() {
        return match opts.missing {
            MissingPolicy::Error => Err(Error::MissingScore),
            MissingPolicy::Zero => {
                fired.missing_zeroed = fired.missing_zeroed.saturating_add(1);
                Ok(Some(0.0))
            }
            MissingPolicy::Skip => {
                fired.missing_skipped = fired.missing_skipped.saturating_add(1);
                Ok(None)
            }
        };
    }
    let in_range = (lo..=hi).contains(&raw) && libm::round(raw) == raw;
    if in_range {
        return Ok(Some(raw));
    }
    match opts.out_of_range {
        RangePolicy::Error => Err(Error::ScoreOutOfRange),
        RangePolicy::Clamp => {
            fired.clamped = fired.clamped.saturating_add(1);
            Ok(Some(libm::round(raw).clamp(lo, hi)))
        }
    }
}

/// The weights to score with, and whether that changed them.
pub(crate) fn effective_weights(
    weights: [f64; 3],
    opts: &ScoreOptions,
    fired: &mut Fired,
) -> [f64; 3] {
    if opts.uniform_weights {
        fired.uniform_weights = true;
        return uniform();
    }
    let w = scoring_weights(weights);
    if w != weights {
        fired.weights_adjusted = true;
    }
    w
}

pub(crate) fn check_counts(counts: [usize; 3], len: usize) -> Result<()> {
    let total = counts
        .iter()
        .try_fold(0usize, |a, &c| a.checked_add(c))
        .ok_or(Error::ScoreShape)?;
    if total != len {
        return Err(Error::ScoreShape);
    }
    Ok(())
}

/// The policy reward of one response with what produced it.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PolicyReward {
    /// `r_theta = sum_d w_d * mean_i s_{d,i}`, in `[0, 1]`.
    pub reward: f64,
    /// Per-dimension mean normalized score (0 for a dimension with no scored criterion).
    pub dim_means: [f64; 3],
    /// The weights used (on the simplex).
    pub weights: [f64; 3],
    /// Which policies fired.
    pub fired: Fired,
}

/// Eq. 5 for a rubric: `r_theta = sum_d w_d * mean_i (raw_{d,i} / 5)`.
///
/// # Errors
/// [`Error::ScoreShape`] when `scores.len() != rubric.total_criteria()`; [`Error::MissingScore`]
/// and [`Error::ScoreOutOfRange`] under the `error` policies.
pub fn policy_reward(
    rubric: &Rubric<'_>,
    scores: &[f64],
    opts: &ScoreOptions,
) -> Result<PolicyReward> {
    policy_reward_fixed(rubric.weights(), rubric.counts(), scores, opts)
}

/// Eq. 5 under a caller-given fixed rubric given by its weights and criteria counts per dimension
/// (the paper's fixed-rubric ablation; also the path of the C ABI and of [`crate::batch`]).
///
/// # Errors
/// As [`policy_reward`], with `counts` defining the layout of `scores`.
pub fn policy_reward_fixed(
    weights: [f64; 3],
    counts: [usize; 3],
    scores: &[f64],
    opts: &ScoreOptions,
) -> Result<PolicyReward> {
    opts.validate()?;
    check_counts(counts, scores.len())?;
    let mut fired = Fired::default();
    let w = effective_weights(weights, opts, &mut fired);
    let mut dim_means = [0.0; 3];
    let mut rest = scores;
    let mut reward = 0.0;
    for ((&n, mean), &wd) in counts.iter().zip(dim_means.iter_mut()).zip(w.iter()) {
        let (dim, tail) = rest.split_at(n.min(rest.len()));
        rest = tail;
        // Sum the raw integer scores first: exact, so the result does not depend on the order
        // of the criteria; one division then normalizes.
        let (mut sum, mut k) = (0.0, 0usize);
        for &raw in dim {
            if let Some(v) = resolve_raw(raw, opts, &mut fired)? {
                sum += v;
                k += 1;
            }
        }
        if k > 0 {
            *mean = sum / (MAX_SCORE * k as f64);
        }
        reward += wd * *mean;
    }
    // Rounding of the weighted sum can exceed 1 by an ulp; the contract says [0, 1].
    Ok(PolicyReward {
        reward: reward.clamp(0.0, 1.0),
        dim_means,
        weights: w,
        fired,
    })
}

/// Checks one real-valued score: finite and in `lo..=hi` (any real value between, not only
/// the integers).
pub(crate) fn check_real_in(raw: f64, lo: f64, hi: f64) -> Result<f64> {
    if !raw.is_finite() {
        return Err(Error::NonFinite);
    }
    if !(lo..=hi).contains(&raw) {
        return Err(Error::ScoreOutOfRange);
    }
    Ok(raw)
}

/// Eq. 5 for real-valued scores: `r_theta = sum_d w_d * mean_i (s_{d,i} / 5)` where each
/// `s_{d,i}` is any real number in `0..=5`, not only an integer (a judge panel's per-criterion
/// aggregate of its judges' scores, for instance).
///
/// Unlike [`policy_reward`], nothing is repaired: the missing-score and out-of-range policies
/// do not apply (a score is either usable or the call fails), and `opts` contributes only
/// [`ScoreOptions::uniform_weights`]. For integer scores the result equals [`policy_reward`]'s
/// under the `error` policies bit for bit (the same sums in the same order).
///
/// # Errors
/// [`Error::ScoreShape`] when `scores.len() != rubric.total_criteria()`; [`Error::NonFinite`]
/// for a `NaN` (no score) or infinite score; [`Error::ScoreOutOfRange`] for a finite score
/// outside `0..=5`.
pub fn reward_from_real_scores(
    rubric: &Rubric<'_>,
    scores: &[f64],
    opts: &ScoreOptions,
) -> Result<PolicyReward> {
    opts.validate()?;
    let counts = rubric.counts();
    check_counts(counts, scores.len())?;
    let mut fired = Fired::default();
    let w = effective_weights(rubric.weights(), opts, &mut fired);
    let mut dim_means = [0.0; 3];
    let mut rest = scores;
    let mut reward = 0.0;
    for ((&n, mean), &wd) in counts.iter().zip(dim_means.iter_mut()).zip(w.iter()) {
        let (dim, tail) = rest.split_at(n.min(rest.len()));
        rest = tail;
        let mut sum = 0.0;
        for &raw in dim {
            sum += check_real_in(raw, 0.0, MAX_SCORE)?;
        }
        if n > 0 {
            *mean = sum / (MAX_SCORE * n as f64);
        }
        reward += wd * *mean;
    }
    Ok(PolicyReward {
        reward: reward.clamp(0.0, 1.0),
        dim_means,
        weights: w,
        fired,
    })
}

/// The score scale of Eq. 3.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ScoreScale {
    /// Differences of normalized scores `raw / 5` (default, SPEC §7).
    #[default]
    Normalized,
    /// Differences of raw `0..=5` scores (saturates quickly with `tau = 0.7`).
    Raw,
}

named_enum!(ScoreScale, "score scale", {
    Normalized => "normalized", "Differences of normalized scores raw / 5";
    Raw => "raw", "Differences of raw 0..=5 scores";
});

/// Options of the preference reward (Eq. 3).
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(deny_unknown_fields)
)]
pub struct PreferenceOptions {
    /// Temperature `tau`, finite and `> 0` (default 0.7).
    pub tau: f64,
    /// Score scale (default normalized).
    pub scale: ScoreScale,
}

impl PreferenceOptions {
    /// The paper defaults: `tau = 0.7`, normalized scores.
    pub const PAPER: PreferenceOptions = PreferenceOptions {
        tau: 0.7,
        scale: ScoreScale::Normalized,
    };

    /// Checks the fields: `tau` finite and `> 0`.
    ///
    /// # Errors
    /// The first field outside its domain.
    pub fn check(&self) -> core::result::Result<(), InvalidOption> {
        InvalidOption::require(
            domain::finite_positive(self.tau),
            "tau",
            domain::FINITE_POSITIVE,
        )
    }

    /// [`PreferenceOptions::check`] as an [`Error`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when a field is outside its domain.
    pub fn validate(&self) -> Result<()> {
        self.check().map_err(Error::from)
    }
}

impl Default for PreferenceOptions {
    fn default() -> Self {
        Self::PAPER
    }
}

/// The preference reward with what produced it.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PreferenceReward {
    /// `r_pref = sum_d w_d * mean_i tanh((s+ - s-) / tau)`, in `(-1, 1)`.
    pub reward: f64,
    /// Per-dimension mean of `tanh((s+ - s-) / tau)` (0 for an empty dimension).
    pub dim_means: [f64; 3],
    /// The weights used (on the simplex).
    pub weights: [f64; 3],
    /// Which policies fired (over both score slices).
    pub fired: Fired,
}

/// Eq. 3 for a rubric: chosen and rejected flat score slices, both of length
/// `rubric.total_criteria()`. Under [`MissingPolicy::Skip`] a criterion is dropped when either
/// side lacks a score, which keeps the reward antisymmetric.
///
/// # Errors
/// [`Error::InvalidArgument`] for invalid options ([`PreferenceOptions::check`]); otherwise as
/// [`policy_reward`].
pub fn preference_reward(
    rubric: &Rubric<'_>,
    chosen: &[f64],
    rejected: &[f64],
    score: &ScoreOptions,
    pref: &PreferenceOptions,
) -> Result<PreferenceReward> {
    preference_reward_fixed(
        rubric.weights(),
        rubric.counts(),
        chosen,
        rejected,
        score,
        pref,
    )
}

/// Eq. 3 under fixed weights and criteria counts (see [`policy_reward_fixed`]).
///
/// # Errors
/// As [`preference_reward`].
pub fn preference_reward_fixed(
    weights: [f64; 3],
    counts: [usize; 3],
    chosen: &[f64],
    rejected: &[f64],
    score: &ScoreOptions,
    pref: &PreferenceOptions,
) -> Result<PreferenceReward> {
    score.validate()?;
    pref.validate()?;
    check_counts(counts, chosen.len())?;
    check_counts(counts, rejected.len())?;
    let mut fired = Fired::default();
    let w = effective_weights(weights, score, &mut fired);
    let div = match pref.scale {
        ScoreScale::Normalized => MAX_SCORE,
        ScoreScale::Raw => 1.0,
    };
    let mut dim_means = [0.0; 3];
    let (mut rc, mut rr) = (chosen, rejected);
    let mut reward = 0.0;
    for ((&n, mean), &wd) in counts.iter().zip(dim_means.iter_mut()).zip(w.iter()) {
        let (c, ct) = rc.split_at(n.min(rc.len()));
        let (r, rt) = rr.split_at(n.min(rr.len()));
        rc = ct;
        rr = rt;
        let (mut sum, mut k) = (0.0, 0usize);
        for (&a, &b) in c.iter().zip(r.iter()) {
            let a = resolve_raw(a, score, &mut fired)?;
            let b = resolve_raw(b, score, &mut fired)?;
            if let (Some(a), Some(b)) = (a, b) {
                sum += libm::tanh((a / div - b / div) / pref.tau);
                k += 1;
            }
        }
        if k > 0 {
            *mean = sum / k as f64;
        }
        reward += wd * *mean;
    }
    Ok(PreferenceReward {
        // As in Eq. 5, rounding can pass 1 by an ulp (found by fuzzing); clamp is odd, so
        // antisymmetry is kept.
        reward: reward.clamp(-1.0, 1.0),
        dim_means,
        weights: w,
        fired,
    })
}

/// Options of the generator reward (Eq. 4).
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(deny_unknown_fields)
)]
pub struct GeneratorOptions {
    /// Weight of `r_align`, finite (default 0.1).
    pub lambda: f64,
    /// Weight of `r_fmt`, finite (default 0.3).
    pub gamma: f64,
    /// Options of `r_pref`.
    pub preference: PreferenceOptions,
    /// Score policies of `r_pref`.
    pub score: ScoreOptions,
    /// The format contract behind `r_fmt`.
    pub format: FormatPolicy,
    /// Unknown tactic labels.
    pub labels: UnknownLabelPolicy,
}

impl GeneratorOptions {
    /// The paper defaults: `lambda = 0.1`, `gamma = 0.3`, `tau = 0.7`, paper format policy.
    pub const PAPER: GeneratorOptions = GeneratorOptions {
        lambda: 0.1,
        gamma: 0.3,
        preference: PreferenceOptions::PAPER,
        score: ScoreOptions {
            missing: MissingPolicy::Error,
            out_of_range: RangePolicy::Error,
            uniform_weights: false,
        },
        format: FormatPolicy::PAPER,
        labels: UnknownLabelPolicy::Error,
    };
}

impl GeneratorOptions {
    /// Checks the fields: `lambda` and `gamma` finite, then the nested preference, score and
    /// format options.
    ///
    /// # Errors
    /// The first field outside its domain.
    pub fn check(&self) -> core::result::Result<(), InvalidOption> {
        InvalidOption::require(self.lambda.is_finite(), "lambda", domain::FINITE)?;
        InvalidOption::require(self.gamma.is_finite(), "gamma", domain::FINITE)?;
        self.preference.check()?;
        self.score.check()?;
        self.format.check()
    }

    /// [`GeneratorOptions::check`] as an [`Error`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when a field is outside its domain.
    pub fn validate(&self) -> Result<()> {
        self.check().map_err(Error::from)
    }
}

impl Default for GeneratorOptions {
    fn default() -> Self {
        Self::PAPER
    }
}

/// The generator reward and its parts.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct GeneratorReward {
    /// `r_phi = r_pref + lambda * r_align + gamma * r_fmt`.
    pub reward: f64,
    /// Eq. 3 on the parsed rubric (0 when it did not parse).
    pub r_pref: f64,
    /// SPEC §6 on the parsed rubric (0 when it did not parse).
    pub r_align: f64,
    /// 1 when the text passes the format contract, else 0.
    pub r_fmt: f64,
    /// Whether the rubric parsed at all.
    pub parsed: bool,
    /// Number of format violations found (capped by the report capacity).
    pub violations: u32,
    /// Strategy counts of the chosen tactics.
    pub counts: StrategyCounts,
    /// The alignment details (default-aligned when the rubric did not parse).
    pub alignment: Alignment,
    /// Policies fired while computing `r_pref`.
    pub fired: Fired,
}

/// Eq. 4 from the raw rubric text: validates it (strings with escapes are decoded into
/// `scratch`), then scores. `chosen` and `rejected` are flat score slices over the parsed
/// rubric's criteria (ignored when it does not parse).
///
/// # Errors
/// [`Error::InvalidArgument`] for invalid options ([`GeneratorOptions::check`]);
/// [`Error::UnknownLabel`] under the `error` label policy; score errors as
/// [`preference_reward`].
pub fn generator_reward<S: AsRef<str>>(
    rubric_text: &[u8],
    scratch: &mut [u8],
    chosen: &[f64],
    rejected: &[f64],
    chosen_tactics: &[S],
    opts: &GeneratorOptions,
) -> Result<GeneratorReward> {
    opts.validate()?;
    let v = validate(rubric_text, &opts.format, scratch)?;
    generator_reward_validated(&v, chosen, rejected, chosen_tactics, opts)
}

/// Eq. 4 from an existing [`Validation`] (so a caller can also show its report). The format
/// policy in `opts` is checked with the rest of `opts` but not used here; `v` was produced
/// under whatever policy the caller chose.
///
/// # Errors
/// As [`generator_reward`].
pub fn generator_reward_validated<S: AsRef<str>>(
    v: &Validation<'_>,
    chosen: &[f64],
    rejected: &[f64],
    chosen_tactics: &[S],
    opts: &GeneratorOptions,
) -> Result<GeneratorReward> {
    opts.validate()?;
    let counts = strategy_counts(chosen_tactics, opts.labels)?;
    let r_fmt = v.r_fmt();
    let violations = u32::try_from(v.report.violations().len()).unwrap_or(u32::MAX);
    let Some(rubric) = v.rubric.as_ref() else {
        return Ok(GeneratorReward {
            reward: opts.gamma * r_fmt,
            r_pref: 0.0,
            r_align: 0.0,
            r_fmt,
            parsed: false,
            violations,
            counts,
            alignment: Alignment {
                reward: 0.0,
                top_violation: false,
                zero_violations: 0,
            },
            fired: Fired::default(),
        });
    };
    let p = preference_reward(rubric, chosen, rejected, &opts.score, &opts.preference)?;
    let a = alignment(rubric.weights(), counts.counts);
    Ok(GeneratorReward {
        reward: p.reward + opts.lambda * a.reward + opts.gamma * r_fmt,
        r_pref: p.reward,
        r_align: a.reward,
        r_fmt,
        parsed: true,
        violations,
        counts,
        alignment: a,
        fired: p.fired,
    })
}
