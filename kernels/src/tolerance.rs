//! The one tolerance table for kernel results against the `care-core` CPU reference, used by the
//! host-emulated tests and the GPU tests alike (and printed in the README).
//!
//! A result `got` passes against the reference `want` when
//! `|got - want| <= atol + rtol * scale`, where `scale` is `|want|` for advantages and group
//! statistics, and the magnitude of the summed terms for the loss (`sum_t w_t |l_t|`) and for the
//! gradient (`max_t |g_t|` of the batch). Why these sizes: advantages are computed in `f64` by
//! both sides and rounded once to `f32`; the loss kernel computes in `f32` (ratios, clips, KL)
//! and sums with `f32` atomics where the reference uses `f64`; a gradient written in a 16-bit
//! dtype carries that dtype's rounding (half an ulp: 2^-9 for bf16, 2^-12 for f16) on top.

use crate::plan::Dtype;

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
}

/// An absolute and a relative tolerance.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    /// Absolute part.
    pub atol: f64,
    /// Relative part (times the quantity's scale).
    pub rtol: f64,
}

impl Tolerance {
    /// Whether `got` is within tolerance of `want` at `scale`. NaN matches NaN only.
    pub fn accepts(&self, got: f64, want: f64, scale: f64) -> bool {
        if want.is_nan() || got.is_nan() {
            return want.is_nan() && got.is_nan();
        }
        if want.is_infinite() || got.is_infinite() {
            return got == want;
        }
        (got - want).abs() <= self.atol + self.rtol * scale.abs()
    }
}

/// The table: (quantity, dtype, tolerance). Advantages only exist for `f32` rewards.
pub const TABLE: [(Quantity, Dtype, Tolerance); 11] = [
    (
        Quantity::Advantage,
        Dtype::F32,
        Tolerance {
            atol: 1e-6,
            rtol: 1e-5,
        },
    ),
    (
        Quantity::GroupStat,
        Dtype::F32,
        Tolerance {
            atol: 1e-6,
            rtol: 1e-5,
        },
    ),
    (
        Quantity::Loss,
        Dtype::F32,
        Tolerance {
            atol: 1e-6,
            rtol: 1e-4,
        },
    ),
    (
        Quantity::Loss,
        Dtype::Bf16,
        Tolerance {
            atol: 1e-6,
            rtol: 1e-4,
        },
    ),
    (
        Quantity::Loss,
        Dtype::F16,
        Tolerance {
            atol: 1e-6,
            rtol: 1e-4,
        },
    ),
    (
        Quantity::Grad,
        Dtype::F32,
        Tolerance {
            atol: 1e-9,
            rtol: 1e-4,
        },
    ),
    (
        Quantity::Grad,
        Dtype::Bf16,
        Tolerance {
            atol: 1e-9,
            rtol: 1e-4,
        },
    ),
    (
        Quantity::Grad,
        Dtype::F16,
        Tolerance {
            atol: 1e-9,
            rtol: 1e-4,
        },
    ),
    (
        Quantity::GradInputDtype,
        Dtype::F32,
        Tolerance {
            atol: 1e-9,
            rtol: 1e-4,
        },
    ),
    (
        Quantity::GradInputDtype,
        Dtype::Bf16,
        Tolerance {
            atol: 1e-9,
            rtol: 8e-3,
        },
    ),
    (
        Quantity::GradInputDtype,
        Dtype::F16,
        Tolerance {
            atol: 1e-7,
            rtol: 1e-3,
        },
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
            for q in [Quantity::Loss, Quantity::Grad, Quantity::GradInputDtype] {
                assert!(tolerance(q, d).is_some(), "{q:?} {d:?}");
            }
        }
        assert!(tolerance(Quantity::Advantage, Dtype::F32).is_some());
        assert!(tolerance(Quantity::Advantage, Dtype::Bf16).is_none());
        let t = Tolerance {
            atol: 0.0,
            rtol: 1e-3,
        };
        assert!(t.accepts(1.0005, 1.0, 1.0));
        assert!(!t.accepts(1.01, 1.0, 1.0));
        assert!(t.accepts(f64::NAN, f64::NAN, 1.0));
        assert!(!t.accepts(f64::NAN, 1.0, 1.0));
        assert!(!t.accepts(f64::INFINITY, 1.0, 1.0));
    }
}
