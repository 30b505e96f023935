//! `care-kernels`: CUDA kernels for the GRPO step (SPEC §9-10), shipped as checked-in PTX.
//!
//! * `kernels/cuda/advantages.cu`: `group_advantages_f32` (one launch: fixed `G` or CSR groups,
//!   every baseline/scale/std/singleton option, optional per-group stats and fused token
//!   broadcast; a segment of a warp per small group, one block per large one) and `batch_std_f32`.
//! * `kernels/cuda/grpo_loss.cu`: `grpo_loss_{f32,bf16,f16}` (ratio, clip, dual clip, KL,
//!   aggregation weights, analytic gradient and stats in one pass; token-, sequence- or
//!   sequence-token-level ratio; CISPO, SAPO, GPG and GMPO; the rollout correction's weights,
//!   rejections and diagnostics; global denominators as inputs), `grpo_loss_denoms`, and
//!   `logits_loss_{f32,bf16,f16}` (the one-pass path from logits to `dlogits` for the
//!   token-local losses).
//! * `kernels/cuda/logsoftmax.cu`: `logsoftmax_{fwd,bwd}_{f32,bf16,f16}` (selective
//!   log-softmax straight from logits: log-probs, entropy and log-sum-exp, and the backward
//!   pass into `dlogits`, in place if wanted).
//! * `kernels/cuda/returns.cu`: `discounted_returns_f32` and `gae_f32` (SPEC §18: the reverse
//!   scan per sequence, one warp each, bit-identical to the CPU reference) and
//!   `whiten_stats_{f32,f64}` + `whiten_apply_{f32,f64}` (masked whitening over the batch,
//!   deterministic; the `f64` pair whitens the scan's unrounded values, verl's f64 chain).
//!
//! The sources include no system headers and compile with NVRTC (`scripts/gen-ptx.sh`, pinned
//! NVRTC 12.2, `compute_80`) and, for the tests, as host C++ under a fiber emulator of the CUDA
//! thread model (crate `care-kernels-emu`). `cargo build` never needs CUDA: the driver is loaded
//! at run time by `cudarc` ([`cuda::driver_available`] is checked first).
//!
//! Every kernel family sits in the same five places (`kernels/README.md` has the checklist):
//! [`kernel`] (the registry: [`Module`], [`Kernel`] and the argument list each launcher
//! passes), [`params`] (the `#[repr(C)]` kernel arguments), [`geometry`] (grid and block of
//! each launch), [`plan`] (what an operation launches, over any [`Launcher`]: the CUDA driver
//! in [`cuda`], or the host emulator) and [`tolerance`] (the one GPU-vs-CPU tolerance table).
#![deny(missing_docs)]

pub mod cuda;
/// The `cudarc` this crate was built with (for [`cuda`]'s safe API types).
pub use cudarc;
pub mod geometry;
pub mod kernel;
pub mod params;
pub mod plan;
pub mod tolerance;

/// The dtype table of every layer (defined in `care-core`).
pub use care_core::Dtype;
pub use geometry::{Geometry, Tuning};
pub use kernel::{Access, Entry, Kernel, KernelArgs, LaunchBounds, Module, Param, ParamLayout};
pub use plan::{
    AdvantageBuffers, AdvantageInputs, DeviceGroups, FusedLossBuffers, KernelError, Launcher,
    LogSoftmaxGrads, LogSoftmaxOutputs, LogitsBuffers, LogitsLossBuffers, LossBuffers,
    RolloutBuffers, TokenBuffers, WHITENED_STATUS_OFFSET, WORKSPACE_BYTES, WhitenBuffers,
    WhitenedOutputs, advantage_status, discounted_returns, discounted_returns_whitened,
    fused_supports, gae, gae_whitened, group_advantages, group_advantages_finalize,
    group_advantages_finalize_with, group_advantages_with, group_partial_squares,
    group_partial_sums, grpo_loss, grpo_loss_with, log_softmax_backward, log_softmax_forward,
    log_softmax_status, logits_loss_forward, logits_loss_fused, loss_workspace_bytes,
    selects_by_covariance, tokens_status, whiten, whiten_result, whitened_result,
    whitened_workspace_bytes,
};
