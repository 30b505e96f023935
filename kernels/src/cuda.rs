//! The CUDA runtime side: the driver API through `cudarc` (dynamic loading, so nothing CUDA is
//! needed to build), on caller-owned device memory and the caller's stream.
//!
//! * [`CudaBackend`] runs the plans of [`crate::plan`] on a raw `CUstream` and raw device
//!   pointers, as a PyTorch or C++ trainer holds them. It uses the context current on the calling
//!   thread, or else the primary context of the device that owns the given pointer.
//! * [`group_advantages_raw`] and [`grpo_loss_raw`] are that for a trainer's pointers and stream
//!   (asynchronous).
//! * Each PTX module is loaded once per context and kept for the life of the process.
//! * [`group_advantages_on`] and [`grpo_loss_on`] are the safe API over `cudarc` buffers
//!   (synchronous: they wait for the stream and read the status and stats back).
//!
//! Creating a context without a driver panics inside `cudarc`, so everything here first checks
//! [`driver_available`] (`cudarc::driver::sys::is_culib_present()`).
//!
//! ```no_run
//! use care_core::grpo::{AdvantageOptions, LossOptions};
//! use care_kernels::cuda::{self, DeviceLossInputs};
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
//! cuda::group_advantages_on(&stream, &rewards, None, 2, None, &opts, &mut adv, None)?;
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
//! };
//! let stats = cuda::grpo_loss_on(&stream, &inputs, &LossOptions::default(), &mut grad)?;
//! println!("loss {} over {} tokens", stats.loss, stats.tokens);
//! # Ok(())
//! # }
//! ```

use std::ffi::{CString, c_void};
use std::sync::{Arc, Mutex};

use care_core::grpo::{AdvantageOptions, GroupStats, LossOptions, LossStats};
use cudarc::driver::result as cu;
use cudarc::driver::sys;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, DriverError};

use crate::kernel::{Geometry, Kernel, Tuning};
use crate::params::LossStatsRaw;
use crate::plan::{
    self, AdvantageBuffers, Backend, DeviceGroups, Dtype, KernelError, LossBuffers, WORKSPACE_BYTES,
};

/// Whether the CUDA driver library can be loaded (no context is created).
pub fn driver_available() -> bool {
    // SAFETY: only tries to dlopen the driver library by its usual names.
    unsafe { sys::is_culib_present() }
}

/// Modules and functions loaded into one context, keyed by the PTX image's address and the
/// entry point's name (handles stored as integers: they are process-global driver handles).
struct ContextEntry {
    ctx: usize,
    modules: Vec<(usize, usize)>,
    functions: Vec<(&'static str, usize)>,
}

/// The one per-context cache of every kernel family (advantages, loss, log-softmax): each PTX
/// module is loaded once per context, each function looked up once.
static CACHE: Mutex<Vec<ContextEntry>> = Mutex::new(Vec::new());

/// The function `name` of the module `ptx` in `ctx`, loading the module on first use.
/// `ctx` must be current on the calling thread.
pub(crate) fn cached_function(
    ctx: sys::CUcontext,
    ptx: &'static str,
    name: &'static str,
) -> Result<sys::CUfunction, DriverError> {
    let mut cache = CACHE
        .lock()
        .map_err(|_| DriverError(sys::CUresult::CUDA_ERROR_UNKNOWN))?;
    let ctx = ctx as usize;
    let pos = match cache.iter().position(|e| e.ctx == ctx) {
        Some(p) => p,
        None => {
            cache.push(ContextEntry {
                ctx,
                modules: Vec::new(),
                functions: Vec::new(),
            });
            cache.len() - 1
        }
    };
    let entry = cache
        .get_mut(pos)
        .ok_or(DriverError(sys::CUresult::CUDA_ERROR_UNKNOWN))?;
    if let Some(&(_, f)) = entry.functions.iter().find(|(n, _)| *n == name) {
        return Ok(f as sys::CUfunction);
    }
    let key = ptx.as_ptr() as usize;
    let module = match entry.modules.iter().find(|(k, _)| *k == key) {
        Some(&(_, m)) => m,
        None => {
            let src = CString::new(ptx)
                .map_err(|_| DriverError(sys::CUresult::CUDA_ERROR_INVALID_PTX))?;
            // SAFETY: `ctx` is current on this thread (caller contract), and `src` is a
            // NUL-terminated PTX image.
            let m = unsafe { cu::module::load_data(src.as_ptr().cast::<c_void>()) }? as usize;
            entry.modules.push((key, m));
            m
        }
    };
    let cname = CString::new(name).map_err(|_| DriverError(sys::CUresult::CUDA_ERROR_NOT_FOUND))?;
    // SAFETY: the module handle is live (modules are never unloaded).
    let f = unsafe { cu::module::get_function(module as sys::CUmodule, cname) }?;
    entry.functions.push((name, f as usize));
    Ok(f)
}

/// Runs kernels on a caller's stream in a caller's context.
#[derive(Debug, Clone, Copy)]
pub struct CudaBackend {
    stream: sys::CUstream,
    ctx: sys::CUcontext,
}

// SAFETY: the handles are plain driver handles; the driver API is thread-safe, and every call
// binds `ctx` to the calling thread first.
unsafe impl Send for CudaBackend {}
// SAFETY: as above; the backend holds no interior state (the module cache has its own lock).
unsafe impl Sync for CudaBackend {}

impl CudaBackend {
    /// A backend for `stream` (null = the legacy default stream) in the context current on this
    /// thread; without one, in the primary context of the device that owns `any_device_ptr`.
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
            return Ok(CudaBackend { stream, ctx });
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
        // (the trainer's runtime retains it too), so it outlives the backend.
        let ctx = unsafe { cu::primary_ctx::retain(dev) }?;
        // SAFETY: `ctx` was just retained.
        unsafe { cu::ctx::set_current(ctx) }?;
        Ok(CudaBackend { stream, ctx })
    }

    /// The function handle of `kernel`, loading its module into this context on first use.
    fn function(&self, kernel: Kernel) -> Result<sys::CUfunction, DriverError> {
        cached_function(self.ctx, kernel.module().ptx(), kernel.name())
    }

    fn bind(&self) -> Result<(), DriverError> {
        // SAFETY: `ctx` is a live context (current or retained primary).
        unsafe { cu::ctx::set_current(self.ctx) }
    }

    /// Waits for the stream (used by the safe API before reading results back).
    pub fn synchronize(&self) -> Result<(), DriverError> {
        self.bind()?;
        // SAFETY: `stream` is live (constructor contract).
        unsafe { cu::stream::synchronize(self.stream) }
    }
}

impl Backend for CudaBackend {
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
        let f = self.function(kernel)?;
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
    let backend = unsafe { CudaBackend::new(stream, buf.rewards) }.map_err(KernelError::Backend)?;
    // SAFETY: forwarded caller contract.
    unsafe { plan::group_advantages(&backend, buf, opts, Tuning::default()) }
}

/// The fused loss on raw device pointers and the caller's stream (asynchronous). The stats
/// struct `buf.stats` (a `LossStatsRaw`, initialized by the caller) holds the loss and stats
/// after the stream has run.
///
/// # Safety
/// As [`group_advantages_raw`], for the buffers of [`LossBuffers`].
pub unsafe fn grpo_loss_raw(
    stream: sys::CUstream,
    buf: &LossBuffers,
    opts: &LossOptions,
) -> Result<(), CudaError> {
    // SAFETY: forwarded caller contract.
    let backend = unsafe { CudaBackend::new(stream, buf.logp) }.map_err(KernelError::Backend)?;
    // SAFETY: forwarded caller contract.
    unsafe { plan::grpo_loss(&backend, buf, opts, Tuning::default()) }
}

fn ptr_of<T, S: DevicePtr<T>>(s: &S, stream: &CudaStream) -> u64 {
    // The guard only records an event when the context tracks events; the launch below is on
    // the same stream, so ordering holds without keeping it.
    let (p, _guard) = s.device_ptr(stream);
    p
}

fn ptr_of_mut<T, S: DevicePtrMut<T>>(s: &mut S, stream: &CudaStream) -> u64 {
    let (p, _guard) = s.device_ptr_mut(stream);
    p
}

/// Group advantages on `cudarc` buffers (SPEC §9), synchronous: launches on `stream`, waits,
/// and maps the kernel's status to the CPU reference's errors. `offsets` is `Some` for a CSR
/// layout (`B + 1` entries on the device), else `group_size` is used. When `stats` is given
/// (`B` entries), the per-group statistics are copied into it.
///
/// Errors: [`KernelError::Core`] with the reference's error for bad arguments, a singleton
/// under the `error` policy or an infinite reward (the outputs are written anyway);
/// [`KernelError::Backend`] for driver failures.
#[allow(clippy::too_many_arguments)]
pub fn group_advantages_on(
    stream: &Arc<CudaStream>,
    rewards: &CudaSlice<f32>,
    valid: Option<&CudaSlice<u8>>,
    group_size: u32,
    offsets: Option<&CudaSlice<u32>>,
    opts: &AdvantageOptions,
    out: &mut CudaSlice<f32>,
    stats: Option<&mut [GroupStats]>,
) -> Result<(), CudaError> {
    let n = u32::try_from(rewards.len()).map_err(|_| care_core::Error::InvalidArgument)?;
    if out.len() != rewards.len() || valid.is_some_and(|v| v.len() != rewards.len()) {
        return Err(care_core::Error::LengthMismatch.into());
    }
    let groups = match offsets {
        Some(o) => DeviceGroups::Offsets {
            ptr: ptr_of(o, stream),
            num_groups: u32::try_from(o.len().saturating_sub(1))
                .map_err(|_| care_core::Error::InvalidLayout)?,
        },
        None => DeviceGroups::Fixed { group_size },
    };
    let num_groups = match groups {
        DeviceGroups::Offsets { num_groups, .. } => num_groups as usize,
        DeviceGroups::Fixed { group_size } if group_size > 0 => (n / group_size) as usize,
        DeviceGroups::Fixed { .. } => 0,
    };
    if stats.as_deref().is_some_and(|s| s.len() != num_groups) {
        return Err(care_core::Error::LengthMismatch.into());
    }
    let mut ws = stream
        .alloc_zeros::<u8>(WORKSPACE_BYTES)
        .map_err(KernelError::Backend)?;
    let mut stats_dev = stream
        .alloc_zeros::<u32>(4 * num_groups.max(1))
        .map_err(KernelError::Backend)?;
    let buf = AdvantageBuffers {
        rewards: ptr_of(rewards, stream),
        valid: valid.map_or(0, |v| ptr_of(v, stream)),
        n,
        groups,
        adv: ptr_of_mut(out, stream),
        group_stats: if stats.is_some() {
            ptr_of_mut(&mut stats_dev, stream)
        } else {
            0
        },
        tok_offsets: 0,
        tok_mask: 0,
        adv_tok: 0,
        workspace: ptr_of_mut(&mut ws, stream),
        batch_std: 0,
    };
    stream
        .context()
        .bind_to_thread()
        .map_err(KernelError::Backend)?;
    // SAFETY: every address comes from a live cudarc buffer of the checked length on this
    // stream's context (now current); the buffers outlive the synchronize below.
    let backend = unsafe { CudaBackend::new(stream.cu_stream(), buf.rewards) }
        .map_err(KernelError::Backend)?;
    // SAFETY: as above.
    unsafe { plan::group_advantages(&backend, &buf, opts, Tuning::default()) }?;
    backend.synchronize().map_err(KernelError::Backend)?;
    let status = stream.clone_dtoh(&ws).map_err(KernelError::Backend)?;
    let word = u32::from_ne_bytes([status[0], status[1], status[2], status[3]]);
    if let Some(st) = stats {
        let raw = stream
            .clone_dtoh(&stats_dev)
            .map_err(KernelError::Backend)?;
        for (g, chunk) in st.iter_mut().zip(raw.chunks_exact(4)) {
            *g = GroupStats {
                count: chunk[0],
                mean: f32::from_bits(chunk[1]),
                std: f32::from_bits(chunk[2]),
                zero_variance: chunk[3],
            };
        }
    }
    plan::advantage_status(word).map_err(KernelError::Core)
}

/// A log-prob element type of the loss kernels.
pub trait LossDtype: DeviceRepr + Copy {
    /// The kernel dtype.
    const DTYPE: Dtype;
}
impl LossDtype for f32 {
    const DTYPE: Dtype = Dtype::F32;
}
impl LossDtype for half::bf16 {
    const DTYPE: Dtype = Dtype::Bf16;
}
impl LossDtype for half::f16 {
    const DTYPE: Dtype = Dtype::F16;
}

/// Inputs of [`grpo_loss_on`], all on the device.
#[derive(Debug)]
pub struct DeviceLossInputs<'a, T: LossDtype> {
    /// `logp[T]`.
    pub logp: &'a CudaSlice<T>,
    /// `logp_old[T]` or `None` (on-policy).
    pub logp_old: Option<&'a CudaSlice<T>>,
    /// `logp_ref[T]` or `None`.
    pub logp_ref: Option<&'a CudaSlice<T>>,
    /// Advantages, per sequence (`B`) or per token (`T`, with `adv_per_token`).
    pub adv: &'a CudaSlice<f32>,
    /// Whether `adv` is per token.
    pub adv_per_token: bool,
    /// Mask `[T]` or `None`.
    pub mask: Option<&'a CudaSlice<u8>>,
    /// CSR offsets `[B + 1]`.
    pub seq_offsets: &'a CudaSlice<u32>,
    /// Longest sequence, if known (geometry only), else 0.
    pub max_seq_len: u32,
}

/// The fused loss on `cudarc` buffers (SPEC §10), synchronous: writes `grad` (`f32[T]`) and
/// returns this call's statistics (`stats.loss` is `L`).
pub fn grpo_loss_on<T: LossDtype>(
    stream: &Arc<CudaStream>,
    inputs: &DeviceLossInputs<'_, T>,
    opts: &LossOptions,
    grad: &mut CudaSlice<f32>,
) -> Result<LossStats, CudaError> {
    let n_tok = inputs.logp.len();
    let n_seq = inputs.seq_offsets.len().saturating_sub(1);
    let len_ok = |l: Option<usize>| l.is_none_or(|l| l == n_tok);
    let adv_len = if inputs.adv_per_token { n_tok } else { n_seq };
    if grad.len() != n_tok
        || inputs.adv.len() != adv_len
        || !len_ok(inputs.logp_old.map(CudaSlice::len))
        || !len_ok(inputs.logp_ref.map(CudaSlice::len))
        || !len_ok(inputs.mask.map(CudaSlice::len))
    {
        return Err(care_core::Error::LengthMismatch.into());
    }
    if inputs.seq_offsets.is_empty() {
        return Err(care_core::Error::InvalidLayout.into());
    }
    let mut ws = stream
        .alloc_zeros::<u8>(WORKSPACE_BYTES)
        .map_err(KernelError::Backend)?;
    let mut stats = stream
        .clone_htod(bytemuck::cast_slice::<LossStatsRaw, u32>(&[
            LossStatsRaw::EMPTY,
        ]))
        .map_err(KernelError::Backend)?;
    let buf = LossBuffers {
        dtype: T::DTYPE,
        logp: ptr_of(inputs.logp, stream),
        logp_old: inputs.logp_old.map_or(0, |s| ptr_of(s, stream)),
        logp_ref: inputs.logp_ref.map_or(0, |s| ptr_of(s, stream)),
        adv: ptr_of(inputs.adv, stream),
        adv_per_token: inputs.adv_per_token,
        mask: inputs.mask.map_or(0, |s| ptr_of(s, stream)),
        seq_offsets: ptr_of(inputs.seq_offsets, stream),
        n_seq: u32::try_from(n_seq).map_err(|_| care_core::Error::InvalidArgument)?,
        n_tok: u32::try_from(n_tok).map_err(|_| care_core::Error::InvalidArgument)?,
        max_seq_len: inputs.max_seq_len,
        grad: ptr_of_mut(grad, stream),
        grad_in_input_dtype: false,
        stats: ptr_of_mut(&mut stats, stream),
        workspace: ptr_of_mut(&mut ws, stream),
    };
    stream
        .context()
        .bind_to_thread()
        .map_err(KernelError::Backend)?;
    // SAFETY: addresses of live cudarc buffers with checked lengths, on this stream's context
    // (now current).
    let backend =
        unsafe { CudaBackend::new(stream.cu_stream(), buf.logp) }.map_err(KernelError::Backend)?;
    // SAFETY: as above; the buffers outlive the synchronize below.
    unsafe { plan::grpo_loss(&backend, &buf, opts, Tuning::default()) }?;
    backend.synchronize().map_err(KernelError::Backend)?;
    let raw = stream.clone_dtoh(&stats).map_err(KernelError::Backend)?;
    let s: LossStatsRaw = bytemuck::pod_read_unaligned(bytemuck::cast_slice::<u32, u8>(&raw));
    Ok(s.to_core())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_keys_are_distinct() {
        use crate::kernel::Module;
        // The cache keys functions by name and modules by PTX image: no two may collide.
        for (i, a) in Kernel::ALL.iter().enumerate() {
            for b in &Kernel::ALL[i + 1..] {
                assert_ne!(a.name(), b.name());
            }
        }
        for (i, m) in Module::ALL.iter().enumerate() {
            assert_eq!(m.index(), i);
            for n in &Module::ALL[i + 1..] {
                assert_ne!(m.ptx().as_ptr(), n.ptx().as_ptr());
            }
        }
    }

    #[test]
    fn backend_without_a_driver_is_an_error_not_a_panic() {
        if driver_available() {
            return; // a machine with a driver: nothing to check here (the gpu_* tests run)
        }
        // SAFETY: never reaches the driver (checked first).
        let r = unsafe { CudaBackend::new(core::ptr::null_mut(), 0) };
        assert!(r.is_err());
    }
}
