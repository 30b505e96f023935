//! `care-kernels`: CUDA kernels for the GRPO step (SPEC §9-10), shipped as checked-in PTX.
//!
//! * `kernels/cuda/advantages.cu`: `group_advantages_f32` (one launch: fixed `G` or CSR groups,
//!   every baseline/scale/std/singleton option, optional per-group stats and fused token
//!   broadcast; one warp per small group, one block per large one) and `batch_std_f32`.
//! * `kernels/cuda/grpo_loss.cu`: `grpo_loss_{f32,bf16,f16}` (ratio, clip, dual clip, KL,
//!   aggregation weights, analytic gradient and stats in one pass; token- or sequence-level
//!   ratio; global denominators as inputs) and `grpo_loss_denoms`.
//!
//! The sources include no system headers and compile with NVRTC (`scripts/gen-ptx.sh`, pinned
//! NVRTC 12.2, `compute_80`) and, for the tests, as host C++ under a fiber emulator of the CUDA
//! thread model (crate `care-kernels-emu`). `cargo build` never needs CUDA: the driver is loaded
//! at run time by `cudarc` ([`cuda::driver_available`] is checked first).
//!
//! Layers: [`params`] (the `#[repr(C)]` kernel arguments), [`kernel`] (modules, entry points,
//! geometry), [`plan`] (what an operation launches, over any [`plan::Backend`]), [`cuda`] (the
//! driver backend on raw pointers and streams, plus a safe API over `cudarc` buffers),
//! [`tolerance`] (the GPU-vs-CPU tolerance table).
#![deny(missing_docs)]

pub mod cuda;
/// The `cudarc` this crate was built with (for [`cuda`]'s safe API types).
pub use cudarc;
pub mod kernel;
pub mod logsoftmax;
pub mod params;
pub mod plan;
pub mod tolerance;

pub use kernel::{Geometry, Kernel, Module, Tuning};
pub use plan::{
    AdvantageBuffers, Backend, DeviceGroups, Dtype, KernelError, LossBuffers, WORKSPACE_BYTES,
    advantage_status, group_advantages, group_advantages_finalize, group_partial_squares,
    group_partial_sums, grpo_loss,
};
