//! What each operation launches, independent of where it runs: one file per kernel family
//! ([`advantages`], [`loss`], [`logsoftmax`], [`returns`]), all over one [`Launcher`] trait.
//!
//! The same plans drive the CUDA launcher ([`crate::cuda::CudaLauncher`]) and the host emulator
//! of the tests (crate `care-kernels-emu`), so the emulated tests cover argument checks,
//! workspace use, the launch order and the geometry exactly as a GPU run uses them.

use core::ffi::c_void;

use care_core::Error;

use crate::geometry::Geometry;
use crate::kernel::{Entry, Kernel, KernelArgs};

pub mod advantages;
pub mod logsoftmax;
pub mod loss;
pub mod returns;

pub use advantages::{
    AdvantageBuffers, AdvantageInputs, DeviceGroups, advantage_status, group_advantages,
    group_advantages_finalize, group_advantages_finalize_with, group_advantages_with,
    group_partial_squares, group_partial_sums,
};
pub use logsoftmax::{
    FusedLossBuffers, LogSoftmaxGrads, LogSoftmaxOutputs, LogitsBuffers, LogitsLossBuffers,
    fused_supports, log_softmax_backward, log_softmax_forward, log_softmax_status,
    logits_loss_forward, logits_loss_fused,
};
pub use loss::{
    LossBuffers, RolloutBuffers, cov_work_address, grpo_loss, grpo_loss_with, loss_workspace_bytes,
    selects_by_covariance,
};
pub use returns::{
    TokenBuffers, WHITENED_STATUS_OFFSET, WhitenBuffers, WhitenedOutputs, discounted_returns,
    discounted_returns_whitened, gae, gae_whitened, tokens_status, whiten, whiten_result,
    whitened_result, whitened_workspace_bytes,
};

/// Bytes of device workspace an operation needs, 16-byte aligned: status words, the batch std,
/// the loss denominators and the whitening statistics, and the per-block slots
/// ([`STAT_SLOTS`](crate::params::STAT_SLOTS)) through which the loss statistics, the
/// whitening statistics and the batch std are merged in a fixed order (bit-identical from run to
/// run, no float atomics).
pub const WORKSPACE_BYTES: usize = 128 * 1024;

// The loss's workspace (after the 16-byte log-softmax status of the logits path) holds its
// slots.
const _: () = assert!(16 + size_of::<crate::params::LossWorkRaw>() <= WORKSPACE_BYTES);
const _: () = assert!(size_of::<crate::params::WhitenWorkRaw>() <= WORKSPACE_BYTES);

/// Where kernels run: the CUDA driver on a stream, or the host emulator.
///
/// Addresses are device addresses (`u64`); for the emulator they are host addresses.
pub trait Launcher {
    /// The launcher's own failure (a driver error code, an emulator error).
    type Error;

    /// Zeroes `bytes` bytes at `ptr`, ordered with the launches.
    ///
    /// # Safety
    /// `ptr..ptr + bytes` is writable memory of this launcher.
    unsafe fn memset_zero(&self, ptr: u64, bytes: usize) -> Result<(), Self::Error>;

    /// Launches `kernel` with one by-value argument per entry of `args` (each entry points at
    /// the argument's bytes, as `cuLaunchKernel`'s `kernelParams`). The plans call it only
    /// through a typed [`Entry`], so `args` has the layout of [`Kernel::params`].
    ///
    /// # Safety
    /// The arguments match the kernel's C signature and every address inside them is valid
    /// for the accesses the kernel makes (see each operation's documentation).
    unsafe fn launch(
        &self,
        kernel: Kernel,
        geometry: Geometry,
        args: &[*mut c_void],
    ) -> Result<(), Self::Error>;
}

/// Launches `entry` with `args`: the one place the plans launch from, so every launch passes
/// the argument tuple that the registry declares for the kernel.
///
/// # Safety
/// As [`Launcher::launch`].
unsafe fn launch<L: Launcher + ?Sized, A: KernelArgs>(
    launcher: &L,
    entry: Entry<A>,
    geometry: Geometry,
    mut args: A,
) -> Result<(), KernelError<L::Error>> {
    // A block larger than the entry's launch bounds would not launch on the GPU (and the
    // emulator would not notice): a `Tuning::threads` override beyond them is refused here.
    let (x, y, z) = geometry.block;
    if u64::from(x) * u64::from(y) * u64::from(z) > u64::from(entry.kernel().bounds().threads) {
        return Err(KernelError::Core(Error::InvalidArgument));
    }
    // SAFETY: forwarded caller contract; the pointers are valid during the call.
    args.with_pointers(|p| unsafe { launcher.launch(entry.kernel(), geometry, p) })
        .map_err(KernelError::Backend)
}

/// Errors of the kernel operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelError<E> {
    /// A `care-core` error: bad arguments, or a status reported by the kernel.
    Core(Error),
    /// The launcher failed.
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
