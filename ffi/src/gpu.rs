//! GPU advantages and loss (SPEC §9-10) on caller device pointers and a caller `CUstream`,
//! through `care-kernels`. Launches are asynchronous on the caller's stream; results that the
//! host needs (the advantage status word, the loss stats) are read back by separate calls that
//! synchronize the stream. Without a CUDA driver or device every function checks its arguments
//! and then returns `CARE_ERR_CUDA_UNAVAILABLE`.

use core::ffi::c_void;
use core::mem::size_of;

use care_core::grpo::LossStats;
use care_kernels::cuda::{CudaLauncher, driver_available};
use care_kernels::params::LossStatsRaw;
use care_kernels::{
    AdvantageBuffers, DeviceGroups, Dtype, KernelError, LossBuffers, Tuning, WORKSPACE_BYTES,
};
use cudarc::driver::result as cu;
use cudarc::driver::{DriverError, sys};

use crate::advantage::{self, care_advantage_options, care_group_stats};
use crate::args::Out;
use crate::loss::{self, care_loss_options, care_loss_stats};
use crate::result::{care_result, map_error};

/// Bytes of device workspace every GPU call needs (16-byte aligned, caller-allocated).
pub const CARE_GPU_WORKSPACE_BYTES: usize = 64;
/// Bytes of the device-side loss statistics accumulator of `care_gpu_policy_loss`.
pub const CARE_GPU_LOSS_STATS_BYTES: usize = 56;

const _: () = assert!(CARE_GPU_WORKSPACE_BYTES == WORKSPACE_BYTES);
const _: () = assert!(CARE_GPU_LOSS_STATS_BYTES == size_of::<LossStatsRaw>());

/// The log-prob dtype of `care_gpu_policy_loss`.
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum care_dtype {
    /// `float`.
    CARE_DTYPE_F32 = 0,
    /// bfloat16 (raw 16-bit patterns).
    CARE_DTYPE_BF16 = 1,
    /// IEEE half (raw 16-bit patterns).
    CARE_DTYPE_F16 = 2,
}

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
        return Err(care_result::CARE_ERR_INVALID_ARGUMENT);
    }
    if len != want {
        return Err(care_result::CARE_ERR_LENGTH_MISMATCH);
    }
    Ok(p as u64)
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

/// Group advantages on the GPU, asynchronously on `stream` (a `CUstream`, NULL = legacy default
/// stream), in the context current on this thread (else the primary context of the pointer's
/// device). All `d_` pointers are device memory: `d_rewards[n]`; `d_valid[valid_len]` optional
/// (`valid_len` 0 or `n`); fixed `group_size`, or CSR `d_group_offsets[group_offsets_len]` with
/// `group_size == 0`; `d_advantages_out[advantages_len]` (`== n`); `d_stats_out[stats_len]`
/// optional (one per group); `d_workspace` at least `CARE_GPU_WORKSPACE_BYTES`, 16-byte
/// aligned, kept until `care_gpu_advantage_status` has been called; `d_batch_std` optional: one
/// device `float` with the batch std to use under `CARE_SCALE_BATCH_STD` (for example one
/// all-reduced across ranks), NULL to compute it from this call's rewards. Same results as
/// `care_group_advantages` within the documented tolerance; a singleton group under the
/// `error` policy or an infinite reward is reported by `care_gpu_advantage_status`.
#[allow(clippy::too_many_arguments)] // one (pointer, length) pair per buffer
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_gpu_group_advantages(
    d_rewards: *const f32,
    n: usize,
    d_valid: *const u8,
    valid_len: usize,
    group_size: u32,
    d_group_offsets: *const u32,
    group_offsets_len: usize,
    options: *const care_advantage_options,
    d_advantages_out: *mut f32,
    advantages_len: usize,
    d_stats_out: *mut care_group_stats,
    stats_len: usize,
    d_batch_std: *const f32,
    d_workspace: *mut c_void,
    workspace_len: usize,
    stream: *mut c_void,
) -> care_result {
    ffi_panic_boundary! {
        let rewards = tri!(dev(d_rewards, n, n, true));
        let batch_std = tri!(dev(d_batch_std, usize::from(!d_batch_std.is_null()), 1, false));
        let valid = tri!(dev(d_valid, valid_len, n, false));
        let out = tri!(dev(d_advantages_out.cast_const(), advantages_len, n, true));
        let groups = if d_group_offsets.is_null() {
            if group_offsets_len != 0 {
                return care_result::CARE_ERR_NULL_POINTER;
            }
            if group_size == 0 || !n.is_multiple_of(group_size as usize) {
                return care_result::CARE_ERR_INVALID_LAYOUT;
            }
            DeviceGroups::Fixed { group_size }
        } else {
            if group_size != 0 {
                return care_result::CARE_ERR_INVALID_ARGUMENT;
            }
            let Some(b) = group_offsets_len.checked_sub(1) else {
                return care_result::CARE_ERR_INVALID_LAYOUT;
            };
            tri!(dev(d_group_offsets, group_offsets_len, group_offsets_len, true));
            DeviceGroups::Offsets { ptr: d_group_offsets as u64, num_groups: tri!(to_u32(b)) }
        };
        let num_groups = match groups {
            DeviceGroups::Fixed { group_size } => n / group_size as usize,
            DeviceGroups::Offsets { num_groups, .. } => num_groups as usize,
        };
        let stats = tri!(dev(d_stats_out.cast_const(), stats_len, num_groups, false));
        let ws = tri!(workspace(d_workspace, workspace_len));
        // SAFETY: forwarded contract.
        let opts = tri!(unsafe { advantage::read_options(options) });
        let buf = AdvantageBuffers {
            rewards,
            valid,
            n: tri!(to_u32(n)),
            groups,
            adv: out,
            group_stats: stats,
            tok_offsets: 0,
            tok_mask: 0,
            adv_tok: 0,
            workspace: ws,
            batch_std,
        };
        // SAFETY: forwarded contract (stream and device pointers are the caller's).
        let b = tri!(unsafe { backend(stream, rewards) });
        // SAFETY: every address is caller device memory of the documented, cross-checked size.
        match unsafe { care_kernels::group_advantages(&b, &buf, &opts, Tuning::default()) } {
            Ok(()) => care_result::CARE_OK,
            Err(e) => kernel_code(e),
        }
    }
}

/// Synchronizes `stream` and reads the status word that `care_gpu_group_advantages` left in
/// `d_workspace`: `CARE_OK`, `CARE_ERR_NON_FINITE` (an infinite valid reward) or
/// `CARE_ERR_SINGLETON_GROUP` (singleton policy `error`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_gpu_advantage_status(
    d_workspace: *const c_void,
    workspace_len: usize,
    stream: *mut c_void,
) -> care_result {
    ffi_panic_boundary! {
        let ws = tri!(workspace(d_workspace.cast_mut(), workspace_len));
        // SAFETY: forwarded contract.
        let b = tri!(unsafe { backend(stream, ws) });
        if let Err(e) = b.synchronize() {
            return driver_code(e);
        }
        let mut word = [0u8; 4];
        // SAFETY: the stream is idle (synchronized); `ws` holds at least 4 bytes.
        if let Err(e) = unsafe { cu::memcpy_dtoh_sync(&mut word, ws) } {
            return driver_code(e);
        }
        match care_kernels::advantage_status(u32::from_ne_bytes(word)) {
            Ok(()) => care_result::CARE_OK,
            Err(e) => map_error(e),
        }
    }
}

/// Synchronizes `stream`, then resets the device loss-statistics accumulator `d_stats`
/// (`CARE_GPU_LOSS_STATS_BYTES`) to empty. `care_gpu_policy_loss` adds into it, so one accumulator
/// can collect several micro-batches.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_gpu_loss_stats_reset(
    d_stats: *mut c_void,
    stats_len: usize,
    stream: *mut c_void,
) -> care_result {
    ffi_panic_boundary! {
        let s = tri!(dev(d_stats.cast_const(), stats_len, CARE_GPU_LOSS_STATS_BYTES, true));
        // SAFETY: forwarded contract.
        let b = tri!(unsafe { backend(stream, s) });
        static EMPTY: LossStatsRaw = LossStatsRaw::EMPTY;
        let bytes: &'static [u8] = bytemuck::bytes_of(&EMPTY);
        if let Err(e) = b.synchronize() {
            return driver_code(e);
        }
        // SAFETY: `s` holds CARE_GPU_LOSS_STATS_BYTES (checked length); the stream is idle.
        match unsafe { cu::memcpy_htod_sync(s, bytes) } {
            Ok(()) => care_result::CARE_OK,
            Err(e) => driver_code(e),
        }
    }
}

/// Synchronizes `stream` and reads the device loss-statistics accumulator into `*stats_out`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_gpu_loss_stats_read(
    d_stats: *const c_void,
    stats_len: usize,
    stream: *mut c_void,
    stats_out: *mut care_loss_stats,
) -> care_result {
    ffi_panic_boundary! {
        let s = tri!(dev(d_stats, stats_len, CARE_GPU_LOSS_STATS_BYTES, true));
        let out = tri!(Out::new(stats_out));
        // SAFETY: forwarded contract.
        let b = tri!(unsafe { backend(stream, s) });
        if let Err(e) = b.synchronize() {
            return driver_code(e);
        }
        let mut raw = [0u8; CARE_GPU_LOSS_STATS_BYTES];
        // SAFETY: the stream is idle; `s` holds CARE_GPU_LOSS_STATS_BYTES.
        if let Err(e) = unsafe { cu::memcpy_dtoh_sync(&mut raw, s) } {
            return driver_code(e);
        }
        let st: LossStatsRaw = bytemuck::pod_read_unaligned(&raw);
        let core_stats: LossStats = st.to_core();
        // SAFETY: checked non-NULL and aligned; valid for a write (contract).
        unsafe { out.write(loss::stats_to_c(&core_stats)) };
        care_result::CARE_OK
    }
}

/// The fused clipped-ratio loss on the GPU, asynchronously on `stream`: writes the gradient
/// `d_grad_out[grad_len]` (`== logp_len`; `float`, or the input dtype when
/// `grad_in_input_dtype` is 1) and adds this call's statistics into `d_stats`
/// (`CARE_GPU_LOSS_STATS_BYTES`, see `care_gpu_loss_stats_reset` / `_read`; the loss is
/// `stats.loss`). Log-prob arrays hold `dtype` (`care_dtype`) elements; optional ones are
/// (NULL, 0); every given per-token length must equal `logp_len`. `max_seq_len` is the longest
/// sequence if known (geometry only), else 0. Other arguments as `care_policy_loss_f32`.
#[allow(clippy::too_many_arguments)] // one (pointer, length) pair per buffer
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_gpu_policy_loss(
    dtype: u32,
    d_logp: *const c_void,
    logp_len: usize,
    d_logp_old: *const c_void,
    logp_old_len: usize,
    d_logp_ref: *const c_void,
    logp_ref_len: usize,
    d_seq_offsets: *const u32,
    seq_offsets_len: usize,
    d_mask: *const u8,
    mask_len: usize,
    d_advantages: *const f32,
    advantages_len: usize,
    advantages_kind: u32,
    options: *const care_loss_options,
    max_seq_len: u32,
    d_grad_out: *mut c_void,
    grad_len: usize,
    grad_in_input_dtype: u32,
    d_stats: *mut c_void,
    stats_len: usize,
    d_workspace: *mut c_void,
    workspace_len: usize,
    stream: *mut c_void,
) -> care_result {
    ffi_panic_boundary! {
        let dtype = tri!(crate::args::enum_arg(dtype, &Dtype::ALL));
        let t = logp_len;
        let logp = tri!(dev(d_logp, logp_len, t, true));
        let logp_old = tri!(dev(d_logp_old, logp_old_len, t, false));
        let logp_ref = tri!(dev(d_logp_ref, logp_ref_len, t, false));
        let Some(n_seq) = seq_offsets_len.checked_sub(1) else {
            return if d_seq_offsets.is_null() {
                care_result::CARE_ERR_NULL_POINTER
            } else {
                care_result::CARE_ERR_INVALID_LAYOUT
            };
        };
        let offs = tri!(dev(d_seq_offsets, seq_offsets_len, seq_offsets_len, true));
        let mask = tri!(dev(d_mask, mask_len, t, false));
        let per_token = match advantages_kind {
            0 => false,
            1 => true,
            _ => return care_result::CARE_ERR_INVALID_ARGUMENT,
        };
        let adv = tri!(dev(d_advantages, advantages_len, if per_token { t } else { n_seq }, true));
        let grad = tri!(dev(d_grad_out.cast_const(), grad_len, t, false));
        let stats = tri!(dev(d_stats.cast_const(), stats_len, CARE_GPU_LOSS_STATS_BYTES, false));
        let ws = tri!(workspace(d_workspace, workspace_len));
        // SAFETY: forwarded contract.
        let opts = tri!(unsafe { loss::read_options(options) });
        let buf = LossBuffers {
            dtype,
            logp,
            logp_old,
            logp_ref,
            adv,
            adv_per_token: per_token,
            mask,
            seq_offsets: offs,
            n_seq: tri!(to_u32(n_seq)),
            n_tok: tri!(to_u32(t)),
            max_seq_len,
            grad,
            grad_in_input_dtype: grad_in_input_dtype != 0,
            stats,
            workspace: ws,
        };
        // SAFETY: forwarded contract (stream and device pointers are the caller's).
        let b = tri!(unsafe { backend(stream, offs) });
        // SAFETY: every address is caller device memory of the documented, cross-checked size.
        match unsafe { care_kernels::grpo_loss(&b, &buf, &opts, Tuning::default()) } {
            Ok(()) => care_result::CARE_OK,
            Err(e) => kernel_code(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_values_are_the_stable_numbers() {
        for (c, d) in [
            (care_dtype::CARE_DTYPE_F32, Dtype::F32),
            (care_dtype::CARE_DTYPE_BF16, Dtype::Bf16),
            (care_dtype::CARE_DTYPE_F16, Dtype::F16),
        ] {
            assert_eq!(c as u32, d.number());
            assert_eq!(Dtype::ALL[c as usize], d);
        }
    }

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
