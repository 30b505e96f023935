//! The policy-loss family's per-token terms (SPEC §17) on their own:
//! hand-worked values, finite-difference derivatives, and the deterministic top-k selection against
//! a sort.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use care_core::grpo::{
    PolicyLoss, cispo_term, cov_select_count, covariance, gmpo_log_ratio, gpg_term, kl_cov_term,
    sapo_term, sigmoid, top_k,
};
use proptest::prelude::*;

fn close(a: f64, b: f64, tol: f64) {
    assert!((a - b).abs() <= tol * (1.0 + b.abs()), "got {a}, want {b}");
}

#[test]
fn cispo_clips_the_weight_not_the_gradient_path() {
    // rho = 1.5 above 1 + 0.2: weight 1.2; l = -1.2 * A * logp, dl/dlogp = -1.2 * A.
    let t = cispo_term(1.5, -2.0, 0.5, 0.8, 1.2);
    assert_eq!((t.loss, t.dloss_dlogp, t.clipped), (1.2, -0.6, true));
    let t = cispo_term(1.1, -2.0, 0.5, 0.8, 1.2);
    close(t.loss, 1.1, 1e-15);
    assert_eq!((t.dloss_dlogp, t.clipped), (-0.55, false));
    // TRL's absolute cap 5 with no lower bound: lo = 0.
    let t = cispo_term(0.01, -1.0, 1.0, 0.0, 5.0);
    assert_eq!((t.dloss_dlogp, t.clipped), (-0.01, false));
}

#[test]
fn sapo_gate_values() {
    // rho = 1: s = 1/2, l = -A * 2 / tau, dl/dlogp = -A * 4 * 1/4 * 1 = -A (as the unclipped
    // ratio at rho = 1).
    let t = sapo_term(1.0, 0.5, 1.0, 1.05, false);
    assert_eq!((t.loss, t.dloss_dlogp), (-1.0, -0.5));
    let t = sapo_term(1.0, -0.5, 1.0, 1.05, false);
    close(t.loss, 0.5 * 2.0 / 1.05, 1e-15);
    assert_eq!(t.dloss_dlogp, 0.5);
    // A clamped log ratio gives no gradient.
    assert_eq!(sapo_term(3.0, 1.0, 1.0, 1.05, true).dloss_dlogp, 0.0);
    assert_eq!(sigmoid(-800.0), 0.0);
    assert_eq!(sigmoid(800.0), 1.0);
}

#[test]
fn gpg_and_kl_cov_values() {
    let t = gpg_term(-2.0, 0.5);
    assert_eq!((t.loss, t.dloss_dlogp), (1.0, -0.5));
    // delta = 0.5, rho = e^0.5, A = 1, selected with coef 2: l = -rho + 1, d = -rho + 2.
    let rho = 0.5f64.exp();
    let t = kl_cov_term(rho, 0.5, 1.0, true, 2.0, false);
    assert_eq!(
        (t.loss, t.dloss_dlogp, t.clipped),
        (-rho + 1.0, -rho + 2.0, false)
    );
    let t = kl_cov_term(rho, 0.5, 1.0, false, 2.0, false);
    assert_eq!((t.loss, t.dloss_dlogp), (-rho, -rho));
    assert_eq!(kl_cov_term(rho, 0.5, 1.0, true, 2.0, true).dloss_dlogp, 0.0);
}

#[test]
fn gmpo_clips_in_log_space_by_advantage_sign() {
    // A > 0: min(delta, clip): above eps_high clips (grad 0), below -eps_low does not.
    assert_eq!(gmpo_log_ratio(0.5, 1.0, 0.2, 0.3), (0.3, 0.0));
    assert_eq!(gmpo_log_ratio(-0.5, 1.0, 0.2, 0.3), (-0.5, 1.0));
    assert_eq!(gmpo_log_ratio(0.1, 1.0, 0.2, 0.3), (0.1, 1.0));
    // A < 0: max(delta, clip).
    assert_eq!(gmpo_log_ratio(-0.5, -1.0, 0.2, 0.3), (-0.2, 0.0));
    assert_eq!(gmpo_log_ratio(0.5, -1.0, 0.2, 0.3), (0.5, 1.0));
    // A = 0: sgn 0 zeroes the log ratio.
    assert_eq!(gmpo_log_ratio(0.5, 0.0, 0.2, 0.3), (0.0, 0.0));
}

#[test]
fn select_counts_and_names() {
    assert_eq!(cov_select_count(2e-4, 0.0), 0);
    assert_eq!(cov_select_count(2e-4, 100.0), 1);
    assert_eq!(cov_select_count(0.25, 10.0), 2);
    assert_eq!(covariance(1.0, 2.0, 1.0, 5.0).to_bits(), 0.0f64.to_bits());
    for l in PolicyLoss::ALL {
        assert_eq!(l.name().parse::<PolicyLoss>(), Ok(l));
        assert_eq!(l.to_string(), l.name());
    }
    assert!("vanilla".parse::<PolicyLoss>().is_err());
}

#[test]
fn top_k_hand_worked() {
    let v = [
        Some(3.0),
        None,
        Some(5.0),
        Some(3.0),
        Some(f64::NAN),
        Some(3.0),
        Some(-1.0),
    ];
    let pick = |k: usize| {
        let mut s = top_k(k, || v.iter().copied());
        v.iter().map(|&x| s.take(x)).collect::<Vec<_>>()
    };
    // k = 2: 5 and the first 3.
    assert_eq!(pick(2), [true, false, true, false, false, false, false]);
    assert_eq!(pick(3), [true, false, true, true, false, false, false]);
    assert_eq!(pick(0), [false; 7]);
    // k >= candidates: all five non-NaN candidates.
    assert_eq!(pick(9), [true, false, true, true, false, true, true]);
}

fn fd<F: Fn(f64) -> f64>(f: F, x: f64) -> f64 {
    let h = 1e-6;
    (f(x + h) - f(x - h)) / (2.0 * h)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Relation: each term's `dloss_dlogp` is the derivative of its loss in `logp`, with the
    /// ratio `rho = exp(logp - logp_old)` (CISPO: with the weight held fixed, as `sg` says).
    #[test]
    fn terms_match_finite_differences(logp in -3.0f64..-0.1, d in -0.6f64..0.6, a in -2.0f64..2.0) {
        let old = logp - d;
        let rho = |l: f64| (l - old).exp();
        let s = sapo_term(rho(logp), a, 1.0, 1.05, false);
        let f = fd(|l| sapo_term(rho(l), a, 1.0, 1.05, false).loss, logp);
        prop_assert!((s.dloss_dlogp - f).abs() <= 1e-6 * (1.0 + f.abs()));
        let g = gpg_term(logp, a);
        prop_assert!((g.dloss_dlogp - fd(|l| gpg_term(l, a).loss, logp)).abs() <= 1e-6);
        prop_assume!(d.abs() > 1e-3);
        let k = kl_cov_term(rho(logp), d, a, true, 1.5, false);
        let f = fd(|l| kl_cov_term(rho(l), l - old, a, true, 1.5, false).loss, logp);
        prop_assert!((k.dloss_dlogp - f).abs() <= 1e-6 * (1.0 + f.abs()));
        // CISPO: the gradient never flows through the clipped weight: with the weight frozen
        // at its value, the loss is linear in logp with slope dloss_dlogp.
        let c = cispo_term(rho(logp), logp, a, 0.8, 1.2);
        let w = c.loss / (-a * logp);
        let f = fd(|l| -w * a * l, logp);
        prop_assert!((c.dloss_dlogp - f).abs() <= 1e-6 * (1.0 + f.abs()));
    }

    /// Relation: `top_k` selects exactly the first `k` of the candidates sorted by value
    /// (descending) and index (ascending).
    #[test]
    fn top_k_is_a_stable_sort_prefix(
        vals in prop::collection::vec(prop_oneof![
            3 => (-4i32..4).prop_map(|x| Some(f64::from(x) * 0.5)),
            3 => (-1e3f64..1e3).prop_map(Some),
            1 => Just(None),
            1 => Just(Some(f64::NAN)),
            1 => Just(Some(-0.0)),
            // Keys that differ only in their lowest bytes, and the extremes of the order.
            2 => (0u64..4).prop_map(|d| Some(f64::from_bits(1.0f64.to_bits() + d))),
            1 => prop::sample::select(vec![f64::INFINITY, f64::NEG_INFINITY, f64::MAX, f64::MIN,
                f64::MIN_POSITIVE, -f64::MIN_POSITIVE, 5e-324]).prop_map(Some),
        ], 0..40),
        k in 0usize..45,
    ) {
        let norm: Vec<Option<f64>> = vals.iter().map(|v| v.map(|x| if x == 0.0 { 0.0 } else { x })).collect();
        let mut s = top_k(k, || norm.iter().copied());
        let got: Vec<bool> = norm.iter().map(|&v| s.take(v)).collect();
        let mut order: Vec<usize> = (0..norm.len()).filter(|&i| norm[i].is_some_and(|x| !x.is_nan())).collect();
        order.sort_by(|&i, &j| norm[j].unwrap().total_cmp(&norm[i].unwrap()).then(i.cmp(&j)));
        let mut want = vec![false; norm.len()];
        for &i in order.iter().take(k) {
            want[i] = true;
        }
        prop_assert_eq!(got, want);
    }
}
