//! The clipped-ratio policy loss (SPEC §10): hand-computed goldens for each preset and edge
//! case, and property tests (finite-difference gradient, masked tokens, micro-batch splits).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use care_core::Error;
use care_core::grpo::{
    Advantages, Aggregation, KlEstimator, LogProb, LossInputs, LossOptions, LossOutput, LossPreset,
    LossStats, RatioLevel, policy_loss,
};
use half::{bf16, f16};
use proptest::prelude::*;

fn run<T: LogProb>(inputs: &LossInputs<'_, T>, o: &LossOptions) -> (LossOutput, Vec<f32>) {
    let mut g = vec![f32::NAN; inputs.logp.len()];
    let out = policy_loss(inputs, o, &mut g).unwrap();
    (out, g)
}

fn close(a: f64, b: f64, tol: f64) {
    assert!((a - b).abs() <= tol * (1.0 + b.abs()), "got {a}, want {b}");
}

/// One sequence of five tokens with `logp_old = 0`, so `delta = logp`; every value is exact in
/// f32, bf16 and f16. Per token: (delta, A) and by hand, with rho = exp(delta):
/// 1. (2, -1): pg1 = 7.389 > pg2 = 1.2: unclipped; verl's dual clip caps it at 3 (grad 0).
/// 2. (0.5, +1): pg1 = -1.6487 < pg2 = -1.2: clipped high, loss -1.2, grad 0.
/// 3. (-0.125, +1): rho = 0.8825 inside the band: loss -rho, grad -rho / 5.
/// 4. (-1, -1): rho = 0.3679: pg2 = 0.8 > pg1: clipped low, loss 0.8, grad 0.
/// 5. (0.0625, -1): rho = 1.0645 inside: loss rho, grad rho / 5.
const DELTA: [f32; 5] = [2.0, 0.5, -0.125, -1.0, 0.0625];
const ADV: [f32; 5] = [-1.0, 1.0, 1.0, -1.0, -1.0];
const RHO: [f64; 5] = [
    7.38905609893065,
    1.6487212707001282,
    0.8824969025845955,
    0.36787944117144233,
    1.0644944589178593,
];

fn golden<T: LogProb>(conv: fn(f32) -> T) {
    let logp: Vec<T> = DELTA.iter().map(|&x| conv(x)).collect();
    let old: Vec<T> = vec![conv(0.0); 5];
    let inputs = LossInputs {
        logp: &logp,
        logp_old: Some(&old),
        logp_ref: None,
        seq_offsets: &[0, 5],
        mask: None,
        advantages: Advantages::PerToken(&ADV),
        logp_rollout: None,
    };
    // verl: token-mean, dual clip 3.
    let (out, g) = run(&inputs, &LossOptions::preset(LossPreset::Verl));
    close(out.loss, 0.5563995112666528, 1e-14);
    let want_g = [0.0, 0.0, -RHO[2] / 5.0, 0.0, RHO[4] / 5.0];
    for (a, b) in g.iter().zip(want_g) {
        assert_eq!(*a, b as f32);
    }
    let s = out.stats;
    assert_eq!((s.tokens, s.sequences), (5.0, 1.0));
    assert_eq!(
        (s.clipped, s.clipped_low, s.clipped_high, s.dual_clipped),
        (2.0, 1.0, 1.0, 1.0)
    );
    assert_eq!(s.log_ratio_clamped, 0.0);
    assert_eq!(s.non_finite, 0.0);
    close(s.ppo_kl_sum, -1.4375, 1e-15);
    close(s.ratio_sum, 11.352648172304676, 1e-14);
    assert_eq!((s.ratio_min, s.ratio_max), (RHO[3], RHO[0]));
    assert_eq!(s.loss, out.loss);

    // trl (dapo): no dual clip, so token 1 is live: loss rho, grad rho / 5.
    let (out, g) = run(&inputs, &LossOptions::preset(LossPreset::Trl));
    close(out.loss, 1.4342107310527827, 1e-14);
    assert_eq!(g[0], 1.4778112197861302f64 as f32);
    assert_eq!(out.stats.dual_clipped, 0.0);
}

#[test]
fn golden_f32_bf16_f16_presets() {
    golden::<f32>(|x| x);
    golden::<bf16>(bf16::from_f32);
    golden::<f16>(f16::from_f32);
}

#[test]
fn loss_presets_by_name() {
    for p in LossPreset::ALL {
        assert_eq!(LossPreset::from_name(p.name()), Some(p));
    }
    assert_eq!(LossPreset::from_name("vanilla"), None);
    let v = LossOptions::preset(LossPreset::Verl);
    assert_eq!(
        (v.dual_clip, v.eps_low, v.eps_high, v.log_ratio_clamp),
        (3.0, 0.2, 0.2, 20.0)
    );
    assert_eq!(v.aggregation, Aggregation::TokenMean);
    assert_eq!(LossOptions::preset(LossPreset::Trl).dual_clip, 0.0);
}

#[test]
fn bf16_rounds_inputs_once() {
    // -0.3 is not exact in bf16: the result equals the f32 run on the bf16-rounded values.
    let lp = [-0.3f32, -1.7];
    let old = [-0.2f32, -1.5];
    let lp_b: Vec<bf16> = lp.iter().map(|&x| bf16::from_f32(x)).collect();
    let old_b: Vec<bf16> = old.iter().map(|&x| bf16::from_f32(x)).collect();
    let lp_r: Vec<f32> = lp_b.iter().map(|x| x.to_f32()).collect();
    let old_r: Vec<f32> = old_b.iter().map(|x| x.to_f32()).collect();
    let adv = Advantages::PerSequence(&[0.7]);
    let a = run(
        &LossInputs {
            logp: &lp_b,
            logp_old: Some(&old_b),
            logp_ref: None,
            seq_offsets: &[0, 2],
            mask: None,
            advantages: adv,
            logp_rollout: None,
        },
        &LossOptions::default(),
    );
    let b = run(
        &LossInputs {
            logp: &lp_r,
            logp_old: Some(&old_r),
            logp_ref: None,
            seq_offsets: &[0, 2],
            mask: None,
            advantages: adv,
            logp_rollout: None,
        },
        &LossOptions::default(),
    );
    assert_eq!(a, b);
}

#[test]
fn delta_plus_minus_100_is_clamped_and_finite() {
    let logp = [100.0f32, -100.0, 100.0, -100.0];
    let old = [0.0f32; 4];
    let adv = [1.0f32, 1.0, -1.0, -1.0];
    let inputs = LossInputs {
        logp: &logp,
        logp_old: Some(&old),
        logp_ref: None,
        seq_offsets: &[0, 4],
        mask: None,
        advantages: Advantages::PerToken(&adv),
        logp_rollout: None,
    };
    let (e20, em20) = (485165195.4097903f64, 2.061153622438558e-09);
    // trl: (A=1, e^20) clipped -1.2; (A=1, e^-20) unclipped -e^-20; (A=-1, e^20) unclipped
    // e^20; (A=-1, e^-20) clipped 0.8. Every gradient is 0: the clamp bound on every token.
    let (out, g) = run(&inputs, &LossOptions::preset(LossPreset::Trl));
    close(out.loss, (-1.2 - em20 + e20 + 0.8) / 4.0, 1e-14);
    assert_eq!(g, vec![0.0; 4]);
    assert_eq!(out.stats.log_ratio_clamped, 4.0);
    assert_eq!(out.stats.non_finite, 0.0);
    assert_eq!((out.stats.ratio_min, out.stats.ratio_max), (em20, e20));
    close(out.stats.ppo_kl_sum, 0.0, 0.0);
    // verl: the dual clip caps the third token at 3.
    let (out, _) = run(&inputs, &LossOptions::preset(LossPreset::Verl));
    close(out.loss, (-1.2 - em20 + 3.0 + 0.8) / 4.0, 1e-14);
    assert_eq!(out.stats.dual_clipped, 1.0);
}

#[test]
fn on_policy_ratio_is_one_and_gradient_flows() {
    let logp = [-1.0f32, -2.0, -0.5];
    let inputs = LossInputs {
        logp: &logp,
        logp_old: None,
        logp_ref: None,
        seq_offsets: &[0, 1, 3],
        mask: None,
        advantages: Advantages::PerSequence(&[0.5, -1.5]),
        logp_rollout: None,
    };
    let (out, g) = run(&inputs, &LossOptions::default());
    close(out.loss, (-0.5 + 1.5 + 1.5) / 3.0, 1e-15);
    assert_eq!(g, vec![-0.5 / 3.0, 0.5, 0.5]);
    assert_eq!(
        (
            out.stats.ratio_sum,
            out.stats.ratio_min,
            out.stats.ratio_max
        ),
        (3.0, 1.0, 1.0)
    );
    assert_eq!(out.stats.clipped, 0.0);
}

#[test]
fn aggregations_and_global_denominators() {
    // Two sequences, lengths 1 and 3, the last token masked; on-policy so l_t = -A.
    // Counted: N_tok = 3, N_seq = 2, H = 3 (the longest sequence, masked tokens included).
    let logp = [-1.0f32; 4];
    let mask = [1u8, 1, 1, 0];
    let inputs = LossInputs {
        logp: &logp,
        logp_old: None,
        logp_ref: None,
        seq_offsets: &[0, 1, 4],
        mask: Some(&mask),
        advantages: Advantages::PerSequence(&[1.0, 2.0]),
        logp_rollout: None,
    };
    let cases = [
        (Aggregation::TokenMean, -5.0 / 3.0, [-1.0 / 3.0, -2.0 / 3.0]),
        (Aggregation::SeqMeanTokenMean, -1.5, [-0.5, -0.5]),
        (Aggregation::SeqMeanTokenSum, -2.5, [-0.5, -1.0]),
        (
            Aggregation::SeqMeanTokenSumNorm,
            -5.0 / 6.0,
            [-1.0 / 6.0, -1.0 / 3.0],
        ),
        (Aggregation::TokenSum, -5.0, [-1.0, -2.0]),
    ];
    for (agg, l, [g0, g1]) in cases {
        let o = LossOptions {
            aggregation: agg,
            ..Default::default()
        };
        let (out, g) = run(&inputs, &o);
        close(out.loss, l, 1e-15);
        assert_eq!(g, vec![g0 as f32, g1 as f32, g1 as f32, 0.0], "{agg:?}");
    }
    let o = LossOptions {
        global_tokens: 10.0,
        ..Default::default()
    };
    close(run(&inputs, &o).0.loss, -0.5, 1e-15);
    let o = LossOptions {
        aggregation: Aggregation::SeqMeanTokenSumNorm,
        global_sequences: 4.0,
        horizon: 5.0,
        ..Default::default()
    };
    close(run(&inputs, &o).0.loss, -5.0 / 20.0, 1e-15);
}

#[test]
fn fully_masked_row_is_ignored_even_with_nan_inputs() {
    let logp = [-1.0f32, f32::NAN, f32::INFINITY, -0.5];
    let old = [-1.2f32, f32::NAN, f32::NEG_INFINITY, -0.5];
    let mask = [1u8, 0, 0, 1];
    let adv = [1.0f32, f32::NAN, 2.0];
    let inputs = LossInputs {
        logp: &logp,
        logp_old: Some(&old),
        logp_ref: Some(&old),
        seq_offsets: &[0, 1, 3, 4],
        mask: Some(&mask),
        advantages: Advantages::PerSequence(&adv),
        logp_rollout: None,
    };
    let o = LossOptions {
        aggregation: Aggregation::SeqMeanTokenMean,
        beta: 0.1,
        ..Default::default()
    };
    let (out, g) = run(&inputs, &o);
    assert!(out.loss.is_finite());
    assert_eq!(out.stats.sequences, 2.0);
    assert_eq!(out.stats.tokens, 2.0);
    assert_eq!(out.stats.non_finite, 0.0);
    assert_eq!((g[1], g[2]), (0.0, 0.0));
    assert!(g[0].is_finite() && g[3].is_finite());
    // The same batch without the masked row gives the same loss.
    let inputs2 = LossInputs {
        logp: &[-1.0f32, -0.5],
        logp_old: Some(&[-1.2f32, -0.5]),
        logp_ref: Some(&[-1.2f32, -0.5]),
        seq_offsets: &[0, 1, 2],
        mask: None,
        advantages: Advantages::PerSequence(&[1.0, 2.0]),
        logp_rollout: None,
    };
    let (out2, g2) = run(&inputs2, &o);
    assert_eq!(out.loss, out2.loss);
    assert_eq!((g[0], g[3]), (g2[0], g2[1]));
}

#[test]
fn everything_masked_gives_zero() {
    let inputs = LossInputs {
        logp: &[f32::NAN; 3],
        logp_old: None,
        logp_ref: None,
        seq_offsets: &[0, 3],
        mask: Some(&[0, 0, 0]),
        advantages: Advantages::PerSequence(&[1.0]),
        logp_rollout: None,
    };
    for agg in [
        Aggregation::TokenMean,
        Aggregation::SeqMeanTokenMean,
        Aggregation::SeqMeanTokenSumNorm,
    ] {
        let (out, g) = run(
            &inputs,
            &LossOptions {
                aggregation: agg,
                ..Default::default()
            },
        );
        assert_eq!(out.loss, 0.0);
        assert_eq!(g, vec![0.0; 3]);
        assert_eq!(
            out.stats,
            LossStats {
                sequences: 0.0,
                ..LossStats::EMPTY
            }
        );
    }
}

#[test]
fn non_finite_counted_inputs_are_counted() {
    let logp = [f32::NAN, -1.0, f32::NEG_INFINITY];
    let inputs = LossInputs {
        logp: &logp,
        logp_old: Some(&[-1.0f32; 3]),
        logp_ref: None,
        seq_offsets: &[0, 3],
        mask: None,
        advantages: Advantages::PerToken(&[1.0, f32::INFINITY, 1.0]),
        logp_rollout: None,
    };
    let (out, _) = run(&inputs, &LossOptions::default());
    assert_eq!(out.stats.non_finite, 3.0);
    assert!(!out.loss.is_finite());
}

#[test]
fn kl_estimators_goldens() {
    // On-policy, A = 0, beta = 0.1, token_sum: only the KL term. x = ref - logp = +-0.5.
    let logp = [0.0f32, 0.0, 0.0];
    let rf = [0.5f32, -0.5, 30.0];
    static MASK: [u8; 3] = [1, 1, 0];
    let mk = |kl, mask: Option<&'static [u8]>| {
        let o = LossOptions {
            beta: 0.1,
            kl_estimator: kl,
            aggregation: Aggregation::TokenSum,
            ..Default::default()
        };
        (o, mask)
    };
    let cases: [(KlEstimator, f64, [f64; 2]); 4] = [
        (KlEstimator::K1, 0.0, [0.1, 0.1]),
        (KlEstimator::Abs, 0.1, [-0.1, 0.1]),
        (KlEstimator::K2, 0.025, [-0.05, 0.05]),
        (
            KlEstimator::K3,
            0.1 * (0.1487212707001282 + 0.10653065971263342),
            [-0.06487212707001282, 0.03934693402873666],
        ),
    ];
    for (kl, l, [g0, g1]) in cases {
        let (o, m) = mk(kl, Some(&MASK));
        let inputs = LossInputs {
            logp: &logp,
            logp_old: None,
            logp_ref: Some(&rf),
            seq_offsets: &[0, 3],
            mask: m,
            advantages: Advantages::PerSequence(&[0.0]),
            logp_rollout: None,
        };
        let (out, g) = run(&inputs, &o);
        close(out.loss, l, 1e-14);
        assert_eq!(g, vec![g0 as f32, g1 as f32, 0.0], "{kl:?}");
        close(out.stats.kl_sum, l / 0.1, 1e-14);
    }
    // x = 30 is clamped to 20: k1 = -20 with gradient 0; k3 hits the output clamp 10.
    let logp = [0.0f32];
    for (kl, k) in [
        (KlEstimator::K1, -20.0),
        (KlEstimator::K2, 200.0),
        (KlEstimator::K3, 10.0),
    ] {
        let (o, _) = mk(kl, None);
        let inputs = LossInputs {
            logp: &logp,
            logp_old: None,
            logp_ref: Some(&[30.0f32]),
            seq_offsets: &[0, 1],
            mask: None,
            advantages: Advantages::PerSequence(&[0.0]),
            logp_rollout: None,
        };
        let (out, g) = run(&inputs, &o);
        close(out.loss, 0.1 * k, 1e-15);
        assert_eq!(g, vec![0.0]);
    }
    // beta = 0 or no reference: no KL term.
    let inputs = LossInputs {
        logp: &logp,
        logp_old: None,
        logp_ref: None,
        seq_offsets: &[0, 1],
        mask: None,
        advantages: Advantages::PerSequence(&[0.0]),
        logp_rollout: None,
    };
    assert_eq!(run(&inputs, &mk(KlEstimator::K3, None).0).0.loss, 0.0);
}

#[test]
fn gspo_golden() {
    // logp = [0.125, 0.25], old 0: mean delta 0.1875, rho = exp(0.1875) = 1.2062 > 1.2.
    let logp = [0.125f64, 0.25];
    let old = [0.0f64; 2];
    let rho = 0.1875f64.exp();
    let o = LossOptions {
        ratio_level: RatioLevel::Sequence,
        aggregation: Aggregation::SeqMeanTokenMean,
        ..Default::default()
    };
    // A = +1: the clipped branch binds for both tokens: loss -1.2, gradient 0.
    let inputs = LossInputs {
        logp: &logp,
        logp_old: Some(&old),
        logp_ref: None,
        seq_offsets: &[0, 2],
        mask: None,
        advantages: Advantages::PerSequence(&[1.0]),
        logp_rollout: None,
    };
    let (out, g) = run(&inputs, &o);
    close(out.loss, -1.2, 1e-15);
    assert_eq!(g, vec![0.0, 0.0]);
    assert_eq!(out.stats.clipped, 2.0);
    // A = -1: unclipped, L = rho; dL/dlogp_t = rho / n * sum_t w (-A) = rho / 2.
    let inputs = LossInputs {
        advantages: Advantages::PerSequence(&[-1.0]),
        ..inputs
    };
    let (out, g) = run(&inputs, &o);
    close(out.loss, rho, 1e-15);
    assert_eq!(g, vec![(rho / 2.0) as f32; 2]);
    assert_eq!(out.stats.ratio_sum, 2.0 * rho);
    // With the mean capped (seq_log_ratio_max = 0.1) the gradient is 0.
    let (out, g) = run(
        &inputs,
        &LossOptions {
            seq_log_ratio_max: 0.1,
            ..o
        },
    );
    close(out.loss, 0.1f64.exp(), 1e-15);
    assert_eq!(g, vec![0.0; 2]);
}

#[test]
fn argument_errors() {
    let logp = [0.0f32; 3];
    let base = LossInputs {
        logp: &logp,
        logp_old: None,
        logp_ref: None,
        seq_offsets: &[0, 3],
        mask: None,
        advantages: Advantages::PerSequence(&[1.0]),
        logp_rollout: None,
    };
    let mut g = [0.0f32; 3];
    let o = LossOptions::default();
    assert_eq!(
        policy_loss(&base, &o, &mut g[..2]),
        Err(Error::LengthMismatch)
    );
    assert_eq!(
        policy_loss(
            &LossInputs {
                seq_offsets: &[0, 2],
                ..base
            },
            &o,
            &mut g
        ),
        Err(Error::InvalidLayout)
    );
    assert_eq!(
        policy_loss(
            &LossInputs {
                advantages: Advantages::PerSequence(&[1.0, 2.0]),
                ..base
            },
            &o,
            &mut g
        ),
        Err(Error::LengthMismatch)
    );
    assert_eq!(
        policy_loss(
            &LossInputs {
                advantages: Advantages::PerToken(&[1.0]),
                ..base
            },
            &o,
            &mut g
        ),
        Err(Error::LengthMismatch)
    );
    assert_eq!(
        policy_loss(
            &LossInputs {
                logp_old: Some(&[0.0f32; 2]),
                ..base
            },
            &o,
            &mut g
        ),
        Err(Error::LengthMismatch)
    );
    assert_eq!(
        policy_loss(
            &LossInputs {
                mask: Some(&[1u8; 4]),
                ..base
            },
            &o,
            &mut g
        ),
        Err(Error::LengthMismatch)
    );
    for bad in [
        LossOptions { eps_low: -0.1, ..o },
        LossOptions {
            eps_high: f64::NAN,
            ..o
        },
        LossOptions {
            log_ratio_clamp: 0.0,
            ..o
        },
        LossOptions { beta: -1.0, ..o },
        LossOptions {
            global_tokens: f64::INFINITY,
            ..o
        },
        LossOptions {
            seq_log_ratio_max: f64::NAN,
            ..o
        },
        LossOptions {
            kl_output_clamp: -1.0,
            ..o
        },
    ] {
        assert_eq!(
            policy_loss(&base, &bad, &mut g),
            Err(Error::InvalidArgument)
        );
    }
    // An infinite log-ratio clamp is allowed (TRL's unclamped ratio).
    policy_loss(
        &base,
        &LossOptions {
            log_ratio_clamp: f64::INFINITY,
            ..o
        },
        &mut g,
    )
    .unwrap();
}

#[test]
fn stats_add_is_a_merge() {
    let mut a = LossStats::EMPTY;
    let b = LossStats {
        tokens: 2.0,
        loss: 1.5,
        ratio_min: 0.9,
        ratio_max: 1.1,
        ..LossStats::EMPTY
    };
    let c = LossStats {
        tokens: 1.0,
        loss: -0.5,
        ratio_min: 0.7,
        ratio_max: 1.0,
        ..LossStats::EMPTY
    };
    a.add(&b);
    a.add(&c);
    assert_eq!(
        (a.tokens, a.loss, a.ratio_min, a.ratio_max),
        (3.0, 1.0, 0.7, 1.1)
    );
    assert_eq!(LossStats::default(), LossStats::EMPTY);
}

// ---- property tests --------------------------------------------------------------------------

/// A random micro-batch in f64: per-token logp, old, ref, per-token and per-sequence
/// advantages, mask, and CSR offsets.
#[derive(Clone, Debug)]
struct Batch {
    logp: Vec<f64>,
    old: Vec<f64>,
    rf: Vec<f64>,
    adv_tok: Vec<f32>,
    adv_seq: Vec<f32>,
    mask: Vec<u8>,
    offsets: Vec<u32>,
}

fn batch() -> impl Strategy<Value = Batch> {
    prop::collection::vec(1usize..6, 1..5).prop_flat_map(|lens| {
        let n: usize = lens.iter().sum();
        let b = lens.len();
        let mut offsets = vec![0u32];
        for l in &lens {
            offsets.push(offsets.last().copied().unwrap() + *l as u32);
        }
        (
            prop::collection::vec(-3.0f64..0.0, n),
            prop::collection::vec(-0.6f64..0.6, n),
            prop::collection::vec(-0.8f64..0.8, n),
            prop::collection::vec(-2.0f32..2.0, n),
            prop::collection::vec(-2.0f32..2.0, b),
            prop::collection::vec(prop_oneof![4 => Just(1u8), 1 => Just(0u8)], n),
            Just(offsets),
        )
            .prop_map(
                |(logp, d_old, d_ref, adv_tok, adv_seq, mask, offsets)| Batch {
                    old: logp.iter().zip(&d_old).map(|(l, d)| l - d).collect(),
                    rf: logp.iter().zip(&d_ref).map(|(l, d)| l + d).collect(),
                    logp,
                    adv_tok,
                    adv_seq,
                    mask,
                    offsets,
                },
            )
    })
}

fn options() -> impl Strategy<Value = LossOptions> {
    (
        0usize..5,
        any::<bool>(),
        0usize..4,
        (
            prop_oneof![Just(0.0), Just(0.1)],
            prop_oneof![Just(0.0), Just(3.0)],
            prop_oneof![Just(0.2), Just(0.28)],
        ),
        (
            prop_oneof![Just(20.0), Just(0.3)],
            prop_oneof![Just(20.0), Just(0.4)],
            prop_oneof![Just(10.0), Just(0.05)],
            prop_oneof![Just(10.0), Just(0.1)],
        ),
    )
        .prop_map(
            |(agg, seq, kl, (beta, dual, eh), (lrc, kic, koc, smax))| LossOptions {
                aggregation: [
                    Aggregation::TokenMean,
                    Aggregation::SeqMeanTokenMean,
                    Aggregation::SeqMeanTokenSum,
                    Aggregation::SeqMeanTokenSumNorm,
                    Aggregation::TokenSum,
                ][agg],
                ratio_level: if seq {
                    RatioLevel::Sequence
                } else {
                    RatioLevel::Token
                },
                kl_estimator: [
                    KlEstimator::K1,
                    KlEstimator::Abs,
                    KlEstimator::K2,
                    KlEstimator::K3,
                ][kl],
                beta,
                dual_clip: dual,
                eps_high: eh,
                log_ratio_clamp: lrc,
                kl_input_clamp: kic,
                kl_output_clamp: koc,
                seq_log_ratio_max: smax,
                ..LossOptions::default()
            },
        )
}

fn loss_of(
    bt: &Batch,
    logp: &[f64],
    per_token: bool,
    on_policy: bool,
    o: &LossOptions,
    grad: &mut [f32],
) -> LossOutput {
    let inputs = LossInputs {
        logp,
        logp_old: if on_policy { None } else { Some(&bt.old) },
        logp_ref: Some(&bt.rf),
        seq_offsets: &bt.offsets,
        mask: Some(&bt.mask),
        advantages: if per_token {
            Advantages::PerToken(&bt.adv_tok)
        } else {
            Advantages::PerSequence(&bt.adv_seq)
        },
        logp_rollout: None,
    };
    policy_loss(&inputs, o, grad).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(384))]

    /// Relation: the analytic gradient equals a central finite difference of L, at every token
    /// where the two one-sided differences agree (that is, away from the clip, dual-clip and
    /// clamp kinks, which a tiny step can cross). Masked tokens: both are exactly 0.
    #[test]
    fn gradient_matches_finite_difference(bt in batch(), o in options(), per_token: bool, on_policy: bool) {
        let mut g = vec![0.0f32; bt.logp.len()];
        loss_of(&bt, &bt.logp, per_token, on_policy, &o, &mut g);
        // On-policy means logp_old = stop_gradient(logp): the finite difference holds logp_old
        // fixed at the unperturbed logp.
        let mut bt = bt;
        if on_policy {
            bt.old = bt.logp.clone();
        }
        let on_policy = false;
        let base = loss_of(&bt, &bt.logp, per_token, on_policy, &o, &mut vec![0.0f32; bt.logp.len()]).loss;
        let mut scratch = vec![0.0f32; bt.logp.len()];
        let h = 1e-6;
        for t in 0..bt.logp.len() {
            let mut lp = bt.logp.clone();
            lp[t] += h;
            let up = loss_of(&bt, &lp, per_token, on_policy, &o, &mut scratch).loss;
            lp[t] = bt.logp[t] - h;
            let dn = loss_of(&bt, &lp, per_token, on_policy, &o, &mut scratch).loss;
            let (fwd, bwd, central) = ((up - base) / h, (base - dn) / h, (up - dn) / (2.0 * h));
            if bt.mask[t] == 0 {
                prop_assert_eq!(g[t], 0.0);
                prop_assert_eq!(up, base);
                continue;
            }
            let scale = 1.0 + central.abs();
            if (fwd - bwd).abs() > 1e-4 * scale {
                continue; // a kink lies within h of this point
            }
            prop_assert!((f64::from(g[t]) - central).abs() <= 2e-5 * scale,
                "token {}: analytic {} vs central {} (fwd {}, bwd {})", t, g[t], central, fwd, bwd);
        }
    }

    /// Relation: a masked token contributes exactly nothing: its gradient is exactly +0.0 and
    /// the loss, gradient and stats are bitwise those of the same batch with the masked inputs
    /// replaced by finite values, even when they are NaN or infinite.
    #[test]
    fn masked_tokens_are_inert(bt in batch(), o in options(), per_token: bool, poison in prop_oneof![Just(f64::NAN), Just(f64::INFINITY), Just(f64::NEG_INFINITY)]) {
        let mut bad = bt.clone();
        for t in 0..bt.logp.len() {
            if bt.mask[t] == 0 {
                bad.logp[t] = poison;
                bad.old[t] = -poison;
                bad.rf[t] = poison;
                bad.adv_tok[t] = poison as f32;
            }
        }
        let mut g1 = vec![0.0f32; bt.logp.len()];
        let mut g2 = vec![0.0f32; bt.logp.len()];
        let a = loss_of(&bt, &bt.logp, per_token, false, &o, &mut g1);
        let b = loss_of(&bad, &bad.logp, per_token, false, &o, &mut g2);
        prop_assert_eq!(a.loss.to_bits(), b.loss.to_bits());
        prop_assert_eq!(a.stats, b.stats);
        prop_assert_eq!(b.stats.non_finite, 0.0);
        for t in 0..bt.logp.len() {
            prop_assert_eq!(g1[t].to_bits(), g2[t].to_bits());
            if bt.mask[t] == 0 {
                prop_assert_eq!(g2[t].to_bits(), 0.0f32.to_bits());
            }
        }
    }

    /// Relation: splitting a batch into micro-batches at sequence boundaries, each given the
    /// global denominators (N_tok, N_seq, H of the whole batch), gives losses that sum to the
    /// whole-batch loss, the same gradient bit for bit, and stats that merge to the whole's.
    #[test]
    fn micro_batches_sum_to_the_batch(bt in batch(), o in options(), per_token: bool, cuts in prop::collection::vec(any::<bool>(), 4)) {
        let b = bt.offsets.len() - 1;
        let mut g_whole = vec![0.0f32; bt.logp.len()];
        let whole = loss_of(&bt, &bt.logp, per_token, false, &o, &mut g_whole);
        let h = (0..b).map(|i| bt.offsets[i + 1] - bt.offsets[i]).max().unwrap_or(0);
        let og = LossOptions { global_tokens: whole.stats.tokens, global_sequences: whole.stats.sequences, horizon: f64::from(h), ..o };
        // Sequence boundaries where a new micro-batch starts.
        let mut starts = vec![0usize];
        for i in 1..b {
            if cuts[i - 1] { starts.push(i); }
        }
        starts.push(b);
        let mut merged = LossStats::EMPTY;
        let mut loss_sum = 0.0f64;
        let mut g_parts = Vec::new();
        for w in starts.windows(2) {
            let (s0, s1) = (w[0], w[1]);
            let (t0, t1) = (bt.offsets[s0] as usize, bt.offsets[s1] as usize);
            let part = Batch {
                logp: bt.logp[t0..t1].to_vec(),
                old: bt.old[t0..t1].to_vec(),
                rf: bt.rf[t0..t1].to_vec(),
                adv_tok: bt.adv_tok[t0..t1].to_vec(),
                adv_seq: bt.adv_seq[s0..s1].to_vec(),
                mask: bt.mask[t0..t1].to_vec(),
                offsets: bt.offsets[s0..=s1].iter().map(|x| x - bt.offsets[s0]).collect(),
            };
            let mut g = vec![0.0f32; t1 - t0];
            let out = loss_of(&part, &part.logp, per_token, false, &og, &mut g);
            loss_sum += out.loss;
            merged.add(&out.stats);
            g_parts.extend(g);
        }
        prop_assert!((loss_sum - whole.loss).abs() <= 1e-12 * (1.0 + whole.loss.abs()), "{} vs {}", loss_sum, whole.loss);
        prop_assert_eq!(&g_parts, &g_whole);
        prop_assert_eq!(merged.tokens, whole.stats.tokens);
        prop_assert_eq!(merged.sequences, whole.stats.sequences);
        prop_assert_eq!(merged.clipped, whole.stats.clipped);
        prop_assert_eq!(merged.dual_clipped, whole.stats.dual_clipped);
        prop_assert_eq!(merged.log_ratio_clamped, whole.stats.log_ratio_clamped);
        prop_assert_eq!(merged.ratio_min, whole.stats.ratio_min);
        prop_assert_eq!(merged.ratio_max, whole.stats.ratio_max);
        prop_assert!((merged.ratio_sum - whole.stats.ratio_sum).abs() <= 1e-12 * (1.0 + whole.stats.ratio_sum));
    }
}

#[test]
fn c_layouts_are_as_documented() {
    use core::mem::{offset_of, size_of};
    assert_eq!(size_of::<LossOptions>(), 408);
    assert_eq!(offset_of!(LossOptions, horizon), 80);
    assert_eq!(offset_of!(LossOptions, aggregation), 88);
    assert_eq!(offset_of!(LossOptions, kl_estimator), 96);
    assert_eq!(offset_of!(LossOptions, policy_loss), 100);
    assert_eq!(offset_of!(LossOptions, sapo_tau_pos), 104);
    assert_eq!(offset_of!(LossOptions, rollout), 152);
    assert_eq!(offset_of!(LossOptions, sequence_count), 360);
    assert_eq!(offset_of!(LossOptions, bypass), 364);
    assert_eq!(offset_of!(LossOptions, gmpo_weight_floor), 368);
    assert_eq!(offset_of!(LossOptions, vespo_lambda_neg), 400);
    assert_eq!(size_of::<LossStats>(), 14 * 8);
    assert_eq!(offset_of!(LossStats, non_finite), 11 * 8);
    assert_eq!(offset_of!(LossStats, ratio_min), 12 * 8);
    assert_eq!(Aggregation::TokenSum as u32, 4);
    assert_eq!(KlEstimator::K3 as u32, 3);
    assert_eq!(RatioLevel::Sequence as u32, 1);
}

/// A literal transcription of the SPEC §10 loss value (not the gradient), with vectors: the
/// counted tokens of each sequence are collected first, then every formula is applied as
/// written.
fn naive_loss(bt: &Batch, per_token: bool, o: &LossOptions) -> f64 {
    let b = bt.offsets.len() - 1;
    let seqs: Vec<Vec<usize>> = (0..b)
        .map(|i| {
            (bt.offsets[i] as usize..bt.offsets[i + 1] as usize)
                .filter(|&t| bt.mask[t] != 0)
                .collect()
        })
        .collect();
    let n_tok: usize = seqs.iter().map(Vec::len).sum();
    let n_seq = seqs.iter().filter(|s| !s.is_empty()).count();
    let h = (0..b)
        .map(|i| bt.offsets[i + 1] - bt.offsets[i])
        .max()
        .unwrap_or(0);
    let delta = |t: usize| (bt.logp[t] - bt.old[t]).clamp(-o.log_ratio_clamp, o.log_ratio_clamp);
    let mut total = 0.0;
    for (i, s) in seqs.iter().enumerate() {
        let n_i = s.len() as f64;
        let seq_rho = (s.iter().map(|&t| delta(t)).sum::<f64>() / n_i)
            .min(o.seq_log_ratio_max)
            .exp();
        for &t in s {
            let a = if per_token {
                f64::from(bt.adv_tok[t])
            } else {
                f64::from(bt.adv_seq[i])
            };
            let rho = if o.ratio_level == RatioLevel::Sequence {
                seq_rho
            } else {
                delta(t).exp()
            };
            let pg1 = -a * rho;
            let pg2 = -a * rho.clamp(1.0 - o.eps_low, 1.0 + o.eps_high);
            let mut l = pg1.max(pg2);
            if o.dual_clip > 1.0 && a < 0.0 {
                l = l.min(-a * o.dual_clip);
            }
            if o.beta > 0.0 {
                let x = (bt.rf[t] - bt.logp[t]).clamp(-o.kl_input_clamp, o.kl_input_clamp);
                let k = match o.kl_estimator {
                    KlEstimator::K1 => -x,
                    KlEstimator::Abs => x.abs(),
                    KlEstimator::K2 => x * x / 2.0,
                    KlEstimator::K3 => {
                        (x.exp() - x - 1.0).clamp(-o.kl_output_clamp, o.kl_output_clamp)
                    }
                };
                l += o.beta * k;
            }
            let w = match o.aggregation {
                Aggregation::TokenMean => 1.0 / n_tok as f64,
                Aggregation::SeqMeanTokenMean => 1.0 / (n_i * n_seq as f64),
                Aggregation::SeqMeanTokenSum => 1.0 / n_seq as f64,
                Aggregation::SeqMeanTokenSumNorm => 1.0 / (n_seq as f64 * f64::from(h)),
                Aggregation::TokenSum => 1.0,
                Aggregation::TokenSumNorm => 1.0 / f64::from(h),
            };
            total += w * l;
        }
    }
    total
}

proptest! {
    /// Relation: the loss of `policy_loss` equals the literal SPEC §10 formulas for every
    /// option combination (token and sequence ratio, all clips, KL estimators, aggregations).
    #[test]
    fn loss_matches_the_literal_spec_formulas(bt in batch(), o in options(), per_token: bool) {
        let mut g = vec![0.0f32; bt.logp.len()];
        let got = loss_of(&bt, &bt.logp, per_token, false, &o, &mut g).loss;
        let want = naive_loss(&bt, per_token, &o);
        prop_assert!((got - want).abs() <= 1e-12 * (1.0 + want.abs()), "{} vs {}", got, want);
    }
}
