//! Profile rewards: one response, and the responses of one GRPO group.
//!
//! Scores are a flat `&[f64]` of raw judge scores in the profile's range, dimensions in profile
//! order, each dimension's criteria in order (for a generated rubric, the rubric's flat order);
//! `NaN` means "no score" and the missing-score policy of [`ScoreOptions`] decides. The
//! arithmetic of an unweighted dimension is that of [`crate::reward::policy_reward`] (sum the
//! raw integer scores, one division), so the `care` profile reproduces it bit for bit.

use super::{CritLayout, MAX_DIMENSIONS, OutputCheck, Profile, RubricSource, normalize_label};
use crate::reward::{Fired, ScoreOptions, check_real_in, resolve_raw_in};
use crate::rubric::Rubric;
use crate::{Error, Result};

/// The reward of one response under a profile, with what produced it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProfileReward {
    /// `r = r_fmt * (1 - veto) * ((1 - lambda) * rubric_reward + lambda * r_emo)`, in `[0, 1]`.
    pub reward: f64,
    /// `r_fmt`: 1 when the output has the profile's format, else 0.
    pub format_reward: f64,
    /// `false` when the output is malformed: the reward is 0 and the scores were not read, so
    /// a trainer can skip the judge call.
    pub judge_needed: bool,
    /// `sum_d w_d * v_d`, in `[0, 1]` (0 when the scores were not read).
    pub rubric_reward: f64,
    /// Whether the emotion span matches the gold label (`None` without an emotion term, or when
    /// the output has no emotion span).
    pub emotion_correct: Option<bool>,
    /// The first dimension (profile order) whose veto fired, if any.
    pub vetoed_by: Option<u8>,
    dims: u8,
    dim_values: [f64; MAX_DIMENSIONS],
    weights: [f64; MAX_DIMENSIONS],
    /// Which scoring policies fired.
    pub fired: Fired,
}

impl ProfileReward {
    /// The value `v_d` of each dimension, in `[0, 1]`, profile order (all 0 when the scores
    /// were not read).
    pub fn dim_values(&self) -> &[f64] {
        self.dim_values.get(..usize::from(self.dims)).unwrap_or(&[])
    }

    /// The dimension weights used (on the simplex), profile order.
    pub fn weights(&self) -> &[f64] {
        self.weights.get(..usize::from(self.dims)).unwrap_or(&[])
    }
}

/// What happened while scoring a group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProfileGroupReport {
    /// Responses with a finite reward (malformed ones included: they score 0).
    pub scored: u32,
    /// Of those, responses whose output is malformed (reward 0, judge not needed).
    pub malformed: u32,
    /// Of those, responses whose reward a veto set to 0.
    pub vetoed: u32,
    /// Responses whose emotion span matches the gold label.
    pub emotion_correct: u32,
    /// Responses that got `NaN` because a score broke an `error` policy.
    pub failed: u32,
    /// The first failure: response index and why.
    pub first_error: Option<(usize, Error)>,
    /// Policies fired, summed over the group.
    pub fired: Fired,
}

/// How scores are read: judge scores (integers, under the score policies) or real values (a
/// panel's per-criterion aggregates: finite and in range, no policy).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scores {
    Integer,
    Real,
}

/// The profile and rubric resolved once for any number of responses.
struct Resolved<'p> {
    n: usize,
    counts: [usize; MAX_DIMENSIONS],
    total: usize,
    /// Effective dimension weights (on the simplex).
    weights: [f64; MAX_DIMENSIONS],
    weight_flags: Fired,
    /// Per-criterion weights of a fixed profile (empty for a generated rubric: all equal).
    criteria: &'p [CritLayout],
    /// Per dimension: all criterion weights equal and positive (the plain mean).
    equal: [bool; MAX_DIMENSIONS],
    /// Per dimension: the veto's minimum raw score.
    veto: [Option<f64>; MAX_DIMENSIONS],
    lo: f64,
    hi: f64,
}

impl<'p> Resolved<'p> {
    fn new(
        profile: &'p Profile<'_>,
        rubric: Option<&Rubric<'_>>,
        opts: &ScoreOptions,
    ) -> Result<Self> {
        let (counts, total) = profile.counts(rubric)?;
        let layout = profile.layout();
        let n = layout.dims.len();
        let mut raw = [0.0; MAX_DIMENSIONS];
        let mut equal = [true; MAX_DIMENSIONS];
        let criteria: &[CritLayout] = match (profile.rubric_source(), rubric) {
            (RubricSource::Generated, Some(r)) => {
                for (slot, w) in raw.iter_mut().zip(r.weights()) {
                    *slot = w;
                }
                &[]
            }
            _ => {
                for ((slot, eq), d) in raw.iter_mut().zip(equal.iter_mut()).zip(&layout.dims) {
                    *slot = d.weight;
                    *eq = d.equal_weights;
                }
                &layout.criteria
            }
        };
        let mut weight_flags = Fired::default();
        let mut weights = [0.0; MAX_DIMENSIONS];
        effective_weights(
            raw.get(..n).unwrap_or(&[]),
            opts,
            &mut weight_flags,
            weights.get_mut(..n).unwrap_or(&mut []),
        );
        let mut veto = [None; MAX_DIMENSIONS];
        for v in profile.vetoes() {
            if let Some(slot) = veto.get_mut(usize::from(v.dimension)) {
                *slot = Some(f64::from(v.min_score));
            }
        }
        let (lo, hi) = profile.score_range();
        Ok(Resolved {
            n,
            counts,
            total,
            weights,
            weight_flags,
            criteria,
            equal,
            veto,
            lo: f64::from(lo),
            hi: f64::from(hi),
        })
    }

    /// `sum_d w_d * v_d` of one response (clamped to `[0, 1]`), the values `v_d`, and the first
    /// dimension whose veto fired.
    fn evaluate(
        &self,
        scores: &[f64],
        mode: Scores,
        opts: &ScoreOptions,
        fired: &mut Fired,
        values: &mut [f64; MAX_DIMENSIONS],
    ) -> Result<(f64, Option<u8>)> {
        if scores.len() != self.total {
            return Err(Error::ScoreShape);
        }
        let (lo, hi) = (self.lo, self.hi);
        let resolve = |raw: f64, fired: &mut Fired| match mode {
            Scores::Integer => resolve_raw_in(raw, lo, hi, opts, fired),
            Scores::Real => check_real_in(raw, lo, hi).map(Some),
        };
        let mut rest = scores;
        let mut first = 0usize;
        let mut reward = 0.0;
        let mut vetoed = None;
        let dims = self
            .counts
            .iter()
            .zip(&self.equal)
            .zip(&self.veto)
            .zip(&self.weights)
            .zip(values.iter_mut())
            .take(self.n)
            .enumerate();
        for (d, ((((&n, &equal), &veto), &wd), slot)) in dims {
            let (dim, tail) = rest.split_at(n.min(rest.len()));
            rest = tail;
            let mut veto_hit = false;
            let value = if equal {
                // Sum the raw integer scores first (exact, independent of the criteria order),
                // then one division: the arithmetic of `policy_reward`.
                let (mut sum, mut k) = (0.0, 0usize);
                for &raw in dim {
                    if let Some(v) = resolve(raw, fired)? {
                        veto_hit |= veto.is_some_and(|m| v < m);
                        sum += v;
                        k += 1;
                    }
                }
                if k > 0 {
                    (sum - lo * k as f64) / ((hi - lo) * k as f64)
                } else {
                    0.0
                }
            } else {
                // Weighted and penalty criteria: clamp(sum_i w_i s_i / sum_{w_i > 0} w_i, 0, 1)
                // over the criteria that have a score.
                let crits = self.criteria.get(first..first + n).unwrap_or(&[]);
                let (mut num, mut den) = (0.0, 0.0);
                for (&raw, c) in dim.iter().zip(crits) {
                    if let Some(v) = resolve(raw, fired)? {
                        num += c.weight * ((v - lo) / (hi - lo));
                        if c.weight > 0.0 {
                            den += c.weight;
                            veto_hit |= veto.is_some_and(|m| v < m);
                        }
                    }
                }
                if den > 0.0 {
                    (num / den).clamp(0.0, 1.0)
                } else {
                    0.0
                }
            };
            first += n;
            if veto_hit && vetoed.is_none() {
                vetoed = u8::try_from(d).ok();
            }
            *slot = value;
            reward += wd * value;
        }
        // Rounding of the weighted sum can pass 1 by an ulp; the contract says [0, 1].
        Ok((reward.clamp(0.0, 1.0), vetoed))
    }
}

/// The weights scoring uses, for any number of dimensions: uniform under the ablation, else
/// negative or non-finite entries count as 0, then L1-normalized (uniform when nothing positive
/// is left). For three dimensions this is [`crate::simplex::scoring_weights`] operation for
/// operation (a property test checks it bit for bit).
fn effective_weights(raw: &[f64], opts: &ScoreOptions, fired: &mut Fired, out: &mut [f64]) {
    let n = raw.len();
    if opts.uniform_weights {
        fired.uniform_weights = true;
        out.fill(1.0 / n as f64);
        return;
    }
    for (o, &x) in out.iter_mut().zip(raw) {
        *o = if x.is_finite() && x > 0.0 { x } else { 0.0 };
    }
    let s: f64 = out.iter().sum();
    if s != 1.0 {
        // Divide by the maximum first so that a sum of huge finite weights cannot overflow.
        let m = out.iter().copied().fold(0.0_f64, f64::max);
        if m <= 0.0 {
            out.fill(1.0 / n as f64);
        } else {
            for x in out.iter_mut() {
                *x /= m;
            }
            let s: f64 = out.iter().sum();
            for x in out.iter_mut() {
                *x /= s;
            }
        }
    }
    if out != raw {
        fired.weights_adjusted = true;
    }
}

/// Checks the gold label an emotion term needs: present and not blank.
fn gold_label<'g>(profile: &Profile<'_>, gold: Option<&'g str>) -> Result<&'g str> {
    match (profile.emotion(), gold) {
        (None, _) => Ok(""),
        (Some(_), Some(g)) if !normalize_label(g).is_empty() => Ok(g),
        (Some(_), _) => Err(Error::InvalidArgument),
    }
}

fn reward_resolved(
    profile: &Profile<'_>,
    res: &Resolved<'_>,
    output: &OutputCheck<'_>,
    (scores, mode): (&[f64], Scores),
    gold: &str,
    opts: &ScoreOptions,
) -> Result<ProfileReward> {
    let emotion = profile.emotion();
    let emotion_correct = emotion.and_then(|e| output.span(e.span()).map(|p| e.matches(p, gold)));
    let mut r = ProfileReward {
        reward: 0.0,
        format_reward: output.format_reward(),
        judge_needed: output.judge_needed(),
        rubric_reward: 0.0,
        emotion_correct,
        vetoed_by: None,
        dims: u8::try_from(res.n).unwrap_or(u8::MAX),
        dim_values: [0.0; MAX_DIMENSIONS],
        weights: res.weights,
        fired: Fired::default(),
    };
    if !output.is_ok() {
        // Malformed: 0 whatever the judge would say, so its scores are not even read.
        return Ok(r);
    }
    let mut fired = Fired::default();
    let (rubric_reward, vetoed) =
        res.evaluate(scores, mode, opts, &mut fired, &mut r.dim_values)?;
    fired.merge(&res.weight_flags);
    let reward = match emotion {
        Some(e) => {
            let lambda = e.weight();
            let r_emo = if emotion_correct == Some(true) {
                1.0
            } else {
                0.0
            };
            (1.0 - lambda) * rubric_reward + lambda * r_emo
        }
        None => rubric_reward,
    };
    r.rubric_reward = rubric_reward;
    r.vetoed_by = vetoed;
    r.reward = if vetoed.is_some() {
        0.0
    } else {
        reward.clamp(0.0, 1.0)
    };
    r.fired = fired;
    Ok(r)
}

/// The reward of one response under `profile`.
///
/// `output` is the response's [`Profile::check_output`]; `scores` its flat raw judge scores
/// (ignored, and may be empty, when the output is malformed); `rubric` the generated rubric of a
/// generated profile (`None` for a fixed one); `gold_emotion` the gold label when the profile
/// has an emotion term.
///
/// # Errors
/// [`Error::InvalidArgument`] for a rubric that does not fit the profile, or a missing or blank
/// gold label under an emotion term; [`Error::ScoreShape`] when a well-formed output's `scores`
/// have the wrong length; [`Error::MissingScore`] and [`Error::ScoreOutOfRange`] under the
/// `error` policies.
pub fn profile_reward(
    profile: &Profile<'_>,
    rubric: Option<&Rubric<'_>>,
    output: &OutputCheck<'_>,
    scores: &[f64],
    gold_emotion: Option<&str>,
    opts: &ScoreOptions,
) -> Result<ProfileReward> {
    let res = Resolved::new(profile, rubric, opts)?;
    let gold = gold_label(profile, gold_emotion)?;
    reward_resolved(profile, &res, output, (scores, Scores::Integer), gold, opts)
}

/// [`profile_reward`] for real-valued scores: each score any real number in the profile's
/// range, not only an integer (a judge panel's per-criterion aggregate of its judges' scores,
/// for instance). The formula is the same (dimension values, weights, vetoes on the scores,
/// the emotion term, the format gate); nothing is repaired: the missing-score and
/// out-of-range policies do not apply, and `opts` contributes only
/// [`ScoreOptions::uniform_weights`]. For integer scores the result equals
/// [`profile_reward`]'s under the `error` policies.
///
/// # Errors
/// As [`profile_reward`], except that a `NaN` (no score) or infinite score is
/// [`Error::NonFinite`] and a finite score outside the range [`Error::ScoreOutOfRange`],
/// whatever the policies.
pub fn profile_reward_real(
    profile: &Profile<'_>,
    rubric: Option<&Rubric<'_>>,
    output: &OutputCheck<'_>,
    scores: &[f64],
    gold_emotion: Option<&str>,
    opts: &ScoreOptions,
) -> Result<ProfileReward> {
    let res = Resolved::new(profile, rubric, opts)?;
    let gold = gold_label(profile, gold_emotion)?;
    reward_resolved(profile, &res, output, (scores, Scores::Real), gold, opts)
}

/// The rewards of the `M` responses of one GRPO group under one profile (and, for a generated
/// profile, one rubric): `out[j]` gets the reward of `outputs[j]`, whose scores are
/// `scores[j * total .. (j + 1) * total]` (`total` = [`Profile::total_criteria`]; the rows of
/// malformed outputs are not read). A response whose scores break an `error` policy gets `NaN`
/// (an invalid sample for the advantage step); the call itself fails only on its arguments.
///
/// # Errors
/// [`Error::LengthMismatch`] when `out.len() != outputs.len()` or
/// `scores.len() != outputs.len() * total`; [`Error::InvalidArgument`] as [`profile_reward`].
pub fn profile_reward_group<S: AsRef<[u8]>>(
    profile: &Profile<'_>,
    rubric: Option<&Rubric<'_>>,
    outputs: &[S],
    scores: &[f64],
    gold_emotion: Option<&str>,
    opts: &ScoreOptions,
    out: &mut [f64],
) -> Result<ProfileGroupReport> {
    let res = Resolved::new(profile, rubric, opts)?;
    let gold = gold_label(profile, gold_emotion)?;
    if out.len() != outputs.len() || outputs.len().checked_mul(res.total) != Some(scores.len()) {
        return Err(Error::LengthMismatch);
    }
    let mut rep = ProfileGroupReport::default();
    for (j, (o, text)) in out.iter_mut().zip(outputs).enumerate() {
        let check = profile.check_output(text.as_ref());
        let row = scores
            .get(j * res.total..(j + 1) * res.total)
            .unwrap_or(&[]);
        match reward_resolved(profile, &res, &check, (row, Scores::Integer), gold, opts) {
            Ok(r) => {
                *o = r.reward;
                rep.scored = rep.scored.saturating_add(1);
                rep.malformed = rep.malformed.saturating_add(u32::from(!r.judge_needed));
                rep.vetoed = rep.vetoed.saturating_add(u32::from(r.vetoed_by.is_some()));
                rep.emotion_correct = rep
                    .emotion_correct
                    .saturating_add(u32::from(r.emotion_correct == Some(true)));
                rep.fired.merge(&r.fired);
            }
            Err(e) => {
                *o = f64::NAN;
                rep.failed = rep.failed.saturating_add(1);
                if rep.first_error.is_none() {
                    rep.first_error = Some((j, e));
                }
            }
        }
    }
    Ok(rep)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::simplex::scoring_weights;

    proptest::proptest! {
        /// Relation: for three dimensions, `effective_weights` is `simplex::scoring_weights`
        /// bit for bit, and flags an adjustment exactly when the weights changed.
        #[test]
        fn effective_weights_are_scoring_weights_for_three(
            w in proptest::array::uniform3(proptest::prop_oneof![
                4 => 0.0f64..1.0,
                1 => -10.0f64..10.0,
                1 => proptest::num::f64::ANY,
            ])
        ) {
            let mut out = [0.0; 3];
            let mut fired = Fired::default();
            effective_weights(&w, &ScoreOptions::default(), &mut fired, &mut out);
            let want = scoring_weights(w);
            proptest::prop_assert_eq!(out.map(f64::to_bits), want.map(f64::to_bits));
            proptest::prop_assert_eq!(fired.weights_adjusted, want != w);
        }
    }
}
