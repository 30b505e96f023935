//! Token-level advantages (SPEC §18): hand-worked goldens for discounted
//! returns, GAE and whitening, and the property tests (GAE with `gamma = lambda = 1` is returns
//! minus values; masked tokens are skipped, not chain breakers; the cross-rank whitening equals one
//! rank's).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use care_core::Error;
use care_core::grpo::{
    GaeOptions, GroupSums, MaskedToken, StdKind, WhitenOptions, discounted_returns,
    discounted_returns_whitened, gae, gae_whitened, whiten, whiten_finalize,
    whiten_partial_squares, whiten_partial_sums,
};
use proptest::prelude::*;

fn close(a: f64, b: f64, tol: f64) {
    assert!((a - b).abs() <= tol * (1.0 + b.abs()), "got {a}, want {b}");
}

#[test]
fn discounted_returns_golden() {
    // One sequence r = [1, 0, 2], gamma 0.5: G = [1 + 0.5 * (0 + 0.5 * 2), 0 + 0.5 * 2, 2].
    // A second sequence with a masked middle token: its reward is skipped and the chain runs
    // through it: r = [1, 100 (masked), 4], gamma 0.5: G = [1 + 0.5 * 4, 0, 4].
    let r = [1.0f32, 0.0, 2.0, 1.0, 100.0, 4.0];
    let mask = [1u8, 1, 1, 1, 0, 1];
    let mut g = [f32::NAN; 6];
    let o = GaeOptions {
        gamma: 0.5,
        lambda: 1.0,
        ..GaeOptions::default()
    };
    discounted_returns(&r, &[0, 3, 6], Some(&mask), &o, &mut g).unwrap();
    assert_eq!(g, [1.5, 1.0, 2.0, 3.0, 0.0, 4.0]);
}

#[test]
fn gae_golden() {
    // r = [0, 0, 1], V = [0.5, 0.25, 0.75], gamma 0.5, lambda 0.5 (gamma * lambda = 0.25):
    // delta_2 = 1 - 0.75 = 0.25                 A_2 = 0.25
    // delta_1 = 0 + 0.5 * 0.75 - 0.25 = 0.125   A_1 = 0.125 + 0.25 * 0.25 = 0.1875
    // delta_0 = 0 + 0.5 * 0.25 - 0.5 = -0.375   A_0 = -0.375 + 0.25 * 0.1875 = -0.328125
    // R = A + V.
    let r = [0.0f32, 0.0, 1.0];
    let v = [0.5f32, 0.25, 0.75];
    let (mut a, mut ret) = ([f32::NAN; 3], [f32::NAN; 3]);
    let o = GaeOptions {
        gamma: 0.5,
        lambda: 0.5,
        ..GaeOptions::default()
    };
    gae(&r, &v, &[0, 3], None, &o, &mut a, &mut ret).unwrap();
    assert_eq!(a, [-0.328125, 0.1875, 0.25]);
    assert_eq!(ret, [0.171875, 0.4375, 1.0]);
    // A masked token between two counted ones is skipped: its value is not the next value.
    let r = [0.0f32, 9.0, 1.0];
    let v = [0.5f32, 9.0, 0.75];
    gae(&r, &v, &[0, 3], Some(&[1, 0, 1]), &o, &mut a, &mut ret).unwrap();
    // delta_2 = 0.25, A_2 = 0.25; delta_0 = 0 + 0.5 * 0.75 - 0.5 = -0.125, A_0 = -0.0625.
    assert_eq!(a, [-0.0625, 0.0, 0.25]);
    assert_eq!(ret, [0.4375, 0.0, 1.0]);
}

#[test]
fn whiten_golden() {
    // [1, 2, 3, 4 (masked), 6]: counted mean 3, unbiased var (4 + 1 + 0 + 9) / 3 = 14/3.
    let mut x = [1.0f32, 2.0, 3.0, 4.0, 6.0];
    let mask = [1u8, 1, 1, 0, 1];
    let o = WhitenOptions {
        eps: 0.0,
        ..WhitenOptions::default()
    };
    let (mean, std) = whiten(&mut x, Some(&mask), &o).unwrap();
    assert_eq!(mean, 3.0);
    close(std, (14.0f64 / 3.0).sqrt(), 1e-15);
    let s = (14.0f64 / 3.0).sqrt();
    let want = [-2.0 / s, -1.0 / s, 0.0, 0.0, 3.0 / s];
    for (a, b) in x.iter().zip(want) {
        assert_eq!(*a, b as f32);
    }
    // Biased with verl's eps: var = 14/4.
    let mut y = [1.0f32, 2.0, 3.0, 4.0, 6.0];
    let o = WhitenOptions {
        eps: 1e-8,
        std_kind: StdKind::Biased,
        ..WhitenOptions::default()
    };
    whiten(&mut y, Some(&mask), &o).unwrap();
    assert_eq!(y[4], (3.0 / (3.5f64 + 1e-8).sqrt()) as f32);
    // All equal with eps 0: exactly 0, not NaN.
    let mut z = [0.3f32; 4];
    whiten(&mut z, None, &o).unwrap();
    let o0 = WhitenOptions {
        eps: 0.0,
        ..WhitenOptions::default()
    };
    let mut z2 = [0.3f32; 4];
    whiten(&mut z2, None, &o0).unwrap();
    assert_eq!((z, z2), ([0.0; 4], [0.0; 4]));
}

#[test]
fn errors_before_writes() {
    let mut out = [7.0f32; 3];
    let bad = GaeOptions {
        gamma: 1.5,
        lambda: 1.0,
        ..GaeOptions::default()
    };
    let e = discounted_returns(&[1.0; 3], &[0, 3], None, &bad, &mut out);
    assert_eq!(e, Err(Error::InvalidArgument));
    let nan = GaeOptions {
        gamma: 1.0,
        lambda: f64::NAN,
        ..GaeOptions::default()
    };
    let mut out2 = [7.0f32; 3];
    let e = gae(
        &[1.0; 3],
        &[0.0; 3],
        &[0, 3],
        None,
        &nan,
        &mut out,
        &mut out2,
    );
    assert_eq!(e, Err(Error::InvalidArgument));
    let o = GaeOptions::default();
    let e = gae(&[1.0; 3], &[0.0; 2], &[0, 3], None, &o, &mut out, &mut out2);
    assert_eq!(e, Err(Error::LengthMismatch));
    let e = gae(&[1.0; 3], &[0.0; 3], &[0, 2], None, &o, &mut out, &mut out2);
    assert_eq!(e, Err(Error::InvalidLayout));
    let e = discounted_returns(&[1.0; 3], &[0, 3], Some(&[1, 1]), &o, &mut out);
    assert_eq!(e, Err(Error::LengthMismatch));
    assert_eq!((out, out2), ([7.0; 3], [7.0; 3]));
    let w = WhitenOptions {
        eps: -1.0,
        ..WhitenOptions::default()
    };
    assert_eq!(whiten(&mut out, None, &w), Err(Error::InvalidArgument));
    let sums = GroupSums {
        count: -1.0,
        sum: 0.0,
    };
    let e = whiten_finalize(&mut out, None, sums, 0.0, &WhitenOptions::default());
    assert_eq!(e, Err(Error::InvalidArgument));
    assert_eq!(out, [7.0; 3]);
}

/// `count_eps` is verl's `masked_mean`: `mean = sum / (n + e)`, `var = m2 / (n + e) * n / (n -
/// 1)`; equal values whiten to a residue (about -5e-5 for 16 values of 0.1... here 3 of 1.0).
#[test]
fn count_eps_golden() {
    let w = WhitenOptions {
        count_eps: 0.5,
        ..WhitenOptions::default()
    };
    let mut x = [1.0f64, 2.0, 3.0];
    let (mean, _) = whiten(&mut x, None, &w).unwrap();
    let m = 6.0 / 3.5;
    assert_eq!(mean, m);
    let m2: f64 = [1.0f64, 2.0, 3.0].iter().map(|v| (v - m) * (v - m)).sum();
    let var = m2 / 3.5 * (3.0 / 2.0);
    for (i, v) in [1.0f64, 2.0, 3.0].iter().enumerate() {
        close(x[i], (v - m) / (var + 1e-8).sqrt(), 1e-15);
    }
    // Equal values: exactly 0 without, verl's residue with 1e-8.
    let mut eq = [1.0f32; 3];
    whiten(&mut eq, None, &WhitenOptions::default()).unwrap();
    assert_eq!(eq, [0.0; 3]);
    let mut eq = [1.0f32; 3];
    whiten(
        &mut eq,
        None,
        &WhitenOptions {
            count_eps: 1e-8,
            ..WhitenOptions::default()
        },
    )
    .unwrap();
    assert!(eq.iter().all(|&v| v > 0.0 && v < 1e-3), "{eq:?}");
    let bad = WhitenOptions {
        count_eps: -1.0,
        ..WhitenOptions::default()
    };
    assert_eq!(whiten(&mut eq, None, &bad), Err(Error::InvalidArgument));
}

/// The reset rule restarts the return before a masked token (verl before 2026-08); GAE refuses
/// it; a non-finite return makes the fused call write nothing.
#[test]
fn reset_rule_and_fused_errors() {
    let r = [1.0f32, 5.0, 2.0, 1.0];
    let o = GaeOptions {
        gamma: 0.5,
        masked_token: MaskedToken::Reset,
        ..GaeOptions::default()
    };
    let mut g = [0.0f32; 4];
    discounted_returns(&r, &[0, 4], Some(&[1, 1, 0, 1]), &o, &mut g).unwrap();
    // Token 3: 1; token 2 masked: 0 and the chain restarts; token 1: 5; token 0: 1 + 2.5.
    assert_eq!(g, [3.5, 5.0, 0.0, 1.0]);
    let (mut a, mut ret) = ([0.0f32; 4], [0.0f32; 4]);
    assert_eq!(
        gae(&r, &r, &[0, 4], None, &o, &mut a, &mut ret),
        Err(Error::InvalidArgument)
    );
    let bad = [1.0f32, f32::INFINITY, 0.0, 0.0];
    let (mut a, mut ret) = ([7.0f32; 4], [7.0f32; 4]);
    let e = discounted_returns_whitened(
        &bad,
        &[0, 4],
        None,
        &GaeOptions::default(),
        &WhitenOptions::default(),
        &mut a,
        &mut ret,
    );
    assert_eq!(e, Err(Error::NonFinite));
    assert_eq!((a, ret), ([7.0; 4], [7.0; 4]));
}

#[derive(Debug, Clone)]
struct Tokens {
    r: Vec<f32>,
    v: Vec<f32>,
    mask: Vec<u8>,
    offsets: Vec<u32>,
}

fn tokens() -> impl Strategy<Value = Tokens> {
    prop::collection::vec(0usize..8, 1..6).prop_flat_map(|lens| {
        let n: usize = lens.iter().sum();
        let mut offsets = vec![0u32];
        for l in &lens {
            offsets.push(offsets.last().copied().unwrap() + *l as u32);
        }
        (
            prop::collection::vec(-2.0f32..2.0, n),
            prop::collection::vec(-2.0f32..2.0, n),
            prop::collection::vec(prop_oneof![4 => Just(1u8), 1 => Just(0u8)], n),
            Just(offsets),
        )
            .prop_map(|(r, v, mask, offsets)| Tokens {
                r,
                v,
                mask,
                offsets,
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Relation: with `gamma = lambda = 1`, GAE telescopes to returns minus values,
    /// `A_t = G_t - V_t`, and its returns `R_t = A_t + V_t` are the discounted returns.
    #[test]
    fn gae_with_unit_gamma_lambda_is_returns_minus_values(tk in tokens()) {
        let n = tk.r.len();
        let o = GaeOptions::default();
        let (mut a, mut ret, mut g) = (vec![0.0f32; n], vec![0.0f32; n], vec![0.0f32; n]);
        gae(&tk.r, &tk.v, &tk.offsets, Some(&tk.mask), &o, &mut a, &mut ret).unwrap();
        discounted_returns(&tk.r, &tk.offsets, Some(&tk.mask), &o, &mut g).unwrap();
        for t in 0..n {
            if tk.mask[t] == 0 {
                prop_assert_eq!((a[t], ret[t], g[t]), (0.0, 0.0, 0.0));
                continue;
            }
            let want = f64::from(g[t]) - f64::from(tk.v[t]);
            prop_assert!((f64::from(a[t]) - want).abs() <= 1e-5, "{} vs {}", a[t], want);
            prop_assert!((ret[t] - g[t]).abs() <= 1e-5);
        }
    }

    /// Relation: a masked token is skipped, so deleting it (and its row) from the input gives
    /// the same outputs on the remaining tokens.
    #[test]
    fn masked_tokens_are_skipped_not_chain_breakers(tk in tokens(), gamma in 0.0f64..=1.0, lambda in 0.0f64..=1.0) {
        let n = tk.r.len();
        let o = GaeOptions { gamma, lambda, ..GaeOptions::default() };
        let (mut a, mut ret) = (vec![0.0f32; n], vec![0.0f32; n]);
        gae(&tk.r, &tk.v, &tk.offsets, Some(&tk.mask), &o, &mut a, &mut ret).unwrap();
        let keep: Vec<usize> = (0..n).filter(|&t| tk.mask[t] != 0).collect();
        let mut offs = vec![0u32];
        for w in tk.offsets.windows(2) {
            let k = (w[0]..w[1]).filter(|&t| tk.mask[t as usize] != 0).count() as u32;
            offs.push(offs.last().copied().unwrap() + k);
        }
        let r2: Vec<f32> = keep.iter().map(|&t| tk.r[t]).collect();
        let v2: Vec<f32> = keep.iter().map(|&t| tk.v[t]).collect();
        let (mut a2, mut ret2) = (vec![0.0f32; keep.len()], vec![0.0f32; keep.len()]);
        gae(&r2, &v2, &offs, None, &o, &mut a2, &mut ret2).unwrap();
        for (j, &t) in keep.iter().enumerate() {
            prop_assert_eq!(a[t], a2[j]);
            prop_assert_eq!(ret[t], ret2[j]);
        }
    }

    /// Relation: the fused estimators equal the estimator into `f64` storage, then `whiten` of
    /// the `f64` values, then one rounding (to `1e-12`: the fused form sums in scan order), for
    /// every masked-token rule, estimator and `count_eps`; masked tokens are 0 in both outputs.
    #[test]
    fn fused_whitening_is_the_f64_composition(tk in tokens(), gamma in 0.0f64..=1.0, lambda in 0.0f64..=1.0, reset: bool, verl: bool) {
        let n = tk.r.len();
        prop_assume!(tk.mask.iter().filter(|&&m| m != 0).count() >= 2);
        let w = WhitenOptions { count_eps: if verl { 1e-8 } else { 0.0 }, ..WhitenOptions::default() };
        let rule = if reset { MaskedToken::Reset } else { MaskedToken::Skip };
        let o = GaeOptions { gamma, lambda, masked_token: rule };
        let m = Some(&tk.mask[..]);
        let mut g64 = vec![0.0f64; n];
        discounted_returns(&tk.r, &tk.offsets, m, &o, &mut g64).unwrap();
        let mut adv64 = g64.clone();
        let (mean, std) = whiten(&mut adv64, m, &w).unwrap();
        let (mut adv, mut ret) = (vec![7.0f32; n], vec![7.0f32; n]);
        let (fm, fs) = discounted_returns_whitened(&tk.r, &tk.offsets, m, &o, &w, &mut adv, &mut ret).unwrap();
        prop_assert!((fm - mean).abs() <= 1e-12 * (1.0 + mean.abs()) && (fs - std).abs() <= 1e-12 * (1.0 + std));
        for t in 0..n {
            prop_assert_eq!(ret[t], g64[t] as f32);
            prop_assert!((f64::from(adv[t]) - adv64[t]).abs() <= 1e-6 * (1.0 + adv64[t].abs()));
        }
        let o = GaeOptions { masked_token: MaskedToken::Skip, ..o };
        let (mut a64, mut r64) = (vec![0.0f64; n], vec![0.0f64; n]);
        gae(&tk.r, &tk.v, &tk.offsets, m, &o, &mut a64, &mut r64).unwrap();
        whiten(&mut a64, m, &w).unwrap();
        gae_whitened(&tk.r, &tk.v, &tk.offsets, m, &o, &w, &mut adv, &mut ret).unwrap();
        for t in 0..n {
            prop_assert_eq!(ret[t], r64[t] as f32);
            prop_assert!((f64::from(adv[t]) - a64[t]).abs() <= 1e-6 * (1.0 + a64[t].abs()));
        }
    }

    /// Relation: the three-step cross-rank whitening over a split equals one rank's whitening.
    #[test]
    fn cross_rank_whitening_equals_one_rank(tk in tokens(), cut in any::<prop::sample::Index>()) {
        let n = tk.r.len();
        let o = WhitenOptions::default();
        let mut whole = tk.r.clone();
        whiten(&mut whole, Some(&tk.mask), &o).unwrap();
        let k = cut.index(n + 1);
        let (a, b) = tk.r.split_at(k);
        let (ma, mb) = tk.mask.split_at(k);
        let (sa, sb) = (whiten_partial_sums(a, Some(ma)).unwrap(), whiten_partial_sums(b, Some(mb)).unwrap());
        let sums = GroupSums { count: sa.count + sb.count, sum: sa.sum + sb.sum };
        let mean = if sums.count > 0.0 { sums.sum / sums.count } else { 0.0 };
        let m2 = whiten_partial_squares(a, Some(ma), mean).unwrap()
            + whiten_partial_squares(b, Some(mb), mean).unwrap();
        let (mut pa, mut pb) = (a.to_vec(), b.to_vec());
        whiten_finalize(&mut pa, Some(ma), sums, m2, &o).unwrap();
        whiten_finalize(&mut pb, Some(mb), sums, m2, &o).unwrap();
        pa.extend(pb);
        for (x, y) in pa.iter().zip(&whole) {
            prop_assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{x} vs {y}");
        }
    }
}
