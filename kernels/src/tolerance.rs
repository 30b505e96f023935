//! The one tolerance table for kernel results against the `care-core` CPU reference, for every
//! kernel family, used by the host-emulated tests and the GPU tests alike (and printed in the
//! README).
//!
//! A result `got` passes against the reference `want` when
//! `|got - want| <= atol + rtol * scale + rel * |want| + floor` ([`Tolerance::bound`]), where
//! `scale` is `|want|` for advantages and group statistics, the magnitude of the summed terms
//! for the loss (`sum_t w_t |l_t|`), `max_t |g_t|` of the batch for the loss gradient, and the
//! row's largest finite `|x / T|` (at least 1) for the log-softmax. Why these sizes:
//!
//! * advantages are computed in `f64` by both sides and rounded once to `f32`;
//! * the loss kernel computes in `f32` (ratios, clips, KL) and sums with `f32` atomics where
//!   the reference uses `f64`; a gradient written in a 16-bit dtype carries that dtype's
//!   rounding (half an ulp: 2^-9 for bf16, 2^-12 for f16) on top;
//! * the log-softmax rounds `x * log2(e) / T` to `f32` (relative error ~1e-7 of `|z|`, which
//!   dominates for `+-1e4` logits: `rtol` times the row scale) and sums up to `V` exponentials in
//!   `f32` (the `log` of that sum carries its relative error: `atol`); the inputs are read
//!   exactly in every dtype;
//! * its backward pass moves that error through `G = (|g| + |e| (1 + |H| + 2 S)) / T`
//!   ([`Tolerance::bound_through`]) and adds the output dtype's rounding (`rel`: one ulp, 2^-8
//!   for bf16 and 2^-11 for f16; `floor`: the f16 subnormal step);
//! * discounted returns and GAE run the reference's reverse scan with the same double
//!   operations in the same order, never contracted into an FMA (`care_dadd`/`care_dmul`), and
//!   round once to `f32`: they are exact (bound 0);
//! * whitening sums in double in a block-tree order instead of the reference's left-to-right
//!   one: the mean and the centered sum of squares differ by at most `n 2^-53` of the summed
//!   magnitudes (`rtol` 1e-9 covers `n` up to 2^23 values), which the output magnifies by
//!   `1 / sqrt(var + eps)`: `scale` is `max |x| / sqrt(var + eps)` over the counted values for
//!   the whitened values and `max |x|` for the mean and std; one `f32` ulp (`rel` 2^-23) covers a
//!   rounding that lands on the other side of a tie.

use care_core::Dtype;

/// What is compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Quantity {
    /// Advantages and the token broadcast (`group_advantages_f32`).
    Advantage,
    /// Group mean and std (`group_advantages_f32`), batch std (`batch_std_f32`).
    GroupStat,
    /// The loss `L` and the float sums of the stats (`grpo_loss_*`).
    Loss,
    /// The `f32` gradient (`grpo_loss_*`).
    Grad,
    /// The gradient written in the log-prob dtype (`grpo_loss_*`, `grad_in_input_dtype`).
    GradInputDtype,
    /// Log-probs, entropy and log-sum-exp (`logsoftmax_fwd_*`, by logits dtype).
    LogSoftmax,
    /// `dlogits` in the logits dtype (`logsoftmax_bwd_*`).
    LogSoftmaxGrad,
    /// Discounted returns, GAE advantages and returns (`discounted_returns_f32`, `gae_f32`).
    TokenReturn,
    /// Whitened values, their mean and std (`whiten_stats_f32`, `whiten_apply_f32`).
    Whiten,
}

/// One row's bound: an absolute part, a part relative to the quantity's scale, and the output
/// dtype's rounding (relative to `|want|`, plus an absolute floor).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    /// Absolute part.
    pub atol: f64,
    /// Relative part (times the quantity's scale).
    pub rtol: f64,
    /// Output rounding relative to `|want|` (0 where `rtol` already covers it).
    pub rel: f64,
    /// Absolute floor of the output rounding.
    pub floor: f64,
}

impl Tolerance {
    /// `atol + rtol * scale`, no output rounding term.
    pub const fn new(atol: f64, rtol: f64) -> Tolerance {
        Tolerance {
            atol,
            rtol,
            rel: 0.0,
            floor: 0.0,
        }
    }

    /// The same with an output rounding term.
    pub const fn rounded(self, rel: f64, floor: f64) -> Tolerance {
        Tolerance { rel, floor, ..self }
    }

    /// The largest accepted `|got - want|` at `scale`.
    pub fn bound(&self, scale: f64, want: f64) -> f64 {
        self.atol + self.rtol * scale.abs() + self.rel * want.abs() + self.floor
    }

    /// The bound of a result computed from an intermediate of tolerance `atol + rtol * scale`
    /// that enters it with factor `gain` (the log-softmax backward pass), plus the output
    /// rounding.
    pub fn bound_through(&self, scale: f64, gain: f64, want: f64) -> f64 {
        (self.atol + self.rtol * scale) * gain + self.rel * want.abs() + self.floor
    }

    /// Whether `got` is within `bound`: NaN matches NaN only, an infinity only itself.
    pub fn within(got: f64, want: f64, bound: f64) -> bool {
        if want.is_nan() || got.is_nan() {
            return want.is_nan() && got.is_nan();
        }
        if want.is_infinite() || got.is_infinite() {
            return got == want;
        }
        (got - want).abs() <= bound
    }

    /// Whether `got` is within tolerance of `want` at `scale` ([`Tolerance::bound`]).
    pub fn accepts(&self, got: f64, want: f64, scale: f64) -> bool {
        Tolerance::within(got, want, self.bound(scale, want))
    }
}

const ADV: Tolerance = Tolerance::new(1e-6, 1e-5);
const LOSS: Tolerance = Tolerance::new(1e-6, 1e-4);
const GRAD: Tolerance = Tolerance::new(1e-9, 1e-4);
const LSM: Tolerance = Tolerance::new(2e-5, 1e-6);

/// The table: (quantity, dtype, tolerance). Advantages and the token-level estimators only
/// exist for `f32`.
pub const TABLE: [(Quantity, Dtype, Tolerance); 19] = [
    (Quantity::Advantage, Dtype::F32, ADV),
    (Quantity::GroupStat, Dtype::F32, ADV),
    (Quantity::Loss, Dtype::F32, LOSS),
    (Quantity::Loss, Dtype::Bf16, LOSS),
    (Quantity::Loss, Dtype::F16, LOSS),
    (Quantity::Grad, Dtype::F32, GRAD),
    (Quantity::Grad, Dtype::Bf16, GRAD),
    (Quantity::Grad, Dtype::F16, GRAD),
    (Quantity::GradInputDtype, Dtype::F32, GRAD),
    (
        Quantity::GradInputDtype,
        Dtype::Bf16,
        Tolerance::new(1e-9, 8e-3),
    ),
    (
        Quantity::GradInputDtype,
        Dtype::F16,
        Tolerance::new(1e-7, 1e-3),
    ),
    (Quantity::LogSoftmax, Dtype::F32, LSM),
    (Quantity::LogSoftmax, Dtype::Bf16, LSM),
    (Quantity::LogSoftmax, Dtype::F16, LSM),
    (Quantity::LogSoftmaxGrad, Dtype::F32, LSM),
    (
        Quantity::LogSoftmaxGrad,
        Dtype::Bf16,
        LSM.rounded(1.0 / 256.0, 1e-38),
    ),
    (
        Quantity::LogSoftmaxGrad,
        Dtype::F16,
        LSM.rounded(1.0 / 2048.0, 6e-8),
    ),
    (Quantity::TokenReturn, Dtype::F32, Tolerance::new(0.0, 0.0)),
    (
        Quantity::Whiten,
        Dtype::F32,
        Tolerance::new(0.0, 1e-9).rounded(1.0 / 8_388_608.0, 0.0),
    ),
];

/// The tolerance of a quantity and dtype (`None` for a combination the kernels do not have).
pub fn tolerance(q: Quantity, dtype: Dtype) -> Option<Tolerance> {
    TABLE
        .iter()
        .find(|(tq, td, _)| *tq == q && *td == dtype)
        .map(|(_, _, t)| *t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_covers_every_kernel_quantity_and_dtype() {
        for d in Dtype::ALL {
            for q in [
                Quantity::Loss,
                Quantity::Grad,
                Quantity::GradInputDtype,
                Quantity::LogSoftmax,
                Quantity::LogSoftmaxGrad,
            ] {
                assert!(tolerance(q, d).is_some(), "{q:?} {d:?}");
            }
        }
        assert!(tolerance(Quantity::Advantage, Dtype::F32).is_some());
        assert!(tolerance(Quantity::Advantage, Dtype::Bf16).is_none());
        assert!(tolerance(Quantity::TokenReturn, Dtype::F32).is_some());
        assert!(tolerance(Quantity::Whiten, Dtype::F32).is_some());
        // One row per (quantity, dtype).
        for (i, (q, d, _)) in TABLE.iter().enumerate() {
            assert!(TABLE[i + 1..].iter().all(|(q2, d2, _)| (q2, d2) != (q, d)));
        }
        let t = Tolerance::new(0.0, 1e-3);
        assert!(t.accepts(1.0005, 1.0, 1.0));
        assert!(!t.accepts(1.01, 1.0, 1.0));
        assert!(t.accepts(f64::NAN, f64::NAN, 1.0));
        assert!(!t.accepts(f64::NAN, 1.0, 1.0));
        assert!(!t.accepts(f64::INFINITY, 1.0, 1.0));
    }

    #[test]
    fn log_softmax_bounds_grow_with_the_row_scale_and_output_dtype() {
        let fwd = tolerance(Quantity::LogSoftmax, Dtype::F32).unwrap_or(LSM);
        assert!(fwd.bound(1e4, 0.0) > fwd.bound(1.0, 0.0));
        let grad = |d| tolerance(Quantity::LogSoftmaxGrad, d).unwrap_or(LSM);
        let b = grad(Dtype::Bf16).bound_through(1.0, 1.0, 0.5);
        let f = grad(Dtype::F32).bound_through(1.0, 1.0, 0.5);
        assert!(b > f && (b - f - 0.5 / 256.0 - 1e-38).abs() < 1e-12);
    }
}
