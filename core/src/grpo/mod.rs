//! The GRPO step on the CPU: group advantages (SPEC §9), their cross-rank form (§11), and the
//! clipped-ratio policy loss with its analytic gradient (§10).
//!
//! This module is the reference that the CUDA kernels and the C ABI are tested against, so every
//! formula lives in one small, pure function that a kernel can mirror line by line:
//! [`log_ratio`], [`sequence_ratio`], [`surrogate`], [`kl_term`], [`token_loss_and_grad`] and
//! [`aggregation_weight`]. Nothing here
//! allocates: every output goes into a caller-provided slice, and all accumulation is in `f64`.
//!
//! Layouts use `u32` offsets, like the `uint32_t` arrays of the C ABI and the kernels:
//! [`GroupLayout`] for groups of samples and CSR sequence offsets for tokens.
//!
//! Outputs narrow from `f64` to `f32` with [`narrow_f32`]: a finite value beyond the `f32` range
//! saturates at `±f32::MAX`, so finite inputs always give finite outputs (a trainer treats `inf`
//! as a poisoned batch); non-finite values pass through unchanged.

mod advantage;
mod dist;
mod family;
mod gae;
mod layout;
mod logprob;
mod loss;
mod rollout;
mod stats_layout;

pub use advantage::{
    AdvantageOptions, AdvantageValue, Baseline, GroupInputs, GroupStats, Preset, Reweight, Scale,
    SingletonPolicy, StdKind, broadcast_to_tokens, group_advantages, group_advantages_with,
};
pub use dist::{
    GroupSums, group_advantages_finalize, group_advantages_finalize_with, group_partial_squares,
    group_partial_sums,
};
pub use family::{
    PgTerm, PolicyLoss, Selection, VESPO_LOG_W_MAX, VESPO_LOG_W_MIN, cispo_term, cov_select_count,
    covariance, gmpo_log_ratio, gpg_term, kl_cov_term, sapo_term, sigmoid, top_k, vespo_term,
    vespo_weight,
};
pub use gae::{
    AdvantageEstimator, GaeOptions, MaskedToken, WhitenOptions, discounted_returns,
    discounted_returns_whitened, gae, gae_whitened, whiten, whiten_finalize,
    whiten_partial_squares, whiten_partial_sums,
};
pub use layout::{GroupLayout, LayoutFault, NamedLayoutFault, offsets_fault, validate_offsets};
pub use logprob::LogProb;
pub use loss::{
    Advantages, Aggregation, Bypass, KlEstimator, KlTerm, LossInputs, LossOptions, LossOutput,
    LossPreset, LossStats, RatioLevel, SequenceCount, Surrogate, TokenTerms, aggregation_weight,
    kl_term, log_ratio, policy_loss, sequence_ratio, surrogate, token_loss_and_grad,
};
pub use rollout::{
    IsLevel, RejectBound, Rejection, RejectionMode, RolloutInputs, RolloutOptions, RolloutStats,
    SequenceRollout, TokenDivergence, rollout_correction, rollout_log_ratio, token_divergence,
    truncated_weight,
};
pub use stats_layout::{Combine, FieldKind, LOSS_STATS_LAYOUT, LOSS_STATS_SIZE, StatsField};

/// Narrows an `f64` result to `f32`, saturating finite values at `±f32::MAX` instead of
/// overflowing to infinity; `±inf` and NaN pass through (they only come from non-finite inputs,
/// which the statistics count). The CUDA kernels mirror this (`care_narrow`, `care_saturate`).
#[inline]
pub fn narrow_f32(x: f64) -> f32 {
    const MAX: f64 = f32::MAX as f64;
    if x.is_finite() {
        x.clamp(-MAX, MAX) as f32
    } else {
        x as f32
    }
}
