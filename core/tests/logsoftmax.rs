//! The selective log-softmax CPU reference (`care_core::logsoftmax`).
//!
//! Relations checked: (1) `logp` equals a naive `log(softmax)` with an explicit softmax vector
//! (small magnitudes, where the naive form is accurate); (2) shift invariance: adding a constant
//! to a row changes `logp` and `entropy` by nothing and `lse` by the constant / T; (3) the
//! backward pass equals a central finite difference of `sum_i g_i logp_i + e_i H_i`; (4) the
//! gradient rows sum to 0 (softmax gradients are orthogonal to constants); (5) every edge case
//! of the module documentation, and that a success never carries NaN; (6) the fused logits-to-loss path equals its three steps.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use care_core::Error;
use care_core::grpo::{Advantages, LossInputs, LossOptions, policy_loss};
use care_core::logsoftmax::{
    LogSoftmaxOptions, Logits, LogitsLossBuffers, logits_policy_loss, selective_log_softmax,
    selective_log_softmax_backward,
};
use proptest::prelude::*;

fn fwd(x: &[f64], rows: usize, v: usize, y: &[i64], t: f64) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let l = Logits::new(x, rows, v, v).unwrap();
    let (mut lp, mut h, mut lse) = (vec![0.0; rows], vec![0.0; rows], vec![0.0; rows]);
    let o = LogSoftmaxOptions { temperature: t };
    selective_log_softmax(&l, y, None, &o, &mut lp, Some(&mut h), Some(&mut lse)).unwrap();
    (lp, h, lse)
}

fn objective(x: &[f64], rows: usize, v: usize, y: &[i64], t: f64, g: &[f64], e: &[f64]) -> f64 {
    let (lp, h, _) = fwd(x, rows, v, y, t);
    (0..rows).map(|i| g[i] * lp[i] + e[i] * h[i]).sum()
}

fn case() -> impl Strategy<Value = (usize, usize, Vec<f64>, Vec<i64>, f64)> {
    (
        1usize..5,
        1usize..9,
        prop_oneof![Just(1.0f64), Just(0.6), Just(2.5)],
    )
        .prop_flat_map(|(rows, v, t)| {
            (
                Just(rows),
                Just(v),
                proptest::collection::vec(-6.0f64..6.0, rows * v),
                proptest::collection::vec(0..v as i64, rows),
                Just(t),
            )
        })
}

proptest! {
    #[test]
    fn pt_logp_equals_naive_log_of_softmax((rows, v, x, y, t) in case()) {
        let (lp, h, lse) = fwd(&x, rows, v, &y, t);
        for i in 0..rows {
            let z: Vec<f64> = x[i * v..(i + 1) * v].iter().map(|a| a / t).collect();
            let sum: f64 = z.iter().map(|a| a.exp()).sum();
            let p: Vec<f64> = z.iter().map(|a| a.exp() / sum).collect();
            let want = p[y[i] as usize].ln();
            let want_h: f64 = -p.iter().map(|q| q * q.ln()).sum::<f64>();
            prop_assert!((lp[i] - want).abs() < 1e-12, "logp {} vs {}", lp[i], want);
            prop_assert!((h[i] - want_h).abs() < 1e-12, "entropy {} vs {}", h[i], want_h);
            prop_assert!((lse[i] - sum.ln()).abs() < 1e-12);
        }
    }

    #[test]
    fn pt_shift_invariance((rows, v, x, y, t) in case(), c in -50.0f64..50.0) {
        let (lp, h, lse) = fwd(&x, rows, v, &y, t);
        let xs: Vec<f64> = x.iter().map(|a| a + c).collect();
        let (lp2, h2, lse2) = fwd(&xs, rows, v, &y, t);
        for i in 0..rows {
            prop_assert!((lp[i] - lp2[i]).abs() < 1e-9);
            prop_assert!((h[i] - h2[i]).abs() < 1e-9);
            prop_assert!((lse2[i] - lse[i] - c / t).abs() < 1e-9);
        }
    }

    #[test]
    fn pt_backward_equals_finite_difference_and_rows_sum_to_zero(
        (rows, v, x, y, t) in case(),
        g in proptest::collection::vec(-2.0f64..2.0, 4),
        e in proptest::collection::vec(-2.0f64..2.0, 4),
    ) {
        let (g, e) = (&g[..rows], &e[..rows]);
        let l = Logits::new(&x[..], rows, v, v).unwrap();
        let mut d = vec![0.0; rows * v];
        let o = LogSoftmaxOptions { temperature: t };
        selective_log_softmax_backward(&l, &y, None, &o, g, Some(e), &mut d).unwrap();
        let hstep = 1e-6;
        for k in 0..rows * v {
            let mut xp = x.clone();
            let mut xm = x.clone();
            xp[k] += hstep;
            xm[k] -= hstep;
            let fd = (objective(&xp, rows, v, &y, t, g, e) - objective(&xm, rows, v, &y, t, g, e))
                / (2.0 * hstep);
            prop_assert!((d[k] - fd).abs() < 1e-6, "k {}: analytic {} vs fd {}", k, d[k], fd);
        }
        for i in 0..rows {
            let s: f64 = d[i * v..(i + 1) * v].iter().sum();
            prop_assert!(s.abs() < 1e-12, "row {} sums to {}", i, s);
        }
    }
}

#[test]
fn vocab_one_and_all_equal() {
    let (lp, h, lse) = fwd(&[3.5, -1.0], 2, 1, &[0, 0], 0.6);
    assert_eq!(lp, vec![0.0, 0.0]);
    assert_eq!(h, vec![0.0, 0.0]);
    assert!((lse[0] - 3.5 / 0.6).abs() < 1e-12);
    let x = vec![0.25f64; 7];
    let (lp, h, _) = fwd(&x, 1, 7, &[3], 1.0);
    assert!((lp[0] + 7f64.ln()).abs() < 1e-12);
    assert!((h[0] - 7f64.ln()).abs() < 1e-12);
}

#[test]
fn neg_inf_entries_and_rows() {
    let ni = f64::NEG_INFINITY;
    // Row 0: a vocabulary mask; row 1: target at -inf.
    let x = [0.0, ni, 0.0, ni, 1.0, ni, 2.0, ni];
    let (lp, h, _) = fwd(&x, 2, 4, &[0, 1], 1.0);
    assert!(
        (lp[0] + 2f64.ln()).abs() < 1e-12,
        "two live entries: {}",
        lp[0]
    );
    assert!(
        (h[0] - 2f64.ln()).abs() < 1e-12,
        "-inf entries have no entropy: {}",
        h[0]
    );
    assert_eq!(lp[1], ni);
    assert!(h[1].is_finite());
    // The gradient of a -inf logit is 0, also through the entropy, except for the one-hot term
    // of a target at -inf (row 1): g * (1 - 0).
    let l = Logits::new(&x[..8], 2, 4, 4).unwrap();
    let mut d = vec![f64::NAN; 8];
    let o = LogSoftmaxOptions::default();
    selective_log_softmax_backward(
        &l,
        &[0i64, 1],
        None,
        &o,
        &[1.0, 0.5],
        Some(&[0.3, -0.2]),
        &mut d,
    )
    .unwrap();
    assert_eq!((d[1], d[3], d[5], d[7]), (0.0, 0.0, 0.5, 0.0));
    assert!(d.iter().all(|v| v.is_finite()));
}

/// Runs forward and backward on `x` (one row per `v` entries, target 0, no mask) and returns
/// both results; the outputs must be untouched on error.
fn both(x: &[f64], v: usize, t: f64) -> (Result<(), Error>, Result<(), Error>) {
    let rows = x.len() / v;
    let l = Logits::new(x, rows, v, v).unwrap();
    let o = LogSoftmaxOptions { temperature: t };
    let y = vec![0i64; rows];
    let (mut lp, mut h, mut lse) = (vec![7.0; rows], vec![7.0; rows], vec![7.0; rows]);
    let f = selective_log_softmax(&l, &y, None, &o, &mut lp, Some(&mut h), Some(&mut lse));
    if f.is_err() {
        assert!(lp.iter().chain(&h).chain(&lse).all(|&v| v == 7.0));
    }
    let mut d = vec![7.0; rows * v];
    let b = selective_log_softmax_backward(&l, &y, None, &o, &vec![1.0; rows], None, &mut d);
    if b.is_err() {
        assert!(d.iter().all(|&v| v == 7.0));
    }
    (f, b)
}

#[test]
fn rows_without_a_softmax_are_errors_not_nan() {
    let ni = f64::NEG_INFINITY;
    let non_finite = (Err(Error::NonFinite), Err(Error::NonFinite));
    // All -inf, in the first or a later row.
    assert_eq!(both(&[ni, ni, ni], 3, 1.0), non_finite);
    assert_eq!(both(&[0.0, 1.0, ni, ni], 2, 1.0), non_finite);
    // NaN and +inf logits.
    assert_eq!(both(&[0.0, f64::NAN, 1.0], 3, 1.0), non_finite);
    assert_eq!(both(&[0.0, f64::INFINITY, 1.0], 3, 1.0), non_finite);
    // A finite logit that overflows once divided by T (f64 logits can reach that).
    assert_eq!(both(&[1e300, 0.0], 2, 1e-10), non_finite);
    // Scaled to -inf: probability 0, like a -inf logit; all of a row so: no softmax.
    assert_eq!(both(&[-1e300, 0.0], 2, 1e-10), (Ok(()), Ok(())));
    assert_eq!(both(&[-1e300, -1e300], 2, 1e-10), non_finite);
    // f32 logits are checked as the kernels scale them, x * (f32(1/T) * log2(e)) in f32: finite
    // in f64, but not on the GPU, so an error on both paths.
    for (x, t) in [(3e38f32, 0.5), (2.5e38, 1.0), (1e30, 1e-9)] {
        let row = [x, 0.0f32];
        let l = Logits::new(&row[..], 1, 2, 2).unwrap();
        let o = LogSoftmaxOptions { temperature: t };
        let mut lp = [7.0];
        let r = selective_log_softmax(&l, &[1i64], None, &o, &mut lp, None, None);
        assert_eq!(r, Err(Error::NonFinite), "x = {x:e}, T = {t}");
        assert_eq!(lp, [7.0]);
    }
    // Just inside the f32 range after the scale: accepted, finite.
    let row = [2.3e38f32, 0.0];
    let l = Logits::new(&row[..], 1, 2, 2).unwrap();
    let mut lp = [7.0];
    let o = LogSoftmaxOptions::default();
    selective_log_softmax(&l, &[0i64], None, &o, &mut lp, None, None).unwrap();
    assert_eq!(lp, [0.0]);
    // The same rows masked out are not read: no error.
    let masked = [ni, ni, 0.0, 1.0];
    let l = Logits::new(&masked[..], 2, 2, 2).unwrap();
    let mut lp = vec![0.0; 2];
    let o = LogSoftmaxOptions::default();
    selective_log_softmax(&l, &[0i64, 1], Some(&[0, 1]), &o, &mut lp, None, None).unwrap();
    assert!(lp.iter().all(|v| v.is_finite()));
}

#[test]
fn temperatures_whose_inverse_overflows_f32_are_invalid() {
    // Finite and positive, but 1/T is not a finite f32 (1e-320 even overflows f64).
    // 4e-39: 1/T is a finite f32, but the kernels' scale log2(e)/T is not.
    for t in [1e-320, 1e-300, 2.9e-39, 4e-39, f64::MIN_POSITIVE] {
        assert_eq!(
            both(&[0.0, 1.0], 2, t),
            (Err(Error::InvalidArgument), Err(Error::InvalidArgument)),
            "T = {t:e}"
        );
    }
    // The smallest accepted temperatures still give finite results.
    for t in [4.25e-39, 1e-38, 1e-30] {
        let (lp, h, lse) = fwd(&[0.0, 1e-3, -2.0], 1, 3, &[1], t);
        assert!(
            lp[0].is_finite() && h[0].is_finite() && lse[0].is_finite(),
            "T = {t:e}"
        );
    }
}

#[test]
fn non_finite_gradients_on_counted_rows_are_errors() {
    let x = [0.0, 1.0, 2.0, 3.0];
    let l = Logits::new(&x[..], 2, 2, 2).unwrap();
    let o = LogSoftmaxOptions::default();
    let mut d = vec![0.0; 4];
    for (g, e) in [
        ([f64::NAN, 1.0], [0.0, 0.0]),
        ([1.0, f64::INFINITY], [0.0, 0.0]),
        ([1.0, 1.0], [0.0, f64::NEG_INFINITY]),
    ] {
        let r = selective_log_softmax_backward(&l, &[0i64, 1], None, &o, &g, Some(&e), &mut d);
        assert_eq!(r, Err(Error::NonFinite), "{g:?} {e:?}");
    }
    // On a masked row the gradient is not read.
    let r = selective_log_softmax_backward(
        &l,
        &[0i64, 1],
        Some(&[1, 0]),
        &o,
        &[1.0, f64::NAN],
        None,
        &mut d,
    );
    assert_eq!(r, Ok(()));
    assert!(d.iter().all(|v| v.is_finite()));
}

proptest! {
    /// Relation: whatever the logits (any f32 bit pattern, -inf masks and NaN included) and
    /// temperature, a success carries no NaN: logp is finite or -inf (target at -inf), entropy
    /// and lse are finite, and so is the backward pass.
    #[test]
    fn success_never_carries_nan(
        bits in proptest::collection::vec(
            prop_oneof![
                proptest::num::u32::ANY,
                Just(f32::NEG_INFINITY.to_bits()),
                (-20.0f32..20.0).prop_map(f32::to_bits),
            ],
            1..24,
        ),
        v in 1usize..6,
        t in prop_oneof![Just(1.0f64), Just(1e-38), Just(1e-30), Just(1e30), 1e-3f64..1e3],
        y in 0i64..6,
    ) {
        let x: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
        let rows = x.len() / v;
        prop_assume!(rows > 0 && y < v as i64);
        let l = Logits::new(&x[..], rows, v, v).unwrap();
        let (mut lp, mut h, mut lse) = (vec![0.0; rows], vec![0.0; rows], vec![0.0; rows]);
        let o = LogSoftmaxOptions { temperature: t };
        let ys = vec![y; rows];
        if selective_log_softmax(&l, &ys, None, &o, &mut lp, Some(&mut h), Some(&mut lse)).is_ok() {
            for i in 0..rows {
                prop_assert!(lp[i].is_finite() || lp[i] == f64::NEG_INFINITY, "logp {}", lp[i]);
                prop_assert!(h[i].is_finite() && lse[i].is_finite(), "h {} lse {}", h[i], lse[i]);
            }
            let mut d = vec![0.0; rows * v];
            let g = vec![1.0; rows];
            selective_log_softmax_backward(&l, &ys, None, &o, &g, Some(&g), &mut d).unwrap();
            prop_assert!(d.iter().all(|v| v.is_finite()), "{:?}", d);
        }
    }
}

#[test]
fn extreme_logits_stay_finite() {
    let x = [1e4, -1e4, 1e4, 0.0];
    let (lp, h, lse) = fwd(&x, 1, 4, &[1], 0.6);
    assert!((lse[0] - (1e4 / 0.6 + 2f64.ln())).abs() < 1e-9);
    assert!((lp[0] - (-2e4 / 0.6 - 2f64.ln())).abs() < 1e-9);
    assert!((h[0] - 2f64.ln()).abs() < 1e-9);
}

#[test]
fn masked_rows_are_not_read_and_get_zeros() {
    let x = [f64::NAN, f64::NAN, 1.0, 2.0];
    let l = Logits::new(&x[..], 2, 2, 2).unwrap();
    let o = LogSoftmaxOptions::default();
    let (mut lp, mut h, mut lse) = (vec![9.0; 2], vec![9.0; 2], vec![9.0; 2]);
    // The masked row also has an out-of-range target: not an error, it is not counted.
    let y = [-100i32, 1];
    selective_log_softmax(
        &l,
        &y,
        Some(&[0, 1]),
        &o,
        &mut lp,
        Some(&mut h),
        Some(&mut lse),
    )
    .unwrap();
    assert_eq!((lp[0], h[0], lse[0]), (0.0, 0.0, 0.0));
    assert!(lp[1].is_finite());
    let mut d = vec![f64::NAN; 4];
    selective_log_softmax_backward(&l, &y, Some(&[0, 1]), &o, &[1.0, 1.0], None, &mut d).unwrap();
    assert_eq!((d[0].to_bits(), d[1].to_bits()), (0, 0));
}

#[test]
fn row_stride_and_dtypes() {
    // Two rows of V = 3 with stride 5 (the gaps are never read), in bf16.
    let vals = [1.0f32, 2.0, 3.0, f32::NAN, f32::NAN, 0.5, 0.5, -1.0];
    let b: Vec<half::bf16> = vals.iter().map(|&v| half::bf16::from_f32(v)).collect();
    let l = Logits::new(&b[..], 2, 3, 5).unwrap();
    let mut lp = vec![0.0; 2];
    selective_log_softmax(
        &l,
        &[2i32, 0],
        None,
        &LogSoftmaxOptions::default(),
        &mut lp,
        None,
        None,
    )
    .unwrap();
    let (want0, _, _) = fwd(&[1.0, 2.0, 3.0], 1, 3, &[2], 1.0);
    let (want1, _, _) = fwd(&[0.5, 0.5, -1.0], 1, 3, &[0], 1.0);
    assert!((lp[0] - want0[0]).abs() < 1e-12 && (lp[1] - want1[0]).abs() < 1e-12);
}

#[test]
fn argument_errors() {
    let x = [0.0f32; 6];
    let l = Logits::new(&x[..], 2, 3, 3).unwrap();
    let mut lp = vec![0.0; 2];
    let ok = LogSoftmaxOptions::default();
    for t in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let o = LogSoftmaxOptions { temperature: t };
        let r = selective_log_softmax(&l, &[0i64, 0], None, &o, &mut lp, None, None);
        assert_eq!(r, Err(Error::InvalidArgument));
    }
    let r = selective_log_softmax(&l, &[0i64, 3], None, &ok, &mut lp, None, None);
    assert_eq!(r, Err(Error::InvalidArgument), "target == V");
    let r = selective_log_softmax(&l, &[0i64], None, &ok, &mut lp, None, None);
    assert_eq!(r, Err(Error::LengthMismatch));
    let r = selective_log_softmax(&l, &[0i64, 0], Some(&[1]), &ok, &mut lp, None, None);
    assert_eq!(r, Err(Error::LengthMismatch));
    let mut short = vec![0.0; 1];
    let r = selective_log_softmax(&l, &[0i64, 0], None, &ok, &mut short, None, None);
    assert_eq!(r, Err(Error::LengthMismatch));
    let mut d = vec![0.0; 5];
    let r = selective_log_softmax_backward(&l, &[0i64, 0], None, &ok, &[0.0; 2], None, &mut d);
    assert_eq!(r, Err(Error::LengthMismatch));
}

#[test]
fn fused_path_equals_its_steps() {
    let (rows, v) = (5usize, 6usize);
    let x: Vec<f32> = (0..rows * v)
        .map(|k| ((k * 37) % 11) as f32 * 0.4 - 2.0)
        .collect();
    let y = [1i64, 0, 5, 2, 3];
    let seq = [0u32, 2, 5];
    let adv = [1.0f32, -0.5];
    let mask = [1u8, 1, 0, 1, 1];
    let old = [-1.5f64, -2.0, -1.0, -2.5, -1.8];
    let l = Logits::new(&x[..], rows, v, v).unwrap();
    let lsm = LogSoftmaxOptions { temperature: 0.6 };
    let loss = LossOptions::default();
    let dummy = [0.0f64; 5];
    let inputs = LossInputs {
        logp: &dummy,
        logp_old: Some(&old),
        logp_ref: None,
        seq_offsets: &seq,
        mask: Some(&mask),
        advantages: Advantages::PerSequence(&adv),
        logp_rollout: None,
    };
    let (mut lp, mut dlp, mut dl) = (vec![0.0; rows], vec![0.0f32; rows], vec![0.0; rows * v]);
    let out = logits_policy_loss(
        &l,
        &y,
        &lsm,
        &inputs,
        &loss,
        LogitsLossBuffers {
            logp: &mut lp,
            dlogp: &mut dlp,
            dlogits: &mut dl,
        },
    )
    .unwrap();

    let mut lp2 = vec![0.0; rows];
    selective_log_softmax(&l, &y, Some(&mask), &lsm, &mut lp2, None, None).unwrap();
    let mut g = vec![0.0f32; rows];
    let li = LossInputs {
        logp: &lp2,
        ..inputs
    };
    let want = policy_loss(&li, &loss, &mut g).unwrap();
    assert_eq!(out.loss, want.loss);
    assert_eq!(dlp, g);
    let g64: Vec<f64> = g.iter().map(|&v| f64::from(v)).collect();
    let mut dl2 = vec![0.0; rows * v];
    selective_log_softmax_backward(&l, &y, Some(&mask), &lsm, &g64, None, &mut dl2).unwrap();
    assert_eq!(dl, dl2);
    assert!(dl[2 * v..3 * v].iter().all(|&d| d == 0.0), "masked row");
    assert!(dl.iter().any(|&d| d != 0.0));
}
