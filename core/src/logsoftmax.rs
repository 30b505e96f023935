//! Selective log-softmax: per-token log-probs (and entropy) straight from logits, with the
//! backward pass, as the `f64` CPU reference of the fused CUDA kernel
//! (`kernels/cuda/logsoftmax.cu`).
//!
//! For every row `i` of a row-major logits matrix `x[N, V]` (row stride `>= V`), with target id
//! `y_i` and sampling temperature `T`:
//!
//! * `z_j = x_j / T`, `lse_i = log sum_j exp(z_j)`, `logp_i = z_{y_i} - lse_i`,
//! * `p_j = exp(z_j - lse_i)`, `H_i = -sum_j p_j log p_j = lse_i - sum_j p_j z_j`,
//! * backward, from `g_i = dL/dlogp_i` and `e_i = dL/dH_i`:
//!   `dL/dx_j = (1/T) * (g_i * ([j = y_i] - p_j) - e_i * p_j * (log p_j + H_i))`.
//!
//! Edge cases:
//!
//! * A `-inf` logit (a vocabulary mask) has `p_j = 0` and contributes nothing, not even to the
//!   entropy (`0 * log 0 = 0`); if the target's logit is `-inf`, `logp = -inf`.
//! * Inputs without a defined softmax are errors, never NaN on success (checked on every
//!   counted row before any output is written): a NaN or `+inf` logit, a row whose logits are
//!   all `-inf` (no token has any probability), or a finite logit whose scaled value overflows
//!   to `+inf` (for the kernel dtypes, as the kernels scale it: `x * f32(1 / T) * log2(e)` in
//!   `f32`) give [`Error::NonFinite`]; a finite logit scaled to `-inf` has probability 0; a temperature that is not finite, not positive, or so small that
//!   the kernels' scale `log2(e) / T` exceeds the `f32` range (`T` below about `4.24e-39`)
//!   gives [`Error::InvalidArgument`]. The backward pass
//!   also refuses a non-finite `dL/dlogp` or `dL/dH` on a counted row ([`Error::NonFinite`]).
//!   [`row_lse_entropy`] itself, the unchecked per-row math, still returns NaN for such rows.
//! * A row with token mask 0 is not read at all: `logp = entropy = lse = 0` and its gradient
//!   row is exactly 0 (padding rows may hold anything).
//! * A target outside `0..V` on a counted row is an error here ([`Error::InvalidArgument`],
//!   reported before any output is written); the kernel, which cannot refuse, writes a NaN
//!   log-prob for the row and raises a status bit.
//! * `V = 1`: `logp = 0` and `entropy = 0` for any finite logit.
//!
//! Everything accumulates in `f64` and nothing allocates: outputs go into caller slices.

use crate::error::{InvalidOption, domain};
use crate::grpo::{LogProb, LossInputs, LossOptions, LossOutput, policy_loss};
use crate::{Error, Result};

mod sealed {
    pub trait Sealed {}
    impl Sealed for i32 {}
    impl Sealed for i64 {}
}

/// A target token id type: `i32` or `i64` (PyTorch's `int32`/`int64` index tensors). Sealed.
pub trait TokenId: Copy + sealed::Sealed {
    /// The dtype's name as the C ABI spells it.
    const NAME: &'static str;

    /// The id as a vocabulary index, or `None` if it is outside `0..vocab`.
    fn index(self, vocab: usize) -> Option<usize>;
}

impl TokenId for i32 {
    const NAME: &'static str = "i32";
    fn index(self, vocab: usize) -> Option<usize> {
        usize::try_from(self).ok().filter(|&i| i < vocab)
    }
}

impl TokenId for i64 {
    const NAME: &'static str = "i64";
    fn index(self, vocab: usize) -> Option<usize> {
        usize::try_from(self).ok().filter(|&i| i < vocab)
    }
}

/// A row-major logits matrix `[rows, vocab]` whose rows start `row_stride` elements apart
/// (a `[B, L, V]` tensor sliced to drop its last position is `rows = B*L'`, `row_stride = V`
/// only if contiguous; any stride `>= vocab` works).
#[derive(Clone, Copy, Debug)]
pub struct Logits<'a, T: LogProb> {
    data: &'a [T],
    rows: usize,
    vocab: usize,
    row_stride: usize,
}

impl<'a, T: LogProb> Logits<'a, T> {
    /// Checks the shape against the data.
    ///
    /// Errors: [`Error::InvalidArgument`] for `vocab == 0` or `row_stride < vocab`;
    /// [`Error::LengthMismatch`] if `data` is shorter than `(rows - 1) * row_stride + vocab`.
    pub fn new(data: &'a [T], rows: usize, vocab: usize, row_stride: usize) -> Result<Self> {
        if vocab == 0 || row_stride < vocab {
            return Err(Error::InvalidArgument);
        }
        let need = match rows {
            0 => 0,
            r => (r - 1)
                .checked_mul(row_stride)
                .and_then(|n| n.checked_add(vocab))
                .ok_or(Error::LengthMismatch)?,
        };
        if data.len() < need {
            return Err(Error::LengthMismatch);
        }
        Ok(Logits {
            data,
            rows,
            vocab,
            row_stride,
        })
    }

    /// Number of rows (tokens).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Vocabulary size `V`.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Elements between the starts of two rows.
    pub fn row_stride(&self) -> usize {
        self.row_stride
    }

    /// Row `i` (`vocab` elements), or `None` past the last row.
    pub fn row(&self, i: usize) -> Option<&'a [T]> {
        if i >= self.rows {
            return None;
        }
        let start = i.checked_mul(self.row_stride)?;
        self.data.get(start..start.checked_add(self.vocab)?)
    }
}

/// Options of the selective log-softmax.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(deny_unknown_fields)
)]
pub struct LogSoftmaxOptions {
    /// Sampling temperature `T` (finite, `> 0`; the logits are divided by it). Default 1.
    pub temperature: f64,
}

impl Default for LogSoftmaxOptions {
    fn default() -> Self {
        LogSoftmaxOptions { temperature: 1.0 }
    }
}

/// The temperature's domain, as [`LogSoftmaxOptions::check`] words it.
const TEMPERATURE_DOMAIN: &str = "finite and at least log2(e)/f32::MAX (about 4.24e-39: the kernels' scale log2(e)/T must be a finite f32)";

/// The scale the kernels apply to every logit, `f32(1 / T) * log2(e)` rounded to `f32`
/// (`logsoftmax.cu` works in the log2 domain); the CPU checks use the same value.
fn kernel_scale(inv_t: f64) -> f32 {
    (inv_t as f32) * core::f32::consts::LOG2_E
}

impl LogSoftmaxOptions {
    /// Checks the fields: `temperature` finite, `> 0` and at least `log2(e) / f32::MAX`
    /// (about `4.24e-39`), so that the kernels' scale `f32(1 / T) * log2(e)` is a finite `f32`
    /// (a smaller `T` would give NaN log-probs on the GPU).
    ///
    /// # Errors
    /// The first field outside its domain.
    pub fn check(&self) -> core::result::Result<(), InvalidOption> {
        let t = self.temperature;
        InvalidOption::require(
            domain::finite_positive(t) && kernel_scale(1.0 / t).is_finite(),
            "temperature",
            TEMPERATURE_DOMAIN,
        )
    }

    /// [`LogSoftmaxOptions::check`] as an [`Error`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when a field is outside its domain.
    pub fn validate(&self) -> Result<()> {
        self.check().map_err(Error::from)
    }
}

/// Log-sum-exp and entropy of one row of scaled logits `z = x / T`, in `f64`: `(lse, H)`.
///
/// Unchecked: a NaN or `+inf` entry gives `(NaN, NaN)`, an all-`-inf` row `(-inf, NaN)`; the
/// public entry points refuse such rows first (see the module documentation). Two passes (max, then
/// sums) because this is the readable reference; the kernel does one online pass.
pub fn row_lse_entropy<T: LogProb>(row: &[T], inv_t: f64) -> (f64, f64) {
    let mut m = f64::NEG_INFINITY;
    for &x in row {
        let z = x.to_f64() * inv_t;
        if z.is_nan() || z == f64::INFINITY {
            return (f64::NAN, f64::NAN);
        }
        m = m.max(z);
    }
    if m == f64::NEG_INFINITY {
        return (f64::NEG_INFINITY, f64::NAN);
    }
    // s = sum exp(z - m) >= 1 (the max contributes 1); t = sum exp(z - m) * (z - m), skipping
    // the exact zeros of -inf entries (0 * -inf would be NaN).
    let (mut s, mut t) = (0.0f64, 0.0f64);
    for &x in row {
        let d = x.to_f64() * inv_t - m;
        if d > f64::NEG_INFINITY {
            let e = libm::exp(d);
            s += e;
            t += e * d;
        }
    }
    let log_s = libm::log(s);
    (m + log_s, log_s - t / s)
}

fn counted(mask: Option<&[u8]>, i: usize) -> bool {
    mask.is_none_or(|m| m.get(i).is_some_and(|&v| v != 0))
}

/// A counted row has a softmax: no NaN or `+inf` logit, no finite logit whose scaled value
/// overflows to `+inf`, and at least one logit whose scaled value is above `-inf` (a finite
/// logit scaled to `-inf` has probability 0, like a `-inf` logit).
///
/// For the dtypes the kernels take (`f32`, `bf16`, `f16`) the scale is also applied as the
/// kernels apply it, `x * (f32(1 / T) * log2(e))` rounded to `f32` (`logsoftmax.cu`), so both
/// paths refuse the same rows (the kernels flag them with a status bit). `f64` logits (CPU
/// only) are scaled in `f64`.
fn check_row<T: LogProb>(row: &[T], inv_t: f64) -> Result<()> {
    let kernel_dtype = T::NAME != <f64 as LogProb>::NAME;
    let scale = kernel_scale(inv_t);
    let mut live = false;
    for &x in row {
        let x = x.to_f64();
        if x.is_nan() || x == f64::INFINITY {
            return Err(Error::NonFinite);
        }
        // Exact for the kernel dtypes, which all convert to f32 without rounding.
        let z = x * inv_t;
        let z32 = if kernel_dtype { x as f32 * scale } else { 0.0 };
        if z == f64::INFINITY || z32 == f32::INFINITY {
            return Err(Error::NonFinite);
        }
        live |= z > f64::NEG_INFINITY && z32 > f32::NEG_INFINITY;
    }
    if live { Ok(()) } else { Err(Error::NonFinite) }
}

/// Checks targets and mask against the logits and returns `1 / T`.
fn check_rows<T: LogProb, I: TokenId>(
    logits: &Logits<'_, T>,
    targets: &[I],
    mask: Option<&[u8]>,
    opts: &LogSoftmaxOptions,
) -> Result<f64> {
    opts.validate()?;
    if targets.len() != logits.rows || mask.is_some_and(|m| m.len() != logits.rows) {
        return Err(Error::LengthMismatch);
    }
    for (i, y) in targets.iter().enumerate() {
        if counted(mask, i) && y.index(logits.vocab).is_none() {
            return Err(Error::InvalidArgument);
        }
    }
    let inv_t = 1.0 / opts.temperature;
    for i in (0..logits.rows).filter(|&i| counted(mask, i)) {
        check_row(logits.row(i).unwrap_or_default(), inv_t)?;
    }
    Ok(inv_t)
}

/// Forward: `logp[i] = log softmax(x_i / T)[y_i]`, optionally `entropy[i]` and the per-row
/// log-sum-exp `lse[i]` of the scaled logits (what the backward pass needs).
///
/// On success every output is finite, except `logp = -inf` for a target whose logit is `-inf`.
///
/// Errors: [`Error::InvalidArgument`] (temperature, or a counted row's target outside
/// `0..V`), [`Error::NonFinite`] (a counted row with a NaN or `+inf` logit, a logit that
/// overflows when scaled by `1 / T`, or only `-inf` logits), [`Error::LengthMismatch`]
/// (targets, mask or an output not of `rows` entries). All checks run before any output is
/// written.
pub fn selective_log_softmax<T: LogProb, I: TokenId>(
    logits: &Logits<'_, T>,
    targets: &[I],
    mask: Option<&[u8]>,
    opts: &LogSoftmaxOptions,
    logp: &mut [f64],
    mut entropy: Option<&mut [f64]>,
    mut lse: Option<&mut [f64]>,
) -> Result<()> {
    let inv_t = check_rows(logits, targets, mask, opts)?;
    let n = logits.rows;
    if logp.len() != n
        || entropy.as_deref().is_some_and(|e| e.len() != n)
        || lse.as_deref().is_some_and(|l| l.len() != n)
    {
        return Err(Error::LengthMismatch);
    }
    for (i, (out, y)) in logp.iter_mut().zip(targets).enumerate() {
        let (l, h, lp) = match (counted(mask, i), logits.row(i), y.index(logits.vocab)) {
            (true, Some(row), Some(j)) => {
                let (l, h) = row_lse_entropy(row, inv_t);
                let zt = row.get(j).map_or(f64::NAN, |x| x.to_f64() * inv_t);
                (l, h, zt - l)
            }
            _ => (0.0, 0.0, 0.0),
        };
        *out = lp;
        if let Some(slot) = entropy.as_deref_mut().and_then(|e| e.get_mut(i)) {
            *slot = h;
        }
        if let Some(slot) = lse.as_deref_mut().and_then(|e| e.get_mut(i)) {
            *slot = l;
        }
    }
    Ok(())
}

/// Backward: `dlogits[i * V + j] = dL/dx_ij` (dense `[rows, V]`) from `dlogp[i]` and, when
/// given, `dentropy[i]`. The log-sum-exp and entropy are recomputed from the logits (the
/// reference does not trust saved values). Rows with mask 0 get exactly 0.
///
/// Errors: as [`selective_log_softmax`]; `dlogits` must hold `rows * V` entries; a NaN or
/// infinite `dlogp` or `dentropy` on a counted row is [`Error::NonFinite`].
pub fn selective_log_softmax_backward<T: LogProb, I: TokenId>(
    logits: &Logits<'_, T>,
    targets: &[I],
    mask: Option<&[u8]>,
    opts: &LogSoftmaxOptions,
    dlogp: &[f64],
    dentropy: Option<&[f64]>,
    dlogits: &mut [f64],
) -> Result<()> {
    let inv_t = check_rows(logits, targets, mask, opts)?;
    let (n, v) = (logits.rows, logits.vocab);
    if dlogp.len() != n
        || dentropy.is_some_and(|e| e.len() != n)
        || n.checked_mul(v) != Some(dlogits.len())
    {
        return Err(Error::LengthMismatch);
    }
    let finite_at = |g: &[f64], i: usize| g.get(i).is_none_or(|x| x.is_finite());
    if (0..n).any(|i| {
        counted(mask, i) && !(finite_at(dlogp, i) && dentropy.is_none_or(|e| finite_at(e, i)))
    }) {
        return Err(Error::NonFinite);
    }
    for (i, out) in dlogits.chunks_exact_mut(v).enumerate() {
        let row = match (counted(mask, i), logits.row(i)) {
            (true, Some(row)) => row,
            _ => {
                out.fill(0.0);
                continue;
            }
        };
        let g = dlogp.get(i).copied().unwrap_or(0.0);
        let e = dentropy.and_then(|d| d.get(i)).copied().unwrap_or(0.0);
        let y = targets.get(i).and_then(|y| y.index(v));
        let (l, h) = row_lse_entropy(row, inv_t);
        for (j, (o, x)) in out.iter_mut().zip(row).enumerate() {
            let log_p = x.to_f64() * inv_t - l;
            let p = libm::exp(log_p);
            let onehot = if y == Some(j) { 1.0 } else { 0.0 };
            // p * log p -> 0 as p -> 0: a -inf logit has no entropy gradient.
            let ent = if p > 0.0 { p * (log_p + h) } else { 0.0 };
            let ent_term = if e == 0.0 { 0.0 } else { e * ent };
            *o = inv_t * (g * (onehot - p) - ent_term);
        }
    }
    Ok(())
}

/// Scratch buffers of [`logits_policy_loss`], each of `rows` entries except `dlogits`
/// (`rows * V`).
#[derive(Debug)]
pub struct LogitsLossBuffers<'a> {
    /// Log-probs of the targets (output of the forward pass).
    pub logp: &'a mut [f64],
    /// `dL/dlogp` as the loss writes it (`f32`, SPEC §10).
    pub dlogp: &'a mut [f32],
    /// `dL/dlogits`, dense `[rows, V]`.
    pub dlogits: &'a mut [f64],
}

/// The fused path from logits to the policy loss (SPEC §10, token layout): the selective
/// log-softmax gives `logp`, [`policy_loss`] gives the loss, the stats and `dlogp`, and the
/// backward pass turns `dlogp` into `dlogits`. `inputs.logp` is ignored (it is what this
/// function computes); `inputs.mask` is the token mask of both steps.
///
/// Errors: those of [`selective_log_softmax`] and [`policy_loss`].
pub fn logits_policy_loss<T: LogProb, I: TokenId>(
    logits: &Logits<'_, T>,
    targets: &[I],
    lsm: &LogSoftmaxOptions,
    inputs: &LossInputs<'_, f64>,
    loss: &LossOptions,
    buf: LogitsLossBuffers<'_>,
) -> Result<LossOutput> {
    // Both option sets are checked before the forward pass writes anything.
    lsm.validate()?;
    loss.validate()?;
    selective_log_softmax(logits, targets, inputs.mask, lsm, buf.logp, None, None)?;
    let li = LossInputs {
        logp: &*buf.logp,
        ..*inputs
    };
    let out = policy_loss(&li, loss, buf.dlogp)?;
    // The loss gradient is f32 (as the kernel's); widen it exactly for the backward pass. The
    // backward pass needs an f64 slice; reuse `logp` (no longer needed) to hold it.
    for (d, g) in buf.logp.iter_mut().zip(buf.dlogp.iter()) {
        *d = f64::from(*g);
    }
    selective_log_softmax_backward(
        logits,
        targets,
        inputs.mask,
        lsm,
        buf.logp,
        None,
        buf.dlogits,
    )?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_row_has_log_v_entropy() {
        let x = [0.5f32; 4];
        let (l, h) = row_lse_entropy(&x, 1.0);
        assert!((l - (0.5 + 4f64.ln())).abs() < 1e-12);
        assert!((h - 4f64.ln()).abs() < 1e-12);
    }

    #[test]
    fn shape_checks() {
        let d = [0.0f32; 10];
        assert_eq!(Logits::new(&d, 2, 0, 4).err(), Some(Error::InvalidArgument));
        assert_eq!(Logits::new(&d, 2, 5, 4).err(), Some(Error::InvalidArgument));
        assert!(Logits::new(&d, 3, 2, 4).is_ok()); // 2*4 + 2 = 10
        assert_eq!(Logits::new(&d, 3, 3, 4).err(), Some(Error::LengthMismatch));
        let l = Logits::new(&d, 0, 3, 4);
        assert!(l.is_ok_and(|l| l.row(0).is_none()));
    }
}
