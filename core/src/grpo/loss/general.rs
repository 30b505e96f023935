//! The general loop of the policy loss: every option (the clipped ratio of SPEC §10, the
//! policy-loss family of SPEC §17, the rollout correction of SPEC §16, every aggregation),
//! token or sequence ratio, with or without the KL term; it hands the common case to the
//! blocked fast path.
//!
//! Per call: (0) one pass per sequence for the rollout correction's verdicts and diagnostics and
//! the local denominators (rejected tokens leave every count); (1) for Clip-Cov and KL-Cov, the
//! means of `A` and `logp` over the counted tokens and the covariance selection ([`top_k`]);
//! (2) per sequence, the pass its ratio level needs (the mean log ratio of GSPO, the clipped
//! mean log ratio and mean advantage of GMPO), then the token terms, then for GSPO the gradient
//! through the mean. The operations per token of the clipped ratio at token level without
//! correction are those of [`token_loss_and_grad`], in the same order, so the blocked fast path
//! and this loop give the same bits (a property test).

use super::blocked::token_level_no_kl;
use super::inputs::{Advantages, LossInputs, counted, counted_in, finite_or_absent};
use super::options::{Bypass, LossOptions, RatioLevel, SequenceCount};
use super::stats::{LossOutput, LossStats};
use super::terms::{Surrogate, aggregation_weight, kl_term, log_ratio, sequence_ratio, surrogate};
use crate::grpo::family::{
    PgTerm, PolicyLoss, Selection, VESPO_LOG_W_MAX, VESPO_LOG_W_MIN, cispo_term, cov_select_count,
    covariance, gmpo_log_ratio, gpg_term, kl_cov_term, sapo_term, top_k, vespo_term, vespo_weight,
};
use crate::grpo::layout::validate_offsets;
use crate::grpo::logprob::LogProb;
use crate::grpo::narrow_f32;
use crate::grpo::rollout::{
    Resolved, RolloutStats, SeqCorrection, correct_sequence, correct_token, sequence_rollout,
};
use crate::{Error, Result};

/// The policy loss of one micro-batch with its gradient `grad[T] = dL/dlogp` (SPEC §10 and
/// SPEC §17), accumulated in `f64`.
///
/// Pass global denominators in `opts` (`global_tokens`, `global_sequences`, `horizon`) to make
/// the loss and gradient of micro-batches add up to those of the whole batch. Masked tokens get
/// `grad = 0.0` exactly and contribute nothing, even if their inputs are NaN or infinite; so do
/// tokens the rollout correction rejects under [`RejectionMode::Drop`]. Non-finite inputs on
/// counted tokens are counted in [`LossStats::non_finite`]; the loss and gradient may then be
/// non-finite.
///
/// With [`Bypass::On`] (verl's bypass mode) `logp_rollout` stands in for `logp_old`: the ratio
/// is `pi / pi_rollout`, the rollout correction compares `logp` (as constants) with
/// `logp_rollout`, and its importance weights are reported, not applied.
///
/// Errors: [`Error::InvalidArgument`] (options; [`Bypass::On`] with `logp_old` or without
/// `logp_rollout`), [`Error::InvalidLayout`] (offsets), [`Error::LengthMismatch`] (any
/// per-token slice, `grad` or the advantages of the wrong length). Checks run before `grad` is
/// written.
///
/// [`Bypass::On`]: super::Bypass::On
///
/// [`RejectionMode::Drop`]: crate::grpo::RejectionMode::Drop
pub fn policy_loss<T: LogProb>(
    inputs: &LossInputs<'_, T>,
    opts: &LossOptions,
    grad: &mut [f32],
) -> Result<LossOutput> {
    policy_loss_with(inputs, opts, grad, true)
}

/// The call's inputs and options, with the per-token and per-sequence views the passes share.
struct Ctx<'a, 'o, T: LogProb> {
    inputs: &'a LossInputs<'a, T>,
    opts: &'o LossOptions,
    kl_on: bool,
    /// The rollout correction: its resolved options and the rollout log-probs, when active.
    rollout: Option<(Resolved, &'a [T])>,
    /// verl's bypass mode: `inputs.logp_old` is the rollout log-probs, the proximal log-probs
    /// of the correction are `logp`, and the importance weights are not applied.
    bypass: bool,
}

/// What a counted token of the loss is: its importance weight (1 without correction, 0 when
/// rejected under the zero-weight mode).
type Omega = f64;

impl<'a, T: LogProb> Ctx<'a, '_, T> {
    #[inline]
    fn old_at(&self, t: usize) -> Option<f64> {
        self.inputs.logp_old.map(|o| o[t].to_f64())
    }

    #[inline]
    fn ref_at(&self, t: usize) -> Option<f64> {
        self.inputs
            .logp_ref
            .filter(|_| self.kl_on)
            .map(|r| r[t].to_f64())
    }

    #[inline]
    fn adv_at(&self, i: usize, t: usize) -> f64 {
        match self.inputs.advantages {
            Advantages::PerSequence(a) => f64::from(a[i]),
            Advantages::PerToken(a) => f64::from(a[t]),
        }
    }

    /// The proximal policy's log-prob of the rollout correction: `logp_old`, or `logp` itself
    /// on-policy and in bypass mode (a constant for the gradient).
    #[inline]
    fn prox(&self) -> &'a [T] {
        match self.inputs.logp_old {
            Some(old) if !self.bypass => old,
            _ => self.inputs.logp,
        }
    }

    /// The sequence verdict of the rollout correction (`None` without it).
    fn seq_correction(&self, range: core::ops::Range<usize>) -> Option<SeqCorrection> {
        self.rollout.map(|(r, lr)| {
            let s = sequence_rollout(self.prox(), lr, self.inputs.mask, range, r.clamp);
            correct_sequence(&s, &r)
        })
    }

    /// `Some(omega)` for a token that counts in the loss, `None` for one that does not (mask 0,
    /// or rejected under the drop mode).
    #[inline]
    fn token(&self, sc: Option<&SeqCorrection>, t: usize) -> Option<Omega> {
        if !counted(self.inputs.mask, t) {
            return None;
        }
        match (self.rollout, sc) {
            (Some((r, lr)), Some(sc)) => {
                let tc = correct_token(&r, sc, self.prox()[t].to_f64(), lr[t].to_f64());
                // Bypass mode: the weight is the ratio itself, so the correction only rejects
                // (a zero-weight rejection still weighs 0).
                let omega = tc.omega(&r);
                if self.bypass {
                    omega.map(|_| f64::from(u8::from(tc.kept)))
                } else {
                    omega
                }
            }
            _ => Some(1.0),
        }
    }

    /// The counted tokens of a sequence.
    fn counted_in(&self, sc: Option<&SeqCorrection>, range: core::ops::Range<usize>) -> f64 {
        match (self.rollout, sc) {
            (Some(_), Some(_)) => range.filter(|&t| self.token(sc, t).is_some()).count() as f64,
            // Without a correction a token counts exactly when its mask does: the vectorized
            // mask count (the fast path's denominators are taken here too).
            _ => counted_in(self.inputs.mask, range) as f64,
        }
    }

    /// The covariance-selection candidate value of token `t` of sequence `i` (`None`: not a
    /// candidate), given the means of `A` and `logp` over the counted tokens.
    fn cov_candidate(&self, i: usize, t: usize, counted: bool, means: (f64, f64)) -> Option<f64> {
        if !counted {
            return None;
        }
        let (lp, a) = (self.inputs.logp[t].to_f64(), self.adv_at(i, t));
        let cov = covariance(a, lp, means.0, means.1);
        match self.opts.policy_loss {
            PolicyLoss::KlCov => Some(cov),
            PolicyLoss::ClipCov => {
                let o = self.opts;
                let (delta, _) = log_ratio(lp, self.old_at(t), o.log_ratio_clamp);
                let clipped = surrogate(libm::exp(delta), a, o).clipped;
                (!clipped && cov > o.clip_cov_lb && cov < o.clip_cov_ub).then_some(cov)
            }
            _ => None,
        }
    }

    /// Every token's candidate value, in token order (one pass per sequence for its verdict).
    fn cov_candidates(&self, means: (f64, f64)) -> impl Iterator<Item = Option<f64>> + '_ {
        self.inputs
            .seq_offsets
            .windows(2)
            .enumerate()
            .flat_map(move |(i, w)| {
                let range = w[0] as usize..w[1] as usize;
                let sc = self.seq_correction(range.clone());
                range.map(move |t| {
                    let c = self.token(sc.as_ref(), t).is_some();
                    self.cov_candidate(i, t, c, means)
                })
            })
    }
}

/// One counted token's contribution before the aggregation weight.
struct TokenOut {
    /// `l_t = omega * pg + beta * k`.
    loss: f64,
    /// `d l_t / d logp_t` (token ratio level; GSPO's comes through the mean).
    grad: f64,
    ratio: f64,
    log_ratio: f64,
    log_ratio_clamped: bool,
    clipped: bool,
    clipped_low: bool,
    clipped_high: bool,
    dual_clipped: bool,
    kl: f64,
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
    let bypass = opts.bypass == Bypass::On;
    if bypass && (inputs.logp_old.is_some() || inputs.logp_rollout.is_none()) {
        // The rollout log-probs are the old ones: both given, or none, is a contradiction.
        return Err(Error::InvalidArgument);
    }
    // Bypass: the rollout log-probs are the old log-probs of every ratio below.
    let bypassed = LossInputs {
        logp_old: inputs.logp_rollout,
        ..*inputs
    };
    let inputs = if bypass { &bypassed } else { inputs };
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
        || !len_ok(inputs.logp_rollout.map(<[T]>::len))
        || !len_ok(inputs.mask.map(<[u8]>::len))
    {
        return Err(Error::LengthMismatch);
    }
    let mask = inputs.mask;
    // From here on, indexing cannot panic: the offsets were validated against `logp.len()`, and
    // every per-token slice (and `grad`) has that length, the per-sequence advantages `B`.
    let resolved = opts.rollout.resolved();
    let ctx = Ctx {
        inputs,
        opts,
        kl_on: opts.beta > 0.0 && inputs.logp_ref.is_some(),
        rollout: inputs
            .logp_rollout
            .filter(|_| opts.rollout.active())
            .map(|lr| (resolved, lr)),
        bypass,
    };

    // Pass 0: the rollout diagnostics (whenever `logp_rollout` is given) and the local
    // denominators, over the tokens the loss counts.
    let mut rs = RolloutStats::default();
    let (mut loc_tok, mut loc_seq, mut loc_h) = (0.0f64, 0.0f64, 0.0f64);
    // Dropped tokens with a non-finite log-prob the correction reads: the sequence weight and
    // the sequence criteria read every counted token, so they count as non-finite inputs too.
    let mut dropped_non_finite = 0.0f64;
    for w in inputs.seq_offsets.windows(2) {
        let range = w[0] as usize..w[1] as usize;
        if let Some(lr) = inputs.logp_rollout {
            rollout_diagnostics(ctx.prox(), lr, mask, range.clone(), &resolved, &mut rs);
        }
        let sc = ctx.seq_correction(range.clone());
        if let Some((_, lr)) = ctx.rollout {
            let prox = ctx.prox();
            dropped_non_finite += range
                .clone()
                .filter(|&t| counted(mask, t) && ctx.token(sc.as_ref(), t).is_none())
                .filter(|&t| !(prox[t].to_f64().is_finite() && lr[t].to_f64().is_finite()))
                .count() as f64;
        }
        let n_i = ctx.counted_in(sc.as_ref(), range.clone());
        loc_tok += n_i;
        if n_i > 0.0 {
            loc_seq += 1.0;
        }
        loc_h = loc_h.max(range.len() as f64);
    }
    let seq_count = match opts.sequence_count {
        SequenceCount::NonEmpty => loc_seq,
        SequenceCount::All => b as f64,
    };
    let pick = |global: f64, local: f64| if global > 0.0 { global } else { local };
    let n_tok = pick(opts.global_tokens, loc_tok);
    let n_seq = pick(opts.global_sequences, seq_count);
    let h = pick(opts.horizon, loc_h);

    let plain = opts.policy_loss == PolicyLoss::Clip
        && opts.ratio_level == RatioLevel::Token
        && !ctx.kl_on
        && ctx.rollout.is_none();
    if allow_fast_path && plain {
        let mut st = token_level_no_kl(inputs, opts, grad, [n_tok, n_seq, h]);
        st.tokens = loc_tok;
        st.sequences = loc_seq;
        return Ok(LossOutput {
            loss: st.loss,
            stats: st,
            rollout: rs,
            cov_selected: 0.0,
        });
    }

    // Pass 1 (Clip-Cov, KL-Cov): the covariance selection over the call's counted tokens.
    let mut sel = Selection::NONE;
    let mut means = (0.0f64, 0.0f64);
    if opts.policy_loss.selects_by_covariance() && loc_tok > 0.0 {
        let (mut sa, mut sl) = (0.0f64, 0.0f64);
        for (i, w) in inputs.seq_offsets.windows(2).enumerate() {
            let range = w[0] as usize..w[1] as usize;
            let sc = ctx.seq_correction(range.clone());
            for t in range.filter(|&t| ctx.token(sc.as_ref(), t).is_some()) {
                sa += ctx.adv_at(i, t);
                sl += inputs.logp[t].to_f64();
            }
        }
        means = (sa / loc_tok, sl / loc_tok);
        let k = cov_select_count(opts.cov_ratio, loc_tok);
        sel = top_k(k, || ctx.cov_candidates(means));
    }

    let mut st = LossStats::EMPTY;
    st.tokens = loc_tok;
    st.sequences = loc_seq;
    st.non_finite = dropped_non_finite;
    let mut cov_selected = 0.0f64;
    for (i, w) in inputs.seq_offsets.windows(2).enumerate() {
        let range = w[0] as usize..w[1] as usize;
        let sc = ctx.seq_correction(range.clone());
        let n_i = ctx.counted_in(sc.as_ref(), range.clone());
        let wt = aggregation_weight(opts.aggregation, n_i, n_tok, n_seq, h);

        // The sequence ratio of GSPO and GSPO-token, from a first pass over the counted tokens.
        let seq_ratio = match opts.ratio_level {
            RatioLevel::Token => None,
            _ if n_i > 0.0 => {
                let mut sum = 0.0f64;
                for t in range.clone() {
                    if ctx.token(sc.as_ref(), t).is_some() {
                        let lp = inputs.logp[t].to_f64();
                        sum += log_ratio(lp, ctx.old_at(t), opts.log_ratio_clamp).0;
                    }
                }
                Some(sequence_ratio(sum, n_i, opts.seq_log_ratio_max))
            }
            _ => Some((1.0, true)),
        };
        // GMPO: the mean clipped log ratio, the mean advantage and the geometric mean of the
        // importance weights, from a first pass.
        let gmpo = (opts.policy_loss == PolicyLoss::Gmpo && n_i > 0.0).then(|| {
            let (mut sd, mut sa, mut slw) = (0.0f64, 0.0f64, 0.0f64);
            for t in range.clone() {
                if let Some(omega) = ctx.token(sc.as_ref(), t) {
                    let lp = inputs.logp[t].to_f64();
                    let a = ctx.adv_at(i, t);
                    let delta = log_ratio(lp, ctx.old_at(t), opts.log_ratio_clamp).0;
                    sd += gmpo_log_ratio(delta, a, opts.eps_low, opts.eps_high).0;
                    sa += a;
                    // verl takes ln(omega + 1e-10): the floor option (0 = the exact log).
                    slw += libm::log(omega + opts.gmpo_weight_floor);
                }
            }
            let omega_i = if ctx.rollout.is_some() {
                libm::exp(slw / n_i)
            } else {
                1.0
            };
            (libm::exp(sd / n_i), sa / n_i, omega_i)
        });

        // VESPO: the sequence's clamped log importance ratio, the rollout weights folded in per
        // token (TRL multiplies its vLLM ratio into w, not into the loss), from a first pass.
        let vespo = (opts.policy_loss == PolicyLoss::Vespo && n_i > 0.0).then(|| {
            let mut s = 0.0f64;
            for t in range.clone() {
                if let Some(omega) = ctx.token(sc.as_ref(), t) {
                    let lp = inputs.logp[t].to_f64();
                    s += log_ratio(lp, ctx.old_at(t), opts.log_ratio_clamp).0;
                    if ctx.rollout.is_some() {
                        let lw = libm::log(omega);
                        s += lw.clamp(VESPO_LOG_W_MIN, VESPO_LOG_W_MAX);
                    }
                }
            }
            let log_w = s.clamp(VESPO_LOG_W_MIN, VESPO_LOG_W_MAX);
            (log_w, libm::exp(log_w))
        });

        // d L / d rho_i for GSPO, summed over the sequence's tokens.
        let mut dl_drho_seq = 0.0f64;
        for t in range.clone() {
            let Some(omega) = ctx.token(sc.as_ref(), t) else {
                grad[t] = 0.0;
                continue;
            };
            let lp = inputs.logp[t].to_f64();
            let old = ctx.old_at(t);
            let rf = ctx.ref_at(t);
            let a = ctx.adv_at(i, t);
            let lr_fin = ctx.rollout.is_none_or(|(_, lr)| lr[t].to_f64().is_finite());
            let fin = lp.is_finite() && a.is_finite() && finite_or_absent(old);
            if !(fin && finite_or_absent(rf) && lr_fin) {
                st.non_finite += 1.0;
            }
            let selected = opts.policy_loss.selects_by_covariance()
                && sel.take(ctx.cov_candidate(i, t, true, means));
            cov_selected += f64::from(u8::from(selected));
            let mut tt = match (seq_ratio, gmpo) {
                (Some((rho, capped)), _) => {
                    let (delta, clamped) = log_ratio(lp, old, opts.log_ratio_clamp);
                    let s = surrogate(rho, a, opts);
                    // GSPO-token: d s_i,t / d logp_t = s_i (0 when the mean was capped); GSPO:
                    // through the mean, after this loop.
                    let g = match opts.ratio_level {
                        RatioLevel::SequenceToken if !capped => omega * (s.dloss_drho * rho),
                        _ => 0.0,
                    };
                    dl_drho_seq += wt * (omega * s.dloss_drho);
                    surrogate_out(&s, omega, g, rho, delta, clamped)
                }
                (None, Some((ratio, a_mean, omega_i))) => {
                    let (delta, clamped) = log_ratio(lp, old, opts.log_ratio_clamp);
                    let (_, live) = gmpo_log_ratio(delta, a, opts.eps_low, opts.eps_high);
                    // Every counted token carries the sequence's loss l_i, so with the common
                    // weight w: dL/dlogp_t = n_i * w * d l_i / dlogp_t = w * l_i * live.
                    let l = -a_mean * ratio;
                    let g = if clamped { 0.0 } else { omega_i * (l * live) };
                    let bound = live == 0.0 && a != 0.0;
                    TokenOut {
                        loss: omega_i * l,
                        grad: g,
                        ratio,
                        log_ratio: delta,
                        log_ratio_clamped: clamped,
                        clipped: bound,
                        clipped_low: bound && a < 0.0,
                        clipped_high: bound && a > 0.0,
                        dual_clipped: false,
                        kl: 0.0,
                    }
                }
                (None, None) => match vespo {
                    Some((log_w, w)) => {
                        let (delta, clamped) = log_ratio(lp, old, opts.log_ratio_clamp);
                        let k = (opts.vespo_k_pos, opts.vespo_k_neg);
                        let lam = (opts.vespo_lambda_pos, opts.vespo_lambda_neg);
                        let t = vespo_term(vespo_weight(log_w, a, k, lam), lp, a);
                        TokenOut {
                            loss: t.loss,
                            grad: t.dloss_dlogp,
                            ratio: w,
                            log_ratio: delta,
                            log_ratio_clamped: clamped,
                            clipped: false,
                            clipped_low: false,
                            clipped_high: false,
                            dual_clipped: false,
                            kl: 0.0,
                        }
                    }
                    None => token_term(opts, lp, old, a, omega, selected),
                },
            };
            if let Some(r) = rf {
                let k = kl_term(r - lp, opts);
                tt.loss += opts.beta * k.k;
                tt.grad += opts.beta * k.dk_dlogp;
                tt.kl = k.k;
            }
            grad[t] = narrow_f32(wt * tt.grad);
            st.loss += wt * tt.loss;
            st.clipped += f64::from(u8::from(tt.clipped));
            st.clipped_low += f64::from(u8::from(tt.clipped_low));
            st.clipped_high += f64::from(u8::from(tt.clipped_high));
            st.dual_clipped += f64::from(u8::from(tt.dual_clipped));
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
        if let (RatioLevel::Sequence, Some((rho, capped))) = (opts.ratio_level, seq_ratio) {
            let g_seq = if capped { 0.0 } else { dl_drho_seq * rho / n_i };
            for t in range {
                if ctx.token(sc.as_ref(), t).is_none() {
                    continue;
                }
                let lp = inputs.logp[t].to_f64();
                let mut g = 0.0f64;
                if !log_ratio(lp, ctx.old_at(t), opts.log_ratio_clamp).1 {
                    g += g_seq;
                }
                if let Some(r) = ctx.ref_at(t) {
                    g += wt * opts.beta * kl_term(r - lp, opts).dk_dlogp;
                }
                grad[t] = narrow_f32(g);
            }
        }
    }
    Ok(LossOutput {
        loss: st.loss,
        stats: st,
        rollout: rs,
        cov_selected,
    })
}

/// The rollout correction's diagnostics of one sequence (before rejection), into `rs`.
fn rollout_diagnostics<T: LogProb>(
    prox: &[T],
    lr: &[T],
    mask: Option<&[u8]>,
    range: core::ops::Range<usize>,
    r: &Resolved,
    rs: &mut RolloutStats,
) {
    let s = sequence_rollout(prox, lr, mask, range.clone(), r.clamp);
    rs.add_sequence(&s, r);
    let sc = correct_sequence(&s, r);
    let mut rejected = false;
    for t in range.filter(|&t| counted(mask, t)) {
        let (p, l) = (prox[t].to_f64(), lr[t].to_f64());
        let tc = correct_token(r, &sc, p, l);
        rs.add_token(&tc, p.is_finite() && l.is_finite());
        rejected |= !tc.kept;
    }
    rs.rejected_sequences += f64::from(u8::from(rejected));
}

/// A clipped surrogate's token output with weight `omega` on the policy-gradient term and the
/// given gradient.
#[inline]
fn surrogate_out(
    s: &Surrogate,
    omega: f64,
    grad: f64,
    rho: f64,
    delta: f64,
    clamped: bool,
) -> TokenOut {
    TokenOut {
        loss: omega * s.loss,
        grad,
        ratio: rho,
        log_ratio: delta,
        log_ratio_clamped: clamped,
        clipped: s.clipped,
        clipped_low: s.clipped_low,
        clipped_high: s.clipped_high,
        dual_clipped: s.dual_clipped,
        kl: 0.0,
    }
}

/// The policy-gradient term of one counted token at the token ratio level, weighted by the
/// rollout correction's `omega` (detached). For the clipped ratio with `omega = 1` these are the
/// operations of [`token_loss_and_grad`](super::token_loss_and_grad) without the KL term.
#[inline]
fn token_term(
    o: &LossOptions,
    lp: f64,
    old: Option<f64>,
    a: f64,
    omega: f64,
    selected: bool,
) -> TokenOut {
    let (delta, clamped) = log_ratio(lp, old, o.log_ratio_clamp);
    let rho = libm::exp(delta);
    let region = |t: PgTerm| {
        let (lo, hi) = (1.0 - o.eps_low, 1.0 + o.eps_high);
        TokenOut {
            loss: omega * t.loss,
            grad: omega * t.dloss_dlogp,
            ratio: rho,
            log_ratio: delta,
            log_ratio_clamped: clamped,
            clipped: t.clipped,
            clipped_low: rho < lo && a < 0.0,
            clipped_high: rho > hi && a > 0.0,
            dual_clipped: false,
            kl: 0.0,
        }
    };
    match o.policy_loss {
        PolicyLoss::Clip | PolicyLoss::ClipCov | PolicyLoss::Gmpo => {
            let s = surrogate(rho, a, o);
            let g = if clamped { 0.0 } else { s.dloss_drho * rho };
            let mut out = surrogate_out(&s, omega, omega * g, rho, delta, clamped);
            if selected {
                // Clip-Cov: a selected token's term is multiplied by 0 (verl's `corr`), so it
                // contributes neither loss nor gradient.
                (out.loss, out.grad) = (0.0, 0.0);
            }
            out
        }
        PolicyLoss::Cispo => region(cispo_term(rho, lp, a, 1.0 - o.eps_low, 1.0 + o.eps_high)),
        PolicyLoss::Sapo => region(sapo_term(rho, a, o.sapo_tau_pos, o.sapo_tau_neg, clamped)),
        PolicyLoss::Gpg => region(gpg_term(lp, a)),
        PolicyLoss::KlCov => region(kl_cov_term(rho, delta, a, selected, o.kl_cov_coef, clamped)),
        // Per sequence (the caller's VESPO pass); a sequence without counted tokens has none.
        PolicyLoss::Vespo => region(vespo_term(0.0, lp, a)),
    }
}
