//! The blocked fast path of [`policy_loss`](super::policy_loss): the token ratio level without
//! the KL term (the common case), in blocks of tokens, bit-identical to the general loop (the
//! tests beside this file, `blocked_tests.rs`, compare every bit).

#[cfg(test)]
#[path = "blocked_tests.rs"]
mod tests;

use super::inputs::{Advantages, LossInputs, counted_in, finite_or_absent};
use super::options::{Aggregation, LossOptions};
use super::stats::LossStats;
use super::terms::{aggregation_weight, log_ratio, surrogate};
use crate::grpo::logprob::LogProb;

/// Running sums of the token-level loop. The counts are integers here; the general loop adds
/// `0.0`/`1.0` to an `f64`, which is exact below `2^53`, so converting at the end gives the
/// same bits. The `f64` sums are added token by token in the same order as the general loop.
struct TokenSums {
    loss: f64,
    ppo_kl_sum: f64,
    ratio_sum: f64,
    ratio_min: f64,
    ratio_max: f64,
    clipped: u64,
    clipped_low: u64,
    clipped_high: u64,
    dual_clipped: u64,
    log_ratio_clamped: u64,
    non_finite: u64,
}

/// Tokens per block of the token-level loop: the buffers of a [`Block`] (about 12 KiB) stay
/// in L1, and the packed counts of [`Block::terms`] (16 bits each) cannot overflow.
const BLOCK: usize = 256;

/// The per-token values of one block of at most [`BLOCK`] tokens of a sequence, for the
/// token-level loop of [`policy_loss`](super::policy_loss). A block goes through five passes, so that no loop
/// that carries a running `f64` value calls `exp`, and most loops vectorize: (0)
/// [`Block::load`] widens the inputs, (1) [`Block::log_ratios`] computes `delta` and the
/// non-finite and clamp counts, (2) `rho = exp(delta)`, (3) the surrogate, the gradient, the
/// loss term `w * l` and the other counts, element-wise, and (4) the `f64` sums in token
/// order ((2) to (4): [`Block::ratios_and_terms`]). The operations per token are those of
/// [`token_loss_and_grad`](super::token_loss_and_grad) with `logp_ref = None`, so every result has the bits of the
/// general loop.
struct Block {
    /// The token counts (mask non-zero).
    counted: [bool; BLOCK],
    /// `logp`, `logp_old` (unused on-policy) and the advantage (unused with `adv_seq`).
    logp: [f64; BLOCK],
    old: [f64; BLOCK],
    adv: [f64; BLOCK],
    /// The clamped log ratio `delta` and whether the clamp bound.
    delta: [f64; BLOCK],
    clamped: [bool; BLOCK],
    /// `rho = exp(delta)` (counted tokens only).
    rho: [f64; BLOCK],
    /// `w * l`.
    loss: [f64; BLOCK],
    /// The advantage of the whole sequence (per-sequence advantages), else `None`.
    adv_seq: Option<f64>,
    /// No `logp_old`: `delta = 0`.
    on_policy: bool,
}

impl Block {
    /// Pass (0): the block's slices of the inputs (`logp.len() <= BLOCK`; the others as long
    /// or absent), widened into the buffers.
    #[inline(always)]
    fn load<T: LogProb>(
        &mut self,
        logp: &[T],
        old: Option<&[T]>,
        mask: Option<&[u8]>,
        adv: Option<&[f32]>,
    ) {
        let n = logp.len().min(BLOCK);
        for (d, x) in self.logp.iter_mut().zip(logp) {
            *d = x.to_f64();
        }
        self.on_policy = old.is_none();
        if let Some(o) = old {
            for (d, x) in self.old.iter_mut().zip(o) {
                *d = x.to_f64();
            }
        }
        match mask {
            Some(m) => {
                for (d, &x) in self.counted.iter_mut().zip(m) {
                    *d = x != 0;
                }
            }
            None => self.counted[..n].fill(true),
        }
        if let Some(a) = adv {
            for (d, &x) in self.adv.iter_mut().zip(a) {
                *d = f64::from(x);
            }
        }
    }

    /// Pass (1) for the first `n` tokens: `delta` and `clamped` (of every token, counted or
    /// not), and the non-finite and clamp counts of the counted ones (`u32`: at most `BLOCK`).
    #[inline(never)]
    fn log_ratios(&mut self, s: &mut TokenSums, n: usize, bound: f64) {
        let n = n.min(BLOCK);
        let (on_policy, adv_seq) = (self.on_policy, self.adv_seq);
        let (mut non_finite, mut clamps) = (0u32, 0u32);
        let outs = self.delta[..n].iter_mut().zip(&mut self.clamped[..n]);
        let ins = self.counted[..n]
            .iter()
            .zip(&self.logp[..n])
            .zip(&self.old[..n]);
        for ((d, cl), (((&c, &lp), &old), &a)) in outs.zip(ins.zip(&self.adv[..n])) {
            let old = if on_policy { None } else { Some(old) };
            let a = adv_seq.unwrap_or(a);
            let (delta, clamped) = log_ratio(lp, old, bound);
            let finite = lp.is_finite() && a.is_finite() && finite_or_absent(old);
            non_finite += u32::from(c & !finite);
            clamps += u32::from(c & clamped);
            (*d, *cl) = (delta, clamped);
        }
        s.non_finite += u64::from(non_finite);
        s.log_ratio_clamped += u64::from(clamps);
    }

    /// Passes (2) to (4) (see [`Block`]) for the first `g.len()` tokens of the block, after
    /// pass (1): `rho = exp(delta)` of the counted tokens, then [`Block::terms`] with the
    /// gradient written to `g`. Not generic and not inlined, so that the loops get the
    /// registers to themselves.
    #[inline(never)]
    fn ratios_and_terms(&mut self, s: &mut TokenSums, g: &mut [f32], wt: f64, opts: &LossOptions) {
        let n = g.len().min(BLOCK);
        let (counted, delta) = (&self.counted[..n], &self.delta[..n]);
        for ((rho, &c), &d) in self.rho[..n].iter_mut().zip(counted).zip(delta) {
            if c {
                *rho = libm::exp(d);
            }
        }
        // One loop each for the common cases, with the dual clip off (folded away) and with
        // one advantage for the whole sequence (hoisted).
        let no_dual = LossOptions {
            dual_clip: 0.0,
            ..*opts
        };
        match (opts.dual_clip_on(), self.adv_seq) {
            (false, Some(a)) => self.terms(s, g, wt, &no_dual, Some(a)),
            (false, None) => self.terms(s, g, wt, &no_dual, None),
            (true, Some(a)) => self.terms(s, g, wt, opts, Some(a)),
            (true, None) => self.terms(s, g, wt, opts, None),
        }
    }

    /// Passes (3) and (4) (see [`Block`]); `adv_seq`, when given, replaces the advantage
    /// column.
    #[inline(always)]
    fn terms(
        &mut self,
        s: &mut TokenSums,
        g: &mut [f32],
        wt: f64,
        opts: &LossOptions,
        adv_seq: Option<f64>,
    ) {
        let n = g.len().min(BLOCK);
        let (counted, delta, clamped) = (&self.counted[..n], &self.delta[..n], &self.clamped[..n]);
        let (adv, rho) = (&self.adv[..n], &self.rho[..n]);
        // (3) Element-wise, also for tokens that do not count (their `rho` is stale, their
        // results are dropped), so that the loop has no branch. The four counts share one
        // `u64`, 16 bits each (at most `BLOCK` per block).
        let mut counts = 0u64;
        let cols = counted.iter().zip(clamped).zip(adv).zip(rho);
        let outs = g.iter_mut().zip(&mut self.loss[..n]);
        for ((g, lw), (((&c, &clamped), &a), &rho)) in outs.zip(cols) {
            let a = adv_seq.unwrap_or(a);
            let t = surrogate(rho, a, opts);
            let d = if clamped { 0.0 } else { t.dloss_drho * rho };
            let narrow = crate::grpo::narrow_f32(wt * d);
            *g = if c { narrow } else { 0.0 };
            *lw = wt * t.loss;
            let k = u64::from(t.clipped)
                | (u64::from(t.clipped_low) << 16)
                | (u64::from(t.clipped_high) << 32)
                | (u64::from(t.dual_clipped) << 48);
            counts += if c { k } else { 0 };
        }
        // (4) The running `f64` values, token by token. `rho` is never `-0.0` (`exp` gives
        // `+0.0` at underflow) and the running min/max are never NaN, so the comparisons give
        // the bits of `f64::min`/`f64::max`, NaN `rho` included.
        let (mut loss, mut ppo_kl, mut ratio) = (s.loss, s.ppo_kl_sum, s.ratio_sum);
        let (mut lo, mut hi) = (s.ratio_min, s.ratio_max);
        let cols = counted.iter().zip(delta).zip(rho).zip(&self.loss[..n]);
        for (((&c, &delta), &rho), &lw) in cols {
            if c {
                loss += lw;
                ppo_kl -= delta;
                ratio += rho;
                lo = if rho < lo { rho } else { lo };
                hi = if rho > hi { rho } else { hi };
            }
        }
        (s.loss, s.ppo_kl_sum, s.ratio_sum) = (loss, ppo_kl, ratio);
        (s.ratio_min, s.ratio_max) = (lo, hi);
        s.clipped += counts & 0xffff;
        s.clipped_low += (counts >> 16) & 0xffff;
        s.clipped_high += (counts >> 32) & 0xffff;
        s.dual_clipped += counts >> 48;
    }
}

/// [`policy_loss`](super::policy_loss) at the token ratio level without the KL term (the common case), after the
/// checks and with the denominators `[N_tok, N_seq, H]`, in blocks of tokens (see [`Block`]).
/// Leaves `tokens` and `sequences` of the result at 0. Bit-identical to the general loop.
pub(super) fn token_level_no_kl<T: LogProb>(
    inputs: &LossInputs<'_, T>,
    opts: &LossOptions,
    grad: &mut [f32],
    [n_tok, n_seq, h]: [f64; 3],
) -> LossStats {
    let mut s = TokenSums {
        loss: 0.0,
        ppo_kl_sum: 0.0,
        ratio_sum: 0.0,
        ratio_min: f64::INFINITY,
        ratio_max: f64::NEG_INFINITY,
        clipped: 0,
        clipped_low: 0,
        clipped_high: 0,
        dual_clipped: 0,
        log_ratio_clamped: 0,
        non_finite: 0,
    };
    let mut b = Block {
        counted: [false; BLOCK],
        logp: [0.0; BLOCK],
        old: [0.0; BLOCK],
        adv: [0.0; BLOCK],
        delta: [0.0; BLOCK],
        clamped: [false; BLOCK],
        rho: [0.0; BLOCK],
        loss: [0.0; BLOCK],
        adv_seq: None,
        on_policy: false,
    };
    for (i, w) in inputs.seq_offsets.windows(2).enumerate() {
        let range = w[0] as usize..w[1] as usize;
        // Only `seq_mean_token_mean` reads `n_i`.
        let n_i = match opts.aggregation {
            Aggregation::SeqMeanTokenMean => counted_in(inputs.mask, range.clone()) as f64,
            _ => 0.0,
        };
        let wt = aggregation_weight(opts.aggregation, n_i, n_tok, n_seq, h);
        b.adv_seq = match inputs.advantages {
            Advantages::PerSequence(a) => Some(f64::from(a[i])),
            Advantages::PerToken(_) => None,
        };
        let mut start = range.start;
        for g in grad[range].chunks_mut(BLOCK) {
            let r = start..start + g.len();
            start = r.end;
            let adv = match inputs.advantages {
                Advantages::PerSequence(_) => None,
                Advantages::PerToken(a) => Some(&a[r.clone()]),
            };
            let old = inputs.logp_old.map(|o| &o[r.clone()]);
            let mask = inputs.mask.map(|m| &m[r.clone()]);
            b.load(&inputs.logp[r], old, mask, adv);
            b.log_ratios(&mut s, g.len(), opts.log_ratio_clamp);
            b.ratios_and_terms(&mut s, g, wt, opts);
        }
    }
    LossStats {
        loss: s.loss,
        clipped: s.clipped as f64,
        clipped_low: s.clipped_low as f64,
        clipped_high: s.clipped_high as f64,
        dual_clipped: s.dual_clipped as f64,
        ppo_kl_sum: s.ppo_kl_sum,
        ratio_sum: s.ratio_sum,
        log_ratio_clamped: s.log_ratio_clamped as f64,
        non_finite: s.non_finite as f64,
        ratio_min: s.ratio_min,
        ratio_max: s.ratio_max,
        ..LossStats::EMPTY
    }
}
