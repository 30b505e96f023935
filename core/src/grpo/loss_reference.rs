//! Test-only snapshot of [`super::policy_loss`] as it was before the specialized token-level
//! loop: one generic loop with per-token `Option` look-ups. The property test at the end checks
//! that the current implementation gives bit-identical gradients, loss and statistics.

use super::super::layout::validate_offsets;
use super::super::logprob::LogProb;
use super::{
    Advantages, LossInputs, LossOptions, LossOutput, LossStats, RatioLevel, TokenTerms,
    aggregation_weight, kl_term, log_ratio, sequence_ratio, surrogate, token_loss_and_grad,
};
use crate::{Error, Result};

#[inline]
fn counted(mask: Option<&[u8]>, t: usize) -> bool {
    mask.is_none_or(|m| m[t] != 0)
}

#[inline]
fn finite_or_absent(x: Option<f64>) -> bool {
    x.is_none_or(f64::is_finite)
}

/// The clipped-ratio policy loss of one micro-batch with its gradient `grad[T] = dL/dlogp`
/// (SPEC §10), accumulated in `f64`.
///
/// Pass global denominators in `opts` (`global_tokens`, `global_sequences`, `horizon`) to make
/// the loss and gradient of micro-batches add up to those of the whole batch. Masked tokens get
/// `grad = 0.0` exactly and contribute nothing, even if their inputs are NaN or infinite.
/// Non-finite inputs on counted tokens are counted in [`LossStats::non_finite`]; the loss and
/// gradient may then be non-finite.
///
/// Errors: [`Error::InvalidArgument`] (options), [`Error::InvalidLayout`] (offsets),
/// [`Error::LengthMismatch`] (any per-token slice, `grad` or the advantages of the wrong
/// length). Checks run before `grad` is written.
pub(super) fn policy_loss<T: LogProb>(
    inputs: &LossInputs<'_, T>,
    opts: &LossOptions,
    grad: &mut [f32],
) -> Result<LossOutput> {
    opts.validate()?;
    let n_tokens = inputs.logp.len();
    let b = validate_offsets(inputs.seq_offsets, n_tokens)?;
    let len_ok = |s: Option<usize>| s.is_none_or(|l| l == n_tokens);
    let adv_ok = match inputs.advantages {
        Advantages::PerSequence(a) => a.len() == b,
        Advantages::PerToken(a) => a.len() == n_tokens,
    };
    if grad.len() != n_tokens
        || !adv_ok
        || !len_ok(inputs.logp_old.map(<[T]>::len))
        || !len_ok(inputs.logp_ref.map(<[T]>::len))
        || !len_ok(inputs.mask.map(<[u8]>::len))
    {
        return Err(Error::LengthMismatch);
    }
    let mask = inputs.mask;
    // From here on, indexing cannot panic: the offsets were validated against `logp.len()`, and
    // every per-token slice (and `grad`) has that length, the per-sequence advantages `B`.

    // Local denominators (used where the caller passed 0).
    let (mut loc_tok, mut loc_seq, mut loc_h) = (0.0f64, 0.0f64, 0.0f64);
    for w in inputs.seq_offsets.windows(2) {
        let (s, e) = (w[0] as usize, w[1] as usize);
        let n_i = (s..e).filter(|&t| counted(mask, t)).count() as f64;
        loc_tok += n_i;
        if n_i > 0.0 {
            loc_seq += 1.0;
        }
        loc_h = loc_h.max((e - s) as f64);
    }
    let pick = |global: f64, local: f64| if global > 0.0 { global } else { local };
    let n_tok = pick(opts.global_tokens, loc_tok);
    let n_seq = pick(opts.global_sequences, loc_seq);
    let h = pick(opts.horizon, loc_h);

    let kl_on = opts.beta > 0.0 && inputs.logp_ref.is_some();
    let old_at = |t: usize| inputs.logp_old.map(|o| o[t].to_f64());
    let ref_at = |t: usize| inputs.logp_ref.filter(|_| kl_on).map(|r| r[t].to_f64());
    let adv_at = |i: usize, t: usize| match inputs.advantages {
        Advantages::PerSequence(a) => f64::from(a[i]),
        Advantages::PerToken(a) => f64::from(a[t]),
    };

    let mut st = LossStats::EMPTY;
    st.tokens = loc_tok;
    st.sequences = loc_seq;
    for (i, w) in inputs.seq_offsets.windows(2).enumerate() {
        let range = w[0] as usize..w[1] as usize;
        let n_i = range.clone().filter(|&t| counted(mask, t)).count() as f64;
        let wt = aggregation_weight(opts.aggregation, n_i, n_tok, n_seq, h);

        // GSPO: the sequence ratio from a first pass over the sequence's counted tokens.
        let seq_ratio = match opts.ratio_level {
            RatioLevel::Token => None,
            RatioLevel::Sequence if n_i > 0.0 => {
                let mut sum = 0.0f64;
                for t in range.clone().filter(|&t| counted(mask, t)) {
                    let lp = inputs.logp[t].to_f64();
                    sum += log_ratio(lp, old_at(t), opts.log_ratio_clamp).0;
                }
                Some(sequence_ratio(sum, n_i, opts.seq_log_ratio_max))
            }
            RatioLevel::Sequence => Some((1.0, true)),
        };

        // d L / d rho_i for GSPO, summed over the sequence's tokens.
        let mut dl_drho_seq = 0.0f64;
        for t in range.clone() {
            if !counted(mask, t) {
                grad[t] = 0.0;
                continue;
            }
            let lp = inputs.logp[t].to_f64();
            let old = old_at(t);
            let rf = ref_at(t);
            let a = adv_at(i, t);
            if !(lp.is_finite() && a.is_finite() && finite_or_absent(old) && finite_or_absent(rf)) {
                st.non_finite += 1.0;
            }
            let tt = match seq_ratio {
                None => token_loss_and_grad(lp, old, rf, a, opts),
                Some((rho, _)) => {
                    let (delta, clamped) = log_ratio(lp, old, opts.log_ratio_clamp);
                    let s = surrogate(rho, a, opts);
                    dl_drho_seq += wt * s.dloss_drho;
                    let mut tt = TokenTerms {
                        loss: s.loss,
                        grad: 0.0,
                        ratio: rho,
                        log_ratio: delta,
                        log_ratio_clamped: clamped,
                        surrogate: s,
                        kl: 0.0,
                    };
                    if let Some(r) = rf {
                        let k = kl_term(r - lp, opts);
                        tt.loss += opts.beta * k.k;
                        tt.grad += opts.beta * k.dk_dlogp;
                        tt.kl = k.k;
                    }
                    tt
                }
            };
            grad[t] = crate::grpo::narrow_f32(wt * tt.grad);
            st.loss += wt * tt.loss;
            st.clipped += f64::from(u8::from(tt.surrogate.clipped));
            st.clipped_low += f64::from(u8::from(tt.surrogate.clipped_low));
            st.clipped_high += f64::from(u8::from(tt.surrogate.clipped_high));
            st.dual_clipped += f64::from(u8::from(tt.surrogate.dual_clipped));
            st.ppo_kl_sum -= tt.log_ratio;
            st.kl_sum += tt.kl;
            st.ratio_sum += tt.ratio;
            st.log_ratio_clamped += f64::from(u8::from(tt.log_ratio_clamped));
            st.ratio_min = st.ratio_min.min(tt.ratio);
            st.ratio_max = st.ratio_max.max(tt.ratio);
        }

        // GSPO: the gradient through the mean, d rho_i / d logp_t = rho_i / n_i for each
        // counted token whose own log ratio was not clamped (0 when the mean was capped). The
        // KL part is recomputed here so that each gradient is rounded to f32 only once.
        if let Some((rho, capped)) = seq_ratio {
            let g_seq = if capped { 0.0 } else { dl_drho_seq * rho / n_i };
            for t in range.filter(|&t| counted(mask, t)) {
                let lp = inputs.logp[t].to_f64();
                let mut g = 0.0f64;
                if !log_ratio(lp, old_at(t), opts.log_ratio_clamp).1 {
                    g += g_seq;
                }
                if let Some(r) = ref_at(t) {
                    g += wt * opts.beta * kl_term(r - lp, opts).dk_dlogp;
                }
                grad[t] = crate::grpo::narrow_f32(g);
            }
        }
    }
    Ok(LossOutput {
        loss: st.loss,
        stats: st,
    })
}

#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::super::{Aggregation, KlEstimator};
    use super::*;
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

    /// Runs the current and the reference implementation on every combination of optional
    /// inputs (`logp_old`, `logp_ref`, mask, advantage kind) and asserts identical bits.
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
            };
            // A sentinel NaN payload, so that an element one side leaves unwritten shows up.
            let sentinel = f32::from_bits(0x7fa5_a5a5);
            let mut g_new = vec![sentinel; n];
            let mut g_ref = vec![sentinel; n];
            let new = super::super::policy_loss(&inputs, o, &mut g_new);
            let old_out = policy_loss(&inputs, o, &mut g_ref);
            let (new, old_out) = match (new, old_out) {
                (Ok(a), Ok(b)) => (a, b),
                (a, b) => {
                    assert_eq!(a.err(), b.err(), "{} combo {combo}", T::NAME);
                    continue;
                }
            };
            for (t, (a, b)) in g_new.iter().zip(&g_ref).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{} combo {combo}: grad[{t}] {a} vs reference {b}",
                    T::NAME
                );
            }
            assert!(
                same(new.loss, old_out.loss),
                "{} combo {combo}: loss {} vs reference {}",
                T::NAME,
                new.loss,
                old_out.loss
            );
            let (sa, sb) = (stats_fields(&new.stats), stats_fields(&old_out.stats));
            for (k, (a, b)) in sa.iter().zip(&sb).enumerate() {
                assert!(
                    same(*a, *b),
                    "{} combo {combo}: stats field {k}: {a} vs reference {b}",
                    T::NAME
                );
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Relation: `policy_loss` (with its specialized token-level loop) gives the same bits
        /// as the reference snapshot (gradient, loss and every statistic; NaN equals NaN for
        /// the `f64` outputs), for f32, bf16, f16 and f64 inputs, every option and every
        /// combination of optional inputs.
        #[test]
        fn fast_path_is_bit_identical_to_the_reference(c in case(), o in options()) {
            check::<f32>(&c, &o, |x| x as f32);
            check::<bf16>(&c, &o, bf16::from_f64);
            check::<f16>(&c, &o, f16::from_f64);
            check::<f64>(&c, &o, |x| x);
        }
    }
}
