//! The alignment reward `r_align` (SPEC §6): do the rubric's weights agree with the strategies
//! the chosen response actually used?

use crate::simplex::scoring_weights;

/// `r_align` with the violations that produced it.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Alignment {
    /// `max(0, 1 - 0.5 * violations)`: one of `0`, `0.5`, `1`.
    pub reward: f64,
    /// Violation T: no most-used dimension holds the highest weight.
    pub top_violation: bool,
    /// Violation Z count: ordered pairs `(z, p)` with `n_z = 0`, `n_p > 0`, `w_z > w_p`.
    pub zero_violations: u32,
}

/// Computes `r_align` from rubric weights (normalized here with
/// [`crate::simplex::scoring_weights`]) and strategy counts. Comparisons are exact.
pub fn alignment(weights: [f64; 3], counts: [u32; 3]) -> Alignment {
    let w = scoring_weights(weights);
    let n_max = counts.iter().copied().max().unwrap_or(0);
    if n_max == 0 {
        return Alignment {
            reward: 1.0,
            top_violation: false,
            zero_violations: 0,
        };
    }
    let w_max = w.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let top_ok = counts
        .iter()
        .zip(w.iter())
        .any(|(&n, &wd)| n == n_max && wd == w_max);
    let mut zero = 0u32;
    for (&nz, &wz) in counts.iter().zip(w.iter()) {
        if nz != 0 {
            continue;
        }
        for (&np, &wp) in counts.iter().zip(w.iter()) {
            if np > 0 && wz > wp {
                zero += 1;
            }
        }
    }
    let violations = u32::from(!top_ok) + zero;
    Alignment {
        reward: (1.0 - 0.5 * f64::from(violations)).max(0.0),
        top_violation: !top_ok,
        zero_violations: zero,
    }
}

/// `r_align` only (see [`alignment`]).
pub fn alignment_reward(weights: [f64; 3], counts: [u32; 3]) -> f64 {
    alignment(weights, counts).reward
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn spec_cases() {
        // All counts zero: 1.
        assert_eq!(alignment_reward([0.4, 0.35, 0.25], [0, 0, 0]), 1.0);
        // Most used (Cog) holds the max weight, unused Aff outweighs used Pro: one Z violation.
        let a = alignment([0.4, 0.35, 0.25], [1, 0, 1]);
        assert_eq!(
            (a.top_violation, a.zero_violations, a.reward),
            (false, 1, 0.5)
        );
        // Fixture 1 weights (0.4, 0.25, 0.35) with tactics questioning + information: aligned.
        assert_eq!(alignment_reward([0.4, 0.25, 0.35], [1, 0, 1]), 1.0);
        // Top violation plus two Z violations: floored at 0.
        let b = alignment([0.5, 0.3, 0.2], [0, 0, 2]);
        assert!(b.top_violation);
        assert_eq!(b.zero_violations, 2);
        assert_eq!(b.reward, 0.0);
        // Ties in n: one of the most used holds the (shared) max.
        assert_eq!(alignment_reward([0.4, 0.4, 0.2], [1, 1, 1]), 1.0);
        assert_eq!(
            alignment_reward([0.2, 0.4, 0.4], [2, 1, 0]).to_bits(),
            0.0f64.to_bits()
        );
    }
}
