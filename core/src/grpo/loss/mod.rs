//! The clipped-ratio policy loss and its analytic gradient (SPEC §10).
//!
//! Per counted token `t` (mask 1), with advantage `A`, weight `w_t` from the aggregation:
//!
//! ```text
//! delta = clamp(logp - logp_old, -C, C)          C = log_ratio_clamp (20); logp_old absent: 0
//! rho   = exp(delta)                             (GSPO: exp(min(mean_t delta, seq_log_ratio_max)))
//! pg1   = -A * rho
//! pg2   = -A * clip(rho, 1 - eps_low, 1 + eps_high)
//! l     = max(pg1, pg2)                          ties: the unclipped branch pg1
//! l     = min(l, -A * c)   if c = dual_clip > 1 and A < 0
//! x     = clamp(logp_ref - logp, -Ck, Ck)        Ck = kl_input_clamp (20)
//! k     = k1: -x | abs: |x| | k2: x^2/2 | k3: clamp(exp(x) - x - 1, -Ko, Ko)    Ko = 10
//! l    += beta * k                               only when beta > 0 and logp_ref is given
//! L     = sum_t w_t * l
//! dL/dlogp_t = w_t * (-A * rho * [pg1 branch binds] * [delta not clamped]
//!                     + beta * dk/dlogp)         dk/dlogp: 1 | -sign(x) | -x | 1 - exp(x),
//!                                                0 where the KL input or output clamp binds
//! ```
//!
//! The pieces are the public pure functions [`log_ratio`], [`sequence_ratio`], [`surrogate`],
//! [`kl_term`], [`token_loss_and_grad`] and [`aggregation_weight`]; [`policy_loss`] only loops
//! over sequences and tokens: for GSPO, one pass for the mean log ratio, one for the token terms
//! (summing `w_t * dl/drho` over the sequence), and one to add the gradient through the mean. A token with
//! mask 0 contributes loss 0 and gets gradient exactly `0.0`, whatever its inputs.
//!
//! The common case (token ratio level, no KL term) runs a specialized loop over blocks of
//! tokens that performs the same operations in the same order on each value, so its gradient,
//! loss and statistics have the same bits as the general loop (a property test runs both on
//! the same inputs and compares every bit).
//!
//! The module is split along its seams: the [`LossOptions`] and their enums, the inputs and the
//! statistics, the per-token terms, the general loop ([`policy_loss`]) and the blocked fast path
//! with its bit-identity tests.

mod blocked;
mod general;
mod inputs;
mod options;
mod stats;
mod terms;

pub use general::policy_loss;
pub use inputs::{Advantages, LossInputs};
pub use options::{
    Aggregation, Bypass, KlEstimator, LossOptions, LossPreset, RatioLevel, SequenceCount,
};
pub use stats::{LossOutput, LossStats};
pub use terms::{
    KlTerm, Surrogate, TokenTerms, aggregation_weight, kl_term, log_ratio, sequence_ratio,
    surrogate, token_loss_and_grad,
};
