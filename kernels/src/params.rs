//! Kernel parameter structs, passed by value to the kernels: `#[repr(C)]` mirrors of the structs
//! in `kernels/cuda/*.cu`, one per kernel family ([`AdvParams`], [`BatchStdParams`],
//! [`LossParams`], [`LogSoftmaxParams`], [`ReturnsParams`], [`WhitenParams`]), plus the device
//! structs the kernels write ([`LossStatsRaw`], [`RolloutStatsRaw`], [`LossDenomsRaw`],
//! [`WhitenStatsRaw`]) and the status bits. The host-emulation tests compare
//! every size, alignment and field offset with the C++ compiler's view of the same source, and
//! `tests/registry.rs` compares every size and alignment with the PTX.
//!
//! Pointers are device addresses (`u64`, 0 = absent), as a trainer holds them: a PyTorch
//! `data_ptr()`, a `CUdeviceptr`, or a host address under the emulator.

use core::mem::offset_of;

use care_core::grpo::{
    AdvantageOptions, Aggregation, Bypass, Combine, FieldKind, IsLevel, KlEstimator, LossOptions,
    LossStats, RatioLevel, Rejection, RejectionMode, RolloutStats, Scale, SingletonPolicy,
    StatsField, StdKind,
};

/// Status bit: a group had exactly one valid sample under [`SingletonPolicy::Error`].
pub const STATUS_SINGLETON: u32 = 1;
/// Status bit: a valid sample had an infinite reward.
pub const STATUS_NON_FINITE: u32 = 2;
/// Status bit: a reduced moment passed to the finalize phase is negative or not finite.
pub const STATUS_INVALID_MOMENTS: u32 = 4;
/// Log-softmax status bit (its own word): a counted row's target was outside `0..V` (its
/// log-prob is NaN).
pub const STATUS_BAD_TARGET: u32 = 1;
/// Log-softmax status bit: a counted row had no softmax (a NaN or `+inf` logit, a scaled logit
/// that overflowed to `+inf`, or every logit `-inf`); its outputs are not finite.
pub const STATUS_LSM_NON_FINITE: u32 = 2;

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
    /// `f32[n]` external baselines (ReMax), or 0.
    pub baselines: u64,
    /// `u32[n]` response lengths (OPO), or 0.
    pub lengths: u64,
    /// `f64` device scalar: the GPG factor, written by `group_alpha_f32`, read under
    /// [`Reweight::Gpg`](care_core::grpo::Reweight::Gpg).
    pub alpha: u64,
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
    /// Lanes per group (8, 16 or 32: segments of a warp), or 0: one block per group.
    pub warp_per_group: u32,
    /// Added to the std before dividing.
    pub eps: f32,
    /// Phase: [`ADV_LOCAL`], [`ADV_PARTIAL_SUMS`], [`ADV_PARTIAL_SQUARES`], [`ADV_FINALIZE`].
    pub mode: u32,
    /// The std floor (`max(std, std_floor) + eps`).
    pub std_floor: f32,
    /// [`Reweight`](care_core::grpo::Reweight) as its `u32` value.
    pub reweight: u32,
}

impl AdvParams {
    /// Copies the options' fields (everything but pointers, sizes and the team mode).
    pub fn with_options(mut self, o: &AdvantageOptions) -> Self {
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
        self.std_floor = o.std_floor as f32;
        self.reweight = o.reweight as u32;
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
    /// [`BatchStdWorkRaw`] in the workspace (the rewards' per-block slots), or 0 from group
    /// moments.
    pub work: u64,
}

/// Status bit of `discounted_returns_f32` and `gae_f32` (their word at `workspace[0]`): the
/// sequence offsets are not a CSR layout of the tokens.
pub const STATUS_TOKENS_LAYOUT: u32 = 1;
/// Status bit of the whitening statistics ([`WhitenStatsRaw::status`]): a counted value is not
/// finite; `whiten_apply_f32` then leaves the values untouched.
pub const STATUS_WHITEN_NON_FINITE: u32 = 1;

/// Parameters of `discounted_returns_f32` and `gae_f32` (C `CareReturnsParams`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ReturnsParams {
    /// `f32[n_tok]` token rewards.
    pub rewards: u64,
    /// `f32[n_tok]` critic values (`gae_f32`), or 0.
    pub values: u64,
    /// `u32[n_seq + 1]` CSR sequence offsets.
    pub seq_offsets: u64,
    /// `u8[n_tok]` token mask (0 = masked) or 0 (every token counts).
    pub mask: u64,
    /// `f32[n_tok]` GAE advantages (output of `gae_f32`), or 0.
    pub adv: u64,
    /// `f32[n_tok]` returns (output).
    pub ret: u64,
    /// `u32` status word ([`STATUS_TOKENS_LAYOUT`] is OR-ed in).
    pub status: u64,
    /// Number of sequences.
    pub n_seq: u32,
    /// Number of tokens.
    pub n_tok: u32,
    /// Discount `gamma`.
    pub gamma: f64,
    /// GAE `lambda`.
    pub lambda: f64,
    /// 1: the return restarts at 0 before a masked token
    /// ([`MaskedToken::Reset`](care_core::grpo::MaskedToken::Reset); returns only).
    pub masked_reset: u32,
    /// Padding.
    pub pad0: u32,
    /// `f64[n_tok]` or 0: the values to whiten, unrounded (the returns, or the GAE advantages,
    /// which then are written only here).
    pub wide: u64,
}

/// Parameters of `whiten_stats_{f32,f64}` and `whiten_apply_{f32,f64}` (C `CareWhitenParams`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WhitenParams {
    /// `f32[n]` values, whitened in place.
    pub x: u64,
    /// `u8[n]` mask or 0.
    pub mask: u64,
    /// The [`WhitenStatsRaw`] in the workspace.
    pub stats: u64,
    /// Number of values.
    pub n: u64,
    /// Added to the variance under the square root.
    pub eps: f64,
    /// 1: unbiased variance (`n - 1`), 0: biased.
    pub unbiased: u32,
    /// Padding.
    pub pad0: u32,
    /// Added to the count in the two means (verl's `masked_mean`: `1e-8`; 0 = exact).
    pub count_eps: f64,
    /// `f64[n]` or 0: the values the `_f64` entries whiten into `x` (32-byte aligned at every
    /// index where `x` is 16-byte aligned, for the vector path).
    pub wide: u64,
}

/// The whitening statistics `whiten_stats_f32` leaves at the start of the workspace (C
/// `CareWhitenStats`); its first word is the status word.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct WhitenStatsRaw {
    /// [`STATUS_WHITEN_NON_FINITE`] or 0.
    pub status: u32,
    /// Padding.
    pub pad0: u32,
    /// Counted values.
    pub count: f64,
    /// Their mean (0 when none).
    pub mean: f64,
    /// Sum of squared deviations from the mean.
    pub m2: f64,
    /// `1 / sqrt(var + eps)`.
    pub scale: f64,
    /// The std under the chosen estimator (0 where undefined), as `care_core::grpo::whiten`
    /// returns it.
    pub std: f64,
}

/// One block's partial moments of the whitening and the batch std (C `CareMoments`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct MomentsRaw {
    /// Counted values of the block.
    pub count: f64,
    /// Their mean.
    pub mean: f64,
    /// Their centered sum of squares.
    pub m2: f64,
    /// 1: a counted value is not finite.
    pub bad: u32,
    /// Padding.
    pub pad0: u32,
}

/// The batch std's slots (C `CareBatchStdWork`): the arrival counter of the slot merge (zeroed
/// by the plan) and one slot per block of `batch_std_f32`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BatchStdWorkRaw {
    /// Blocks that have published their slot.
    pub arrivals: u32,
    /// Padding.
    pub pad0: [u32; 3],
    /// One per block.
    pub slots: [MomentsRaw; STAT_SLOTS],
}

/// The whitening's workspace (C `CareWhitenWork`): the [`WhitenStatsRaw`] first, then the
/// arrival counter of the slot merge (zeroed by the plan) and one slot per block of
/// `whiten_stats_f32`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct WhitenWorkRaw {
    /// The merged statistics.
    pub stats: WhitenStatsRaw,
    /// Blocks that have published their slot.
    pub arrivals: u32,
    /// Padding.
    pub pad0: [u32; 3],
    /// One per block.
    pub slots: [MomentsRaw; STAT_SLOTS],
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
    /// 1: verl's bypass mode ([`Bypass::On`](care_core::grpo::Bypass::On)): `logp_old` holds
    /// the rollout log-probs (the host passes them there), the rollout correction's proximal
    /// log-probs are `logp` and its weights are not applied.
    pub bypass: u32,
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
    /// GMPO: the floor under the rollout weights in their geometric mean.
    pub gmpo_w_floor: f32,
    /// `T[n_tok]` rollout log-probs, or 0 (no rollout correction, no diagnostics).
    pub logp_rollout: u64,
    /// [`RolloutStatsRaw`] device struct (accumulated into) or 0.
    pub rollout_stats: u64,
    /// [`PolicyLoss`](care_core::grpo::PolicyLoss) as its `u32` value.
    pub policy: u32,
    /// [`IsLevel`] as its `u32` value.
    pub is_level: u32,
    /// 1: [`RejectionMode::ZeroWeight`].
    pub rej_zero: u32,
    /// 1: the rollout correction's weights and rejections apply (with `logp_rollout`).
    pub roll_on: u32,
    /// SAPO temperature for `A > 0`.
    pub sapo_tau_pos: f32,
    /// SAPO temperature for `A <= 0`.
    pub sapo_tau_neg: f32,
    /// Upper truncation bound of the importance weights.
    pub is_threshold: f32,
    /// Lower truncation bound of the importance weights.
    pub is_threshold_low: f32,
    /// Bound on the rollout log ratio.
    pub roll_clamp: f32,
    /// Bit `k`: [`Rejection`] `k` is on.
    pub rej_on: u32,
    /// Per [`Rejection`]: `ln(lower)` for the `k1` criteria (`-inf`: no lower bound), else 0.
    pub rej_lower: [f32; 11],
    /// Per [`Rejection`]: `ln(upper)` for the `k1` criteria, `upper` for the others.
    pub rej_upper: [f32; 11],
    /// [`Dtype::number`](care_core::Dtype::number) of the log-probs (the denominators kernel
    /// reads them for the rollout correction).
    pub dtype: u32,
    /// Padding.
    pub pad2: u32,
    /// Clip-Cov / KL-Cov: the share of counted tokens selected.
    pub cov_ratio: f64,
    /// Clip-Cov: candidates have a covariance strictly above this.
    pub clip_cov_lb: f64,
    /// Clip-Cov: candidates have a covariance strictly below this.
    pub clip_cov_ub: f64,
    /// KL-Cov: the coefficient of `|delta|` on a selected token.
    pub kl_cov_coef: f32,
    /// `grpo_cov_radix`: the radix round, `0..COV_ROUNDS`.
    pub cov_round: u32,
    /// [`CovWorkRaw`] device struct, or 0: nothing is selected.
    pub cov_work: u64,
    /// `u64[n_tok]` device array of candidate keys (with `cov_work`).
    pub cov_keys: u64,
    /// VESPO: the Gamma weight's power for `A >= 0`.
    pub vespo_k_pos: f32,
    /// VESPO: its decay for `A >= 0`.
    pub vespo_lambda_pos: f32,
    /// VESPO: the power for `A < 0`.
    pub vespo_k_neg: f32,
    /// VESPO: the decay for `A < 0`.
    pub vespo_lambda_neg: f32,
    /// [`LossWorkRaw`] in the workspace (the statistics' per-block slots), required with
    /// `stats` or `rollout_stats`; 0 when neither is wanted.
    pub work: u64,
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
            Aggregation::TokenSumNorm => 5,
        };
        self.kl = match o.kl_estimator {
            KlEstimator::K1 => 0,
            KlEstimator::Abs => 1,
            KlEstimator::K2 => 2,
            KlEstimator::K3 => 3,
        };
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
        self.seq_level = match o.ratio_level {
            RatioLevel::Token => 0,
            RatioLevel::Sequence => 1,
            RatioLevel::SequenceToken => 2,
        };
        self.policy = o.policy_loss as u32;
        self.bypass = u32::from(o.bypass == Bypass::On);
        self.gmpo_w_floor = o.gmpo_weight_floor as f32;
        self.vespo_k_pos = o.vespo_k_pos as f32;
        self.vespo_lambda_pos = o.vespo_lambda_pos as f32;
        self.vespo_k_neg = o.vespo_k_neg as f32;
        self.vespo_lambda_neg = o.vespo_lambda_neg as f32;
        self.cov_ratio = o.cov_ratio;
        self.clip_cov_lb = o.clip_cov_lb;
        self.clip_cov_ub = o.clip_cov_ub;
        self.kl_cov_coef = o.kl_cov_coef as f32;
        self.sapo_tau_pos = o.sapo_tau_pos as f32;
        self.sapo_tau_neg = o.sapo_tau_neg as f32;
        let r = &o.rollout;
        self.is_level = match r.is_level {
            IsLevel::Off => 0,
            IsLevel::Token => 1,
            IsLevel::Sequence => 2,
        };
        self.rej_zero = u32::from(r.rejection_mode == RejectionMode::ZeroWeight);
        self.is_threshold = r.is_threshold as f32;
        self.is_threshold_low = r.is_threshold_low as f32;
        self.roll_clamp = r.log_ratio_clamp as f32;
        self.rej_on = 0;
        for c in Rejection::ALL {
            let (k, b) = (c as usize, r.bound(c));
            if !b.on() {
                (self.rej_lower[k], self.rej_upper[k]) = (0.0, 0.0);
                continue;
            }
            self.rej_on |= 1 << k;
            // The k1 criteria compare log ratios: the bounds in log space (ln 0 = -inf: none),
            // rounded to f32 once.
            (self.rej_lower[k], self.rej_upper[k]) = if c.is_k1() {
                (b.lower.ln() as f32, b.upper.ln() as f32)
            } else {
                (0.0, b.upper as f32)
            };
        }
        self
    }

    /// Whether some denominator must come from the device pre-pass (`grpo_loss_denoms`).
    pub fn needs_denoms(&self) -> bool {
        !(self.n_tok_denom > 0.0 && self.n_seq_denom > 0.0 && self.horizon > 0.0)
    }
}

/// Parameters of `logsoftmax_{fwd,bwd}_{f32,bf16,f16}` (C `CareLsmParams`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LogSoftmaxParams {
    /// `T` logits; row `i` starts at element `i * stride`.
    pub logits: u64,
    /// `i32[n]` or `i64[n]` target ids.
    pub targets: u64,
    /// `u8[n]` token mask (0 = row not read, outputs 0) or 0.
    pub mask: u64,
    /// Forward: `f32[n]` log-probs.
    pub logp: u64,
    /// Forward: `f32[n]` entropy output or 0; backward: `f32[n]` input (needed with `dentropy`).
    pub entropy: u64,
    /// Forward: `f32[n]` log-sum-exp output or 0; backward: `f32[n]` input (required).
    pub lse: u64,
    /// Backward: `f32[n]` `dL/dlogp` or 0.
    pub dlogp: u64,
    /// Backward: `f32[n]` `dL/dentropy` or 0 (no entropy term).
    pub dentropy: u64,
    /// Backward: `T` output, row `i` at element `i * dstride`; may equal `logits` (in place).
    pub dlogits: u64,
    /// `u32` status word ([`STATUS_BAD_TARGET`], [`STATUS_LSM_NON_FINITE`] are OR-ed in) or 0.
    pub status: u64,
    /// Rows.
    pub n: u64,
    /// Elements between two logits rows (`>= vocab`).
    pub stride: u64,
    /// Elements between two dlogits rows (`>= vocab`).
    pub dstride: u64,
    /// Vocabulary size (`>= 1`).
    pub vocab: u32,
    /// 1: targets are `i64`.
    pub targets_i64: u32,
    /// 1: one block per row, 0: one warp per row.
    pub block_team: u32,
    /// `1 / T`.
    pub inv_temp: f32,
}

/// Loss statistics as the kernel accumulates them (C `CareLossStats`): `f32` sums and `u32`
/// counts, added once per launch by the slot merge (see [`LossWorkRaw`]). Convert with [`LossStatsRaw::to_core`].
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
    pub log_ratio_clamped: u32,
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
        log_ratio_clamped: 0,
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
            log_ratio_clamped: f64::from(self.log_ratio_clamped),
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

macro_rules! device_fields {
    ($t:ty; $($field:ident: $kind:ident $combine:ident),* $(,)?) => {
        [$(StatsField {
            name: stringify!($field),
            kind: FieldKind::$kind,
            offset: offset_of!($t, $field),
            combine: Combine::$combine,
        }),*]
    };
}

/// Checks at compile time that a device stats table covers its struct densely and in order.
macro_rules! dense_table {
    ($table:ident, $t:ty) => {
        const _: () = {
            let mut end = 0;
            let mut i = 0;
            while i < $table.len() {
                assert!($table[i].offset == end, "device stats table out of order");
                end += $table[i].kind.size();
                i += 1;
            }
            assert!(end == size_of::<$t>(), "device stats table misses a field");
        };
    };
}

/// The fields of the device accumulator [`LossStatsRaw`] (C `CareLossStats`) in declaration
/// order: the same names and combine rules as [`care_core::grpo::LOSS_STATS_LAYOUT`] (checked
/// by a test), as `f32` sums and extrema first, then `u32` counts.
pub const LOSS_STATS_DEVICE_LAYOUT: [StatsField; 14] = device_fields![LossStatsRaw;
    loss: F32 Sum,
    ppo_kl_sum: F32 Sum,
    kl_sum: F32 Sum,
    ratio_sum: F32 Sum,
    ratio_min: F32 Min,
    ratio_max: F32 Max,
    tokens: U32 Sum,
    sequences: U32 Sum,
    clipped: U32 Sum,
    clipped_low: U32 Sum,
    clipped_high: U32 Sum,
    dual_clipped: U32 Sum,
    log_ratio_clamped: U32 Sum,
    non_finite: U32 Sum,
];

dense_table!(LOSS_STATS_DEVICE_LAYOUT, LossStatsRaw);

/// The rollout correction's diagnostics as the loss kernel accumulates them (C
/// `CareRolloutStats`): `f32` sums, then `u32` counts, added once per launch by the slot
/// merge (see [`LossWorkRaw`]); initialize to zero.
/// Convert with [`RolloutStatsRaw::to_core`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct RolloutStatsRaw {
    /// [`RolloutStats::weight_sum`].
    pub weight_sum: f32,
    /// [`RolloutStats::kl_sum`].
    pub kl_sum: f32,
    /// [`RolloutStats::k3_sum`].
    pub k3_sum: f32,
    /// [`RolloutStats::log_ppl_diff_sum`].
    pub log_ppl_diff_sum: f32,
    /// [`RolloutStats::log_ppl_abs_diff_sum`].
    pub log_ppl_abs_diff_sum: f32,
    /// [`RolloutStats::chi2_token_sum`].
    pub chi2_token_sum: f32,
    /// [`RolloutStats::chi2_seq_sum`].
    pub chi2_seq_sum: f32,
    /// [`RolloutStats::tokens`].
    pub tokens: u32,
    /// [`RolloutStats::sequences`].
    pub sequences: u32,
    /// [`RolloutStats::rejected_tokens`].
    pub rejected_tokens: u32,
    /// [`RolloutStats::rejected_sequences`].
    pub rejected_sequences: u32,
    /// [`RolloutStats::truncated`].
    pub truncated: u32,
    /// [`RolloutStats::non_finite`].
    pub non_finite: u32,
}

impl RolloutStatsRaw {
    /// The same statistics as [`care_core::grpo::RolloutStats`].
    pub fn to_core(&self) -> RolloutStats {
        RolloutStats {
            tokens: f64::from(self.tokens),
            sequences: f64::from(self.sequences),
            rejected_tokens: f64::from(self.rejected_tokens),
            rejected_sequences: f64::from(self.rejected_sequences),
            truncated: f64::from(self.truncated),
            weight_sum: f64::from(self.weight_sum),
            kl_sum: f64::from(self.kl_sum),
            k3_sum: f64::from(self.k3_sum),
            log_ppl_diff_sum: f64::from(self.log_ppl_diff_sum),
            log_ppl_abs_diff_sum: f64::from(self.log_ppl_abs_diff_sum),
            chi2_token_sum: f64::from(self.chi2_token_sum),
            chi2_seq_sum: f64::from(self.chi2_seq_sum),
            non_finite: f64::from(self.non_finite),
        }
    }
}

/// The fields of [`RolloutStatsRaw`] (C `CareRolloutStats`) in declaration order, each named as
/// its [`RolloutStats`] field; every one is a sum.
pub const ROLLOUT_STATS_DEVICE_LAYOUT: [StatsField; 13] = device_fields![RolloutStatsRaw;
    weight_sum: F32 Sum,
    kl_sum: F32 Sum,
    k3_sum: F32 Sum,
    log_ppl_diff_sum: F32 Sum,
    log_ppl_abs_diff_sum: F32 Sum,
    chi2_token_sum: F32 Sum,
    chi2_seq_sum: F32 Sum,
    tokens: U32 Sum,
    sequences: U32 Sum,
    rejected_tokens: U32 Sum,
    rejected_sequences: U32 Sum,
    truncated: U32 Sum,
    non_finite: U32 Sum,
];

dense_table!(ROLLOUT_STATS_DEVICE_LAYOUT, RolloutStatsRaw);

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

/// Per-block slots of the statistics that span blocks (C `CARE_STAT_SLOTS`): the loss pass,
/// the whitening statistics and the batch std launch at most this many blocks, each writes its
/// partial result into its own slot, and the last block to finish merges the slots in slot
/// order, so the result does not depend on the block schedule.
pub const STAT_SLOTS: usize = 1024;

/// One block's partial statistics of the loss pass (C `CareLossSlot`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct LossSlotRaw {
    /// The block's loss statistics.
    pub loss: LossStatsRaw,
    /// The block's rollout diagnostics.
    pub roll: RolloutStatsRaw,
    /// Padding.
    pub pad0: u32,
}

/// The loss pass's workspace (C `CareLossWork`): the default denominators, the arrival counter
/// of the slot merge (zeroed by the plan before each launch) and one slot per block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct LossWorkRaw {
    /// Written by `grpo_loss_denoms`.
    pub denoms: LossDenomsRaw,
    /// Blocks that have published their slot.
    pub arrivals: u32,
    /// Padding.
    pub pad0: [u32; 3],
    /// One per block of the loss pass.
    pub slots: [LossSlotRaw; STAT_SLOTS],
}

/// Slots of the per-block sums of the covariance means: the largest grid of `grpo_cov_means`
/// and `grpo_cov_keys` (C `CARE_COV_PARTS`).
pub const COV_PARTS: usize = 1024;
/// Rounds of the covariance radix select, 8 bits of the 64-bit key each (C `CARE_COV_ROUNDS`).
pub const COV_ROUNDS: u32 = 8;

/// The device workspace of the covariance selection of Clip-Cov and KL-Cov (C `CareCovWork`):
/// the per-block sums of the means, the radix histograms and the cut the loss pass reads.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct CovWorkRaw {
    /// Per block of `grpo_cov_means`: the sum of `A` over its counted tokens.
    pub part_a: [f64; COV_PARTS],
    /// Per block: the sum of `logp`.
    pub part_l: [f64; COV_PARTS],
    /// Per block: the counted tokens.
    pub part_n: [u32; COV_PARTS],
    /// The radix histograms, one per round.
    pub hist: [[u32; 256]; COV_ROUNDS as usize],
    /// The cut `K`: token `t` is selected iff `key > K`, or `key == K` and `t < tie_end`.
    pub cut_key: u64,
    /// The end of the ties taken at `K`, in token order.
    pub tie_end: u32,
    /// Tokens selected (`care_core`'s `LossOutput::cov_selected`).
    pub selected: u32,
    /// Tokens that count in the loss (`N`).
    pub counted: u32,
    /// Tokens to select, `max(1, floor(cov_ratio * N))` (0 when `N = 0`).
    pub k: u32,
    /// Candidates (tokens with a candidate key).
    pub candidates: u32,
    /// Padding.
    pub pad0: u32,
}

/// Field offsets of each struct, in C declaration order, preceded by size and alignment: the
/// format of the emulator's `emu_layout_*` functions, for the layout tests.
pub mod layout {
    use super::*;
    use core::mem::{align_of, offset_of, size_of};

    macro_rules! layout {
        ($t:ty: $($field:ident),+ $(,)?) => {
            [size_of::<$t>(), align_of::<$t>(), $(offset_of!($t, $field)),+]
                .iter()
                .map(|&x| x as u32)
                .collect()
        };
    }

    /// `CareAdvParams`.
    pub fn adv() -> Vec<u32> {
        layout!(AdvParams: rewards, valid, offsets, adv, group_stats, batch_std, tok_offsets,
            tok_mask, adv_tok, status, sums, m2, baselines, lengths, alpha, n, num_groups,
            group_size, baseline, scale, unbiased, singleton, warp_per_group, eps, mode,
            std_floor, reweight)
    }

    /// `CareGroupStats` (= `care_core::grpo::GroupStats`).
    pub fn group_stats() -> Vec<u32> {
        use care_core::grpo::GroupStats;
        layout!(GroupStats: count, mean, std, zero_variance)
    }

    /// `CareBatchStdParams`.
    pub fn batch_std() -> Vec<u32> {
        layout!(BatchStdParams: rewards, valid, out_std, sums, m2, n, unbiased, num_groups, pad0,
            work)
    }

    /// `CareLossParams`.
    pub fn loss() -> Vec<u32> {
        layout!(LossParams: logp, logp_old, logp_ref, adv, mask, seq_offsets, grad, stats,
            denoms, n_seq, n_tok, adv_per_token, grad_in_input_dtype, agg, kl, seq_level, bypass,
            eps_low, eps_high, dual_clip, log_ratio_clamp, kl_clamp, k3_clamp, seq_log_ratio_max,
            beta, n_tok_denom, n_seq_denom, horizon, gmpo_w_floor, logp_rollout, rollout_stats, policy,
            is_level, rej_zero, roll_on, sapo_tau_pos, sapo_tau_neg, is_threshold,
            is_threshold_low, roll_clamp, rej_on, rej_lower, rej_upper, dtype, pad2, cov_ratio,
            clip_cov_lb, clip_cov_ub, kl_cov_coef, cov_round, cov_work, cov_keys, vespo_k_pos,
            vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg, work)
    }

    /// `CareBatchStdWork`.
    pub fn batch_std_work() -> Vec<u32> {
        layout!(BatchStdWorkRaw: arrivals, pad0, slots)
    }

    /// `CareWhitenWork` (then `sizeof(CareMoments)`).
    pub fn whiten_work() -> Vec<u32> {
        let mut v: Vec<u32> = layout!(WhitenWorkRaw: stats, arrivals, pad0, slots);
        v.push(size_of::<MomentsRaw>() as u32);
        v
    }

    /// `CareLossWork` (its slot type's size first).
    pub fn loss_work() -> Vec<u32> {
        let mut v: Vec<u32> = layout!(LossWorkRaw: denoms, arrivals, pad0, slots);
        v.push(size_of::<LossSlotRaw>() as u32);
        v
    }

    /// `CareRolloutStats`, from [`ROLLOUT_STATS_DEVICE_LAYOUT`].
    pub fn rollout_stats() -> Vec<u32> {
        [size_of::<RolloutStatsRaw>(), align_of::<RolloutStatsRaw>()]
            .into_iter()
            .chain(ROLLOUT_STATS_DEVICE_LAYOUT.iter().map(|f| f.offset))
            .map(|x| x as u32)
            .collect()
    }

    /// `CareReturnsParams`.
    pub fn returns() -> Vec<u32> {
        layout!(ReturnsParams: rewards, values, seq_offsets, mask, adv, ret, status, n_seq, n_tok,
            gamma, lambda, masked_reset, pad0, wide)
    }

    /// `CareWhitenParams`.
    pub fn whiten() -> Vec<u32> {
        layout!(WhitenParams: x, mask, stats, n, eps, unbiased, pad0, count_eps, wide)
    }

    /// `CareWhitenStats`.
    pub fn whiten_stats() -> Vec<u32> {
        layout!(WhitenStatsRaw: status, pad0, count, mean, m2, scale, std)
    }

    /// `CareLsmParams`.
    pub fn log_softmax() -> Vec<u32> {
        layout!(LogSoftmaxParams: logits, targets, mask, logp, entropy, lse, dlogp, dentropy,
            dlogits, status, n, stride, dstride, vocab, targets_i64, block_team, inv_temp)
    }

    /// `CareLossStats`, from [`LOSS_STATS_DEVICE_LAYOUT`].
    pub fn stats() -> Vec<u32> {
        [size_of::<LossStatsRaw>(), align_of::<LossStatsRaw>()]
            .into_iter()
            .chain(LOSS_STATS_DEVICE_LAYOUT.iter().map(|f| f.offset))
            .map(|x| x as u32)
            .collect()
    }

    /// `CareLossDenoms`.
    pub fn denoms() -> Vec<u32> {
        layout!(LossDenomsRaw: n_tok, n_seq, horizon, pad0)
    }

    /// `CareCovWork`.
    pub fn cov_work() -> Vec<u32> {
        layout!(CovWorkRaw: part_a, part_l, part_n, hist, cut_key, tie_end, selected, counted, k,
            candidates, pad0)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use care_core::grpo::LOSS_STATS_LAYOUT;

    #[test]
    fn device_stats_have_the_host_fields_and_rules() {
        // The same set of names (each once) and the same combine rule per name.
        assert_eq!(LOSS_STATS_DEVICE_LAYOUT.len(), LOSS_STATS_LAYOUT.len());
        for d in &LOSS_STATS_DEVICE_LAYOUT {
            let h = LOSS_STATS_LAYOUT.iter().filter(|h| h.name == d.name);
            let h: Vec<_> = h.collect();
            assert_eq!(h.len(), 1, "device field {} is not one host field", d.name);
            assert_eq!(h[0].combine, d.combine, "{}", d.name);
            assert_ne!(d.kind, FieldKind::F64, "{}", d.name);
        }
    }

    #[test]
    fn to_core_maps_every_field_by_name() {
        // Distinct positive values per device field (ratio_max > 0, so no -inf fallback).
        let mut raw = LossStatsRaw::EMPTY;
        let bytes = bytemuck::bytes_of_mut(&mut raw);
        for (i, f) in LOSS_STATS_DEVICE_LAYOUT.iter().enumerate() {
            let v = i as u32 + 1;
            let b = match f.kind {
                FieldKind::F32 => (v as f32).to_ne_bytes(),
                _ => v.to_ne_bytes(),
            };
            bytes[f.offset..f.offset + 4].copy_from_slice(&b);
        }
        let host = raw.to_core();
        for (i, d) in LOSS_STATS_DEVICE_LAYOUT.iter().enumerate() {
            let h = LOSS_STATS_LAYOUT.iter().find(|h| h.name == d.name).unwrap();
            // SAFETY: LOSS_STATS_LAYOUT puts an f64 at every offset of `LossStats`.
            let got = unsafe {
                (&raw const host)
                    .cast::<u8>()
                    .add(h.offset)
                    .cast::<f64>()
                    .read()
            };
            assert_eq!(got, (i + 1) as f64, "{}", d.name);
        }
        // The empty accumulator converts to the empty host stats.
        assert_eq!(LossStatsRaw::EMPTY.to_core(), LossStats::EMPTY);
    }

    #[test]
    #[allow(clippy::panic)]
    fn rollout_to_core_maps_every_field_by_name() {
        // Distinct values per device field, read back through the host field of the same name.
        let mut raw = RolloutStatsRaw::default();
        let bytes = bytemuck::bytes_of_mut(&mut raw);
        for (i, f) in ROLLOUT_STATS_DEVICE_LAYOUT.iter().enumerate() {
            let v = i as u32 + 1;
            let b = match f.kind {
                FieldKind::F32 => (v as f32).to_ne_bytes(),
                _ => v.to_ne_bytes(),
            };
            bytes[f.offset..f.offset + 4].copy_from_slice(&b);
        }
        let h = raw.to_core();
        let host = |name: &str| match name {
            "weight_sum" => h.weight_sum,
            "kl_sum" => h.kl_sum,
            "k3_sum" => h.k3_sum,
            "log_ppl_diff_sum" => h.log_ppl_diff_sum,
            "log_ppl_abs_diff_sum" => h.log_ppl_abs_diff_sum,
            "chi2_token_sum" => h.chi2_token_sum,
            "chi2_seq_sum" => h.chi2_seq_sum,
            "tokens" => h.tokens,
            "sequences" => h.sequences,
            "rejected_tokens" => h.rejected_tokens,
            "rejected_sequences" => h.rejected_sequences,
            "truncated" => h.truncated,
            "non_finite" => h.non_finite,
            other => panic!("{other} is not a RolloutStats field"),
        };
        for (i, f) in ROLLOUT_STATS_DEVICE_LAYOUT.iter().enumerate() {
            assert_eq!(host(f.name), (i + 1) as f64, "{}", f.name);
        }
        // Every host field has its device field (13 of each).
        assert_eq!(
            core::mem::size_of::<RolloutStats>(),
            8 * ROLLOUT_STATS_DEVICE_LAYOUT.len()
        );
        assert_eq!(
            RolloutStatsRaw::default().to_core(),
            RolloutStats::default()
        );
    }

    #[test]
    fn loss_params_carry_the_rejection_bounds_in_log_space_for_k1() {
        let mut o = LossOptions::default();
        o.rollout.set_bound(Rejection::TokenK1, 0.5, 2.0);
        o.rollout.set_bound(Rejection::SeqSumK1, 0.0, 4.0);
        o.rollout.set_bound(Rejection::SeqMaxK3, 0.0, 0.25);
        let p = LossParams::default().with_options(&o);
        let bits = (1 << Rejection::TokenK1 as u32)
            | (1 << Rejection::SeqSumK1 as u32)
            | (1 << Rejection::SeqMaxK3 as u32);
        assert_eq!(p.rej_on, bits);
        let k = Rejection::TokenK1 as usize;
        assert_eq!(
            (p.rej_lower[k], p.rej_upper[k]),
            (0.5f64.ln() as f32, 2f64.ln() as f32)
        );
        let k = Rejection::SeqSumK1 as usize;
        assert_eq!(
            (p.rej_lower[k], p.rej_upper[k]),
            (f32::NEG_INFINITY, 4f64.ln() as f32)
        );
        let k = Rejection::SeqMaxK3 as usize;
        assert_eq!((p.rej_lower[k], p.rej_upper[k]), (0.0, 0.25));
    }
}
