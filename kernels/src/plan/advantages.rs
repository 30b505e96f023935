//! Group advantages (SPEC §9) and their cross-rank phases (§11): `batch_std_f32`,
//! `group_alpha_f32` and `group_advantages_f32`.

use care_core::Error;
use care_core::grpo::{AdvantageOptions, Baseline, Reweight, Scale, StdKind};

use super::{KernelError, Launcher, launch};
use crate::geometry::{
    MAX_GRID_X, Tuning, advantages_geometry, batch_std_geometry, group_alpha_geometry,
};
use crate::kernel::entry;
use crate::params::{
    ADV_FINALIZE, ADV_LOCAL, ADV_PARTIAL_SQUARES, ADV_PARTIAL_SUMS, AdvParams, BatchStdParams,
    STATUS_INVALID_MOMENTS, STATUS_NON_FINITE, STATUS_SINGLETON,
};

/// The group layout, on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceGroups {
    /// `N = B * G`, groups of `group_size` contiguous samples.
    Fixed {
        /// `G`, non-zero and dividing `n`.
        group_size: u32,
    },
    /// CSR offsets `u32[num_groups + 1]` in device memory (`o[0] = 0`, non-decreasing,
    /// `o[B] = n`). The kernels clamp every offset into `0..=n`, so malformed offsets give
    /// wrong results but never out-of-bounds accesses.
    Offsets {
        /// Device address of the offsets.
        ptr: u64,
        /// `B`.
        num_groups: u32,
    },
}

/// Device buffers of [`group_advantages`]. Addresses are 0 where absent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdvantageBuffers {
    /// `f32[n]` rewards.
    pub rewards: u64,
    /// `u8[n]` validity mask (0 = invalid), or 0.
    pub valid: u64,
    /// Number of samples.
    pub n: u32,
    /// Group layout.
    pub groups: DeviceGroups,
    /// `f32[n]` advantages (output).
    pub adv: u64,
    /// `GroupStats[B]` (output, layout of `care_core::grpo::GroupStats`), or 0.
    pub group_stats: u64,
    /// Token broadcast: `u32[n + 1]` token offsets of the samples, or 0 for none.
    pub tok_offsets: u64,
    /// Token broadcast: `u8[T]` token mask, or 0.
    pub tok_mask: u64,
    /// Token broadcast: `f32[T]` output, `A_tok[t] = A[seq(t)] * mask[t]`.
    pub adv_tok: u64,
    /// At least [`WORKSPACE_BYTES`](super::WORKSPACE_BYTES) of device memory, 16-byte
    /// aligned; holds the status word read by [`advantage_status`].
    pub workspace: u64,
    /// `f32` device scalar with the batch std to use under `Scale::BatchStd` (for example a
    /// std all-reduced across ranks), or 0 to compute it from this call's rewards.
    pub batch_std: u64,
}

/// The per-sample inputs some baselines read (device addresses, 0 = absent), as
/// `care_core::grpo::GroupInputs`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AdvantageInputs {
    /// `f32[n]` external baselines ([`Baseline::External`], ReMax).
    pub baselines: u64,
    /// `u32[n]` response lengths ([`Baseline::LengthWeighted`], OPO).
    pub lengths: u64,
}

impl AdvantageInputs {
    /// [`Error::InvalidArgument`] when the baseline of `opts` reads an input that is absent
    /// (lengths for [`Baseline::LengthWeighted`], baselines for [`Baseline::External`]); the
    /// launches check it first, and a caller can check it before it needs a device.
    pub fn check(&self, opts: &AdvantageOptions) -> Result<(), Error> {
        let missing = match opts.baseline {
            Baseline::LengthWeighted => self.lengths == 0,
            Baseline::External => self.baselines == 0,
            _ => false,
        };
        if missing {
            Err(Error::InvalidArgument)
        } else {
            Ok(())
        }
    }
}

/// [`group_advantages_with`] without per-sample inputs.
///
/// # Safety
/// As [`group_advantages_with`].
pub unsafe fn group_advantages<L: Launcher>(
    launcher: &L,
    buf: &AdvantageBuffers,
    opts: &AdvantageOptions,
    tuning: Tuning,
) -> Result<(), KernelError<L::Error>> {
    // SAFETY: forwarded caller contract.
    unsafe { group_advantages_with(launcher, buf, &AdvantageInputs::default(), opts, tuning) }
}

/// Launches the group advantages (SPEC §9): `batch_std_f32` first when the scale is the batch
/// std, `group_alpha_f32` first under the GPG factor, then `group_advantages_f32`. `tuning` overrides the tuned launch choices
/// (`Tuning::default()` on the GPU).
///
/// Unlike the CPU reference, the kernel cannot refuse to write: a singleton group under the
/// `error` policy or an infinite valid reward sets a bit in the workspace status word and the
/// outputs are still written; check it with [`advantage_status`].
///
/// A baseline that needs an input of [`AdvantageInputs`] without it is
/// [`Error::InvalidArgument`], as on the CPU; a non-finite external baseline on a valid sample
/// sets the status ([`Error::NonFinite`]).
///
/// # Safety
/// Every address in `buf` and `inputs` is valid device memory of the launcher with the sizes
/// documented on [`AdvantageBuffers`] and [`AdvantageInputs`], and stays valid until the
/// launches complete.
pub unsafe fn group_advantages_with<L: Launcher>(
    launcher: &L,
    buf: &AdvantageBuffers,
    inputs: &AdvantageInputs,
    opts: &AdvantageOptions,
    tuning: Tuning,
) -> Result<(), KernelError<L::Error>> {
    // SAFETY: forwarded caller contract.
    unsafe { launch_advantages(launcher, buf, inputs, opts, Phase::Local, tuning) }
}

/// Groups split across ranks (SPEC §11), step 1 of 3: writes this rank's count and sum of the
/// valid rewards per group into `sums` (`GroupSums[B]`, i.e. `f64[2 * B]`), for the trainer to
/// all-reduce with a sum. `buf.adv` is not used. Every rank passes the same `B` groups (a group
/// without local samples is an empty CSR range). An infinite valid reward sets the status.
///
/// # Safety
/// As [`group_advantages`]; `sums` holds `B` entries.
pub unsafe fn group_partial_sums<L: Launcher>(
    launcher: &L,
    buf: &AdvantageBuffers,
    sums: u64,
    tuning: Tuning,
) -> Result<(), KernelError<L::Error>> {
    // SAFETY: forwarded caller contract.
    unsafe {
        launch_advantages(
            launcher,
            buf,
            &AdvantageInputs::default(),
            &AdvantageOptions::default(),
            Phase::PartialSums { sums },
            tuning,
        )
    }
}

/// Step 2 of 3: from the all-reduced `sums`, writes this rank's sum of squared deviations from
/// each group's global mean into `m2` (`f64[B]`), for the trainer to all-reduce with a sum.
///
/// # Safety
/// As [`group_advantages`]; `sums` and `m2` hold `B` entries.
pub unsafe fn group_partial_squares<L: Launcher>(
    launcher: &L,
    buf: &AdvantageBuffers,
    sums: u64,
    m2: u64,
    tuning: Tuning,
) -> Result<(), KernelError<L::Error>> {
    // SAFETY: forwarded caller contract.
    unsafe {
        launch_advantages(
            launcher,
            buf,
            &AdvantageInputs::default(),
            &AdvantageOptions::default(),
            Phase::PartialSquares { sums, m2 },
            tuning,
        )
    }
}

/// Step 3 of 3: this rank's advantages (and the global per-group stats, token broadcast) from
/// the all-reduced `sums` and `m2`, equal to a single-rank [`group_advantages`] over the whole
/// batch up to the reduction order (as `care_core::grpo::group_advantages_finalize`). Under the
/// batch std, `batch_std_f32` first combines the group moments. Reduced moments that are
/// negative or not finite set the status ([`Error::InvalidArgument`]).
///
/// # Safety
/// As [`group_advantages`]; `sums` and `m2` hold `B` entries.
pub unsafe fn group_advantages_finalize<L: Launcher>(
    launcher: &L,
    buf: &AdvantageBuffers,
    sums: u64,
    m2: u64,
    opts: &AdvantageOptions,
    tuning: Tuning,
) -> Result<(), KernelError<L::Error>> {
    let inputs = AdvantageInputs::default();
    // SAFETY: forwarded caller contract.
    unsafe { group_advantages_finalize_with(launcher, buf, &inputs, sums, m2, opts, tuning) }
}

/// Step 3 with the per-sample inputs of [`AdvantageInputs`] (this rank's external baselines).
/// The length-weighted and pass@k baselines need a whole group on one rank and are
/// [`Error::InvalidArgument`] here, as in `care_core::grpo::group_advantages_finalize_with`.
///
/// # Safety
/// As [`group_advantages_with`]; `sums` and `m2` hold `B` entries.
pub unsafe fn group_advantages_finalize_with<L: Launcher>(
    launcher: &L,
    buf: &AdvantageBuffers,
    inputs: &AdvantageInputs,
    sums: u64,
    m2: u64,
    opts: &AdvantageOptions,
    tuning: Tuning,
) -> Result<(), KernelError<L::Error>> {
    if matches!(opts.baseline, Baseline::LengthWeighted | Baseline::PassK) {
        return Err(Error::InvalidArgument.into());
    }
    // SAFETY: forwarded caller contract.
    unsafe {
        launch_advantages(
            launcher,
            buf,
            inputs,
            opts,
            Phase::Finalize { sums, m2 },
            tuning,
        )
    }
}

/// Offset of the batch std's [`BatchStdWorkRaw`] in the workspace: after the status word, the
/// batch std and the GPG factor.
const BATCH_STD_WORK_OFFSET: u64 = 16;
const _: () = assert!(
    BATCH_STD_WORK_OFFSET as usize + size_of::<crate::params::BatchStdWorkRaw>()
        <= super::WORKSPACE_BYTES
);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Local,
    PartialSums { sums: u64 },
    PartialSquares { sums: u64, m2: u64 },
    Finalize { sums: u64, m2: u64 },
}

unsafe fn launch_advantages<L: Launcher>(
    launcher: &L,
    buf: &AdvantageBuffers,
    inputs: &AdvantageInputs,
    opts: &AdvantageOptions,
    phase: Phase,
    tuning: Tuning,
) -> Result<(), KernelError<L::Error>> {
    opts.validate()?;
    tuning.check()?;
    if matches!(phase, Phase::Local | Phase::Finalize { .. }) {
        inputs.check(opts)?;
    }
    let (mode, sums, m2, writes_adv) = match phase {
        Phase::Local => (ADV_LOCAL, 0, 0, true),
        Phase::PartialSums { sums } => (ADV_PARTIAL_SUMS, sums, 0, false),
        Phase::PartialSquares { sums, m2 } => (ADV_PARTIAL_SQUARES, sums, m2, false),
        Phase::Finalize { sums, m2 } => (ADV_FINALIZE, sums, m2, true),
    };
    if buf.rewards == 0 || buf.workspace == 0 || (writes_adv && buf.adv == 0) {
        return Err(Error::InvalidArgument.into());
    }
    if mode != ADV_LOCAL && (sums == 0 || (mode != ADV_PARTIAL_SUMS && m2 == 0)) {
        return Err(Error::InvalidArgument.into());
    }
    if mode == ADV_FINALIZE && opts.reweight == Reweight::Nonzero {
        // As the CPU reference: the count of nonzero rewards is not a reduced moment.
        return Err(Error::InvalidArgument.into());
    }
    if writes_adv && buf.tok_offsets != 0 && buf.adv_tok == 0 {
        return Err(Error::InvalidArgument.into());
    }
    let (num_groups, group_size, offsets) = match buf.groups {
        DeviceGroups::Fixed { group_size } => {
            if group_size == 0 || !buf.n.is_multiple_of(group_size) {
                return Err(Error::InvalidLayout.into());
            }
            (buf.n / group_size, group_size, 0)
        }
        DeviceGroups::Offsets { ptr, num_groups } => {
            if ptr == 0 {
                return Err(Error::InvalidLayout.into());
            }
            (num_groups, 0, ptr)
        }
    };
    // SAFETY: the workspace holds WORKSPACE_BYTES (caller contract).
    unsafe { launcher.memset_zero(buf.workspace, 8) }.map_err(KernelError::Backend)?;
    if num_groups == 0 {
        return Ok(());
    }
    let status = buf.workspace;
    let batch_std = if buf.batch_std != 0 {
        buf.batch_std
    } else {
        buf.workspace + 4
    };
    if writes_adv && opts.scale == Scale::BatchStd && buf.batch_std == 0 {
        let p = BatchStdParams {
            rewards: buf.rewards,
            valid: buf.valid,
            out_std: batch_std,
            sums,
            m2,
            n: buf.n,
            unbiased: u32::from(opts.std_kind == StdKind::Unbiased),
            num_groups,
            pad0: 0,
            work: if sums == 0 {
                buf.workspace + BATCH_STD_WORK_OFFSET
            } else {
                0
            },
        };
        if sums == 0 {
            // SAFETY: the slots' arrival counter is inside the workspace (caller contract).
            unsafe { launcher.memset_zero(p.work, 4) }.map_err(KernelError::Backend)?;
        }
        // SAFETY: rewards/valid hold `n` entries, sums/m2 (finalize) `num_groups`, and
        // `out_std` and the slots are inside the workspace (caller contract).
        unsafe {
            launch(
                launcher,
                entry::BATCH_STD_F32,
                batch_std_geometry(buf.n, sums != 0, tuning),
                (p,),
            )
        }?;
    }
    // The GPG factor, an f64 in the workspace after the status word and the batch std.
    let alpha = buf.workspace + 8;
    let gpg = writes_adv && opts.reweight != Reweight::None;
    let base = AdvParams {
        rewards: buf.rewards,
        valid: buf.valid,
        offsets,
        status,
        sums,
        m2,
        baselines: inputs.baselines,
        lengths: inputs.lengths,
        alpha,
        n: buf.n,
        num_groups,
        group_size,
        mode,
        ..AdvParams::default()
    }
    .with_options(opts);
    if gpg {
        // SAFETY: rewards/valid/offsets (or sums/m2 in finalize) have their documented sizes
        // and `alpha` is inside the workspace (caller contract).
        unsafe {
            launch(
                launcher,
                entry::GROUP_ALPHA_F32,
                group_alpha_geometry(tuning),
                (base,),
            )
        }?;
    }
    let broadcast = writes_adv && buf.tok_offsets != 0;
    let (geometry, width) = advantages_geometry(buf.n, num_groups, broadcast, tuning);
    if geometry.grid.0 > MAX_GRID_X {
        return Err(Error::InvalidArgument.into());
    }
    let p = AdvParams {
        adv: if writes_adv { buf.adv } else { 0 },
        group_stats: if writes_adv { buf.group_stats } else { 0 },
        batch_std,
        tok_offsets: if broadcast { buf.tok_offsets } else { 0 },
        tok_mask: buf.tok_mask,
        adv_tok: if broadcast { buf.adv_tok } else { 0 },
        warp_per_group: width,
        reweight: if gpg { base.reweight } else { 0 },
        ..base
    };
    // SAFETY: the buffers of `p` have the documented sizes (caller contract); the geometry is
    // the one the kernel's team indexing assumes.
    unsafe { launch(launcher, entry::GROUP_ADVANTAGES_F32, geometry, (p,)) }
}

/// Maps the status word of [`group_advantages`] (read back from `workspace[0..4]`) to the error
/// the CPU reference returns: [`Error::InvalidArgument`] (bad reduced moments) first, then
/// [`Error::NonFinite`], then [`Error::SingletonGroup`].
pub fn advantage_status(status: u32) -> Result<(), Error> {
    if status & STATUS_INVALID_MOMENTS != 0 {
        Err(Error::InvalidArgument)
    } else if status & STATUS_NON_FINITE != 0 {
        Err(Error::NonFinite)
    } else if status & STATUS_SINGLETON != 0 {
        Err(Error::SingletonGroup)
    } else {
        Ok(())
    }
}
