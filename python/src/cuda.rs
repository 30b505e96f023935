//! The CUDA side of the bindings: the `care-kernels` plans on PyTorch's device pointers and
//! current stream, asynchronously.
//!
//! The kernels trust the sizes they are given, so every length, dtype, device and alignment is
//! checked here before a launch (the DLPack tensors carry them). Nothing waits for the device:
//! statuses stay in the workspace and the loss stays in the device statistics, so a step can
//! be captured in a CUDA graph. The plans' own argument checks (options, grid limits) run
//! before anything is enqueued.

use care_core::Dtype;
use care_core::grpo::{AdvantageOptions, LossOptions};
use care_core::logsoftmax::LogSoftmaxOptions;
use care_kernels::cuda::CudaLauncher;
use care_kernels::cudarc::driver::{DriverError, sys};
use care_kernels::geometry::Tuning;
use care_kernels::params::{LossStatsRaw, RolloutStatsRaw, WhitenStatsRaw};
use care_kernels::plan::{self, KernelError, Launcher};
use care_kernels::{
    AdvantageBuffers, DeviceGroups, LogSoftmaxGrads, LogSoftmaxOutputs, LogitsBuffers,
    LogitsLossBuffers, LossBuffers, WORKSPACE_BYTES,
};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::dlpack::{Device, Dt, Elem, Tensor};
use crate::error::{core_err, invalid, mismatch};

fn driver(what: &str, e: DriverError) -> PyErr {
    PyRuntimeError::new_err(format!("{what}: CUDA driver error {:?}", e.0))
}

fn kernel_err(what: &str, e: KernelError<DriverError>) -> PyErr {
    match e {
        KernelError::Core(c) => core_err(what, c),
        KernelError::Backend(d) => driver(what, d),
    }
}

fn launcher(stream: usize, any_ptr: u64) -> PyResult<CudaLauncher> {
    // SAFETY: `stream` is the raw handle of a live torch stream (or 0, the legacy default
    // stream) of the current context, which the Python glue makes the tensors' device;
    // `any_ptr` is a device address of that device.
    unsafe { CudaLauncher::new(stream as sys::CUstream, any_ptr) }
        .map_err(|e| driver("CUDA launcher", e))
}

fn to_u32(n: usize, what: &str) -> PyResult<u32> {
    u32::try_from(n).map_err(|_| invalid(format!("{what}: {n} is more than the kernels take")))
}

fn expect_len(t: &Tensor<'_>, n: usize, what: &str) -> PyResult<()> {
    if t.numel() != n {
        return Err(mismatch(format!(
            "{}: {} values, expected {n} ({what})",
            t.name(),
            t.numel()
        )));
    }
    Ok(())
}

/// Device address of an optional tensor of `T` with `n` elements (0 when absent).
fn opt_ptr<T: Elem>(t: Option<&Tensor<'_>>, dev: Device, n: usize, what: &str) -> PyResult<u64> {
    match t {
        Some(t) => {
            expect_len(t, n, what)?;
            t.device_ptr::<T>(dev)
        }
        None => Ok(0),
    }
}

fn workspace_ptr(ws: &Tensor<'_>, dev: Device) -> PyResult<u64> {
    let p = ws.device_ptr::<u32>(dev)?;
    if ws.numel() * 4 < WORKSPACE_BYTES || !p.is_multiple_of(16) {
        return Err(invalid(format!(
            "workspace: needs {WORKSPACE_BYTES} bytes, 16-byte aligned (int32 [{}])",
            WORKSPACE_BYTES / 4
        )));
    }
    Ok(p)
}

/// Resets a raw device statistics struct to `LossStatsRaw::EMPTY`, on the stream (a memset
/// node in a captured graph, no host copy).
fn reset_stats(l: &CudaLauncher, stats: &Tensor<'_>, dev: Device, stream: usize) -> PyResult<u64> {
    reset_raw(
        l,
        stats,
        bytemuck::bytes_of(&LossStatsRaw::EMPTY),
        dev,
        stream,
    )
}

/// Resets a raw device rollout-diagnostics struct (`RolloutStatsRaw`) to zero, on the stream.
fn reset_rollout_stats(
    l: &CudaLauncher,
    stats: &Tensor<'_>,
    dev: Device,
    stream: usize,
) -> PyResult<u64> {
    reset_raw(
        l,
        stats,
        bytemuck::bytes_of(&RolloutStatsRaw::default()),
        dev,
        stream,
    )
}

/// Writes `init` (a raw device struct of 4-byte fields) over the float32 tensor `stats` of the
/// same size, on the stream: a memset, then one 32-bit memset per non-zero word.
fn reset_raw(
    l: &CudaLauncher,
    stats: &Tensor<'_>,
    init: &[u8],
    dev: Device,
    stream: usize,
) -> PyResult<u64> {
    let size = init.len();
    let p = stats.device_ptr::<f32>(dev)?;
    if stats.numel() * 4 != size {
        return Err(mismatch(format!(
            "{}: {} float32 values, expected {} (the raw device statistics)",
            stats.name(),
            stats.numel(),
            size / 4
        )));
    }
    // SAFETY: `p` is `size` bytes of device memory (checked above).
    unsafe { l.memset_zero(p, size) }.map_err(|e| driver("stats reset", e))?;
    for (i, w) in init.chunks_exact(4).enumerate() {
        let w = u32::from_ne_bytes([w[0], w[1], w[2], w[3]]);
        if w != 0 {
            // SAFETY: word `i` lies inside the struct; the context is current (bound by the
            // memset above) and the stream is the caller's.
            unsafe { sys::cuMemsetD32Async(p + 4 * i as u64, w, 1, stream as sys::CUstream) }
                .result()
                .map_err(|e| driver("stats reset", e))?;
        }
    }
    Ok(p)
}

/// Which phase of the advantages to launch (SPEC §9, §11).
#[derive(Clone, Copy, Debug)]
pub enum Phase {
    /// One rank: advantages from this call's rewards.
    Local,
    /// Step 1: counts and sums into `sums` (f64 `[B, 2]`).
    PartialSums {
        /// Device address.
        sums: u64,
    },
    /// Step 2: squared deviations into `m2` (f64 `[B]`).
    PartialSquares {
        /// Device address of the reduced sums.
        sums: u64,
        /// Device address of the output.
        m2: u64,
    },
    /// Step 3: advantages from the reduced moments.
    Finalize {
        /// Device address of the reduced sums.
        sums: u64,
        /// Device address of the reduced squares.
        m2: u64,
    },
}

/// A group layout on the device: fixed size or device offsets, with the group count.
pub struct Groups<'a, 'py> {
    group_size: usize,
    offsets: Option<&'a Tensor<'py>>,
    count: usize,
}

impl<'a, 'py> Groups<'a, 'py> {
    /// `B` groups of `group_size`, or `B` CSR ranges of `offsets` (`[B + 1]`).
    pub fn new(
        group_size: usize,
        offsets: Option<&'a Tensor<'py>>,
        count: usize,
    ) -> PyResult<Self> {
        Ok(Groups {
            group_size,
            offsets,
            count,
        })
    }

    fn device(&self, dev: Device) -> PyResult<DeviceGroups> {
        Ok(match self.offsets {
            Some(o) => DeviceGroups::Offsets {
                ptr: o.device_ptr::<u32>(dev)?,
                num_groups: to_u32(self.count, "groups")?,
            },
            None => DeviceGroups::Fixed {
                group_size: to_u32(self.group_size, "group_size")?,
            },
        })
    }
}

/// Group advantages (or one cross-rank phase) on the device.
#[allow(clippy::too_many_arguments)] // one argument per buffer
pub fn group_advantages(
    rewards: &Tensor<'_>,
    out: &Tensor<'_>,
    opts: &AdvantageOptions,
    groups: Groups<'_, '_>,
    valid: Option<&Tensor<'_>>,
    stats: Option<&Tensor<'_>>,
    workspace: &Tensor<'_>,
    batch_std: Option<&Tensor<'_>>,
    stream: usize,
    phase: Phase,
) -> PyResult<()> {
    let dev = rewards.device()?;
    let n = rewards.numel();
    let r = rewards.device_ptr::<f32>(dev)?;
    let b = groups.count;
    let adv = match phase {
        Phase::Local | Phase::Finalize { .. } => {
            expect_len(out, n, "one advantage per reward")?;
            if out.dtype() != Dt::F32 {
                return Err(invalid(format!(
                    "out: {} on CUDA, expected float32",
                    out.dtype().name()
                )));
            }
            out.device_ptr::<f32>(dev)?
        }
        _ => 0,
    };
    if let Some(o) = groups.offsets {
        expect_len(o, b + 1, "B + 1 group offsets")?;
    }
    let buf = AdvantageBuffers {
        rewards: r,
        valid: opt_ptr::<u8>(valid, dev, n, "one flag per reward")?,
        n: to_u32(n, "rewards")?,
        groups: groups.device(dev)?,
        adv,
        group_stats: opt_ptr::<u32>(stats, dev, 4 * b, "[B, 4] group stats")?,
        tok_offsets: 0,
        tok_mask: 0,
        adv_tok: 0,
        workspace: workspace_ptr(workspace, dev)?,
        batch_std: opt_ptr::<f32>(batch_std, dev, 1, "one value")?,
    };
    let l = launcher(stream, r)?;
    let t = Tuning::default();
    // SAFETY: every address above is device memory of `dev` with the size the plan reads
    // (checked against the DLPack shapes), alive for the call; torch keeps the tensors alive
    // until the stream has used them (the caller holds them, and the caching allocator
    // reuses memory only in stream order).
    unsafe {
        match phase {
            Phase::Local => plan::group_advantages(&l, &buf, opts, t),
            Phase::PartialSums { sums } => plan::group_partial_sums(&l, &buf, sums, t),
            Phase::PartialSquares { sums, m2 } => {
                plan::group_partial_squares(&l, &buf, sums, m2, t)
            }
            Phase::Finalize { sums, m2 } => {
                plan::group_advantages_finalize(&l, &buf, sums, m2, opts, t)
            }
        }
    }
    .map_err(|e| kernel_err("group_advantages", e))
}

fn kernel_dtype(dt: Dt, what: &str) -> PyResult<Dtype> {
    match dt {
        Dt::F32 => Ok(Dtype::F32),
        Dt::Bf16 => Ok(Dtype::Bf16),
        Dt::F16 => Ok(Dtype::F16),
        other => Err(invalid(format!(
            "{what}: {} on CUDA, expected float32, bfloat16 or float16",
            other.name()
        ))),
    }
}

/// A dense device tensor of the kernel dtype `dt`, with `n` elements.
fn typed_ptr(t: &Tensor<'_>, dt: Dtype, dev: Device, n: usize, what: &str) -> PyResult<u64> {
    expect_len(t, n, what)?;
    match dt {
        Dtype::F32 => t.device_ptr::<f32>(dev),
        Dtype::Bf16 => t.device_ptr::<half::bf16>(dev),
        Dtype::F16 => t.device_ptr::<half::f16>(dev),
    }
}

/// Arguments of [`policy_loss`].
pub struct LossArgs<'a, 'py> {
    /// `logp [T]`.
    pub logp: &'a Tensor<'py>,
    /// `logp_old [T]`.
    pub old: Option<&'a Tensor<'py>>,
    /// `logp_ref [T]`.
    pub reference: Option<&'a Tensor<'py>>,
    /// `logp_rollout [T]` (the rollout correction).
    pub rollout: Option<&'a Tensor<'py>>,
    /// Raw rollout diagnostics `[13]` float32 (`RolloutStatsRaw`), reset here and accumulated
    /// by the kernel (nothing is added without `rollout`).
    pub rollout_stats: Option<&'a Tensor<'py>>,
    /// Advantages `[B]` or `[T]`.
    pub adv: &'a Tensor<'py>,
    /// Whether `adv` is per token.
    pub adv_per_token: bool,
    /// Offsets `[B + 1]`.
    pub offsets: &'a Tensor<'py>,
    /// Mask `[T]`.
    pub mask: Option<&'a Tensor<'py>>,
    /// Gradient output `[T]`.
    pub grad: Option<&'a Tensor<'py>>,
    /// Gradient in the logp dtype.
    pub grad_in_input_dtype: bool,
    /// Raw statistics `[14]` float32.
    pub stats: &'a Tensor<'py>,
    /// Workspace.
    pub workspace: &'a Tensor<'py>,
    /// Longest sequence (geometry only).
    pub max_seq_len: u32,
    /// Options.
    pub opts: &'a LossOptions,
    /// Stream handle.
    pub stream: usize,
}

/// The fused loss on the device; the loss is `stats[0]` after the stream has run.
pub fn policy_loss(a: LossArgs<'_, '_>) -> PyResult<()> {
    let dev = a.logp.device()?;
    let dt = kernel_dtype(a.logp.dtype(), "logp")?;
    let n_tok = a.logp.numel();
    let n_seq = a.offsets.numel().saturating_sub(1);
    if a.offsets.numel() == 0 {
        return Err(core_err("seq_offsets", care_core::Error::InvalidLayout));
    }
    let logp = typed_ptr(a.logp, dt, dev, n_tok, "tokens")?;
    let old = match a.old {
        Some(t) => typed_ptr(t, dt, dev, n_tok, "one per token")?,
        None => 0,
    };
    let reference = match a.reference {
        Some(t) => typed_ptr(t, dt, dev, n_tok, "one per token")?,
        None => 0,
    };
    let rollout = match a.rollout {
        Some(t) => typed_ptr(t, dt, dev, n_tok, "one per token")?,
        None => 0,
    };
    let n_adv = if a.adv_per_token { n_tok } else { n_seq };
    let grad = match a.grad {
        Some(g) if a.grad_in_input_dtype => typed_ptr(g, dt, dev, n_tok, "one per token")?,
        Some(g) => opt_ptr::<f32>(Some(g), dev, n_tok, "one per token")?,
        None => 0,
    };
    let l = launcher(a.stream, logp)?;
    let stats = reset_stats(&l, a.stats, dev, a.stream)?;
    let buf = LossBuffers {
        dtype: dt,
        logp,
        logp_old: old,
        logp_ref: reference,
        adv: opt_ptr::<f32>(
            Some(a.adv),
            dev,
            n_adv,
            "one advantage per sequence or token",
        )?,
        adv_per_token: a.adv_per_token,
        mask: opt_ptr::<u8>(a.mask, dev, n_tok, "one flag per token")?,
        seq_offsets: a.offsets.device_ptr::<u32>(dev)?,
        n_seq: to_u32(n_seq, "sequences")?,
        n_tok: to_u32(n_tok, "tokens")?,
        max_seq_len: a.max_seq_len,
        grad,
        grad_in_input_dtype: a.grad_in_input_dtype && grad != 0,
        stats,
        workspace: workspace_ptr(a.workspace, dev)?,
        workspace_len: a.workspace.numel() * 4,
    };
    // Clip-Cov and KL-Cov select tokens in the workspace: said here, with the size, rather
    // than as the plan's bare invalid_argument.
    let need = plan::loss_workspace_bytes(a.opts, buf.n_tok);
    if buf.workspace_len < need {
        return Err(invalid(format!(
            "workspace: {} needs {need} bytes for {n_tok} tokens (policy_loss_workspace_bytes), \
             got {}",
            a.opts.policy_loss, buf.workspace_len
        )));
    }
    let roll = plan::RolloutBuffers {
        logp_rollout: rollout,
        stats: match a.rollout_stats {
            Some(t) => reset_rollout_stats(&l, t, dev, a.stream)?,
            None => 0,
        },
    };
    // SAFETY: every address (`rollout` included) is device memory of `dev` of the size and
    // dtype the plan reads (checked above); see `group_advantages` for the lifetime argument.
    unsafe { plan::grpo_loss_with(&l, &buf, &roll, a.opts, Tuning::default()) }
        .map_err(|e| kernel_err("policy_loss", e))
}

/// `(rows, vocab, stride, dtype)` of device logits.
fn logits_layout(x: &Tensor<'_>, dev: Device) -> PyResult<(usize, usize, usize, Dtype)> {
    let dt = kernel_dtype(x.dtype(), "logits")?;
    let (r, v, s) = match dt {
        Dtype::F32 => x.matrix_shape::<f32>(dev)?,
        Dtype::Bf16 => x.matrix_shape::<half::bf16>(dev)?,
        Dtype::F16 => x.matrix_shape::<half::f16>(dev)?,
    };
    Ok((r, v, s, dt))
}

fn rows_buffers(
    x: &Tensor<'_>,
    y: &Tensor<'_>,
    mask: Option<&Tensor<'_>>,
    dev: Device,
) -> PyResult<(LogitsBuffers, usize)> {
    let (rows, vocab, stride, dt) = logits_layout(x, dev)?;
    expect_len(y, rows, "one target per row")?;
    let (targets, i64_ids) = match y.dtype() {
        Dt::I64 => (y.device_ptr::<i64>(dev)?, true),
        Dt::I32 => (y.device_ptr::<i32>(dev)?, false),
        other => {
            return Err(invalid(format!(
                "targets: {}, expected int64 or int32",
                other.name()
            )));
        }
    };
    Ok((
        LogitsBuffers {
            dtype: dt,
            logits: x.addr(),
            rows: rows as u64,
            vocab: to_u32(vocab, "vocabulary")?,
            stride: stride as u64,
            targets,
            targets_i64: i64_ids,
            mask: opt_ptr::<u8>(mask, dev, rows, "one flag per row")?,
        },
        rows,
    ))
}

/// The selective log-softmax forward on the device.
#[allow(clippy::too_many_arguments)] // one argument per buffer
pub fn log_softmax(
    x: &Tensor<'_>,
    y: &Tensor<'_>,
    mask: Option<&Tensor<'_>>,
    logp: &Tensor<'_>,
    lse: &Tensor<'_>,
    entropy: Option<&Tensor<'_>>,
    workspace: &Tensor<'_>,
    opts: &LogSoftmaxOptions,
    stream: usize,
) -> PyResult<()> {
    let dev = x.device()?;
    let (rows, n) = rows_buffers(x, y, mask, dev)?;
    let out = LogSoftmaxOutputs {
        logp: opt_ptr::<f32>(Some(logp), dev, n, "one per row")?,
        entropy: opt_ptr::<f32>(entropy, dev, n, "one per row")?,
        lse: opt_ptr::<f32>(Some(lse), dev, n, "one per row")?,
        status: workspace_ptr(workspace, dev)?,
    };
    let l = launcher(stream, out.logp)?;
    // SAFETY: the logits cover `(rows - 1) * stride + vocab` elements (DLPack shape and
    // strides, checked by `matrix_shape`); the other buffers were checked above.
    unsafe { plan::log_softmax_forward(&l, &rows, &out, opts, Tuning::default()) }
        .map_err(|e| kernel_err("selective_log_softmax", e))
}

/// The selective log-softmax backward on the device.
#[allow(clippy::too_many_arguments)] // one argument per buffer
pub fn log_softmax_backward(
    x: &Tensor<'_>,
    y: &Tensor<'_>,
    mask: Option<&Tensor<'_>>,
    dlogits: &Tensor<'_>,
    lse: &Tensor<'_>,
    entropy: Option<&Tensor<'_>>,
    dlogp: Option<&Tensor<'_>>,
    dentropy: Option<&Tensor<'_>>,
    opts: &LogSoftmaxOptions,
    stream: usize,
) -> PyResult<()> {
    let dev = x.device()?;
    let (rows, n) = rows_buffers(x, y, mask, dev)?;
    let (dr, dv, ds, _) = logits_layout(dlogits, dev)?;
    if dr != n || dv as u64 != u64::from(rows.vocab) {
        return Err(mismatch(format!(
            "dlogits: [{dr}, {dv}], expected the logits' [{n}, {}]",
            rows.vocab
        )));
    }
    if dentropy.is_some() && entropy.is_none() {
        return Err(invalid(
            "dentropy: needs the entropy saved by the forward".into(),
        ));
    }
    let grads = LogSoftmaxGrads {
        lse: opt_ptr::<f32>(Some(lse), dev, n, "one per row")?,
        entropy: opt_ptr::<f32>(entropy, dev, n, "one per row")?,
        dlogp: opt_ptr::<f32>(dlogp, dev, n, "one per row")?,
        dentropy: opt_ptr::<f32>(dentropy, dev, n, "one per row")?,
        dlogits: dlogits.addr(),
        dstride: ds as u64,
    };
    let l = launcher(stream, grads.lse)?;
    // SAFETY: as `log_softmax`; `dlogits` is a `[rows, V]` matrix with row stride `ds` in the
    // logits dtype (checked by `logits_layout`).
    unsafe { plan::log_softmax_backward(&l, &rows, &grads, opts, Tuning::default()) }
        .map_err(|e| kernel_err("selective_log_softmax_backward", e))
}

/// Arguments of [`logits_policy_loss`].
pub struct LogitsLossArgs<'a, 'py> {
    /// Logits `[N, V]`.
    pub logits: &'a Tensor<'py>,
    /// Targets `[N]`.
    pub targets: &'a Tensor<'py>,
    /// Mask `[N]`.
    pub mask: Option<&'a Tensor<'py>>,
    /// `logp_old [N]` float32.
    pub old: Option<&'a Tensor<'py>>,
    /// `logp_ref [N]` float32.
    pub reference: Option<&'a Tensor<'py>>,
    /// Advantages.
    pub adv: &'a Tensor<'py>,
    /// Per token.
    pub adv_per_token: bool,
    /// Offsets `[B + 1]`.
    pub offsets: &'a Tensor<'py>,
    /// Output `[N]` float32.
    pub logp: &'a Tensor<'py>,
    /// Output `[N]` float32.
    pub lse: &'a Tensor<'py>,
    /// Output `[N]` float32.
    pub dlogp: &'a Tensor<'py>,
    /// Raw statistics.
    pub stats: &'a Tensor<'py>,
    /// Workspace.
    pub workspace: &'a Tensor<'py>,
    /// Longest sequence.
    pub max_seq_len: u32,
    /// Log-softmax options.
    pub lsm: &'a LogSoftmaxOptions,
    /// Loss options.
    pub opts: &'a LossOptions,
    /// Stream handle.
    pub stream: usize,
}

/// The fused logits-to-loss forward on the device.
pub fn logits_policy_loss(a: LogitsLossArgs<'_, '_>) -> PyResult<()> {
    let dev = a.logits.device()?;
    let (rows, n) = rows_buffers(a.logits, a.targets, a.mask, dev)?;
    if a.offsets.numel() == 0 {
        return Err(core_err("seq_offsets", care_core::Error::InvalidLayout));
    }
    let n_seq = a.offsets.numel() - 1;
    let n_adv = if a.adv_per_token { n } else { n_seq };
    let logp = opt_ptr::<f32>(Some(a.logp), dev, n, "one per row")?;
    let l = launcher(a.stream, logp)?;
    let stats = reset_stats(&l, a.stats, dev, a.stream)?;
    let buf = LogitsLossBuffers {
        logp,
        lse: opt_ptr::<f32>(Some(a.lse), dev, n, "one per row")?,
        dlogp: opt_ptr::<f32>(Some(a.dlogp), dev, n, "one per row")?,
        logp_old: opt_ptr::<f32>(a.old, dev, n, "one per row")?,
        logp_ref: opt_ptr::<f32>(a.reference, dev, n, "one per row")?,
        adv: opt_ptr::<f32>(Some(a.adv), dev, n_adv, "one per sequence or token")?,
        adv_per_token: a.adv_per_token,
        seq_offsets: a.offsets.device_ptr::<u32>(dev)?,
        n_seq: to_u32(n_seq, "sequences")?,
        max_seq_len: a.max_seq_len,
        stats,
        workspace: workspace_ptr(a.workspace, dev)?,
    };
    // SAFETY: as `log_softmax` and `policy_loss`: every buffer checked above.
    unsafe { plan::logits_loss_forward(&l, &rows, &buf, a.lsm, a.opts, Tuning::default()) }
        .map_err(|e| kernel_err("logits_policy_loss", e))
}

/// Arguments of [`logits_policy_loss_fused`].
pub struct FusedArgs<'a, 'py> {
    /// Logits `[N, V]`.
    pub logits: &'a Tensor<'py>,
    /// Targets `[N]`.
    pub targets: &'a Tensor<'py>,
    /// Mask `[N]`.
    pub mask: Option<&'a Tensor<'py>>,
    /// `logp_old [N]` float32.
    pub old: Option<&'a Tensor<'py>>,
    /// `logp_ref [N]` float32.
    pub reference: Option<&'a Tensor<'py>>,
    /// Advantages.
    pub adv: &'a Tensor<'py>,
    /// Per token.
    pub adv_per_token: bool,
    /// Offsets `[B + 1]`.
    pub offsets: &'a Tensor<'py>,
    /// Output `[N, V]` in the logits dtype, or `None`: in place over the logits.
    pub dlogits: Option<&'a Tensor<'py>>,
    /// Output `[N]` float32, optional.
    pub logp: Option<&'a Tensor<'py>>,
    /// Output `[N]` float32, optional.
    pub lse: Option<&'a Tensor<'py>>,
    /// Raw statistics (reset here).
    pub stats: &'a Tensor<'py>,
    /// Workspace.
    pub workspace: &'a Tensor<'py>,
    /// Log-softmax options.
    pub lsm: &'a LogSoftmaxOptions,
    /// Loss options.
    pub opts: &'a LossOptions,
    /// Stream handle.
    pub stream: usize,
}

/// The one-pass logits-to-loss-to-dlogits path on the device.
pub fn logits_policy_loss_fused(a: FusedArgs<'_, '_>) -> PyResult<()> {
    let dev = a.logits.device()?;
    let (rows, n) = rows_buffers(a.logits, a.targets, a.mask, dev)?;
    if a.offsets.numel() == 0 {
        return Err(core_err("seq_offsets", care_core::Error::InvalidLayout));
    }
    let n_seq = a.offsets.numel() - 1;
    let n_adv = if a.adv_per_token { n } else { n_seq };
    let (dlogits, dstride) = match a.dlogits {
        Some(d) => {
            let (dr, dv, ds, _) = logits_layout(d, dev)?;
            if dr != n || dv as u64 != u64::from(rows.vocab) {
                return Err(mismatch(format!(
                    "dlogits: [{dr}, {dv}], expected the logits' [{n}, {}]",
                    rows.vocab
                )));
            }
            (d.addr(), ds as u64)
        }
        None => (rows.logits, rows.stride),
    };
    let ws = workspace_ptr(a.workspace, dev)?;
    let l = launcher(a.stream, ws)?;
    let stats = reset_stats(&l, a.stats, dev, a.stream)?;
    let buf = care_kernels::FusedLossBuffers {
        logp: opt_ptr::<f32>(a.logp, dev, n, "one per row")?,
        lse: opt_ptr::<f32>(a.lse, dev, n, "one per row")?,
        dlogits,
        dstride,
        logp_old: opt_ptr::<f32>(a.old, dev, n, "one per row")?,
        logp_ref: opt_ptr::<f32>(a.reference, dev, n, "one per row")?,
        adv: opt_ptr::<f32>(Some(a.adv), dev, n_adv, "one per sequence or token")?,
        adv_per_token: a.adv_per_token,
        seq_offsets: a.offsets.device_ptr::<u32>(dev)?,
        n_seq: to_u32(n_seq, "sequences")?,
        stats,
        workspace: ws,
    };
    // SAFETY: as `logits_policy_loss`; `dlogits` is a `[rows, V]` matrix with row stride
    // `dstride` in the logits dtype (checked by `logits_layout`), or the logits themselves.
    unsafe { plan::logits_loss_fused(&l, &rows, &buf, a.lsm, a.opts, Tuning::default()) }
        .map_err(|e| kernel_err("logits_policy_loss_fused", e))
}

/// Maps an advantage status word read back from `workspace[0]` to an error.
#[pyfunction]
pub fn check_advantage_status(status: u32) -> PyResult<()> {
    plan::advantage_status(status).map_err(|e| core_err("group_advantages (device status)", e))
}

/// Maps a log-softmax status word read back from `workspace[0]` to an error.
#[pyfunction]
pub fn check_log_softmax_status(status: u32) -> PyResult<()> {
    plan::log_softmax_status(status)
        .map_err(|e| core_err("selective_log_softmax (device status)", e))
}

/// Whether a CUDA driver library can be loaded (no context is created).
#[pyfunction]
pub fn cuda_driver_available() -> bool {
    care_kernels::cuda::driver_available()
}

/// Buffers of [`token_estimator`]: the token rewards on the CSR layout of SPEC §10, the
/// outputs, and (GAE only) the values and advantages.
pub struct TokenArgs<'a, 'py> {
    /// `token_rewards [T]` float32.
    pub rewards: &'a Tensor<'py>,
    /// `values [T]` float32: `Some` for GAE, `None` for discounted returns.
    pub values: Option<&'a Tensor<'py>>,
    /// `seq_offsets [B + 1]` int32/uint32.
    pub offsets: &'a Tensor<'py>,
    /// `mask [T]` bool/uint8.
    pub mask: Option<&'a Tensor<'py>>,
    /// `advantages [T]` float32 output (GAE only).
    pub advantages: Option<&'a Tensor<'py>>,
    /// `returns [T]` float32 output.
    pub returns: &'a Tensor<'py>,
    /// Workspace; its first word receives the layout status.
    pub workspace: &'a Tensor<'py>,
    /// Stream handle.
    pub stream: usize,
}

/// Discounted returns (`values` and `advantages` absent) or GAE (both present) on the device.
/// The offsets' contents are not read here (that would synchronize): a malformed layout sets
/// the status word `workspace[0]` ([`check_tokens_status`]).
pub fn token_estimator(a: TokenArgs<'_, '_>, opts: &care_core::grpo::GaeOptions) -> PyResult<()> {
    let what = if a.values.is_some() {
        "gae"
    } else {
        "discounted_returns"
    };
    let dev = a.rewards.device()?;
    let n = a.rewards.numel();
    let rewards = a.rewards.device_ptr::<f32>(dev)?;
    // The layout faults that the sizes alone show, named as the host path names them.
    let Some(n_seq) = a.offsets.numel().checked_sub(1) else {
        return Err(core_err(
            "seq_offsets: empty; the offsets need B + 1 entries, [0] for no sequences",
            care_core::Error::InvalidLayout,
        ));
    };
    if n_seq == 0 && n != 0 {
        return Err(core_err(
            &format!("seq_offsets: no sequence but {n} token rewards; the last offset must be T"),
            care_core::Error::InvalidLayout,
        ));
    }
    let buf = care_kernels::TokenBuffers {
        rewards,
        values: opt_ptr::<f32>(a.values, dev, n, "one value per token")?,
        seq_offsets: a.offsets.device_ptr::<u32>(dev)?,
        n_seq: to_u32(n_seq, "sequences")?,
        n_tok: to_u32(n, "tokens")?,
        mask: opt_ptr::<u8>(a.mask, dev, n, "one flag per token")?,
        workspace: workspace_ptr(a.workspace, dev)?,
    };
    let ret = opt_ptr::<f32>(Some(a.returns), dev, n, "one return per token")?;
    let adv = opt_ptr::<f32>(a.advantages, dev, n, "one advantage per token")?;
    let l = launcher(a.stream, buf.workspace)?;
    let t = Tuning::default();
    // SAFETY: every address is device memory of `dev` of the size and dtype the plan reads
    // (checked above against the DLPack shapes); the kernels clamp the offsets into `0..=T`.
    // See `group_advantages` for the lifetime argument.
    unsafe {
        match a.values {
            Some(_) => plan::gae(&l, &buf, adv, ret, opts, t),
            None => plan::discounted_returns(&l, &buf, ret, opts, t),
        }
    }
    .map_err(|e| kernel_err(what, e))
}

/// The f64 chains on the device (`values` absent: discounted returns; present: GAE): the
/// returns into `returns`, the whitened values into `advantages`, the unrounded values between
/// in the workspace (`whitened_workspace_bytes`). Statuses as `check_whitened_status` reads
/// them; mean and std as [`WHITEN_MEAN_STD_F64`].
pub fn token_estimator_whitened(
    a: TokenArgs<'_, '_>,
    opts: &care_core::grpo::GaeOptions,
    w: &care_core::grpo::WhitenOptions,
) -> PyResult<()> {
    let what = if a.values.is_some() {
        "gae_whitened"
    } else {
        "discounted_returns_whitened"
    };
    let dev = a.rewards.device()?;
    let n = a.rewards.numel();
    let Some(n_seq) = a.offsets.numel().checked_sub(1) else {
        return Err(core_err(
            "seq_offsets: empty; the offsets need B + 1 entries, [0] for no sequences",
            care_core::Error::InvalidLayout,
        ));
    };
    if n_seq == 0 && n != 0 {
        return Err(core_err(
            &format!("seq_offsets: no sequence but {n} token rewards; the last offset must be T"),
            care_core::Error::InvalidLayout,
        ));
    }
    let n_tok = to_u32(n, "tokens")?;
    let need = care_kernels::whitened_workspace_bytes(n_tok);
    let ws = a.workspace.device_ptr::<u32>(dev)?;
    if a.workspace.numel() * 4 < need || !ws.is_multiple_of(16) {
        return Err(invalid(format!(
            "workspace: {what} of {n} tokens needs {need} bytes, 16-byte aligned (int32 [{}]; \
             whitened_workspace_bytes)",
            need.div_ceil(4)
        )));
    }
    let buf = care_kernels::TokenBuffers {
        rewards: a.rewards.device_ptr::<f32>(dev)?,
        values: opt_ptr::<f32>(a.values, dev, n, "one value per token")?,
        seq_offsets: a.offsets.device_ptr::<u32>(dev)?,
        n_seq: to_u32(n_seq, "sequences")?,
        n_tok,
        mask: opt_ptr::<u8>(a.mask, dev, n, "one flag per token")?,
        workspace: ws,
    };
    let out = care_kernels::WhitenedOutputs {
        advantages: opt_ptr::<f32>(a.advantages, dev, n, "one advantage per token")?,
        returns: opt_ptr::<f32>(Some(a.returns), dev, n, "one return per token")?,
        workspace_len: a.workspace.numel() * 4,
    };
    let l = launcher(a.stream, ws)?;
    let t = Tuning::default();
    // SAFETY: every address is device memory of `dev` of the size and dtype the plans read
    // (checked above against the DLPack shapes, the workspace against `need`); the kernels
    // clamp the offsets into `0..=T`.
    unsafe {
        match a.values {
            Some(_) => plan::gae_whitened(&l, &buf, &out, opts, w, t),
            None => plan::discounted_returns_whitened(&l, &buf, &out, opts, w, t),
        }
    }
    .map_err(|e| kernel_err(what, e))
}

/// The `int32` index in the workspace of the returns' status word of the CUDA
/// `discounted_returns_whitened` and `gae_whitened` (the whitening's is word 0).
pub const WHITENED_STATUS_WORD: usize = care_kernels::WHITENED_STATUS_OFFSET / 4;

/// Maps the two status words the CUDA `discounted_returns_whitened` or `gae_whitened` left in
/// the workspace (`workspace[WHITENED_STATUS_WORD]`, then `workspace[0]`) to the error the host
/// path raises: `invalid_layout` first, then `non_finite` (the advantages were not written).
#[pyfunction]
pub fn check_whitened_status(tokens_status: u32, whiten_status: u32) -> PyResult<()> {
    let raw = WhitenStatsRaw {
        status: whiten_status,
        ..WhitenStatsRaw::default()
    };
    plan::whitened_result(&raw, tokens_status)
        .map(|_| ())
        .map_err(|e| {
            let why = if e == care_core::Error::InvalidLayout {
                "seq_offsets (device status): not a CSR layout of the tokens; it must start at \
                 0, never decrease and end at T"
            } else {
                "whitened chain (device status): a counted return or advantage is NaN or \
                 infinite; the advantages were not written"
            };
            core_err(why, e)
        })
}

/// Whitening in place on the device. The statistics (status word, mean, std) stay in the
/// workspace as a `WhitenStatsRaw` ([`check_whiten_status`], [`WHITEN_MEAN_STD_F64`]).
pub fn whiten(
    values: &Tensor<'_>,
    mask: Option<&Tensor<'_>>,
    workspace: &Tensor<'_>,
    opts: &care_core::grpo::WhitenOptions,
    stream: usize,
) -> PyResult<()> {
    let dev = values.device()?;
    let n = values.numel();
    let buf = care_kernels::WhitenBuffers {
        values: values.device_ptr::<f32>(dev)?,
        mask: opt_ptr::<u8>(mask, dev, n, "one flag per value")?,
        n: n as u64,
        workspace: workspace_ptr(workspace, dev)?,
    };
    let l = launcher(stream, buf.workspace)?;
    // SAFETY: as `token_estimator`; the workspace holds a `WhitenStatsRaw` (WORKSPACE_BYTES).
    unsafe { plan::whiten(&l, &buf, opts, Tuning::default()) }.map_err(|e| kernel_err("whiten", e))
}

/// The float64 indices of the mean and the std in a workspace that `whiten` filled (the
/// `WhitenStatsRaw` fields, read as a float64 array).
pub const WHITEN_MEAN_STD_F64: (usize, usize) = (
    core::mem::offset_of!(WhitenStatsRaw, mean) / 8,
    core::mem::offset_of!(WhitenStatsRaw, std) / 8,
);

const _: () = assert!(
    core::mem::offset_of!(WhitenStatsRaw, mean) % 8 == 0
        && core::mem::offset_of!(WhitenStatsRaw, std) % 8 == 0
        && core::mem::offset_of!(WhitenStatsRaw, status) == 0
);

/// Maps the status word that `discounted_returns` or `gae` left in `workspace[0]` to an error
/// (`invalid_layout`: the sequence offsets were not a CSR layout of the tokens).
#[pyfunction]
pub fn check_tokens_status(status: u32) -> PyResult<()> {
    plan::tokens_status(status).map_err(|e| {
        core_err(
            "seq_offsets (device status): not a CSR layout of the tokens; it must start at 0, \
             never decrease and end at T",
            e,
        )
    })
}

/// Maps the status word that `whiten` left in `workspace[0]` to an error (`non_finite`: a
/// counted value was NaN or infinite; the values were left as they were).
#[pyfunction]
pub fn check_whiten_status(status: u32) -> PyResult<()> {
    let raw = WhitenStatsRaw {
        status,
        ..WhitenStatsRaw::default()
    };
    plan::whiten_result(&raw).map(|_| ()).map_err(|e| {
        core_err(
            "whiten (device status): a counted value is NaN or infinite",
            e,
        )
    })
}
