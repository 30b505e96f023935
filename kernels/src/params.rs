//! Kernel parameter structs, passed by value to the kernels: `#[repr(C)]` mirrors of the structs
//! in `kernels/cuda/*.cu`. The host-emulation tests compare every size, alignment and field
//! offset with the C++ compiler's view of the same source.
//!
//! Pointers are device addresses (`u64`, 0 = absent), as a trainer holds them: a PyTorch
//! `data_ptr()`, a `CUdeviceptr`, or a host address under the emulator.

use care_core::grpo::{
    AdvantageOptions, Aggregation, KlEstimator, LossOptions, LossStats, RatioLevel, Scale,
    SingletonPolicy, StdKind,
};

/// Status bit: a group had exactly one valid sample under [`SingletonPolicy::Error`].
pub const STATUS_SINGLETON: u32 = 1;
/// Status bit: a valid sample had an infinite reward.
pub const STATUS_NON_FINITE: u32 = 2;
/// Status bit: a reduced moment passed to the finalize phase is negative or not finite.
pub const STATUS_INVALID_MOMENTS: u32 = 4;

/// `AdvParams::mode`: one rank, statistics from this call's rewards.
pub const ADV_LOCAL: u32 = 0;
/// `AdvParams::mode`: write each group's count and sum (`GroupSums`).
pub const ADV_PARTIAL_SUMS: u32 = 1;
/// `AdvParams::mode`: write each group's squares centered on the global mean.
pub const ADV_PARTIAL_SQUARES: u32 = 2;
/// `AdvParams::mode`: advantages from the all-reduced moments.
pub const ADV_FINALIZE: u32 = 3;

/// Parameters of `group_advantages_f32` (C `CareAdvParams`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AdvParams {
    /// `f32[n]` rewards.
    pub rewards: u64,
    /// `u8[n]` validity mask (0 = invalid) or 0.
    pub valid: u64,
    /// `u32[num_groups + 1]` CSR group offsets, or 0 for the fixed layout.
    pub offsets: u64,
    /// `f32[n]` output advantages.
    pub adv: u64,
    /// `GroupStats[num_groups]` output (layout of [`care_core::grpo::GroupStats`]) or 0.
    pub group_stats: u64,
    /// `f32` device scalar: the batch std, read when the scale is the batch std.
    pub batch_std: u64,
    /// `u32[n + 1]` token offsets of the samples (token broadcast) or 0.
    pub tok_offsets: u64,
    /// `u8[T]` token mask or 0 (every token counts).
    pub tok_mask: u64,
    /// `f32[T]` broadcast output or 0.
    pub adv_tok: u64,
    /// `u32` device status word (`STATUS_*` bits are OR-ed in) or 0.
    pub status: u64,
    /// `GroupSums[num_groups]` (`care_core::grpo::GroupSums` layout): output of the partial-sums
    /// phase, input of the later phases; 0 for [`ADV_LOCAL`].
    pub sums: u64,
    /// `f64[num_groups]`: output of the partial-squares phase, input of finalize.
    pub m2: u64,
    /// Number of samples.
    pub n: u32,
    /// Number of groups.
    pub num_groups: u32,
    /// Fixed layout: samples per group.
    pub group_size: u32,
    /// [`Baseline`] as its `u32` value.
    pub baseline: u32,
    /// [`Scale`] as its `u32` value.
    pub scale: u32,
    /// 1: unbiased std (`n - 1`), 0: biased.
    pub unbiased: u32,
    /// [`SingletonPolicy`] as its `u32` value.
    pub singleton: u32,
    /// 1: one warp per group, 0: one block per group.
    pub warp_per_group: u32,
    /// Added to the std before dividing.
    pub eps: f32,
    /// Phase: [`ADV_LOCAL`], [`ADV_PARTIAL_SUMS`], [`ADV_PARTIAL_SQUARES`], [`ADV_FINALIZE`].
    pub mode: u32,
}

impl AdvParams {
    /// Copies the options' fields (everything but pointers, sizes and the team mode).
    pub fn with_options(mut self, o: &AdvantageOptions) -> Self {
        // The kernel knows the first three; `launch_advantages` refuses the others.
        self.baseline = o.baseline as u32;
        self.scale = match o.scale {
            Scale::GroupStd => 0,
            Scale::BatchStd => 1,
            Scale::None => 2,
        };
        self.unbiased = u32::from(o.std_kind == StdKind::Unbiased);
        self.singleton = match o.singleton {
            SingletonPolicy::Zero => 0,
            SingletonPolicy::Raw => 1,
            SingletonPolicy::Error => 2,
        };
        self.eps = o.eps as f32;
        self
    }
}

/// Parameters of `batch_std_f32` (C `CareBatchStdParams`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BatchStdParams {
    /// `f32[n]` rewards.
    pub rewards: u64,
    /// `u8[n]` validity mask or 0.
    pub valid: u64,
    /// `f32` device scalar output.
    pub out_std: u64,
    /// `GroupSums[num_groups]` reduced moments, or 0 to use the rewards.
    pub sums: u64,
    /// `f64[num_groups]` reduced centered squares (with `sums`).
    pub m2: u64,
    /// Number of samples.
    pub n: u32,
    /// 1: unbiased std, 0: biased.
    pub unbiased: u32,
    /// Number of groups (with `sums`).
    pub num_groups: u32,
    /// Padding.
    pub pad0: u32,
}

/// Parameters of `grpo_loss_{f32,bf16,f16}` and `grpo_loss_denoms` (C `CareLossParams`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LossParams {
    /// `T[n_tok]` current log-probs.
    pub logp: u64,
    /// `T[n_tok]` old log-probs or 0 (on-policy).
    pub logp_old: u64,
    /// `T[n_tok]` reference log-probs or 0.
    pub logp_ref: u64,
    /// `f32[n_seq]` or `f32[n_tok]` advantages.
    pub adv: u64,
    /// `u8[n_tok]` mask or 0.
    pub mask: u64,
    /// `u32[n_seq + 1]` CSR sequence offsets.
    pub seq_offsets: u64,
    /// `f32[n_tok]` (or `T[n_tok]` with `grad_in_input_dtype`) gradient output, or 0.
    pub grad: u64,
    /// [`LossStatsRaw`] device struct (accumulated into) or 0.
    pub stats: u64,
    /// [`LossDenomsRaw`] device struct from `grpo_loss_denoms`, or 0.
    pub denoms: u64,
    /// Number of sequences.
    pub n_seq: u32,
    /// Number of tokens.
    pub n_tok: u32,
    /// 1: advantages per token.
    pub adv_per_token: u32,
    /// 1: write the gradient in the log-prob dtype.
    pub grad_in_input_dtype: u32,
    /// [`Aggregation`] as its `u32` value.
    pub agg: u32,
    /// [`KlEstimator`] as its `u32` value.
    pub kl: u32,
    /// 1: sequence-level ratio (GSPO).
    pub seq_level: u32,
    /// Padding.
    pub pad0: u32,
    /// Lower clip width.
    pub eps_low: f32,
    /// Upper clip width.
    pub eps_high: f32,
    /// Dual-clip constant (off when `<= 1`).
    pub dual_clip: f32,
    /// Bound on the log ratio before `exp`.
    pub log_ratio_clamp: f32,
    /// Bound on the KL input.
    pub kl_clamp: f32,
    /// Bound on the `k3` value.
    pub k3_clamp: f32,
    /// GSPO: bound on the mean log ratio.
    pub seq_log_ratio_max: f32,
    /// KL coefficient.
    pub beta: f32,
    /// Global token count, or `<= 0` to read it from `denoms`.
    pub n_tok_denom: f32,
    /// Global sequence count, or `<= 0` to read it from `denoms`.
    pub n_seq_denom: f32,
    /// Horizon `H`, or `<= 0` to read it from `denoms`.
    pub horizon: f32,
    /// Padding.
    pub pad1: f32,
}

impl LossParams {
    /// Copies the options' fields (everything but pointers and sizes).
    pub fn with_options(mut self, o: &LossOptions) -> Self {
        self.agg = match o.aggregation {
            Aggregation::TokenMean => 0,
            Aggregation::SeqMeanTokenMean => 1,
            Aggregation::SeqMeanTokenSum => 2,
            Aggregation::SeqMeanTokenSumNorm => 3,
            Aggregation::TokenSum => 4,
        };
        self.kl = match o.kl_estimator {
            KlEstimator::K1 => 0,
            KlEstimator::Abs => 1,
            KlEstimator::K2 => 2,
            KlEstimator::K3 => 3,
        };
        self.seq_level = u32::from(o.ratio_level == RatioLevel::Sequence);
        self.eps_low = o.eps_low as f32;
        self.eps_high = o.eps_high as f32;
        self.dual_clip = o.dual_clip as f32;
        self.log_ratio_clamp = o.log_ratio_clamp as f32;
        self.kl_clamp = o.kl_input_clamp as f32;
        self.k3_clamp = o.kl_output_clamp as f32;
        self.seq_log_ratio_max = o.seq_log_ratio_max as f32;
        self.beta = o.beta as f32;
        self.n_tok_denom = o.global_tokens as f32;
        self.n_seq_denom = o.global_sequences as f32;
        self.horizon = o.horizon as f32;
        self
    }

    /// Whether some denominator must come from the device pre-pass (`grpo_loss_denoms`).
    pub fn needs_denoms(&self) -> bool {
        !(self.n_tok_denom > 0.0 && self.n_seq_denom > 0.0 && self.horizon > 0.0)
    }
}

/// Loss statistics as the kernel accumulates them (C `CareLossStats`): `f32` sums and `u32`
/// counts, added with atomics. Convert with [`LossStatsRaw::to_core`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct LossStatsRaw {
    /// `sum_t w_t * l_t`.
    pub loss: f32,
    /// `sum (logp_old - logp)` (clamped log ratio).
    pub ppo_kl_sum: f32,
    /// `sum k`.
    pub kl_sum: f32,
    /// `sum rho`.
    pub ratio_sum: f32,
    /// Smallest finite ratio (`+inf` when none).
    pub ratio_min: f32,
    /// Largest finite ratio (0 when none: every ratio is positive).
    pub ratio_max: f32,
    /// Counted tokens.
    pub tokens: u32,
    /// Sequences with a counted token.
    pub sequences: u32,
    /// `pg2 > pg1`.
    pub clipped: u32,
    /// `rho < 1 - eps_low`, `A < 0`.
    pub clipped_low: u32,
    /// `rho > 1 + eps_high`, `A > 0`.
    pub clipped_high: u32,
    /// Dual clip binds.
    pub dual_clipped: u32,
    /// Log ratio hit the clamp.
    pub clamped_log_ratios: u32,
    /// Counted tokens with a non-finite input.
    pub non_finite: u32,
}

impl LossStatsRaw {
    /// The initial value the kernel accumulates into: zero sums, `ratio_min = +inf`,
    /// `ratio_max = 0`.
    pub const EMPTY: LossStatsRaw = LossStatsRaw {
        loss: 0.0,
        ppo_kl_sum: 0.0,
        kl_sum: 0.0,
        ratio_sum: 0.0,
        ratio_min: f32::INFINITY,
        ratio_max: 0.0,
        tokens: 0,
        sequences: 0,
        clipped: 0,
        clipped_low: 0,
        clipped_high: 0,
        dual_clipped: 0,
        clamped_log_ratios: 0,
        non_finite: 0,
    };

    /// The same statistics as [`care_core::grpo::LossStats`] (`ratio_max = -inf` when no finite
    /// ratio was seen, as in the CPU reference).
    pub fn to_core(&self) -> LossStats {
        LossStats {
            tokens: f64::from(self.tokens),
            sequences: f64::from(self.sequences),
            loss: f64::from(self.loss),
            clipped: f64::from(self.clipped),
            clipped_low: f64::from(self.clipped_low),
            clipped_high: f64::from(self.clipped_high),
            dual_clipped: f64::from(self.dual_clipped),
            ppo_kl_sum: f64::from(self.ppo_kl_sum),
            kl_sum: f64::from(self.kl_sum),
            ratio_sum: f64::from(self.ratio_sum),
            log_ratio_clamped: f64::from(self.clamped_log_ratios),
            non_finite: f64::from(self.non_finite),
            ratio_min: f64::from(self.ratio_min),
            ratio_max: if self.ratio_max > 0.0 {
                f64::from(self.ratio_max)
            } else {
                f64::NEG_INFINITY
            },
        }
    }
}

impl Default for LossStatsRaw {
    fn default() -> Self {
        LossStatsRaw::EMPTY
    }
}

/// Default loss denominators computed on the device (C `CareLossDenoms`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct LossDenomsRaw {
    /// Counted tokens.
    pub n_tok: u32,
    /// Sequences with a counted token.
    pub n_seq: u32,
    /// Longest sequence (offset difference).
    pub horizon: u32,
    /// Padding.
    pub pad0: u32,
}

/// Field offsets of each struct, in C declaration order, preceded by size and alignment: the
/// format of the emulator's `emu_layout_*` functions, for the layout tests.
pub mod layout {
    use super::*;
    use core::mem::{align_of, offset_of, size_of};

    /// `CareAdvParams`.
    pub fn adv() -> Vec<u32> {
        let v = [
            size_of::<AdvParams>(),
            align_of::<AdvParams>(),
            offset_of!(AdvParams, rewards),
            offset_of!(AdvParams, valid),
            offset_of!(AdvParams, offsets),
            offset_of!(AdvParams, adv),
            offset_of!(AdvParams, group_stats),
            offset_of!(AdvParams, batch_std),
            offset_of!(AdvParams, tok_offsets),
            offset_of!(AdvParams, tok_mask),
            offset_of!(AdvParams, adv_tok),
            offset_of!(AdvParams, status),
            offset_of!(AdvParams, sums),
            offset_of!(AdvParams, m2),
            offset_of!(AdvParams, n),
            offset_of!(AdvParams, num_groups),
            offset_of!(AdvParams, group_size),
            offset_of!(AdvParams, baseline),
            offset_of!(AdvParams, scale),
            offset_of!(AdvParams, unbiased),
            offset_of!(AdvParams, singleton),
            offset_of!(AdvParams, warp_per_group),
            offset_of!(AdvParams, eps),
            offset_of!(AdvParams, mode),
        ];
        v.iter().map(|&x| x as u32).collect()
    }

    /// `CareGroupStats` (= `care_core::grpo::GroupStats`).
    pub fn group_stats() -> Vec<u32> {
        use care_core::grpo::GroupStats;
        let v = [
            size_of::<GroupStats>(),
            align_of::<GroupStats>(),
            offset_of!(GroupStats, count),
            offset_of!(GroupStats, mean),
            offset_of!(GroupStats, std),
            offset_of!(GroupStats, zero_variance),
        ];
        v.iter().map(|&x| x as u32).collect()
    }

    /// `CareBatchStdParams`.
    pub fn batch_std() -> Vec<u32> {
        let v = [
            size_of::<BatchStdParams>(),
            align_of::<BatchStdParams>(),
            offset_of!(BatchStdParams, rewards),
            offset_of!(BatchStdParams, valid),
            offset_of!(BatchStdParams, out_std),
            offset_of!(BatchStdParams, sums),
            offset_of!(BatchStdParams, m2),
            offset_of!(BatchStdParams, n),
            offset_of!(BatchStdParams, unbiased),
            offset_of!(BatchStdParams, num_groups),
            offset_of!(BatchStdParams, pad0),
        ];
        v.iter().map(|&x| x as u32).collect()
    }

    /// `CareLossParams`.
    pub fn loss() -> Vec<u32> {
        let v = [
            size_of::<LossParams>(),
            align_of::<LossParams>(),
            offset_of!(LossParams, logp),
            offset_of!(LossParams, logp_old),
            offset_of!(LossParams, logp_ref),
            offset_of!(LossParams, adv),
            offset_of!(LossParams, mask),
            offset_of!(LossParams, seq_offsets),
            offset_of!(LossParams, grad),
            offset_of!(LossParams, stats),
            offset_of!(LossParams, denoms),
            offset_of!(LossParams, n_seq),
            offset_of!(LossParams, n_tok),
            offset_of!(LossParams, adv_per_token),
            offset_of!(LossParams, grad_in_input_dtype),
            offset_of!(LossParams, agg),
            offset_of!(LossParams, kl),
            offset_of!(LossParams, seq_level),
            offset_of!(LossParams, pad0),
            offset_of!(LossParams, eps_low),
            offset_of!(LossParams, eps_high),
            offset_of!(LossParams, dual_clip),
            offset_of!(LossParams, log_ratio_clamp),
            offset_of!(LossParams, kl_clamp),
            offset_of!(LossParams, k3_clamp),
            offset_of!(LossParams, seq_log_ratio_max),
            offset_of!(LossParams, beta),
            offset_of!(LossParams, n_tok_denom),
            offset_of!(LossParams, n_seq_denom),
            offset_of!(LossParams, horizon),
            offset_of!(LossParams, pad1),
        ];
        v.iter().map(|&x| x as u32).collect()
    }

    /// `CareLossStats`.
    pub fn stats() -> Vec<u32> {
        let v = [
            size_of::<LossStatsRaw>(),
            align_of::<LossStatsRaw>(),
            offset_of!(LossStatsRaw, loss),
            offset_of!(LossStatsRaw, ppo_kl_sum),
            offset_of!(LossStatsRaw, kl_sum),
            offset_of!(LossStatsRaw, ratio_sum),
            offset_of!(LossStatsRaw, ratio_min),
            offset_of!(LossStatsRaw, ratio_max),
            offset_of!(LossStatsRaw, tokens),
            offset_of!(LossStatsRaw, sequences),
            offset_of!(LossStatsRaw, clipped),
            offset_of!(LossStatsRaw, clipped_low),
            offset_of!(LossStatsRaw, clipped_high),
            offset_of!(LossStatsRaw, dual_clipped),
            offset_of!(LossStatsRaw, clamped_log_ratios),
            offset_of!(LossStatsRaw, non_finite),
        ];
        v.iter().map(|&x| x as u32).collect()
    }

    /// `CareLossDenoms`.
    pub fn denoms() -> Vec<u32> {
        let v = [
            size_of::<LossDenomsRaw>(),
            align_of::<LossDenomsRaw>(),
            offset_of!(LossDenomsRaw, n_tok),
            offset_of!(LossDenomsRaw, n_seq),
            offset_of!(LossDenomsRaw, horizon),
            offset_of!(LossDenomsRaw, pad0),
        ];
        v.iter().map(|&x| x as u32).collect()
    }
}
