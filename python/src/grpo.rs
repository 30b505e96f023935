//! The GRPO step (SPEC §9-13) on caller-allocated arrays: group advantages and their
//! cross-rank phases, the clipped-ratio policy loss with its gradient, the selective
//! log-softmax forward and backward, and the fused logits-to-loss forward.
//!
//! Every function takes its outputs as arguments (numpy arrays or tensors the caller allocated:
//! PyTorch's allocator on the GPU), so nothing here allocates device memory. Host arrays run
//! the `care-core` reference; CUDA tensors run the `care-kernels` plans on the stream the
//! caller passes (`torch.cuda.current_stream().cuda_stream`), asynchronously: nothing here
//! waits for the device, which is what makes CUDA-graph capture possible.

use care_core::grpo::{
    AdvantageOptions, Advantages, GaeOptions, GroupLayout, GroupStats, GroupSums,
    LOSS_STATS_LAYOUT, LogProb, LossInputs, LossOptions, LossStats, RolloutInputs, RolloutStats,
    WhitenOptions,
};
use care_core::logsoftmax::{self as lsm, LogSoftmaxOptions, Logits, TokenId};
use half::{bf16, f16};
use pyo3::prelude::*;

use crate::cuda;
use crate::dlpack::{Device, Dt, Elem, Tensor, check_outputs};
use crate::error::{OrRaise, invalid, mismatch};
use crate::options::from_spec;

/// The device of the first argument; the others are checked against it when they are read.
pub fn device_of(t: &Tensor<'_>) -> PyResult<Device> {
    t.device()
}

fn layout<'a>(group_size: usize, offsets: Option<&'a [u32]>) -> GroupLayout<'a> {
    match offsets {
        Some(o) => GroupLayout::Offsets(o),
        None => GroupLayout::Fixed { group_size },
    }
}

fn opt_slice<'a, T: Elem>(t: &'a Option<Tensor<'_>>) -> PyResult<Option<&'a [T]>> {
    t.as_ref().map(|t| t.slice::<T>()).transpose()
}

fn write_group_stats(stats: &[GroupStats], out: &mut Tensor<'_>) -> PyResult<()> {
    let o = out.slice_mut::<f64>()?;
    if o.len() != 4 * stats.len() {
        return Err(mismatch(format!(
            "stats: {} values, expected [B, 4] = {}",
            o.len(),
            4 * stats.len()
        )));
    }
    for (row, s) in o.chunks_exact_mut(4).zip(stats) {
        row.copy_from_slice(&[
            f64::from(s.count),
            f64::from(s.mean),
            f64::from(s.std),
            f64::from(s.zero_variance),
        ]);
    }
    Ok(())
}

/// Number of groups of a layout over `n` samples (for output sizes), checked.
fn groups(n: usize, group_size: usize, offsets: Option<&Tensor<'_>>) -> PyResult<usize> {
    use care_core::grpo::{GroupLayout, offsets_fault};
    // The fault named with the arrays and sizes (the CLI's wording); device offsets are
    // checked by the kernels.
    let fault = match offsets {
        Some(o) if matches!(device_of(o)?, Device::Cuda(_)) => None,
        Some(o) => offsets_fault(o.slice::<u32>()?, n).map(|f| f.named("group_offsets", "rewards")),
        None => GroupLayout::Fixed { group_size }
            .fault(n)
            .map(|f| f.named("group_size", "rewards")),
    };
    if let Some(f) = fault {
        return Err(crate::error::core_err(
            &f.to_string(),
            care_core::Error::InvalidLayout,
        ));
    }
    Ok(match offsets {
        Some(o) => o.numel().saturating_sub(1),
        None => n / group_size,
    })
}

/// `_care.group_advantages(rewards, out, options, group_size=0, group_offsets=None,
/// valid=None, stats=None, stream=0, workspace=None, batch_std=None)`.
///
/// Host: `out` is float32 or float64, `stats` float64 `[B, 4]` (count, mean, std,
/// zero_variance). CUDA: `out` float32, `stats` int32 `[B, 4]` (the raw `GroupStats`
/// records: `u32, f32, f32, u32`), `workspace` int32 `[16]`; the kernels' status word (an
/// infinite reward, a singleton under `error`) is left in `workspace[0]`.
#[pyfunction]
#[pyo3(signature = (rewards, out, options, group_size=0, group_offsets=None, valid=None, stats=None, stream=0, workspace=None, batch_std=None))]
#[allow(clippy::too_many_arguments)] // one argument per buffer, as the Python glue passes them
pub fn group_advantages(
    py: Python<'_>,
    rewards: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    options: &str,
    group_size: usize,
    group_offsets: Option<&Bound<'_, PyAny>>,
    valid: Option<&Bound<'_, PyAny>>,
    stats: Option<&Bound<'_, PyAny>>,
    stream: usize,
    workspace: Option<&Bound<'_, PyAny>>,
    batch_std: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let opts: AdvantageOptions = from_spec(options)?;
    let r = Tensor::take(rewards, "rewards")?;
    let mut o = Tensor::take(out, "out")?;
    let offs = Tensor::take_opt(group_offsets, "group_offsets")?;
    let v = Tensor::take_opt(valid, "valid")?;
    let mut st = Tensor::take_opt(stats, "stats")?;
    let ws = Tensor::take_opt(workspace, "workspace")?;
    let bstd = Tensor::take_opt(batch_std, "batch_std")?;
    let mut outs = vec![&o];
    outs.extend(st.as_ref());
    check_outputs(&outs, &[Some(&r), offs.as_ref(), v.as_ref(), bstd.as_ref()])?;
    let b = groups(r.numel(), group_size, offs.as_ref())?;
    if let Device::Cuda(_) = device_of(&r)? {
        let ws = ws.ok_or_else(|| invalid("workspace: required for CUDA tensors".into()))?;
        return cuda::group_advantages(
            &r,
            &o,
            &opts,
            cuda::Groups::new(group_size, offs.as_ref(), b)?,
            v.as_ref(),
            st.as_ref(),
            &ws,
            bstd.as_ref(),
            stream,
            cuda::Phase::Local,
        );
    }
    if bstd.is_some() {
        return Err(invalid(
            "batch_std: only for CUDA tensors (the host path computes the batch std itself)".into(),
        ));
    }
    let rw = r.slice::<f32>()?;
    let vs = opt_slice::<u8>(&v)?;
    let os = opt_slice::<u32>(&offs)?;
    let lay = layout(group_size, os);
    let mut gs = vec![GroupStats::default(); if st.is_some() { b } else { 0 }];
    let gsr = st.as_ref().map(|_| gs.as_mut_slice());
    match o.dtype() {
        Dt::F64 => {
            let out = o.slice_mut::<f64>()?;
            py.detach(|| care_core::grpo::group_advantages(rw, vs, lay, &opts, out, gsr))
        }
        _ => {
            let out = o.slice_mut::<f32>()?;
            py.detach(|| care_core::grpo::group_advantages(rw, vs, lay, &opts, out, gsr))
        }
    }
    .or_raise("group_advantages")?;
    if let Some(s) = st.as_mut() {
        write_group_stats(&gs, s)?;
    }
    Ok(())
}

fn sums_of(t: &[f64]) -> Vec<GroupSums> {
    t.chunks_exact(2)
        .map(|c| GroupSums {
            count: c[0],
            sum: c[1],
        })
        .collect()
}

/// `_care.group_partial_sums(rewards, out, group_size=0, group_offsets=None, valid=None,
/// stream=0, workspace=None)`: `out` float64 `[B, 2]` (count, sum) of this rank's valid
/// rewards per group, to all-reduce with a sum (SPEC §11 step 1).
#[pyfunction]
#[pyo3(signature = (rewards, out, group_size=0, group_offsets=None, valid=None, stream=0, workspace=None))]
#[allow(clippy::too_many_arguments)] // one argument per buffer
pub fn group_partial_sums(
    rewards: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    group_size: usize,
    group_offsets: Option<&Bound<'_, PyAny>>,
    valid: Option<&Bound<'_, PyAny>>,
    stream: usize,
    workspace: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let r = Tensor::take(rewards, "rewards")?;
    let mut o = Tensor::take(out, "out")?;
    let offs = Tensor::take_opt(group_offsets, "group_offsets")?;
    let v = Tensor::take_opt(valid, "valid")?;
    let ws = Tensor::take_opt(workspace, "workspace")?;
    check_outputs(&[&o], &[Some(&r), offs.as_ref(), v.as_ref()])?;
    let b = groups(r.numel(), group_size, offs.as_ref())?;
    if o.numel() != 2 * b {
        return Err(mismatch(format!(
            "out: {} values, expected [B, 2] = {}",
            o.numel(),
            2 * b
        )));
    }
    if let Device::Cuda(_) = device_of(&r)? {
        let ws = ws.ok_or_else(|| invalid("workspace: required for CUDA tensors".into()))?;
        let g = cuda::Groups::new(group_size, offs.as_ref(), b)?;
        let sums = o.device_ptr::<f64>(device_of(&r)?)?;
        return cuda::group_advantages(
            &r,
            &r,
            &AdvantageOptions::default(),
            g,
            v.as_ref(),
            None,
            &ws,
            None,
            stream,
            cuda::Phase::PartialSums { sums },
        );
    }
    let os = opt_slice::<u32>(&offs)?;
    let mut sums = vec![GroupSums::default(); b];
    care_core::grpo::group_partial_sums(
        r.slice::<f32>()?,
        opt_slice::<u8>(&v)?,
        layout(group_size, os),
        &mut sums,
    )
    .or_raise("group_partial_sums")?;
    for (c, s) in o.slice_mut::<f64>()?.chunks_exact_mut(2).zip(&sums) {
        c.copy_from_slice(&[s.count, s.sum]);
    }
    Ok(())
}

/// `_care.group_partial_squares(rewards, sums, out, group_size=0, group_offsets=None,
/// valid=None, stream=0, workspace=None)`: `out` float64 `[B]`, this rank's squared
/// deviations from the global means of the all-reduced `sums` (SPEC §11 step 2).
#[pyfunction]
#[pyo3(signature = (rewards, sums, out, group_size=0, group_offsets=None, valid=None, stream=0, workspace=None))]
#[allow(clippy::too_many_arguments)] // one argument per buffer
pub fn group_partial_squares(
    rewards: &Bound<'_, PyAny>,
    sums: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    group_size: usize,
    group_offsets: Option<&Bound<'_, PyAny>>,
    valid: Option<&Bound<'_, PyAny>>,
    stream: usize,
    workspace: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let r = Tensor::take(rewards, "rewards")?;
    let s = Tensor::take(sums, "sums")?;
    let mut o = Tensor::take(out, "out")?;
    let offs = Tensor::take_opt(group_offsets, "group_offsets")?;
    let v = Tensor::take_opt(valid, "valid")?;
    let ws = Tensor::take_opt(workspace, "workspace")?;
    check_outputs(&[&o], &[Some(&r), Some(&s), offs.as_ref(), v.as_ref()])?;
    let b = groups(r.numel(), group_size, offs.as_ref())?;
    if o.numel() != b || s.numel() != 2 * b {
        return Err(mismatch(format!(
            "sums [B, 2] and out [B] for B = {b} groups: got {} and {} values",
            s.numel(),
            o.numel()
        )));
    }
    let dev = device_of(&r)?;
    if let Device::Cuda(_) = dev {
        let ws = ws.ok_or_else(|| invalid("workspace: required for CUDA tensors".into()))?;
        let g = cuda::Groups::new(group_size, offs.as_ref(), b)?;
        let phase = cuda::Phase::PartialSquares {
            sums: s.device_ptr::<f64>(dev)?,
            m2: o.device_ptr::<f64>(dev)?,
        };
        return cuda::group_advantages(
            &r,
            &r,
            &AdvantageOptions::default(),
            g,
            v.as_ref(),
            None,
            &ws,
            None,
            stream,
            phase,
        );
    }
    let os = opt_slice::<u32>(&offs)?;
    care_core::grpo::group_partial_squares(
        r.slice::<f32>()?,
        opt_slice::<u8>(&v)?,
        layout(group_size, os),
        &sums_of(s.slice::<f64>()?),
        o.slice_mut::<f64>()?,
    )
    .or_raise("group_partial_squares")
}

/// `_care.group_advantages_finalize(rewards, sums, m2, out, options, group_size=0,
/// group_offsets=None, valid=None, stats=None, stream=0, workspace=None)`: this rank's
/// advantages from the all-reduced `sums [B, 2]` and `m2 [B]` (SPEC §11 step 3).
#[pyfunction]
#[pyo3(signature = (rewards, sums, m2, out, options, group_size=0, group_offsets=None, valid=None, stats=None, stream=0, workspace=None))]
#[allow(clippy::too_many_arguments)] // one argument per buffer
pub fn group_advantages_finalize(
    rewards: &Bound<'_, PyAny>,
    sums: &Bound<'_, PyAny>,
    m2: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    options: &str,
    group_size: usize,
    group_offsets: Option<&Bound<'_, PyAny>>,
    valid: Option<&Bound<'_, PyAny>>,
    stats: Option<&Bound<'_, PyAny>>,
    stream: usize,
    workspace: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let opts: AdvantageOptions = from_spec(options)?;
    let r = Tensor::take(rewards, "rewards")?;
    let s = Tensor::take(sums, "sums")?;
    let q = Tensor::take(m2, "m2")?;
    let mut o = Tensor::take(out, "out")?;
    let offs = Tensor::take_opt(group_offsets, "group_offsets")?;
    let v = Tensor::take_opt(valid, "valid")?;
    let mut st = Tensor::take_opt(stats, "stats")?;
    let ws = Tensor::take_opt(workspace, "workspace")?;
    let mut outs = vec![&o];
    outs.extend(st.as_ref());
    check_outputs(
        &outs,
        &[Some(&r), Some(&s), Some(&q), offs.as_ref(), v.as_ref()],
    )?;
    let b = groups(r.numel(), group_size, offs.as_ref())?;
    if q.numel() != b || s.numel() != 2 * b {
        return Err(mismatch(format!(
            "sums [B, 2] and m2 [B] for B = {b} groups: got {} and {} values",
            s.numel(),
            q.numel()
        )));
    }
    let dev = device_of(&r)?;
    if let Device::Cuda(_) = dev {
        let ws = ws.ok_or_else(|| invalid("workspace: required for CUDA tensors".into()))?;
        let g = cuda::Groups::new(group_size, offs.as_ref(), b)?;
        let phase = cuda::Phase::Finalize {
            sums: s.device_ptr::<f64>(dev)?,
            m2: q.device_ptr::<f64>(dev)?,
        };
        return cuda::group_advantages(
            &r,
            &o,
            &opts,
            g,
            v.as_ref(),
            st.as_ref(),
            &ws,
            None,
            stream,
            phase,
        );
    }
    let os = opt_slice::<u32>(&offs)?;
    let (rw, vs, lay) = (
        r.slice::<f32>()?,
        opt_slice::<u8>(&v)?,
        layout(group_size, os),
    );
    let sums = sums_of(s.slice::<f64>()?);
    let m2 = q.slice::<f64>()?;
    let mut gs = vec![GroupStats::default(); if st.is_some() { b } else { 0 }];
    let gsr = st.as_ref().map(|_| gs.as_mut_slice());
    match o.dtype() {
        Dt::F64 => care_core::grpo::group_advantages_finalize(
            rw,
            vs,
            lay,
            &sums,
            m2,
            &opts,
            o.slice_mut::<f64>()?,
            gsr,
        ),
        _ => care_core::grpo::group_advantages_finalize(
            rw,
            vs,
            lay,
            &sums,
            m2,
            &opts,
            o.slice_mut::<f32>()?,
            gsr,
        ),
    }
    .or_raise("group_advantages_finalize")?;
    if let Some(s) = st.as_mut() {
        write_group_stats(&gs, s)?;
    }
    Ok(())
}

/// Writes `s` into `out` (float64 `[14]`, `LOSS_STATS_LAYOUT` order).
fn write_loss_stats(s: &LossStats, out: &mut Tensor<'_>) -> PyResult<()> {
    let o = out.slice_mut::<f64>()?;
    if o.len() != LOSS_STATS_LAYOUT.len() {
        return Err(mismatch(format!(
            "stats: {} values, expected {}",
            o.len(),
            LOSS_STATS_LAYOUT.len()
        )));
    }
    let base = (s as *const LossStats).cast::<u8>();
    for (slot, f) in o.iter_mut().zip(LOSS_STATS_LAYOUT.iter()) {
        // SAFETY: LOSS_STATS_LAYOUT lists the f64 fields of LossStats with their offsets (a
        // compile-time check in care-core covers the whole struct densely).
        *slot = unsafe { base.add(f.offset).cast::<f64>().read_unaligned() };
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)] // the pieces of one loss call
fn host_loss<T: LogProb + Elem>(
    py: Python<'_>,
    logp: &Tensor<'_>,
    old: Option<&Tensor<'_>>,
    reference: Option<&Tensor<'_>>,
    rollout: Option<&Tensor<'_>>,
    offsets: &[u32],
    mask: Option<&[u8]>,
    adv: Advantages<'_>,
    opts: &LossOptions,
    grad: &mut [f32],
) -> PyResult<care_core::grpo::LossOutput> {
    let inputs = LossInputs {
        logp: logp.slice::<T>()?,
        logp_old: old.map(|t| t.slice::<T>()).transpose()?,
        logp_ref: reference.map(|t| t.slice::<T>()).transpose()?,
        seq_offsets: offsets,
        mask,
        advantages: adv,
        logp_rollout: rollout.map(|t| t.slice::<T>()).transpose()?,
    };
    py.detach(|| care_core::grpo::policy_loss(&inputs, opts, grad))
        .or_raise("policy_loss")
}

/// Bytes of device workspace `policy_loss` needs for `n_tokens` tokens under `options` (a
/// spec string): `WORKSPACE_BYTES`, or for Clip-Cov and KL-Cov that plus the covariance
/// selection's (a fixed part and 8 bytes per token).
#[pyfunction]
pub fn policy_loss_workspace_bytes(options: &str, n_tokens: usize) -> PyResult<usize> {
    let opts: LossOptions = from_spec(options)?;
    let n = u32::try_from(n_tokens).map_err(|_| {
        crate::error::invalid(format!(
            "n_tokens is {n_tokens}; the kernels index tokens with 32 bits"
        ))
    })?;
    Ok(care_kernels::loss_workspace_bytes(&opts, n))
}

/// `_care.policy_loss(logp, advantages, seq_offsets, grad, stats, options, adv_per_token,
/// logp_old=None, logp_ref=None, mask=None, max_seq_len=0, stream=0, workspace=None,
/// grad_in_input_dtype=False, logp_rollout=None, rollout_stats=None) -> float | None`.
///
/// `logp_rollout` (the inference engine's log-probs, the dtype of `logp`) turns on the rollout
/// correction of the options' `rollout_*` fields (SPEC §16); its weights are constants, so
/// `grad` stays `dL/dlogp`. `rollout_stats` receives the correction's diagnostics (all zero
/// without `logp_rollout`): on the host float64 `[13]` in `ROLLOUT_STATS_FIELDS` order; on
/// CUDA float32 `[13]` holding the raw device struct (reset here, accumulated by the kernel;
/// `ROLLOUT_STATS_DEVICE_FIELDS` says where each field is).
///
/// Host: `logp`, `logp_old`, `logp_ref`, `logp_rollout` of one dtype (float32, float64, bfloat16, float16),
/// `advantages` float32, `grad` float32 `[T]` (always written), `stats` float64 `[14]` in
/// `LOSS_STATS_LAYOUT` order; returns the loss. CUDA: float32/bfloat16/float16, `grad` float32
/// (or the logp dtype with `grad_in_input_dtype`; `None` for loss and stats only), `stats`
/// float32 `[14]` holding the raw device statistics (reset here, accumulated by the kernel;
/// `LOSS_STATS_DEVICE_FIELDS` says where each field is), `workspace` int32 of
/// `policy_loss_workspace_bytes` (16 words but for Clip-Cov and KL-Cov); returns
/// `None` (the loss stays on the device: `stats[0]`).
#[pyfunction]
#[pyo3(signature = (logp, advantages, seq_offsets, grad, stats, options, adv_per_token, logp_old=None, logp_ref=None, mask=None, max_seq_len=0, stream=0, workspace=None, grad_in_input_dtype=false, logp_rollout=None, rollout_stats=None))]
#[allow(clippy::too_many_arguments)] // one argument per buffer
pub fn policy_loss(
    py: Python<'_>,
    logp: &Bound<'_, PyAny>,
    advantages: &Bound<'_, PyAny>,
    seq_offsets: &Bound<'_, PyAny>,
    grad: Option<&Bound<'_, PyAny>>,
    stats: &Bound<'_, PyAny>,
    options: &str,
    adv_per_token: bool,
    logp_old: Option<&Bound<'_, PyAny>>,
    logp_ref: Option<&Bound<'_, PyAny>>,
    mask: Option<&Bound<'_, PyAny>>,
    max_seq_len: u32,
    stream: usize,
    workspace: Option<&Bound<'_, PyAny>>,
    grad_in_input_dtype: bool,
    logp_rollout: Option<&Bound<'_, PyAny>>,
    rollout_stats: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<f64>> {
    let opts: LossOptions = from_spec(options)?;
    let lp = Tensor::take(logp, "logp")?;
    let a = Tensor::take(advantages, "advantages")?;
    let so = Tensor::take(seq_offsets, "seq_offsets")?;
    let mut g = Tensor::take_opt(grad, "grad")?;
    let mut st = Tensor::take(stats, "stats")?;
    let old = Tensor::take_opt(logp_old, "logp_old")?;
    let rf = Tensor::take_opt(logp_ref, "logp_ref")?;
    let m = Tensor::take_opt(mask, "mask")?;
    let ws = Tensor::take_opt(workspace, "workspace")?;
    let ro = Tensor::take_opt(logp_rollout, "logp_rollout")?;
    let mut rst = Tensor::take_opt(rollout_stats, "rollout_stats")?;
    let mut outs = vec![&st];
    outs.extend(g.as_ref());
    outs.extend(rst.as_ref());
    check_outputs(
        &outs,
        &[
            Some(&lp),
            Some(&a),
            Some(&so),
            old.as_ref(),
            rf.as_ref(),
            m.as_ref(),
            ro.as_ref(),
        ],
    )?;
    let dt = lp.dtype();
    for t in [old.as_ref(), rf.as_ref(), ro.as_ref()]
        .into_iter()
        .flatten()
    {
        if t.dtype() != dt {
            return Err(invalid(format!(
                "{}: {} but logp is {} (all log-probs share one dtype)",
                t.name(),
                t.dtype().name(),
                dt.name()
            )));
        }
    }
    if let Device::Cuda(_) = device_of(&lp)? {
        let ws = ws.ok_or_else(|| invalid("workspace: required for CUDA tensors".into()))?;
        cuda::policy_loss(cuda::LossArgs {
            logp: &lp,
            old: old.as_ref(),
            reference: rf.as_ref(),
            rollout: ro.as_ref(),
            rollout_stats: rst.as_ref(),
            adv: &a,
            adv_per_token,
            offsets: &so,
            mask: m.as_ref(),
            grad: g.as_ref(),
            grad_in_input_dtype,
            stats: &st,
            workspace: &ws,
            max_seq_len,
            opts: &opts,
            stream,
        })?;
        return Ok(None);
    }
    if grad_in_input_dtype {
        return Err(invalid(
            "grad_in_input_dtype: only for CUDA tensors (the host gradient is float32)".into(),
        ));
    }
    let g = g
        .as_mut()
        .ok_or_else(|| invalid("grad: required for host arrays".into()))?;
    let advs = a.slice::<f32>()?;
    let adv = if adv_per_token {
        Advantages::PerToken(advs)
    } else {
        Advantages::PerSequence(advs)
    };
    let offsets = so.slice::<u32>()?;
    if let Some(f) = care_core::grpo::offsets_fault(offsets, lp.numel()) {
        return Err(crate::error::core_err(
            &f.named("seq_offsets", "logp").to_string(),
            care_core::Error::InvalidLayout,
        ));
    }
    let mk = opt_slice::<u8>(&m)?;
    let gr = g.slice_mut::<f32>()?;
    let (o, r, ro) = (old.as_ref(), rf.as_ref(), ro.as_ref());
    let out = match dt {
        Dt::F32 => host_loss::<f32>(py, &lp, o, r, ro, offsets, mk, adv, &opts, gr),
        Dt::F64 => host_loss::<f64>(py, &lp, o, r, ro, offsets, mk, adv, &opts, gr),
        Dt::Bf16 => host_loss::<bf16>(py, &lp, o, r, ro, offsets, mk, adv, &opts, gr),
        Dt::F16 => host_loss::<f16>(py, &lp, o, r, ro, offsets, mk, adv, &opts, gr),
        other => Err(invalid(format!(
            "logp: expected float32, float64, bfloat16 or float16, got {}",
            other.name()
        ))),
    }?;
    write_loss_stats(&out.stats, &mut st)?;
    if let Some(t) = rst.as_mut() {
        write_rollout_stats(&out.rollout, t)?;
    }
    Ok(Some(out.loss))
}

/// Writes `s` into `out` (float64 `[13]`, [`ROLLOUT_STATS_FIELDS`] order).
fn write_rollout_stats(s: &RolloutStats, out: &mut Tensor<'_>) -> PyResult<()> {
    let o = out.slice_mut::<f64>()?;
    let values = s.values();
    if o.len() != values.len() {
        return Err(mismatch(format!(
            "rollout_stats: {} values, expected {}",
            o.len(),
            values.len()
        )));
    }
    o.copy_from_slice(&values);
    Ok(())
}

/// The names of [`RolloutStats`]' fields, in declaration order (`ROLLOUT_STATS_FIELDS` in
/// Python; every one a sum).
pub const ROLLOUT_STATS_FIELDS: [&str; 13] = RolloutStats::FIELDS;

/// Copies `src` (computed in f64) into a host output of float32 or float64.
fn store(src: &[f64], out: &mut Tensor<'_>) -> PyResult<()> {
    if out.numel() != src.len() {
        return Err(mismatch(format!(
            "{}: {} values, expected {}",
            out.name(),
            out.numel(),
            src.len()
        )));
    }
    match out.dtype() {
        Dt::F64 => out.slice_mut::<f64>()?.copy_from_slice(src),
        _ => {
            for (o, &x) in out.slice_mut::<f32>()?.iter_mut().zip(src) {
                *o = x as f32;
            }
        }
    }
    Ok(())
}

/// A host float32/float64 input as f64 values.
fn load(t: &Tensor<'_>) -> PyResult<Vec<f64>> {
    Ok(match t.dtype() {
        Dt::F64 => t.slice::<f64>()?.to_vec(),
        _ => t.slice::<f32>()?.iter().map(|&x| f64::from(x)).collect(),
    })
}

/// The host forward for logits of `T`, targets of `I`.
#[allow(clippy::too_many_arguments)] // the pieces of one forward call
fn host_lsm<T: LogProb + Elem, I: TokenId + Elem>(
    py: Python<'_>,
    logits: &Tensor<'_>,
    targets: &Tensor<'_>,
    mask: Option<&[u8]>,
    opts: &LogSoftmaxOptions,
    logp: &mut [f64],
    entropy: Option<&mut [f64]>,
    lse: &mut [f64],
) -> PyResult<()> {
    let (data, rows, vocab, stride) = logits.rows::<T>()?;
    let l = Logits::new(data, rows, vocab, stride).or_raise("logits")?;
    let y = targets.slice::<I>()?;
    py.detach(|| lsm::selective_log_softmax(&l, y, mask, opts, logp, entropy, Some(lse)))
        .or_raise("selective_log_softmax")
}

macro_rules! by_dtypes {
    ($logits:expr, $targets:expr, $f:ident, ($($arg:expr),*)) => {
        match ($logits.dtype(), $targets.dtype()) {
            (Dt::F32, Dt::I64) => $f::<f32, i64>($($arg),*),
            (Dt::F32, Dt::I32) => $f::<f32, i32>($($arg),*),
            (Dt::F64, Dt::I64) => $f::<f64, i64>($($arg),*),
            (Dt::F64, Dt::I32) => $f::<f64, i32>($($arg),*),
            (Dt::Bf16, Dt::I64) => $f::<bf16, i64>($($arg),*),
            (Dt::Bf16, Dt::I32) => $f::<bf16, i32>($($arg),*),
            (Dt::F16, Dt::I64) => $f::<f16, i64>($($arg),*),
            (Dt::F16, Dt::I32) => $f::<f16, i32>($($arg),*),
            (l, t) => Err(invalid(format!(
                "logits {} and targets {}: expected float32/float64/bfloat16/float16 logits \
                 and int64/int32 targets",
                l.name(),
                t.name()
            ))),
        }
    };
}

fn temperature_options(temperature: f64) -> PyResult<LogSoftmaxOptions> {
    let o = LogSoftmaxOptions { temperature };
    o.validate().or_raise("temperature")?;
    Ok(o)
}

/// `_care.selective_log_softmax(logits, targets, logp, lse, temperature=1.0, mask=None,
/// entropy=None, stream=0, workspace=None)`: `logits [N, V]` (rows may be strided),
/// `targets [N]` int64/int32, outputs `[N]` (host: float32 or float64; CUDA: float32). On
/// CUDA a target outside `0..V` gives NaN and sets `workspace[0]`.
#[pyfunction]
#[pyo3(signature = (logits, targets, logp, lse, temperature=1.0, mask=None, entropy=None, stream=0, workspace=None))]
#[allow(clippy::too_many_arguments)] // one argument per buffer
pub fn selective_log_softmax(
    py: Python<'_>,
    logits: &Bound<'_, PyAny>,
    targets: &Bound<'_, PyAny>,
    logp: &Bound<'_, PyAny>,
    lse: &Bound<'_, PyAny>,
    temperature: f64,
    mask: Option<&Bound<'_, PyAny>>,
    entropy: Option<&Bound<'_, PyAny>>,
    stream: usize,
    workspace: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let opts = temperature_options(temperature)?;
    let x = Tensor::take(logits, "logits")?;
    let y = Tensor::take(targets, "targets")?;
    let mut lp = Tensor::take(logp, "logp")?;
    let mut ls = Tensor::take(lse, "lse")?;
    let m = Tensor::take_opt(mask, "mask")?;
    let mut en = Tensor::take_opt(entropy, "entropy")?;
    let ws = Tensor::take_opt(workspace, "workspace")?;
    let mut outs = vec![&lp, &ls];
    outs.extend(en.as_ref());
    check_outputs(&outs, &[Some(&x), Some(&y), m.as_ref()])?;
    if let Device::Cuda(_) = device_of(&x)? {
        let ws = ws.ok_or_else(|| invalid("workspace: required for CUDA tensors".into()))?;
        return cuda::log_softmax(
            &x,
            &y,
            m.as_ref(),
            &lp,
            &ls,
            en.as_ref(),
            &ws,
            &opts,
            stream,
        );
    }
    let rows = x.shape().first().copied().unwrap_or(0) as usize;
    let mk = opt_slice::<u8>(&m)?;
    let (mut a, mut b) = (vec![0.0; rows], vec![0.0; rows]);
    let mut e = en.as_ref().map(|_| vec![0.0; rows]);
    by_dtypes!(
        x,
        y,
        host_lsm,
        (py, &x, &y, mk, &opts, &mut a, e.as_deref_mut(), &mut b)
    )?;
    store(&a, &mut lp)?;
    store(&b, &mut ls)?;
    if let (Some(t), Some(e)) = (en.as_mut(), e.as_ref()) {
        store(e, t)?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)] // the pieces of one backward call
fn host_lsm_backward<T: LogProb + Elem + FromF64, I: TokenId + Elem>(
    py: Python<'_>,
    logits: &Tensor<'_>,
    targets: &Tensor<'_>,
    mask: Option<&[u8]>,
    opts: &LogSoftmaxOptions,
    dlogp: &[f64],
    dentropy: Option<&[f64]>,
    out: &mut Tensor<'_>,
) -> PyResult<()> {
    let (data, rows, vocab, stride) = logits.rows::<T>()?;
    let l = Logits::new(data, rows, vocab, stride).or_raise("logits")?;
    let y = targets.slice::<I>()?;
    let mut d = vec![0.0f64; rows * vocab];
    py.detach(|| lsm::selective_log_softmax_backward(&l, y, mask, opts, dlogp, dentropy, &mut d))
        .or_raise("selective_log_softmax_backward")?;
    let o = out.slice_mut::<T>()?;
    if o.len() != d.len() {
        return Err(mismatch(format!(
            "dlogits: {} values, expected [N, V] = {}",
            o.len(),
            d.len()
        )));
    }
    for (o, &x) in o.iter_mut().zip(&d) {
        *o = T::from_f64(x);
    }
    Ok(())
}

/// Rounds an f64 gradient into the logits dtype.
pub trait FromF64 {
    /// Rounds `x` to the nearest value of this type.
    fn from_f64(x: f64) -> Self;
}
impl FromF64 for f32 {
    fn from_f64(x: f64) -> Self {
        x as f32
    }
}
impl FromF64 for f64 {
    fn from_f64(x: f64) -> Self {
        x
    }
}
impl FromF64 for bf16 {
    fn from_f64(x: f64) -> Self {
        bf16::from_f64(x)
    }
}
impl FromF64 for f16 {
    fn from_f64(x: f64) -> Self {
        f16::from_f64(x)
    }
}

/// `_care.selective_log_softmax_backward(logits, targets, dlogits, lse, temperature=1.0,
/// mask=None, entropy=None, dlogp=None, dentropy=None, stream=0)`: writes `dlogits` (dense
/// `[N, V]` in the logits dtype). The host reference recomputes the log-sum-exp from the
/// logits; CUDA reads `lse` (and `entropy` with `dentropy`) saved by the forward.
#[pyfunction]
#[pyo3(signature = (logits, targets, dlogits, lse, temperature=1.0, mask=None, entropy=None, dlogp=None, dentropy=None, stream=0))]
#[allow(clippy::too_many_arguments)] // one argument per buffer
pub fn selective_log_softmax_backward(
    py: Python<'_>,
    logits: &Bound<'_, PyAny>,
    targets: &Bound<'_, PyAny>,
    dlogits: &Bound<'_, PyAny>,
    lse: &Bound<'_, PyAny>,
    temperature: f64,
    mask: Option<&Bound<'_, PyAny>>,
    entropy: Option<&Bound<'_, PyAny>>,
    dlogp: Option<&Bound<'_, PyAny>>,
    dentropy: Option<&Bound<'_, PyAny>>,
    stream: usize,
) -> PyResult<()> {
    let opts = temperature_options(temperature)?;
    let x = Tensor::take(logits, "logits")?;
    let y = Tensor::take(targets, "targets")?;
    let mut d = Tensor::take(dlogits, "dlogits")?;
    let ls = Tensor::take(lse, "lse")?;
    let m = Tensor::take_opt(mask, "mask")?;
    let en = Tensor::take_opt(entropy, "entropy")?;
    let gl = Tensor::take_opt(dlogp, "dlogp")?;
    let ge = Tensor::take_opt(dentropy, "dentropy")?;
    check_outputs(
        &[&d],
        &[
            Some(&x),
            Some(&y),
            Some(&ls),
            m.as_ref(),
            en.as_ref(),
            gl.as_ref(),
            ge.as_ref(),
        ],
    )?;
    if d.dtype() != x.dtype() {
        return Err(invalid(format!(
            "dlogits: {}, expected the logits dtype {}",
            d.dtype().name(),
            x.dtype().name()
        )));
    }
    if let Device::Cuda(_) = device_of(&x)? {
        return cuda::log_softmax_backward(
            &x,
            &y,
            m.as_ref(),
            &d,
            &ls,
            en.as_ref(),
            gl.as_ref(),
            ge.as_ref(),
            &opts,
            stream,
        );
    }
    let rows = x.shape().first().copied().unwrap_or(0) as usize;
    let g = match &gl {
        Some(t) => load(t)?,
        None => vec![0.0; rows],
    };
    let e = ge.as_ref().map(load).transpose()?;
    let mk = opt_slice::<u8>(&m)?;
    by_dtypes!(
        x,
        y,
        host_lsm_backward,
        (py, &x, &y, mk, &opts, &g, e.as_deref(), &mut d)
    )
}

/// Why the fused path refuses `logp_rollout`, and what to call instead.
pub const LOGITS_NO_ROLLOUT: &str = "logp_rollout: the fused logits path has no rollout correction \
     (compute logp with selective_log_softmax, then call policy_loss with logp_rollout)";

#[allow(clippy::too_many_arguments)] // the pieces of one fused call
fn host_logits_loss<T: LogProb + Elem, I: TokenId + Elem>(
    py: Python<'_>,
    logits: &Tensor<'_>,
    targets: &Tensor<'_>,
    lsm_opts: &LogSoftmaxOptions,
    old: Option<&[f64]>,
    reference: Option<&[f64]>,
    offsets: &[u32],
    mask: Option<&[u8]>,
    adv: Advantages<'_>,
    opts: &LossOptions,
    logp: &mut [f64],
    lse: &mut [f64],
    dlogp: &mut [f32],
) -> PyResult<care_core::grpo::LossOutput> {
    host_lsm::<T, I>(py, logits, targets, mask, lsm_opts, logp, None, lse)?;
    let inputs = LossInputs {
        logp: &*logp,
        logp_old: old,
        logp_ref: reference,
        seq_offsets: offsets,
        mask,
        advantages: adv,
        logp_rollout: None,
    };
    py.detach(|| care_core::grpo::policy_loss(&inputs, opts, dlogp))
        .or_raise("logits_policy_loss")
}

/// `_care.logits_policy_loss(logits, targets, advantages, seq_offsets, logp, lse, dlogp,
/// stats, options, adv_per_token, temperature=1.0, logp_old=None, logp_ref=None, mask=None,
/// max_seq_len=0, stream=0, workspace=None) -> float | None`: the forward of the fused path
/// (log-probs from the logits, the loss, `dL/dlogp`, stats); follow it with
/// [`selective_log_softmax_backward`] of `dlogp` for `dL/dlogits`. Outputs as
/// [`policy_loss`] and [`selective_log_softmax`]; `logp_old`/`logp_ref` float32 (or float64
/// on the host).
#[pyfunction]
#[pyo3(signature = (logits, targets, advantages, seq_offsets, logp, lse, dlogp, stats, options, adv_per_token, temperature=1.0, logp_old=None, logp_ref=None, mask=None, max_seq_len=0, stream=0, workspace=None, logp_rollout=None))]
#[allow(clippy::too_many_arguments)] // one argument per buffer
pub fn logits_policy_loss(
    py: Python<'_>,
    logits: &Bound<'_, PyAny>,
    targets: &Bound<'_, PyAny>,
    advantages: &Bound<'_, PyAny>,
    seq_offsets: &Bound<'_, PyAny>,
    logp: &Bound<'_, PyAny>,
    lse: &Bound<'_, PyAny>,
    dlogp: &Bound<'_, PyAny>,
    stats: &Bound<'_, PyAny>,
    options: &str,
    adv_per_token: bool,
    temperature: f64,
    logp_old: Option<&Bound<'_, PyAny>>,
    logp_ref: Option<&Bound<'_, PyAny>>,
    mask: Option<&Bound<'_, PyAny>>,
    max_seq_len: u32,
    stream: usize,
    workspace: Option<&Bound<'_, PyAny>>,
    logp_rollout: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<f64>> {
    // The fused paths have no rollout correction: refused rather than ignored, with the code
    // the C ABI's `care_logits_policy_loss` returns (CARE_ERR_INVALID_ARGUMENT).
    if logp_rollout.is_some_and(|t| !t.is_none()) {
        return Err(invalid(LOGITS_NO_ROLLOUT.into()));
    }
    let opts: LossOptions = from_spec(options)?;
    let lsm_opts = temperature_options(temperature)?;
    let x = Tensor::take(logits, "logits")?;
    let y = Tensor::take(targets, "targets")?;
    let a = Tensor::take(advantages, "advantages")?;
    let so = Tensor::take(seq_offsets, "seq_offsets")?;
    let mut lp = Tensor::take(logp, "logp")?;
    let mut ls = Tensor::take(lse, "lse")?;
    let mut dl = Tensor::take(dlogp, "dlogp")?;
    let mut st = Tensor::take(stats, "stats")?;
    let old = Tensor::take_opt(logp_old, "logp_old")?;
    let rf = Tensor::take_opt(logp_ref, "logp_ref")?;
    let m = Tensor::take_opt(mask, "mask")?;
    let ws = Tensor::take_opt(workspace, "workspace")?;
    check_outputs(
        &[&lp, &ls, &dl, &st],
        &[
            Some(&x),
            Some(&y),
            Some(&a),
            Some(&so),
            old.as_ref(),
            rf.as_ref(),
            m.as_ref(),
        ],
    )?;
    if let Device::Cuda(_) = device_of(&x)? {
        let ws = ws.ok_or_else(|| invalid("workspace: required for CUDA tensors".into()))?;
        cuda::logits_policy_loss(cuda::LogitsLossArgs {
            logits: &x,
            targets: &y,
            mask: m.as_ref(),
            old: old.as_ref(),
            reference: rf.as_ref(),
            adv: &a,
            adv_per_token,
            offsets: &so,
            logp: &lp,
            lse: &ls,
            dlogp: &dl,
            stats: &st,
            workspace: &ws,
            max_seq_len,
            lsm: &lsm_opts,
            opts: &opts,
            stream,
        })?;
        return Ok(None);
    }
    let rows = x.shape().first().copied().unwrap_or(0) as usize;
    let old_v = old.as_ref().map(load).transpose()?;
    let ref_v = rf.as_ref().map(load).transpose()?;
    let advs = a.slice::<f32>()?;
    let adv = if adv_per_token {
        Advantages::PerToken(advs)
    } else {
        Advantages::PerSequence(advs)
    };
    let offsets = so.slice::<u32>()?;
    let mk = opt_slice::<u8>(&m)?;
    let (mut lpv, mut lsv) = (vec![0.0; rows], vec![0.0; rows]);
    let out = by_dtypes!(
        x,
        y,
        host_logits_loss,
        (
            py,
            &x,
            &y,
            &lsm_opts,
            old_v.as_deref(),
            ref_v.as_deref(),
            offsets,
            mk,
            adv,
            &opts,
            &mut lpv,
            &mut lsv,
            dl.slice_mut::<f32>()?
        )
    )?;
    store(&lpv, &mut lp)?;
    store(&lsv, &mut ls)?;
    write_loss_stats(&out.stats, &mut st)?;
    Ok(Some(out.loss))
}

#[allow(clippy::too_many_arguments)] // the pieces of one call
fn host_rollout<T: LogProb + Elem>(
    py: Python<'_>,
    old: &Tensor<'_>,
    rollout: &Tensor<'_>,
    offsets: &[u32],
    mask: Option<&[u8]>,
    opts: &LossOptions,
    weights: &mut [f32],
    keep: &mut [u8],
) -> PyResult<RolloutStats> {
    let inputs = RolloutInputs {
        logp_old: old.slice::<T>()?,
        logp_rollout: rollout.slice::<T>()?,
        seq_offsets: offsets,
        mask,
    };
    py.detach(|| care_core::grpo::rollout_correction(&inputs, &opts.rollout, weights, keep))
        .or_raise("rollout_correction")
}

/// `_care.rollout_correction(logp_old, logp_rollout, seq_offsets, weights, keep, stats,
/// options, mask=None)`: the rollout correction on its own (host arrays; SPEC §16), with the
/// `rollout_*` fields of the loss options text. `logp_old` and `logp_rollout` of one dtype
/// (float32, float64, bfloat16, float16; `logp_old` is the proximal policy, `logp` when
/// on-policy), `weights` float32 `[T]` (the importance weight the loss applies, 0 on masked or
/// rejected tokens), `keep` uint8 `[T]` (1 = still counted), `stats` float64 `[13]` in
/// `ROLLOUT_STATS_FIELDS` order.
#[pyfunction]
#[pyo3(signature = (logp_old, logp_rollout, seq_offsets, weights, keep, stats, options, mask=None))]
#[allow(clippy::too_many_arguments)] // one argument per buffer
pub fn rollout_correction(
    py: Python<'_>,
    logp_old: &Bound<'_, PyAny>,
    logp_rollout: &Bound<'_, PyAny>,
    seq_offsets: &Bound<'_, PyAny>,
    weights: &Bound<'_, PyAny>,
    keep: &Bound<'_, PyAny>,
    stats: &Bound<'_, PyAny>,
    options: &str,
    mask: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let opts: LossOptions = from_spec(options)?;
    let old = Tensor::take(logp_old, "logp_old")?;
    let ro = Tensor::take(logp_rollout, "logp_rollout")?;
    let so = Tensor::take(seq_offsets, "seq_offsets")?;
    let mut w = Tensor::take(weights, "weights")?;
    let mut k = Tensor::take(keep, "keep")?;
    let mut st = Tensor::take(stats, "stats")?;
    let m = Tensor::take_opt(mask, "mask")?;
    check_outputs(
        &[&w, &k, &st],
        &[Some(&old), Some(&ro), Some(&so), m.as_ref()],
    )?;
    for t in [&old, &ro, &so, &w, &k, &st] {
        if let Device::Cuda(_) = device_of(t)? {
            return Err(invalid(format!(
                "{}: rollout_correction takes host arrays",
                t.name()
            )));
        }
    }
    let dt = old.dtype();
    if ro.dtype() != dt {
        return Err(invalid(format!(
            "logp_rollout: {} but logp_old is {} (the log-probs share one dtype)",
            ro.dtype().name(),
            dt.name()
        )));
    }
    let offsets = so.slice::<u32>()?;
    let mk = opt_slice::<u8>(&m)?;
    let (wv, kv) = (w.slice_mut::<f32>()?, k.slice_mut::<u8>()?);
    let out = match dt {
        Dt::F32 => host_rollout::<f32>(py, &old, &ro, offsets, mk, &opts, wv, kv),
        Dt::F64 => host_rollout::<f64>(py, &old, &ro, offsets, mk, &opts, wv, kv),
        Dt::Bf16 => host_rollout::<bf16>(py, &old, &ro, offsets, mk, &opts, wv, kv),
        Dt::F16 => host_rollout::<f16>(py, &old, &ro, offsets, mk, &opts, wv, kv),
        other => Err(invalid(format!(
            "logp_old: expected float32, float64, bfloat16 or float16, got {}",
            other.name()
        ))),
    }?;
    write_rollout_stats(&out, &mut st)
}

/// The workspace of a CUDA call, required there.
fn cuda_workspace<'a, 'py>(ws: &'a Option<Tensor<'py>>) -> PyResult<&'a Tensor<'py>> {
    ws.as_ref()
        .ok_or_else(|| invalid("workspace: required for CUDA tensors".into()))
}

/// `_care.fused_supported(options) -> bool`: whether `logits_policy_loss_fused` computes the
/// loss of these options (the token-local losses without the rollout correction or bypass
/// mode; `care_kernels::fused_supports`).
#[pyfunction]
pub fn fused_supported(options: &str) -> PyResult<bool> {
    let opts: LossOptions = from_spec(options)?;
    Ok(care_kernels::fused_supports(&opts))
}

/// `_care.logits_policy_loss_fused(logits, targets, advantages, seq_offsets, stats, options,
/// adv_per_token, temperature=1.0, logp_old=None, logp_ref=None, mask=None, dlogits=None,
/// logp=None, lse=None, stream=0, workspace=None)`: the one-pass path on CUDA tensors: each row
/// of logits read once for its log-sum-exp, log-prob, loss term and `dL/dlogp`, and
/// `dL/dlogits` (for `dL/dloss = 1`) written at once into `dlogits` (the logits' shape and
/// dtype), or over the logits themselves when `dlogits` is None. The statistics go to the raw
/// `stats` (reset here; the loss is its first word); `logp` and `lse` are optional outputs.
/// Asynchronous on `stream`; the log-softmax status in `workspace[0]`. Options outside
/// `fused_supported` are refused; host arrays are refused (the host has the three-step path:
/// `logits_policy_loss`, then `selective_log_softmax_backward`).
#[pyfunction]
#[pyo3(signature = (logits, targets, advantages, seq_offsets, stats, options, adv_per_token, temperature=1.0, logp_old=None, logp_ref=None, mask=None, dlogits=None, logp=None, lse=None, stream=0, workspace=None))]
#[allow(clippy::too_many_arguments)] // one argument per buffer
pub fn logits_policy_loss_fused(
    logits: &Bound<'_, PyAny>,
    targets: &Bound<'_, PyAny>,
    advantages: &Bound<'_, PyAny>,
    seq_offsets: &Bound<'_, PyAny>,
    stats: &Bound<'_, PyAny>,
    options: &str,
    adv_per_token: bool,
    temperature: f64,
    logp_old: Option<&Bound<'_, PyAny>>,
    logp_ref: Option<&Bound<'_, PyAny>>,
    mask: Option<&Bound<'_, PyAny>>,
    dlogits: Option<&Bound<'_, PyAny>>,
    logp: Option<&Bound<'_, PyAny>>,
    lse: Option<&Bound<'_, PyAny>>,
    stream: usize,
    workspace: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let opts: LossOptions = from_spec(options)?;
    if !care_kernels::fused_supports(&opts) {
        return Err(invalid(format!(
            "logits_policy_loss_fused: the one-pass path computes token-local losses only \
             (ratio_level token, policy_loss clip, cispo, sapo or gpg, no rollout correction, \
             bypass off); {} at ratio level {} needs whole sequences first: use \
             logits_policy_loss",
            opts.policy_loss, opts.ratio_level
        )));
    }
    let lsm_opts = temperature_options(temperature)?;
    let x = Tensor::take(logits, "logits")?;
    let y = Tensor::take(targets, "targets")?;
    let a = Tensor::take(advantages, "advantages")?;
    let so = Tensor::take(seq_offsets, "seq_offsets")?;
    let st = Tensor::take(stats, "stats")?;
    let old = Tensor::take_opt(logp_old, "logp_old")?;
    let rf = Tensor::take_opt(logp_ref, "logp_ref")?;
    let m = Tensor::take_opt(mask, "mask")?;
    let d = Tensor::take_opt(dlogits, "dlogits")?;
    let lp = Tensor::take_opt(logp, "logp")?;
    let ls = Tensor::take_opt(lse, "lse")?;
    let ws = Tensor::take_opt(workspace, "workspace")?;
    let ins = [
        Some(&y),
        Some(&a),
        Some(&so),
        old.as_ref(),
        rf.as_ref(),
        m.as_ref(),
    ];
    let mut outs: Vec<&Tensor<'_>> = vec![&st];
    outs.extend(lp.iter().chain(ls.iter()));
    match &d {
        Some(d) => {
            outs.push(d);
            let mut all = ins.to_vec();
            all.push(Some(&x));
            check_outputs(&outs, &all)?;
            if d.dtype() != x.dtype() {
                return Err(invalid(format!(
                    "dlogits: {}, expected the logits dtype {}",
                    d.dtype().name(),
                    x.dtype().name()
                )));
            }
        }
        None => {
            // In place: the logits are an output too.
            outs.push(&x);
            check_outputs(&outs, &ins)?;
        }
    }
    let Device::Cuda(_) = device_of(&x)? else {
        return Err(invalid(
            "logits_policy_loss_fused: CUDA tensors only (on the host, logits_policy_loss then \
             selective_log_softmax_backward)"
                .into(),
        ));
    };
    let ws = ws.ok_or_else(|| invalid("workspace: required for CUDA tensors".into()))?;
    cuda::logits_policy_loss_fused(cuda::FusedArgs {
        logits: &x,
        targets: &y,
        mask: m.as_ref(),
        old: old.as_ref(),
        reference: rf.as_ref(),
        adv: &a,
        adv_per_token,
        offsets: &so,
        dlogits: d.as_ref(),
        logp: lp.as_ref(),
        lse: ls.as_ref(),
        stats: &st,
        workspace: &ws,
        lsm: &lsm_opts,
        opts: &opts,
        stream,
    })
}

/// `_care.discounted_returns(token_rewards, seq_offsets, returns, gamma=1.0, mask=None,
/// stream=0, workspace=None, masked_token="skip")`: `G_t = r_t + gamma G_next` per sequence
/// over the counted tokens (SPEC §18), float32 `[T]` in and out (masked tokens get 0;
/// `masked_token="reset"` restarts the return before them, verl before 2026-08).
///
/// Host arrays: a malformed layout raises `invalid_layout` before anything is written. CUDA
/// tensors (`workspace` int32 `[WORKSPACE_BYTES / 4]` required): asynchronous on `stream`,
/// bit-identical to the host; the offsets are not read on the host, so a malformed layout is
/// left in the status word `workspace[0]` (`check_tokens_status`; the outputs are then
/// unspecified).
#[pyfunction]
#[pyo3(signature = (token_rewards, seq_offsets, returns, gamma=1.0, mask=None, stream=0, workspace=None, masked_token="skip"))]
#[allow(clippy::too_many_arguments)] // one argument per buffer
pub fn discounted_returns(
    py: Python<'_>,
    token_rewards: &Bound<'_, PyAny>,
    seq_offsets: &Bound<'_, PyAny>,
    returns: &Bound<'_, PyAny>,
    gamma: f64,
    mask: Option<&Bound<'_, PyAny>>,
    stream: usize,
    workspace: Option<&Bound<'_, PyAny>>,
    masked_token: &str,
) -> PyResult<()> {
    let r = Tensor::take(token_rewards, "token_rewards")?;
    let so = Tensor::take(seq_offsets, "seq_offsets")?;
    let mut out = Tensor::take(returns, "returns")?;
    let m = Tensor::take_opt(mask, "mask")?;
    let ws = Tensor::take_opt(workspace, "workspace")?;
    check_outputs(&[&out], &[Some(&r), Some(&so), m.as_ref(), ws.as_ref()])?;
    let opts = GaeOptions {
        gamma,
        masked_token: crate::names::parse("masked_token", masked_token)?,
        ..GaeOptions::default()
    };
    if let Device::Cuda(_) = device_of(&r)? {
        let args = cuda::TokenArgs {
            rewards: &r,
            values: None,
            offsets: &so,
            mask: m.as_ref(),
            advantages: None,
            returns: &out,
            workspace: cuda_workspace(&ws)?,
            stream,
        };
        return cuda::token_estimator(args, &opts);
    }
    let (rv, offs, mk) = (r.slice::<f32>()?, so.slice::<u32>()?, opt_slice::<u8>(&m)?);
    let o = out.slice_mut::<f32>()?;
    py.detach(|| care_core::grpo::discounted_returns(rv, offs, mk, &opts, o))
        .or_raise("discounted_returns")
}

/// `_care.gae(token_rewards, values, seq_offsets, advantages, returns, gamma=1.0,
/// lambda_=1.0, mask=None, stream=0, workspace=None)`: generalized advantage estimation by a
/// reverse scan per sequence (SPEC §18), float32 `[T]`: the advantages and the returns
/// `A_t + V_t` (masked: 0). Host and CUDA as `discounted_returns` (same status word).
#[pyfunction]
#[pyo3(signature = (token_rewards, values, seq_offsets, advantages, returns, gamma=1.0, lambda_=1.0, mask=None, stream=0, workspace=None))]
#[allow(clippy::too_many_arguments)] // one argument per buffer
pub fn gae(
    py: Python<'_>,
    token_rewards: &Bound<'_, PyAny>,
    values: &Bound<'_, PyAny>,
    seq_offsets: &Bound<'_, PyAny>,
    advantages: &Bound<'_, PyAny>,
    returns: &Bound<'_, PyAny>,
    gamma: f64,
    lambda_: f64,
    mask: Option<&Bound<'_, PyAny>>,
    stream: usize,
    workspace: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let r = Tensor::take(token_rewards, "token_rewards")?;
    let v = Tensor::take(values, "values")?;
    let so = Tensor::take(seq_offsets, "seq_offsets")?;
    let mut a = Tensor::take(advantages, "advantages")?;
    let mut ret = Tensor::take(returns, "returns")?;
    let m = Tensor::take_opt(mask, "mask")?;
    let ws = Tensor::take_opt(workspace, "workspace")?;
    check_outputs(
        &[&a, &ret],
        &[Some(&r), Some(&v), Some(&so), m.as_ref(), ws.as_ref()],
    )?;
    let opts = GaeOptions {
        gamma,
        lambda: lambda_,
        ..GaeOptions::default()
    };
    if let Device::Cuda(_) = device_of(&r)? {
        let args = cuda::TokenArgs {
            rewards: &r,
            values: Some(&v),
            offsets: &so,
            mask: m.as_ref(),
            advantages: Some(&a),
            returns: &ret,
            workspace: cuda_workspace(&ws)?,
            stream,
        };
        return cuda::token_estimator(args, &opts);
    }
    let (rv, vv, offs) = (r.slice::<f32>()?, v.slice::<f32>()?, so.slice::<u32>()?);
    let mk = opt_slice::<u8>(&m)?;
    let (ao, ro) = (a.slice_mut::<f32>()?, ret.slice_mut::<f32>()?);
    py.detach(|| care_core::grpo::gae(rv, vv, offs, mk, &opts, ao, ro))
        .or_raise("gae")
}

/// `_care.whiten(values, eps=1e-8, std_kind="unbiased", mask=None, stream=0, workspace=None,
/// count_eps=0.0) -> (mean, std) | None`: whitens float32 `values` in place over the counted
/// entries (SPEC §18; masked become 0; `count_eps=1e-8` is verl's `masked_mean`).
///
/// Host arrays: returns `(mean, std)`; a non-finite counted value raises `non_finite` and
/// leaves the values as they were. CUDA tensors (`workspace` required): asynchronous on
/// `stream`, within the `Whiten` tolerance of the host; returns `None`: the status word
/// (`workspace[0]`, `check_whiten_status`), mean and std (float64 words
/// `WHITEN_MEAN_STD_F64`) stay in the workspace.
#[pyfunction]
#[pyo3(signature = (values, eps=1e-8, std_kind="unbiased", mask=None, stream=0, workspace=None, count_eps=0.0))]
#[allow(clippy::too_many_arguments)] // one argument per buffer or option
pub fn whiten(
    py: Python<'_>,
    values: &Bound<'_, PyAny>,
    eps: f64,
    std_kind: &str,
    mask: Option<&Bound<'_, PyAny>>,
    stream: usize,
    workspace: Option<&Bound<'_, PyAny>>,
    count_eps: f64,
) -> PyResult<Option<(f64, f64)>> {
    let mut v = Tensor::take(values, "values")?;
    let m = Tensor::take_opt(mask, "mask")?;
    let ws = Tensor::take_opt(workspace, "workspace")?;
    check_outputs(&[&v], &[m.as_ref(), ws.as_ref()])?;
    let opts = WhitenOptions {
        eps,
        std_kind: crate::names::parse("std_kind", std_kind)?,
        count_eps,
    };
    if let Device::Cuda(_) = device_of(&v)? {
        return cuda::whiten(&v, m.as_ref(), cuda_workspace(&ws)?, &opts, stream).map(|()| None);
    }
    let mk = opt_slice::<u8>(&m)?;
    let vv = v.slice_mut::<f32>()?;
    py.detach(|| care_core::grpo::whiten(vv, mk, &opts))
        .or_raise("whiten")
        .map(Some)
}

/// `_care.discounted_returns_whitened(token_rewards, seq_offsets, advantages, returns,
/// gamma=1.0, mask=None, masked_token="skip", eps=1e-8, std_kind="unbiased", count_eps=0.0,
/// stream=0, workspace=None) -> (mean, std) | None`: the discounted returns into `returns` and
/// their whitening into `advantages` (float32 `[T]`), every intermediate in float64 (SPEC §18;
/// verl's `reinforce_plus_plus`).
///
/// Host arrays: returns `(mean, std)`. CUDA tensors (`workspace` of
/// `whitened_workspace_bytes(T)` bytes required): asynchronous on `stream`, the returns equal to
/// the host's bit for bit and the whitened values within the `Whiten` tolerance; returns
/// `None`: the two status words (`workspace[0]` and `workspace[WHITENED_STATUS_WORD]`,
/// `check_whitened_status`), mean and std (`WHITEN_MEAN_STD_F64`) stay in the workspace.
#[pyfunction]
#[pyo3(signature = (token_rewards, seq_offsets, advantages, returns, gamma=1.0, mask=None, masked_token="skip", eps=1e-8, std_kind="unbiased", count_eps=0.0, stream=0, workspace=None))]
#[allow(clippy::too_many_arguments)] // one argument per buffer or option
pub fn discounted_returns_whitened(
    py: Python<'_>,
    token_rewards: &Bound<'_, PyAny>,
    seq_offsets: &Bound<'_, PyAny>,
    advantages: &Bound<'_, PyAny>,
    returns: &Bound<'_, PyAny>,
    gamma: f64,
    mask: Option<&Bound<'_, PyAny>>,
    masked_token: &str,
    eps: f64,
    std_kind: &str,
    count_eps: f64,
    stream: usize,
    workspace: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<(f64, f64)>> {
    let r = Tensor::take(token_rewards, "token_rewards")?;
    let so = Tensor::take(seq_offsets, "seq_offsets")?;
    let mut a = Tensor::take(advantages, "advantages")?;
    let mut ret = Tensor::take(returns, "returns")?;
    let m = Tensor::take_opt(mask, "mask")?;
    let ws = Tensor::take_opt(workspace, "workspace")?;
    check_outputs(&[&a, &ret], &[Some(&r), Some(&so), m.as_ref(), ws.as_ref()])?;
    let opts = GaeOptions {
        gamma,
        masked_token: crate::names::parse("masked_token", masked_token)?,
        ..GaeOptions::default()
    };
    let w = WhitenOptions {
        eps,
        std_kind: crate::names::parse("std_kind", std_kind)?,
        count_eps,
    };
    if let Device::Cuda(_) = device_of(&r)? {
        let args = cuda::TokenArgs {
            rewards: &r,
            values: None,
            offsets: &so,
            mask: m.as_ref(),
            advantages: Some(&a),
            returns: &ret,
            workspace: cuda_workspace(&ws)?,
            stream,
        };
        return cuda::token_estimator_whitened(args, &opts, &w).map(|()| None);
    }
    let (rv, offs, mk) = (r.slice::<f32>()?, so.slice::<u32>()?, opt_slice::<u8>(&m)?);
    let (ao, ro) = (a.slice_mut::<f32>()?, ret.slice_mut::<f32>()?);
    py.detach(|| care_core::grpo::discounted_returns_whitened(rv, offs, mk, &opts, &w, ao, ro))
        .or_raise("discounted_returns_whitened")
        .map(Some)
}

/// `_care.gae_whitened(token_rewards, values, seq_offsets, advantages, returns, gamma=1.0,
/// lambda_=1.0, mask=None, eps=1e-8, std_kind="unbiased", count_eps=0.0, stream=0,
/// workspace=None) -> (mean, std) | None`: GAE with the advantages whitened, every intermediate
/// in float64 (SPEC §18; verl's `gae`); the returns are not whitened. Host and CUDA as
/// `discounted_returns_whitened`.
#[pyfunction]
#[pyo3(signature = (token_rewards, values, seq_offsets, advantages, returns, gamma=1.0, lambda_=1.0, mask=None, eps=1e-8, std_kind="unbiased", count_eps=0.0, stream=0, workspace=None))]
#[allow(clippy::too_many_arguments)] // one argument per buffer or option
pub fn gae_whitened(
    py: Python<'_>,
    token_rewards: &Bound<'_, PyAny>,
    values: &Bound<'_, PyAny>,
    seq_offsets: &Bound<'_, PyAny>,
    advantages: &Bound<'_, PyAny>,
    returns: &Bound<'_, PyAny>,
    gamma: f64,
    lambda_: f64,
    mask: Option<&Bound<'_, PyAny>>,
    eps: f64,
    std_kind: &str,
    count_eps: f64,
    stream: usize,
    workspace: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<(f64, f64)>> {
    let r = Tensor::take(token_rewards, "token_rewards")?;
    let v = Tensor::take(values, "values")?;
    let so = Tensor::take(seq_offsets, "seq_offsets")?;
    let mut a = Tensor::take(advantages, "advantages")?;
    let mut ret = Tensor::take(returns, "returns")?;
    let m = Tensor::take_opt(mask, "mask")?;
    let ws = Tensor::take_opt(workspace, "workspace")?;
    check_outputs(
        &[&a, &ret],
        &[Some(&r), Some(&v), Some(&so), m.as_ref(), ws.as_ref()],
    )?;
    let opts = GaeOptions {
        gamma,
        lambda: lambda_,
        ..GaeOptions::default()
    };
    let w = WhitenOptions {
        eps,
        std_kind: crate::names::parse("std_kind", std_kind)?,
        count_eps,
    };
    if let Device::Cuda(_) = device_of(&r)? {
        let args = cuda::TokenArgs {
            rewards: &r,
            values: Some(&v),
            offsets: &so,
            mask: m.as_ref(),
            advantages: Some(&a),
            returns: &ret,
            workspace: cuda_workspace(&ws)?,
            stream,
        };
        return cuda::token_estimator_whitened(args, &opts, &w).map(|()| None);
    }
    let (rv, vv, offs) = (r.slice::<f32>()?, v.slice::<f32>()?, so.slice::<u32>()?);
    let mk = opt_slice::<u8>(&m)?;
    let (ao, ro) = (a.slice_mut::<f32>()?, ret.slice_mut::<f32>()?);
    py.detach(|| care_core::grpo::gae_whitened(rv, vv, offs, mk, &opts, &w, ao, ro))
        .or_raise("gae_whitened")
        .map(Some)
}

/// `_care.whitened_workspace_bytes(n_tokens) -> int`: the bytes of workspace the CUDA
/// `discounted_returns_whitened` and `gae_whitened` need for `n_tokens` tokens (a fixed part
/// and 8 bytes per token for the unrounded values).
#[pyfunction]
pub fn whitened_workspace_bytes(n_tokens: usize) -> PyResult<usize> {
    let n = u32::try_from(n_tokens).map_err(|_| {
        crate::error::invalid(format!(
            "n_tokens: {n_tokens} is more than the kernels take (2^32 - 1)"
        ))
    })?;
    Ok(care_kernels::whitened_workspace_bytes(n))
}
