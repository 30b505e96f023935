//! The general loop of the policy loss: every option, token or sequence ratio, with or without
//! the KL term; it hands the common case to the blocked fast path.

use super::blocked::token_level_no_kl;
use super::inputs::{Advantages, LossInputs, counted, counted_in, finite_or_absent};
use super::options::{LossOptions, RatioLevel};
use super::stats::{LossOutput, LossStats};
use super::terms::{
    TokenTerms, aggregation_weight, kl_term, log_ratio, sequence_ratio, surrogate,
    token_loss_and_grad,
};
use crate::grpo::layout::validate_offsets;
use crate::grpo::logprob::LogProb;
use crate::{Error, Result};

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
pub fn policy_loss<T: LogProb>(
    inputs: &LossInputs<'_, T>,
    opts: &LossOptions,
    grad: &mut [f32],
) -> Result<LossOutput> {
    policy_loss_with(inputs, opts, grad, true)
}

/// [`policy_loss`], with the specialized token-level loop allowed or not (`false`: every case
/// runs the general loop, which tests compare the specialized one with).
pub(super) fn policy_loss_with<T: LogProb>(
    inputs: &LossInputs<'_, T>,
    opts: &LossOptions,
    grad: &mut [f32],
    allow_fast_path: bool,
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
        let n_i = counted_in(mask, s..e) as f64;
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
    if allow_fast_path && opts.ratio_level == RatioLevel::Token && !kl_on {
        let mut st = token_level_no_kl(inputs, opts, grad, [n_tok, n_seq, h]);
        st.tokens = loc_tok;
        st.sequences = loc_seq;
        return Ok(LossOutput {
            loss: st.loss,
            stats: st,
        });
    }
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
        let n_i = counted_in(mask, range.clone()) as f64;
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
