//! The CUDA runtime side: the driver API through `cudarc` (dynamic loading, so nothing CUDA is
//! needed to build), on caller-owned device memory and the caller's stream.
//!
//! * [`CudaLauncher`] runs the plans of [`crate::plan`] (every kernel family) on a raw
//!   `CUstream` and raw device pointers, as a PyTorch or C++ trainer holds them. It uses the
//!   context current on the calling thread, or else the primary context of the device that owns
//!   a given pointer.
//! * Each PTX module ([`crate::Module`]) is loaded once per context, each function looked up
//!   once, in one process-wide cache, and kept for the life of the process.
//! * [`group_advantages_raw`] and [`grpo_loss_raw`] are the plans on a trainer's pointers and
//!   stream (asynchronous).
//! * [`group_advantages_on`], [`grpo_loss_on`], [`log_softmax_on`] and
//!   [`log_softmax_backward_on`] are the safe API over `cudarc` buffers (synchronous: they wait
//!   for the stream and read statuses and stats back).
//!
//! Creating a context without a driver panics inside `cudarc`, so everything here first checks
//! [`driver_available`] (`cudarc::driver::sys::is_culib_present()`).
//!
//! ```no_run
//! use care_core::grpo::{AdvantageOptions, LossOptions};
//! use care_kernels::cuda::{self, DeviceAdvantageInputs, DeviceLossInputs};
//! use care_kernels::cudarc::driver::CudaContext;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! if !cuda::driver_available() {
//!     return Ok(()); // no GPU here
//! }
//! let ctx = CudaContext::new(0)?;
//! let stream = ctx.default_stream();
//! // Two groups of two rollouts.
//! let rewards = stream.clone_htod(&[1.0f32, 0.0, 0.5, 0.5])?;
//! let mut adv = stream.alloc_zeros::<f32>(4)?;
//! let opts = AdvantageOptions::default();
//! let inputs = DeviceAdvantageInputs { rewards: &rewards, valid: None, group_size: 2, offsets: None };
//! cuda::group_advantages_on(&stream, &inputs, &opts, &mut adv, None)?;
//!
//! // One token per rollout, per-sequence advantages, on-policy.
//! let logp = stream.clone_htod(&[-0.5f32, -1.0, -0.7, -2.0])?;
//! let offsets = stream.clone_htod(&[0u32, 1, 2, 3, 4])?;
//! let mut grad = stream.alloc_zeros::<f32>(4)?;
//! let inputs = DeviceLossInputs {
//!     logp: &logp,
//!     logp_old: None,
//!     logp_ref: None,
//!     adv: &adv,
//!     adv_per_token: false,
//!     mask: None,
//!     seq_offsets: &offsets,
//!     max_seq_len: 1,
//!     logp_rollout: None,
//! };
//! let stats = cuda::grpo_loss_on(&stream, &inputs, &LossOptions::default(), &mut grad)?;
//! println!("loss {} over {} tokens", stats.loss, stats.tokens);
//! # Ok(())
//! # }
//! ```

use std::ffi::{CString, c_void};
use std::sync::Mutex;

use care_core::grpo::{AdvantageOptions, LossOptions};
use cudarc::driver::DriverError;
use cudarc::driver::result as cu;
use cudarc::driver::sys;

use crate::geometry::{Geometry, Tuning};
use crate::kernel::{Kernel, Module};
use crate::plan::{self, AdvantageBuffers, KernelError, Launcher, LossBuffers};

mod safe;

pub use safe::{
    DeviceAdvantageInputs, DeviceLogSoftmaxGrads, DeviceLogits, DeviceLossInputs, KernelDtype,
    TargetDtype, group_advantages_on, grpo_loss_on, grpo_loss_with_on, log_softmax_backward_on,
    log_softmax_on,
};

/// Whether the CUDA driver library can be loaded (no context is created).
pub fn driver_available() -> bool {
    // SAFETY: only tries to dlopen the driver library by its usual names.
    unsafe { sys::is_culib_present() }
}

/// What the driver made of one entry when its module was loaded (the `compute_80` PTX is
/// JIT-compiled for the device on load, so these can differ from `scripts/gen-ptx.sh
/// --ptxas`'s): read once per context with `cuFuncGetAttribute`, so that a JIT that needs more
/// registers than the launch bounds allow (and spills instead) is visible.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelInfo {
    /// The entry.
    pub kernel: Kernel,
    /// Registers per thread (`CU_FUNC_ATTRIBUTE_NUM_REGS`).
    pub registers: u32,
    /// Local memory per thread, spills included (`CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES`).
    pub local_bytes: u32,
    /// Static shared memory per block (`CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES`).
    pub shared_bytes: u32,
    /// Largest block the function launches with (`CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK`;
    /// the launch bounds' `threads` at most).
    pub max_threads: u32,
}

impl KernelInfo {
    /// Whether the loaded function keeps the occupancy its launch bounds promise: registers
    /// within [`LaunchBounds::register_budget`](crate::kernel::LaunchBounds::register_budget)
    /// and no local memory (no spill).
    pub fn within_budget(&self) -> bool {
        self.registers <= self.kernel.bounds().register_budget() && self.local_bytes == 0
    }
}

/// Modules and functions loaded into one context (handles stored as integers: they are
/// process-global driver handles). Modules are indexed by [`Module::index`].
struct ContextEntry {
    ctx: usize,
    modules: Vec<Option<usize>>,
    functions: Vec<(Kernel, usize, KernelInfo)>,
}

/// The one per-context cache of every kernel family: each PTX module is loaded once per
/// context, each function looked up once.
static CACHE: Mutex<Vec<ContextEntry>> = Mutex::new(Vec::new());

/// The function of `kernel` in `ctx`, loading its module on first use.
/// `ctx` must be current on the calling thread.
fn cached_function(ctx: sys::CUcontext, kernel: Kernel) -> Result<sys::CUfunction, DriverError> {
    let unknown = DriverError(sys::CUresult::CUDA_ERROR_UNKNOWN);
    let mut cache = CACHE.lock().map_err(|_| unknown)?;
    let ctx = ctx as usize;
    let pos = match cache.iter().position(|e| e.ctx == ctx) {
        Some(p) => p,
        None => {
            cache.push(ContextEntry {
                ctx,
                modules: vec![None; Module::ALL.len()],
                functions: Vec::new(),
            });
            cache.len() - 1
        }
    };
    let entry = cache.get_mut(pos).ok_or(unknown)?;
    if let Some(&(_, f, _)) = entry.functions.iter().find(|(k, _, _)| *k == kernel) {
        return Ok(f as sys::CUfunction);
    }
    let module = kernel.module();
    let slot = entry.modules.get_mut(module.index()).ok_or(unknown)?;
    let handle = match *slot {
        Some(m) => m,
        None => {
            let src = CString::new(module.ptx())
                .map_err(|_| DriverError(sys::CUresult::CUDA_ERROR_INVALID_PTX))?;
            // SAFETY: `ctx` is current on this thread (caller contract), and `src` is a
            // NUL-terminated PTX image.
            let m = unsafe { cu::module::load_data(src.as_ptr().cast::<c_void>()) }? as usize;
            *slot = Some(m);
            m
        }
    };
    let name = CString::new(kernel.name())
        .map_err(|_| DriverError(sys::CUresult::CUDA_ERROR_NOT_FOUND))?;
    // SAFETY: the module handle is live (modules are never unloaded).
    let f = unsafe { cu::module::get_function(handle as sys::CUmodule, name) }?;
    let attr = |a: sys::CUfunction_attribute| -> Result<u32, DriverError> {
        // SAFETY: `f` was just looked up in a live module.
        let v = unsafe { cu::function::get_function_attribute(f, a) }?;
        Ok(u32::try_from(v).unwrap_or(0))
    };
    use sys::CUfunction_attribute as A;
    let info = KernelInfo {
        kernel,
        registers: attr(A::CU_FUNC_ATTRIBUTE_NUM_REGS)?,
        local_bytes: attr(A::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
        shared_bytes: attr(A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
        max_threads: attr(A::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
    };
    entry.functions.push((kernel, f as usize, info));
    Ok(f)
}

/// Loads every module into the context current on this thread (or the primary context of
/// device 0) and returns what the driver made of each entry, in [`Kernel::ALL`] order: the
/// registers per thread the JIT chose, spills, shared memory and the largest block.
/// `care_kernels`' report of the device side (the gpu-check script prints it).
///
/// Errors: the driver's, or `CUDA_ERROR_NO_DEVICE` without a driver library.
pub fn kernel_info() -> Result<Vec<KernelInfo>, DriverError> {
    // SAFETY: no stream is used; pointer 0 (the current context, or device 0's primary).
    let l = unsafe { CudaLauncher::new(core::ptr::null_mut(), 0) }?;
    l.bind()?;
    let mut out = Vec::with_capacity(Kernel::ALL.len());
    for &k in Kernel::ALL {
        cached_function(l.ctx, k)?;
        let unknown = DriverError(sys::CUresult::CUDA_ERROR_UNKNOWN);
        let cache = CACHE.lock().map_err(|_| unknown)?;
        let e = cache
            .iter()
            .find(|e| e.ctx == l.ctx as usize)
            .ok_or(unknown)?;
        let &(_, _, info) = e.functions.iter().find(|f| f.0 == k).ok_or(unknown)?;
        out.push(info);
    }
    Ok(out)
}

/// Runs kernels on a caller's stream in a caller's context: the [`Launcher`] of every kernel
/// family on a GPU.
#[derive(Debug, Clone, Copy)]
pub struct CudaLauncher {
    stream: sys::CUstream,
    ctx: sys::CUcontext,
}

// SAFETY: the handles are plain driver handles; the driver API is thread-safe, and every call
// binds `ctx` to the calling thread first.
unsafe impl Send for CudaLauncher {}
// SAFETY: as above; the launcher holds no interior state (the module cache has its own lock).
unsafe impl Sync for CudaLauncher {}

impl CudaLauncher {
    /// A launcher for `stream` (null = the legacy default stream) in the context current on
    /// this thread; without one, in the primary context of the device that owns
    /// `any_device_ptr` (which is then made current).
    ///
    /// Errors: `CUDA_ERROR_NOT_INITIALIZED`-style driver errors, or `CUDA_ERROR_NO_DEVICE` when
    /// the driver library is missing (checked first, so this never panics).
    ///
    /// # Safety
    /// `stream` is null or a live stream of that context; `any_device_ptr` is a device address
    /// (or 0 when a context is known to be current).
    pub unsafe fn new(stream: sys::CUstream, any_device_ptr: u64) -> Result<Self, DriverError> {
        if !driver_available() {
            return Err(DriverError(sys::CUresult::CUDA_ERROR_NO_DEVICE));
        }
        cu::init()?;
        if let Some(ctx) = cu::ctx::get_current()?
            && !ctx.is_null()
        {
            return Ok(CudaLauncher { stream, ctx });
        }
        let mut ordinal: i32 = 0;
        if any_device_ptr != 0 {
            // SAFETY: writes one int; the attribute query needs no current context.
            unsafe {
                sys::cuPointerGetAttribute(
                    (&raw mut ordinal).cast::<c_void>(),
                    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                    any_device_ptr,
                )
            }
            .result()?;
        }
        let dev = cu::device::get(ordinal)?;
        // SAFETY: `dev` is a valid device; the primary context stays retained for the process
        // (the trainer's runtime retains it too), so it outlives the launcher.
        let ctx = unsafe { cu::primary_ctx::retain(dev) }?;
        // SAFETY: `ctx` was just retained.
        unsafe { cu::ctx::set_current(ctx) }?;
        Ok(CudaLauncher { stream, ctx })
    }

    fn bind(&self) -> Result<(), DriverError> {
        // SAFETY: `ctx` is a live context (current or retained primary).
        unsafe { cu::ctx::set_current(self.ctx) }
    }

    /// Waits for the stream (used before reading results back).
    pub fn synchronize(&self) -> Result<(), DriverError> {
        self.bind()?;
        // SAFETY: `stream` is live (constructor contract).
        unsafe { cu::stream::synchronize(self.stream) }
    }
}

impl Launcher for CudaLauncher {
    type Error = DriverError;

    unsafe fn memset_zero(&self, ptr: u64, bytes: usize) -> Result<(), DriverError> {
        self.bind()?;
        // SAFETY: `ptr..ptr + bytes` is device memory of this context (trait contract).
        unsafe { cu::memset_d8_async(ptr, 0, bytes, self.stream) }
    }

    unsafe fn launch(
        &self,
        kernel: Kernel,
        g: Geometry,
        args: &[*mut c_void],
    ) -> Result<(), DriverError> {
        self.bind()?;
        let f = cached_function(self.ctx, kernel)?;
        let mut params: Vec<*mut c_void> = args.to_vec();
        // SAFETY: the arguments match the kernel signature (trait contract); the kernels use
        // static shared memory only, so 0 dynamic bytes; the launch is ordered on the caller's
        // stream and the driver copies the argument values before returning.
        unsafe { cu::launch_kernel(f, g.grid, g.block, 0, self.stream, &mut params) }
    }
}

/// Error of the CUDA entry points.
pub type CudaError = KernelError<DriverError>;

/// Group advantages on raw device pointers and the caller's stream (asynchronous): the
/// entry point for C++ and PyTorch trainers. Runs [`plan::group_advantages`] in the current
/// context, or the primary context of `buf.rewards`' device. The status word is the first `u32`
/// of `buf.workspace`; read it after the stream (map it with [`plan::advantage_status`]).
///
/// # Safety
/// `stream` is null or a live stream of that context; every address in `buf` is device memory
/// of that context with the sizes documented on [`AdvantageBuffers`], valid until the stream
/// has run the launches.
pub unsafe fn group_advantages_raw(
    stream: sys::CUstream,
    buf: &AdvantageBuffers,
    opts: &AdvantageOptions,
) -> Result<(), CudaError> {
    // SAFETY: forwarded caller contract.
    let l = unsafe { CudaLauncher::new(stream, buf.rewards) }.map_err(KernelError::Backend)?;
    // SAFETY: forwarded caller contract.
    unsafe { plan::group_advantages(&l, buf, opts, Tuning::default()) }
}

/// The fused loss on raw device pointers and the caller's stream (asynchronous). The stats
/// struct `buf.stats` (a [`crate::params::LossStatsRaw`], initialized by the caller) holds the
/// loss and stats after the stream has run.
///
/// # Safety
/// As [`group_advantages_raw`], for the buffers of [`LossBuffers`].
pub unsafe fn grpo_loss_raw(
    stream: sys::CUstream,
    buf: &LossBuffers,
    opts: &LossOptions,
) -> Result<(), CudaError> {
    // SAFETY: forwarded caller contract.
    let l = unsafe { CudaLauncher::new(stream, buf.logp) }.map_err(KernelError::Backend)?;
    // SAFETY: forwarded caller contract.
    unsafe { plan::grpo_loss(&l, buf, opts, Tuning::default()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launcher_without_a_driver_is_an_error_not_a_panic() {
        if driver_available() {
            return; // a machine with a driver: nothing to check here (the gpu_* tests run)
        }
        // SAFETY: never reaches the driver (checked first).
        let r = unsafe { CudaLauncher::new(core::ptr::null_mut(), 0) };
        assert!(r.is_err());
    }
}
