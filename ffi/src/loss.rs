//! The policy loss, its gradient and stats on the CPU (SPEC §10, the policy-loss family of
//! SPEC §17 and the rollout correction of SPEC §16), and the rollout correction on its own.

use core::ffi::{c_char, c_void};
use core::mem::{align_of, size_of};

use care_core::Dtype;
use care_core::grpo::{
    Advantages, Aggregation, Bypass, IsLevel, KlEstimator, LogProb, LossInputs, LossOptions,
    LossOutput, LossPreset, LossStats, PolicyLoss, RatioLevel, RejectBound, Rejection,
    RejectionMode, RolloutInputs, RolloutOptions, RolloutStats, SequenceCount,
};
use half::{bf16, f16};

use crate::args::{self, Out};
use crate::result::{care_result, map_error};

/// How per-token losses are combined (`care_loss_options.aggregation`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum care_aggregation {
    /// `w = 1 / N_tok` (default).
    CARE_AGGREGATION_TOKEN_MEAN = 0,
    /// `w = 1 / (n_i * N_seq)`.
    CARE_AGGREGATION_SEQ_MEAN_TOKEN_MEAN = 1,
    /// `w = 1 / N_seq`.
    CARE_AGGREGATION_SEQ_MEAN_TOKEN_SUM = 2,
    /// `w = 1 / (N_seq * H)` (Dr. GRPO).
    CARE_AGGREGATION_SEQ_MEAN_TOKEN_SUM_NORM = 3,
    /// `w = 1`.
    CARE_AGGREGATION_TOKEN_SUM = 4,
    /// `w = 1 / H` (verl's `seq-mean-token-sum-norm` until 2026: no sequence mean).
    CARE_AGGREGATION_TOKEN_SUM_NORM = 5,
}

/// The KL-to-reference estimator (`care_loss_options.kl_estimator`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum care_kl_estimator {
    /// `k1 = -x`.
    CARE_KL_K1 = 0,
    /// `|x|`.
    CARE_KL_ABS = 1,
    /// `x^2 / 2`.
    CARE_KL_K2 = 2,
    /// `clamp(exp(x) - x - 1, -Ko, Ko)` (default).
    CARE_KL_K3 = 3,
}

/// Per-token (PPO/GRPO) or per-sequence (GSPO) ratio (`care_loss_options.ratio_level`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum care_ratio_level {
    /// `rho_t = exp(delta_t)` (default).
    CARE_RATIO_TOKEN = 0,
    /// GSPO: one ratio per sequence from the mean log ratio.
    CARE_RATIO_SEQUENCE = 1,
    /// GSPO-token: the sequence ratio's value with each token's own gradient.
    CARE_RATIO_SEQUENCE_TOKEN = 2,
}

/// The policy-gradient term (`care_loss_options.policy_loss`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum care_policy_loss_kind {
    /// The clipped ratio (PPO/GRPO; GSPO with a sequence ratio level; default).
    CARE_POLICY_LOSS_CLIP = 0,
    /// CISPO: the clipped ratio as a detached weight on `A * logp`.
    CARE_POLICY_LOSS_CISPO = 1,
    /// SAPO: a soft sigmoid gate on the ratio (`sapo_tau_pos`, `sapo_tau_neg`).
    CARE_POLICY_LOSS_SAPO = 2,
    /// GPG: `-A * logp`.
    CARE_POLICY_LOSS_GPG = 3,
    /// Clip-Cov: the `cov_ratio` share of tokens with the largest covariance in
    /// `(clip_cov_lb, clip_cov_ub)` gets no gradient (on the GPU with a larger workspace:
    /// `care_gpu_policy_loss_workspace_bytes`).
    CARE_POLICY_LOSS_CLIP_COV = 4,
    /// KL-Cov: `kl_cov_coef * |log ratio|` on the `cov_ratio` share of tokens with the largest
    /// covariance (on the GPU with a larger workspace).
    CARE_POLICY_LOSS_KL_COV = 5,
    /// GMPO: the geometric mean of the token ratios, clipped in log space.
    CARE_POLICY_LOSS_GMPO = 6,
    /// VESPO (TRL `vespo`): a detached Gamma weight of the sequence ratio on `A * logp`
    /// (`vespo_k_pos` ... `vespo_lambda_neg`).
    CARE_POLICY_LOSS_VESPO = 7,
}

/// Which sequences the sequence count of the aggregation counts
/// (`care_loss_options.sequence_count`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum care_sequence_count {
    /// Sequences with at least one counted token (default; verl, OpenRLHF).
    CARE_SEQUENCE_COUNT_NON_EMPTY = 0,
    /// Every sequence of the call (TRL `grpo`, `dr_grpo`, `sapo`; verl `geo_mean`).
    CARE_SEQUENCE_COUNT_ALL = 1,
}

/// Where the ratio's old log-probs come from (`care_loss_options.bypass`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum care_bypass {
    /// `logp_old` as given (NULL: on-policy); importance weights applied (default).
    CARE_BYPASS_OFF = 0,
    /// verl's bypass mode (`loss_type = ppo_clip`): `logp_old` must be NULL and
    /// `logp_rollout` stands in for it; the importance weights are reported, not applied.
    CARE_BYPASS_ON = 1,
}

/// How the rollout correction forms importance weights (`care_rollout_options.is_level`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum care_is_level {
    /// No importance weights (default).
    CARE_IS_OFF = 0,
    /// One truncated weight per token.
    CARE_IS_TOKEN = 1,
    /// One truncated weight per sequence.
    CARE_IS_SEQUENCE = 2,
}

/// What a token the rollout correction rejects becomes (`care_rollout_options.rejection_mode`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum care_rejection_mode {
    /// It leaves the loss and every count (verl; default).
    CARE_REJECTION_DROP = 0,
    /// It keeps its place with importance weight 0 (TRL, OpenRLHF).
    CARE_REJECTION_ZERO_WEIGHT = 1,
}

/// The rejection criteria: each value indexes `care_rollout_options.reject`.
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum care_rejection {
    /// `ln(lower) <= x_t <= ln(upper)`, `x_t = logp_prox_t - logp_rollout_t`.
    CARE_REJECT_TOKEN_K1 = 0,
    /// `x_t^2 / 2 <= upper`.
    CARE_REJECT_TOKEN_K2 = 1,
    /// `exp(x_t) - 1 - x_t <= upper`.
    CARE_REJECT_TOKEN_K3 = 2,
    /// The sequence's sum of `k1` within `[ln(lower), ln(upper)]`.
    CARE_REJECT_SEQ_SUM_K1 = 3,
    /// The sequence's sum of `k2 <= upper`.
    CARE_REJECT_SEQ_SUM_K2 = 4,
    /// The sequence's sum of `k3 <= upper`.
    CARE_REJECT_SEQ_SUM_K3 = 5,
    /// The sequence's mean of `k1` within `[ln(lower), ln(upper)]`.
    CARE_REJECT_SEQ_MEAN_K1 = 6,
    /// The sequence's mean of `k2 <= upper`.
    CARE_REJECT_SEQ_MEAN_K2 = 7,
    /// The sequence's mean of `k3 <= upper`.
    CARE_REJECT_SEQ_MEAN_K3 = 8,
    /// The sequence's max of `k2 <= upper`.
    CARE_REJECT_SEQ_MAX_K2 = 9,
    /// The sequence's max of `k3 <= upper`.
    CARE_REJECT_SEQ_MAX_K3 = 10,
}

/// The number of rejection criteria (`care_rollout_options.reject` entries).
pub const CARE_REJECTION_COUNT: usize = 11;

/// One rejection criterion's bounds: off when `upper` is 0. The `k1` criteria bound the ratio
/// (`lower` 0: no lower bound); the others bound the statistic by `upper`, with `lower` 0.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_reject_bound {
    /// Lower bound (`k1` criteria only), or 0.
    pub lower: f64,
    /// Upper bound, or 0 (off).
    pub upper: f64,
}

/// The rollout correction (`care_loss_options.rollout`): importance weights and rejection from
/// the inference engine's log-probs (`care_loss_inputs.logp_rollout`). Defaults: weights off,
/// `is_threshold` 2, `is_threshold_low` 0, `log_ratio_clamp` 20, no criterion, drop.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_rollout_options {
    /// Upper truncation bound `C` of the importance weights (> 0).
    pub is_threshold: f64,
    /// Lower truncation bound (finite, `0 <= is_threshold_low <= is_threshold`).
    pub is_threshold_low: f64,
    /// Bound on the rollout log ratio before `exp` (> 0; infinity turns it off).
    pub log_ratio_clamp: f64,
    /// One bound per `care_rejection`; every criterion that is on must pass.
    pub reject: [care_reject_bound; CARE_REJECTION_COUNT],
    /// A `care_is_level`.
    pub is_level: u32,
    /// A `care_rejection_mode`.
    pub rejection_mode: u32,
}

/// The rollout correction's diagnostics as sums over counted tokens (the mask's, before
/// rejection) and over sequences with a counted token; they add across micro-batches and
/// ranks. Means: divide by `tokens` or `sequences`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_rollout_stats {
    /// Counted tokens.
    pub tokens: f64,
    /// Sequences with a counted token.
    pub sequences: f64,
    /// Counted tokens some criterion rejects.
    pub rejected_tokens: f64,
    /// Sequences with a rejected token.
    pub rejected_sequences: f64,
    /// Counted tokens whose weight hit a truncation bound.
    pub truncated: f64,
    /// Sum of the importance weights before rejection.
    pub weight_sum: f64,
    /// `sum (logp_rollout - logp_prox)` (the k1 KL estimate of the rollout policy from the
    /// proximal one, unclamped).
    pub kl_sum: f64,
    /// `sum (exp(x) - x - 1)`, unclamped.
    pub k3_sum: f64,
    /// Per sequence: `-mean_t x_t` (the log-perplexity difference).
    pub log_ppl_diff_sum: f64,
    /// Per sequence: `|mean_t x_t|`.
    pub log_ppl_abs_diff_sum: f64,
    /// `sum rho_t^2` (clamped log ratio).
    pub chi2_token_sum: f64,
    /// Per sequence: `(prod_t rho_t)^2` (clamped sum).
    pub chi2_seq_sum: f64,
    /// Counted tokens with a non-finite `logp_prox` or `logp_rollout`.
    pub non_finite: f64,
}

// `care_reject_bound`, `care_rollout_options` and `care_rollout_stats` have the layout of the
// core's `#[repr(C)]` `RejectBound`, `RolloutOptions` and `RolloutStats`.
const _: () = {
    assert!(size_of::<care_reject_bound>() == size_of::<RejectBound>());
    assert!(size_of::<care_rollout_options>() == size_of::<RolloutOptions>());
    assert!(align_of::<care_rollout_options>() == align_of::<RolloutOptions>());
    assert!(size_of::<care_rollout_stats>() == size_of::<RolloutStats>());
    assert!(align_of::<care_rollout_stats>() == align_of::<RolloutStats>());
    assert!(CARE_REJECTION_COUNT == Rejection::ALL.len());
};

/// Named loss option sets (also by name: the constant's suffix in lower case, `"verl"`,
/// `"trl"`, `"verl_seq_mean_token_mean"`, ..., `"openrlhf_gspo"`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum care_loss_preset {
    /// verl vanilla policy loss: eps 0.2/0.2, dual clip 3, token mean.
    CARE_LOSS_PRESET_VERL = 0,
    /// TRL `dapo`: eps 0.2/0.2, no dual clip, token mean.
    CARE_LOSS_PRESET_TRL = 1,
    /// verl vanilla, `seq-mean-token-mean`.
    CARE_LOSS_PRESET_VERL_SEQ_MEAN_TOKEN_MEAN = 2,
    /// verl vanilla, `seq-mean-token-sum`.
    CARE_LOSS_PRESET_VERL_SEQ_MEAN_TOKEN_SUM = 3,
    /// verl vanilla, `seq-mean-token-sum-norm` as verl computed it until 2026 (token sum / H).
    CARE_LOSS_PRESET_VERL_SEQ_MEAN_TOKEN_SUM_NORM = 4,
    /// verl `gspo`: GSPO-token ratio, `seq-mean-token-mean`.
    CARE_LOSS_PRESET_VERL_GSPO = 5,
    /// verl `sapo`: tau 1 / 1.05, `seq-mean-token-mean`.
    CARE_LOSS_PRESET_VERL_SAPO = 6,
    /// verl `cispo`: weight clipped to [0.8, 1.2], token mean.
    CARE_LOSS_PRESET_VERL_CISPO = 7,
    /// verl `gpg`: `-A * logp`, token mean.
    CARE_LOSS_PRESET_VERL_GPG = 8,
    /// verl `clip_cov`.
    CARE_LOSS_PRESET_VERL_CLIP_COV = 9,
    /// verl `kl_cov`.
    CARE_LOSS_PRESET_VERL_KL_COV = 10,
    /// verl `geo_mean` (GMPO).
    CARE_LOSS_PRESET_VERL_GEO_MEAN = 11,
    /// TRL `grpo`: `seq-mean-token-mean` over every row.
    CARE_LOSS_PRESET_TRL_GRPO = 12,
    /// TRL `bnpo`: local token mean.
    CARE_LOSS_PRESET_TRL_BNPO = 13,
    /// TRL `dr_grpo`: token sum over rows times the horizon.
    CARE_LOSS_PRESET_TRL_DR_GRPO = 14,
    /// TRL `dapo`: global token mean.
    CARE_LOSS_PRESET_TRL_DAPO = 15,
    /// TRL `cispo`: weight capped at 5, global token mean.
    CARE_LOSS_PRESET_TRL_CISPO = 16,
    /// TRL `sapo`: tau 1 / 1.05, `grpo` normalization.
    CARE_LOSS_PRESET_TRL_SAPO = 17,
    /// OpenRLHF `ppo`, token-level loss.
    CARE_LOSS_PRESET_OPENRLHF = 18,
    /// OpenRLHF `ppo` with `token_level_loss = False`.
    CARE_LOSS_PRESET_OPENRLHF_SEQ = 19,
    /// OpenRLHF `gspo`: the sequence ratio through the mean.
    CARE_LOSS_PRESET_OPENRLHF_GSPO = 20,
    /// verl `bypass_mode` (`loss_type = ppo_clip`): verl vanilla with `CARE_BYPASS_ON`.
    CARE_LOSS_PRESET_VERL_BYPASS = 21,
    /// TRL `luspo`: the sequence ratio, each sequence's loss times its length, over every row.
    CARE_LOSS_PRESET_TRL_LUSPO = 22,
    /// TRL `vespo`: `CARE_POLICY_LOSS_VESPO`, global token mean.
    CARE_LOSS_PRESET_TRL_VESPO = 23,
}

/// Whether `advantages` holds one value per sequence or one per token.
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum care_advantages_kind {
    /// `advantages[B]`, broadcast to the tokens of each sequence.
    CARE_ADVANTAGES_PER_SEQUENCE = 0,
    /// `advantages[T]`, one per token.
    CARE_ADVANTAGES_PER_TOKEN = 1,
}

/// The element type of log-prob and logits arrays (`care_loss_inputs.dtype`,
/// `care_logits.dtype`). 16-bit types are passed as their raw bit patterns (`uint16_t`, e.g.
/// the storage of `torch.bfloat16` / `torch.float16`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum care_dtype {
    /// `float`.
    CARE_DTYPE_F32 = 0,
    /// bfloat16.
    CARE_DTYPE_BF16 = 1,
    /// IEEE half (f16).
    CARE_DTYPE_F16 = 2,
}

/// A `care_dtype` value as the dtype of that stable number (`care_core::Dtype`, the one dtype
/// table; a test checks the C constants against it).
pub(crate) fn read_dtype(value: u32) -> Result<Dtype, care_result> {
    Dtype::from_number(value).map_err(|e| {
        crate::detail::set(format_args!(
            "dtype {value} is not a care_dtype; valid values: 0 (CARE_DTYPE_F32), 1 \
             (CARE_DTYPE_BF16), 2 (CARE_DTYPE_F16)"
        ));
        map_error(e)
    })
}

/// The inputs of the policy loss for one micro-batch (SPEC §10), shared by `care_policy_loss`,
/// `care_gpu_policy_loss` and (without `logp`) the fused logits paths; host memory for the CPU
/// functions, device memory for the GPU ones.
///
/// Token layout: `seq_offsets[B + 1]` CSR offsets (first 0, non-decreasing, last `T`). `logp`
/// has `T` elements of `dtype`; `logp_old` (absent: on-policy) and `logp_ref` (the KL term,
/// used when `beta > 0`) are optional, of `dtype`, `T` elements each, and so is `logp_rollout`
/// (the inference engine's log-probs: the rollout correction of `care_loss_options.rollout`
/// applies; `CARE_ERR_INVALID_ARGUMENT` on the fused logits paths); `mask` is optional
/// (non-zero = counted, `T` entries); `advantages` has `B` (per sequence) or `T` (per token)
/// values as `advantages_kind` says. Optional arrays are (NULL, 0); every per-token length
/// must equal `logp_len` (`CARE_ERR_LENGTH_MISMATCH`).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_loss_inputs {
    /// `sizeof(care_loss_inputs)`.
    pub struct_size: u32,
    /// A `care_dtype`: the element type of `logp`, `logp_old` and `logp_ref`.
    pub dtype: u32,
    /// Current policy log-probs `[T]`.
    pub logp: *const c_void,
    /// `T`.
    pub logp_len: usize,
    /// Log-probs of the policy that sampled the batch `[T]`, or (NULL, 0).
    pub logp_old: *const c_void,
    /// 0 or `T`.
    pub logp_old_len: usize,
    /// Reference-model log-probs `[T]`, or (NULL, 0).
    pub logp_ref: *const c_void,
    /// 0 or `T`.
    pub logp_ref_len: usize,
    /// CSR sequence offsets `[B + 1]`.
    pub seq_offsets: *const u32,
    /// `B + 1`.
    pub seq_offsets_len: usize,
    /// Token mask `[T]`, or (NULL, 0) for all counted.
    pub mask: *const u8,
    /// 0 or `T`.
    pub mask_len: usize,
    /// Advantages `[B]` or `[T]`.
    pub advantages: *const f32,
    /// `B` or `T`, per `advantages_kind`.
    pub advantages_len: usize,
    /// A `care_advantages_kind`.
    pub advantages_kind: u32,
    /// The longest sequence if known, else 0: a hint for the GPU launch geometry only (any
    /// value gives the same results; the CPU does not read it).
    pub max_seq_len: u32,
    /// Rollout (inference-engine) log-probs `[T]`, or (NULL, 0).
    pub logp_rollout: *const c_void,
    /// 0 or `T`.
    pub logp_rollout_len: usize,
}

/// Whether a `care_advantages_kind` is per token; an unknown kind is
/// `CARE_ERR_INVALID_ARGUMENT`.
pub(crate) fn per_token(kind: u32) -> Result<bool, care_result> {
    match kind {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(crate::detail::fail(
            care_result::CARE_ERR_INVALID_ARGUMENT,
            format_args!(
                "care_loss_inputs.advantages_kind is {kind}; valid values: 0 \
                 (CARE_ADVANTAGES_PER_SEQUENCE), 1 (CARE_ADVANTAGES_PER_TOKEN)"
            ),
        )),
    }
}

/// Advantages of the kind the C enum says.
pub(crate) fn advantages(kind: u32, adv: &[f32]) -> Result<Advantages<'_>, care_result> {
    Ok(if per_token(kind)? {
        Advantages::PerToken(adv)
    } else {
        Advantages::PerSequence(adv)
    })
}

/// Describes the fault behind a `CARE_ERR_LENGTH_MISMATCH` or `CARE_ERR_INVALID_LAYOUT` of a
/// call on `c` (nothing for other codes): the first per-token array whose length is not `t`
/// (the length of `t_name`), the advantages against their kind, the outputs `outs` (name,
/// length; each must be `t`) and, when `offsets` holds the host sequence offsets, the first
/// fault in them. The code came from whichever check ran first; this names a fault of the
/// same class, so the detail never contradicts the code. Returns `code`.
pub(crate) fn explain(
    code: care_result,
    c: &care_loss_inputs,
    t: usize,
    t_name: &str,
    outs: &[(&str, usize)],
    offsets: Option<&[u32]>,
) -> care_result {
    use crate::detail::set_if_empty;
    if code == care_result::CARE_ERR_INVALID_LAYOUT {
        if c.seq_offsets_len == 0 {
            set_if_empty(format_args!(
                "care_loss_inputs.seq_offsets_len is 0; the offsets need B + 1 entries, \
                 [0] for an empty batch"
            ));
        } else if let Some(f) = offsets.and_then(|o| care_core::grpo::offsets_fault(o, t)) {
            set_if_empty(format_args!(
                "{}",
                f.named("care_loss_inputs.seq_offsets", t_name)
            ));
        }
        return code;
    }
    if code != care_result::CARE_ERR_LENGTH_MISMATCH {
        return code;
    }
    let token_arrays = [
        ("logp_old_len", c.logp_old.is_null(), c.logp_old_len),
        ("logp_ref_len", c.logp_ref.is_null(), c.logp_ref_len),
        (
            "logp_rollout_len",
            c.logp_rollout.is_null(),
            c.logp_rollout_len,
        ),
        ("mask_len", c.mask.is_null(), c.mask_len),
    ];
    for (name, absent, len) in token_arrays {
        if !absent && len != t {
            set_if_empty(format_args!(
                "care_loss_inputs.{name} is {len} but {t_name} is {t}; every per-token array \
                 has one entry per token"
            ));
            return code;
        }
    }
    let b = c.seq_offsets_len.saturating_sub(1);
    match per_token(c.advantages_kind) {
        Ok(true) if c.advantages_len != t => set_if_empty(format_args!(
            "care_loss_inputs.advantages_len is {} but {t_name} is {t}; per-token advantages \
             (CARE_ADVANTAGES_PER_TOKEN) have one entry per token",
            c.advantages_len
        )),
        Ok(false) if c.advantages_len != b => set_if_empty(format_args!(
            "care_loss_inputs.advantages_len is {} but there are {b} sequences \
             (seq_offsets_len - 1); per-sequence advantages have one entry per sequence",
            c.advantages_len
        )),
        _ => {
            if let Some((name, len)) = outs.iter().find(|(_, len)| *len != t) {
                set_if_empty(format_args!(
                    "{name} is {len} but {t_name} is {t}; the output has one entry per token"
                ));
            }
        }
    }
    code
}

/// The host slices of `c` as the core's loss inputs with log-probs of type `T`.
///
/// # Safety
/// The pointers of `c` are NULL or valid for their lengths, and the log-prob arrays hold `T`s.
unsafe fn host_inputs<'a, T: LogProb>(
    c: &care_loss_inputs,
) -> Result<LossInputs<'a, T>, care_result> {
    // SAFETY (all blocks): forwarded contract; `bf16`/`f16` are `repr(transparent)` over `u16`.
    Ok(LossInputs {
        logp: unsafe { args::slice(c.logp.cast::<T>(), c.logp_len) }?,
        logp_old: unsafe { args::opt_slice(c.logp_old.cast::<T>(), c.logp_old_len) }?,
        logp_ref: unsafe { args::opt_slice(c.logp_ref.cast::<T>(), c.logp_ref_len) }?,
        seq_offsets: unsafe { args::slice(c.seq_offsets, c.seq_offsets_len) }?,
        mask: unsafe { args::opt_slice(c.mask, c.mask_len) }?,
        advantages: advantages(c.advantages_kind, unsafe {
            args::slice(c.advantages, c.advantages_len)
        }?)?,
        logp_rollout: unsafe { args::opt_slice(c.logp_rollout.cast::<T>(), c.logp_rollout_len) }?,
    })
}

/// The core loss on host inputs of type `T`.
///
/// # Safety
/// As for [`host_inputs`].
unsafe fn host_loss<T: LogProb>(
    c: &care_loss_inputs,
    opts: &LossOptions,
    grad: &mut [f32],
) -> Result<LossOutput, care_result> {
    // SAFETY: forwarded contract.
    let inputs = unsafe { host_inputs::<T>(c) }?;
    let t = inputs.logp.len();
    care_core::grpo::policy_loss(&inputs, opts, grad).map_err(|e| {
        let outs = [("grad_len", grad.len())];
        explain(
            map_error(e),
            c,
            t,
            "care_loss_inputs.logp_len",
            &outs,
            Some(inputs.seq_offsets),
        )
    })
}

/// Options of the policy loss. Initialize with `care_loss_options_default` or
/// `care_loss_options_preset` (they set `struct_size`), then change fields. A denominator of
/// 0 means "this call's own count"; pass global counts so that micro-batches add up.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_loss_options {
    /// `sizeof(care_loss_options)`; lets the struct grow without breaking old callers.
    pub struct_size: u32,
    /// A `care_aggregation`.
    pub aggregation: u32,
    /// A `care_ratio_level`.
    pub ratio_level: u32,
    /// A `care_kl_estimator`.
    pub kl_estimator: u32,
    /// Lower clip width (0.2): `rho` is clipped below at `1 - eps_low`.
    pub eps_low: f64,
    /// Upper clip width (0.2): `rho` is clipped above at `1 + eps_high`.
    pub eps_high: f64,
    /// Dual-clip constant `c` (off when `<= 1`; default 0, verl preset 3).
    pub dual_clip: f64,
    /// Bound on `|logp - logp_old|` before `exp` (20).
    pub log_ratio_clamp: f64,
    /// GSPO only: upper bound on the mean log ratio (10).
    pub seq_log_ratio_max: f64,
    /// KL coefficient `beta` (0 = no KL term).
    pub beta: f64,
    /// Bound on `|logp_ref - logp|` before the KL estimator (20).
    pub kl_input_clamp: f64,
    /// Bound on the `k3` value (10).
    pub kl_output_clamp: f64,
    /// Global counted-token count `N_tok` (0 = this call's).
    pub global_tokens: f64,
    /// Global sequence count `N_seq` (0 = this call's).
    pub global_sequences: f64,
    /// Dr. GRPO horizon `H` (0 = the longest sequence of this call).
    pub horizon: f64,
    /// A `care_policy_loss_kind`.
    pub policy_loss: u32,
    /// A `care_sequence_count`.
    pub sequence_count: u32,
    /// SAPO temperature for `A > 0` (1).
    pub sapo_tau_pos: f64,
    /// SAPO temperature for `A <= 0` (1.05).
    pub sapo_tau_neg: f64,
    /// Clip-Cov / KL-Cov: the share of counted tokens selected (2e-4).
    pub cov_ratio: f64,
    /// Clip-Cov: the covariance window's lower end (1).
    pub clip_cov_lb: f64,
    /// Clip-Cov: the covariance window's upper end (5).
    pub clip_cov_ub: f64,
    /// KL-Cov: the coefficient of `|log ratio|` (1; verl preset 0.1).
    pub kl_cov_coef: f64,
    /// The rollout correction (applies with `care_loss_inputs.logp_rollout`).
    pub rollout: care_rollout_options,
    /// A `care_bypass`.
    pub bypass: u32,
    /// GMPO: the sequence's rollout weight is `exp(mean ln(w + gmpo_weight_floor))` (0 = the
    /// exact geometric mean; verl preset 1e-10).
    pub gmpo_weight_floor: f64,
    /// VESPO: the Gamma weight's power for `A >= 0` (2).
    pub vespo_k_pos: f64,
    /// VESPO: its decay for `A >= 0` (3).
    pub vespo_lambda_pos: f64,
    /// VESPO: the power for `A < 0` (3).
    pub vespo_k_neg: f64,
    /// VESPO: the decay for `A < 0` (2).
    pub vespo_lambda_neg: f64,
}

/// Loss statistics as sums that add across micro-batches and ranks (all-reduce the first
/// twelve with a sum, `ratio_min` with min, `ratio_max` with max).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_loss_stats {
    /// Counted tokens.
    pub tokens: f64,
    /// Sequences with at least one counted token.
    pub sequences: f64,
    /// This call's part of the loss.
    pub loss: f64,
    /// Tokens where the clipped branch binds.
    pub clipped: f64,
    /// Tokens with `rho < 1 - eps_low` and `A < 0`.
    pub clipped_low: f64,
    /// Tokens with `rho > 1 + eps_high` and `A > 0`.
    pub clipped_high: f64,
    /// Tokens where the dual clip binds.
    pub dual_clipped: f64,
    /// `sum (logp_old - logp)` (verl `ppo_kl` times tokens).
    pub ppo_kl_sum: f64,
    /// `sum k` of the KL estimator (without `beta`).
    pub kl_sum: f64,
    /// `sum rho`.
    pub ratio_sum: f64,
    /// Counted tokens whose log ratio hit the clamp.
    pub log_ratio_clamped: f64,
    /// Counted tokens with a non-finite input.
    pub non_finite: f64,
    /// Smallest `rho` (`+inf` when no token counted).
    pub ratio_min: f64,
    /// Largest `rho` (`-inf` when no token counted).
    pub ratio_max: f64,
}

// `care_loss_stats` is written as the core's `#[repr(C)]` `LossStats`: fourteen `f64`s in the
// same order (checked here and by a test that compares field values).
const _: () = {
    assert!(size_of::<care_loss_stats>() == size_of::<LossStats>());
    assert!(align_of::<care_loss_stats>() == align_of::<LossStats>());
};

fn to_c(o: &LossOptions) -> care_loss_options {
    care_loss_options {
        struct_size: size_of::<care_loss_options>() as u32,
        aggregation: o.aggregation as u32,
        ratio_level: o.ratio_level as u32,
        kl_estimator: o.kl_estimator as u32,
        eps_low: o.eps_low,
        eps_high: o.eps_high,
        dual_clip: o.dual_clip,
        log_ratio_clamp: o.log_ratio_clamp,
        seq_log_ratio_max: o.seq_log_ratio_max,
        beta: o.beta,
        kl_input_clamp: o.kl_input_clamp,
        kl_output_clamp: o.kl_output_clamp,
        global_tokens: o.global_tokens,
        global_sequences: o.global_sequences,
        horizon: o.horizon,
        policy_loss: o.policy_loss as u32,
        sequence_count: o.sequence_count as u32,
        sapo_tau_pos: o.sapo_tau_pos,
        sapo_tau_neg: o.sapo_tau_neg,
        cov_ratio: o.cov_ratio,
        clip_cov_lb: o.clip_cov_lb,
        clip_cov_ub: o.clip_cov_ub,
        kl_cov_coef: o.kl_cov_coef,
        rollout: rollout_to_c(&o.rollout),
        bypass: o.bypass as u32,
        gmpo_weight_floor: o.gmpo_weight_floor,
        vespo_k_pos: o.vespo_k_pos,
        vespo_lambda_pos: o.vespo_lambda_pos,
        vespo_k_neg: o.vespo_k_neg,
        vespo_lambda_neg: o.vespo_lambda_neg,
    }
}

fn rollout_to_c(r: &RolloutOptions) -> care_rollout_options {
    care_rollout_options {
        is_threshold: r.is_threshold,
        is_threshold_low: r.is_threshold_low,
        log_ratio_clamp: r.log_ratio_clamp,
        reject: r.reject.map(|b| care_reject_bound {
            lower: b.lower,
            upper: b.upper,
        }),
        is_level: r.is_level as u32,
        rejection_mode: r.rejection_mode as u32,
    }
}

fn rollout_from_c(c: &care_rollout_options) -> Result<RolloutOptions, care_result> {
    Ok(RolloutOptions {
        is_threshold: c.is_threshold,
        is_threshold_low: c.is_threshold_low,
        log_ratio_clamp: c.log_ratio_clamp,
        reject: c.reject.map(|b| RejectBound {
            lower: b.lower,
            upper: b.upper,
        }),
        is_level: args::enum_arg(
            "care_loss_options.rollout.is_level",
            c.is_level,
            &IsLevel::ALL,
        )?,
        rejection_mode: args::enum_arg(
            "care_loss_options.rollout.rejection_mode",
            c.rejection_mode,
            &RejectionMode::ALL,
        )?,
    })
}

pub(crate) fn rollout_stats_to_c(s: &RolloutStats) -> care_rollout_stats {
    care_rollout_stats {
        tokens: s.tokens,
        sequences: s.sequences,
        rejected_tokens: s.rejected_tokens,
        rejected_sequences: s.rejected_sequences,
        truncated: s.truncated,
        weight_sum: s.weight_sum,
        kl_sum: s.kl_sum,
        k3_sum: s.k3_sum,
        log_ppl_diff_sum: s.log_ppl_diff_sum,
        log_ppl_abs_diff_sum: s.log_ppl_abs_diff_sum,
        chi2_token_sum: s.chi2_token_sum,
        chi2_seq_sum: s.chi2_seq_sum,
        non_finite: s.non_finite,
    }
}

pub(crate) fn stats_to_c(s: &LossStats) -> care_loss_stats {
    care_loss_stats {
        tokens: s.tokens,
        sequences: s.sequences,
        loss: s.loss,
        clipped: s.clipped,
        clipped_low: s.clipped_low,
        clipped_high: s.clipped_high,
        dual_clipped: s.dual_clipped,
        ppo_kl_sum: s.ppo_kl_sum,
        kl_sum: s.kl_sum,
        ratio_sum: s.ratio_sum,
        log_ratio_clamped: s.log_ratio_clamped,
        non_finite: s.non_finite,
        ratio_min: s.ratio_min,
        ratio_max: s.ratio_max,
    }
}

/// Reads the caller's loss options (NULL: SPEC defaults): every enum value decoded, then the
/// core's `LossOptions::validate`.
///
/// # Safety
/// As for [`args::options`].
pub(crate) unsafe fn read_options(p: *const care_loss_options) -> Result<LossOptions, care_result> {
    // SAFETY: forwarded contract.
    let c = unsafe { args::options(p, to_c(&LossOptions::default())) }?;
    let o = LossOptions {
        eps_low: c.eps_low,
        eps_high: c.eps_high,
        dual_clip: c.dual_clip,
        log_ratio_clamp: c.log_ratio_clamp,
        seq_log_ratio_max: c.seq_log_ratio_max,
        beta: c.beta,
        kl_input_clamp: c.kl_input_clamp,
        kl_output_clamp: c.kl_output_clamp,
        global_tokens: c.global_tokens,
        global_sequences: c.global_sequences,
        horizon: c.horizon,
        aggregation: args::enum_arg(
            "care_loss_options.aggregation",
            c.aggregation,
            &Aggregation::ALL,
        )?,
        ratio_level: args::enum_arg(
            "care_loss_options.ratio_level",
            c.ratio_level,
            &RatioLevel::ALL,
        )?,
        kl_estimator: args::enum_arg(
            "care_loss_options.kl_estimator",
            c.kl_estimator,
            &KlEstimator::ALL,
        )?,
        policy_loss: args::enum_arg(
            "care_loss_options.policy_loss",
            c.policy_loss,
            &PolicyLoss::ALL,
        )?,
        sequence_count: args::enum_arg(
            "care_loss_options.sequence_count",
            c.sequence_count,
            &SequenceCount::ALL,
        )?,
        sapo_tau_pos: c.sapo_tau_pos,
        sapo_tau_neg: c.sapo_tau_neg,
        cov_ratio: c.cov_ratio,
        clip_cov_lb: c.clip_cov_lb,
        clip_cov_ub: c.clip_cov_ub,
        kl_cov_coef: c.kl_cov_coef,
        rollout: rollout_from_c(&c.rollout)?,
        bypass: args::enum_arg("care_loss_options.bypass", c.bypass, &Bypass::ALL)?,
        gmpo_weight_floor: c.gmpo_weight_floor,
        vespo_k_pos: c.vespo_k_pos,
        vespo_lambda_pos: c.vespo_lambda_pos,
        vespo_k_neg: c.vespo_k_neg,
        vespo_lambda_neg: c.vespo_lambda_neg,
    };
    // The core's own rules, checked here too so that a GPU call reports them before it needs
    // a driver, exactly as the CPU does.
    args::option_check("care_loss_options", o.check())?;
    Ok(o)
}

/// Writes the SPEC §10 default loss options into `*options_out` (eps 0.2/0.2, no dual clip,
/// clamps 20/10/20/10, beta 0, k3, token ratio, token mean, local denominators).
///
/// ```c
/// care_loss_options lo;
/// care_loss_options_default(&lo);
/// lo.global_tokens = (double)tokens_on_all_ranks;
/// ```
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_loss_options_default(
    options_out: *mut care_loss_options,
) -> care_result {
    ffi_panic_boundary! {
        let out = tri!(Out::new(options_out));
        // SAFETY: checked non-NULL and aligned; valid for a write (contract).
        unsafe { out.write(to_c(&LossOptions::default())) };
        care_result::CARE_OK
    }
}

/// Writes the options of a `care_loss_preset` into `*options_out`.
/// Errors: `CARE_ERR_INVALID_ARGUMENT` for an unknown preset.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_loss_options_preset(
    preset: u32,
    options_out: *mut care_loss_options,
) -> care_result {
    ffi_panic_boundary! {
        let out = tri!(Out::new(options_out));
        let p = tri!(args::enum_arg("preset", preset, &LossPreset::ALL));
        // SAFETY: checked non-NULL and aligned; valid for a write (contract).
        unsafe { out.write(to_c(&LossOptions::preset(p))) };
        care_result::CARE_OK
    }
}

/// Writes the options of the loss preset named `(name, name_len)` (the names of
/// `care_loss_preset`: `"verl"`, `"trl"`, ..., `"openrlhf_gspo"`).
/// Errors: `CARE_ERR_INVALID_ARGUMENT` for an unknown name.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_loss_options_preset_by_name(
    name: *const c_char,
    name_len: usize,
    options_out: *mut care_loss_options,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY: forwarded contract.
        let name = tri!(unsafe { args::text(name, name_len) });
        let out = tri!(Out::new(options_out));
        let p = tri!(LossPreset::from_name(name).ok_or(care_result::CARE_ERR_INVALID_ARGUMENT));
        // SAFETY: checked non-NULL and aligned; valid for a write (contract).
        unsafe { out.write(to_c(&LossOptions::preset(p))) };
        care_result::CARE_OK
    }
}

/// The policy loss of one micro-batch (SPEC §10 and §17, with the rollout
/// correction when `inputs->logp_rollout` is given) on the CPU: its gradient
/// `grad_out[grad_len]` (`dL/dlogp`, `float`, `grad_len == T`), the loss into `*loss_out` and,
/// if `stats_out` is not NULL, the statistics. `options` NULL: the defaults. The rollout
/// diagnostics come from `care_rollout_correction` on the same inputs.
///
/// ```c
/// care_loss_inputs in = {sizeof in, CARE_DTYPE_F32, logp, T, logp_old, T, NULL, 0,
///                        offs, B + 1, mask, T, adv, B, CARE_ADVANTAGES_PER_SEQUENCE, 0};
/// double loss; care_loss_stats st; float grad[T];
/// care_result r = care_policy_loss(&in, NULL, grad, T, &loss, &st);
/// ```
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_policy_loss(
    inputs: *const care_loss_inputs,
    options: *const care_loss_options,
    grad_out: *mut f32,
    grad_len: usize,
    loss_out: *mut f64,
    stats_out: *mut care_loss_stats,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let c = tri!(unsafe { args::input(inputs) });
        let dtype = tri!(read_dtype(c.dtype));
        let opts = tri!(unsafe { read_options(options) });
        let loss_out = tri!(Out::new(loss_out));
        let stats_out = tri!(Out::optional(stats_out));
        let grad = tri!(unsafe { args::slice_mut(grad_out, grad_len) });
        let out = tri!(match dtype {
            Dtype::F32 => unsafe { host_loss::<f32>(&c, &opts, grad) },
            Dtype::Bf16 => unsafe { host_loss::<bf16>(&c, &opts, grad) },
            Dtype::F16 => unsafe { host_loss::<f16>(&c, &opts, grad) },
        });
        unsafe { loss_out.write(out.loss) };
        if let Some(s) = stats_out {
            unsafe { s.write(stats_to_c(&out.stats)) };
        }
        care_result::CARE_OK
    }
}

/// The rollout correction on its own (CPU): per counted token the importance weight the loss
/// applies (`weights_out[T]`, 0 for a rejected token) and whether the token stays in the loss
/// (`keep_out[T]`, 1/0; a masked token gets weight 0 and keep 0), and the diagnostics into
/// `*stats_out` (optional, NULL to skip). `inputs` as for `care_policy_loss`, with
/// `logp_rollout` required; the proximal log-probs are `logp_old`, or `logp` when it is absent;
/// the advantages are not read. `options->rollout` (NULL: the defaults) says which weights and
/// criteria apply.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_rollout_correction(
    inputs: *const care_loss_inputs,
    options: *const care_loss_options,
    weights_out: *mut f32,
    weights_len: usize,
    keep_out: *mut u8,
    keep_len: usize,
    stats_out: *mut care_rollout_stats,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let c = tri!(unsafe { args::input(inputs) });
        let dtype = tri!(read_dtype(c.dtype));
        let opts = tri!(unsafe { read_options(options) });
        let stats_out = tri!(Out::optional(stats_out));
        let weights = tri!(unsafe { args::slice_mut(weights_out, weights_len) });
        let keep = tri!(unsafe { args::slice_mut(keep_out, keep_len) });
        let st = tri!(match dtype {
            Dtype::F32 => unsafe { host_rollout::<f32>(&c, &opts.rollout, weights, keep) },
            Dtype::Bf16 => unsafe { host_rollout::<bf16>(&c, &opts.rollout, weights, keep) },
            Dtype::F16 => unsafe { host_rollout::<f16>(&c, &opts.rollout, weights, keep) },
        });
        if let Some(s) = stats_out {
            unsafe { s.write(rollout_stats_to_c(&st)) };
        }
        care_result::CARE_OK
    }
}

/// The core's rollout correction on host inputs of type `T`.
///
/// # Safety
/// As for [`host_inputs`].
unsafe fn host_rollout<T: LogProb>(
    c: &care_loss_inputs,
    opts: &RolloutOptions,
    weights: &mut [f32],
    keep: &mut [u8],
) -> Result<RolloutStats, care_result> {
    // SAFETY (all blocks): forwarded contract.
    let logp = unsafe { args::slice(c.logp.cast::<T>(), c.logp_len) }?;
    let old = unsafe { args::opt_slice(c.logp_old.cast::<T>(), c.logp_old_len) }?;
    // The core checks every length against the proximal log-probs; `logp` fixes `T` here as in
    // `care_policy_loss`, so a `logp_old` of another length is a mismatch, not a smaller `T`.
    if let Some(o) = old.filter(|o| o.len() != logp.len()) {
        return Err(args::mismatch(
            "care_loss_inputs.logp_old_len",
            o.len(),
            "logp_len",
            logp.len(),
        ));
    }
    if c.logp_rollout.is_null() {
        // Required here.
        return Err(crate::detail::fail(
            care_result::CARE_ERR_NULL_POINTER,
            format_args!(
                "care_loss_inputs.logp_rollout is NULL; care_rollout_correction needs the \
                 rollout (inference-engine) log-probs"
            ),
        ));
    }
    let rollout = unsafe { args::slice(c.logp_rollout.cast::<T>(), c.logp_rollout_len) }?;
    let inputs = RolloutInputs {
        logp_old: old.unwrap_or(logp),
        logp_rollout: rollout,
        seq_offsets: unsafe { args::slice(c.seq_offsets, c.seq_offsets_len) }?,
        mask: unsafe { args::opt_slice(c.mask, c.mask_len) }?,
    };
    let (t, offsets) = (inputs.logp_old.len(), inputs.seq_offsets);
    let outs = [("weights_len", weights.len()), ("keep_len", keep.len())];
    care_core::grpo::rollout_correction(&inputs, opts, weights, keep).map_err(|e| {
        let name = if old.is_some() {
            "care_loss_inputs.logp_old_len"
        } else {
            "care_loss_inputs.logp_len"
        };
        explain(map_error(e), c, t, name, &outs, Some(offsets))
    })
}

/// Adds the stats of another micro-batch or rank into `*acc` (sums add, min/max combine).
/// Start from `care_loss_stats_empty`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_loss_stats_add(
    acc: *mut care_loss_stats,
    other: *const care_loss_stats,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY: forwarded contract.
        let o = *tri!(unsafe { args::as_ref(other) });
        let out = tri!(Out::new(acc));
        // SAFETY: checked non-NULL and aligned; `acc` is initialized (contract).
        let mut a = unsafe { *acc };
        a.tokens += o.tokens;
        a.sequences += o.sequences;
        a.loss += o.loss;
        a.clipped += o.clipped;
        a.clipped_low += o.clipped_low;
        a.clipped_high += o.clipped_high;
        a.dual_clipped += o.dual_clipped;
        a.ppo_kl_sum += o.ppo_kl_sum;
        a.kl_sum += o.kl_sum;
        a.ratio_sum += o.ratio_sum;
        a.log_ratio_clamped += o.log_ratio_clamped;
        a.non_finite += o.non_finite;
        a.ratio_min = a.ratio_min.min(o.ratio_min);
        a.ratio_max = a.ratio_max.max(o.ratio_max);
        // SAFETY: as above.
        unsafe { out.write(a) };
        care_result::CARE_OK
    }
}

/// Writes the identity of `care_loss_stats_add` (zero sums, `ratio_min = +inf`,
/// `ratio_max = -inf`) into `*stats_out`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_loss_stats_empty(stats_out: *mut care_loss_stats) -> care_result {
    ffi_panic_boundary! {
        let out = tri!(Out::new(stats_out));
        // SAFETY: checked non-NULL and aligned; valid for a write (contract).
        unsafe { out.write(stats_to_c(&LossStats::EMPTY)) };
        care_result::CARE_OK
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_enum_values_index_the_core_tables() {
        for (i, a) in Aggregation::ALL.iter().enumerate() {
            assert_eq!(*a as usize, i);
        }
        for (i, r) in RatioLevel::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i);
        }
        for (i, k) in KlEstimator::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i);
        }
        for (i, p) in LossPreset::ALL.iter().enumerate() {
            assert_eq!(*p as usize, i);
        }
        assert_eq!(care_aggregation::CARE_AGGREGATION_TOKEN_SUM as usize, 4);
        assert_eq!(
            care_kl_estimator::CARE_KL_K3 as usize,
            KlEstimator::K3 as usize
        );
        assert_eq!(
            care_ratio_level::CARE_RATIO_SEQUENCE as usize,
            RatioLevel::Sequence as usize
        );
        assert_eq!(
            care_loss_preset::CARE_LOSS_PRESET_TRL as usize,
            LossPreset::Trl as usize
        );
    }

    #[test]
    fn dtype_values_index_the_dtype_table() {
        for (c, d) in [
            (care_dtype::CARE_DTYPE_F32, Dtype::F32),
            (care_dtype::CARE_DTYPE_BF16, Dtype::Bf16),
            (care_dtype::CARE_DTYPE_F16, Dtype::F16),
        ] {
            assert_eq!(c as u32, d.number());
            assert_eq!(read_dtype(c as u32), Ok(d));
        }
        assert_eq!(read_dtype(3), Err(care_result::CARE_ERR_INVALID_ARGUMENT));
    }

    #[test]
    fn options_round_trip_through_the_c_struct() {
        for p in LossPreset::ALL {
            let o = LossOptions::preset(p);
            // SAFETY: pointer to a live, fully initialized struct.
            assert_eq!(unsafe { read_options(&to_c(&o)) }, Ok(o));
        }
        let mut c = to_c(&LossOptions::default());
        c.kl_estimator = 4;
        // SAFETY: as above.
        assert_eq!(
            unsafe { read_options(&c) },
            Err(care_result::CARE_ERR_INVALID_ARGUMENT)
        );
    }

    #[test]
    fn stats_add_matches_the_core() {
        let a = LossStats {
            tokens: 3.0,
            loss: 0.5,
            ratio_min: 0.9,
            ratio_max: 1.1,
            ..LossStats::EMPTY
        };
        let b = LossStats {
            tokens: 2.0,
            clipped: 1.0,
            ratio_min: 0.7,
            ratio_max: 1.0,
            ..LossStats::EMPTY
        };
        let mut want = a;
        want.add(&b);
        let mut acc = stats_to_c(&a);
        // SAFETY: live structs.
        assert_eq!(
            unsafe { care_loss_stats_add(&mut acc, &stats_to_c(&b)) },
            care_result::CARE_OK
        );
        assert_eq!(acc, stats_to_c(&want));
    }

    #[test]
    fn c_stats_struct_is_the_core_layout() {
        use care_core::grpo::{LOSS_STATS_LAYOUT, LOSS_STATS_SIZE};
        assert_eq!(size_of::<care_loss_stats>(), LOSS_STATS_SIZE);
        // A distinct value in every field of the core struct, placed through the table; the C
        // struct must hold each at the table's offset (same order, and `stats_to_c` copies
        // every field by its own name).
        let mut s = LossStats::EMPTY;
        for (i, f) in LOSS_STATS_LAYOUT.iter().enumerate() {
            // SAFETY: the table puts an f64 at every offset of `LossStats` (checked in core).
            unsafe {
                (&raw mut s)
                    .cast::<u8>()
                    .add(f.offset)
                    .cast::<f64>()
                    .write(i as f64 + 0.5)
            };
        }
        let c = stats_to_c(&s);
        for (i, f) in LOSS_STATS_LAYOUT.iter().enumerate() {
            // SAFETY: same size (asserted above); all fields are f64.
            let got = unsafe {
                (&raw const c)
                    .cast::<u8>()
                    .add(f.offset)
                    .cast::<f64>()
                    .read()
            };
            assert_eq!(got, i as f64 + 0.5, "care_loss_stats.{}", f.name);
        }
    }
}
