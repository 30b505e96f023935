//! Group advantages across ranks (SPEC §11): two sum-reductions, then a local finalize.
//!
//! A group's samples may live on several ranks (TRL gathers rewards across processes; a group
//! can span them). Every rank describes its *local* samples with a layout that has the same
//! `B` groups as every other rank (a group with no local samples is an empty range). Then:
//!
//! 1. [`group_partial_sums`] writes `B` [`GroupSums`]; the trainer all-reduces them with a sum
//!    (the array is `2 * B` plain `f64`s).
//! 2. [`group_partial_squares`] writes `B` centered sums of squares around the *global* group
//!    means; the trainer all-reduces them with a sum (`B` `f64`s).
//! 3. [`group_advantages_finalize`] writes the local advantages. The batch std (for
//!    [`Scale::BatchStd`](super::Scale::BatchStd)) is combined from the reduced per-group
//!    moments, so no third reduction is needed.
//!
//! Two-pass centering keeps the variance exact in the all-equal case, so the zero-variance rule
//! gives the same answer on any split.

use super::advantage::{
    AdvantageOptions, AdvantageValue, Baseline, GroupExtra, GroupInputs, GroupStats, Reweight,
    check_lengths, gpg_alpha, group_map, group_stats, range_centered_squares, range_sums, std_from,
    write_group,
};
use super::layout::GroupLayout;
use crate::{Error, Result};

/// Count and sum of a group's valid rewards on one rank; all-reduce with a sum.
///
/// Field order (C): `count: f64, sum: f64` (so `B` of them are one `f64[2 * B]` buffer).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct GroupSums {
    /// Number of valid samples (an integer stored as `f64`).
    pub count: f64,
    /// Sum of the valid rewards, accumulated in `f64`.
    pub sum: f64,
}

/// Step 1: this rank's count and sum per group, into `out[B]`.
///
/// Errors: [`Error::LengthMismatch`], [`Error::InvalidLayout`], [`Error::NonFinite`] (infinite
/// valid reward), as for [`group_advantages`](super::group_advantages).
pub fn group_partial_sums(
    rewards: &[f32],
    valid: Option<&[u8]>,
    layout: GroupLayout<'_>,
    out: &mut [GroupSums],
) -> Result<()> {
    let b = check_lengths(rewards, valid, &layout, rewards.len(), Some(out.len()))?;
    for (g, o) in out.iter_mut().enumerate().take(b) {
        let (count, sum) = range_sums(rewards, valid, layout.range(g))?;
        *o = GroupSums { count, sum };
    }
    Ok(())
}

/// Step 2: this rank's sum of squared deviations from the global group mean, into `out[B]`.
///
/// `sums[B]` are the all-reduced results of step 1.
/// Errors: as [`group_partial_sums`], plus [`Error::LengthMismatch`] for `sums`.
pub fn group_partial_squares(
    rewards: &[f32],
    valid: Option<&[u8]>,
    layout: GroupLayout<'_>,
    sums: &[GroupSums],
    out: &mut [f64],
) -> Result<()> {
    let b = check_lengths(rewards, valid, &layout, rewards.len(), Some(out.len()))?;
    if sums.len() != b {
        return Err(Error::LengthMismatch);
    }
    for (g, (o, s)) in out.iter_mut().zip(sums).enumerate() {
        let mean = if s.count > 0.0 { s.sum / s.count } else { 0.0 };
        *o = range_centered_squares(rewards, valid, layout.range(g), mean)?;
    }
    Ok(())
}

/// Step 3: the local advantages `out[N]` (and optionally the global per-group `stats[B]`) from
/// the all-reduced `sums[B]` and `m2[B]`. Every rank gets the same result for a sample as a
/// single-rank [`group_advantages`](super::group_advantages) over the whole batch (to rounding
/// of the reduction order).
///
/// [`group_advantages_finalize_with`] without external baselines.
///
/// Errors: as [`group_advantages_finalize_with`].
#[allow(clippy::too_many_arguments)] // mirrors the C ABI: one slice per buffer, no structs
pub fn group_advantages_finalize<O: AdvantageValue>(
    rewards: &[f32],
    valid: Option<&[u8]>,
    layout: GroupLayout<'_>,
    sums: &[GroupSums],
    m2: &[f64],
    opts: &AdvantageOptions,
    out: &mut [O],
    stats: Option<&mut [GroupStats]>,
) -> Result<()> {
    let inputs = GroupInputs::new(rewards, valid, layout);
    group_advantages_finalize_with(&inputs, sums, m2, opts, out, stats)
}

/// Step 3 with the per-sample inputs of [`GroupInputs`].
///
/// The baselines that need a whole group on one rank ([`Baseline::LengthWeighted`],
/// [`Baseline::PassK`]) are not available here: gather such groups on one rank and call
/// [`group_advantages_with`](super::group_advantages_with). [`Baseline::External`] takes this
/// rank's `inputs.baselines`; [`Reweight::Gpg`] is computed from the reduced moments.
/// [`Reweight::Nonzero`] needs the batch's count of nonzero rewards, which the two reductions
/// do not carry: gather the batch on one rank for it.
///
/// Errors: as [`group_advantages_with`](super::group_advantages_with);
/// [`Error::LengthMismatch`] for `sums`/`m2`; [`Error::InvalidArgument`] for a negative or
/// non-finite reduced value, a length-weighted or pass@k baseline, or [`Reweight::Nonzero`].
/// Checks run before any write.
pub fn group_advantages_finalize_with<O: AdvantageValue>(
    inputs: &GroupInputs<'_>,
    sums: &[GroupSums],
    m2: &[f64],
    opts: &AdvantageOptions,
    out: &mut [O],
    mut stats: Option<&mut [GroupStats]>,
) -> Result<()> {
    opts.validate()?;
    if matches!(opts.baseline, Baseline::LengthWeighted | Baseline::PassK)
        || opts.reweight == Reweight::Nonzero
    {
        return Err(Error::InvalidArgument);
    }
    let (rewards, valid, layout) = (inputs.rewards, inputs.valid, inputs.layout);
    let b = check_lengths(
        rewards,
        valid,
        &layout,
        out.len(),
        stats.as_deref().map(<[_]>::len),
    )?;
    if sums.len() != b || m2.len() != b {
        return Err(Error::LengthMismatch);
    }
    inputs.check(opts)?;
    let none = GroupExtra::default();
    let (mut tot_n, mut tot_sum) = (0.0f64, 0.0f64);
    for (s, &q) in sums.iter().zip(m2) {
        let ok = s.count.is_finite() && s.count >= 0.0 && s.sum.is_finite();
        if !(ok && q.is_finite() && q >= 0.0) {
            return Err(Error::InvalidArgument);
        }
        // The singleton policy's error, before any write (alpha does not matter here).
        group_map(s.count, s.sum, q, 0.0, &none, 1.0, opts)?;
        tot_n += s.count;
        tot_sum += s.sum;
    }
    // Batch moments by Chan's combination of the group moments:
    // M2 = sum_g m2_g + sum_g n_g (mean_g - mean)^2.
    let batch_std = if tot_n > 0.0 {
        let mean = tot_sum / tot_n;
        let mut q = 0.0f64;
        for (s, &m) in sums.iter().zip(m2) {
            if s.count > 0.0 {
                let d = s.sum / s.count - mean;
                q += m + s.count * d * d;
            }
        }
        std_from(q, tot_n, opts.std_kind)
    } else {
        0.0
    };
    let alpha = match opts.reweight {
        Reweight::None => 1.0,
        Reweight::Gpg => {
            let mut m = 0.0f64;
            for (s, &q) in sums.iter().zip(m2) {
                if group_map(s.count, s.sum, q, batch_std, &none, 1.0, opts)?.factor == 0.0 {
                    m += s.count;
                }
            }
            gpg_alpha(tot_n, m)
        }
        // Refused above.
        Reweight::Nonzero => return Err(Error::InvalidArgument),
    };
    for (g, (s, &q)) in sums.iter().zip(m2).enumerate() {
        let map = group_map(s.count, s.sum, q, batch_std, &none, alpha, opts)?;
        write_group(inputs, layout.range(g), &map, out)?;
        if let Some(st) = stats.as_deref_mut() {
            st[g] = group_stats(s.count, s.sum, &map);
        }
    }
    Ok(())
}
