//! Group advantages (SPEC §9): GRPO, Dr. GRPO, RLOO, OPO, ReMax, pass@k, GPG and the anchor
//! presets.

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
    /// The length-weighted group mean `sum_j |o_j| r_j / sum_j |o_j|` (OPO, Hao et al. 2025;
    /// verl `opo`): needs the response lengths ([`GroupInputs::lengths`]).
    LengthWeighted = 3,
    /// A baseline per sample given by the caller, `A = r_i - b_i` (ReMax: the reward of the
    /// greedy response; verl `remax`): needs [`GroupInputs::baselines`]. Groups only matter for
    /// the scale; the all-equal and singleton rules do not apply.
    External = 4,
    /// pass@k (Tang et al. 2025, leave-one-out max; verl `grpo_passk`):
    /// `A_i = max_j r_j - max_{j != i} r_j`, so only the best sample of a group gets
    /// `r_max - r_second`, and ties give 0 everywhere.
    PassK = 5,
}

named_enum!(Baseline, "baseline", {
    Mean => "mean", "The group mean";
    LeaveOneOut => "leave_one_out", "The mean of the other samples (RLOO)";
    None => "none", "Nothing subtracted";
    LengthWeighted => "length_weighted", "The length-weighted group mean (OPO; needs lengths)";
    External => "external", "A per-sample baseline (ReMax; needs baselines)";
    PassK => "pass_k", "pass@k: the best gets r_max - r_second, the others 0";
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

/// A factor applied to every advantage of the batch.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Reweight {
    /// None (default).
    #[default]
    None = 0,
    /// GPG (Chu et al. 2025): `alpha = N / (N - M)`, where `N` counts the valid samples and `M`
    /// those in groups whose advantages are all 0 (all-equal rewards, singletons under policy
    /// `zero`), so the batch's gradient is not diluted by groups without signal; 1 when every
    /// group is such a group.
    Gpg = 1,
    /// verl's `gpg` estimator: `alpha = N / max(1, K)`, where `K` counts the valid samples whose
    /// reward is not 0 (`torch.count_nonzero` of the raw rewards). Not a sum of group moments,
    /// so the cross-rank form refuses it.
    Nonzero = 2,
}

named_enum!(Reweight, "reweight", {
    None => "none", "No factor";
    Gpg => "gpg", "GPG: N / (N - M), M = samples of groups without signal";
    Nonzero => "nonzero", "verl gpg: N / max(1, K), K = samples with a nonzero reward";
});

/// Options of [`group_advantages`]. Plain `#[repr(C)]` data, mirrored by the C ABI.
///
/// Field order (C): `baseline: u32, scale: u32, std_kind: u32, singleton: u32, eps: f64,
/// std_floor: f64, reweight: u32` and 4 bytes of tail padding (40 bytes).
/// `A = alpha * (r - b) / (max(std, std_floor) + eps)`; see SPEC §9.
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
    /// A floor under the std before `eps` is added: `max(std, std_floor)` (0 = off; NeMo-RL
    /// proposes `1e-3`). A group whose rewards differ by a rounding residue would otherwise
    /// have its advantages blown up by thousands of times. Finite and `>= 0`.
    pub std_floor: f64,
    /// A factor on every advantage of the batch (GPG).
    pub reweight: Reweight,
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
            std_floor: 0.0,
            reweight: Reweight::None,
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
    /// verl `opo`: length-weighted baseline, no scale, singleton `raw` (`A = r`).
    Opo = 6,
    /// verl `remax`: the caller's per-sample baseline, no scale.
    Remax = 7,
    /// verl `grpo_passk`: pass@k, divided by the group std + `1e-6` (verl's
    /// `norm_adv_by_std_in_grpo = True`); singleton `error` (verl needs two samples).
    GrpoPassK = 8,
    /// GPG as its paper and reference code define it: mean baseline, no scale (`F_norm = 1`),
    /// `alpha = N / (N - M)`, singleton `zero`. verl's `gpg` is [`Preset::VerlGpg`].
    Gpg = 9,
    /// verl `reinforce_plus_plus_baseline` before its token whitening: mean baseline, no
    /// scale, singleton `raw` (`A = r`). Whiten the token advantages with
    /// [`whiten`](super::whiten).
    ReinforcePpBaseline = 10,
    /// verl `gpg`: mean baseline, no scale, `alpha = N / max(1, count_nonzero(rewards))`
    /// ([`Reweight::Nonzero`]), singleton `raw` (a lone sample keeps `alpha * r`).
    VerlGpg = 11,
}

named_enum!(Preset, "advantage preset", {
    Verl => "verl", "verl grpo: mean, group std, unbiased, eps 1e-6, singleton raw";
    Trl => "trl", "TRL: mean, group std, unbiased, eps 1e-4, singleton zero";
    TrlBatch => "trl_batch", "TRL with the batch std";
    OpenRlhf => "openrlhf", "OpenRLHF group_norm: eps 1e-9, singleton error";
    DrGrpo => "dr_grpo", "Dr. GRPO: mean baseline, no scale";
    Rloo => "rloo", "RLOO: leave-one-out baseline, no scale";
    Opo => "opo", "verl opo: length-weighted baseline, no scale, singleton raw";
    Remax => "remax", "verl remax: the caller's per-sample baseline, no scale";
    GrpoPassK => "grpo_passk", "verl grpo_passk: only the best gets r_max - r_second, over std";
    Gpg => "gpg", "GPG: mean baseline, no scale, factor N / (N - M)";
    ReinforcePpBaseline => "reinforce_pp_baseline", "verl REINFORCE++-baseline before whitening";
    VerlGpg => "verl_gpg", "verl gpg: mean baseline, no scale, factor N / count_nonzero(r)";
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
            std_floor: 0.0,
            reweight: Reweight::None,
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
            Preset::Opo => AdvantageOptions {
                baseline: Baseline::LengthWeighted,
                scale: Scale::None,
                singleton: SingletonPolicy::Raw,
                ..base
            },
            Preset::Remax => AdvantageOptions {
                baseline: Baseline::External,
                scale: Scale::None,
                ..base
            },
            Preset::GrpoPassK => AdvantageOptions {
                baseline: Baseline::PassK,
                singleton: SingletonPolicy::Error,
                ..base
            },
            Preset::Gpg => AdvantageOptions {
                scale: Scale::None,
                reweight: Reweight::Gpg,
                ..base
            },
            Preset::ReinforcePpBaseline => AdvantageOptions {
                scale: Scale::None,
                singleton: SingletonPolicy::Raw,
                ..base
            },
            Preset::VerlGpg => AdvantageOptions {
                scale: Scale::None,
                singleton: SingletonPolicy::Raw,
                reweight: Reweight::Nonzero,
                ..base
            },
        }
    }

    /// Checks the fields: `eps` and `std_floor` finite and `>= 0`.
    ///
    /// # Errors
    /// The first field outside its domain.
    pub fn check(&self) -> core::result::Result<(), InvalidOption> {
        InvalidOption::require(
            domain::finite_non_negative(self.eps),
            "eps",
            domain::FINITE_NON_NEGATIVE,
        )?;
        InvalidOption::require(
            domain::finite_non_negative(self.std_floor),
            "std_floor",
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

    /// The divisor of a scaled group: `max(std, std_floor) + eps`.
    #[inline]
    pub(super) fn divisor(&self, std: f64) -> f64 {
        let s = if std < self.std_floor {
            self.std_floor
        } else {
            std
        };
        s + self.eps
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
    /// The stored value, widened to `f64` exactly.
    fn to_f64(self) -> f64;
    /// Zero.
    const ZERO: Self;
}

impl AdvantageValue for f32 {
    #[inline]
    fn from_f64(x: f64) -> Self {
        super::narrow_f32(x)
    }
    #[inline]
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    const ZERO: Self = 0.0;
}

impl AdvantageValue for f64 {
    #[inline]
    fn from_f64(x: f64) -> Self {
        x
    }
    #[inline]
    fn to_f64(self) -> f64 {
        self
    }
    const ZERO: Self = 0.0;
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

/// What a group's advantages are centered on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Center {
    /// One value for the group (mean, leave-one-out, none, length-weighted).
    Value(f64),
    /// The caller's per-sample baseline ([`Baseline::External`]).
    External,
    /// pass@k: only sample `best` gets `r - second`.
    PassK { best: usize, second: f64 },
}

/// The map of one group: `A_i = (r_i - center_i) * factor / divisor`.
#[derive(Clone, Copy, Debug)]
pub(super) struct GroupMap {
    pub center: Center,
    pub factor: f64,
    pub divisor: f64,
    pub std: f64,
    pub zero_variance: bool,
}

impl GroupMap {
    /// The advantage of sample `i` with reward `r` (`baselines`: the external baselines).
    #[inline]
    pub fn apply(&self, i: usize, r: f32, baselines: Option<&[f32]>) -> f64 {
        if self.factor == 0.0 {
            return 0.0;
        }
        let c = match self.center {
            Center::Value(c) => c,
            Center::External => baselines.map_or(0.0, |b| f64::from(b[i])),
            Center::PassK { best, second } if best == i => second,
            Center::PassK { .. } => return 0.0,
        };
        (f64::from(r) - c) * self.factor / self.divisor
    }
}

/// What [`group_map`] needs beyond the group's moments: the length-weighted mean (OPO) and the
/// pass@k cut, from one more pass over the group ([`group_extra`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct GroupExtra {
    /// `sum l r / sum l` (the plain mean when every length is 0).
    pub length_weighted: f64,
    /// The first sample with the largest reward and the largest reward of the others.
    pub best: usize,
    pub second: f64,
}

/// The extra per-group statistics of [`GroupExtra`] (only read for the baselines that use
/// them).
pub(super) fn group_extra(
    inputs: &GroupInputs<'_>,
    range: core::ops::Range<usize>,
    opts: &AdvantageOptions,
) -> Result<GroupExtra> {
    let mut e = GroupExtra::default();
    match opts.baseline {
        Baseline::LengthWeighted => {
            let (mut lr, mut l, mut n, mut s) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
            for i in range {
                if sample_valid(inputs.rewards, inputs.valid, i)? {
                    let len = inputs.lengths.map_or(0.0, |x| f64::from(x[i]));
                    let r = f64::from(inputs.rewards[i]);
                    lr += len * r;
                    l += len;
                    n += 1.0;
                    s += r;
                }
            }
            e.length_weighted = if l > 0.0 {
                lr / l
            } else if n > 0.0 {
                s / n
            } else {
                0.0
            };
        }
        Baseline::PassK => {
            let (mut best, mut max, mut second) =
                (None::<usize>, f64::NEG_INFINITY, f64::NEG_INFINITY);
            for i in range {
                if sample_valid(inputs.rewards, inputs.valid, i)? {
                    let r = f64::from(inputs.rewards[i]);
                    if best.is_none() || r > max {
                        second = max;
                        (best, max) = (Some(i), r);
                    } else if r > second {
                        second = r;
                    }
                }
            }
            e.best = best.unwrap_or(usize::MAX);
            e.second = second;
        }
        _ => {}
    }
    Ok(e)
}

/// The advantage map of a group from its global moments. `m2` is the sum of squared deviations
/// from the group mean; it is exactly 0 iff all valid rewards are equal, because `n` equal `f32`
/// values sum exactly in `f64` (for `n < 2^29`), so the mean is the value itself. `alpha` is
/// the [`Reweight`] factor of the batch (1 when off).
pub(super) fn group_map(
    n: f64,
    sum: f64,
    m2: f64,
    batch_std: f64,
    extra: &GroupExtra,
    alpha: f64,
    opts: &AdvantageOptions,
) -> Result<GroupMap> {
    let zero = |std: f64, zero_variance: bool| GroupMap {
        center: Center::Value(0.0),
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
    let divisor = match opts.scale {
        Scale::GroupStd => opts.divisor(std),
        Scale::BatchStd => opts.divisor(batch_std),
        Scale::None => 1.0,
    };
    if opts.baseline == Baseline::External {
        // Not group-relative: every sample keeps its own signal. A zero std (one valid sample,
        // all valid rewards equal, or a zero batch std) counts as 1, as verl's std of a
        // degenerate group does: dividing `r - b` by `eps` alone would blow it up by 1/eps, and
        // with `eps = 0` overflow to infinity (found by the `advantages` fuzz target).
        let used = match opts.scale {
            Scale::GroupStd => std,
            Scale::BatchStd => batch_std,
            Scale::None => 1.0,
        };
        let divisor = if used > 0.0 {
            divisor
        } else {
            opts.divisor(1.0)
        };
        return Ok(GroupMap {
            center: Center::External,
            factor: alpha,
            divisor,
            std,
            zero_variance: n == 1.0 || m2 == 0.0,
        });
    }
    if n == 1.0 {
        return match opts.singleton {
            SingletonPolicy::Zero => Ok(zero(std, true)),
            SingletonPolicy::Error => Err(Error::SingletonGroup),
            SingletonPolicy::Raw => Ok(GroupMap {
                center: Center::Value(0.0),
                factor: alpha,
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
        Baseline::Mean => (Center::Value(mean), 1.0),
        Baseline::LeaveOneOut => (Center::Value(mean), n / (n - 1.0)),
        Baseline::None => (Center::Value(0.0), 1.0),
        Baseline::LengthWeighted => (Center::Value(extra.length_weighted), 1.0),
        Baseline::PassK => (
            Center::PassK {
                best: extra.best,
                second: extra.second,
            },
            1.0,
        ),
        Baseline::External => (Center::External, 1.0),
    };
    Ok(GroupMap {
        center,
        factor: factor * alpha,
        divisor,
        std,
        zero_variance: false,
    })
}

/// The GPG factor `alpha = N / (N - M)` from the valid-sample count `N` and the count `M` of
/// valid samples in groups whose advantages are all 0; 1 when `N - M = 0`.
#[inline]
pub(super) fn gpg_alpha(n: f64, m: f64) -> f64 {
    if n - m > 0.0 { n / (n - m) } else { 1.0 }
}

/// verl's `gpg` factor `alpha = N / max(1, K)` from the valid-sample count `N` and the count
/// `K` of valid samples with a nonzero reward.
#[inline]
fn nonzero_alpha(n: f64, k: f64) -> f64 {
    n / k.max(1.0)
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
    inputs: &GroupInputs<'_>,
    range: core::ops::Range<usize>,
    map: &GroupMap,
    out: &mut [O],
) -> Result<()> {
    for i in range {
        let a = if sample_valid(inputs.rewards, inputs.valid, i)? {
            map.apply(i, inputs.rewards[i], inputs.baselines)
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

/// The inputs of [`group_advantages_with`]: the rewards with their layout and validity, and
/// the per-sample inputs some baselines need.
#[derive(Clone, Copy, Debug)]
pub struct GroupInputs<'a> {
    /// `rewards[N]`.
    pub rewards: &'a [f32],
    /// `valid[N]` (non-zero = valid), or `None` (all valid).
    pub valid: Option<&'a [u8]>,
    /// The groups.
    pub layout: GroupLayout<'a>,
    /// `lengths[N]`, each response's token count ([`Baseline::LengthWeighted`]).
    pub lengths: Option<&'a [u32]>,
    /// `baselines[N]`, each sample's baseline reward ([`Baseline::External`]; finite on valid
    /// samples).
    pub baselines: Option<&'a [f32]>,
}

impl<'a> GroupInputs<'a> {
    /// Rewards, validity and layout, without the optional per-sample inputs.
    pub fn new(rewards: &'a [f32], valid: Option<&'a [u8]>, layout: GroupLayout<'a>) -> Self {
        GroupInputs {
            rewards,
            valid,
            layout,
            lengths: None,
            baselines: None,
        }
    }

    /// Checks the optional inputs against the options: present where the baseline needs them,
    /// of length `N`, external baselines finite on valid samples.
    pub(super) fn check(&self, opts: &AdvantageOptions) -> Result<()> {
        let n = self.rewards.len();
        if self.lengths.is_some_and(|l| l.len() != n)
            || self.baselines.is_some_and(|b| b.len() != n)
        {
            return Err(Error::LengthMismatch);
        }
        match opts.baseline {
            Baseline::LengthWeighted if self.lengths.is_none() => Err(Error::InvalidArgument),
            Baseline::External => {
                let b = self.baselines.ok_or(Error::InvalidArgument)?;
                for (i, x) in b.iter().enumerate() {
                    if !x.is_finite() && sample_valid(self.rewards, self.valid, i)? {
                        return Err(Error::NonFinite);
                    }
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

/// Group-relative advantages of one batch (SPEC §9), single rank; [`group_advantages_with`]
/// without lengths or external baselines.
///
/// Errors: as [`group_advantages_with`].
pub fn group_advantages<O: AdvantageValue>(
    rewards: &[f32],
    valid: Option<&[u8]>,
    layout: GroupLayout<'_>,
    opts: &AdvantageOptions,
    out: &mut [O],
    stats: Option<&mut [GroupStats]>,
) -> Result<()> {
    group_advantages_with(&GroupInputs::new(rewards, valid, layout), opts, out, stats)
}

/// Group-relative advantages of one batch (SPEC §9), single rank.
///
/// `out` is `f32` (what trainers use) or `f64` (the unrounded reference, for tests).
///
/// `rewards[N]` with the groups of `layout`; `valid[N]` (optional, non-zero = valid). A sample
/// is left out of every statistic, and gets `A = 0`, when its mask byte is 0 or its reward is
/// NaN. Writes `out[N]` and, if given, `stats[B]` (one [`GroupStats`] per group). Variances are
/// two-pass centered sums in `f64`. A group whose valid rewards are all exactly equal gets
/// `A = 0`; a group with one valid sample follows [`AdvantageOptions::singleton`] (neither rule
/// applies to [`Baseline::External`]).
///
/// Errors: [`Error::LengthMismatch`] (`valid`, `lengths`, `baselines`, `out` or `stats` of the
/// wrong length), [`Error::InvalidLayout`], [`Error::InvalidArgument`] (bad `eps` or
/// `std_floor`, or the input a baseline needs is absent), [`Error::NonFinite`] (an infinite
/// reward, or a non-finite external baseline, on a valid sample), [`Error::SingletonGroup`]
/// (policy `error`). All checks run before anything is written, so on error `out` and `stats`
/// are untouched.
pub fn group_advantages_with<O: AdvantageValue>(
    inputs: &GroupInputs<'_>,
    opts: &AdvantageOptions,
    out: &mut [O],
    mut stats: Option<&mut [GroupStats]>,
) -> Result<()> {
    opts.validate()?;
    let (rewards, valid, layout) = (inputs.rewards, inputs.valid, inputs.layout);
    let b = check_lengths(
        rewards,
        valid,
        &layout,
        out.len(),
        stats.as_deref().map(<[_]>::len),
    )?;
    inputs.check(opts)?;

    // Indexing below cannot panic: the layout was validated against `rewards.len()`, which
    // `valid`, `lengths`, `baselines` and `out` match, and `stats` has one entry per group.
    // Pass 1: every error is found here, before any write; batch count and sum.
    let (mut tot_n, mut tot_sum) = (0.0f64, 0.0f64);
    for g in 0..b {
        let (n, s) = range_sums(rewards, valid, layout.range(g))?;
        let grouped = opts.baseline != Baseline::External;
        if grouped && n == 1.0 && opts.singleton == SingletonPolicy::Error {
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
    // One group's moments and map (pass 2 runs it once more per group for GPG's alpha).
    let map_of = |g: usize, alpha: f64| -> Result<(f64, f64, GroupMap)> {
        let range = layout.range(g);
        let (n, s) = range_sums(rewards, valid, range.clone())?;
        let m2 = if n > 0.0 {
            range_centered_squares(rewards, valid, range.clone(), s / n)?
        } else {
            0.0
        };
        let extra = group_extra(inputs, range, opts)?;
        Ok((n, s, group_map(n, s, m2, batch_std, &extra, alpha, opts)?))
    };
    let alpha = match opts.reweight {
        Reweight::None => 1.0,
        Reweight::Gpg => {
            let mut m = 0.0f64;
            for g in 0..b {
                let (n, _, map) = map_of(g, 1.0)?;
                if map.factor == 0.0 {
                    m += n;
                }
            }
            gpg_alpha(tot_n, m)
        }
        Reweight::Nonzero => {
            let mut k = 0.0f64;
            for g in 0..b {
                for i in layout.range(g) {
                    if sample_valid(rewards, valid, i)? && rewards[i] != 0.0 {
                        k += 1.0;
                    }
                }
            }
            nonzero_alpha(tot_n, k)
        }
    };

    // Pass 2 (per group): the map, then the writes.
    for g in 0..b {
        let (n, s, map) = map_of(g, alpha)?;
        write_group(inputs, layout.range(g), &map, out)?;
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
/// `f32` or `f64` (keep `f64` advantages unrounded until a later [`whiten`](super::whiten)).
///
/// Errors: [`Error::InvalidLayout`] for bad offsets, [`Error::LengthMismatch`] when `adv` does
/// not have one entry per sequence or `mask` does not match `out`.
pub fn broadcast_to_tokens<V: AdvantageValue>(
    adv: &[V],
    seq_offsets: &[u32],
    mask: Option<&[u8]>,
    out: &mut [V],
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
                V::ZERO
            };
        }
    }
    Ok(())
}
