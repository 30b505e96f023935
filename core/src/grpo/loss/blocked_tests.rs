//! Tests of the blocked token-level loop of [`policy_loss`]: on every input and option it must
//! give the bits of the general loop (which handles every case and is the loop the blocked one
//! was derived from).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::grpo::loss::general::policy_loss_with;
use crate::grpo::{
    Advantages, Aggregation, KlEstimator, LogProb, LossInputs, LossOptions, LossStats, RatioLevel,
    policy_loss,
};
use half::{bf16, f16};
use proptest::prelude::*;

/// Raw inputs of one case, in `f64`/`f32` before narrowing to the element type.
#[derive(Clone, Debug)]
struct Case {
    offsets: Vec<u32>,
    logp: Vec<f64>,
    old: Vec<f64>,
    rf: Vec<f64>,
    mask: Vec<u8>,
    adv_tok: Vec<f32>,
    adv_seq: Vec<f32>,
}

/// Mostly ordinary log-probs, some far enough apart for every clamp to bind, and the
/// non-finite values (which land on masked and unmasked tokens alike).
fn value() -> impl Strategy<Value = f64> {
    prop_oneof![
        10 => -6.0f64..1.0,
        3 => -80.0f64..80.0,
        1 => Just(0.0),
        1 => Just(-0.0),
        1 => Just(f64::NAN),
        1 => Just(f64::INFINITY),
        1 => Just(f64::NEG_INFINITY),
    ]
}

fn advantage() -> impl Strategy<Value = f32> {
    prop_oneof![
        10 => -3.0f32..3.0,
        1 => Just(0.0),
        1 => Just(-0.0),
        1 => Just(f32::NAN),
        1 => Just(f32::INFINITY),
        1 => Just(f32::NEG_INFINITY),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    // Empty batches and empty sequences included; some sequences span several blocks of
    // the token-level loop (64 tokens) and several 255-byte mask-count chunks.
    let len = prop_oneof![8 => 0usize..9, 1 => 60usize..600];
    prop::collection::vec(len, 0..6).prop_flat_map(|lens| {
        let n: usize = lens.iter().sum();
        let mut offsets = vec![0u32];
        for l in &lens {
            offsets.push(offsets.last().copied().unwrap() + *l as u32);
        }
        (
            prop::collection::vec(value(), n),
            prop::collection::vec(value(), n),
            prop::collection::vec(value(), n),
            prop::collection::vec(
                prop_oneof![5 => Just(1u8), 3 => Just(0u8), 1 => Just(200u8)],
                n,
            ),
            prop::collection::vec(advantage(), n),
            prop::collection::vec(advantage(), lens.len()),
            Just(offsets),
        )
            .prop_map(|(logp, old, rf, mask, adv_tok, adv_seq, offsets)| Case {
                offsets,
                logp,
                old,
                rf,
                mask,
                adv_tok,
                adv_seq,
            })
    })
}

/// Every option: each aggregation, both ratio levels, every KL estimator, `beta` 0 and
/// positive, dual clip off/at 1 (off)/on, binding and infinite clamps, global denominators.
fn options() -> impl Strategy<Value = LossOptions> {
    (
        (0usize..5, any::<bool>(), 0usize..4),
        (
            prop_oneof![Just(0.0), Just(0.2), Just(0.5)],
            prop_oneof![Just(0.0), Just(0.2), Just(0.28)],
            prop_oneof![Just(0.0), Just(0.5), Just(1.0), Just(3.0)],
        ),
        (
            prop_oneof![Just(20.0), Just(0.3), Just(1.5), Just(f64::INFINITY)],
            prop_oneof![
                Just(10.0),
                Just(0.05),
                Just(-0.5),
                Just(f64::INFINITY),
                Just(f64::NEG_INFINITY)
            ],
            prop_oneof![Just(0.0), Just(0.0), Just(0.1), Just(2.0)],
        ),
        (
            prop_oneof![Just(20.0), Just(0.4), Just(f64::INFINITY)],
            prop_oneof![Just(10.0), Just(0.05)],
        ),
        (
            prop_oneof![Just(0.0), Just(3.0), Just(1000.0)],
            prop_oneof![Just(0.0), Just(2.0)],
            prop_oneof![Just(0.0), Just(4.0)],
        ),
    )
        .prop_map(
            |((agg, seq, kl), (el, eh, dual), (lrc, smax, beta), (kic, koc), (gt, gs, h))| {
                LossOptions {
                    eps_low: el,
                    eps_high: eh,
                    dual_clip: dual,
                    log_ratio_clamp: lrc,
                    seq_log_ratio_max: smax,
                    beta,
                    kl_input_clamp: kic,
                    kl_output_clamp: koc,
                    global_tokens: gt,
                    global_sequences: gs,
                    horizon: h,
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
                    ..LossOptions::default()
                }
            },
        )
}

fn same(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

fn stats_fields(s: &LossStats) -> [f64; 14] {
    [
        s.tokens,
        s.sequences,
        s.loss,
        s.clipped,
        s.clipped_low,
        s.clipped_high,
        s.dual_clipped,
        s.ppo_kl_sum,
        s.kl_sum,
        s.ratio_sum,
        s.log_ratio_clamped,
        s.non_finite,
        s.ratio_min,
        s.ratio_max,
    ]
}

/// Runs `policy_loss` (specialized loop allowed) and the general loop alone on every
/// combination of optional inputs (`logp_old`, `logp_ref`, mask, advantage kind) and asserts
/// identical bits.
fn check<T: LogProb>(c: &Case, o: &LossOptions, conv: fn(f64) -> T) {
    let logp: Vec<T> = c.logp.iter().map(|&x| conv(x)).collect();
    let old: Vec<T> = c.old.iter().map(|&x| conv(x)).collect();
    let rf: Vec<T> = c.rf.iter().map(|&x| conv(x)).collect();
    let n = logp.len();
    for combo in 0..16u32 {
        let inputs = LossInputs {
            logp: &logp,
            logp_old: (combo & 1 != 0).then_some(&old[..]),
            logp_ref: (combo & 2 != 0).then_some(&rf[..]),
            seq_offsets: &c.offsets,
            mask: (combo & 4 != 0).then_some(&c.mask[..]),
            advantages: if combo & 8 != 0 {
                Advantages::PerToken(&c.adv_tok)
            } else {
                Advantages::PerSequence(&c.adv_seq)
            },
            logp_rollout: None,
        };
        // A sentinel NaN payload, so that an element one side leaves unwritten shows up.
        let sentinel = f32::from_bits(0x7fa5_a5a5);
        let mut g_new = vec![sentinel; n];
        let mut g_ref = vec![sentinel; n];
        let new = policy_loss(&inputs, o, &mut g_new);
        let old_out = policy_loss_with(&inputs, o, &mut g_ref, false);
        let (new, old_out) = match (new, old_out) {
            (Ok(a), Ok(b)) => (a, b),
            (a, b) => {
                assert_eq!(a.err(), b.err(), "{} combo {combo}", T::NAME);
                continue;
            }
        };
        for (t, (a, b)) in g_new.iter().zip(&g_ref).enumerate() {
            // Two NaN operands (a NaN log-prob and a NaN advantage) give either one's payload,
            // as the compiler orders the commutative multiplication; any NaN is the same
            // verdict (the input is counted as non-finite).
            assert!(
                a.to_bits() == b.to_bits()
                    || (a.is_nan()
                        && b.is_nan()
                        && a.to_bits() != sentinel.to_bits()
                        && b.to_bits() != sentinel.to_bits()),
                "{} combo {combo}: grad[{t}] {a} vs general loop {b} ({:x} vs {:x})",
                T::NAME,
                a.to_bits(),
                b.to_bits()
            );
        }
        assert!(
            same(new.loss, old_out.loss),
            "{} combo {combo}: loss {} vs general loop {}",
            T::NAME,
            new.loss,
            old_out.loss
        );
        let (sa, sb) = (stats_fields(&new.stats), stats_fields(&old_out.stats));
        for (k, (a, b)) in sa.iter().zip(&sb).enumerate() {
            assert!(
                same(*a, *b),
                "{} combo {combo}: stats field {k}: {a} vs general loop {b}",
                T::NAME
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Relation: `policy_loss` (with its specialized token-level loop) gives the same bits
    /// as the general loop (gradient, loss and every statistic; NaN equals NaN for the `f64`
    /// outputs), for f32, bf16, f16 and f64 inputs, every option and every combination of
    /// optional inputs.
    #[test]
    fn fast_path_is_bit_identical_to_the_general_loop(c in case(), o in options()) {
        check::<f32>(&c, &o, |x| x as f32);
        check::<bf16>(&c, &o, bf16::from_f64);
        check::<f16>(&c, &o, f16::from_f64);
        check::<f64>(&c, &o, |x| x);
    }
}
