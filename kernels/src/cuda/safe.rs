//! The safe API over `cudarc` buffers, for every kernel family: lengths are checked against
//! each other, the launch runs on the buffers' stream in its context, and the call waits for
//! the stream and reads the status (and stats) back.

use std::sync::Arc;

use care_core::Dtype;
use care_core::Error;
use care_core::grpo::{AdvantageOptions, GroupStats, LossOptions, LossOutput, LossStats};
use care_core::logsoftmax::LogSoftmaxOptions;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr};

use super::{CudaError, CudaLauncher};
use crate::geometry::Tuning;
use crate::params::{CovWorkRaw, LossStatsRaw, RolloutStatsRaw};
use crate::plan::{
    self, AdvantageBuffers, DeviceGroups, KernelError, LogSoftmaxGrads, LogSoftmaxOutputs,
    LogitsBuffers, LossBuffers, RolloutBuffers, WORKSPACE_BYTES,
};

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

/// A launcher on `stream`, in the stream's context (bound to this thread first).
fn launcher(stream: &Arc<CudaStream>, any_ptr: u64) -> Result<CudaLauncher, CudaError> {
    stream
        .context()
        .bind_to_thread()
        .map_err(KernelError::Backend)?;
    // SAFETY: the stream is live and belongs to the context just bound; `any_ptr` is an
    // address of one of its buffers.
    unsafe { CudaLauncher::new(stream.cu_stream(), any_ptr) }.map_err(KernelError::Backend)
}

/// An element type of the kernels' floating-point inputs: `f32`, `half::bf16`, `half::f16`.
pub trait KernelDtype: DeviceRepr + Copy {
    /// Its dtype.
    const DTYPE: Dtype;
}
impl KernelDtype for f32 {
    const DTYPE: Dtype = Dtype::F32;
}
impl KernelDtype for half::bf16 {
    const DTYPE: Dtype = Dtype::Bf16;
}
impl KernelDtype for half::f16 {
    const DTYPE: Dtype = Dtype::F16;
}

/// A target id element type of the log-softmax: `i32` or `i64`.
pub trait TargetDtype: DeviceRepr + Copy {
    /// Whether the kernels read it as `i64`.
    const I64: bool;
}
impl TargetDtype for i32 {
    const I64: bool = false;
}
impl TargetDtype for i64 {
    const I64: bool = true;
}

// ---- advantages ---------------------------------------------------------------------------------

/// Inputs of [`group_advantages_on`], all on the device.
#[derive(Debug)]
pub struct DeviceAdvantageInputs<'a> {
    /// `N` rewards.
    pub rewards: &'a CudaSlice<f32>,
    /// `N` validity flags (0 = invalid), or `None`.
    pub valid: Option<&'a CudaSlice<u8>>,
    /// Samples per group for the fixed layout (ignored with `offsets`).
    pub group_size: u32,
    /// CSR group offsets (`B + 1` entries) for a ragged layout, or `None` for the fixed one.
    pub offsets: Option<&'a CudaSlice<u32>>,
}

/// Group advantages on `cudarc` buffers (SPEC §9), synchronous: launches on `stream`, waits,
/// and maps the kernel's status to the CPU reference's errors. When `stats` is given (`B`
/// entries), the per-group statistics are copied into it.
///
/// Errors: [`KernelError::Core`] with the reference's error for bad arguments, a singleton
/// under the `error` policy or an infinite reward (the outputs are written anyway);
/// [`KernelError::Backend`] for driver failures.
pub fn group_advantages_on(
    stream: &Arc<CudaStream>,
    inputs: &DeviceAdvantageInputs<'_>,
    opts: &AdvantageOptions,
    out: &mut CudaSlice<f32>,
    stats: Option<&mut [GroupStats]>,
) -> Result<(), CudaError> {
    let rewards = inputs.rewards;
    let n = u32::try_from(rewards.len()).map_err(|_| Error::InvalidArgument)?;
    if out.len() != rewards.len() || inputs.valid.is_some_and(|v| v.len() != rewards.len()) {
        return Err(Error::LengthMismatch.into());
    }
    let groups = match inputs.offsets {
        Some(o) => DeviceGroups::Offsets {
            ptr: ptr_of(o, stream),
            num_groups: u32::try_from(o.len().saturating_sub(1))
                .map_err(|_| Error::InvalidLayout)?,
        },
        None => DeviceGroups::Fixed {
            group_size: inputs.group_size,
        },
    };
    let num_groups = match groups {
        DeviceGroups::Offsets { num_groups, .. } => num_groups as usize,
        DeviceGroups::Fixed { group_size } if group_size > 0 => (n / group_size) as usize,
        DeviceGroups::Fixed { .. } => 0,
    };
    if stats.as_deref().is_some_and(|s| s.len() != num_groups) {
        return Err(Error::LengthMismatch.into());
    }
    let mut ws = stream
        .alloc_zeros::<u8>(WORKSPACE_BYTES)
        .map_err(KernelError::Backend)?;
    let mut stats_dev = stream
        .alloc_zeros::<u32>(4 * num_groups.max(1))
        .map_err(KernelError::Backend)?;
    let buf = AdvantageBuffers {
        rewards: ptr_of(rewards, stream),
        valid: inputs.valid.map_or(0, |v| ptr_of(v, stream)),
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
    let l = launcher(stream, buf.rewards)?;
    // SAFETY: every address comes from a live cudarc buffer of the checked length on this
    // stream's context; the buffers outlive the synchronize below.
    unsafe { plan::group_advantages(&l, &buf, opts, Tuning::default()) }?;
    l.synchronize().map_err(KernelError::Backend)?;
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

// ---- loss ---------------------------------------------------------------------------------------

/// Inputs of [`grpo_loss_on`], all on the device.
#[derive(Debug)]
pub struct DeviceLossInputs<'a, T: KernelDtype> {
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
    /// `logp_rollout[T]` (the inference engine's log-probs) or `None`: the rollout correction
    /// of `opts.rollout` and its diagnostics.
    pub logp_rollout: Option<&'a CudaSlice<T>>,
}

/// The fused loss on `cudarc` buffers (SPEC §10), synchronous: writes `grad` (`f32[T]`) and
/// returns this call's statistics (`stats.loss` is `L`). [`grpo_loss_with_on`] also returns
/// the rollout diagnostics.
pub fn grpo_loss_on<T: KernelDtype>(
    stream: &Arc<CudaStream>,
    inputs: &DeviceLossInputs<'_, T>,
    opts: &LossOptions,
    grad: &mut CudaSlice<f32>,
) -> Result<LossStats, CudaError> {
    grpo_loss_with_on(stream, inputs, opts, grad).map(|o| o.stats)
}

/// [`grpo_loss_on`] with the rollout diagnostics (zero without `logp_rollout`) and the
/// covariance selection's count, as `care_core::grpo::policy_loss` returns them.
pub fn grpo_loss_with_on<T: KernelDtype>(
    stream: &Arc<CudaStream>,
    inputs: &DeviceLossInputs<'_, T>,
    opts: &LossOptions,
    grad: &mut CudaSlice<f32>,
) -> Result<LossOutput, CudaError> {
    let n_tok = inputs.logp.len();
    let n_seq = inputs.seq_offsets.len().saturating_sub(1);
    let len_ok = |l: Option<usize>| l.is_none_or(|l| l == n_tok);
    let adv_len = if inputs.adv_per_token { n_tok } else { n_seq };
    if grad.len() != n_tok
        || inputs.adv.len() != adv_len
        || !len_ok(inputs.logp_old.map(CudaSlice::len))
        || !len_ok(inputs.logp_ref.map(CudaSlice::len))
        || !len_ok(inputs.mask.map(CudaSlice::len))
        || !len_ok(inputs.logp_rollout.map(CudaSlice::len))
    {
        return Err(Error::LengthMismatch.into());
    }
    if inputs.seq_offsets.is_empty() {
        return Err(Error::InvalidLayout.into());
    }
    let n_tok32 = u32::try_from(n_tok).map_err(|_| Error::InvalidArgument)?;
    let ws_len = plan::loss_workspace_bytes(opts, n_tok32);
    let mut ws = stream
        .alloc_zeros::<u8>(ws_len)
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
        n_seq: u32::try_from(n_seq).map_err(|_| Error::InvalidArgument)?,
        n_tok: n_tok32,
        max_seq_len: inputs.max_seq_len,
        grad: ptr_of_mut(grad, stream),
        grad_in_input_dtype: false,
        stats: ptr_of_mut(&mut stats, stream),
        workspace: ptr_of_mut(&mut ws, stream),
        workspace_len: ws_len,
    };
    let mut rstats = stream
        .alloc_zeros::<u32>(size_of::<RolloutStatsRaw>() / 4)
        .map_err(KernelError::Backend)?;
    let roll = RolloutBuffers {
        logp_rollout: inputs.logp_rollout.map_or(0, |s| ptr_of(s, stream)),
        stats: ptr_of_mut(&mut rstats, stream),
    };
    let l = launcher(stream, buf.logp)?;
    // SAFETY: addresses of live cudarc buffers with checked lengths, on this stream's context;
    // the buffers outlive the synchronize below.
    unsafe { plan::grpo_loss_with(&l, &buf, &roll, opts, Tuning::default()) }?;
    l.synchronize().map_err(KernelError::Backend)?;
    let raw = stream.clone_dtoh(&stats).map_err(KernelError::Backend)?;
    let s: LossStatsRaw = bytemuck::pod_read_unaligned(bytemuck::cast_slice::<u32, u8>(&raw));
    let raw = stream.clone_dtoh(&rstats).map_err(KernelError::Backend)?;
    let r: RolloutStatsRaw = bytemuck::pod_read_unaligned(bytemuck::cast_slice::<u32, u8>(&raw));
    let cov_selected = if plan::selects_by_covariance(opts) {
        let ws = stream.clone_dtoh(&ws).map_err(KernelError::Backend)?;
        // The struct's offset in the workspace: its address for a workspace at address 0.
        let at = plan::cov_work_address(0) as usize;
        let w: CovWorkRaw = bytemuck::pod_read_unaligned(&ws[at..at + size_of::<CovWorkRaw>()]);
        f64::from(w.selected)
    } else {
        0.0
    };
    let stats = s.to_core();
    Ok(LossOutput {
        loss: stats.loss,
        stats,
        rollout: r.to_core(),
        cov_selected,
    })
}

// ---- log-softmax --------------------------------------------------------------------------------

/// Logits and targets as `cudarc` buffers for [`log_softmax_on`] and
/// [`log_softmax_backward_on`]: `logits` holds `rows` rows of `vocab` elements, `stride` apart.
#[derive(Debug)]
pub struct DeviceLogits<'a, T: KernelDtype, I: TargetDtype> {
    /// The logits, at least `(rows - 1) * stride + vocab` elements.
    pub logits: &'a CudaSlice<T>,
    /// Rows `N`.
    pub rows: usize,
    /// Vocabulary `V`.
    pub vocab: u32,
    /// Elements between rows (`>= vocab`).
    pub stride: usize,
    /// `N` target ids.
    pub targets: &'a CudaSlice<I>,
    /// `N` mask values, or `None`.
    pub mask: Option<&'a CudaSlice<u8>>,
}

fn device_rows<T: KernelDtype, I: TargetDtype>(
    d: &DeviceLogits<'_, T, I>,
    stream: &CudaStream,
) -> Result<LogitsBuffers, Error> {
    let need = match d.rows {
        0 => 0,
        r => (r - 1)
            .checked_mul(d.stride)
            .and_then(|n| n.checked_add(d.vocab as usize))
            .ok_or(Error::InvalidArgument)?,
    };
    if d.vocab == 0 || d.stride < d.vocab as usize {
        return Err(Error::InvalidArgument);
    }
    if d.logits.len() < need
        || d.targets.len() != d.rows
        || d.mask.is_some_and(|m| m.len() != d.rows)
    {
        return Err(Error::LengthMismatch);
    }
    Ok(LogitsBuffers {
        dtype: T::DTYPE,
        logits: ptr_of(d.logits, stream),
        rows: d.rows as u64,
        vocab: d.vocab,
        stride: d.stride as u64,
        targets: ptr_of(d.targets, stream),
        targets_i64: I::I64,
        mask: d.mask.map_or(0, |m| ptr_of(m, stream)),
    })
}

/// The forward pass on `cudarc` buffers, synchronous: writes `logp` (`N`), and `entropy` and
/// `lse` when given (`N` each; keep `lse` for [`log_softmax_backward_on`]). Errors like the CPU
/// reference: [`Error::InvalidArgument`] for the temperature, the shape or a target outside
/// `0..V` on a counted row (checked after the launch, from the status word; the outputs are
/// written anyway, with NaN for such rows), [`Error::LengthMismatch`] for buffer lengths.
pub fn log_softmax_on<T: KernelDtype, I: TargetDtype>(
    stream: &Arc<CudaStream>,
    input: &DeviceLogits<'_, T, I>,
    opts: &LogSoftmaxOptions,
    logp: &mut CudaSlice<f32>,
    entropy: Option<&mut CudaSlice<f32>>,
    lse: Option<&mut CudaSlice<f32>>,
) -> Result<(), CudaError> {
    let rows = device_rows(input, stream)?;
    let n = input.rows;
    if logp.len() != n
        || entropy.as_ref().is_some_and(|e| e.len() != n)
        || lse.as_ref().is_some_and(|e| e.len() != n)
    {
        return Err(Error::LengthMismatch.into());
    }
    let mut status = stream.alloc_zeros::<u32>(4).map_err(KernelError::Backend)?;
    let out = LogSoftmaxOutputs {
        logp: ptr_of_mut(logp, stream),
        entropy: entropy.map_or(0, |e| ptr_of_mut(e, stream)),
        lse: lse.map_or(0, |e| ptr_of_mut(e, stream)),
        status: ptr_of_mut(&mut status, stream),
    };
    let l = launcher(stream, out.status)?;
    // SAFETY: addresses of live cudarc buffers with checked lengths, on this stream's context;
    // the buffers outlive the synchronize below.
    unsafe { plan::log_softmax_forward(&l, &rows, &out, opts, Tuning::default()) }?;
    l.synchronize().map_err(KernelError::Backend)?;
    let word = stream.clone_dtoh(&status).map_err(KernelError::Backend)?;
    plan::log_softmax_status(word.first().copied().unwrap_or(0)).map_err(KernelError::Core)
}

/// The saved forward outputs and the incoming gradients of [`log_softmax_backward_on`]
/// (`N` entries each).
#[derive(Debug)]
pub struct DeviceLogSoftmaxGrads<'a> {
    /// The forward's log-sum-exp.
    pub lse: &'a CudaSlice<f32>,
    /// `dL/dlogp`.
    pub dlogp: &'a CudaSlice<f32>,
    /// The forward's entropy and `dL/dentropy`, or `None` (no entropy term).
    pub entropy_and_grad: Option<(&'a CudaSlice<f32>, &'a CudaSlice<f32>)>,
}

/// The backward pass on `cudarc` buffers, synchronous: `dlogits` (`rows * vocab`, dense, in the
/// logits dtype) from the forward's `lse`, `dlogp` and optionally `dentropy` (which needs the
/// forward's `entropy`).
pub fn log_softmax_backward_on<T: KernelDtype, I: TargetDtype>(
    stream: &Arc<CudaStream>,
    input: &DeviceLogits<'_, T, I>,
    opts: &LogSoftmaxOptions,
    grads: &DeviceLogSoftmaxGrads<'_>,
    dlogits: &mut CudaSlice<T>,
) -> Result<(), CudaError> {
    let rows = device_rows(input, stream)?;
    let n = input.rows;
    let dense = n.checked_mul(input.vocab as usize);
    if grads.lse.len() != n
        || grads.dlogp.len() != n
        || grads
            .entropy_and_grad
            .is_some_and(|(h, e)| h.len() != n || e.len() != n)
        || dense != Some(dlogits.len())
    {
        return Err(Error::LengthMismatch.into());
    }
    if n == 0 {
        return Ok(());
    }
    let g = LogSoftmaxGrads {
        lse: ptr_of(grads.lse, stream),
        entropy: grads.entropy_and_grad.map_or(0, |(h, _)| ptr_of(h, stream)),
        dlogp: ptr_of(grads.dlogp, stream),
        dentropy: grads.entropy_and_grad.map_or(0, |(_, e)| ptr_of(e, stream)),
        dlogits: ptr_of_mut(dlogits, stream),
        dstride: u64::from(input.vocab),
    };
    let l = launcher(stream, g.lse)?;
    // SAFETY: addresses of live cudarc buffers with checked lengths, on this stream's context;
    // `dlogits` is a buffer of its own (a unique borrow), so it does not overlap the logits;
    // the buffers outlive the synchronize below.
    unsafe { plan::log_softmax_backward(&l, &rows, &g, opts, Tuning::default()) }?;
    l.synchronize().map_err(KernelError::Backend)
}
