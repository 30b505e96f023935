//! The fused policy loss (SPEC §10, §16 the rollout correction, §17 the policy-loss family):
//! `grpo_loss_denoms` and `grpo_loss_{f32,bf16,f16}`.

use care_core::Dtype;
use care_core::Error;
use care_core::grpo::{Aggregation, LossOptions, PolicyLoss, RatioLevel, SequenceCount};

use super::{KernelError, Launcher, launch};
use crate::geometry::{MAX_GRID_X, Tuning, denoms_geometry, loss_geometry};
use crate::kernel::{Kernel, entry};
use crate::params::{LossDenomsRaw, LossParams};

/// Device buffers of [`grpo_loss`]. Addresses are 0 where absent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LossBuffers {
    /// Dtype of `logp`, `logp_old`, `logp_ref` (and of `grad` with `grad_in_input_dtype`).
    pub dtype: Dtype,
    /// `T[n_tok]` current log-probs.
    pub logp: u64,
    /// `T[n_tok]` old log-probs, or 0 (on-policy).
    pub logp_old: u64,
    /// `T[n_tok]` reference log-probs, or 0.
    pub logp_ref: u64,
    /// `f32[n_seq]` advantages, or `f32[n_tok]` with `adv_per_token`.
    pub adv: u64,
    /// Whether `adv` holds one value per token.
    pub adv_per_token: bool,
    /// `u8[n_tok]` mask (non-zero = counted), or 0.
    pub mask: u64,
    /// `u32[n_seq + 1]` CSR offsets (`[0] = 0`, non-decreasing, `[n_seq] = n_tok`; clamped into
    /// `0..=n_tok` by the kernels).
    pub seq_offsets: u64,
    /// Number of sequences.
    pub n_seq: u32,
    /// Number of tokens.
    pub n_tok: u32,
    /// Longest sequence if the caller knows it (the padded `T`), else 0: only the geometry uses it.
    pub max_seq_len: u32,
    /// Gradient output `[n_tok]`, or 0 for loss and stats only.
    pub grad: u64,
    /// Write the gradient in `dtype` instead of `f32`.
    pub grad_in_input_dtype: bool,
    /// A `LossStatsRaw` to accumulate into (initialize it to `LossStatsRaw::EMPTY`), or 0.
    pub stats: u64,
    /// At least [`WORKSPACE_BYTES`](super::WORKSPACE_BYTES) of device memory, 16-byte
    /// aligned (default denominators).
    pub workspace: u64,
}

/// The rollout correction's device buffers of [`grpo_loss_with`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RolloutBuffers {
    /// `T[n_tok]` rollout log-probs (the inference engine's), in [`LossBuffers::dtype`], or 0:
    /// no correction and no diagnostics, as without `logp_rollout` on the CPU.
    pub logp_rollout: u64,
    /// A [`RolloutStatsRaw`](crate::params::RolloutStatsRaw) to accumulate the diagnostics into (initialize it to zero), or 0.
    pub stats: u64,
}

/// Launches the fused policy loss (SPEC §10): `grpo_loss_denoms` first when some denominator
/// of `opts` is 0 (this call's own counts), then `grpo_loss_<dtype>`. Without rollout
/// log-probs; see [`grpo_loss_with`].
///
/// # Safety
/// Every address in `buf` is valid device memory of the launcher with the documented sizes and
/// dtypes, and stays valid until the launches complete.
pub unsafe fn grpo_loss<L: Launcher>(
    launcher: &L,
    buf: &LossBuffers,
    opts: &LossOptions,
    tuning: Tuning,
) -> Result<(), KernelError<L::Error>> {
    // SAFETY: the caller's contract, and no rollout buffers.
    unsafe { grpo_loss_with(launcher, buf, &RolloutBuffers::default(), opts, tuning) }
}

/// Whether the kernels implement these options: everything but the covariance selection of
/// Clip-Cov and KL-Cov (a batch-wide top-k over the call's tokens, which the CPU reference
/// computes; on the device it would need a sort or a bisection over the whole batch before the
/// loss pass).
pub fn loss_supported(opts: &LossOptions) -> bool {
    !opts.policy_loss.selects_by_covariance()
}

/// [`grpo_loss`] with the rollout correction: with `roll.logp_rollout`, the importance weights
/// and rejections of `opts.rollout` apply (when active) and the diagnostics accumulate into
/// `roll.stats` (when not 0), as `care_core::grpo::policy_loss` with `logp_rollout`.
///
/// Errors: [`Error::InvalidArgument`] for options the kernels do not implement
/// ([`loss_supported`]), a missing required buffer or too many sequences;
/// [`Error::InvalidLayout`] for tokens without sequences.
///
/// # Safety
/// Every address in `buf` and `roll` is valid device memory of the launcher with the documented
/// sizes and dtypes, and stays valid until the launches complete.
pub unsafe fn grpo_loss_with<L: Launcher>(
    launcher: &L,
    buf: &LossBuffers,
    roll: &RolloutBuffers,
    opts: &LossOptions,
    tuning: Tuning,
) -> Result<(), KernelError<L::Error>> {
    opts.validate()?;
    tuning.check()?;
    if !loss_supported(opts) {
        return Err(Error::InvalidArgument.into());
    }
    if buf.logp == 0 || buf.adv == 0 || buf.seq_offsets == 0 || buf.workspace == 0 {
        return Err(Error::InvalidArgument.into());
    }
    if buf.n_seq > MAX_GRID_X {
        return Err(Error::InvalidArgument.into()); // one block row per sequence
    }
    if buf.n_seq == 0 {
        return if buf.n_tok == 0 {
            Ok(())
        } else {
            Err(Error::InvalidLayout.into())
        };
    }
    let with_roll = roll.logp_rollout != 0;
    let mut p = LossParams {
        logp: buf.logp,
        logp_old: buf.logp_old,
        logp_ref: buf.logp_ref,
        adv: buf.adv,
        mask: buf.mask,
        seq_offsets: buf.seq_offsets,
        grad: buf.grad,
        stats: buf.stats,
        denoms: 0,
        n_seq: buf.n_seq,
        n_tok: buf.n_tok,
        adv_per_token: u32::from(buf.adv_per_token),
        grad_in_input_dtype: u32::from(buf.grad_in_input_dtype),
        ..LossParams::default()
    }
    .with_options(opts);
    p.dtype = buf.dtype.number();
    if with_roll {
        p.logp_rollout = roll.logp_rollout;
        p.rollout_stats = roll.stats;
        p.roll_on = u32::from(opts.rollout.active());
    }
    // Every row in the sequence count: the call's row count stands for a missing global count
    // (the device pre-pass counts only the sequences with a counted token).
    if opts.sequence_count == SequenceCount::All && opts.global_sequences <= 0.0 {
        p.n_seq_denom = buf.n_seq as f32;
    }
    if p.needs_denoms() {
        p.denoms = buf.workspace;
        // SAFETY: the workspace holds WORKSPACE_BYTES >= size_of::<LossDenomsRaw>().
        unsafe { launcher.memset_zero(buf.workspace, core::mem::size_of::<LossDenomsRaw>()) }
            .map_err(KernelError::Backend)?;
        // SAFETY: `out` is the workspace, which holds the `CareLossDenoms` the kernel writes;
        // the kernel reads `seq_offsets` and `mask`, and with the rollout correction the
        // log-probs (caller contract on their sizes).
        unsafe {
            launch(
                launcher,
                entry::GRPO_LOSS_DENOMS,
                denoms_geometry(buf.n_seq, tuning),
                (p, buf.workspace),
            )
        }?;
    }
    // Chunks re-read their whole sequence for the GSPO and GMPO means, the rollout correction's
    // sequence pass and the mask scan of seq_mean_token_mean.
    let rescans = opts.ratio_level != RatioLevel::Token
        || opts.policy_loss == PolicyLoss::Gmpo
        || with_roll
        || (buf.mask != 0 && opts.aggregation == Aggregation::SeqMeanTokenMean);
    let geometry = loss_geometry(buf.n_seq, buf.n_tok, buf.max_seq_len, rescans, tuning);
    // SAFETY: buffers have the documented sizes and dtype (caller contract); grid.x = n_seq as
    // the kernel's sequence indexing assumes.
    unsafe { launch(launcher, Kernel::grpo_loss(buf.dtype), geometry, (p,)) }
}
