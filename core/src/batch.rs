//! Scoring the `M` responses of one GRPO group under one shared rubric (parsed once).
//!
//! Scores are one flat slice of `M * total_criteria` raw judge scores, response-major: the
//! scores of response `j` are `scores[j * total .. (j + 1) * total]` in the rubric's flat order.
//! A response that cannot be scored under the `error` policies gets a `NaN` reward, which the
//! GRPO advantage step (SPEC §9) treats as an invalid sample; the call itself only fails on a
//! layout problem. Nothing here allocates.

use crate::reward::{Fired, ScoreOptions, policy_reward_fixed};
use crate::rubric::Rubric;
use crate::{Error, Result};

/// What happened while scoring a group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupReport {
    /// Responses with a finite reward.
    pub scored: u32,
    /// Responses that got `NaN` because a score broke an `error` policy.
    pub failed: u32,
    /// The first failure: response index and why.
    pub first_error: Option<(usize, Error)>,
    /// Policies fired, summed over the group.
    pub fired: Fired,
}

/// Eq. 5 for every response of a group under `rubric`; `out[j]` gets response `j`'s reward.
///
/// # Errors
/// [`Error::LengthMismatch`] when `scores.len() != out.len() * rubric.total_criteria()`.
pub fn score_group(
    rubric: &Rubric<'_>,
    opts: &ScoreOptions,
    scores: &[f64],
    out: &mut [f64],
) -> Result<GroupReport> {
    score_group_fixed(rubric.weights(), rubric.counts(), opts, scores, out)
}

/// [`score_group`] under caller-given weights and criteria counts per dimension (the
/// fixed-rubric ablation, and the C ABI path).
///
/// # Errors
/// As [`score_group`], with `counts` defining the per-response layout.
pub fn score_group_fixed(
    weights: [f64; 3],
    counts: [usize; 3],
    opts: &ScoreOptions,
    scores: &[f64],
    out: &mut [f64],
) -> Result<GroupReport> {
    let total = counts
        .iter()
        .try_fold(0usize, |a, &c| a.checked_add(c))
        .ok_or(Error::LengthMismatch)?;
    if out.len().checked_mul(total) != Some(scores.len()) {
        return Err(Error::LengthMismatch);
    }
    let mut report = GroupReport::default();
    // `total == 0` is allowed: every response then scores 0 (no criterion, no evidence).
    for (j, o) in out.iter_mut().enumerate() {
        let s = scores.get(j * total..(j + 1) * total).unwrap_or(&[]);
        match policy_reward_fixed(weights, counts, s, opts) {
            Ok(r) => {
                *o = r.reward;
                report.scored = report.scored.saturating_add(1);
                report.fired.merge(&r.fired);
            }
            Err(e) => {
                *o = f64::NAN;
                report.failed = report.failed.saturating_add(1);
                if report.first_error.is_none() {
                    report.first_error = Some((j, e));
                }
            }
        }
    }
    Ok(report)
}
