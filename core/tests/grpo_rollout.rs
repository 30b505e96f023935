//! Rollout correction (SPEC §16): hand-worked goldens for the weights, every
//! rejection criterion and the diagnostics, and the property tests of the issue (a sequence weight
//! is the product of the token weights before truncation; `logp_rollout == logp_old` gives weights
//! 1 and no rejection; diagnostics add across micro-batches).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use care_core::Error;
use care_core::grpo::{
    IsLevel, RejectBound, Rejection, RejectionMode, RolloutInputs, RolloutOptions, RolloutStats,
    rollout_correction,
};
use proptest::prelude::*;

fn close(a: f64, b: f64, tol: f64) {
    assert!((a - b).abs() <= tol * (1.0 + b.abs()), "got {a}, want {b}");
}

/// Two sequences `[0, 3)` and `[3, 5)`; `x = logp_old - logp_rollout` is
/// `[0.5, -1, 0, 0, -2]` (exact in f32).
const OLD: [f32; 5] = [-1.0, -2.0, -0.5, -1.0, -3.0];
const ROLLOUT: [f32; 5] = [-1.5, -1.0, -0.5, -1.0, -1.0];
const X: [f64; 5] = [0.5, -1.0, 0.0, 0.0, -2.0];
const OFFSETS: [u32; 3] = [0, 3, 5];

fn run(opts: &RolloutOptions, mask: Option<&[u8]>) -> (RolloutStats, Vec<f32>, Vec<u8>) {
    let inputs = RolloutInputs {
        logp_old: &OLD,
        logp_rollout: &ROLLOUT,
        seq_offsets: &OFFSETS,
        mask,
    };
    let (mut w, mut keep) = (vec![f32::NAN; 5], vec![7u8; 5]);
    let st = rollout_correction(&inputs, opts, &mut w, &mut keep).unwrap();
    (st, w, keep)
}

fn k3(x: f64) -> f64 {
    x.exp() - 1.0 - x
}

#[test]
fn token_weights_truncate_at_the_threshold() {
    let mut o = RolloutOptions {
        is_level: IsLevel::Token,
        ..RolloutOptions::default()
    };
    let (st, w, keep) = run(&o, None);
    let want: Vec<f32> = X.iter().map(|x| x.exp() as f32).collect();
    assert_eq!(w, want);
    assert_eq!(keep, [1; 5]);
    assert_eq!(st.truncated, 0.0);
    close(st.weight_sum, X.iter().map(|x| x.exp()).sum(), 1e-15);
    // C = 1.5 truncates exp(0.5) = 1.6487 only.
    o.is_threshold = 1.5;
    let (st, w, _) = run(&o, None);
    assert_eq!(w[0], 1.5);
    assert_eq!(w[1], (-1.0f64).exp() as f32);
    assert_eq!(st.truncated, 1.0);
    // A lower truncation C_low = 0.5 (OpenRLHF `tis`) lifts e^-1 and e^-2 to 0.5.
    o.is_threshold_low = 0.5;
    let (st, w, _) = run(&o, None);
    assert_eq!(w, [1.5, 0.5, 1.0, 1.0, 0.5]);
    assert_eq!(st.truncated, 3.0);
}

#[test]
fn sequence_weights_are_the_clamped_truncated_product() {
    let o = RolloutOptions {
        is_level: IsLevel::Sequence,
        ..RolloutOptions::default()
    };
    let (st, w, _) = run(&o, None);
    let (w0, w1) = ((-0.5f64).exp() as f32, (-2.0f64).exp() as f32);
    assert_eq!(w, [w0, w0, w0, w1, w1]);
    assert_eq!(st.truncated, 0.0);
    // The sum is clamped to S before exp: with S = 0.25 the first sequence's -0.5 becomes -0.25.
    let o = RolloutOptions {
        log_ratio_clamp: 0.25,
        ..o
    };
    let (_, w, _) = run(&o, None);
    assert_eq!(w[0], (-0.25f64).exp() as f32);
    // A masked token leaves the product: masking token 1 leaves x = 0.5 + 0 in sequence 0.
    let o = RolloutOptions {
        is_level: IsLevel::Sequence,
        ..RolloutOptions::default()
    };
    let (st, w, keep) = run(&o, Some(&[1, 0, 1, 1, 1]));
    assert_eq!(w, [0.5f64.exp() as f32, 0.0, 0.5f64.exp() as f32, w1, w1]);
    assert_eq!(keep, [1, 0, 1, 1, 1]);
    assert_eq!(st.tokens, 4.0);
}

#[test]
fn token_k1_bounds_the_ratio_with_default_lower() {
    // upper 1.5, lower 1/1.5: keep |x| <= ln 1.5 = 0.405: tokens 2 and 3.
    let mut o = RolloutOptions::default();
    o.reject[Rejection::TokenK1 as usize] = RejectBound::ratio(1.5);
    let (st, w, keep) = run(&o, None);
    assert_eq!(keep, [0, 0, 1, 1, 0]);
    assert_eq!(w, [0.0, 0.0, 1.0, 1.0, 0.0]);
    assert_eq!((st.rejected_tokens, st.rejected_sequences), (3.0, 2.0));
    // Asymmetric bounds apply to rho = pi_old / pi_rollout (not 1 / rho): [0.3, 1.7] keeps
    // rho = e^0.5 = 1.65 and e^-1 = 0.37, rejects e^-2 = 0.135.
    o.set_bound(Rejection::TokenK1, 0.3, 1.7);
    let (_, _, keep) = run(&o, None);
    assert_eq!(keep, [1, 1, 1, 1, 0]);
    // lower 0 = no lower bound: [0, 1.7] keeps every ratio below 1.7.
    o.set_bound(Rejection::TokenK1, 0.0, 1.7);
    assert_eq!(run(&o, None).2, [1; 5]);
    o.set_bound(Rejection::TokenK1, 0.0, 1.5);
    assert_eq!(run(&o, None).2, [0, 1, 1, 1, 1]);
}

#[test]
fn zero_weight_mode_keeps_rejected_tokens_counted() {
    // OpenRLHF `icepop` [0.5, 2]: token weights, zero outside the band (e^-1, e^-2 rejected).
    let mut o = RolloutOptions {
        is_level: IsLevel::Token,
        is_threshold: f64::INFINITY,
        rejection_mode: RejectionMode::ZeroWeight,
        ..RolloutOptions::default()
    };
    o.set_bound(Rejection::TokenK1, 0.5, 2.0);
    let (st, w, keep) = run(&o, None);
    assert_eq!(keep, [1; 5]);
    assert_eq!(w, [0.5f64.exp() as f32, 0.0, 1.0, 1.0, 0.0]);
    assert_eq!((st.rejected_tokens, st.rejected_sequences), (2.0, 2.0));
}

#[test]
fn token_k2_and_k3() {
    let mut o = RolloutOptions::default();
    // k2 = x^2/2 = [0.125, 0.5, 0, 0, 2]; <= 0.5 keeps all but the last (equality passes).
    o.set_bound(Rejection::TokenK2, 0.0, 0.5);
    assert_eq!(run(&o, None).2, [1, 1, 1, 1, 0]);
    // k3 = [0.1487, 0.3679, 0, 0, 1.1353]; <= 0.2.
    let mut o = RolloutOptions::default();
    o.set_bound(Rejection::TokenK3, 0.0, 0.2);
    assert_eq!(run(&o, None).2, [1, 0, 1, 1, 0]);
}

#[test]
fn sequence_criteria_goldens() {
    // Per sequence: sum k1 = [-0.5, -2], mean k1 = [-1/6, -1]; sum k2 = [0.625, 2],
    // mean k2 = [0.2083, 1], max k2 = [0.5, 2]; sum k3 = [0.5166, 1.1353],
    // mean k3 = [0.1722, 0.5677], max k3 = [0.3679, 1.1353].
    let case = |r: Rejection, lower: f64, upper: f64| {
        let mut o = RolloutOptions::default();
        o.set_bound(r, lower, upper);
        let (st, _, keep) = run(&o, None);
        (keep, st.rejected_sequences)
    };
    let first = (vec![1u8, 1, 1, 0, 0], 1.0);
    let none = (vec![1u8; 5], 0.0);
    // seq_sum_k1 in [e^-1, e^1]: -0.5 passes, -2 fails.
    assert_eq!(case(Rejection::SeqSumK1, (-1f64).exp(), 1f64.exp()), first);
    assert_eq!(case(Rejection::SeqSumK2, 0.0, 1.0), first);
    assert_eq!(case(Rejection::SeqSumK3, 0.0, 1.0), first);
    // seq_mean_k1 in [e^-0.5, e^0.5]: -1/6 passes, -1 fails.
    let b = RejectBound::ratio(0.5f64.exp());
    assert_eq!(case(Rejection::SeqMeanK1, b.lower, b.upper), first);
    assert_eq!(case(Rejection::SeqMeanK2, 0.0, 0.5), first);
    assert_eq!(case(Rejection::SeqMeanK3, 0.0, 0.2), first);
    assert_eq!(case(Rejection::SeqMaxK2, 0.0, 1.0), first);
    assert_eq!(case(Rejection::SeqMaxK3, 0.0, 0.4), first);
    // Loose thresholds reject nothing; tight ones reject both.
    assert_eq!(case(Rejection::SeqMaxK3, 0.0, 2.0), none);
    assert_eq!(
        case(Rejection::SeqMeanK3, 0.0, 0.1),
        (vec![0u8; 5], 2.0),
        "both sequences above 0.1"
    );
}

#[test]
fn criteria_chain_with_and() {
    // token_k3 <= 0.2 rejects tokens 1 and 4; seq_max_k2 <= 1 rejects sequence 1.
    let mut o = RolloutOptions::default();
    o.set_bound(Rejection::TokenK3, 0.0, 0.2);
    o.set_bound(Rejection::SeqMaxK2, 0.0, 1.0);
    let (st, _, keep) = run(&o, None);
    assert_eq!(keep, [1, 0, 1, 0, 0]);
    assert_eq!((st.rejected_tokens, st.rejected_sequences), (3.0, 2.0));
}

#[test]
fn diagnostics_are_sums() {
    let (st, w, keep) = run(&RolloutOptions::default(), None);
    assert_eq!(w, [1.0; 5]);
    assert_eq!(keep, [1; 5]);
    assert_eq!((st.tokens, st.sequences), (5.0, 2.0));
    close(st.kl_sum, 2.5, 1e-15);
    close(st.k3_sum, X.iter().map(|&x| k3(x)).sum(), 1e-15);
    // log PPL difference per sequence: mean(logp_rollout - logp_old) = [1/6, 1].
    close(st.log_ppl_diff_sum, 1.0 / 6.0 + 1.0, 1e-15);
    close(st.log_ppl_abs_diff_sum, 1.0 / 6.0 + 1.0, 1e-15);
    close(
        st.chi2_token_sum,
        X.iter().map(|&x| (2.0 * x).exp()).sum(),
        1e-15,
    );
    close(st.chi2_seq_sum, (-1.0f64).exp() + (-4.0f64).exp(), 1e-15);
    assert_eq!(
        (st.weight_sum, st.truncated, st.non_finite),
        (5.0, 0.0, 0.0)
    );
}

#[test]
fn non_finite_inputs_are_rejected_and_counted() {
    let old = [f32::NAN, -1.0, -1.0];
    let rollout = [-1.0, f32::NEG_INFINITY, -1.0];
    let mut o = RolloutOptions {
        is_level: IsLevel::Token,
        ..RolloutOptions::default()
    };
    o.set_bound(Rejection::TokenK3, 0.0, 10.0);
    let inputs = RolloutInputs {
        logp_old: &old,
        logp_rollout: &rollout,
        seq_offsets: &[0, 1, 3],
        mask: None,
    };
    let (mut w, mut keep) = ([0.0f32; 3], [0u8; 3]);
    let st = rollout_correction(&inputs, &o, &mut w, &mut keep).unwrap();
    // NaN fails every comparison; x = +inf clamps to 20, k3 = e^20 - 21 > 10.
    assert_eq!(keep, [0, 0, 1]);
    assert_eq!(w, [0.0, 0.0, 1.0]);
    assert_eq!(st.non_finite, 2.0);
}

/// Without the clamp, `x = +inf` gives `k3 = inf - 1 - inf = NaN`: the max criteria reject
/// the sequence wherever that token sits (a NaN never replaces a running max, so without the
/// NaN flag a later token would go unseen; the kernel's unordered max relies on the flag too).
#[test]
fn unclamped_infinite_log_ratio_fails_the_max_criteria_in_any_position() {
    for pos in 0..3 {
        let mut old = [-1.0f32; 3];
        old[pos] = 0.0;
        let mut rollout = [-1.0f32; 3];
        rollout[pos] = f32::NEG_INFINITY; // x = +inf
        let mut o = RolloutOptions {
            log_ratio_clamp: f64::INFINITY,
            ..RolloutOptions::default()
        };
        o.set_bound(Rejection::SeqMaxK3, 0.0, 100.0);
        let inputs = RolloutInputs {
            logp_old: &old,
            logp_rollout: &rollout,
            seq_offsets: &[0, 3],
            mask: None,
        };
        let (mut w, mut keep) = ([0.0f32; 3], [9u8; 3]);
        let st = rollout_correction(&inputs, &o, &mut w, &mut keep).unwrap();
        assert_eq!(keep, [0, 0, 0], "token {pos}");
        assert_eq!(st.rejected_sequences, 1.0);
    }
}

#[test]
fn options_are_validated_before_writes() {
    let bad = |f: &dyn Fn(&mut RolloutOptions)| {
        let mut o = RolloutOptions::default();
        f(&mut o);
        assert_eq!(o.validate(), Err(Error::InvalidArgument), "{o:?}");
        let inputs = RolloutInputs {
            logp_old: &OLD,
            logp_rollout: &ROLLOUT,
            seq_offsets: &OFFSETS,
            mask: None,
        };
        let (mut w, mut keep) = ([9.0f32; 5], [9u8; 5]);
        let e = rollout_correction(&inputs, &o, &mut w, &mut keep);
        assert_eq!(e, Err(Error::InvalidArgument));
        assert_eq!((w, keep), ([9.0; 5], [9; 5]));
    };
    bad(&|o| o.is_threshold = 0.0);
    bad(&|o| o.is_threshold = f64::NAN);
    bad(&|o| o.log_ratio_clamp = -1.0);
    bad(&|o| o.is_threshold_low = 3.0); // above C = 2
    bad(&|o| o.is_threshold_low = -0.1);
    bad(&|o| o.set_bound(Rejection::TokenK2, 0.5, 1.0)); // a lower bound on k2
    bad(&|o| o.set_bound(Rejection::SeqSumK1, 2.0, 1.0)); // lower > upper
    bad(&|o| o.set_bound(Rejection::SeqMeanK1, -0.5, 1.0));
    bad(&|o| o.set_bound(Rejection::SeqMeanK1, f64::INFINITY, f64::INFINITY));
    bad(&|o| o.set_bound(Rejection::SeqMaxK3, 0.0, -1.0));
    bad(&|o| o.set_bound(Rejection::TokenK3, 0.0, f64::NAN));
    bad(&|o| {
        o.reject[4] = RejectBound {
            lower: 1.0,
            upper: 0.0,
        }
    }); // lower on a disabled one
    let mut ok = RolloutOptions::default();
    ok.set_bound(Rejection::TokenK2, 0.0, f64::INFINITY);
    ok.is_threshold = f64::INFINITY;
    ok.log_ratio_clamp = f64::INFINITY;
    assert_eq!(ok.validate(), Ok(()));
}

#[test]
fn layout_and_length_errors() {
    let o = RolloutOptions::default();
    let (mut w, mut keep) = ([0.0f32; 5], [0u8; 5]);
    let mut inputs = RolloutInputs {
        logp_old: &OLD,
        logp_rollout: &ROLLOUT[..4],
        seq_offsets: &OFFSETS,
        mask: None,
    };
    let r = rollout_correction(&inputs, &o, &mut w, &mut keep);
    assert_eq!(r, Err(Error::LengthMismatch));
    inputs.logp_rollout = &ROLLOUT;
    inputs.seq_offsets = &[0, 3, 4];
    let r = rollout_correction(&inputs, &o, &mut w, &mut keep);
    assert_eq!(r, Err(Error::InvalidLayout));
    inputs.seq_offsets = &OFFSETS;
    let r = rollout_correction(&inputs, &o, &mut w[..4], &mut keep);
    assert_eq!(r, Err(Error::LengthMismatch));
}

#[test]
fn names_round_trip() {
    for r in Rejection::ALL {
        assert_eq!(r.name().parse::<Rejection>(), Ok(r));
        assert_eq!(r.to_string(), r.name());
    }
    for l in IsLevel::ALL {
        assert_eq!(l.name().parse::<IsLevel>(), Ok(l));
    }
    for m in RejectionMode::ALL {
        assert_eq!(m.name().parse::<RejectionMode>(), Ok(m));
    }
    // seq_max of k1 does not exist (a max of log ratios bounds nothing useful).
    assert!("seq_max_k1".parse::<Rejection>().is_err());
    assert_eq!(Rejection::NAMES.len(), Rejection::ALL.len());
}

#[derive(Debug, Clone)]
struct Case {
    old: Vec<f32>,
    rollout: Vec<f32>,
    mask: Vec<u8>,
    offsets: Vec<u32>,
}

fn case() -> impl Strategy<Value = Case> {
    prop::collection::vec(1usize..7, 1..6).prop_flat_map(|lens| {
        let n: usize = lens.iter().sum();
        let mut offsets = vec![0u32];
        for l in &lens {
            offsets.push(offsets.last().copied().unwrap() + *l as u32);
        }
        (
            prop::collection::vec(-4.0f32..0.0, n),
            prop::collection::vec(-0.7f32..0.7, n),
            prop::collection::vec(prop_oneof![4 => Just(1u8), 1 => Just(0u8)], n),
            Just(offsets),
        )
            .prop_map(|(old, d, mask, offsets)| Case {
                rollout: old.iter().zip(&d).map(|(o, d)| o - d).collect(),
                old,
                mask,
                offsets,
            })
    })
}

fn any_bounds() -> impl Strategy<Value = RolloutOptions> {
    (
        prop::collection::vec(prop_oneof![Just(0.0), 1.0f64..3.0], 11),
        0usize..3,
        prop_oneof![Just(1.0), 1.0f64..4.0, Just(f64::INFINITY)],
    )
        .prop_map(|(ups, level, c)| {
            let mut o = RolloutOptions {
                is_level: IsLevel::ALL[level],
                is_threshold: c,
                ..RolloutOptions::default()
            };
            for (r, u) in Rejection::ALL.into_iter().zip(ups) {
                if r.is_k1() && u > 0.0 {
                    o.reject[r as usize] = RejectBound::ratio(u);
                } else {
                    o.set_bound(r, 0.0, u);
                }
            }
            o
        })
}

fn run_case(c: &Case, o: &RolloutOptions, rollout: &[f32]) -> (RolloutStats, Vec<f32>, Vec<u8>) {
    let inputs = RolloutInputs {
        logp_old: &c.old,
        logp_rollout: rollout,
        seq_offsets: &c.offsets,
        mask: Some(&c.mask),
    };
    let (mut w, mut keep) = (vec![0.0f32; c.old.len()], vec![0u8; c.old.len()]);
    let st = rollout_correction(&inputs, o, &mut w, &mut keep).unwrap();
    (st, w, keep)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Relation: the sequence weight equals the product of the token weights before
    /// truncation (no clamp, no truncation: `prod_t exp(x_t) = exp(sum_t x_t)`).
    #[test]
    fn sequence_weight_is_the_product_of_token_weights(c in case()) {
        let base = RolloutOptions {
            is_threshold: f64::INFINITY,
            log_ratio_clamp: f64::INFINITY,
            ..RolloutOptions::default()
        };
        let tok = RolloutOptions { is_level: IsLevel::Token, ..base };
        let seq = RolloutOptions { is_level: IsLevel::Sequence, ..base };
        let (_, wt, _) = run_case(&c, &tok, &c.rollout);
        let (_, ws, _) = run_case(&c, &seq, &c.rollout);
        for w in c.offsets.windows(2) {
            let r = w[0] as usize..w[1] as usize;
            let prod: f64 = r.clone().filter(|&t| c.mask[t] != 0).map(|t| f64::from(wt[t])).product();
            for t in r.filter(|&t| c.mask[t] != 0) {
                let got = f64::from(ws[t]);
                prop_assert!((got - prod).abs() <= 1e-5 * prod, "{got} vs {prod}");
            }
        }
    }

    /// Relation: `logp_rollout == logp_old` gives every counted token weight 1 and rejects
    /// nothing, for any enabled criteria whose `k1` bounds contain ratio 1 and any `C >= 1`.
    #[test]
    fn identical_policies_give_unit_weights_and_no_rejection(c in case(), o in any_bounds()) {
        let (st, w, keep) = run_case(&c, &o, &c.old);
        for t in 0..c.old.len() {
            prop_assert_eq!(keep[t], c.mask[t]);
            prop_assert_eq!(w[t], if c.mask[t] != 0 { 1.0 } else { 0.0 });
        }
        prop_assert_eq!(st.rejected_tokens, 0.0);
        prop_assert_eq!(st.truncated, 0.0);
        prop_assert_eq!(st.kl_sum, 0.0);
        prop_assert_eq!(st.chi2_token_sum, st.tokens);
    }

    /// Relation: splitting a batch at a sequence boundary gives the same weights and masks,
    /// and statistics that add up to the whole batch's.
    #[test]
    fn micro_batches_add_up(c in case(), o in any_bounds(), cut in any::<prop::sample::Index>()) {
        let (whole, w, keep) = run_case(&c, &o, &c.rollout);
        let b = c.offsets.len() - 1;
        let k = cut.index(b + 1);
        let split = c.offsets[k] as usize;
        let mut sum = RolloutStats::default();
        let (mut w2, mut keep2) = (Vec::new(), Vec::new());
        for (lo, hi) in [(0, k), (k, b)] {
            let base = c.offsets[lo];
            let offs: Vec<u32> = c.offsets[lo..=hi].iter().map(|x| x - base).collect();
            let r = c.offsets[lo] as usize..c.offsets[hi] as usize;
            let part = Case {
                old: c.old[r.clone()].to_vec(),
                rollout: c.rollout[r.clone()].to_vec(),
                mask: c.mask[r].to_vec(),
                offsets: offs,
            };
            let (st, pw, pk) = run_case(&part, &o, &part.rollout);
            sum.add(&st);
            w2.extend(pw);
            keep2.extend(pk);
        }
        prop_assert!(split <= c.old.len());
        prop_assert_eq!(w2, w);
        prop_assert_eq!(keep2, keep);
        for (a, b) in [
            (sum.tokens, whole.tokens), (sum.sequences, whole.sequences),
            (sum.rejected_tokens, whole.rejected_tokens), (sum.truncated, whole.truncated),
        ] {
            prop_assert_eq!(a, b);
        }
        for (a, b) in [
            (sum.kl_sum, whole.kl_sum), (sum.chi2_seq_sum, whole.chi2_seq_sum),
            (sum.weight_sum, whole.weight_sum), (sum.log_ppl_diff_sum, whole.log_ppl_diff_sum),
        ] {
            prop_assert!((a - b).abs() <= 1e-12 * (1.0 + b.abs()));
        }
    }
}

#[test]
fn verl_threshold_strings_parse() {
    let mut o = RolloutOptions::default();
    // One shared threshold: k1 takes [1/u, u], k3 the upper bound.
    o.set_rejections("token_k1, seq_mean_k3", "2").unwrap();
    assert_eq!(o.bound(Rejection::TokenK1), RejectBound::ratio(2.0));
    assert_eq!(o.bound(Rejection::SeqMeanK3).upper, 2.0);
    // One per option; k1 as lower_upper; the others are turned off.
    o.set_rejections("seq_sum_k1,token_k2", "0.5_3,0.01")
        .unwrap();
    assert_eq!(
        o.bound(Rejection::SeqSumK1),
        RejectBound {
            lower: 0.5,
            upper: 3.0
        }
    );
    assert_eq!(o.bound(Rejection::TokenK2).upper, 0.01);
    assert!(!o.bound(Rejection::TokenK1).on());
    // Errors leave the options unchanged.
    let before = o;
    for (opts, thr) in [
        ("token_k4", "2"),
        ("token_k1,token_k1", "2"),
        ("token_k1,token_k2,token_k3", "1,2"),
        ("token_k2", "0.5_1"),
        ("token_k2", "x"),
        ("token_k2", "0"),
        ("token_k1", "3_2"),
        ("", "2"),
    ] {
        assert_eq!(
            o.set_rejections(opts, thr),
            Err(Error::InvalidArgument),
            "{opts} {thr}"
        );
        assert_eq!(o, before);
    }
}
