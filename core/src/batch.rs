//! Scoring the `M` responses of one GRPO group under one shared rubric (parsed once).
//!
//! Scores are one flat slice of `M * total_criteria` raw judge scores, response-major: the
//! scores of response `j` are `scores[j * total .. (j + 1) * total]` in the rubric's flat order.
//! A response that cannot be scored under the `error` policies gets a `NaN` reward, which the
//! GRPO advantage step (SPEC §9) treats as an invalid sample; the call itself only fails on a
//! layout problem. Nothing here allocates.

use crate::reward::{Fired, MAX_SCORE, ScoreOptions, effective_weights, policy_reward_fixed};
use crate::rubric::Rubric;
use crate::{Error, Result};

/// What happened while scoring a group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
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
/// [`Error::LengthMismatch`] when `scores.len() != out.len() * rubric.total_criteria()`;
/// [`Error::InvalidArgument`] for invalid options ([`ScoreOptions::check`]).
pub fn policy_reward_group(
    rubric: &Rubric<'_>,
    opts: &ScoreOptions,
    scores: &[f64],
    out: &mut [f64],
) -> Result<GroupReport> {
    policy_reward_group_fixed(rubric.weights(), rubric.counts(), opts, scores, out)
}

/// [`policy_reward_group`] under caller-given weights and criteria counts per dimension (the
/// fixed-rubric ablation, and the C ABI path).
///
/// # Errors
/// As [`policy_reward_group`], with `counts` defining the per-response layout.
pub fn policy_reward_group_fixed(
    weights: [f64; 3],
    counts: [usize; 3],
    opts: &ScoreOptions,
    scores: &[f64],
    out: &mut [f64],
) -> Result<GroupReport> {
    opts.validate()?;
    let total = counts
        .iter()
        .try_fold(0usize, |a, &c| a.checked_add(c))
        .ok_or(Error::LengthMismatch)?;
    if out.len().checked_mul(total) != Some(scores.len()) {
        return Err(Error::LengthMismatch);
    }
    let mut report = GroupReport::default();
    // The weights and the denominators do not depend on the response: resolve them once. A
    // response whose scores are all integers in 0..=5 (the usual case) is then scored by the
    // loop below with the same operations in the same order as `policy_reward_fixed`, so the
    // reward is bit-identical; any other response takes `policy_reward_fixed` itself, which
    // applies the missing and range policies and reports what fired.
    let mut weight_flags = Fired::default();
    let w = effective_weights(weights, opts, &mut weight_flags);
    let denom = counts.map(|n| MAX_SCORE * n as f64);
    // `total == 0` is allowed: every response then scores 0 (no criterion, no evidence).
    for (j, o) in out.iter_mut().enumerate() {
        let s = scores.get(j * total..(j + 1) * total).unwrap_or(&[]);
        if let Some(r) = plain_reward(s, counts, w, denom) {
            *o = r;
            report.scored = report.scored.saturating_add(1);
            continue;
        }
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
    if report.scored > 0 {
        // What `policy_reward_fixed` reports for every scored response.
        report.fired.merge(&weight_flags);
    }
    Ok(report)
}

/// Eq. 5 of one response whose raw scores are all integers in `0..=5`, `None` otherwise. The
/// arithmetic is that of `policy_reward_fixed` (sequential sums of the raw scores, one division
/// per dimension, the weighted sum in dimension order, the clamp).
#[inline]
fn plain_reward(s: &[f64], counts: [usize; 3], w: [f64; 3], denom: [f64; 3]) -> Option<f64> {
    let mut rest = s;
    let mut reward = 0.0;
    for ((&n, &wd), &dn) in counts.iter().zip(w.iter()).zip(denom.iter()) {
        let (dim, tail) = rest.split_at_checked(n)?;
        rest = tail;
        // Integer sums: `policy_reward_fixed` adds the same integers in f64, which is exact
        // (below 2^53), so the sum is the same number, without the latency of a
        // chain of f64 additions.
        let mut sum = 0u64;
        let mut plain = true;
        for &raw in dim {
            // `raw as u8` truncates (and saturates); equal back only for an integer in range.
            // NaN fails the range test.
            let q = raw as u8;
            plain &= (0.0..=MAX_SCORE).contains(&raw) && f64::from(q) == raw;
            sum += u64::from(q);
        }
        if !plain {
            return None;
        }
        let mean = if n > 0 { sum as f64 / dn } else { 0.0 };
        reward += wd * mean;
    }
    Some(reward.clamp(0.0, 1.0))
}
