//! GPU advantages and loss (SPEC §9-10) on caller device pointers and a caller `CUstream`,
//! through `care-kernels`, with the input structs of the CPU entry points (their pointers are
//! device addresses here) and a `care_gpu_launch`. Launches are asynchronous on the caller's
//! stream; results that the host needs (the status word, the loss stats) are read back by
//! separate calls that synchronize the stream. Device memory cannot be inspected, so every
//! length is checked against the others instead. Without a CUDA driver or device every
//! function checks its arguments and then returns `CARE_ERR_CUDA_UNAVAILABLE`.

use core::ffi::c_void;
use core::mem::size_of;

use care_core::grpo::LossStats;
use care_kernels::cuda::{CudaLauncher, driver_available};
use care_kernels::params::{LossStatsRaw, RolloutStatsRaw};
use care_kernels::{
    AdvantageBuffers, AdvantageInputs, DeviceGroups, Dtype, KernelError, LossBuffers,
    RolloutBuffers, Tuning, WORKSPACE_BYTES,
};
use cudarc::driver::result as cu;
use cudarc::driver::{DriverError, sys};

use crate::advantage::{
    self, care_advantage_options, care_advantage_outputs, care_group_layout, care_rewards,
};
use crate::args::{self, Out};
use crate::loss::{self, care_loss_inputs, care_loss_options, care_loss_stats, care_rollout_stats};
use crate::result::{care_result, map_error};

/// Bytes of device workspace every GPU call needs (16-byte aligned, caller-allocated).
pub const CARE_GPU_WORKSPACE_BYTES: usize = 131072;
/// Bytes of the device-side loss statistics accumulator of `care_gpu_policy_loss`.
pub const CARE_GPU_LOSS_STATS_BYTES: usize = 56;
/// Bytes of the device-side rollout-diagnostics accumulator of `care_gpu_policy_loss_into`
/// (4-byte aligned).
pub const CARE_GPU_ROLLOUT_STATS_BYTES: usize = 52;

const _: () = assert!(CARE_GPU_WORKSPACE_BYTES == WORKSPACE_BYTES);
const _: () = assert!(CARE_GPU_LOSS_STATS_BYTES == size_of::<LossStatsRaw>());
const _: () = assert!(CARE_GPU_ROLLOUT_STATS_BYTES == size_of::<RolloutStatsRaw>());

/// A device address: NULL is `None` when the buffer is optional and `CARE_ERR_NULL_POINTER`
/// when it is required; `len` must be `want` (the lengths are checked against each other,
/// since device allocations cannot be inspected).
pub(crate) fn dev<T>(
    p: *const T,
    len: usize,
    want: usize,
    required: bool,
) -> Result<u64, care_result> {
    if p.is_null() {
        return if len == 0 && (!required || want == 0) {
            Ok(0)
        } else {
            Err(care_result::CARE_ERR_NULL_POINTER)
        };
    }
    if !p.is_aligned() {
        crate::detail::set_generic(format_args!(
            "the device address {p:p} is not aligned to its {}-byte elements",
            core::mem::align_of::<T>()
        ));
        return Err(care_result::CARE_ERR_INVALID_ARGUMENT);
    }
    if len != want {
        crate::detail::set_generic(format_args!(
            "a device buffer has length {len} where {want} is required"
        ));
        return Err(care_result::CARE_ERR_LENGTH_MISMATCH);
    }
    Ok(p as u64)
}

/// [`dev`] for a log-prob array of `dtype` passed as `void *`: its address must also be aligned
/// to the element size (`CARE_ERR_INVALID_ARGUMENT`), which the pointer type cannot say.
fn dev_logp(
    p: *const c_void,
    len: usize,
    want: usize,
    required: bool,
    dtype: Dtype,
) -> Result<u64, care_result> {
    if !p.is_null() && !(p as usize).is_multiple_of(dtype.size()) {
        return Err(care_result::CARE_ERR_INVALID_ARGUMENT);
    }
    dev(p, len, want, required)
}

pub(crate) fn workspace(p: *mut c_void, len: usize) -> Result<u64, care_result> {
    if p.is_null() {
        return Err(care_result::CARE_ERR_NULL_POINTER);
    }
    if !(p as usize).is_multiple_of(16) {
        return Err(care_result::CARE_ERR_INVALID_ARGUMENT);
    }
    if len < CARE_GPU_WORKSPACE_BYTES {
        return Err(care_result::CARE_ERR_BUFFER_TOO_SMALL);
    }
    Ok(p as u64)
}

fn to_u32(n: usize) -> Result<u32, care_result> {
    u32::try_from(n).map_err(|_| care_result::CARE_ERR_INVALID_ARGUMENT)
}

/// Maps a driver error to a CUDA code: missing driver/device, kernel image problems, or any
/// other driver failure.
pub(crate) fn driver_code(e: DriverError) -> care_result {
    use sys::CUresult::*;
    match e.0 {
        CUDA_ERROR_NO_DEVICE
        | CUDA_ERROR_NOT_INITIALIZED
        | CUDA_ERROR_DEINITIALIZED
        | CUDA_ERROR_INVALID_DEVICE
        | CUDA_ERROR_SYSTEM_DRIVER_MISMATCH
        | CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE => care_result::CARE_ERR_CUDA_UNAVAILABLE,
        CUDA_ERROR_INVALID_PTX
        | CUDA_ERROR_UNSUPPORTED_PTX_VERSION
        | CUDA_ERROR_NO_BINARY_FOR_GPU
        | CUDA_ERROR_INVALID_IMAGE
        | CUDA_ERROR_NOT_FOUND
        | CUDA_ERROR_JIT_COMPILER_NOT_FOUND
        | CUDA_ERROR_SHARED_OBJECT_INIT_FAILED => care_result::CARE_ERR_CUDA_COMPILE,
        _ => care_result::CARE_ERR_CUDA_DRIVER,
    }
}

pub(crate) fn kernel_code(e: KernelError<DriverError>) -> care_result {
    match e {
        KernelError::Core(e) => map_error(e),
        KernelError::Backend(e) => driver_code(e),
    }
}

/// A launcher on the caller's stream, or the CUDA code saying why there is none.
///
/// # Safety
/// `stream` is NULL (legacy default stream) or a live `CUstream`; `any_ptr` a device address.
pub(crate) unsafe fn backend(
    stream: *mut c_void,
    any_ptr: u64,
) -> Result<CudaLauncher, care_result> {
    if !driver_available() {
        return Err(care_result::CARE_ERR_CUDA_UNAVAILABLE);
    }
    // SAFETY: forwarded contract.
    unsafe { CudaLauncher::new(stream.cast(), any_ptr) }.map_err(driver_code)
}

/// Where a GPU call runs and its scratch memory; every GPU function but `care_gpu_available`
/// takes one as its last argument. The kernels run asynchronously on `stream` in the CUDA
/// context current on the calling thread (else the primary context of the pointers' device).
/// `workspace` is caller-allocated device memory of at least `CARE_GPU_WORKSPACE_BYTES`, 16-byte
/// aligned (`CARE_ERR_BUFFER_TOO_SMALL`, `CARE_ERR_INVALID_ARGUMENT`); it holds the status word
/// that the `_status` functions read, so keep it until they have been called. The backward pass
/// and the loss-statistics functions use no workspace: there it may be (NULL, 0).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_gpu_launch {
    /// `sizeof(care_gpu_launch)`.
    pub struct_size: u32,
    /// A `CUstream` (for example `torch.cuda.current_stream().cuda_stream`); NULL is the
    /// legacy default stream.
    pub stream: *mut c_void,
    /// Device scratch memory, or NULL where none is used.
    pub workspace: *mut c_void,
    /// Bytes at `workspace`.
    pub workspace_len: usize,
}

/// A checked `care_gpu_launch`: the stream and the workspace address (0 when absent).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Launch {
    pub(crate) stream: *mut c_void,
    pub(crate) workspace: u64,
    /// Bytes at `workspace` (0 when absent).
    pub(crate) workspace_len: usize,
}

/// Reads `*p`; `needs_workspace` says whether the call needs scratch memory (then NULL is
/// `CARE_ERR_NULL_POINTER`; otherwise (NULL, 0) is accepted and a given one is still checked).
///
/// # Safety
/// As for [`args::input`].
pub(crate) unsafe fn read_launch(
    p: *const care_gpu_launch,
    needs_workspace: bool,
) -> Result<Launch, care_result> {
    // SAFETY: forwarded contract.
    let l = unsafe { args::input(p) }?;
    let absent = l.workspace.is_null() && l.workspace_len == 0;
    let workspace = if absent && !needs_workspace {
        0
    } else {
        workspace(l.workspace, l.workspace_len)?
    };
    Ok(Launch {
        stream: l.stream,
        workspace,
        workspace_len: if workspace == 0 { 0 } else { l.workspace_len },
    })
}

/// `CARE_OK` when the CUDA driver library loads and reports at least one device, else
/// `CARE_ERR_CUDA_UNAVAILABLE`. Creates no context.
#[unsafe(no_mangle)]
pub extern "C" fn care_gpu_available() -> care_result {
    ffi_panic_boundary! {
        if !driver_available() {
            return care_result::CARE_ERR_CUDA_UNAVAILABLE;
        }
        match cu::init().and_then(|()| cu::device::get_count()) {
            Ok(n) if n > 0 => care_result::CARE_OK,
            _ => care_result::CARE_ERR_CUDA_UNAVAILABLE,
        }
    }
}

/// The device addresses of a `care_rewards` and a `care_group_layout`: the rewards, the
/// validity flags (0 when absent), the sample count and the layout with its group count.
///
/// # Safety
/// As for [`args::input`] (the structs themselves are host memory).
unsafe fn device_groups(
    rewards: *const care_rewards,
    layout: *const care_group_layout,
) -> Result<(u64, u64, usize, DeviceGroups, usize), care_result> {
    // SAFETY (both blocks): forwarded contract.
    let r = unsafe { args::input(rewards) }?;
    let l = unsafe { args::input(layout) }?;
    let n = r.rewards_len;
    let d_rewards = dev(r.rewards, n, n, true)?;
    let valid = dev(r.valid, r.valid_len, n, false).map_err(|e| {
        if e == care_result::CARE_ERR_LENGTH_MISMATCH {
            args::mismatch("care_rewards.valid_len", r.valid_len, "rewards_len", n)
        } else {
            e
        }
    })?;
    let (groups, num_groups) = if l.offsets.is_null() {
        if l.offsets_len != 0 {
            return Err(care_result::CARE_ERR_NULL_POINTER);
        }
        let fixed = care_core::grpo::GroupLayout::Fixed {
            group_size: l.group_size as usize,
        };
        if let Some(f) = fixed.fault(n) {
            return Err(crate::detail::fail(
                care_result::CARE_ERR_INVALID_LAYOUT,
                format_args!(
                    "{}",
                    f.named("care_group_layout.group_size", "care_rewards.rewards")
                ),
            ));
        }
        let g = DeviceGroups::Fixed {
            group_size: l.group_size,
        };
        (g, n / l.group_size as usize)
    } else {
        if l.group_size != 0 {
            return Err(care_result::CARE_ERR_INVALID_ARGUMENT);
        }
        let Some(b) = l.offsets_len.checked_sub(1) else {
            return Err(crate::detail::fail(
                care_result::CARE_ERR_INVALID_LAYOUT,
                format_args!(
                    "care_group_layout.offsets_len is 0; the offsets need B + 1 entries, [0] \
                     for no groups"
                ),
            ));
        };
        let ptr = dev(l.offsets, l.offsets_len, l.offsets_len, true)?;
        let g = DeviceGroups::Offsets {
            ptr,
            num_groups: to_u32(b)?,
        };
        (g, b)
    };
    Ok((d_rewards, valid, n, groups, num_groups))
}

/// Group advantages on the GPU, asynchronously on `launch->stream`: as `care_group_advantages`
/// (same structs, device memory) within the documented tolerance. `d_batch_std` is optional:
/// one device `float` with the batch std to use under `CARE_SCALE_BATCH_STD` (for example one
/// all-reduced across ranks); NULL computes it from this call's rewards. A singleton group under
/// the `error` policy or an infinite reward cannot stop the kernel: it is reported by
/// `care_gpu_group_advantages_status`, which reads `launch->workspace`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_gpu_group_advantages(
    rewards: *const care_rewards,
    layout: *const care_group_layout,
    options: *const care_advantage_options,
    outputs: *const care_advantage_outputs,
    d_batch_std: *const f32,
    launch: *const care_gpu_launch,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let (d_rewards, valid, n, groups, num_groups) =
            tri!(unsafe { device_groups(rewards, layout) });
        let o = tri!(unsafe { args::input(outputs) });
        let adv = tri!(dev(o.advantages.cast_const(), o.advantages_len, n, true));
        let stats = tri!(dev(o.stats.cast_const(), o.stats_len, num_groups, false));
        let batch_std = tri!(dev(d_batch_std, usize::from(!d_batch_std.is_null()), 1, false));
        let opts = tri!(unsafe { advantage::read_options(options) });
        let r = tri!(unsafe { args::input(rewards) });
        let per_sample = AdvantageInputs {
            lengths: tri!(dev(r.lengths, r.lengths_len, n, false)),
            baselines: tri!(dev(r.baselines, r.baselines_len, n, false)),
        };
        // Reported before a driver is needed, as the CPU reports it.
        tri!(per_sample.check(&opts).map_err(map_error));
        let l = tri!(unsafe { read_launch(launch, true) });
        let buf = AdvantageBuffers {
            rewards: d_rewards,
            valid,
            n: tri!(to_u32(n)),
            groups,
            adv,
            group_stats: stats,
            tok_offsets: 0,
            tok_mask: 0,
            adv_tok: 0,
            workspace: l.workspace,
            batch_std,
        };
        let b = tri!(unsafe { backend(l.stream, l.workspace) });
        // SAFETY: every address is caller device memory of the documented, cross-checked size.
        let run = unsafe {
            care_kernels::group_advantages_with(&b, &buf, &per_sample, &opts, Tuning::default())
        };
        match run {
            Ok(()) => care_result::CARE_OK,
            Err(e) => kernel_code(e),
        }
    }
}

/// Synchronizes the stream and reads the status word that a `care_gpu_*` call left in the
/// workspace.
///
/// # Safety
/// As for [`read_launch`]; the workspace is device memory on the stream's context.
pub(crate) unsafe fn read_status(launch: *const care_gpu_launch) -> Result<u32, care_result> {
    // SAFETY (all blocks): forwarded contract.
    let l = unsafe { read_launch(launch, true) }?;
    let b = unsafe { backend(l.stream, l.workspace) }?;
    b.synchronize().map_err(driver_code)?;
    let mut word = [0u8; 4];
    // SAFETY: the stream is idle (synchronized); the workspace holds at least 4 bytes.
    unsafe { cu::memcpy_dtoh_sync(&mut word, l.workspace) }.map_err(driver_code)?;
    Ok(u32::from_ne_bytes(word))
}

/// Synchronizes `launch->stream` and reads the status that `care_gpu_group_advantages` left in
/// `launch->workspace`: `CARE_OK`, `CARE_ERR_NON_FINITE` (an infinite valid reward) or
/// `CARE_ERR_SINGLETON_GROUP` (singleton policy `error`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_gpu_group_advantages_status(
    launch: *const care_gpu_launch,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY: forwarded contract.
        let word = tri!(unsafe { read_status(launch) });
        match care_kernels::advantage_status(word) {
            Ok(()) => care_result::CARE_OK,
            Err(e) => map_error(e),
        }
    }
}

/// The device address of a statistics accumulator of `want` bytes: required, the exact
/// length, 4-byte aligned (the kernels add into its `float`/`uint32_t` fields with atomics).
fn dev_stats(
    p: *const c_void,
    len: usize,
    want: usize,
    required: bool,
) -> Result<u64, care_result> {
    dev(p.cast::<u32>(), len, want, required)
}

/// Synchronizes the stream of `launch`, then copies `init` over the device accumulator `s`.
///
/// # Safety
/// As for [`read_launch`]; `s` is device memory of `init.len()` bytes on the stream's context.
unsafe fn stats_reset(s: u64, init: &[u8], launch: *const care_gpu_launch) -> care_result {
    // SAFETY: forwarded contract.
    let l = tri!(unsafe { read_launch(launch, false) });
    // SAFETY: forwarded contract.
    let b = tri!(unsafe { backend(l.stream, s) });
    if let Err(e) = b.synchronize() {
        return driver_code(e);
    }
    // SAFETY: `s` holds `init.len()` bytes (checked length); the stream is idle.
    match unsafe { cu::memcpy_htod_sync(s, init) } {
        Ok(()) => care_result::CARE_OK,
        Err(e) => driver_code(e),
    }
}

/// Synchronizes the stream of `launch` and copies the device accumulator `s` into `raw`.
///
/// # Safety
/// As for [`stats_reset`], with `raw.len()` bytes at `s`.
unsafe fn stats_read(
    s: u64,
    raw: &mut [u8],
    launch: *const care_gpu_launch,
) -> Result<(), care_result> {
    // SAFETY (all blocks): forwarded contract.
    let l = unsafe { read_launch(launch, false) }?;
    let b = unsafe { backend(l.stream, s) }?;
    b.synchronize().map_err(driver_code)?;
    // SAFETY: the stream is idle; `s` holds `raw.len()` bytes.
    unsafe { cu::memcpy_dtoh_sync(raw, s) }.map_err(driver_code)
}

/// Synchronizes `launch->stream`, then resets the device loss-statistics accumulator `d_stats`
/// (`stats_len == CARE_GPU_LOSS_STATS_BYTES`) to empty. `care_gpu_policy_loss` adds into it, so
/// one accumulator can collect several micro-batches.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_gpu_loss_stats_reset(
    d_stats: *mut c_void,
    stats_len: usize,
    launch: *const care_gpu_launch,
) -> care_result {
    ffi_panic_boundary! {
        let s = tri!(dev(d_stats.cast_const(), stats_len, CARE_GPU_LOSS_STATS_BYTES, true));
        static EMPTY: LossStatsRaw = LossStatsRaw::EMPTY;
        // SAFETY: forwarded contract; `s` holds CARE_GPU_LOSS_STATS_BYTES (checked length).
        unsafe { stats_reset(s, bytemuck::bytes_of(&EMPTY), launch) }
    }
}

/// Synchronizes `launch->stream` and reads the device loss-statistics accumulator `d_stats`
/// into `*stats_out`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_gpu_loss_stats_read(
    d_stats: *const c_void,
    stats_len: usize,
    launch: *const care_gpu_launch,
    stats_out: *mut care_loss_stats,
) -> care_result {
    ffi_panic_boundary! {
        let s = tri!(dev(d_stats, stats_len, CARE_GPU_LOSS_STATS_BYTES, true));
        let out = tri!(Out::new(stats_out));
        let mut raw = [0u8; CARE_GPU_LOSS_STATS_BYTES];
        // SAFETY: forwarded contract; `s` holds CARE_GPU_LOSS_STATS_BYTES (checked length).
        tri!(unsafe { stats_read(s, &mut raw, launch) });
        let st: LossStatsRaw = bytemuck::pod_read_unaligned(&raw);
        let core_stats: LossStats = st.to_core();
        // SAFETY: checked non-NULL and aligned; valid for a write (contract).
        unsafe { out.write(loss::stats_to_c(&core_stats)) };
        care_result::CARE_OK
    }
}

/// Synchronizes `launch->stream`, then resets the device rollout-diagnostics accumulator
/// `d_rollout_stats` (`CARE_GPU_ROLLOUT_STATS_BYTES`, 4-byte aligned) to zero.
/// `care_gpu_policy_loss_into` adds into it, so one accumulator can collect several
/// micro-batches. Uses no workspace.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_gpu_rollout_stats_reset(
    d_rollout_stats: *mut c_void,
    rollout_stats_len: usize,
    launch: *const care_gpu_launch,
) -> care_result {
    ffi_panic_boundary! {
        let s = tri!(dev_stats(
            d_rollout_stats.cast_const(),
            rollout_stats_len,
            CARE_GPU_ROLLOUT_STATS_BYTES,
            true,
        ));
        let zero = RolloutStatsRaw::default(); // every sum and count 0
        // SAFETY: forwarded contract; `s` holds CARE_GPU_ROLLOUT_STATS_BYTES (checked length).
        unsafe { stats_reset(s, bytemuck::bytes_of(&zero), launch) }
    }
}

/// Synchronizes `launch->stream` and reads the device rollout-diagnostics accumulator
/// `d_rollout_stats` into `*stats_out`: the fields of `care_rollout_correction`'s statistics,
/// summed over every `care_gpu_policy_loss_into` call since the last reset. Uses no workspace.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_gpu_rollout_stats_read(
    d_rollout_stats: *const c_void,
    rollout_stats_len: usize,
    launch: *const care_gpu_launch,
    stats_out: *mut care_rollout_stats,
) -> care_result {
    ffi_panic_boundary! {
        let s = tri!(dev_stats(d_rollout_stats, rollout_stats_len, CARE_GPU_ROLLOUT_STATS_BYTES, true));
        let out = tri!(Out::new(stats_out));
        let mut raw = [0u8; CARE_GPU_ROLLOUT_STATS_BYTES];
        // SAFETY: forwarded contract; `s` holds CARE_GPU_ROLLOUT_STATS_BYTES (checked length).
        tri!(unsafe { stats_read(s, &mut raw, launch) });
        let st: RolloutStatsRaw = bytemuck::pod_read_unaligned(&raw);
        // SAFETY: checked non-NULL and aligned; valid for a write (contract).
        unsafe { out.write(loss::rollout_stats_to_c(&st.to_core())) };
        care_result::CARE_OK
    }
}

/// The checked device view of a `care_loss_inputs` over `t` tokens (the log-prob arrays are
/// checked only when `with_logp`): log-probs, old and reference log-probs (0 when absent),
/// sequence offsets and count, mask, advantages and their kind.
pub(crate) struct DeviceLoss {
    pub(crate) dtype: Dtype,
    pub(crate) logp: u64,
    pub(crate) logp_old: u64,
    pub(crate) logp_ref: u64,
    pub(crate) seq_offsets: u64,
    pub(crate) n_seq: u32,
    pub(crate) mask: u64,
    pub(crate) adv: u64,
    pub(crate) per_token: bool,
    pub(crate) max_seq_len: u32,
}

/// Reads the device addresses of `c` for `t` tokens (`c.logp_len` for the plain loss, the rows
/// for the fused path, which computes `logp` and passes `with_logp = false`).
pub(crate) fn device_loss(
    c: &care_loss_inputs,
    t: usize,
    with_logp: bool,
) -> Result<DeviceLoss, care_result> {
    let t_name = if with_logp {
        "care_loss_inputs.logp_len"
    } else {
        "care_logits.rows"
    };
    device_loss_unexplained(c, t, with_logp).map_err(|e| loss::explain(e, c, t, t_name, &[], None))
}

fn device_loss_unexplained(
    c: &care_loss_inputs,
    t: usize,
    with_logp: bool,
) -> Result<DeviceLoss, care_result> {
    let dtype = loss::read_dtype(c.dtype)?;
    let logp = if with_logp {
        dev_logp(c.logp, c.logp_len, t, true, dtype)?
    } else {
        0
    };
    let logp_old = dev_logp(c.logp_old, c.logp_old_len, t, false, dtype)?;
    let logp_ref = dev_logp(c.logp_ref, c.logp_ref_len, t, false, dtype)?;
    let Some(n_seq) = c.seq_offsets_len.checked_sub(1) else {
        return Err(if c.seq_offsets.is_null() {
            care_result::CARE_ERR_NULL_POINTER
        } else {
            care_result::CARE_ERR_INVALID_LAYOUT
        });
    };
    let seq_offsets = dev(c.seq_offsets, c.seq_offsets_len, c.seq_offsets_len, true)?;
    let mask = dev(c.mask, c.mask_len, t, false)?;
    let per_token = loss::per_token(c.advantages_kind)?;
    let adv = dev(
        c.advantages,
        c.advantages_len,
        if per_token { t } else { n_seq },
        true,
    )?;
    Ok(DeviceLoss {
        dtype,
        logp,
        logp_old,
        logp_ref,
        seq_offsets,
        n_seq: to_u32(n_seq)?,
        mask,
        adv,
        per_token,
        max_seq_len: c.max_seq_len,
    })
}

/// The fused policy loss on the GPU, asynchronously on `launch->stream`: the inputs and
/// options of `care_policy_loss` (device memory), the gradient into `d_grad_out[grad_len]`
/// (`== T`; (NULL, 0) for loss and statistics only) as `grad_dtype` elements
/// (`CARE_DTYPE_F32`, or the inputs' dtype), and this call's statistics added into the device
/// accumulator `d_stats` (`CARE_GPU_LOSS_STATS_BYTES`; see `care_gpu_loss_stats_reset` /
/// `_read`; the loss is `stats.loss`; (NULL, 0) to skip). Same results as `care_policy_loss`
/// within the documented tolerance, the policy-loss family and the rollout correction included.
/// The workspace is `CARE_GPU_WORKSPACE_BYTES`, except for Clip-Cov and KL-Cov, whose
/// covariance selection needs `care_gpu_policy_loss_workspace_bytes` (8 bytes per token and a
/// fixed part; a shorter one is `CARE_ERR_BUFFER_TOO_SMALL`). The rollout diagnostics are not
/// accumulated here; use `care_gpu_policy_loss_into` for them.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_gpu_policy_loss(
    inputs: *const care_loss_inputs,
    options: *const care_loss_options,
    d_grad_out: *mut c_void,
    grad_len: usize,
    grad_dtype: u32,
    d_stats: *mut c_void,
    stats_len: usize,
    launch: *const care_gpu_launch,
) -> care_result {
    ffi_panic_boundary! {
        let outputs = care_gpu_loss_outputs {
            struct_size: size_of::<care_gpu_loss_outputs>() as u32,
            grad_dtype,
            grad: d_grad_out,
            grad_len,
            stats: d_stats,
            stats_len,
            rollout_stats: core::ptr::null_mut(),
            rollout_stats_len: 0,
        };
        // SAFETY: forwarded contract of the entry point.
        unsafe { policy_loss_on(inputs, options, &outputs, launch) }
    }
}

/// The bytes of workspace `care_gpu_policy_loss` and `care_gpu_policy_loss_into` need for
/// `n_tokens` tokens under `options`, into `*out_bytes`: `CARE_GPU_WORKSPACE_BYTES`, or for
/// Clip-Cov and KL-Cov that plus the covariance selection's (a fixed part and 8 bytes per
/// token). `n_tokens` above `UINT32_MAX` is `CARE_ERR_INVALID_ARGUMENT`, as in the loss.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_gpu_policy_loss_workspace_bytes(
    options: *const care_loss_options,
    n_tokens: usize,
    out_bytes: *mut usize,
) -> care_result {
    ffi_panic_boundary! {
        let out = tri!(Out::new(out_bytes));
        // SAFETY: forwarded contract of the entry point.
        let opts = tri!(unsafe { loss::read_options(options) });
        let Ok(n) = u32::try_from(n_tokens) else {
            return crate::detail::fail(
                care_result::CARE_ERR_INVALID_ARGUMENT,
                format_args!("n_tokens is {n_tokens}; the kernels index tokens with 32 bits"),
            );
        };
        // SAFETY: `out_bytes` is valid for a write (contract; NULL and alignment checked).
        unsafe { out.write(care_kernels::loss_workspace_bytes(&opts, n)) };
        care_result::CARE_OK
    }
}

/// The device outputs of `care_gpu_policy_loss_into`. Every buffer is optional ((NULL, 0) to
/// skip) and device memory.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_gpu_loss_outputs {
    /// `sizeof(care_gpu_loss_outputs)`.
    pub struct_size: u32,
    /// A `care_dtype` for `grad`: `CARE_DTYPE_F32`, or the inputs' dtype.
    pub grad_dtype: u32,
    /// `dL/dlogp` `[T]` in `grad_dtype`, or NULL.
    pub grad: *mut c_void,
    /// 0 or `T`.
    pub grad_len: usize,
    /// The loss-statistics accumulator (`care_gpu_loss_stats_reset` / `_read`), or NULL.
    pub stats: *mut c_void,
    /// 0 or `CARE_GPU_LOSS_STATS_BYTES`.
    pub stats_len: usize,
    /// The rollout-diagnostics accumulator (`care_gpu_rollout_stats_reset` / `_read`), or
    /// NULL. Nothing is added without `inputs->logp_rollout`, as the CPU has no diagnostics
    /// then.
    pub rollout_stats: *mut c_void,
    /// 0 or `CARE_GPU_ROLLOUT_STATS_BYTES`.
    pub rollout_stats_len: usize,
}

/// `care_gpu_policy_loss` with its device outputs in a size-versioned struct, which adds the
/// rollout correction's diagnostics: with `inputs->logp_rollout`, the loss pass adds the
/// statistics that `care_rollout_correction` computes on the same inputs and options into
/// `outputs->rollout_stats` (`CARE_GPU_ROLLOUT_STATS_BYTES`; see
/// `care_gpu_rollout_stats_reset` / `_read`), within the documented tolerance. The gradient,
/// the loss statistics and the errors are those of `care_gpu_policy_loss`, checked in the same
/// order. An outputs struct rather than more arguments: the device outputs of the loss are
/// optional and may grow, and a struct grows without a new entry point; the inputs struct is
/// shared with the CPU, which has no device accumulator, so the accumulator does not belong
/// there.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_gpu_policy_loss_into(
    inputs: *const care_loss_inputs,
    options: *const care_loss_options,
    outputs: *const care_gpu_loss_outputs,
    launch: *const care_gpu_launch,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (both blocks): forwarded contract of the entry point.
        let o = tri!(unsafe { args::input(outputs) });
        unsafe { policy_loss_on(inputs, options, &o, launch) }
    }
}

/// The body of `care_gpu_policy_loss` and `care_gpu_policy_loss_into`: every argument checked
/// (inputs, grad dtype, outputs, options, launch, kernel support), then the launch.
///
/// # Safety
/// As for [`args::input`] on `inputs`, `options` and `launch`; the addresses in `inputs` and
/// `o` are device memory of the lengths they state.
unsafe fn policy_loss_on(
    inputs: *const care_loss_inputs,
    options: *const care_loss_options,
    o: &care_gpu_loss_outputs,
    launch: *const care_gpu_launch,
) -> care_result {
    // SAFETY (all blocks below): forwarded contract.
    let c = tri!(unsafe { args::input(inputs) });
    let t = c.logp_len;
    let d = tri!(device_loss(&c, t, true));
    let grad_dtype = tri!(loss::read_dtype(o.grad_dtype));
    if grad_dtype != Dtype::F32 && grad_dtype != d.dtype {
        return crate::detail::fail(
            care_result::CARE_ERR_INVALID_ARGUMENT,
            format_args!(
                "grad_dtype is {}; the gradient is written as CARE_DTYPE_F32 or in the inputs' \
                 dtype ({})",
                o.grad_dtype, c.dtype
            ),
        );
    }
    let grad = tri!(dev(o.grad.cast_const(), o.grad_len, t, false).map_err(|e| {
        loss::explain(
            e,
            &c,
            t,
            "care_loss_inputs.logp_len",
            &[("grad_len", o.grad_len)],
            None,
        )
    }));
    let stats = tri!(dev(
        o.stats.cast_const(),
        o.stats_len,
        CARE_GPU_LOSS_STATS_BYTES,
        false
    ));
    let rollout_stats = tri!(dev_stats(
        o.rollout_stats.cast_const(),
        o.rollout_stats_len,
        CARE_GPU_ROLLOUT_STATS_BYTES,
        false,
    ));
    let opts = tri!(unsafe { loss::read_options(options) });
    let l = tri!(unsafe { read_launch(launch, true) });
    let n_tok = tri!(to_u32(t));
    let need = care_kernels::loss_workspace_bytes(&opts, n_tok);
    if l.workspace_len < need {
        return crate::detail::fail(
            care_result::CARE_ERR_BUFFER_TOO_SMALL,
            format_args!(
                "care_gpu_launch.workspace_len is {} but the covariance selection of {} needs {} \
                 bytes for {} tokens; size the workspace with \
                 care_gpu_policy_loss_workspace_bytes",
                l.workspace_len, opts.policy_loss, need, t
            ),
        );
    }
    let buf = LossBuffers {
        dtype: d.dtype,
        logp: d.logp,
        logp_old: d.logp_old,
        logp_ref: d.logp_ref,
        adv: d.adv,
        adv_per_token: d.per_token,
        mask: d.mask,
        seq_offsets: d.seq_offsets,
        n_seq: d.n_seq,
        n_tok,
        max_seq_len: d.max_seq_len,
        grad,
        grad_in_input_dtype: grad_dtype != Dtype::F32,
        stats,
        workspace: l.workspace,
        workspace_len: l.workspace_len,
    };
    let roll = RolloutBuffers {
        logp_rollout: tri!(dev_logp(
            c.logp_rollout,
            c.logp_rollout_len,
            t,
            false,
            d.dtype
        )),
        stats: rollout_stats,
    };
    let b = tri!(unsafe { backend(l.stream, d.seq_offsets) });
    // SAFETY: every address is caller device memory of the documented, cross-checked size.
    let run = unsafe { care_kernels::grpo_loss_with(&b, &buf, &roll, &opts, Tuning::default()) };
    match run {
        Ok(()) => care_result::CARE_OK,
        Err(e) => kernel_code(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_errors_map_to_cuda_codes() {
        use sys::CUresult::*;
        assert_eq!(
            driver_code(DriverError(CUDA_ERROR_NO_DEVICE)),
            care_result::CARE_ERR_CUDA_UNAVAILABLE
        );
        assert_eq!(
            driver_code(DriverError(CUDA_ERROR_INVALID_PTX)),
            care_result::CARE_ERR_CUDA_COMPILE
        );
        assert_eq!(
            driver_code(DriverError(CUDA_ERROR_ILLEGAL_ADDRESS)),
            care_result::CARE_ERR_CUDA_DRIVER
        );
    }
}
