//! The inputs of the policy loss, and the token-mask helpers both loops use.

use crate::grpo::logprob::LogProb;

/// Advantages for [`policy_loss`](super::policy_loss): one per sequence (broadcast to its tokens) or one per token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Advantages<'a> {
    /// `B` values, one per sequence.
    PerSequence(&'a [f32]),
    /// `T` values, one per token.
    PerToken(&'a [f32]),
}

/// Inputs of [`policy_loss`](super::policy_loss) for one micro-batch, all on the token layout `seq_offsets`.
#[derive(Clone, Copy, Debug)]
pub struct LossInputs<'a, T: LogProb> {
    /// Current policy log-probs `logp[T]`.
    pub logp: &'a [T],
    /// Behaviour (rollout/old) log-probs `[T]`; `None` means on-policy (`delta = 0`, `rho = 1`,
    /// the gradient still flows).
    pub logp_old: Option<&'a [T]>,
    /// Reference log-probs `[T]` for the KL term; `None` disables it.
    pub logp_ref: Option<&'a [T]>,
    /// CSR sequence offsets, `B + 1` entries, last `= T` (a padded `[B, L]` tensor is
    /// `[0, L, 2L, ...]`).
    pub seq_offsets: &'a [u32],
    /// Token mask `[T]`, non-zero = the token counts; `None` = all count.
    pub mask: Option<&'a [u8]>,
    /// Per-sequence or per-token advantages.
    pub advantages: Advantages<'a>,
    /// The rollout engine's log-probs `[T]` (vLLM, SGLang, ...): the rollout correction of
    /// [`LossOptions::rollout`](super::LossOptions::rollout) compares them with `logp_old` (with
    /// `logp` as a constant when on-policy); `None` = no correction and no diagnostics.
    pub logp_rollout: Option<&'a [T]>,
}

#[inline]
pub(super) fn counted(mask: Option<&[u8]>, t: usize) -> bool {
    mask.is_none_or(|m| m[t] != 0)
}

#[inline]
pub(super) fn finite_or_absent(x: Option<f64>) -> bool {
    x.is_none_or(f64::is_finite)
}

/// The number of counted tokens in `range` (all of them without a mask).
#[inline]
pub(super) fn counted_in(mask: Option<&[u8]>, range: core::ops::Range<usize>) -> usize {
    // Byte-wide partial counts (at most 255 per chunk) vectorize well.
    let chunk = |c: &[u8]| usize::from(c.iter().fold(0u8, |n, &x| n + u8::from(x != 0)));
    match mask {
        Some(m) => m[range].chunks(255).map(chunk).sum(),
        None => range.len(),
    }
}
