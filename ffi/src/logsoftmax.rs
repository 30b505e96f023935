//! Selective log-softmax (per-token log-probs and entropy from logits, and the backward pass):
//! the `f64` CPU reference on host arrays, and the fused CUDA kernels on caller device pointers
//! and a caller `CUstream`, including the fused path from logits to the policy loss.
//! The contract (edge cases included) is `care_core::logsoftmax`.
//!
//! Logits are `[rows, vocab]` row-major with a row stride in elements (`>= vocab`), in
//! `care_dtype` (16-bit dtypes as raw bit patterns); targets are `int32_t` or `int64_t`
//! (`targets_i64`); the optional mask is `uint8_t` (0 = row not read, outputs 0).

use core::ffi::c_void;

use care_core::grpo::LogProb;
use care_core::logsoftmax::{
    LogSoftmaxOptions, Logits, TokenId, selective_log_softmax, selective_log_softmax_backward,
};
use care_kernels::{
    Dtype, LogSoftmaxGrads, LogSoftmaxOutputs, LogitsBuffers, LogitsLossBuffers, Tuning,
    WORKSPACE_BYTES, log_softmax_backward, log_softmax_forward, log_softmax_status,
    logits_loss_forward,
};
use cudarc::driver::result as cu;
use half::{bf16, f16};

use crate::args;
use crate::gpu::{
    CARE_GPU_LOSS_STATS_BYTES, CARE_GPU_WORKSPACE_BYTES, backend, dev, driver_code, kernel_code,
    workspace,
};
use crate::loss::{self, care_loss_options};
use crate::result::{care_result, map_error};

fn dtype_arg(d: u32) -> Result<Dtype, care_result> {
    args::enum_arg(d, &Dtype::ALL)
}

fn options(temperature: f64) -> Result<LogSoftmaxOptions, care_result> {
    let o = LogSoftmaxOptions { temperature };
    o.validate().map_err(map_error)?;
    Ok(o)
}

/// Elements a `[rows, vocab]` matrix with `stride` needs: `(rows - 1) * stride + vocab`.
fn matrix_len(rows: usize, vocab: usize, stride: usize) -> Result<usize, care_result> {
    if vocab == 0 || stride < vocab {
        return Err(care_result::CARE_ERR_INVALID_ARGUMENT);
    }
    match rows {
        0 => Ok(0),
        r => (r - 1)
            .checked_mul(stride)
            .and_then(|n| n.checked_add(vocab))
            .ok_or(care_result::CARE_ERR_INVALID_ARGUMENT),
    }
}

// ---- CPU ------------------------------------------------------------------------------------

/// # Safety
/// The contract of `care_log_softmax`.
#[allow(clippy::too_many_arguments)]
unsafe fn cpu_forward<T: LogProb, I: TokenId>(
    logits: *const c_void,
    logits_len: usize,
    rows: usize,
    vocab: usize,
    row_stride: usize,
    targets: *const c_void,
    targets_len: usize,
    mask: *const u8,
    mask_len: usize,
    temperature: f64,
    logp_out: *mut f32,
    logp_len: usize,
    entropy_out: *mut f32,
    entropy_len: usize,
    lse_out: *mut f32,
    lse_len: usize,
) -> care_result {
    // SAFETY (all blocks below): forwarded contract of the entry point.
    let x = tri!(unsafe { args::slice(logits.cast::<T>(), logits_len) });
    let y = tri!(unsafe { args::slice(targets.cast::<I>(), targets_len) });
    let mask = tri!(unsafe { args::opt_slice(mask, mask_len) });
    let opts = tri!(options(temperature));
    let l = match Logits::new(x, rows, vocab, row_stride) {
        Ok(l) => l,
        Err(e) => return map_error(e),
    };
    let logp = tri!(unsafe { args::slice_mut(logp_out, logp_len) });
    let ent = tri!(unsafe { args::opt_slice_mut(entropy_out, entropy_len) });
    let lse = tri!(unsafe { args::opt_slice_mut(lse_out, lse_len) });
    let n = rows;
    if logp.len() != n
        || ent.as_ref().is_some_and(|e| e.len() != n)
        || lse.as_ref().is_some_and(|e| e.len() != n)
    {
        return care_result::CARE_ERR_LENGTH_MISMATCH;
    }
    let (mut lp, mut h, mut ls) = (vec![0.0f64; n], vec![0.0f64; n], vec![0.0f64; n]);
    if let Err(e) = selective_log_softmax(&l, y, mask, &opts, &mut lp, Some(&mut h), Some(&mut ls))
    {
        return map_error(e);
    }
    for (o, v) in logp.iter_mut().zip(&lp) {
        *o = *v as f32;
    }
    if let Some(e) = ent {
        for (o, v) in e.iter_mut().zip(&h) {
            *o = *v as f32;
        }
    }
    if let Some(e) = lse {
        for (o, v) in e.iter_mut().zip(&ls) {
            *o = *v as f32;
        }
    }
    care_result::CARE_OK
}

/// Selective log-softmax on the CPU (the `f64` reference, outputs rounded to `float`):
/// `logp_out[rows]` = `log softmax(x_i / temperature)[y_i]`, and optionally the entropy
/// `entropy_out[rows]` and the log-sum-exp of the scaled logits `lse_out[rows]` ((NULL, 0) to
/// skip). `logits[logits_len]` holds `dtype` elements (`care_dtype`), `logits_len >=
/// (rows - 1) * row_stride + vocab`; `targets[targets_len]` (`== rows`) are `int64_t` when
/// `targets_i64` is 1, else `int32_t`; `mask` optional (`mask_len` 0 or `rows`).
///
/// Errors: `CARE_ERR_INVALID_ARGUMENT` for `temperature` not finite and positive, `vocab == 0`,
/// `row_stride < vocab`, or a counted row's target outside `0..vocab` (nothing is written).
#[allow(clippy::too_many_arguments)] // one (pointer, length) pair per buffer
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_log_softmax(
    dtype: u32,
    logits: *const c_void,
    logits_len: usize,
    rows: usize,
    vocab: usize,
    row_stride: usize,
    targets: *const c_void,
    targets_len: usize,
    targets_i64: u32,
    mask: *const u8,
    mask_len: usize,
    temperature: f64,
    logp_out: *mut f32,
    logp_len: usize,
    entropy_out: *mut f32,
    entropy_len: usize,
    lse_out: *mut f32,
    lse_len: usize,
) -> care_result {
    ffi_panic_boundary! {
        let dt = tri!(dtype_arg(dtype));
        macro_rules! go {
            ($t:ty, $i:ty) => {
                // SAFETY: the entry point's contract; bf16/f16 are repr(transparent) over u16.
                unsafe {
                    cpu_forward::<$t, $i>(
                        logits, logits_len, rows, vocab, row_stride, targets, targets_len, mask,
                        mask_len, temperature, logp_out, logp_len, entropy_out, entropy_len,
                        lse_out, lse_len,
                    )
                }
            };
        }
        match (dt, targets_i64) {
            (Dtype::F32, 0) => go!(f32, i32),
            (Dtype::F32, 1) => go!(f32, i64),
            (Dtype::Bf16, 0) => go!(bf16, i32),
            (Dtype::Bf16, 1) => go!(bf16, i64),
            (Dtype::F16, 0) => go!(f16, i32),
            (Dtype::F16, 1) => go!(f16, i64),
            _ => care_result::CARE_ERR_INVALID_ARGUMENT,
        }
    }
}

/// # Safety
/// The contract of `care_log_softmax_backward`.
#[allow(clippy::too_many_arguments)]
unsafe fn cpu_backward<T: LogProb, I: TokenId>(
    logits: *const c_void,
    logits_len: usize,
    rows: usize,
    vocab: usize,
    row_stride: usize,
    targets: *const c_void,
    targets_len: usize,
    mask: *const u8,
    mask_len: usize,
    temperature: f64,
    dlogp: *const f32,
    dlogp_len: usize,
    dentropy: *const f32,
    dentropy_len: usize,
    dlogits_out: *mut f32,
    dlogits_len: usize,
) -> care_result {
    // SAFETY (all blocks below): forwarded contract of the entry point.
    let x = tri!(unsafe { args::slice(logits.cast::<T>(), logits_len) });
    let y = tri!(unsafe { args::slice(targets.cast::<I>(), targets_len) });
    let mask = tri!(unsafe { args::opt_slice(mask, mask_len) });
    let g = tri!(unsafe { args::slice(dlogp, dlogp_len) });
    let e = tri!(unsafe { args::opt_slice(dentropy, dentropy_len) });
    let opts = tri!(options(temperature));
    let l = match Logits::new(x, rows, vocab, row_stride) {
        Ok(l) => l,
        Err(e) => return map_error(e),
    };
    let out = tri!(unsafe { args::slice_mut(dlogits_out, dlogits_len) });
    let g64: Vec<f64> = g.iter().map(|&v| f64::from(v)).collect();
    let e64: Option<Vec<f64>> = e.map(|e| e.iter().map(|&v| f64::from(v)).collect());
    let mut d = vec![0.0f64; out.len()];
    match selective_log_softmax_backward(&l, y, mask, &opts, &g64, e64.as_deref(), &mut d) {
        Ok(()) => {
            for (o, v) in out.iter_mut().zip(&d) {
                *o = *v as f32;
            }
            care_result::CARE_OK
        }
        Err(e) => map_error(e),
    }
}

/// Backward of `care_log_softmax` on the CPU: `dlogits_out[rows * vocab]` (dense, `float`) =
/// `dL/dx` from `dlogp[rows]` and, optionally, `dentropy[rows]` ((NULL, 0) for no entropy
/// term). Masked rows get exact zeros. Arguments and errors as `care_log_softmax`.
#[allow(clippy::too_many_arguments)] // one (pointer, length) pair per buffer
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_log_softmax_backward(
    dtype: u32,
    logits: *const c_void,
    logits_len: usize,
    rows: usize,
    vocab: usize,
    row_stride: usize,
    targets: *const c_void,
    targets_len: usize,
    targets_i64: u32,
    mask: *const u8,
    mask_len: usize,
    temperature: f64,
    dlogp: *const f32,
    dlogp_len: usize,
    dentropy: *const f32,
    dentropy_len: usize,
    dlogits_out: *mut f32,
    dlogits_len: usize,
) -> care_result {
    ffi_panic_boundary! {
        let dt = tri!(dtype_arg(dtype));
        macro_rules! go {
            ($t:ty, $i:ty) => {
                // SAFETY: the entry point's contract; bf16/f16 are repr(transparent) over u16.
                unsafe {
                    cpu_backward::<$t, $i>(
                        logits, logits_len, rows, vocab, row_stride, targets, targets_len, mask,
                        mask_len, temperature, dlogp, dlogp_len, dentropy, dentropy_len,
                        dlogits_out, dlogits_len,
                    )
                }
            };
        }
        match (dt, targets_i64) {
            (Dtype::F32, 0) => go!(f32, i32),
            (Dtype::F32, 1) => go!(f32, i64),
            (Dtype::Bf16, 0) => go!(bf16, i32),
            (Dtype::Bf16, 1) => go!(bf16, i64),
            (Dtype::F16, 0) => go!(f16, i32),
            (Dtype::F16, 1) => go!(f16, i64),
            _ => care_result::CARE_ERR_INVALID_ARGUMENT,
        }
    }
}

// ---- GPU ------------------------------------------------------------------------------------

/// The checked row description shared by the GPU entry points.
#[allow(clippy::too_many_arguments)]
fn gpu_rows(
    dtype: u32,
    d_logits: *const c_void,
    rows: usize,
    vocab: u32,
    row_stride: usize,
    d_targets: *const c_void,
    targets_len: usize,
    targets_i64: u32,
    d_mask: *const u8,
    mask_len: usize,
) -> Result<LogitsBuffers, care_result> {
    let dtype = dtype_arg(dtype)?;
    matrix_len(rows, vocab as usize, row_stride)?;
    let i64t = match targets_i64 {
        0 => false,
        1 => true,
        _ => return Err(care_result::CARE_ERR_INVALID_ARGUMENT),
    };
    let logits = dev(d_logits.cast::<u8>(), rows, rows, true)?;
    if !(logits as usize).is_multiple_of(dtype.size()) {
        return Err(care_result::CARE_ERR_INVALID_ARGUMENT);
    }
    let targets = if i64t {
        dev(d_targets.cast::<i64>(), targets_len, rows, true)?
    } else {
        dev(d_targets.cast::<i32>(), targets_len, rows, true)?
    };
    Ok(LogitsBuffers {
        dtype,
        logits,
        rows: rows as u64,
        vocab,
        stride: row_stride as u64,
        targets,
        targets_i64: i64t,
        mask: dev(d_mask, mask_len, rows, false)?,
    })
}

/// Selective log-softmax on the GPU, asynchronously on `stream` (NULL = legacy default stream)
/// in the context current on this thread (else the primary context of the pointer's device).
/// `d_logits` holds `rows` rows of `vocab` `dtype` elements, `row_stride` elements apart (any
/// stride `>= vocab`, any alignment of the element type; 16-byte aligned rows are fastest);
/// `d_targets[targets_len]` (`== rows`) `int32_t` or `int64_t` (`targets_i64`); `d_mask`
/// optional. Writes `d_logp_out[rows]` and, when given, `d_entropy_out[rows]` and
/// `d_lse_out[rows]` (the backward pass needs `lse`). `d_workspace`: at least
/// `CARE_GPU_WORKSPACE_BYTES`, 16-byte aligned; `care_gpu_log_softmax_status` reads it.
/// Same results as `care_log_softmax` within the documented tolerance; a bad target gives NaN
/// and is reported by `care_gpu_log_softmax_status`.
#[allow(clippy::too_many_arguments)] // one (pointer, length) pair per buffer
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_gpu_log_softmax(
    dtype: u32,
    d_logits: *const c_void,
    rows: usize,
    vocab: u32,
    row_stride: usize,
    d_targets: *const c_void,
    targets_len: usize,
    targets_i64: u32,
    d_mask: *const u8,
    mask_len: usize,
    temperature: f64,
    d_logp_out: *mut f32,
    logp_len: usize,
    d_entropy_out: *mut f32,
    entropy_len: usize,
    d_lse_out: *mut f32,
    lse_len: usize,
    d_workspace: *mut c_void,
    workspace_len: usize,
    stream: *mut c_void,
) -> care_result {
    ffi_panic_boundary! {
        let r = tri!(gpu_rows(dtype, d_logits, rows, vocab, row_stride, d_targets, targets_len,
                              targets_i64, d_mask, mask_len));
        let out = LogSoftmaxOutputs {
            logp: tri!(dev(d_logp_out.cast_const(), logp_len, rows, true)),
            entropy: tri!(dev(d_entropy_out.cast_const(), entropy_len, rows, false)),
            lse: tri!(dev(d_lse_out.cast_const(), lse_len, rows, false)),
            status: tri!(workspace(d_workspace, workspace_len)),
        };
        let opts = tri!(options(temperature));
        // SAFETY: forwarded contract.
        let b = tri!(unsafe { backend(stream, out.status) });
        // SAFETY: every address is caller device memory of the documented, cross-checked size.
        match unsafe { log_softmax_forward(&b, &r, &out, &opts, Tuning::default()) } {
            Ok(()) => care_result::CARE_OK,
            Err(e) => kernel_code(e),
        }
    }
}

/// Synchronizes `stream` and reads the status word that `care_gpu_log_softmax` or
/// `care_gpu_logits_policy_loss` left in `d_workspace`: `CARE_OK`, or
/// `CARE_ERR_INVALID_ARGUMENT` when a counted row's target was outside `0..vocab`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_gpu_log_softmax_status(
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
        match log_softmax_status(u32::from_ne_bytes(word)) {
            Ok(()) => care_result::CARE_OK,
            Err(e) => map_error(e),
        }
    }
}

/// Backward of `care_gpu_log_softmax`, asynchronously on `stream`: writes
/// `d_dlogits_out` (`dtype`, `rows` rows `dlogits_row_stride` elements apart) =
/// `(g / T) * (onehot - softmax) - (e / T) * p * (log p + H)` from `d_dlogp[rows]` (optional:
/// (NULL, 0) is 0) and `d_dentropy[rows]` (optional; needs the forward's `d_entropy`), using
/// the forward's `d_lse[rows]`. Pass `d_dlogits_out = d_logits` with the same stride to
/// overwrite the logits in place. Masked rows get zeros.
#[allow(clippy::too_many_arguments)] // one (pointer, length) pair per buffer
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_gpu_log_softmax_backward(
    dtype: u32,
    d_logits: *const c_void,
    rows: usize,
    vocab: u32,
    row_stride: usize,
    d_targets: *const c_void,
    targets_len: usize,
    targets_i64: u32,
    d_mask: *const u8,
    mask_len: usize,
    temperature: f64,
    d_lse: *const f32,
    lse_len: usize,
    d_entropy: *const f32,
    entropy_len: usize,
    d_dlogp: *const f32,
    dlogp_len: usize,
    d_dentropy: *const f32,
    dentropy_len: usize,
    d_dlogits_out: *mut c_void,
    dlogits_row_stride: usize,
    stream: *mut c_void,
) -> care_result {
    ffi_panic_boundary! {
        let r = tri!(gpu_rows(dtype, d_logits, rows, vocab, row_stride, d_targets, targets_len,
                              targets_i64, d_mask, mask_len));
        tri!(matrix_len(rows, vocab as usize, dlogits_row_stride));
        let g = LogSoftmaxGrads {
            lse: tri!(dev(d_lse, lse_len, rows, true)),
            entropy: tri!(dev(d_entropy, entropy_len, rows, false)),
            dlogp: tri!(dev(d_dlogp, dlogp_len, rows, false)),
            dentropy: tri!(dev(d_dentropy, dentropy_len, rows, false)),
            dlogits: tri!(dev(d_dlogits_out.cast_const().cast::<u8>(), rows, rows, true)),
            dstride: dlogits_row_stride as u64,
        };
        if !(g.dlogits as usize).is_multiple_of(r.dtype.size()) {
            return care_result::CARE_ERR_INVALID_ARGUMENT;
        }
        let opts = tri!(options(temperature));
        if rows == 0 {
            return care_result::CARE_OK;
        }
        // SAFETY: forwarded contract.
        let b = tri!(unsafe { backend(stream, g.lse) });
        // SAFETY: every address is caller device memory of the documented, cross-checked size.
        match unsafe { log_softmax_backward(&b, &r, &g, &opts, Tuning::default()) } {
            Ok(()) => care_result::CARE_OK,
            Err(e) => kernel_code(e),
        }
    }
}

/// The fused path from logits to the policy loss (SPEC §10, token-level layout over the rows),
/// forward half, asynchronously on `stream`: the selective log-softmax writes
/// `d_logp_out[rows]` and `d_lse_out[rows]`, then the loss writes `d_dlogp_out[rows]`
/// (`dL/dlogp`, `float`) and adds its statistics into `d_stats` (see
/// `care_gpu_loss_stats_reset` / `_read`). Then call `care_gpu_log_softmax_backward` with
/// `d_dlogp_out` and `d_lse_out` (in place over the logits if they are not needed any more)
/// to get `dlogits`. `d_logp_old` / `d_logp_ref` are `float` (optional); sequences, mask,
/// advantages and `options` as `care_gpu_policy_loss`. The status word in `d_workspace`
/// reports bad targets (`care_gpu_log_softmax_status`).
#[allow(clippy::too_many_arguments)] // one (pointer, length) pair per buffer
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_gpu_logits_policy_loss(
    dtype: u32,
    d_logits: *const c_void,
    rows: usize,
    vocab: u32,
    row_stride: usize,
    d_targets: *const c_void,
    targets_len: usize,
    targets_i64: u32,
    d_mask: *const u8,
    mask_len: usize,
    temperature: f64,
    d_logp_old: *const f32,
    logp_old_len: usize,
    d_logp_ref: *const f32,
    logp_ref_len: usize,
    d_seq_offsets: *const u32,
    seq_offsets_len: usize,
    d_advantages: *const f32,
    advantages_len: usize,
    advantages_kind: u32,
    options_: *const care_loss_options,
    max_seq_len: u32,
    d_logp_out: *mut f32,
    logp_len: usize,
    d_lse_out: *mut f32,
    lse_len: usize,
    d_dlogp_out: *mut f32,
    dlogp_len: usize,
    d_stats: *mut c_void,
    stats_len: usize,
    d_workspace: *mut c_void,
    workspace_len: usize,
    stream: *mut c_void,
) -> care_result {
    ffi_panic_boundary! {
        let r = tri!(gpu_rows(dtype, d_logits, rows, vocab, row_stride, d_targets, targets_len,
                              targets_i64, d_mask, mask_len));
        let Some(n_seq) = seq_offsets_len.checked_sub(1) else {
            return if d_seq_offsets.is_null() {
                care_result::CARE_ERR_NULL_POINTER
            } else {
                care_result::CARE_ERR_INVALID_LAYOUT
            };
        };
        let per_token = match advantages_kind {
            0 => false,
            1 => true,
            _ => return care_result::CARE_ERR_INVALID_ARGUMENT,
        };
        let adv_want = if per_token { rows } else { n_seq };
        let ws = tri!(workspace(d_workspace, workspace_len));
        let buf = LogitsLossBuffers {
            logp: tri!(dev(d_logp_out.cast_const(), logp_len, rows, true)),
            lse: tri!(dev(d_lse_out.cast_const(), lse_len, rows, true)),
            dlogp: tri!(dev(d_dlogp_out.cast_const(), dlogp_len, rows, true)),
            logp_old: tri!(dev(d_logp_old, logp_old_len, rows, false)),
            logp_ref: tri!(dev(d_logp_ref, logp_ref_len, rows, false)),
            adv: tri!(dev(d_advantages, advantages_len, adv_want, true)),
            adv_per_token: per_token,
            seq_offsets: tri!(dev(d_seq_offsets, seq_offsets_len, seq_offsets_len, true)),
            n_seq: tri!(u32::try_from(n_seq).map_err(|_| care_result::CARE_ERR_INVALID_ARGUMENT)),
            max_seq_len,
            stats: tri!(dev(d_stats.cast_const(), stats_len, CARE_GPU_LOSS_STATS_BYTES, false)),
            workspace: ws,
        };
        let opts = tri!(options(temperature));
        // SAFETY: forwarded contract.
        let loss_opts = tri!(unsafe { loss::read_options(options_) });
        // SAFETY: forwarded contract.
        let b = tri!(unsafe { backend(stream, ws) });
        // SAFETY: every address is caller device memory of the documented, cross-checked size.
        match unsafe { logits_loss_forward(&b, &r, &buf, &opts, &loss_opts, Tuning::default()) } {
            Ok(()) => care_result::CARE_OK,
            Err(e) => kernel_code(e),
        }
    }
}

const _: () = assert!(CARE_GPU_WORKSPACE_BYTES == WORKSPACE_BYTES);

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use core::ptr::{null, null_mut};

    #[test]
    fn cpu_forward_and_backward_match_the_reference() {
        // Two rows of V = 3, stride 4, bf16 logits; i64 targets; temperature 0.6.
        let x: Vec<u16> = [1.0f32, -2.0, 0.5, 9.0, 0.0, 0.0, 3.0, 9.0]
            .iter()
            .map(|&v| bf16::from_f32(v).to_bits())
            .collect();
        let y = [2i64, 1];
        let (mut lp, mut h, mut lse) = ([0f32; 2], [0f32; 2], [0f32; 2]);
        // SAFETY: host buffers of the given lengths.
        let r = unsafe {
            care_log_softmax(
                1,
                x.as_ptr().cast(),
                7,
                2,
                3,
                4,
                y.as_ptr().cast(),
                2,
                1,
                null(),
                0,
                0.6,
                lp.as_mut_ptr(),
                2,
                h.as_mut_ptr(),
                2,
                lse.as_mut_ptr(),
                2,
            )
        };
        assert_eq!(r, care_result::CARE_OK);
        let xb: Vec<bf16> = x.iter().map(|&b| bf16::from_bits(b)).collect();
        let l = Logits::new(&xb[..], 2, 3, 4).unwrap();
        let mut want = [0f64; 2];
        let o = LogSoftmaxOptions { temperature: 0.6 };
        selective_log_softmax(&l, &y, None, &o, &mut want, None, None).unwrap();
        assert_eq!(lp, [want[0] as f32, want[1] as f32]);

        let g = [1.0f32, -0.5];
        let mut d = [f32::NAN; 6];
        // SAFETY: as above.
        let r = unsafe {
            care_log_softmax_backward(
                1,
                x.as_ptr().cast(),
                7,
                2,
                3,
                4,
                y.as_ptr().cast(),
                2,
                1,
                null(),
                0,
                0.6,
                g.as_ptr(),
                2,
                null(),
                0,
                d.as_mut_ptr(),
                6,
            )
        };
        assert_eq!(r, care_result::CARE_OK);
        assert!(d.iter().all(|v| v.is_finite()));
        // Softmax gradients of each row sum to 0.
        assert!((d[0] + d[1] + d[2]).abs() < 1e-6 && (d[3] + d[4] + d[5]).abs() < 1e-6);
    }

    #[test]
    fn cpu_argument_errors() {
        let x = [0f32; 4];
        let y = [0i32, 5];
        let mut lp = [0f32; 2];
        let lpp = lp.as_mut_ptr();
        // SAFETY: host buffers of the given lengths (or NULL with length 0).
        unsafe {
            let call = |dtype, ti64, t: f64, y: &[i32], vocab| {
                care_log_softmax(
                    dtype,
                    x.as_ptr().cast(),
                    4,
                    2,
                    vocab,
                    2,
                    y.as_ptr().cast(),
                    y.len(),
                    ti64,
                    null(),
                    0,
                    t,
                    lpp,
                    2,
                    null_mut(),
                    0,
                    null_mut(),
                    0,
                )
            };
            assert_eq!(
                call(0, 0, 1.0, &y, 2),
                care_result::CARE_ERR_INVALID_ARGUMENT
            ); // target 5
            assert_eq!(
                call(3, 0, 1.0, &[0, 0], 2),
                care_result::CARE_ERR_INVALID_ARGUMENT
            );
            assert_eq!(
                call(0, 2, 1.0, &[0, 0], 2),
                care_result::CARE_ERR_INVALID_ARGUMENT
            );
            assert_eq!(
                call(0, 0, 0.0, &[0, 0], 2),
                care_result::CARE_ERR_INVALID_ARGUMENT
            );
            assert_eq!(
                call(0, 0, 1.0, &[0, 0], 3),
                care_result::CARE_ERR_INVALID_ARGUMENT
            );
            assert_eq!(
                call(0, 0, 1.0, &[0], 2),
                care_result::CARE_ERR_LENGTH_MISMATCH
            );
            assert_eq!(call(0, 0, 1.0, &[0, 1], 2), care_result::CARE_OK);
        }
    }

    #[test]
    fn gpu_checks_arguments_before_the_driver() {
        // SAFETY: every call is rejected before any device access.
        unsafe {
            let r = care_gpu_log_softmax(
                0,
                null(),
                4,
                8,
                8,
                null(),
                4,
                0,
                null(),
                0,
                1.0,
                null_mut(),
                4,
                null_mut(),
                0,
                null_mut(),
                0,
                null_mut(),
                0,
                null_mut(),
            );
            assert_eq!(r, care_result::CARE_ERR_NULL_POINTER);
            let r = care_gpu_log_softmax(
                7,
                null(),
                0,
                8,
                8,
                null(),
                0,
                0,
                null(),
                0,
                1.0,
                null_mut(),
                0,
                null_mut(),
                0,
                null_mut(),
                0,
                null_mut(),
                0,
                null_mut(),
            );
            assert_eq!(r, care_result::CARE_ERR_INVALID_ARGUMENT);
            let r = care_gpu_log_softmax(
                0,
                null(),
                0,
                8,
                4,
                null(),
                0,
                0,
                null(),
                0,
                1.0,
                null_mut(),
                0,
                null_mut(),
                0,
                null_mut(),
                0,
                null_mut(),
                0,
                null_mut(),
            );
            assert_eq!(r, care_result::CARE_ERR_INVALID_ARGUMENT, "stride < vocab");
        }
    }

    #[test]
    fn gpu_without_a_driver_is_unavailable() {
        if care_kernels::cuda::driver_available() {
            return; // covered by the GPU tests
        }
        #[repr(align(16))]
        struct Ws([u8; 64]);
        let ws = Ws([0; 64]);
        // Fake (aligned, non-NULL) addresses: the call must stop at the driver check.
        let p = 0x1000usize as *mut f32;
        // SAFETY: nothing is dereferenced without a driver.
        let r = unsafe {
            care_gpu_log_softmax(
                0,
                p.cast(),
                2,
                8,
                8,
                p.cast(),
                2,
                0,
                null(),
                0,
                1.0,
                p,
                2,
                null_mut(),
                0,
                null_mut(),
                0,
                ws.0.as_ptr().cast_mut().cast(),
                64,
                null_mut(),
            )
        };
        assert_eq!(r, care_result::CARE_ERR_CUDA_UNAVAILABLE);
    }
}
