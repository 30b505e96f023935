//! Selective log-softmax (per-token log-probs and entropy from logits, and the backward pass):
//! the `f64` CPU reference on host arrays, and the fused CUDA kernels on caller device pointers
//! and a caller `CUstream`; plus the fused path from logits to the policy loss on both. The
//! contract (edge cases included) is `care_core::logsoftmax`.
//!
//! A `care_logits` describes the rows (logits, targets, mask, temperature) for every entry
//! point here, CPU and GPU alike.

use core::ffi::c_void;

use care_core::grpo::{Advantages, LogProb, LossInputs, LossOptions, LossOutput};
use care_core::logsoftmax::{
    LogSoftmaxOptions, Logits, TokenId, selective_log_softmax, selective_log_softmax_backward,
};
use care_kernels::{
    Dtype, FusedLossBuffers, LogSoftmaxGrads, LogSoftmaxOutputs, LogitsBuffers, LogitsLossBuffers,
    Tuning, WORKSPACE_BYTES, fused_supports, log_softmax_backward, log_softmax_forward,
    log_softmax_status, logits_loss_forward, logits_loss_fused,
};
use half::{bf16, f16};

use crate::args::{self, Out};
use crate::gpu::{
    CARE_GPU_LOSS_STATS_BYTES, CARE_GPU_WORKSPACE_BYTES, backend, care_gpu_launch, dev,
    device_loss, kernel_code, read_launch,
};
use crate::loss::{
    self, care_loss_inputs, care_loss_options, care_loss_stats, read_dtype as dtype_arg,
};
use crate::result::{care_result, map_error};

/// Rows of logits with their targets: the input of every selective log-softmax entry point
/// (CPU: host memory; GPU: device memory).
///
/// `logits` holds `rows` rows of `vocab` elements of `dtype` (a `care_dtype`), row `i` starting
/// at element `i * row_stride` (`row_stride >= vocab`; a strided view such as `x[:, :V]` needs
/// no copy), so `logits_len >= (rows - 1) * row_stride + vocab` (`CARE_ERR_LENGTH_MISMATCH`).
/// `targets[targets_len]` (`== rows`) are `int64_t` when `targets_i64` is 1, `int32_t` when it
/// is 0. `mask` is optional ((NULL, 0), else `mask_len == rows`; 0 = row not read, its outputs
/// and gradient are 0). The logits are divided by `temperature` (finite and at least
/// `log2(e) / FLT_MAX`, about `4.24e-39`, so that the kernels' scale `log2(e) / temperature`
/// is a finite `float`).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_logits {
    /// `sizeof(care_logits)`.
    pub struct_size: u32,
    /// A `care_dtype`: the element type of `logits`.
    pub dtype: u32,
    /// The logits.
    pub logits: *const c_void,
    /// Elements readable at `logits`.
    pub logits_len: usize,
    /// Number of rows (tokens).
    pub rows: usize,
    /// Vocabulary size `V` (`> 0`).
    pub vocab: usize,
    /// Elements between the starts of two rows (`>= vocab`).
    pub row_stride: usize,
    /// One target id per row.
    pub targets: *const c_void,
    /// `rows`.
    pub targets_len: usize,
    /// 1: `targets` are `int64_t`; 0: `int32_t`.
    pub targets_i64: u32,
    /// Row mask, or NULL.
    pub mask: *const u8,
    /// 0 or `rows`.
    pub mask_len: usize,
    /// Sampling temperature `T` (1 for none).
    pub temperature: f64,
}

/// What the forward pass writes, one `float` per row: `logp` (required) and, optionally
/// ((NULL, 0) to skip), the entropy and the log-sum-exp of the scaled logits (the GPU backward
/// pass reads the latter).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_log_softmax_outputs {
    /// `sizeof(care_log_softmax_outputs)`.
    pub struct_size: u32,
    /// `log softmax(x_i / T)[y_i]`.
    pub logp: *mut f32,
    /// `rows`.
    pub logp_len: usize,
    /// Entropy of each row's distribution, or NULL.
    pub entropy: *mut f32,
    /// 0 or `rows`.
    pub entropy_len: usize,
    /// `log sum_j exp(x_ij / T)`, or NULL.
    pub lse: *mut f32,
    /// 0 or `rows`.
    pub lse_len: usize,
}

/// What the backward pass reads besides the logits, one `float` per row: the gradients of the
/// loss with respect to `logp` and the entropy (each optional: (NULL, 0) is zero), and the
/// forward's saved `lse` and `entropy`. The GPU reads the saved values (`lse` required,
/// `entropy` with `dentropy`); the CPU reference recomputes both in `f64` from the logits, so
/// for it they are optional and only their lengths are checked.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_log_softmax_grads {
    /// `sizeof(care_log_softmax_grads)`.
    pub struct_size: u32,
    /// `dL/dlogp`, or NULL.
    pub dlogp: *const f32,
    /// 0 or `rows`.
    pub dlogp_len: usize,
    /// `dL/dentropy`, or NULL.
    pub dentropy: *const f32,
    /// 0 or `rows`.
    pub dentropy_len: usize,
    /// The forward's `lse`, or NULL (CPU only).
    pub lse: *const f32,
    /// 0 or `rows`.
    pub lse_len: usize,
    /// The forward's `entropy`, or NULL (needed by the GPU only with `dentropy`).
    pub entropy: *const f32,
    /// 0 or `rows`.
    pub entropy_len: usize,
}

/// What the fused logits-to-loss forward writes besides the loss and its statistics, one
/// `float` per row: the log-probs, the log-sum-exp (required on the GPU, whose backward pass
/// reads it; optional on the CPU) and `dL/dlogp`, which `_selective_log_softmax_backward`
/// turns into `dL/dlogits`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_logits_loss_outputs {
    /// `sizeof(care_logits_loss_outputs)`.
    pub struct_size: u32,
    /// Log-probs of the targets.
    pub logp: *mut f32,
    /// `rows`.
    pub logp_len: usize,
    /// Log-sum-exp of each row's scaled logits, or NULL (CPU only).
    pub lse: *mut f32,
    /// 0 or `rows`.
    pub lse_len: usize,
    /// `dL/dlogp`.
    pub dlogp: *mut f32,
    /// `rows`.
    pub dlogp_len: usize,
}

fn options(temperature: f64) -> Result<LogSoftmaxOptions, care_result> {
    let o = LogSoftmaxOptions { temperature };
    args::option_check("care_logits", o.check())?;
    Ok(o)
}

/// Elements a `[rows, vocab]` matrix with `stride` needs: `(rows - 1) * stride + vocab`.
fn matrix_len(rows: usize, vocab: usize, stride: usize) -> Result<usize, care_result> {
    if vocab == 0 || stride < vocab {
        return Err(crate::detail::fail(
            care_result::CARE_ERR_INVALID_ARGUMENT,
            format_args!(
                "care_logits.vocab is {vocab} and row_stride is {stride}; the vocabulary must \
                 not be empty and row_stride must be at least vocab"
            ),
        ));
    }
    matrix_need(rows, vocab, stride).ok_or_else(|| {
        crate::detail::fail(
            care_result::CARE_ERR_INVALID_ARGUMENT,
            format_args!(
                "care_logits.rows {rows} times row_stride {stride} overflows the address space"
            ),
        )
    })
}

/// `(rows - 1) * stride + vocab` (0 for no rows), `None` on overflow; writes no detail.
fn matrix_need(rows: usize, vocab: usize, stride: usize) -> Option<usize> {
    match rows {
        0 => Some(0),
        r => (r - 1).checked_mul(stride)?.checked_add(vocab),
    }
}

/// Describes a `CARE_ERR_LENGTH_MISMATCH` or `CARE_ERR_INVALID_LAYOUT` of the logits `c`
/// (nothing for other codes, or when a deeper check already wrote a detail): a logits buffer
/// shorter than its rows need, or targets or mask not one per row. Returns `code`.
fn explain_logits(code: care_result, c: &care_logits) -> care_result {
    if code != care_result::CARE_ERR_LENGTH_MISMATCH && code != care_result::CARE_ERR_INVALID_LAYOUT
    {
        return code;
    }
    let set = crate::detail::set_if_empty;
    if let Some(need) = matrix_need(c.rows, c.vocab, c.row_stride)
        && c.logits_len < need
    {
        set(format_args!(
            "care_logits.logits_len is {} but {} rows of vocab {} at row_stride {} need at \
             least (rows - 1) * row_stride + vocab = {need}",
            c.logits_len, c.rows, c.vocab, c.row_stride
        ));
    } else if c.targets_len != c.rows {
        set(format_args!(
            "care_logits.targets_len is {} but rows is {}; there is one target per row",
            c.targets_len, c.rows
        ));
    } else if !c.mask.is_null() && c.mask_len != c.rows {
        set(format_args!(
            "care_logits.mask_len is {} but rows is {}; the mask has one entry per row",
            c.mask_len, c.rows
        ));
    }
    code
}

/// [`dev`] for a per-row device buffer `name` (`rows` entries): a wrong length names it.
fn dev_row<T>(
    name: &str,
    p: *const T,
    len: usize,
    rows: usize,
    required: bool,
) -> Result<u64, care_result> {
    dev(p, len, rows, required).map_err(|e| match e {
        care_result::CARE_ERR_LENGTH_MISMATCH => row_mismatch(name, len, rows),
        e => e,
    })
}

/// A per-row output or input `name` whose length `len` is not `rows`.
fn row_mismatch(name: &str, len: usize, rows: usize) -> care_result {
    crate::args::mismatch(name, len, "care_logits.rows", rows)
}

// ---- CPU ------------------------------------------------------------------------------------

/// The checked host view of a `care_logits`.
struct HostRows<'a, T: LogProb, I: TokenId> {
    logits: Logits<'a, T>,
    targets: &'a [I],
    mask: Option<&'a [u8]>,
    opts: LogSoftmaxOptions,
}

/// A computation over host rows of any logits dtype and target type.
trait WithRows {
    type Out;
    fn run<T: LogProb, I: TokenId>(
        self,
        rows: HostRows<'_, T, I>,
    ) -> Result<Self::Out, care_result>;
}

/// # Safety
/// The pointers of `c` are NULL or valid for their lengths and hold `T` / `I` elements.
unsafe fn host_rows<'a, T: LogProb, I: TokenId>(
    c: &care_logits,
) -> Result<HostRows<'a, T, I>, care_result> {
    // SAFETY (all blocks): forwarded contract; bf16/f16 are repr(transparent) over u16.
    let x = unsafe { args::slice(c.logits.cast::<T>(), c.logits_len) }?;
    let targets = unsafe { args::slice(c.targets.cast::<I>(), c.targets_len) }?;
    let mask = unsafe { args::opt_slice(c.mask, c.mask_len) }?;
    let opts = options(c.temperature)?;
    let logits = Logits::new(x, c.rows, c.vocab, c.row_stride).map_err(map_error)?;
    Ok(HostRows {
        logits,
        targets,
        mask,
        opts,
    })
}

/// Reads `*p` and runs `f` on its rows, dispatching on the logits dtype and target type.
///
/// # Safety
/// `p` is a valid `care_logits` whose pointers are valid for their lengths.
unsafe fn with_rows<F: WithRows>(p: *const care_logits, f: F) -> Result<F::Out, care_result> {
    // SAFETY (all blocks): forwarded contract.
    let c = unsafe { args::input(p) }?;
    let dtype = dtype_arg(c.dtype)?;
    let i64t = args::flag("care_logits.targets_i64", c.targets_i64)?;
    let explain = |e| explain_logits(e, &c);
    match (dtype, i64t) {
        (Dtype::F32, false) => f
            .run(unsafe { host_rows::<f32, i32>(&c) }.map_err(explain)?)
            .map_err(explain),
        (Dtype::F32, true) => f
            .run(unsafe { host_rows::<f32, i64>(&c) }.map_err(explain)?)
            .map_err(explain),
        (Dtype::Bf16, false) => f
            .run(unsafe { host_rows::<bf16, i32>(&c) }.map_err(explain)?)
            .map_err(explain),
        (Dtype::Bf16, true) => f
            .run(unsafe { host_rows::<bf16, i64>(&c) }.map_err(explain)?)
            .map_err(explain),
        (Dtype::F16, false) => f
            .run(unsafe { host_rows::<f16, i32>(&c) }.map_err(explain)?)
            .map_err(explain),
        (Dtype::F16, true) => f
            .run(unsafe { host_rows::<f16, i64>(&c) }.map_err(explain)?)
            .map_err(explain),
    }
}

/// `src` rounded to `float` into `dst` (same length).
fn narrow(dst: &mut [f32], src: &[f64]) {
    for (o, v) in dst.iter_mut().zip(src) {
        *o = *v as f32;
    }
}

/// An optional per-row slice `name`: (NULL, 0) is `None`, else its length must be `rows`.
fn per_row<S: AsRef<[f32]>>(
    name: &str,
    s: Option<S>,
    rows: usize,
) -> Result<Option<S>, care_result> {
    match s {
        Some(v) if v.as_ref().len() != rows => Err(row_mismatch(name, v.as_ref().len(), rows)),
        s => Ok(s),
    }
}

struct Forward<'o> {
    logp: &'o mut [f32],
    entropy: Option<&'o mut [f32]>,
    lse: Option<&'o mut [f32]>,
}

impl WithRows for Forward<'_> {
    type Out = ();
    fn run<T: LogProb, I: TokenId>(self, r: HostRows<'_, T, I>) -> Result<(), care_result> {
        let n = r.logits.rows();
        if self.logp.len() != n {
            return Err(row_mismatch(
                "care_log_softmax_outputs.logp_len",
                self.logp.len(),
                n,
            ));
        }
        let entropy = per_row("care_log_softmax_outputs.entropy_len", self.entropy, n)?;
        let lse = per_row("care_log_softmax_outputs.lse_len", self.lse, n)?;
        // The core writes its f64 outputs; ours are written only once it has succeeded.
        let (mut lp, mut h, mut ls) = (
            args::working("log-probs", n, 0.0f64)?,
            args::working("entropies", n, 0.0f64)?,
            args::working("log-sum-exps", n, 0.0f64)?,
        );
        selective_log_softmax(
            &r.logits,
            r.targets,
            r.mask,
            &r.opts,
            &mut lp,
            Some(&mut h),
            Some(&mut ls),
        )
        .map_err(map_error)?;
        narrow(self.logp, &lp);
        if let Some(e) = entropy {
            narrow(e, &h);
        }
        if let Some(l) = lse {
            narrow(l, &ls);
        }
        Ok(())
    }
}

/// Selective log-softmax on the CPU (the `f64` reference, outputs rounded to `float`): for
/// every row `i`, `outputs->logp[i] = log softmax(x_i / T)[y_i]`, and the entropy and
/// log-sum-exp when asked for. On `CARE_OK` no output is NaN: `logp` is finite, or
/// `-INFINITY` for a target whose logit is `-inf`.
///
/// Errors (nothing is written): `CARE_ERR_INVALID_ARGUMENT` for a temperature that is not
/// finite or below `1 / FLT_MAX` (`1 / temperature` overflows a `float`), `vocab == 0`,
/// `row_stride < vocab`, or a counted row's target outside `0..vocab`; `CARE_ERR_NON_FINITE`
/// for a counted row (mask 1 or no mask) with a NaN or `+inf` logit or only `-inf` logits (no
/// softmax exists).
///
/// ```c
/// care_logits x = {sizeof x, CARE_DTYPE_BF16, logits, rows * V, rows, V, V,
///                  targets, rows, 1 /* int64 */, NULL, 0, 1.0};
/// care_log_softmax_outputs out = {sizeof out, logp, rows, NULL, 0, NULL, 0};
/// care_result r = care_selective_log_softmax(&x, &out);
/// ```
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_selective_log_softmax(
    logits: *const care_logits,
    outputs: *const care_log_softmax_outputs,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let o = tri!(unsafe { args::input(outputs) });
        let f = Forward {
            logp: tri!(unsafe { args::slice_mut(o.logp, o.logp_len) }),
            entropy: tri!(unsafe { args::opt_slice_mut(o.entropy, o.entropy_len) }),
            lse: tri!(unsafe { args::opt_slice_mut(o.lse, o.lse_len) }),
        };
        tri!(unsafe { with_rows(logits, f) });
        care_result::CARE_OK
    }
}

struct Backward<'o> {
    dlogp: Option<&'o [f32]>,
    dentropy: Option<&'o [f32]>,
    saved: [Option<&'o [f32]>; 2],
    dlogits: &'o mut [f32],
}

impl WithRows for Backward<'_> {
    type Out = ();
    fn run<T: LogProb, I: TokenId>(self, r: HostRows<'_, T, I>) -> Result<(), care_result> {
        let n = r.logits.rows();
        let g = per_row("care_log_softmax_grads.dlogp_len", self.dlogp, n)?;
        let e = per_row("care_log_softmax_grads.dentropy_len", self.dentropy, n)?;
        let saved = [
            "care_log_softmax_grads.lse_len",
            "care_log_softmax_grads.entropy_len",
        ];
        for (s, name) in self.saved.into_iter().zip(saved) {
            per_row(name, s, n)?;
        }
        let v = r.logits.vocab();
        if n.checked_mul(v) != Some(self.dlogits.len()) {
            return Err(crate::detail::fail(
                care_result::CARE_ERR_LENGTH_MISMATCH,
                format_args!(
                    "dlogits_len is {} but care_logits.rows {n} times vocab {v} is {}; the \
                     gradient is dense [rows, vocab]",
                    self.dlogits.len(),
                    n.saturating_mul(v)
                ),
            ));
        }
        let widen = |what: &str, v: &[f32]| -> Result<Vec<f64>, care_result> {
            let mut w = args::working(what, v.len(), 0.0f64)?;
            for (a, &b) in w.iter_mut().zip(v) {
                *a = f64::from(b);
            }
            Ok(w)
        };
        let g64: Vec<f64> = match g {
            Some(g) => widen("the log-prob gradient", g)?,
            None => args::working("the log-prob gradient", n, 0.0)?,
        };
        let e64: Option<Vec<f64>> = match e {
            Some(e) => Some(widen("the entropy gradient", e)?),
            None => None,
        };
        let mut d = args::working("the logits gradient", self.dlogits.len(), 0.0f64)?;
        selective_log_softmax_backward(
            &r.logits,
            r.targets,
            r.mask,
            &r.opts,
            &g64,
            e64.as_deref(),
            &mut d,
        )
        .map_err(map_error)?;
        narrow(self.dlogits, &d);
        Ok(())
    }
}

/// Backward of `care_selective_log_softmax` on the CPU: `dlogits_out[rows * vocab]` (dense,
/// `float`) = `dL/dx` from `grads` (see `care_log_softmax_grads`). Masked rows get exact
/// zeros. Errors as `care_selective_log_softmax`; `dlogits_len != rows * vocab` is
/// `CARE_ERR_LENGTH_MISMATCH`; a NaN or infinite `dlogp` or `dentropy` on a counted row is
/// `CARE_ERR_NON_FINITE`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_selective_log_softmax_backward(
    logits: *const care_logits,
    grads: *const care_log_softmax_grads,
    dlogits_out: *mut f32,
    dlogits_len: usize,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let g = tri!(unsafe { args::input(grads) });
        let b = Backward {
            dlogp: tri!(unsafe { args::opt_slice(g.dlogp, g.dlogp_len) }),
            dentropy: tri!(unsafe { args::opt_slice(g.dentropy, g.dentropy_len) }),
            saved: [
                tri!(unsafe { args::opt_slice(g.lse, g.lse_len) }),
                tri!(unsafe { args::opt_slice(g.entropy, g.entropy_len) }),
            ],
            dlogits: tri!(unsafe { args::slice_mut(dlogits_out, dlogits_len) }),
        };
        tri!(unsafe { with_rows(logits, b) });
        care_result::CARE_OK
    }
}

/// The loss inputs of the fused logits paths, checked: `logp` and `mask` must be (NULL, 0)
/// (the log-probs are computed, the mask is the logits' row mask), so must `logp_rollout` (no
/// rollout correction on these paths), and the log-prob dtype is `float`, else
/// `CARE_ERR_INVALID_ARGUMENT`.
///
/// # Safety
/// As for [`args::input`].
unsafe fn logits_loss_inputs(p: *const care_loss_inputs) -> Result<care_loss_inputs, care_result> {
    // SAFETY: forwarded contract.
    let c = unsafe { args::input(p) }?;
    let refuse = |why: core::fmt::Arguments<'_>| {
        Err(crate::detail::fail(
            care_result::CARE_ERR_INVALID_ARGUMENT,
            why,
        ))
    };
    if !c.logp.is_null() || c.logp_len != 0 {
        return refuse(format_args!(
            "care_loss_inputs.logp must be (NULL, 0) on the fused logits path, which computes \
             the log-probs from the logits"
        ));
    }
    if !c.mask.is_null() || c.mask_len != 0 {
        return refuse(format_args!(
            "care_loss_inputs.mask must be (NULL, 0) on the fused logits path; pass the mask in \
             care_logits.mask"
        ));
    }
    // The fused paths have no rollout correction (refused rather than ignored).
    if !c.logp_rollout.is_null() || c.logp_rollout_len != 0 {
        return refuse(format_args!(
            "care_loss_inputs.logp_rollout must be (NULL, 0): the fused logits path has no \
             rollout correction; compute the log-probs and call care_policy_loss instead"
        ));
    }
    if dtype_arg(c.dtype)? != Dtype::F32 {
        return refuse(format_args!(
            "care_loss_inputs.dtype must be CARE_DTYPE_F32 on the fused logits path (logp_old \
             and logp_ref are float there)"
        ));
    }
    Ok(c)
}

struct LogitsLoss<'o> {
    /// The caller's struct, for the detail of a length fault.
    inputs: care_loss_inputs,
    logp_old: Option<Vec<f64>>,
    logp_ref: Option<Vec<f64>>,
    seq_offsets: &'o [u32],
    advantages: Advantages<'o>,
    opts: LossOptions,
    logp: &'o mut [f32],
    lse: Option<&'o mut [f32]>,
    dlogp: &'o mut [f32],
}

impl WithRows for LogitsLoss<'_> {
    type Out = LossOutput;
    fn run<T: LogProb, I: TokenId>(self, r: HostRows<'_, T, I>) -> Result<LossOutput, care_result> {
        let n = r.logits.rows();
        if self.logp.len() != n {
            return Err(row_mismatch(
                "care_logits_loss_outputs.logp_len",
                self.logp.len(),
                n,
            ));
        }
        if self.dlogp.len() != n {
            return Err(row_mismatch(
                "care_logits_loss_outputs.dlogp_len",
                self.dlogp.len(),
                n,
            ));
        }
        let lse = per_row("care_logits_loss_outputs.lse_len", self.lse, n)?;
        // As care_core::logsoftmax::logits_policy_loss up to dL/dlogp: the backward pass is a
        // separate call, as on the GPU.
        let (mut lp, mut ls) = (
            args::working("log-probs", n, 0.0f64)?,
            args::working("log-sum-exps", n, 0.0f64)?,
        );
        selective_log_softmax(
            &r.logits,
            r.targets,
            r.mask,
            &r.opts,
            &mut lp,
            None,
            Some(&mut ls),
        )
        .map_err(map_error)?;
        let inputs = LossInputs {
            logp: &lp[..],
            logp_old: self.logp_old.as_deref(),
            logp_ref: self.logp_ref.as_deref(),
            seq_offsets: self.seq_offsets,
            mask: r.mask,
            advantages: self.advantages,
            // Refused by logits_loss_inputs (the fused paths have no rollout correction yet).
            logp_rollout: None,
        };
        let mut g = args::working("the log-prob gradient", n, 0.0f32)?;
        let out = care_core::grpo::policy_loss(&inputs, &self.opts, &mut g).map_err(|e| {
            let offs = Some(self.seq_offsets);
            loss::explain(map_error(e), &self.inputs, n, "care_logits.rows", &[], offs)
        })?;
        narrow(self.logp, &lp);
        if let Some(l) = lse {
            narrow(l, &ls);
        }
        self.dlogp.copy_from_slice(&g);
        Ok(out)
    }
}

/// The fused path from logits to the policy loss (SPEC §10, token layout over the rows) on the
/// CPU, forward half, as `care_gpu_logits_policy_loss`: the selective log-softmax of `logits`
/// gives `outputs->logp` (and `lse`), the loss of `inputs` on them gives `*loss_out`, the
/// statistics (`stats_out`, optional) and `outputs->dlogp`; then
/// `care_selective_log_softmax_backward` with `dlogp` gives `dL/dlogits`. `inputs->logp` and
/// `inputs->mask` are (NULL, 0) (the log-probs are computed here; the logits' mask is the token
/// mask), `inputs->dtype` is `CARE_DTYPE_F32` (`logp_old`, `logp_ref` are `float`), and
/// `T = logits->rows`; otherwise `CARE_ERR_INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_logits_policy_loss(
    logits: *const care_logits,
    inputs: *const care_loss_inputs,
    options: *const care_loss_options,
    outputs: *const care_logits_loss_outputs,
    loss_out: *mut f64,
    stats_out: *mut care_loss_stats,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let c = tri!(unsafe { logits_loss_inputs(inputs) });
        let widen = |what: &str, v: Option<&[f32]>| -> Result<Option<Vec<f64>>, care_result> {
            let Some(v) = v else { return Ok(None) };
            let mut w = args::working(what, v.len(), 0.0f64)?;
            for (a, &b) in w.iter_mut().zip(v) {
                *a = f64::from(b);
            }
            Ok(Some(w))
        };
        let logp_old = tri!(unsafe { args::opt_slice(c.logp_old.cast::<f32>(), c.logp_old_len) });
        let logp_ref = tri!(unsafe { args::opt_slice(c.logp_ref.cast::<f32>(), c.logp_ref_len) });
        let adv = tri!(unsafe { args::slice(c.advantages, c.advantages_len) });
        let opts = tri!(unsafe { loss::read_options(options) });
        let o = tri!(unsafe { args::input(outputs) });
        let loss_out = tri!(Out::new(loss_out));
        let stats_out = tri!(Out::optional(stats_out));
        let f = LogitsLoss {
            inputs: c,
            logp_old: tri!(widen("logp_old", logp_old)),
            logp_ref: tri!(widen("logp_ref", logp_ref)),
            seq_offsets: tri!(unsafe { args::slice(c.seq_offsets, c.seq_offsets_len) }),
            advantages: tri!(loss::advantages(c.advantages_kind, adv)),
            opts,
            logp: tri!(unsafe { args::slice_mut(o.logp, o.logp_len) }),
            lse: tri!(unsafe { args::opt_slice_mut(o.lse, o.lse_len) }),
            dlogp: tri!(unsafe { args::slice_mut(o.dlogp, o.dlogp_len) }),
        };
        let out = tri!(unsafe { with_rows(logits, f) });
        unsafe { loss_out.write(out.loss) };
        if let Some(s) = stats_out {
            unsafe { s.write(loss::stats_to_c(&out.stats)) };
        }
        care_result::CARE_OK
    }
}

// ---- GPU ------------------------------------------------------------------------------------
/// A device matrix of `rows` rows of `vocab` elements of `dtype`, `stride` apart, at `p` with
/// `len` elements readable: the address, after the checks the CPU makes on host rows (shape,
/// then length), plus NULL and the dtype's alignment.
fn device_matrix(
    p: *const c_void,
    len: usize,
    dtype: Dtype,
    rows: usize,
    vocab: usize,
    stride: usize,
) -> Result<u64, care_result> {
    let need = matrix_len(rows, vocab, stride)?;
    if p.is_null() && len != 0 {
        return Err(care_result::CARE_ERR_NULL_POINTER);
    }
    if len < need {
        return Err(care_result::CARE_ERR_LENGTH_MISMATCH);
    }
    if !(p as usize).is_multiple_of(dtype.size()) {
        return Err(care_result::CARE_ERR_INVALID_ARGUMENT);
    }
    Ok(p as u64)
}

/// The checked device view of a `care_logits` and its temperature.
///
/// # Safety
/// As for [`args::input`].
unsafe fn device_rows(
    p: *const care_logits,
) -> Result<(LogitsBuffers, LogSoftmaxOptions), care_result> {
    // SAFETY: forwarded contract.
    let c = unsafe { args::input(p) }?;
    let dtype = dtype_arg(c.dtype)?;
    let i64t = args::flag("care_logits.targets_i64", c.targets_i64)?;
    let explain = |e| explain_logits(e, &c);
    let logits = device_matrix(c.logits, c.logits_len, dtype, c.rows, c.vocab, c.row_stride)
        .map_err(explain)?;
    let vocab = u32::try_from(c.vocab).map_err(|_| care_result::CARE_ERR_INVALID_ARGUMENT)?;
    let targets = if i64t {
        dev(c.targets.cast::<i64>(), c.targets_len, c.rows, true)
    } else {
        dev(c.targets.cast::<i32>(), c.targets_len, c.rows, true)
    }
    .map_err(explain)?;
    let rows = LogitsBuffers {
        dtype,
        logits,
        rows: c.rows as u64,
        vocab,
        stride: c.row_stride as u64,
        targets,
        targets_i64: i64t,
        mask: dev(c.mask, c.mask_len, c.rows, false).map_err(explain)?,
    };
    Ok((rows, options(c.temperature)?))
}

/// Selective log-softmax on the GPU, asynchronously on `launch->stream`: as
/// `care_selective_log_softmax` (the same structs, device memory; any row stride `>= vocab`
/// and any alignment of the element type, 16-byte aligned rows being fastest) within the
/// documented tolerance. What the CPU function refuses cannot stop the kernel: a counted row's
/// target outside `0..vocab` (its `logp` is NaN) or a counted row without a softmax (its
/// outputs are not finite); `care_gpu_selective_log_softmax_status` reports both.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_gpu_selective_log_softmax(
    logits: *const care_logits,
    outputs: *const care_log_softmax_outputs,
    launch: *const care_gpu_launch,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let (r, opts) = tri!(unsafe { device_rows(logits) });
        let o = tri!(unsafe { args::input(outputs) });
        let n = r.rows as usize;
        let logp = tri!(dev_row("care_log_softmax_outputs.logp_len", o.logp.cast_const(), o.logp_len, n, true));
        let entropy = tri!(dev_row("care_log_softmax_outputs.entropy_len", o.entropy.cast_const(), o.entropy_len, n, false));
        let lse = tri!(dev_row("care_log_softmax_outputs.lse_len", o.lse.cast_const(), o.lse_len, n, false));
        let l = tri!(unsafe { read_launch(launch, true) });
        let out = LogSoftmaxOutputs { logp, entropy, lse, status: l.workspace };
        let b = tri!(unsafe { backend(l.stream, l.workspace) });
        // SAFETY: every address is caller device memory of the documented, cross-checked size.
        match unsafe { log_softmax_forward(&b, &r, &out, &opts, Tuning::default()) } {
            Ok(()) => care_result::CARE_OK,
            Err(e) => kernel_code(e),
        }
    }
}

/// Synchronizes `launch->stream` and reads the status that `care_gpu_selective_log_softmax` or
/// `care_gpu_logits_policy_loss` left in `launch->workspace`: `CARE_OK`,
/// `CARE_ERR_INVALID_ARGUMENT` when a counted row's target was outside `0..vocab`, else
/// `CARE_ERR_NON_FINITE` when a counted row had no softmax (a NaN or `+inf` logit, one whose
/// scaled value overflowed, or every logit `-inf`), as `care_selective_log_softmax` refuses it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_gpu_selective_log_softmax_status(
    launch: *const care_gpu_launch,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY: forwarded contract.
        let word = tri!(unsafe { crate::gpu::read_status(launch) });
        match log_softmax_status(word) {
            Ok(()) => care_result::CARE_OK,
            Err(e) => map_error(e),
        }
    }
}

/// Backward of `care_gpu_selective_log_softmax`, asynchronously on `launch->stream`: writes
/// `d_dlogits_out` (the logits' dtype; `rows` rows `dlogits_row_stride` elements apart,
/// `dlogits_len >= (rows - 1) * dlogits_row_stride + vocab`) =
/// `(g / T) * (onehot - softmax) - (e / T) * p * (log p + H)` from `grads` (its `lse` is
/// required, its `entropy` with `dentropy`). Pass `d_dlogits_out = logits->logits` with the same
/// stride to overwrite the logits in place. Masked rows get zeros. Uses no workspace.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_gpu_selective_log_softmax_backward(
    logits: *const care_logits,
    grads: *const care_log_softmax_grads,
    d_dlogits_out: *mut c_void,
    dlogits_len: usize,
    dlogits_row_stride: usize,
    launch: *const care_gpu_launch,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let (r, opts) = tri!(unsafe { device_rows(logits) });
        let n = r.rows as usize;
        let g = tri!(unsafe { args::input(grads) });
        let dlogits = tri!(device_matrix(d_dlogits_out.cast_const(), dlogits_len, r.dtype, n,
                                         r.vocab as usize, dlogits_row_stride)
            .map_err(|e| match e {
                care_result::CARE_ERR_LENGTH_MISMATCH => crate::detail::fail(e, format_args!(
                    "dlogits_len is {dlogits_len} but {n} rows of vocab {} at \
                     dlogits_row_stride {dlogits_row_stride} need at least (rows - 1) * \
                     row_stride + vocab", r.vocab)),
                e => e,
            }));
        let grads = LogSoftmaxGrads {
            lse: tri!(dev_row("care_log_softmax_grads.lse_len", g.lse, g.lse_len, n, true)),
            entropy: tri!(dev_row("care_log_softmax_grads.entropy_len", g.entropy, g.entropy_len, n, false)),
            dlogp: tri!(dev_row("care_log_softmax_grads.dlogp_len", g.dlogp, g.dlogp_len, n, false)),
            dentropy: tri!(dev_row("care_log_softmax_grads.dentropy_len", g.dentropy, g.dentropy_len, n, false)),
            dlogits,
            dstride: dlogits_row_stride as u64,
        };
        if grads.dentropy != 0 && grads.entropy == 0 {
            return care_result::CARE_ERR_INVALID_ARGUMENT; // the entropy term needs the entropy
        }
        let l = tri!(unsafe { read_launch(launch, false) });
        if n == 0 {
            return care_result::CARE_OK;
        }
        let b = tri!(unsafe { backend(l.stream, grads.lse) });
        // SAFETY: every address is caller device memory of the documented, cross-checked size.
        match unsafe { log_softmax_backward(&b, &r, &grads, &opts, Tuning::default()) } {
            Ok(()) => care_result::CARE_OK,
            Err(e) => kernel_code(e),
        }
    }
}

/// The fused path from logits to the policy loss on the GPU, forward half, asynchronously on
/// `launch->stream`: as `care_logits_policy_loss` (the same structs, device memory; `lse` is
/// required), except that the loss statistics are added into the device accumulator `d_stats`
/// (`CARE_GPU_LOSS_STATS_BYTES`, see `care_gpu_loss_stats_reset` / `_read`; the loss is
/// `stats.loss`; (NULL, 0) to skip). Then `care_gpu_selective_log_softmax_backward` with
/// `outputs->dlogp` and `outputs->lse` (in place over the logits if they are not needed any
/// more) gives `dL/dlogits`. Bad targets are reported by
/// `care_gpu_selective_log_softmax_status`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_gpu_logits_policy_loss(
    logits: *const care_logits,
    inputs: *const care_loss_inputs,
    options: *const care_loss_options,
    outputs: *const care_logits_loss_outputs,
    d_stats: *mut c_void,
    stats_len: usize,
    launch: *const care_gpu_launch,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let (r, opts) = tri!(unsafe { device_rows(logits) });
        let n = r.rows as usize;
        let c = tri!(unsafe { logits_loss_inputs(inputs) });
        let d = tri!(device_loss(&c, n, false));
        let o = tri!(unsafe { args::input(outputs) });
        let stats = tri!(dev(d_stats.cast_const(), stats_len, CARE_GPU_LOSS_STATS_BYTES, false));
        let loss_opts = tri!(unsafe { loss::read_options(options) });
        if care_kernels::selects_by_covariance(&loss_opts) {
            // Before a driver is needed.
            return crate::detail::fail(
                care_result::CARE_ERR_INVALID_ARGUMENT,
                format_args!(
                    "the fused logits path has a fixed workspace and does not run the covariance \
                     selection of {}; call care_gpu_selective_log_softmax, then \
                     care_gpu_policy_loss",
                    loss_opts.policy_loss
                ),
            );
        }
        let l = tri!(unsafe { read_launch(launch, true) });
        let buf = LogitsLossBuffers {
            logp: tri!(dev_row("care_logits_loss_outputs.logp_len", o.logp.cast_const(), o.logp_len, n, true)),
            lse: tri!(dev_row("care_logits_loss_outputs.lse_len", o.lse.cast_const(), o.lse_len, n, true)),
            dlogp: tri!(dev_row("care_logits_loss_outputs.dlogp_len", o.dlogp.cast_const(), o.dlogp_len, n, true)),
            logp_old: d.logp_old,
            logp_ref: d.logp_ref,
            adv: d.adv,
            adv_per_token: d.per_token,
            seq_offsets: d.seq_offsets,
            n_seq: d.n_seq,
            max_seq_len: d.max_seq_len,
            stats,
            workspace: l.workspace,
        };
        let b = tri!(unsafe { backend(l.stream, l.workspace) });
        // SAFETY: every address is caller device memory of the documented, cross-checked size.
        match unsafe { logits_loss_forward(&b, &r, &buf, &opts, &loss_opts, Tuning::default()) } {
            Ok(()) => care_result::CARE_OK,
            Err(e) => kernel_code(e),
        }
    }
}

/// The device outputs of `care_gpu_logits_policy_loss_fused`: the gradient with respect to the
/// logits (required) and, each optional ((NULL, 0) to skip), the log-probs, the log-sum-exp
/// and the loss-statistics accumulator.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_gpu_fused_loss_outputs {
    /// `sizeof(care_gpu_fused_loss_outputs)`.
    pub struct_size: u32,
    /// `dL/dlogits` in the logits' dtype, `rows` rows `dlogits_row_stride` elements apart; may
    /// be `logits->logits` itself (with the same stride) to overwrite the logits in place.
    pub dlogits: *mut c_void,
    /// Elements writable at `dlogits`: at least `(rows - 1) * dlogits_row_stride + vocab`.
    pub dlogits_len: usize,
    /// Elements between two gradient rows (`>= vocab`).
    pub dlogits_row_stride: usize,
    /// Log-probs of the targets (`float[rows]`), or NULL.
    pub logp: *mut f32,
    /// 0 or `rows`.
    pub logp_len: usize,
    /// Log-sum-exp of each row's scaled logits (`float[rows]`), or NULL.
    pub lse: *mut f32,
    /// 0 or `rows`.
    pub lse_len: usize,
    /// The loss-statistics accumulator (`care_gpu_loss_stats_reset` / `_read`; the loss is
    /// `stats.loss`), or NULL.
    pub stats: *mut c_void,
    /// 0 or `CARE_GPU_LOSS_STATS_BYTES`.
    pub stats_len: usize,
}

/// Whether `care_gpu_logits_policy_loss_fused` computes the loss of `options`, into
/// `*supported_out` (1 or 0): the token-local losses (the token-level ratio with the clipped
/// ratio, the dual clip, CISPO, SAPO or GPG, any KL estimator and aggregation) without the
/// rollout correction and without bypass mode. Needs no GPU. `options` NULL: the defaults.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_logits_policy_loss_fused_supported(
    options: *const care_loss_options,
    supported_out: *mut u32,
) -> care_result {
    ffi_panic_boundary! {
        let out = tri!(Out::new(supported_out));
        // SAFETY: forwarded contract of the entry point.
        let opts = tri!(unsafe { loss::read_options(options) });
        // SAFETY: `supported_out` is valid for a write (contract; NULL and alignment checked).
        unsafe { out.write(u32::from(fused_supports(&opts))) };
        care_result::CARE_OK
    }
}

/// The one-pass path from logits to the policy loss and its gradient on the GPU, asynchronously
/// on `launch->stream`, for the token-local losses (`care_logits_policy_loss_fused_supported`):
/// each row of `logits` is read once for its log-sum-exp, the target's log-prob, the loss term
/// and `dL/dlogp`, and `dL/dlogits` is written at once (`outputs->dlogits`; in place over the
/// logits if wanted): the `logp`, `lse` and `dlogits` of `care_gpu_logits_policy_loss`
/// followed by `care_gpu_selective_log_softmax_backward` (the three-kernel path) for
/// `dL/dloss = 1`, within the documented tolerance (the two reduce a row over different block
/// sizes; at the same block size they are equal bit for bit), and its statistics added into
/// `outputs->stats`. Inputs as `care_gpu_logits_policy_loss`
/// (`inputs->logp`, `mask` and `logp_rollout` are (NULL, 0), `dtype` is `CARE_DTYPE_F32`);
/// options it does not support are `CARE_ERR_INVALID_ARGUMENT` before any launch (call the
/// three-kernel path for them). Bad targets and rows without a softmax are reported by
/// `care_gpu_selective_log_softmax_status`. The workspace is `CARE_GPU_WORKSPACE_BYTES`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_gpu_logits_policy_loss_fused(
    logits: *const care_logits,
    inputs: *const care_loss_inputs,
    options: *const care_loss_options,
    outputs: *const care_gpu_fused_loss_outputs,
    launch: *const care_gpu_launch,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let (r, opts) = tri!(unsafe { device_rows(logits) });
        let n = r.rows as usize;
        let c = tri!(unsafe { logits_loss_inputs(inputs) });
        let d = tri!(device_loss(&c, n, false));
        let o = tri!(unsafe { args::input(outputs) });
        let dlogits = tri!(device_matrix(o.dlogits.cast_const(), o.dlogits_len, r.dtype, n,
                                         r.vocab as usize, o.dlogits_row_stride)
            .map_err(|e| match e {
                care_result::CARE_ERR_LENGTH_MISMATCH => crate::detail::fail(e, format_args!(
                    "care_gpu_fused_loss_outputs.dlogits_len is {} but {n} rows of vocab {} at \
                     dlogits_row_stride {} need at least (rows - 1) * row_stride + vocab",
                    o.dlogits_len, r.vocab, o.dlogits_row_stride)),
                e => e,
            }));
        if dlogits == r.logits && o.dlogits_row_stride as u64 != r.stride {
            return crate::detail::fail(
                care_result::CARE_ERR_INVALID_ARGUMENT,
                format_args!(
                    "care_gpu_fused_loss_outputs.dlogits is the logits but dlogits_row_stride {} \
                     is not care_logits.row_stride {}; in place, the gradient takes the logits' \
                     rows",
                    o.dlogits_row_stride, r.stride
                ),
            );
        }
        let logp = tri!(dev_row("care_gpu_fused_loss_outputs.logp_len", o.logp.cast_const(), o.logp_len, n, false));
        let lse = tri!(dev_row("care_gpu_fused_loss_outputs.lse_len", o.lse.cast_const(), o.lse_len, n, false));
        let stats = tri!(dev(o.stats.cast_const(), o.stats_len, CARE_GPU_LOSS_STATS_BYTES, false));
        let loss_opts = tri!(unsafe { loss::read_options(options) });
        if !fused_supports(&loss_opts) {
            // Before a driver is needed.
            return crate::detail::fail(
                care_result::CARE_ERR_INVALID_ARGUMENT,
                format_args!(
                    "the one-pass path computes token-local losses only (ratio_level token, \
                     policy_loss clip, cispo, sapo or gpg, no rollout correction, bypass off); \
                     these options ({} at ratio level {}) need whole sequences first: call \
                     care_gpu_logits_policy_loss, then care_gpu_selective_log_softmax_backward",
                    loss_opts.policy_loss, loss_opts.ratio_level
                ),
            );
        }
        let l = tri!(unsafe { read_launch(launch, true) });
        let buf = FusedLossBuffers {
            logp,
            lse,
            dlogits,
            dstride: o.dlogits_row_stride as u64,
            logp_old: d.logp_old,
            logp_ref: d.logp_ref,
            adv: d.adv,
            adv_per_token: d.per_token,
            seq_offsets: d.seq_offsets,
            n_seq: d.n_seq,
            stats,
            workspace: l.workspace,
        };
        let b = tri!(unsafe { backend(l.stream, l.workspace) });
        // SAFETY: every address is caller device memory of the documented, cross-checked size.
        match unsafe { logits_loss_fused(&b, &r, &buf, &opts, &loss_opts, Tuning::default()) } {
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

    fn rows(x: &[u16], y: &[i64]) -> care_logits {
        care_logits {
            struct_size: size_of::<care_logits>() as u32,
            dtype: loss::care_dtype::CARE_DTYPE_BF16 as u32,
            logits: x.as_ptr().cast(),
            logits_len: 7,
            rows: 2,
            vocab: 3,
            row_stride: 4,
            targets: y.as_ptr().cast(),
            targets_len: y.len(),
            targets_i64: 1,
            mask: null(),
            mask_len: 0,
            temperature: 0.6,
        }
    }

    #[test]
    fn cpu_forward_and_backward_match_the_reference() {
        // Two rows of V = 3, stride 4, bf16 logits; i64 targets; temperature 0.6.
        let x: Vec<u16> = [1.0f32, -2.0, 0.5, 9.0, 0.0, 0.0, 3.0, 9.0]
            .iter()
            .map(|&v| bf16::from_f32(v).to_bits())
            .collect();
        let y = [2i64, 1];
        let (mut lp, mut h, mut lse) = ([0f32; 2], [0f32; 2], [0f32; 2]);
        let c = rows(&x, &y);
        let out = care_log_softmax_outputs {
            struct_size: size_of::<care_log_softmax_outputs>() as u32,
            logp: lp.as_mut_ptr(),
            logp_len: 2,
            entropy: h.as_mut_ptr(),
            entropy_len: 2,
            lse: lse.as_mut_ptr(),
            lse_len: 2,
        };
        // SAFETY: host buffers of the given lengths.
        assert_eq!(
            unsafe { care_selective_log_softmax(&c, &out) },
            care_result::CARE_OK
        );
        let xb: Vec<bf16> = x.iter().map(|&b| bf16::from_bits(b)).collect();
        let l = Logits::new(&xb[..], 2, 3, 4).unwrap();
        let (mut want, mut want_h, mut want_lse) = ([0f64; 2], [0f64; 2], [0f64; 2]);
        let o = LogSoftmaxOptions { temperature: 0.6 };
        selective_log_softmax(
            &l,
            &y,
            None,
            &o,
            &mut want,
            Some(&mut want_h),
            Some(&mut want_lse),
        )
        .unwrap();
        let f = |v: [f64; 2]| [v[0] as f32, v[1] as f32];
        assert_eq!((lp, h, lse), (f(want), f(want_h), f(want_lse)));

        let g = [1.0f32, -0.5];
        let mut d = [f32::NAN; 6];
        let grads = care_log_softmax_grads {
            struct_size: size_of::<care_log_softmax_grads>() as u32,
            dlogp: g.as_ptr(),
            dlogp_len: 2,
            dentropy: null(),
            dentropy_len: 0,
            lse: null(),
            lse_len: 0,
            entropy: null(),
            entropy_len: 0,
        };
        // SAFETY: as above.
        let r = unsafe { care_selective_log_softmax_backward(&c, &grads, d.as_mut_ptr(), 6) };
        assert_eq!(r, care_result::CARE_OK);
        assert!(d.iter().all(|v| v.is_finite()));
        // Softmax gradients of each row sum to 0.
        assert!((d[0] + d[1] + d[2]).abs() < 1e-6 && (d[3] + d[4] + d[5]).abs() < 1e-6);
    }

    #[test]
    fn cpu_argument_errors() {
        let x = [0u16; 8];
        let mut lp = [7f32; 2];
        let out = care_log_softmax_outputs {
            struct_size: size_of::<care_log_softmax_outputs>() as u32,
            logp: lp.as_mut_ptr(),
            logp_len: 2,
            entropy: null_mut(),
            entropy_len: 0,
            lse: null_mut(),
            lse_len: 0,
        };
        let call = |f: &dyn Fn(&mut care_logits), y: &[i64]| {
            let mut c = rows(&x, y);
            f(&mut c);
            // SAFETY: host buffers of the given lengths (or NULL with length 0).
            unsafe { care_selective_log_softmax(&c, &out) }
        };
        use care_result::*;
        assert_eq!(
            call(&|_| {}, &[0, 5]),
            CARE_ERR_INVALID_ARGUMENT,
            "target 5"
        );
        assert_eq!(call(&|c| c.dtype = 3, &[0, 0]), CARE_ERR_INVALID_ARGUMENT);
        assert_eq!(call(&|c| c.targets_i64 = 2, &[0, 0]), CARE_ERR_INVALID_BOOL);
        assert_eq!(
            call(&|c| c.temperature = 0.0, &[0, 0]),
            CARE_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            call(&|c| c.vocab = 5, &[0, 0]),
            CARE_ERR_INVALID_ARGUMENT,
            "stride < V"
        );
        assert_eq!(
            call(&|c| c.logits_len = 6, &[0, 0]),
            CARE_ERR_LENGTH_MISMATCH
        );
        assert_eq!(call(&|_| {}, &[0]), CARE_ERR_LENGTH_MISMATCH);
        assert_eq!(lp, [7.0; 2], "nothing written on failure");
        assert_eq!(call(&|_| {}, &[0, 1]), CARE_OK);
    }

    #[test]
    fn gpu_without_a_driver_is_unavailable_after_the_argument_checks() {
        // 16-byte aligned, CARE_GPU_WORKSPACE_BYTES long.
        let ws = vec![0u128; CARE_GPU_WORKSPACE_BYTES / 16];
        // Fake (aligned, non-NULL) device addresses: the call must stop before touching them.
        let p = 0x1000usize as *mut f32;
        let mut c = rows(&[], &[]);
        c.logits = p.cast_const().cast();
        c.targets = p.cast_const().cast();
        c.targets_len = 2;
        c.logits_len = 7;
        let out = care_log_softmax_outputs {
            struct_size: size_of::<care_log_softmax_outputs>() as u32,
            logp: p,
            logp_len: 2,
            entropy: null_mut(),
            entropy_len: 0,
            lse: null_mut(),
            lse_len: 0,
        };
        let mut launch = care_gpu_launch {
            struct_size: size_of::<care_gpu_launch>() as u32,
            stream: null_mut(),
            workspace: ws.as_ptr().cast_mut().cast(),
            workspace_len: CARE_GPU_WORKSPACE_BYTES,
        };
        // SAFETY: nothing is dereferenced before the driver check, which fails here.
        unsafe {
            launch.workspace_len = CARE_GPU_WORKSPACE_BYTES - 16;
            assert_eq!(
                care_gpu_selective_log_softmax(&c, &out, &launch),
                care_result::CARE_ERR_BUFFER_TOO_SMALL
            );
            launch.workspace_len = CARE_GPU_WORKSPACE_BYTES;
            c.row_stride = 2;
            assert_eq!(
                care_gpu_selective_log_softmax(&c, &out, &launch),
                care_result::CARE_ERR_INVALID_ARGUMENT,
                "stride < vocab"
            );
            c.row_stride = 4;
            if !care_kernels::cuda::driver_available() {
                assert_eq!(
                    care_gpu_selective_log_softmax(&c, &out, &launch),
                    care_result::CARE_ERR_CUDA_UNAVAILABLE
                );
            }
        }
    }
}
