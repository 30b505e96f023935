//! The policy-loss family, GSPO-token, the rollout correction inside the loss, the new
//! aggregation and sequence count, and the peer presets (SPEC §17).
//! Hand-worked goldens per term and preset, finite-difference gradients for every loss, and the
//! property tests of the issue (GSPO-token equals GSPO for advantages constant per sequence;
//! CISPO's gradient never flows through its clipped weight; `logp_rollout == logp_old` changes
//! nothing).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use care_core::grpo::{
    Advantages, Aggregation, IsLevel, KlEstimator, LossInputs, LossOptions, LossOutput, LossPreset,
    PolicyLoss, RatioLevel, RejectBound, Rejection, RejectionMode, RolloutOptions, SequenceCount,
    policy_loss,
};
use proptest::prelude::*;

fn close(a: f64, b: f64, tol: f64) {
    assert!((a - b).abs() <= tol * (1.0 + b.abs()), "got {a}, want {b}");
}

/// One call on `f64` inputs (exact), `logp_old` given.
fn run(
    logp: &[f64],
    old: &[f64],
    adv: Advantages<'_>,
    offsets: &[u32],
    mask: Option<&[u8]>,
    o: &LossOptions,
) -> (LossOutput, Vec<f32>) {
    run_with(logp, Some(old), None, adv, offsets, mask, o)
}

fn run_with(
    logp: &[f64],
    old: Option<&[f64]>,
    rollout: Option<&[f64]>,
    adv: Advantages<'_>,
    offsets: &[u32],
    mask: Option<&[u8]>,
    o: &LossOptions,
) -> (LossOutput, Vec<f32>) {
    let inputs = LossInputs {
        logp,
        logp_old: old,
        logp_ref: None,
        seq_offsets: offsets,
        mask,
        advantages: adv,
        logp_rollout: rollout,
    };
    let mut g = vec![f32::NAN; logp.len()];
    let out = policy_loss(&inputs, o, &mut g).unwrap();
    (out, g)
}

fn opts(policy: PolicyLoss) -> LossOptions {
    LossOptions {
        policy_loss: policy,
        ..LossOptions::default()
    }
}

#[test]
fn cispo_golden() {
    // logp_old = 0, so delta = logp. rho = [e^0.5, e^-0.1, e^-1] = [1.649, 0.905, 0.368]; the
    // weight clip(rho, 0.8, 1.2) = [1.2, 0.905, 0.8]; l = -w A logp; token mean over 3.
    let logp = [0.5, -0.1, -1.0];
    let adv = [1.0f32, -1.0, 1.0];
    let (out, g) = run(
        &logp,
        &[0.0; 3],
        Advantages::PerToken(&adv),
        &[0, 3],
        None,
        &opts(PolicyLoss::Cispo),
    );
    let w1 = (-0.1f64).exp();
    let l = [-1.2 * 0.5, -w1 * -1.0 * -0.1, -0.8 * -1.0];
    close(out.loss, l.iter().sum::<f64>() / 3.0, 1e-15);
    let want = [-1.2 / 3.0, w1 / 3.0, -0.8 / 3.0];
    for (a, b) in g.iter().zip(want) {
        assert_eq!(*a, b as f32);
    }
    assert_eq!(out.stats.clipped, 2.0); // tokens 0 and 2: weight clipped
    assert_eq!(out.stats.clipped_high, 1.0); // rho > 1.2 with A > 0
}

#[test]
fn sapo_golden() {
    // f(rho) = 4/tau sigmoid(tau (rho - 1)); l = -A f; dl/dlogp = -A 4 s (1 - s) rho.
    let logp = [0.5, -0.1];
    let adv = [1.0f32, -1.0];
    let (out, g) = run(
        &logp,
        &[0.0; 2],
        Advantages::PerToken(&adv),
        &[0, 2],
        None,
        &opts(PolicyLoss::Sapo),
    );
    let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
    let (r0, r1) = (0.5f64.exp(), (-0.1f64).exp());
    let (s0, s1) = (sig(r0 - 1.0), sig(1.05 * (r1 - 1.0)));
    let l = [-4.0 * s0, 4.0 / 1.05 * s1];
    close(out.loss, (l[0] + l[1]) / 2.0, 1e-15);
    let want = [
        -4.0 * s0 * (1.0 - s0) * r0 / 2.0,
        4.0 * s1 * (1.0 - s1) * r1 / 2.0,
    ];
    for (a, b) in g.iter().zip(want) {
        assert!((f64::from(*a) - b).abs() <= 1e-7 * b.abs(), "{a} vs {b}");
    }
    assert_eq!(out.stats.clipped, 0.0);
}

#[test]
fn gpg_golden() {
    // l = -A logp, no ratio: dl/dlogp = -A whatever logp_old.
    let logp = [-0.5, -2.0];
    let adv = [2.0f32, -1.0];
    let (out, g) = run(
        &logp,
        &[-9.0, 3.0],
        Advantages::PerToken(&adv),
        &[0, 2],
        None,
        &opts(PolicyLoss::Gpg),
    );
    close(out.loss, (1.0 + -2.0) / 2.0, 1e-15);
    assert_eq!(g, [-1.0, 0.5]);
}

#[test]
fn gspo_token_keeps_per_token_gradients_where_gspo_has_none() {
    // delta = [0.1, -0.1]: mean 0, s = 1; A = [1, -1]. GSPO's gradient goes through the mean:
    // (s / n) * sum_t' w (-A_t') = 0 for both tokens. GSPO-token: w (-A_t) s = [-w, +w].
    let logp = [0.1, -0.1];
    let adv = [1.0f32, -1.0];
    let seq = LossOptions {
        ratio_level: RatioLevel::Sequence,
        aggregation: Aggregation::SeqMeanTokenMean,
        ..LossOptions::default()
    };
    let tok = LossOptions {
        ratio_level: RatioLevel::SequenceToken,
        ..seq
    };
    let a = Advantages::PerToken(&adv);
    let (o1, g1) = run(&logp, &[0.0; 2], a, &[0, 2], None, &seq);
    let (o2, g2) = run(&logp, &[0.0; 2], a, &[0, 2], None, &tok);
    assert_eq!(g1, [0.0, 0.0]);
    assert_eq!(g2, [-0.5, 0.5]);
    assert_eq!(o1.loss, o2.loss); // the same value: s_i,t = s_i
    assert_eq!(o2.loss, 0.0);
}

#[test]
fn gmpo_golden() {
    // One sequence, A = 1: d~ = min(delta, clip(delta, -0.2, 0.2)) = [0.2, -0.1] for
    // delta = [0.5, -0.1]; R = exp(0.05); l = -R; seq_mean_token_mean over one sequence: L = -R.
    // Token 0's clip binds (gradient 0); token 1: w * (-R) with w = 1 / 2.
    let logp = [0.5, -0.1];
    let o = LossOptions {
        aggregation: Aggregation::SeqMeanTokenMean,
        ..opts(PolicyLoss::Gmpo)
    };
    let (out, g) = run(
        &logp,
        &[0.0; 2],
        Advantages::PerSequence(&[1.0]),
        &[0, 2],
        None,
        &o,
    );
    let r = 0.05f64.exp();
    close(out.loss, -r, 1e-15);
    assert_eq!(g, [0.0, (-0.5 * r) as f32]);
    assert_eq!((out.stats.clipped, out.stats.clipped_high), (1.0, 1.0));
    // With A = -1: max(delta, clip) = [0.5, -0.1], R = exp(0.2), l = +R, no clip binds.
    let (out, g) = run(
        &logp,
        &[0.0; 2],
        Advantages::PerSequence(&[-1.0]),
        &[0, 2],
        None,
        &o,
    );
    let r = 0.2f64.exp();
    close(out.loss, r, 1e-15);
    assert_eq!(g, [(0.5 * r) as f32; 2]);
    // verl's geo_mean divides by every row: a fully masked second sequence halves the loss.
    let p = LossOptions::preset(LossPreset::VerlGeoMean);
    let logp4 = [0.5, -0.1, -1.0, -2.0];
    let (out, _) = run(
        &logp4,
        &[0.0; 4],
        Advantages::PerSequence(&[-1.0, 3.0]),
        &[0, 2, 4],
        Some(&[1, 1, 0, 0]),
        &p,
    );
    close(out.loss, r / 2.0, 1e-15);
}

#[test]
fn kl_cov_golden() {
    // Four tokens, per-token A = [2, -2, 1, -1], logp = [-1, -3, -2, -2]: means A 0, logp -2;
    // cov = [2 * 1, -2 * -1, 1 * 0, -1 * 0] = [2, 2, 0, 0]. ratio 0.25 -> k = 1: the first of the
    // tied largest, token 0, gets + coef |delta|.
    let logp = [-1.0, -3.0, -2.0, -2.0];
    let old = [-1.5, -3.0, -2.0, -2.0]; // delta = [0.5, 0, 0, 0]
    let adv = [2.0f32, -2.0, 1.0, -1.0];
    let o = LossOptions {
        cov_ratio: 0.25,
        kl_cov_coef: 3.0,
        aggregation: Aggregation::TokenSum,
        ..opts(PolicyLoss::KlCov)
    };
    let (out, g) = run(&logp, &old, Advantages::PerToken(&adv), &[0, 4], None, &o);
    let rho = 0.5f64.exp();
    // l = -A rho (no clip) plus 3 * 0.5 on token 0.
    close(out.loss, -2.0 * rho + 1.5 + 2.0 - 1.0 + 1.0, 1e-15);
    assert_eq!(g, [(-2.0 * rho + 3.0) as f32, 2.0, -1.0, 1.0]);
    assert_eq!(out.cov_selected, 1.0);
}

#[test]
fn clip_cov_golden() {
    // As above with Clip-Cov: candidates need 1 < cov < 5 and no ordinary clip. Token 0 has
    // rho = e^0.5 > 1.2 with A > 0: already clipped, not a candidate; token 1 (cov 2) is the
    // only candidate; k = 1 selects it: its loss and gradient are 0.
    let logp = [-1.0, -3.0, -2.0, -2.0];
    let old = [-1.5, -3.0, -2.0, -2.0];
    let adv = [2.0f32, -2.0, 1.0, -1.0];
    let o = LossOptions {
        cov_ratio: 0.25,
        aggregation: Aggregation::TokenSum,
        ..opts(PolicyLoss::ClipCov)
    };
    let (out, g) = run(&logp, &old, Advantages::PerToken(&adv), &[0, 4], None, &o);
    // Token 0 clipped high: l = -2 * 1.2; token 1 selected: 0; tokens 2, 3: -A.
    close(out.loss, -2.4 - 1.0 + 1.0, 1e-15);
    assert_eq!(g, [0.0, 0.0, -1.0, 1.0]);
    assert_eq!(out.cov_selected, 1.0);
    assert_eq!(out.stats.clipped, 1.0);
}

#[test]
fn token_sum_norm_and_all_rows() {
    // verl <= 2025 seq-mean-token-sum-norm: sum_t l / H, H = the longest sequence (3 here).
    let logp = [0.0; 5];
    let adv = [1.0f32, 1.0];
    let o = LossOptions {
        aggregation: Aggregation::TokenSumNorm,
        ..LossOptions::default()
    };
    let (out, g) = run(
        &logp,
        &[0.0; 5],
        Advantages::PerSequence(&adv),
        &[0, 3, 5],
        None,
        &o,
    );
    close(out.loss, -5.0 / 3.0, 1e-15);
    assert_eq!(g, [(-1.0f64 / 3.0) as f32; 5]);
    // TRL grpo: the mean over every row, a fully masked row included (3 rows, not 2).
    let trl = LossOptions::preset(LossPreset::TrlGrpo);
    let (out, _) = run(
        &[0.0; 6],
        &[0.0; 6],
        Advantages::PerSequence(&[1.0, 1.0, 1.0]),
        &[0, 2, 4, 6],
        Some(&[1, 1, 1, 1, 0, 0]),
        &trl,
    );
    close(out.loss, -2.0 / 3.0, 1e-15);
    assert_eq!(out.stats.sequences, 2.0); // the stat still counts non-empty sequences
}

#[test]
fn rollout_weights_and_rejection_in_the_loss() {
    // logp = logp_old = 0 (rho = 1, A = 1: pg = -1 per token); logp_rollout = [0, 1, -2, 0.5]
    // -> x = old - rollout = [0, -1, 2, -0.5].
    let logp = [0.0; 4];
    let rollout = [0.0, 1.0, -2.0, 0.5];
    let adv = Advantages::PerSequence(&[1.0]);
    let mut o = LossOptions::default();
    o.rollout.is_level = IsLevel::Token;
    // Token TIS at C = 2: w = [1, e^-1, 2 (truncated e^2), e^-0.5]; token mean over 4.
    let (out, g) = run_with(
        &logp,
        Some(&[0.0; 4]),
        Some(&rollout),
        adv,
        &[0, 4],
        None,
        &o,
    );
    let w = [1.0, (-1.0f64).exp(), 2.0, (-0.5f64).exp()];
    close(out.loss, -w.iter().sum::<f64>() / 4.0, 1e-15);
    for (a, b) in g.iter().zip(w) {
        assert_eq!(*a, (-b / 4.0) as f32);
    }
    assert_eq!(out.rollout.truncated, 1.0);
    // Drop token_k2 > 1 (x = 2 is rejected): it leaves the loss and N_tok.
    o.rollout.set_bound(Rejection::TokenK2, 0.0, 1.0);
    let (out, g) = run_with(
        &logp,
        Some(&[0.0; 4]),
        Some(&rollout),
        adv,
        &[0, 4],
        None,
        &o,
    );
    close(out.loss, -(w[0] + w[1] + w[3]) / 3.0, 1e-15);
    assert_eq!(g[2], 0.0);
    assert_eq!((out.stats.tokens, out.rollout.rejected_tokens), (3.0, 1.0));
    // Weight 0 instead: it stays in N_tok.
    o.rollout.rejection_mode = RejectionMode::ZeroWeight;
    let (out, g) = run_with(
        &logp,
        Some(&[0.0; 4]),
        Some(&rollout),
        adv,
        &[0, 4],
        None,
        &o,
    );
    close(out.loss, -(w[0] + w[1] + w[3]) / 4.0, 1e-15);
    assert_eq!(g[2], 0.0);
    assert_eq!(out.stats.tokens, 4.0);
    // On-policy (no logp_old): the proximal policy is logp itself, so x = logp - rollout.
    let mut on = LossOptions::default();
    on.rollout.is_level = IsLevel::Sequence;
    on.rollout.is_threshold = f64::INFINITY;
    let (out, _) = run_with(&logp, None, Some(&rollout), adv, &[0, 4], None, &on);
    close(out.loss, -(0.5f64).exp(), 1e-15); // exp(sum x) = exp(0 - 1 + 2 - 0.5) for all 4
}

#[test]
fn presets_by_name_and_their_options() {
    for p in LossPreset::ALL {
        assert_eq!(LossPreset::from_name(p.name()), Some(p));
        assert_eq!(LossOptions::preset(p).validate(), Ok(()), "{p:?}");
    }
    let p = LossOptions::preset;
    assert_eq!(
        p(LossPreset::VerlGspo).ratio_level,
        RatioLevel::SequenceToken
    );
    assert_eq!(
        p(LossPreset::OpenRlhfGspo).ratio_level,
        RatioLevel::Sequence
    );
    assert_eq!(p(LossPreset::TrlDrGrpo).sequence_count, SequenceCount::All);
    assert_eq!(
        p(LossPreset::VerlSeqMeanTokenSumNorm).aggregation,
        Aggregation::TokenSumNorm
    );
    let c = p(LossPreset::TrlCispo);
    assert_eq!((1.0 - c.eps_low, 1.0 + c.eps_high), (0.0, 5.0));
    assert_eq!(p(LossPreset::Trl), p(LossPreset::TrlDapo));
    assert_eq!(p(LossPreset::Verl).dual_clip, 3.0);
    assert_eq!(p(LossPreset::VerlGspo).dual_clip, 0.0);
}

#[test]
fn clamps_off_reproduce_an_unclamped_peer() {
    // delta = 25, A = -1: TRL's loss is e^25 (no clamp); ours is e^20 with the safety clamp.
    let o = LossOptions::preset(LossPreset::Trl);
    let (out, _) = run(
        &[0.0],
        &[-25.0],
        Advantages::PerSequence(&[-1.0]),
        &[0, 1],
        None,
        &o,
    );
    close(out.loss, 20f64.exp(), 1e-15);
    let (out, g) = run(
        &[0.0],
        &[-25.0],
        Advantages::PerSequence(&[-1.0]),
        &[0, 1],
        None,
        &o.without_clamps(),
    );
    close(out.loss, 25f64.exp(), 1e-15);
    assert_eq!(g[0], 25f64.exp() as f32);
    let u = o.without_clamps();
    assert!(u.log_ratio_clamp.is_infinite() && u.kl_output_clamp.is_infinite());
    assert!(u.seq_log_ratio_max.is_infinite() && u.rollout.log_ratio_clamp.is_infinite());
    assert_eq!(u.validate(), Ok(()));
}

#[test]
fn new_options_are_checked() {
    let bad = |o: LossOptions| assert!(o.validate().is_err(), "{o:?}");
    let d = LossOptions::default();
    bad(LossOptions {
        sapo_tau_pos: 0.0,
        ..d
    });
    bad(LossOptions {
        cov_ratio: f64::NAN,
        ..d
    });
    bad(LossOptions {
        clip_cov_lb: 2.0,
        clip_cov_ub: 1.0,
        ..d
    });
    bad(LossOptions {
        kl_cov_coef: -1.0,
        ..d
    });
    bad(LossOptions {
        ratio_level: RatioLevel::Sequence,
        policy_loss: PolicyLoss::Cispo,
        ..d
    });
    let mut r = d;
    r.rollout.is_threshold_low = 5.0;
    bad(r);
    assert_eq!(
        LossOptions {
            clip_cov_lb: 2.0,
            clip_cov_ub: 1.0,
            ..d
        }
        .check()
        .unwrap_err()
        .field,
        "clip_cov_ub"
    );
}

// ---------------------------------------------------------------------------------------------
// Properties

#[derive(Debug, Clone)]
struct Batch {
    logp: Vec<f64>,
    old: Vec<f64>,
    rf: Vec<f64>,
    rollout: Vec<f64>,
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
            prop::collection::vec(-3.0f64..-0.05, n),
            prop::collection::vec(-0.6f64..0.6, n),
            prop::collection::vec(-0.8f64..0.8, n),
            prop::collection::vec(-0.4f64..0.4, n),
            prop::collection::vec(-2.0f32..2.0, n),
            prop::collection::vec(-2.0f32..2.0, b),
            prop::collection::vec(prop_oneof![4 => Just(1u8), 1 => Just(0u8)], n),
            Just(offsets),
        )
            .prop_map(
                |(logp, d_old, d_ref, d_roll, adv_tok, adv_seq, mask, offsets)| Batch {
                    old: logp.iter().zip(&d_old).map(|(l, d)| l - d).collect(),
                    rf: logp.iter().zip(&d_ref).map(|(l, d)| l + d).collect(),
                    rollout: logp
                        .iter()
                        .zip(&d_old)
                        .zip(&d_roll)
                        .map(|((l, d), r)| l - d - r)
                        .collect(),
                    logp,
                    adv_tok,
                    adv_seq,
                    mask,
                    offsets,
                },
            )
    })
}

fn rollout_options() -> impl Strategy<Value = RolloutOptions> {
    (0usize..3, any::<bool>(), any::<bool>(), any::<bool>()).prop_map(|(lvl, tis, rej, zero)| {
        let mut r = RolloutOptions {
            is_level: IsLevel::ALL[lvl],
            is_threshold: if tis { 1.3 } else { f64::INFINITY },
            rejection_mode: if zero {
                RejectionMode::ZeroWeight
            } else {
                RejectionMode::Drop
            },
            ..RolloutOptions::default()
        };
        if rej {
            r.reject[Rejection::TokenK2 as usize] = RejectBound {
                lower: 0.0,
                upper: 0.05,
            };
            r.reject[Rejection::SeqMeanK1 as usize] = RejectBound::ratio(1.25);
        }
        r
    })
}

fn options() -> impl Strategy<Value = LossOptions> {
    (
        0usize..7,
        0usize..3,
        0usize..6,
        0usize..4,
        prop_oneof![Just(0.0), Just(0.1)],
        prop_oneof![Just(0.0), Just(3.0)],
        rollout_options(),
        any::<bool>(),
    )
        .prop_map(|(pl, rl, agg, kl, beta, dual, rollout, all_rows)| {
            let policy_loss = PolicyLoss::ALL[pl];
            LossOptions {
                policy_loss,
                ratio_level: if policy_loss == PolicyLoss::Clip {
                    RatioLevel::ALL[rl]
                } else {
                    RatioLevel::Token
                },
                aggregation: Aggregation::ALL[agg],
                kl_estimator: KlEstimator::ALL[kl],
                beta,
                dual_clip: dual,
                cov_ratio: 0.3,
                clip_cov_lb: -0.5,
                clip_cov_ub: 0.5,
                rollout,
                sequence_count: if all_rows {
                    SequenceCount::All
                } else {
                    SequenceCount::NonEmpty
                },
                ..LossOptions::default()
            }
        })
}

fn loss_of(
    bt: &Batch,
    logp: &[f64],
    shift: f64,
    per_token: bool,
    o: &LossOptions,
    grad: &mut [f32],
) -> LossOutput {
    // `shift` moves logp_old and logp_rollout with logp (CISPO's weight then stays fixed).
    let old: Vec<f64> = bt
        .old
        .iter()
        .zip(logp)
        .zip(&bt.logp)
        .map(|((o, l), l0)| o + shift * (l - l0))
        .collect();
    let roll: Vec<f64> = bt
        .rollout
        .iter()
        .zip(logp)
        .zip(&bt.logp)
        .map(|((r, l), l0)| r + shift * (l - l0))
        .collect();
    let inputs = LossInputs {
        logp,
        logp_old: Some(&old),
        logp_ref: Some(&bt.rf),
        seq_offsets: &bt.offsets,
        mask: Some(&bt.mask),
        advantages: if per_token {
            Advantages::PerToken(&bt.adv_tok)
        } else {
            Advantages::PerSequence(&bt.adv_seq)
        },
        logp_rollout: Some(&roll),
    };
    policy_loss(&inputs, o, grad).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Relation: for every loss, ratio level, aggregation, KL term and rollout correction, the
    /// analytic gradient equals a central finite difference of L where the two one-sided
    /// differences agree (away from kinks). The rollout weights are constants for the gradient
    /// (they read logp_old, held fixed); CISPO's weight too: its difference moves logp_old and
    /// logp_rollout with logp, so the ratio and the weight stay put. GSPO-token's value holds a
    /// detached mean that no finite difference can hold fixed: its gradient is checked against
    /// its formula below, and against GSPO where the two must agree.
    #[test]
    fn gradient_matches_finite_difference(bt in batch(), o in options(), per_token: bool) {
        prop_assume!(o.ratio_level != RatioLevel::SequenceToken);
        let n = bt.logp.len();
        let shift = if o.policy_loss == PolicyLoss::Cispo { 1.0 } else { 0.0 };
        let mut g = vec![0.0f32; n];
        let base = loss_of(&bt, &bt.logp, shift, per_token, &o, &mut g).loss;
        let mut scratch = vec![0.0f32; n];
        let h = 1e-6;
        for t in 0..n {
            let mut lp = bt.logp.clone();
            lp[t] += h;
            let up = loss_of(&bt, &lp, shift, per_token, &o, &mut scratch).loss;
            lp[t] = bt.logp[t] - h;
            let dn = loss_of(&bt, &lp, shift, per_token, &o, &mut scratch).loss;
            let (fwd, bwd, central) = ((up - base) / h, (base - dn) / h, (up - dn) / (2.0 * h));
            let scale = 1.0 + central.abs();
            if (fwd - bwd).abs() > 1e-4 * scale {
                continue; // a kink lies within h of this point
            }
            prop_assert!((f64::from(g[t]) - central).abs() <= 2e-5 * scale,
                "{:?} token {}: analytic {} vs central {} (fwd {}, bwd {})", o.policy_loss, t, g[t], central, fwd, bwd);
        }
    }

    /// Relation: with advantages constant within each sequence, GSPO-token and GSPO give the
    /// same loss and the same gradient.
    #[test]
    fn gspo_token_equals_gspo_for_sequence_advantages(bt in batch(), agg in 0usize..6, dual: bool) {
        let seq = LossOptions {
            ratio_level: RatioLevel::Sequence,
            aggregation: Aggregation::ALL[agg],
            dual_clip: if dual { 3.0 } else { 0.0 },
            ..LossOptions::default()
        };
        let tok = LossOptions { ratio_level: RatioLevel::SequenceToken, ..seq };
        let n = bt.logp.len();
        let (mut g1, mut g2) = (vec![0.0f32; n], vec![0.0f32; n]);
        let none = RolloutOptions::default();
        let a = loss_of(&bt, &bt.logp, 0.0, false, &LossOptions { rollout: none, ..seq }, &mut g1);
        let b = loss_of(&bt, &bt.logp, 0.0, false, &LossOptions { rollout: none, ..tok }, &mut g2);
        prop_assert!((a.loss - b.loss).abs() <= 1e-12 * (1.0 + a.loss.abs()));
        for t in 0..n {
            prop_assert!((g1[t] - g2[t]).abs() <= 1e-6 * (1.0 + g1[t].abs()), "{} vs {}", g1[t], g2[t]);
        }
    }

    /// Relation: GSPO-token's gradient is the aggregation weight times `dpg/ds * s_i` at the
    /// sequence ratio `s_i = exp(mean delta)`, with per-token advantages.
    #[test]
    fn gspo_token_gradient_formula(bt in batch()) {
        let o = LossOptions {
            ratio_level: RatioLevel::SequenceToken,
            aggregation: Aggregation::TokenSum,
            ..LossOptions::default()
        };
        let mut g = vec![0.0f32; bt.logp.len()];
        loss_of(&bt, &bt.logp, 0.0, true, &o, &mut g);
        for w in bt.offsets.windows(2) {
            let r = w[0] as usize..w[1] as usize;
            let ts: Vec<usize> = r.clone().filter(|&t| bt.mask[t] != 0).collect();
            for t in r {
                if bt.mask[t] == 0 {
                    prop_assert_eq!(g[t], 0.0);
                    continue;
                }
                let mean = ts.iter().map(|&u| bt.logp[u] - bt.old[u]).sum::<f64>() / ts.len() as f64;
                let s = mean.exp();
                let a = f64::from(bt.adv_tok[t]);
                let unclipped = -a * s >= -a * s.clamp(0.8, 1.2);
                let want = if unclipped { -a * s } else { 0.0 };
                prop_assert!((f64::from(g[t]) - want).abs() <= 1e-6 * (1.0 + want.abs()), "{} vs {}", g[t], want);
            }
        }
    }

    /// Relation: CISPO's gradient is exactly the aggregation weight times `-clip(rho) * A`:
    /// nothing flows through the clipped weight, however the ratio moves.
    #[test]
    fn cispo_gradient_never_flows_through_the_weight(bt in batch()) {
        let o = LossOptions { policy_loss: PolicyLoss::Cispo, aggregation: Aggregation::TokenSum, ..LossOptions::default() };
        let mut g = vec![0.0f32; bt.logp.len()];
        loss_of(&bt, &bt.logp, 0.0, true, &o, &mut g);
        for (t, &gt) in g.iter().enumerate() {
            let rho = (bt.logp[t] - bt.old[t]).exp();
            let w = rho.clamp(0.8, 1.2);
            let want = if bt.mask[t] == 0 { 0.0 } else { (-w * f64::from(bt.adv_tok[t])) as f32 };
            prop_assert_eq!(gt, want);
        }
    }

    /// Relation: rollout log-probs equal to logp_old change nothing in the loss (weights 1, no
    /// rejection), for any correction whose truncation is >= 1 and whose ratio bounds hold 1.
    #[test]
    fn identical_rollout_changes_nothing(bt in batch(), o in options(), per_token: bool) {
        let mut same = bt.clone();
        same.rollout = bt.old.clone();
        let plain = LossOptions { rollout: RolloutOptions::default(), ..o };
        let n = bt.logp.len();
        let (mut g1, mut g2) = (vec![0.0f32; n], vec![0.0f32; n]);
        let a = loss_of(&same, &same.logp, 0.0, per_token, &o, &mut g1);
        let b = loss_of(&same, &same.logp, 0.0, per_token, &plain, &mut g2);
        prop_assert_eq!(a.loss.to_bits(), b.loss.to_bits());
        prop_assert_eq!(a.stats, b.stats);
        prop_assert_eq!(g1, g2);
        prop_assert_eq!(a.rollout.rejected_tokens, 0.0);
        prop_assert_eq!(a.rollout.weight_sum, a.rollout.tokens);
    }

    /// Relation: a batch split at sequence boundaries into micro-batches, each with the global
    /// denominators, gives losses that sum to the whole and the same gradient, for every loss
    /// whose terms are per call only through the denominators (not the covariance selection).
    #[test]
    fn micro_batches_sum_to_the_batch(bt in batch(), o in options(), per_token: bool, cut in any::<prop::sample::Index>()) {
        prop_assume!(!o.policy_loss.selects_by_covariance());
        let b = bt.offsets.len() - 1;
        let n = bt.logp.len();
        let mut g_whole = vec![0.0f32; n];
        let whole = loss_of(&bt, &bt.logp, 0.0, per_token, &o, &mut g_whole);
        let h = (0..b).map(|i| bt.offsets[i + 1] - bt.offsets[i]).max().unwrap_or(0);
        let n_seq = match o.sequence_count { SequenceCount::All => b as f64, SequenceCount::NonEmpty => whole.stats.sequences };
        let og = LossOptions { global_tokens: whole.stats.tokens, global_sequences: n_seq, horizon: f64::from(h), ..o };
        let k = cut.index(b + 1);
        let mut total = 0.0;
        let mut g = Vec::new();
        for (lo, hi) in [(0, k), (k, b)] {
            let base = bt.offsets[lo];
            let r = bt.offsets[lo] as usize..bt.offsets[hi] as usize;
            let part = Batch {
                logp: bt.logp[r.clone()].to_vec(),
                old: bt.old[r.clone()].to_vec(),
                rf: bt.rf[r.clone()].to_vec(),
                rollout: bt.rollout[r.clone()].to_vec(),
                adv_tok: bt.adv_tok[r.clone()].to_vec(),
                adv_seq: bt.adv_seq[lo..hi].to_vec(),
                mask: bt.mask[r].to_vec(),
                offsets: bt.offsets[lo..=hi].iter().map(|x| x - base).collect(),
            };
            let mut gp = vec![0.0f32; part.logp.len()];
            total += loss_of(&part, &part.logp, 0.0, per_token, &og, &mut gp).loss;
            g.extend(gp);
        }
        let mut gw = vec![0.0f32; n];
        let w2 = loss_of(&bt, &bt.logp, 0.0, per_token, &og, &mut gw);
        prop_assert!((total - w2.loss).abs() <= 1e-12 * (1.0 + w2.loss.abs()), "{} vs {}", total, w2.loss);
        prop_assert_eq!(g, gw);
    }
}
