//! The fused policy loss (SPEC §10, §16 the rollout correction, §17 the policy-loss family):
//! `grpo_loss_denoms` and `grpo_loss_{f32,bf16,f16}`.

use care_core::Dtype;
use care_core::Error;
use care_core::grpo::{Aggregation, Bypass, LossOptions, PolicyLoss, RatioLevel, SequenceCount};

use super::WORKSPACE_BYTES;
use super::{KernelError, Launcher, launch};
use crate::geometry::{
    MAX_GRID_X, Tuning, cov_cut_geometry, cov_geometry, cov_radix_geometry, denoms_geometry,
    loss_geometry,
};
use crate::kernel::{Kernel, entry};
use crate::params::{COV_ROUNDS, CovWorkRaw, LossDenomsRaw, LossParams, LossWorkRaw};

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
    /// Device memory, 16-byte aligned: the default denominators, and for Clip-Cov and KL-Cov
    /// the covariance selection; [`loss_workspace_bytes`] says how much.
    pub workspace: u64,
    /// Bytes at `workspace`; at least [`loss_workspace_bytes`].
    pub workspace_len: usize,
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

/// Whether these options run the covariance selection of Clip-Cov and KL-Cov: its pre-passes
/// (`grpo_cov_*`) and its workspace (both losses are token-level; the options check refuses
/// them at the sequence levels).
pub fn selects_by_covariance(opts: &LossOptions) -> bool {
    opts.policy_loss.selects_by_covariance()
}

/// Offset of the [`CovWorkRaw`] in the workspace: after the denominators' bytes.
const COV_WORK_OFFSET: usize = WORKSPACE_BYTES;
/// Offset of the `u64[n_tok]` candidate keys: after the [`CovWorkRaw`], 16-byte aligned.
const COV_KEYS_OFFSET: usize = COV_WORK_OFFSET + size_of::<CovWorkRaw>().next_multiple_of(16);

/// Bytes of device workspace [`grpo_loss_with`] needs for `n_tok` tokens under `opts`:
/// [`WORKSPACE_BYTES`], plus for Clip-Cov and KL-Cov a
/// [`CovWorkRaw`] and 8 bytes per token for the candidate keys.
pub fn loss_workspace_bytes(opts: &LossOptions, n_tok: u32) -> usize {
    if selects_by_covariance(opts) {
        loss_workspace_bytes_cov(n_tok)
    } else {
        WORKSPACE_BYTES
    }
}

/// The [`CovWorkRaw`] of a workspace that [`grpo_loss_with`] used for Clip-Cov or KL-Cov (its
/// `selected` is the CPU's `LossOutput::cov_selected`), as a device address.
pub fn cov_work_address(workspace: u64) -> u64 {
    workspace + COV_WORK_OFFSET as u64
}

/// [`grpo_loss`] with the rollout correction: with `roll.logp_rollout`, the importance weights
/// and rejections of `opts.rollout` apply (when active) and the diagnostics accumulate into
/// `roll.stats` (when not 0), as `care_core::grpo::policy_loss` with `logp_rollout`.
///
/// With Clip-Cov or KL-Cov, the covariance selection runs first (SPEC §17):
/// the means of `A` and `logp` over the counted tokens, each token's candidate key, a radix
/// select of the `k`-th largest in 8 rounds and the cut with the CPU's tie rule (the earlier
/// token), all in the workspace; the loss pass then reads each token's verdict.
///
/// Errors: [`Error::InvalidArgument`] for a missing required buffer, a workspace shorter than
/// [`loss_workspace_bytes`] or too many sequences; [`Error::InvalidLayout`] for tokens without
/// sequences.
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
    if buf.logp == 0 || buf.adv == 0 || buf.seq_offsets == 0 || buf.workspace == 0 {
        return Err(Error::InvalidArgument.into());
    }
    // Without the selection the loss uses a LossWorkRaw (the denominators and the statistics'
    // slots); with it, the covariance selection's memory follows.
    if buf.workspace_len < size_of::<LossWorkRaw>()
        || (selects_by_covariance(opts)
            && buf.workspace_len < loss_workspace_bytes(opts, buf.n_tok))
    {
        return Err(Error::InvalidArgument.into());
    }
    if buf.n_seq > MAX_GRID_X {
        return Err(Error::InvalidArgument.into()); // one block row per sequence
    }
    if buf.n_seq == 0 {
        if buf.n_tok != 0 {
            return Err(Error::InvalidLayout.into());
        }
        if selects_by_covariance(opts) {
            // Nothing to select: the results say so (`selected` 0).
            // SAFETY: the workspace holds loss_workspace_bytes (checked above).
            unsafe {
                launcher.memset_zero(cov_work_address(buf.workspace), size_of::<CovWorkRaw>())
            }
            .map_err(KernelError::Backend)?;
        }
        return Ok(());
    }
    let with_roll = roll.logp_rollout != 0;
    let bypass = opts.bypass == Bypass::On;
    if bypass && (buf.logp_old != 0 || !with_roll) {
        // As the CPU reference: the rollout log-probs are the old ones.
        return Err(Error::InvalidArgument.into());
    }
    let mut p = base_params(buf, opts);
    if bypass {
        // Bypass mode: the ratio's old log-probs are the rollout's (the kernel takes the
        // correction's proximal log-probs from `logp`, as `p.bypass` says).
        p.logp_old = roll.logp_rollout;
    }
    if with_roll {
        p.logp_rollout = roll.logp_rollout;
        p.rollout_stats = roll.stats;
        p.roll_on = u32::from(opts.rollout.active());
    }
    // SAFETY: the workspace holds a LossWorkRaw (checked above); the pre-pass reads the
    // caller's buffers with their documented sizes.
    unsafe {
        prepare_work(
            launcher,
            &mut p,
            buf,
            buf.stats != 0 || roll.stats != 0,
            tuning,
        )
    }?;
    if selects_by_covariance(opts) {
        // SAFETY: the workspace holds loss_workspace_bytes (checked above); the kernels read
        // the caller's buffers as the loss pass does.
        unsafe { covariance_selection(launcher, &mut p, buf, tuning) }?;
    }
    // Chunks re-read their whole sequence for the GSPO and GMPO means, the rollout correction's
    // sequence pass and the mask scan of seq_mean_token_mean.
    let rescans = opts.ratio_level != RatioLevel::Token
        || opts.policy_loss == PolicyLoss::Gmpo
        || opts.policy_loss == PolicyLoss::Vespo
        || with_roll
        || (buf.mask != 0 && opts.aggregation == Aggregation::SeqMeanTokenMean);
    let geometry = loss_geometry(buf.n_seq, buf.n_tok, buf.max_seq_len, rescans, tuning);
    // SAFETY: buffers have the documented sizes and dtype (caller contract); grid.x = n_seq as
    // the kernel's sequence indexing assumes.
    unsafe { launch(launcher, Kernel::grpo_loss(buf.dtype), geometry, (p,)) }
}

/// The loss parameters of `buf` under `opts` (no rollout correction, no covariance selection,
/// no workspace yet).
pub(crate) fn base_params(buf: &LossBuffers, opts: &LossOptions) -> LossParams {
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
    // Every row in the sequence count: the call's row count stands for a missing global count
    // (the device pre-pass counts only the sequences with a counted token).
    if opts.sequence_count == SequenceCount::All && opts.global_sequences <= 0.0 {
        p.n_seq_denom = buf.n_seq as f32;
    }
    p
}

/// Points `p` at the workspace (a [`LossWorkRaw`]): the statistics' slots when `stats` (the
/// arrival counter zeroed), and the default denominators when some is missing (zeroed, then
/// `grpo_loss_denoms`).
///
/// # Safety
/// `buf.workspace` holds a [`LossWorkRaw`]; the addresses in `p` as [`grpo_loss_with`].
pub(crate) unsafe fn prepare_work<L: Launcher>(
    launcher: &L,
    p: &mut LossParams,
    buf: &LossBuffers,
    stats: bool,
    tuning: Tuning,
) -> Result<(), KernelError<L::Error>> {
    if stats {
        // The statistics go through the per-block slots of the workspace; the arrival counter
        // starts at 0.
        p.work = buf.workspace;
        let counter = core::mem::offset_of!(LossWorkRaw, arrivals);
        // SAFETY: the workspace holds a LossWorkRaw (caller contract).
        unsafe { launcher.memset_zero(buf.workspace + counter as u64, 4) }
            .map_err(KernelError::Backend)?;
    }
    if p.needs_denoms() {
        p.denoms = buf.workspace;
        // SAFETY: the workspace holds a LossWorkRaw, whose first member is the denominators.
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
                (*p, buf.workspace),
            )
        }?;
    }
    Ok(())
}

/// The covariance selection's launches (see [`grpo_loss_with`]); sets `p.cov_work` and
/// `p.cov_keys` for the loss pass.
///
/// # Safety
/// `buf.workspace` holds [`loss_workspace_bytes`]; the other addresses as [`grpo_loss_with`].
unsafe fn covariance_selection<L: Launcher>(
    launcher: &L,
    p: &mut LossParams,
    buf: &LossBuffers,
    tuning: Tuning,
) -> Result<(), KernelError<L::Error>> {
    p.cov_work = cov_work_address(buf.workspace);
    p.cov_keys = buf.workspace + COV_KEYS_OFFSET as u64;
    let bytes = loss_workspace_bytes_cov(buf.n_tok) - COV_WORK_OFFSET;
    // Zero the histograms and the results, and the keys of tokens no sequence covers.
    // SAFETY: the workspace holds COV_KEYS_OFFSET + 8 * n_tok bytes (caller contract).
    unsafe { launcher.memset_zero(p.cov_work, bytes) }.map_err(KernelError::Backend)?;
    let per_seq = cov_geometry(buf.n_seq, tuning);
    // SAFETY (all four launches): `p` points into the workspace and the caller's buffers with
    // the sizes the kernels read; `per_seq.grid.x <= COV_PARTS` slots.
    unsafe { launch(launcher, entry::GRPO_COV_MEANS, per_seq, (*p,)) }?;
    unsafe { launch(launcher, entry::GRPO_COV_KEYS, per_seq, (*p,)) }?;
    let per_tok = cov_radix_geometry(buf.n_tok, tuning);
    for round in 0..COV_ROUNDS {
        p.cov_round = round;
        // SAFETY: as above.
        unsafe { launch(launcher, entry::GRPO_COV_RADIX, per_tok, (*p,)) }?;
    }
    // SAFETY: as above.
    unsafe { launch(launcher, entry::GRPO_COV_CUT, cov_cut_geometry(), (*p,)) }
}

fn loss_workspace_bytes_cov(n_tok: u32) -> usize {
    COV_KEYS_OFFSET + 8 * n_tok as usize
}
