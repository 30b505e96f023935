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

mod advantage;
mod dist;
mod layout;
mod logprob;
mod loss;

pub use advantage::{
    AdvantageOptions, AdvantageValue, Baseline, GroupStats, Preset, Scale, SingletonPolicy,
    StdKind, broadcast_to_tokens, group_advantages,
};
pub use dist::{GroupSums, group_advantages_finalize, group_partial_squares, group_partial_sums};
pub use layout::{GroupLayout, validate_offsets};
pub use logprob::LogProb;
pub use loss::{
    Advantages, Aggregation, KlEstimator, KlTerm, LossInputs, LossOptions, LossOutput, LossPreset,
    LossStats, RatioLevel, Surrogate, TokenTerms, aggregation_weight, kl_term, log_ratio,
    policy_loss, sequence_ratio, surrogate, token_loss_and_grad,
};
