//! Fused selective log-softmax: per-token log-probs, entropy and log-sum-exp straight from
//! logits `[N, V]` (`logsoftmax_fwd_*`), the backward pass into `dlogits` (`logsoftmax_bwd_*`),
//! and the fused path from logits to the policy loss of SPEC §10. The CPU reference
//! and the contract (edge cases included) are in [`care_core::logsoftmax`].

use care_core::Dtype;
use care_core::Error;
use care_core::grpo::{Bypass, LossOptions, PolicyLoss, RatioLevel};
use care_core::logsoftmax::LogSoftmaxOptions;

use super::loss::{base_params, prepare_work};
use super::{
    KernelError, Launcher, LossBuffers, WORKSPACE_BYTES, grpo_loss, launch, selects_by_covariance,
};
use crate::geometry::{
    Tuning, log_softmax_backward_geometry, log_softmax_geometry, logits_loss_geometry,
};
use crate::kernel::Kernel;
use crate::params::{LogSoftmaxParams, STATUS_BAD_TARGET, STATUS_LSM_NON_FINITE};

/// Logits and targets, on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogitsBuffers {
    /// Dtype of the logits (and of `dlogits`).
    pub dtype: Dtype,
    /// Logits address; row `i` starts at element `i * stride`.
    pub logits: u64,
    /// Rows `N`.
    pub rows: u64,
    /// Vocabulary `V >= 1`.
    pub vocab: u32,
    /// Elements between rows (`>= vocab`).
    pub stride: u64,
    /// `i32[N]` or `i64[N]` target ids.
    pub targets: u64,
    /// Whether the targets are `i64`.
    pub targets_i64: bool,
    /// `u8[N]` token mask or 0 (every row counts).
    pub mask: u64,
}

/// Outputs of [`log_softmax_forward`] (`f32[N]` each, 0 where not wanted; `logp` required).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogSoftmaxOutputs {
    /// Log-probs of the targets.
    pub logp: u64,
    /// Entropy of each row, or 0.
    pub entropy: u64,
    /// Log-sum-exp of each row's scaled logits (what the backward pass needs), or 0.
    pub lse: u64,
    /// A `u32` status word (zeroed, then [`STATUS_BAD_TARGET`] and [`STATUS_LSM_NON_FINITE`]
    /// OR-ed in), or 0; read it back
    /// and check it with [`log_softmax_status`].
    pub status: u64,
}

/// Inputs and output of [`log_softmax_backward`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogSoftmaxGrads {
    /// `f32[N]` log-sum-exp saved by the forward pass (required).
    pub lse: u64,
    /// `f32[N]` entropy saved by the forward pass (required with `dentropy`), or 0.
    pub entropy: u64,
    /// `f32[N]` `dL/dlogp`, or 0 (treated as 0).
    pub dlogp: u64,
    /// `f32[N]` `dL/dentropy`, or 0 (no entropy term).
    pub dentropy: u64,
    /// Output in the logits dtype, row `i` at element `i * dstride`; may be the logits
    /// themselves (`dlogits == logits`, `dstride == stride`) to overwrite them in place.
    pub dlogits: u64,
    /// Elements between two dlogits rows (`>= vocab`).
    pub dstride: u64,
}

fn check_rows(r: &LogitsBuffers, opts: &LogSoftmaxOptions) -> Result<LogSoftmaxParams, Error> {
    opts.validate()?;
    if r.vocab == 0 || r.stride < u64::from(r.vocab) {
        return Err(Error::InvalidArgument);
    }
    if r.rows > 0 && (r.logits == 0 || r.targets == 0) {
        return Err(Error::InvalidArgument);
    }
    Ok(LogSoftmaxParams {
        logits: r.logits,
        targets: r.targets,
        mask: r.mask,
        n: r.rows,
        stride: r.stride,
        vocab: r.vocab,
        targets_i64: u32::from(r.targets_i64),
        inv_temp: (1.0 / opts.temperature) as f32,
        ..LogSoftmaxParams::default()
    })
}

/// Launches the forward kernel: `logp`, and optionally `entropy` and `lse`, for every row.
/// Masked rows are not read and get 0 everywhere.
///
/// The kernel cannot refuse a target outside `0..V` on a counted row as the CPU reference
/// does: it writes NaN for that row and sets [`STATUS_BAD_TARGET`] in `out.status`. A counted
/// row without a softmax (which the CPU reference refuses as non-finite) gets non-finite
/// outputs and sets [`STATUS_LSM_NON_FINITE`].
///
/// # Safety
/// Every address is valid device memory of the launcher with the documented sizes and dtypes
/// (the logits: `(rows - 1) * stride + vocab` elements), and stays valid until the launch
/// completes.
pub unsafe fn log_softmax_forward<L: Launcher>(
    launcher: &L,
    rows: &LogitsBuffers,
    out: &LogSoftmaxOutputs,
    opts: &LogSoftmaxOptions,
    tuning: Tuning,
) -> Result<(), KernelError<L::Error>> {
    tuning.check()?;
    let mut p = check_rows(rows, opts)?;
    if rows.rows > 0 && out.logp == 0 {
        return Err(Error::InvalidArgument.into());
    }
    p.logp = out.logp;
    p.entropy = out.entropy;
    p.lse = out.lse;
    p.status = out.status;
    if out.status != 0 {
        // SAFETY: the status word is 4 writable bytes (caller contract).
        unsafe { launcher.memset_zero(out.status, 4) }.map_err(KernelError::Backend)?;
    }
    if rows.rows == 0 {
        return Ok(());
    }
    let (g, block_team) = log_softmax_geometry(rows.rows, rows.vocab, tuning);
    p.block_team = u32::from(block_team);
    // SAFETY: the buffers of `p` have the documented sizes (caller contract); the geometry's
    // team mode is the one written into `p`.
    unsafe { launch(launcher, Kernel::log_softmax_forward(rows.dtype), g, (p,)) }
}

/// Launches the backward kernel: `dlogits = (1/T) * (g * (onehot - p) - e * p * (log p + H))`
/// per row, in the logits dtype, from the saved `lse` (and `entropy` with `dentropy`). Masked
/// rows get exact zeros.
///
/// # Safety
/// As [`log_softmax_forward`]; `dlogits` holds `(rows - 1) * dstride + vocab` elements and
/// either does not overlap the logits or is exactly them (`dlogits == logits`,
/// `dstride == stride`).
pub unsafe fn log_softmax_backward<L: Launcher>(
    launcher: &L,
    rows: &LogitsBuffers,
    grads: &LogSoftmaxGrads,
    opts: &LogSoftmaxOptions,
    tuning: Tuning,
) -> Result<(), KernelError<L::Error>> {
    tuning.check()?;
    let mut p = check_rows(rows, opts)?;
    if grads.dstride < u64::from(rows.vocab) {
        return Err(Error::InvalidArgument.into());
    }
    if grads.dlogits == rows.logits && grads.dstride != rows.stride {
        // In place needs the same row layout, or a row would overwrite logits not yet read.
        return Err(Error::InvalidArgument.into());
    }
    if rows.rows > 0
        && (grads.lse == 0 || grads.dlogits == 0 || (grads.dentropy != 0 && grads.entropy == 0))
    {
        return Err(Error::InvalidArgument.into());
    }
    if rows.rows == 0 {
        return Ok(());
    }
    p.lse = grads.lse;
    p.entropy = grads.entropy;
    p.dlogp = grads.dlogp;
    p.dentropy = grads.dentropy;
    p.dlogits = grads.dlogits;
    p.dstride = grads.dstride;
    let (g, block_team) = log_softmax_backward_geometry(rows.rows, rows.vocab, tuning);
    p.block_team = u32::from(block_team);
    // SAFETY: buffers as documented (caller contract).
    unsafe { launch(launcher, Kernel::log_softmax_backward(rows.dtype), g, (p,)) }
}

/// Maps the forward status word (read back from [`LogSoftmaxOutputs::status`]) to the CPU
/// reference's error: [`Error::InvalidArgument`] for a target outside `0..V`, else
/// [`Error::NonFinite`] for a counted row without a softmax.
pub fn log_softmax_status(status: u32) -> Result<(), Error> {
    if status & STATUS_BAD_TARGET != 0 {
        Err(Error::InvalidArgument)
    } else if status & STATUS_LSM_NON_FINITE != 0 {
        Err(Error::NonFinite)
    } else {
        Ok(())
    }
}

/// The policy-loss side of [`logits_loss_forward`]: everything [`LossBuffers`] holds except
/// the log-probs, which the forward pass computes (`f32`, so `logp_old` and `logp_ref` are
/// `f32` too) and the gradient, which is `dlogp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogitsLossBuffers {
    /// `f32[N]` log-probs (written by the forward pass, read by the loss).
    pub logp: u64,
    /// `f32[N]` log-sum-exp (written; the backward pass reads it).
    pub lse: u64,
    /// `f32[N]` `dL/dlogp` (written by the loss; the backward pass reads it).
    pub dlogp: u64,
    /// `f32[N]` old log-probs, or 0 (on-policy).
    pub logp_old: u64,
    /// `f32[N]` reference log-probs, or 0.
    pub logp_ref: u64,
    /// `f32[n_seq]` advantages, or `f32[N]` with `adv_per_token`.
    pub adv: u64,
    /// Whether `adv` holds one value per token.
    pub adv_per_token: bool,
    /// `u32[n_seq + 1]` CSR sequence offsets over the rows.
    pub seq_offsets: u64,
    /// Number of sequences.
    pub n_seq: u32,
    /// Longest sequence if known, else 0 (geometry only).
    pub max_seq_len: u32,
    /// A `LossStatsRaw` to accumulate into (initialized by the caller), or 0.
    pub stats: u64,
    /// [`WORKSPACE_BYTES`](super::WORKSPACE_BYTES) of 16-byte aligned device memory; its
    /// first 4 bytes are the log-softmax status word, the loss uses the rest.
    pub workspace: u64,
}

/// The fused path's forward (one call per step): the selective log-softmax writes `logp` and
/// `lse`, then the policy loss (SPEC §10, the token mask is `rows.mask`) writes `dlogp` and
/// accumulates the stats. Follow it with [`log_softmax_backward`] with `dlogp` and `lse` (in
/// place over the logits if they are not needed any more) to get `dlogits`. `tuning` applies
/// to both launches (each reads its own fields). Clip-Cov and KL-Cov are refused
/// ([`Error::InvalidArgument`]): their selection needs a workspace that grows with the tokens.
///
/// # Safety
/// As [`log_softmax_forward`] and [`grpo_loss`]; `rows.rows` fits `u32`.
pub unsafe fn logits_loss_forward<L: Launcher>(
    launcher: &L,
    rows: &LogitsBuffers,
    buf: &LogitsLossBuffers,
    lsm: &LogSoftmaxOptions,
    loss: &LossOptions,
    tuning: Tuning,
) -> Result<(), KernelError<L::Error>> {
    loss.validate()?;
    if selects_by_covariance(loss) {
        // The fixed workspace has no room for Clip-Cov's and KL-Cov's selection.
        return Err(Error::InvalidArgument.into());
    }
    let n_tok = u32::try_from(rows.rows).map_err(|_| Error::InvalidArgument)?;
    if buf.workspace == 0 || !buf.workspace.is_multiple_of(16) {
        return Err(Error::InvalidArgument.into());
    }
    let out = LogSoftmaxOutputs {
        logp: buf.logp,
        entropy: 0,
        lse: buf.lse,
        status: buf.workspace,
    };
    // SAFETY: forwarded caller contract.
    unsafe { log_softmax_forward(launcher, rows, &out, lsm, tuning) }?;
    let lb = LossBuffers {
        dtype: Dtype::F32,
        logp: buf.logp,
        logp_old: buf.logp_old,
        logp_ref: buf.logp_ref,
        adv: buf.adv,
        adv_per_token: buf.adv_per_token,
        mask: rows.mask,
        seq_offsets: buf.seq_offsets,
        n_seq: buf.n_seq,
        n_tok,
        max_seq_len: buf.max_seq_len,
        grad: buf.dlogp,
        grad_in_input_dtype: false,
        stats: buf.stats,
        // The loss's denominators go after the status word, 16-byte aligned.
        workspace: buf.workspace + 16,
        workspace_len: WORKSPACE_BYTES - 16,
    };
    // SAFETY: forwarded caller contract; the loss uses at most WORKSPACE_BYTES - 16 bytes of
    // workspace (its 16-byte denominators struct).
    unsafe { grpo_loss(launcher, &lb, loss, tuning) }
}

/// Buffers of [`logits_loss_fused`]: the policy-loss side as in [`LogitsLossBuffers`], and the
/// gradient with respect to the logits instead of `dlogp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FusedLossBuffers {
    /// `f32[N]` log-probs of the targets (written), or 0.
    pub logp: u64,
    /// `f32[N]` log-sum-exp (written), or 0.
    pub lse: u64,
    /// `dL/dlogits` in the logits dtype, row `i` at element `i * dstride`; may be the logits
    /// themselves (`dlogits == logits`, `dstride == stride`) to overwrite them in place.
    pub dlogits: u64,
    /// Elements between two dlogits rows (`>= vocab`).
    pub dstride: u64,
    /// `f32[N]` old log-probs, or 0 (on-policy).
    pub logp_old: u64,
    /// `f32[N]` reference log-probs, or 0.
    pub logp_ref: u64,
    /// `f32[n_seq]` advantages, or `f32[N]` with `adv_per_token`.
    pub adv: u64,
    /// Whether `adv` holds one value per token.
    pub adv_per_token: bool,
    /// `u32[n_seq + 1]` CSR sequence offsets over the rows.
    pub seq_offsets: u64,
    /// Number of sequences.
    pub n_seq: u32,
    /// A `LossStatsRaw` to accumulate into (initialized by the caller), or 0.
    pub stats: u64,
    /// [`WORKSPACE_BYTES`](super::WORKSPACE_BYTES) of 16-byte aligned device memory; its
    /// first 4 bytes are the log-softmax status word, the loss uses the rest.
    pub workspace: u64,
}

/// Whether [`logits_loss_fused`] computes these options' loss: a term at token `t` that needs
/// only token `t` (the token-level ratio with the clipped ratio, the dual clip, CISPO, SAPO or
/// GPG, any KL estimator; every aggregation) and no rollout correction. GSPO, GMPO, VESPO,
/// Clip-Cov, KL-Cov and the rollout correction need whole sequences first:
/// [`logits_loss_forward`] and [`log_softmax_backward`] compute those. Bypass mode is refused
/// too: it needs the rollout log-probs, which the fused path does not take (with the rollout
/// correction inactive it is the same loss as passing them as `logp_old` with bypass off).
pub fn fused_supports(loss: &LossOptions) -> bool {
    loss.ratio_level == RatioLevel::Token
        && matches!(
            loss.policy_loss,
            PolicyLoss::Clip | PolicyLoss::Cispo | PolicyLoss::Sapo | PolicyLoss::Gpg
        )
        && !loss.rollout.active()
        && loss.bypass == Bypass::Off
}

/// The fused one-pass path for token-local losses (see [`fused_supports`]): one launch reads
/// each row of logits once, computes its log-sum-exp, the target's log-prob, the loss term and
/// `dL/dlogp`, and writes `dlogits = (g / T) (onehot - p)` (in place if wanted), accumulating the
/// loss statistics into `buf.stats` (plus the `grpo_loss_denoms` pre-pass over the mask when a
/// default denominator is needed). The same values as [`logits_loss_forward`] followed by
/// [`log_softmax_backward`] run with the same block size, bit for bit for `logp` and
/// `dlogits`. Status in the workspace's first word as [`log_softmax_status`] reads it.
///
/// Errors: [`Error::InvalidArgument`] for options outside [`fused_supports`], a missing buffer,
/// a `dstride` below `vocab` or an in-place call with another stride, an unaligned workspace or
/// more rows than `u32`; [`Error::InvalidLayout`] for rows without sequences.
///
/// # Safety
/// As [`log_softmax_backward`] and [`grpo_loss`] (the loss buffers hold `rows.rows` entries in
/// `f32`, or `n_seq` advantages).
pub unsafe fn logits_loss_fused<L: Launcher>(
    launcher: &L,
    rows: &LogitsBuffers,
    buf: &FusedLossBuffers,
    lsm: &LogSoftmaxOptions,
    loss: &LossOptions,
    tuning: Tuning,
) -> Result<(), KernelError<L::Error>> {
    loss.validate()?;
    tuning.check()?;
    if !fused_supports(loss) {
        return Err(Error::InvalidArgument.into());
    }
    let mut x = check_rows(rows, lsm)?;
    let n_tok = u32::try_from(rows.rows).map_err(|_| Error::InvalidArgument)?;
    if buf.workspace == 0 || !buf.workspace.is_multiple_of(16) {
        return Err(Error::InvalidArgument.into());
    }
    if buf.dstride < u64::from(rows.vocab)
        || (buf.dlogits == rows.logits && buf.dstride != rows.stride)
    {
        return Err(Error::InvalidArgument.into());
    }
    if rows.rows > 0 && (buf.dlogits == 0 || buf.adv == 0 || buf.seq_offsets == 0) {
        return Err(Error::InvalidArgument.into());
    }
    if buf.n_seq == 0 && n_tok != 0 {
        return Err(Error::InvalidLayout.into());
    }
    // SAFETY: the workspace's first 4 bytes are the status word (caller contract).
    unsafe { launcher.memset_zero(buf.workspace, 4) }.map_err(KernelError::Backend)?;
    if rows.rows == 0 {
        return Ok(());
    }
    let lb = LossBuffers {
        dtype: Dtype::F32,
        logp: 0,
        logp_old: buf.logp_old,
        logp_ref: buf.logp_ref,
        adv: buf.adv,
        adv_per_token: buf.adv_per_token,
        mask: rows.mask,
        seq_offsets: buf.seq_offsets,
        n_seq: buf.n_seq,
        n_tok,
        max_seq_len: 0,
        grad: 0,
        grad_in_input_dtype: false,
        stats: buf.stats,
        // After the status word, 16-byte aligned, as in logits_loss_forward.
        workspace: buf.workspace + 16,
        workspace_len: WORKSPACE_BYTES - 16,
    };
    let mut p = base_params(&lb, loss);
    // SAFETY: the loss's part of the workspace holds a LossWorkRaw (WORKSPACE_BYTES - 16 bytes,
    // checked at compile time in plan/mod.rs); the pre-pass reads the mask and the offsets.
    unsafe { prepare_work(launcher, &mut p, &lb, buf.stats != 0, tuning) }?;
    x.logp = buf.logp;
    x.lse = buf.lse;
    x.status = buf.workspace;
    x.dlogits = buf.dlogits;
    x.dstride = buf.dstride;
    x.block_team = 1;
    let g = logits_loss_geometry(rows.rows, tuning);
    // SAFETY: buffers as documented (caller contract); at most STAT_SLOTS blocks.
    unsafe { launch(launcher, Kernel::logits_loss(rows.dtype), g, (p, x)) }
}
