//! Group advantages (SPEC §9): GRPO, Dr. GRPO, RLOO and the anchor presets.

use super::layout::GroupLayout;
use super::layout::validate_offsets;
use crate::error::{InvalidOption, domain};
use crate::names::named_enum;
use crate::{Error, Result};

/// What is subtracted from a reward before scaling.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Baseline {
    /// The group mean of the valid rewards (GRPO; default).
    #[default]
    Mean = 0,
    /// The mean of the *other* valid rewards of the group (RLOO):
    /// `r_i - (sum_{j != i} r_j) / (n - 1)`, computed as `n / (n - 1) * (r_i - mean)`.
    LeaveOneOut = 1,
    /// Nothing is subtracted.
    None = 2,
}

named_enum!(Baseline, "baseline", {
    Mean => "mean", "The group mean";
    LeaveOneOut => "leave_one_out", "The mean of the other samples (RLOO)";
    None => "none", "Nothing subtracted";
});

/// What the centered reward is divided by (`std + eps`), if anything.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Scale {
    /// The std of the group's valid rewards (default).
    #[default]
    GroupStd = 0,
    /// The std of all valid rewards of the batch (TRL `scale_rewards="batch"`, LitePPO).
    BatchStd = 1,
    /// No scaling (Dr. GRPO, RLOO); `eps` is unused.
    None = 2,
}

named_enum!(Scale, "scale", {
    GroupStd => "group_std", "The group's std";
    BatchStd => "batch_std", "The std of all valid rewards of the batch";
    None => "none", "No scaling";
});

/// Which variance estimator the std uses.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum StdKind {
    /// Bessel-corrected, divides by `n - 1` (default; every anchor uses it).
    #[default]
    Unbiased = 0,
    /// Divides by `n`.
    Biased = 1,
}

named_enum!(StdKind, "std estimator", {
    Unbiased => "unbiased", "Divide by n - 1";
    Biased => "biased", "Divide by n";
});

/// What a group with exactly one valid sample gets.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum SingletonPolicy {
    /// Advantage 0 (default; TRL, verl `rloo_vectorized`).
    #[default]
    Zero = 0,
    /// Baseline 0 and std 1, as verl `grpo` does: `A = r / (1 + eps)` when a scale is on,
    /// `A = r` when the scale is [`Scale::None`].
    Raw = 1,
    /// Fail with [`Error::SingletonGroup`] (OpenRLHF asserts `G > 1`).
    Error = 2,
}

named_enum!(SingletonPolicy, "singleton policy", {
    Zero => "zero", "Advantage 0";
    Raw => "raw", "Baseline 0, std 1 (verl)";
    Error => "error", "Fail with singleton_group";
});

/// Options of [`group_advantages`]. Plain `#[repr(C)]` data, mirrored by the C ABI.
///
/// Field order (C): `baseline: u32, scale: u32, std_kind: u32, singleton: u32, eps: f64`
/// (24 bytes, no padding). `A = (r - b) / (std + eps)`; see SPEC §9.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(deny_unknown_fields)
)]
pub struct AdvantageOptions {
    /// The baseline subtracted from each reward.
    pub baseline: Baseline,
    /// The scale the centered reward is divided by.
    pub scale: Scale,
    /// Biased or unbiased std.
    pub std_kind: StdKind,
    /// What a group with one valid sample gets.
    pub singleton: SingletonPolicy,
    /// Added to the std before dividing; finite and `>= 0`.
    pub eps: f64,
}

impl Default for AdvantageOptions {
    /// SPEC §9 defaults: mean baseline, group std, unbiased, `eps = 1e-6`, singleton `zero`.
    fn default() -> Self {
        AdvantageOptions {
            baseline: Baseline::Mean,
            scale: Scale::GroupStd,
            std_kind: StdKind::Unbiased,
            singleton: SingletonPolicy::Zero,
            eps: 1e-6,
        }
    }
}

/// Named option sets that reproduce an anchor trainer's advantage exactly (see the README table).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Preset {
    /// verl `grpo`: mean, group std, unbiased, `eps = 1e-6`, singleton `raw`.
    Verl = 0,
    /// TRL GRPOTrainer: mean, group std, unbiased, `eps = 1e-4`, singleton `zero`.
    Trl = 1,
    /// TRL with `scale_rewards="batch"`: like [`Preset::Trl`] with the batch std.
    TrlBatch = 2,
    /// OpenRLHF `group_norm`: mean, group std, unbiased, `eps = 1e-9`, singleton `error`.
    OpenRlhf = 3,
    /// Dr. GRPO: mean baseline, no scale; singleton `zero`.
    DrGrpo = 4,
    /// RLOO: leave-one-out baseline, no scale; singleton `zero`.
    Rloo = 5,
}

named_enum!(Preset, "advantage preset", {
    Verl => "verl", "verl grpo: mean, group std, unbiased, eps 1e-6, singleton raw";
    Trl => "trl", "TRL: mean, group std, unbiased, eps 1e-4, singleton zero";
    TrlBatch => "trl_batch", "TRL with the batch std";
    OpenRlhf => "openrlhf", "OpenRLHF group_norm: eps 1e-9, singleton error";
    DrGrpo => "dr_grpo", "Dr. GRPO: mean baseline, no scale";
    Rloo => "rloo", "RLOO: leave-one-out baseline, no scale";
});

impl AdvantageOptions {
    /// The options of a preset.
    pub const fn preset(preset: Preset) -> Self {
        let base = AdvantageOptions {
            baseline: Baseline::Mean,
            scale: Scale::GroupStd,
            std_kind: StdKind::Unbiased,
            singleton: SingletonPolicy::Zero,
            eps: 1e-6,
        };
        match preset {
            Preset::Verl => AdvantageOptions {
                singleton: SingletonPolicy::Raw,
                ..base
            },
            Preset::Trl => AdvantageOptions { eps: 1e-4, ..base },
            Preset::TrlBatch => AdvantageOptions {
                eps: 1e-4,
                scale: Scale::BatchStd,
                ..base
            },
            Preset::OpenRlhf => AdvantageOptions {
                eps: 1e-9,
                singleton: SingletonPolicy::Error,
                ..base
            },
            Preset::DrGrpo => AdvantageOptions {
                scale: Scale::None,
                ..base
            },
            Preset::Rloo => AdvantageOptions {
                baseline: Baseline::LeaveOneOut,
                scale: Scale::None,
                ..base
            },
        }
    }

    /// Checks the fields: `eps` finite and `>= 0`.
    ///
    /// # Errors
    /// The first field outside its domain.
    pub fn check(&self) -> core::result::Result<(), InvalidOption> {
        InvalidOption::require(
            domain::finite_non_negative(self.eps),
            "eps",
            domain::FINITE_NON_NEGATIVE,
        )
    }

    /// [`AdvantageOptions::check`] as an [`Error`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when a field is outside its domain.
    pub fn validate(&self) -> Result<()> {
        self.check().map_err(Error::from)
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
}

/// An advantage output element: `f32` or `f64`. Everything is computed in `f64`; `f32` output
/// rounds once at the end.
pub trait AdvantageValue: Copy + sealed::Sealed {
    /// Rounds (for `f32`, saturating with [`super::narrow_f32`]) or passes through (for `f64`)
    /// a value computed in `f64`.
    fn from_f64(x: f64) -> Self;
}

impl AdvantageValue for f32 {
    #[inline]
    fn from_f64(x: f64) -> Self {
        super::narrow_f32(x)
    }
}

impl AdvantageValue for f64 {
    #[inline]
    fn from_f64(x: f64) -> Self {
        x
    }
}

/// Per-group statistics of the valid rewards, written by [`group_advantages`].
///
/// Field order (C): `count: u32, mean: f32, std: f32, zero_variance: u32` (16 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct GroupStats {
    /// Valid samples in the group.
    pub count: u32,
    /// Mean of the valid rewards (0 for an empty group).
    pub mean: f32,
    /// Std of the valid rewards under the chosen [`StdKind`] (0 when it is undefined:
    /// fewer than 2 samples for unbiased, 0 samples for biased).
    pub std: f32,
    /// 1 when the group has at least one valid sample and all valid rewards are exactly equal
    /// (a singleton counts: it carries no relative signal), else 0.
    pub zero_variance: u32,
}

/// Whether sample `i` takes part in the statistics: valid-mask bit set and reward not NaN.
/// An infinite reward on a valid sample is an error: it would poison its whole group.
#[inline]
pub(super) fn sample_valid(rewards: &[f32], valid: Option<&[u8]>, i: usize) -> Result<bool> {
    let r = rewards[i];
    let masked_in = valid.is_none_or(|v| v[i] != 0);
    if !masked_in || r.is_nan() {
        return Ok(false);
    }
    if r.is_infinite() {
        return Err(Error::NonFinite);
    }
    Ok(true)
}

/// Count and `f64` sum of the valid rewards in `range`.
pub(super) fn range_sums(
    rewards: &[f32],
    valid: Option<&[u8]>,
    range: core::ops::Range<usize>,
) -> Result<(f64, f64)> {
    let (mut n, mut s) = (0.0f64, 0.0f64);
    for i in range {
        if sample_valid(rewards, valid, i)? {
            n += 1.0;
            s += f64::from(rewards[i]);
        }
    }
    Ok((n, s))
}

/// Sum of squared deviations from `mean` of the valid rewards in `range` (second pass).
pub(super) fn range_centered_squares(
    rewards: &[f32],
    valid: Option<&[u8]>,
    range: core::ops::Range<usize>,
    mean: f64,
) -> Result<f64> {
    let mut m2 = 0.0f64;
    for i in range {
        if sample_valid(rewards, valid, i)? {
            let d = f64::from(rewards[i]) - mean;
            m2 += d * d;
        }
    }
    Ok(m2)
}

/// `sqrt(m2 / (n - 1))` or `sqrt(m2 / n)`; 0 where the estimator is undefined.
pub(super) fn std_from(m2: f64, n: f64, kind: StdKind) -> f64 {
    let denom = match kind {
        StdKind::Unbiased => n - 1.0,
        StdKind::Biased => n,
    };
    if denom > 0.0 {
        libm::sqrt(m2 / denom)
    } else {
        0.0
    }
}

/// The affine map of one group: `A = (r - center) * factor / divisor`.
#[derive(Clone, Copy, Debug)]
pub(super) struct GroupMap {
    pub center: f64,
    pub factor: f64,
    pub divisor: f64,
    pub std: f64,
    pub zero_variance: bool,
}

impl GroupMap {
    #[inline]
    pub fn apply(&self, r: f32) -> f64 {
        if self.factor == 0.0 {
            return 0.0;
        }
        (f64::from(r) - self.center) * self.factor / self.divisor
    }
}

/// The advantage map of a group from its global moments. `m2` is the sum of squared deviations
/// from the group mean; it is exactly 0 iff all valid rewards are equal, because `n` equal `f32`
/// values sum exactly in `f64` (for `n < 2^29`), so the mean is the value itself.
pub(super) fn group_map(
    n: f64,
    sum: f64,
    m2: f64,
    batch_std: f64,
    opts: &AdvantageOptions,
) -> Result<GroupMap> {
    let zero = |std: f64, zero_variance: bool| GroupMap {
        center: 0.0,
        factor: 0.0,
        divisor: 1.0,
        std,
        zero_variance,
    };
    if n <= 0.0 {
        return Ok(zero(0.0, false));
    }
    let mean = sum / n;
    let std = std_from(m2, n, opts.std_kind);
    if n == 1.0 {
        return match opts.singleton {
            SingletonPolicy::Zero => Ok(zero(std, true)),
            SingletonPolicy::Error => Err(Error::SingletonGroup),
            SingletonPolicy::Raw => Ok(GroupMap {
                center: 0.0,
                factor: 1.0,
                divisor: match opts.scale {
                    Scale::None => 1.0,
                    Scale::GroupStd | Scale::BatchStd => 1.0 + opts.eps,
                },
                std,
                zero_variance: true,
            }),
        };
    }
    if m2 == 0.0 {
        return Ok(zero(std, true));
    }
    let (center, factor) = match opts.baseline {
        Baseline::Mean => (mean, 1.0),
        Baseline::LeaveOneOut => (mean, n / (n - 1.0)),
        Baseline::None => (0.0, 1.0),
    };
    let divisor = match opts.scale {
        Scale::GroupStd => std + opts.eps,
        Scale::BatchStd => batch_std + opts.eps,
        Scale::None => 1.0,
    };
    Ok(GroupMap {
        center,
        factor,
        divisor,
        std,
        zero_variance: false,
    })
}

pub(super) fn check_lengths(
    rewards: &[f32],
    valid: Option<&[u8]>,
    layout: &GroupLayout<'_>,
    out_len: usize,
    stats_len: Option<usize>,
) -> Result<usize> {
    let n = rewards.len();
    if out_len != n || valid.is_some_and(|v| v.len() != n) {
        return Err(Error::LengthMismatch);
    }
    let b = layout.validate(n)?;
    if stats_len.is_some_and(|s| s != b) {
        return Err(Error::LengthMismatch);
    }
    Ok(b)
}

pub(super) fn write_group<O: AdvantageValue>(
    rewards: &[f32],
    valid: Option<&[u8]>,
    range: core::ops::Range<usize>,
    map: &GroupMap,
    out: &mut [O],
) -> Result<()> {
    for i in range {
        let a = if sample_valid(rewards, valid, i)? {
            map.apply(rewards[i])
        } else {
            0.0
        };
        out[i] = O::from_f64(a);
    }
    Ok(())
}

pub(super) fn group_stats(n: f64, sum: f64, map: &GroupMap) -> GroupStats {
    GroupStats {
        count: n as u32,
        mean: if n > 0.0 {
            super::narrow_f32(sum / n)
        } else {
            0.0
        },
        std: super::narrow_f32(map.std),
        zero_variance: u32::from(map.zero_variance),
    }
}

/// Group-relative advantages of one batch (SPEC §9), single rank.
///
/// `out` is `f32` (what trainers use) or `f64` (the unrounded reference, for tests).
///
/// `rewards[N]` with the groups of `layout`; `valid[N]` (optional, non-zero = valid). A sample
/// is left out of every statistic, and gets `A = 0`, when its mask byte is 0 or its reward is
/// NaN. Writes `out[N]` and, if given, `stats[B]` (one [`GroupStats`] per group). Variances are
/// two-pass centered sums in `f64`. A group whose valid rewards are all exactly equal gets
/// `A = 0`; a group with one valid sample follows [`AdvantageOptions::singleton`].
///
/// Errors: [`Error::LengthMismatch`] (`valid`, `out` or `stats` of the wrong length),
/// [`Error::InvalidLayout`], [`Error::InvalidArgument`] (bad `eps`), [`Error::NonFinite`]
/// (an infinite reward on a valid sample), [`Error::SingletonGroup`] (policy `error`). All checks
/// run before anything is written, so on error `out` and `stats` are untouched.
pub fn group_advantages<O: AdvantageValue>(
    rewards: &[f32],
    valid: Option<&[u8]>,
    layout: GroupLayout<'_>,
    opts: &AdvantageOptions,
    out: &mut [O],
    mut stats: Option<&mut [GroupStats]>,
) -> Result<()> {
    opts.validate()?;
    let b = check_lengths(
        rewards,
        valid,
        &layout,
        out.len(),
        stats.as_deref().map(<[_]>::len),
    )?;

    // Indexing below cannot panic: the layout was validated against `rewards.len()`, which
    // `valid` and `out` match, and `stats` has one entry per group.
    // Pass 1: every error is found here, before any write; batch count and sum.
    let (mut tot_n, mut tot_sum) = (0.0f64, 0.0f64);
    for g in 0..b {
        let (n, s) = range_sums(rewards, valid, layout.range(g))?;
        if n == 1.0 && opts.singleton == SingletonPolicy::Error {
            return Err(Error::SingletonGroup);
        }
        tot_n += n;
        tot_sum += s;
    }
    let batch_std = if opts.scale == Scale::BatchStd && tot_n > 0.0 {
        let m2 = range_centered_squares(rewards, valid, 0..rewards.len(), tot_sum / tot_n)?;
        std_from(m2, tot_n, opts.std_kind)
    } else {
        0.0
    };

    // Pass 2 (per group): sums again, centered squares, then the writes.
    for g in 0..b {
        let range = layout.range(g);
        let (n, s) = range_sums(rewards, valid, range.clone())?;
        let m2 = if n > 0.0 {
            range_centered_squares(rewards, valid, range.clone(), s / n)?
        } else {
            0.0
        };
        let map = group_map(n, s, m2, batch_std, opts)?;
        write_group(rewards, valid, range, &map, out)?;
        if let Some(st) = stats.as_deref_mut() {
            st[g] = group_stats(n, s, &map);
        }
    }
    Ok(())
}

/// Broadcasts per-sequence advantages onto a token layout: `A_tok[t] = A[seq(t)] * mask[t]`.
///
/// `seq_offsets` is the CSR token layout of SPEC §10 (`B + 1` entries, last = `out.len()`);
/// `adv[B]`; `mask[T]` optional (non-zero = counted). Masked tokens get exactly `0.0`, even if
/// the advantage is NaN.
///
/// Errors: [`Error::InvalidLayout`] for bad offsets, [`Error::LengthMismatch`] when `adv` does
/// not have one entry per sequence or `mask` does not match `out`.
pub fn broadcast_to_tokens(
    adv: &[f32],
    seq_offsets: &[u32],
    mask: Option<&[u8]>,
    out: &mut [f32],
) -> Result<()> {
    let b = validate_offsets(seq_offsets, out.len())?;
    if adv.len() != b || mask.is_some_and(|m| m.len() != out.len()) {
        return Err(Error::LengthMismatch);
    }
    for (w, &a) in seq_offsets.windows(2).zip(adv) {
        for t in w[0] as usize..w[1] as usize {
            out[t] = if mask.is_none_or(|m| m[t] != 0) {
                a
            } else {
                0.0
            };
        }
    }
    Ok(())
}
