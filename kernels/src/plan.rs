//! What each operation launches, independent of where it runs.
//!
//! The same plan drives the CUDA backend ([`crate::cuda`]) and the host emulator of the tests
//! (crate `care-kernels-emu`), so the emulated tests cover argument checks, workspace use, the
//! launch order and the geometry exactly as a GPU run uses them.

use care_core::Error;
use care_core::grpo::{
    AdvantageOptions, Aggregation, Baseline, LossOptions, RatioLevel, Reweight, Scale,
};

use crate::kernel::{
    Geometry, Kernel, Tuning, advantages_geometry, batch_std_geometry, denoms_geometry,
    loss_geometry,
};
use crate::params::{
    ADV_FINALIZE, ADV_LOCAL, ADV_PARTIAL_SQUARES, ADV_PARTIAL_SUMS, AdvParams, BatchStdParams,
    LossDenomsRaw, LossParams, STATUS_INVALID_MOMENTS, STATUS_NON_FINITE, STATUS_SINGLETON,
};

/// Bytes of device workspace an operation needs (status word, batch std, loss denominators);
/// 16-byte aligned.
pub const WORKSPACE_BYTES: usize = 64;

/// The largest `grid.x` CUDA allows (2^31 - 1).
pub const MAX_GRID_X: u32 = i32::MAX as u32;

/// Where kernels run: the CUDA driver on a stream, or the host emulator.
///
/// Addresses are device addresses (`u64`); for the emulator they are host addresses.
pub trait Backend {
    /// The backend's own failure (a driver error code, an emulator error).
    type Error;

    /// Zeroes `bytes` bytes at `ptr`, ordered with the launches.
    ///
    /// # Safety
    /// `ptr..ptr + bytes` is writable memory of this backend.
    unsafe fn memset_zero(&self, ptr: u64, bytes: usize) -> Result<(), Self::Error>;

    /// Launches `kernel` with one by-value argument per entry of `args` (each entry points at
    /// the argument's bytes, as `cuLaunchKernel`'s `kernelParams`).
    ///
    /// # Safety
    /// The arguments match the kernel's C signature and every address inside them is valid
    /// for the accesses the kernel makes (see each operation's documentation).
    unsafe fn launch(
        &self,
        kernel: Kernel,
        geometry: Geometry,
        args: &[*mut core::ffi::c_void],
    ) -> Result<(), Self::Error>;
}

/// Errors of the kernel operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelError<E> {
    /// A `care-core` error: bad arguments, or a status reported by the kernel.
    Core(Error),
    /// The backend failed.
    Backend(E),
}

impl<E> From<Error> for KernelError<E> {
    fn from(e: Error) -> Self {
        KernelError::Core(e)
    }
}

impl<E: core::fmt::Debug> core::fmt::Display for KernelError<E> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            KernelError::Core(e) => write!(f, "{e}"),
            KernelError::Backend(e) => write!(f, "kernel backend error: {e:?}"),
        }
    }
}

impl<E: core::fmt::Debug> std::error::Error for KernelError<E> {}

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
    /// At least [`WORKSPACE_BYTES`] of device memory, 16-byte aligned; holds the status word
    /// read by [`advantage_status`].
    pub workspace: u64,
    /// `f32` device scalar with the batch std to use under `Scale::BatchStd` (for example a
    /// std all-reduced across ranks), or 0 to compute it from this call's rewards.
    pub batch_std: u64,
}

/// Launches the group advantages (SPEC §9): `batch_std_f32` first when the scale is the batch
/// std, then `group_advantages_f32`. `tuning` overrides the tuned launch choices
/// (`Tuning::default()` on the GPU).
///
/// Unlike the CPU reference, the kernel cannot refuse to write: a singleton group under the
/// `error` policy or an infinite valid reward sets a bit in the workspace status word and the
/// outputs are still written; check it with [`advantage_status`].
///
/// # Safety
/// Every address in `buf` is valid device memory of the backend with the sizes documented on
/// [`AdvantageBuffers`], and stays valid until the launches complete.
pub unsafe fn group_advantages<B: Backend>(
    backend: &B,
    buf: &AdvantageBuffers,
    opts: &AdvantageOptions,
    tuning: Tuning,
) -> Result<(), KernelError<B::Error>> {
    // SAFETY: forwarded caller contract.
    unsafe { launch_advantages(backend, buf, opts, Phase::Local, tuning) }
}

/// Groups split across ranks (SPEC §11), step 1 of 3: writes this rank's count and sum of the
/// valid rewards per group into `sums` (`GroupSums[B]`, i.e. `f64[2 * B]`), for the trainer to
/// all-reduce with a sum. `buf.adv` is not used. Every rank passes the same `B` groups (a group
/// without local samples is an empty CSR range). An infinite valid reward sets the status.
///
/// # Safety
/// As [`group_advantages`]; `sums` holds `B` entries.
pub unsafe fn group_partial_sums<B: Backend>(
    backend: &B,
    buf: &AdvantageBuffers,
    sums: u64,
    tuning: Tuning,
) -> Result<(), KernelError<B::Error>> {
    // SAFETY: forwarded caller contract.
    unsafe {
        launch_advantages(
            backend,
            buf,
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
pub unsafe fn group_partial_squares<B: Backend>(
    backend: &B,
    buf: &AdvantageBuffers,
    sums: u64,
    m2: u64,
    tuning: Tuning,
) -> Result<(), KernelError<B::Error>> {
    // SAFETY: forwarded caller contract.
    unsafe {
        launch_advantages(
            backend,
            buf,
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
pub unsafe fn group_advantages_finalize<B: Backend>(
    backend: &B,
    buf: &AdvantageBuffers,
    sums: u64,
    m2: u64,
    opts: &AdvantageOptions,
    tuning: Tuning,
) -> Result<(), KernelError<B::Error>> {
    // SAFETY: forwarded caller contract.
    unsafe { launch_advantages(backend, buf, opts, Phase::Finalize { sums, m2 }, tuning) }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Local,
    PartialSums { sums: u64 },
    PartialSquares { sums: u64, m2: u64 },
    Finalize { sums: u64, m2: u64 },
}

unsafe fn launch_advantages<B: Backend>(
    backend: &B,
    buf: &AdvantageBuffers,
    opts: &AdvantageOptions,
    phase: Phase,
    tuning: Tuning,
) -> Result<(), KernelError<B::Error>> {
    opts.validate()?;
    check_tuning(tuning)?;
    // Not on the GPU yet: the baselines with per-sample inputs or a whole-group pass, the std
    // floor and the GPG factor (the CPU reference has them).
    let gpu_baseline = matches!(
        opts.baseline,
        Baseline::Mean | Baseline::LeaveOneOut | Baseline::None
    );
    if !gpu_baseline || opts.std_floor != 0.0 || opts.reweight != Reweight::None {
        return Err(Error::InvalidArgument.into());
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
    unsafe { backend.memset_zero(buf.workspace, 8) }.map_err(KernelError::Backend)?;
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
        let mut p = BatchStdParams {
            rewards: buf.rewards,
            valid: buf.valid,
            out_std: batch_std,
            sums,
            m2,
            n: buf.n,
            unbiased: u32::from(opts.std_kind == care_core::grpo::StdKind::Unbiased),
            num_groups,
            pad0: 0,
        };
        let args = [(&raw mut p).cast::<core::ffi::c_void>()];
        // SAFETY: `p` matches `CareBatchStdParams`; rewards/valid hold `n` entries, sums/m2
        // (finalize) `num_groups`, and `out_std` is inside the workspace (caller contract).
        unsafe { backend.launch(Kernel::BatchStdF32, batch_std_geometry(tuning), &args) }
            .map_err(KernelError::Backend)?;
    }
    let broadcast = writes_adv && buf.tok_offsets != 0;
    let (geometry, warp) = advantages_geometry(buf.n, num_groups, broadcast, tuning);
    if geometry.grid.0 > MAX_GRID_X {
        return Err(Error::InvalidArgument.into());
    }
    let mut p = AdvParams {
        rewards: buf.rewards,
        valid: buf.valid,
        offsets,
        adv: if writes_adv { buf.adv } else { 0 },
        group_stats: if writes_adv { buf.group_stats } else { 0 },
        batch_std,
        tok_offsets: if broadcast { buf.tok_offsets } else { 0 },
        tok_mask: buf.tok_mask,
        adv_tok: if broadcast { buf.adv_tok } else { 0 },
        status,
        sums,
        m2,
        n: buf.n,
        num_groups,
        group_size,
        warp_per_group: u32::from(warp),
        mode,
        ..AdvParams::default()
    }
    .with_options(opts);
    let args = [(&raw mut p).cast::<core::ffi::c_void>()];
    // SAFETY: `p` matches `CareAdvParams`; its buffers have the documented sizes (caller
    // contract); the geometry is the one the kernel's team indexing assumes.
    unsafe { backend.launch(Kernel::GroupAdvantagesF32, geometry, &args) }
        .map_err(KernelError::Backend)
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

/// The log-prob dtype of the loss kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// `f32`.
    F32,
    /// `bf16` (`half::bf16`, `__nv_bfloat16` bits).
    Bf16,
    /// `f16` (`half::f16`, `__half` bits).
    F16,
}

impl Dtype {
    /// Every dtype.
    pub const ALL: [Dtype; 3] = [Dtype::F32, Dtype::Bf16, Dtype::F16];

    /// The loss kernel of this dtype.
    pub const fn loss_kernel(self) -> Kernel {
        match self {
            Dtype::F32 => Kernel::GrpoLossF32,
            Dtype::Bf16 => Kernel::GrpoLossBf16,
            Dtype::F16 => Kernel::GrpoLossF16,
        }
    }

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 | Dtype::F16 => 2,
        }
    }

    /// The name used in tables and kernel symbols.
    pub const fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "f16",
        }
    }
}

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
    /// At least [`WORKSPACE_BYTES`] of device memory, 16-byte aligned (default denominators).
    pub workspace: u64,
}

/// Launches the fused clipped-ratio loss (SPEC §10): `grpo_loss_denoms` first when some
/// denominator of `opts` is 0 (this call's own counts), then `grpo_loss_<dtype>`.
///
/// # Safety
/// Every address in `buf` is valid device memory of the backend with the documented sizes and
/// dtypes, and stays valid until the launches complete.
pub unsafe fn grpo_loss<B: Backend>(
    backend: &B,
    buf: &LossBuffers,
    opts: &LossOptions,
    tuning: Tuning,
) -> Result<(), KernelError<B::Error>> {
    opts.validate()?;
    check_tuning(tuning)?;
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
    if p.needs_denoms() {
        p.denoms = buf.workspace;
        // SAFETY: the workspace holds WORKSPACE_BYTES >= size_of::<LossDenomsRaw>().
        unsafe { backend.memset_zero(buf.workspace, core::mem::size_of::<LossDenomsRaw>()) }
            .map_err(KernelError::Backend)?;
        let mut out = buf.workspace;
        let args = [
            (&raw mut p).cast::<core::ffi::c_void>(),
            (&raw mut out).cast::<core::ffi::c_void>(),
        ];
        // SAFETY: `p` matches `CareLossParams` and `out` the `CareLossDenoms*` argument; the
        // kernel reads only `seq_offsets` and `mask` (caller contract on their sizes).
        unsafe {
            backend.launch(
                Kernel::GrpoLossDenoms,
                denoms_geometry(buf.n_seq, tuning),
                &args,
            )
        }
        .map_err(KernelError::Backend)?;
    }
    // Chunks re-read their whole sequence for the GSPO mean and for the mask scan of
    // seq_mean_token_mean.
    let rescans = opts.ratio_level == RatioLevel::Sequence
        || (buf.mask != 0 && opts.aggregation == Aggregation::SeqMeanTokenMean);
    let geometry = loss_geometry(buf.n_seq, buf.n_tok, buf.max_seq_len, rescans, tuning);
    let args = [(&raw mut p).cast::<core::ffi::c_void>()];
    // SAFETY: `p` matches `CareLossParams`; buffers have the documented sizes and dtype (caller
    // contract); grid.x = n_seq as the kernel's sequence indexing assumes.
    unsafe { backend.launch(buf.dtype.loss_kernel(), geometry, &args) }
        .map_err(KernelError::Backend)
}

fn check_tuning(t: Tuning) -> Result<(), Error> {
    let threads_ok = t
        .threads
        .is_none_or(|n| (32..=1024).contains(&n) && n.is_multiple_of(32));
    let chunks_ok = t.loss_chunks.is_none_or(|c| (1..=65535).contains(&c));
    if threads_ok && chunks_ok {
        Ok(())
    } else {
        Err(Error::InvalidArgument)
    }
}
