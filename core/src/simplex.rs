//! Weights on the probability simplex (SPEC §4).
//!
//! Rubric weights come from a language model and may be off the simplex; scoring always uses
//! [`scoring_weights`], which maps any triple onto it, so every reward stays in its documented
//! range whatever the generator wrote.

use crate::{Error, Result};

/// The default tolerance of [`is_on_simplex`] (the format contract's `weight_tolerance`).
pub const DEFAULT_TOLERANCE: f64 = 1e-3;

/// `true` when every weight is finite and `>= 0` and `|sum - 1| <= tol`.
pub fn is_on_simplex(w: &[f64], tol: f64) -> bool {
    if w.is_empty() || w.iter().any(|x| !x.is_finite() || *x < 0.0) {
        return false;
    }
    let s: f64 = w.iter().sum();
    (s - 1.0).abs() <= tol
}

/// The uniform point `[1/N; N]`.
pub fn uniform<const N: usize>() -> [f64; N] {
    [1.0 / N as f64; N]
}

/// L1 normalization: `w / sum(w)`.
///
/// # Errors
/// [`Error::InvalidWeights`] when a weight is negative or non-finite, or all are zero;
/// [`Error::Empty`] when `N == 0`.
pub fn normalize_l1<const N: usize>(w: [f64; N]) -> Result<[f64; N]> {
    if N == 0 {
        return Err(Error::Empty);
    }
    if w.iter().any(|x| !x.is_finite() || *x < 0.0) {
        return Err(Error::InvalidWeights);
    }
    // Divide by the maximum first so that a sum of huge finite weights cannot overflow to inf.
    let m = w.iter().copied().fold(0.0_f64, f64::max);
    if m <= 0.0 {
        return Err(Error::InvalidWeights);
    }
    let mut out = w.map(|x| x / m);
    let s: f64 = out.iter().sum();
    for x in &mut out {
        *x /= s;
    }
    Ok(out)
}

/// Euclidean projection onto the simplex (Duchi et al. 2008): the point of the simplex nearest
/// to `w`, for arbitrary finite reals.
///
/// # Errors
/// [`Error::NonFinite`] when an entry is NaN or infinite; [`Error::Empty`] when `N == 0`.
pub fn project_to_simplex<const N: usize>(w: [f64; N]) -> Result<[f64; N]> {
    if N == 0 {
        return Err(Error::Empty);
    }
    if w.iter().any(|x| !x.is_finite()) {
        return Err(Error::NonFinite);
    }
    let mut u = w;
    u.sort_unstable_by(|a, b| b.total_cmp(a));
    // theta = (sum of the k largest - 1) / k for the largest k with u_k > theta_k.
    let mut cumsum = 0.0;
    let mut theta = 0.0;
    for (i, &ui) in u.iter().enumerate() {
        cumsum += ui;
        let t = (cumsum - 1.0) / (i as f64 + 1.0);
        if ui - t > 0.0 {
            theta = t;
        }
    }
    Ok(w.map(|x| (x - theta).max(0.0)))
}

/// The weights scoring uses for a rubric whose stored weights are `w`: negative, NaN or
/// infinite entries count as 0 (they come from a broken rubric and must not be exploitable),
/// then L1-normalized; uniform when nothing positive remains. The result is always on the
/// simplex, and an already normalized triple is returned unchanged up to rounding (exactly
/// unchanged when its sum is exactly 1).
pub fn scoring_weights(w: [f64; 3]) -> [f64; 3] {
    let cleaned = w.map(|x| if x.is_finite() && x > 0.0 { x } else { 0.0 });
    let s: f64 = cleaned.iter().sum();
    if s == 1.0 {
        return cleaned;
    }
    normalize_l1(cleaned).unwrap_or_else(|_| uniform())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn projection_of_simplex_point_is_identity() {
        let w = [0.2, 0.3, 0.5];
        let p = project_to_simplex(w).unwrap();
        for (a, b) in w.iter().zip(p.iter()) {
            assert!((a - b).abs() < 1e-12);
        }
    }

    #[test]
    fn projection_known_values() {
        // (2, 0, 0) -> (1, 0, 0); (0.5, 0.5, 0.5) -> uniform; (-1, 0.5, 0.5) -> (0, 0.5, 0.5).
        assert_eq!(
            project_to_simplex([2.0, 0.0, 0.0]).unwrap(),
            [1.0, 0.0, 0.0]
        );
        let p = project_to_simplex([0.5, 0.5, 0.5]).unwrap();
        assert!(p.iter().all(|x| (x - 1.0 / 3.0).abs() < 1e-12));
        assert_eq!(
            project_to_simplex([-1.0, 0.5, 0.5]).unwrap(),
            [0.0, 0.5, 0.5]
        );
        assert_eq!(
            project_to_simplex([f64::NAN, 0.0, 0.0]),
            Err(Error::NonFinite)
        );
    }

    #[test]
    fn normalize_rejects_bad_weights() {
        assert_eq!(normalize_l1([0.0, 0.0, 0.0]), Err(Error::InvalidWeights));
        assert_eq!(normalize_l1([-0.1, 0.5, 0.6]), Err(Error::InvalidWeights));
        assert_eq!(
            normalize_l1([1.0, f64::INFINITY, 0.0]),
            Err(Error::InvalidWeights)
        );
        assert_eq!(normalize_l1([2.0, 1.0, 1.0]).unwrap(), [0.5, 0.25, 0.25]);
        let big = normalize_l1([f64::MAX, f64::MAX, 0.0]).unwrap();
        assert_eq!(big, [0.5, 0.5, 0.0]);
    }

    #[test]
    fn scoring_weights_cases() {
        assert_eq!(scoring_weights([0.4, 0.35, 0.25]), [0.4, 0.35, 0.25]);
        assert_eq!(scoring_weights([0.0, 0.0, 0.0]), uniform());
        assert_eq!(scoring_weights([f64::NAN, -1.0, 2.0]), [0.0, 0.0, 1.0]);
        assert!(is_on_simplex(&scoring_weights([0.5, 0.3, 0.1]), 1e-12));
        assert!(!is_on_simplex(&[0.5, 0.3, 0.1], 1e-3));
        assert!(is_on_simplex(&[0.5, 0.3, 0.2005], 1e-3));
    }
}
