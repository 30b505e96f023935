//! The policy-loss family and the rollout correction in `grpo_loss_{f32,bf16,f16}` and
//! `grpo_loss_denoms`, run under the host emulator through the launch plan
//! (`grpo_loss_with`), against `care_core::grpo::policy_loss` with `logp_rollout`.
//!
//! Relations checked: (1) oracle: gradient, loss stats and rollout diagnostics equal the
//! reference within `care_kernels::tolerance` for every dtype, policy loss (clip at token,
//! sequence and sequence-token level, CISPO, SAPO, GPG, GMPO), aggregation, sequence count,
//! importance-weight level, rejection criterion (alone and chained) and rejection mode; tokens
//! within 1e-4 of a kink (clip bounds, clamps, truncation bounds, GMPO's log-space bounds) are
//! exempt from the per-token gradient check and from the exact clip counts, with the whole
//! sequence where the kink feeds a sequence quantity (GSPO, GMPO, the sequence weight); a case
//! whose rejection verdict lies within 1e-4 of a bound is discarded, since a flipped verdict
//! changes every denominator; (2) tokens that are masked or dropped get a gradient of exactly 0;
//! (3) `logp_rollout == logp_old` with every criterion on a loose bound gives the gradient of
//! the uncorrected loss bit for bit; (4) schedule independence and micro-batches with global
//! denominators adding up, with the correction on; (5) Clip-Cov and KL-Cov: the covariance
//! selection takes the same tokens as the reference (the count, and through the gradient
//! every token's verdict), ties to the earlier token, at every dtype, with the correction on;
//! a case whose k-th and (k+1)-th candidate covariances differ by less than 1e-9 (relative),
//! or whose candidates sit within 1e-4 of a clip bound or the covariance window, is discarded,
//! since the device's means (a tree sum) may differ from the reference's in the last bits.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use care_core::Error;
use care_core::grpo::{
    Advantages, Aggregation, Bypass, IsLevel, KlEstimator, LogProb, LossInputs, LossOptions,
    LossPreset, LossStats, PolicyLoss, RatioLevel, Rejection, RejectionMode, RolloutInputs,
    RolloutStats, SequenceCount, SequenceRollout, VESPO_LOG_W_MAX, VESPO_LOG_W_MIN,
    cov_select_count, covariance, kl_term, policy_loss, rollout_correction, rollout_log_ratio,
};
use care_kernels::params::{CovWorkRaw, LossStatsRaw, RolloutStatsRaw};
use care_kernels::plan::{
    KernelError, LossBuffers, RolloutBuffers, cov_work_address, loss_workspace_bytes,
    selects_by_covariance,
};
use care_kernels::tolerance::{Quantity, tolerance};
use care_kernels::{Dtype, Tuning, WORKSPACE_BYTES};
mod common;
use common::{Device, EmuDevice};
use proptest::prelude::*;

trait Lp: LogProb + bytemuck::Pod + core::fmt::Debug {
    const DTYPE: Dtype;
    fn from_f32(x: f32) -> Self;
}
impl Lp for f32 {
    const DTYPE: Dtype = Dtype::F32;
    fn from_f32(x: f32) -> Self {
        x
    }
}
impl Lp for half::bf16 {
    const DTYPE: Dtype = Dtype::Bf16;
    fn from_f32(x: f32) -> Self {
        half::bf16::from_f32(x)
    }
}
impl Lp for half::f16 {
    const DTYPE: Dtype = Dtype::F16;
    fn from_f32(x: f32) -> Self {
        half::f16::from_f32(x)
    }
}

/// Inputs in f32; converted to the dtype under test (the reference sees the same values).
#[derive(Clone, Debug)]
struct Case {
    lens: Vec<u32>,
    logp: Vec<f32>,
    logp_old: Option<Vec<f32>>,
    logp_ref: Option<Vec<f32>>,
    logp_rollout: Option<Vec<f32>>,
    adv: Vec<f32>,
    adv_per_token: bool,
    mask: Option<Vec<u8>>,
    opts: LossOptions,
}

fn offsets(lens: &[u32]) -> Vec<u32> {
    let mut o = vec![0u32];
    for l in lens {
        o.push(o.last().unwrap() + l);
    }
    o
}

fn conv<T: Lp>(v: &[f32]) -> Vec<T> {
    v.iter().map(|&x| T::from_f32(x)).collect()
}

fn wide<T: Lp>(v: &[f32]) -> Vec<f64> {
    conv::<T>(v).iter().map(|x| x.to_f64()).collect()
}

struct Out {
    grad: Vec<f32>,
    stats: LossStats,
    rollout: RolloutStats,
    /// Clip-Cov / KL-Cov: the tokens the covariance selection took.
    cov_selected: f64,
}

fn run_reference<T: Lp>(c: &Case) -> Out {
    let logp = conv::<T>(&c.logp);
    let old = c.logp_old.as_deref().map(conv::<T>);
    let rf = c.logp_ref.as_deref().map(conv::<T>);
    let lr = c.logp_rollout.as_deref().map(conv::<T>);
    let o = offsets(&c.lens);
    let inputs = LossInputs {
        logp: &logp,
        logp_old: old.as_deref(),
        logp_ref: rf.as_deref(),
        seq_offsets: &o,
        mask: c.mask.as_deref(),
        advantages: if c.adv_per_token {
            Advantages::PerToken(&c.adv)
        } else {
            Advantages::PerSequence(&c.adv)
        },
        logp_rollout: lr.as_deref(),
    };
    let mut grad = vec![0f32; logp.len()];
    let out = policy_loss(&inputs, &c.opts, &mut grad).unwrap();
    Out {
        grad,
        stats: out.stats,
        rollout: out.rollout,
        cov_selected: out.cov_selected,
    }
}

fn launch_on<T: Lp, D: Device>(
    dev: &mut D,
    c: &Case,
    tuning: Tuning,
    seed: u64,
    grad_in_dtype: bool,
) -> Result<Out, KernelError<<D::B as care_kernels::Launcher>::Error>> {
    dev.reset();
    let logp = conv::<T>(&c.logp);
    let n_tok = logp.len();
    let o = offsets(&c.lens);
    // Outputs are poisoned: every entry must be written.
    let grad = if grad_in_dtype {
        dev.upload(&vec![T::from_f32(f32::NAN); n_tok])
    } else {
        dev.upload(&vec![f32::NAN; n_tok])
    };
    let stats = dev.upload(&[LossStatsRaw::EMPTY]);
    let rstats = dev.upload(&[RolloutStatsRaw::default()]);
    let mut opt = |v: &Option<Vec<f32>>| match v {
        Some(v) => dev.upload(&conv::<T>(v)),
        None => 0,
    };
    let (logp_old, logp_ref, logp_rollout) =
        (opt(&c.logp_old), opt(&c.logp_ref), opt(&c.logp_rollout));
    let ws_len = loss_workspace_bytes(&c.opts, n_tok as u32);
    let buf = LossBuffers {
        dtype: T::DTYPE,
        logp: dev.upload(&logp),
        logp_old,
        logp_ref,
        adv: dev.upload(&c.adv),
        adv_per_token: c.adv_per_token,
        mask: match &c.mask {
            Some(m) => dev.upload(m),
            None => 0,
        },
        seq_offsets: dev.upload(&o),
        n_seq: c.lens.len() as u32,
        n_tok: n_tok as u32,
        max_seq_len: 0,
        grad,
        grad_in_input_dtype: grad_in_dtype,
        stats,
        // Poisoned too: the plan zeroes what the kernels accumulate into.
        workspace: dev.upload(&vec![0x55u8; ws_len]),
        workspace_len: ws_len,
    };
    let roll = RolloutBuffers {
        logp_rollout,
        stats: rstats,
    };
    // SAFETY: every address was uploaded with the documented size and dtype.
    unsafe { care_kernels::grpo_loss_with(&dev.launcher(seed), &buf, &roll, &c.opts, tuning) }?;
    let g = if grad_in_dtype {
        dev.download::<T>(grad, n_tok)
            .iter()
            .map(|x| x.to_f64() as f32)
            .collect()
    } else {
        dev.download::<f32>(grad, n_tok)
    };
    let cov_selected = if selects_by_covariance(&c.opts) {
        f64::from(dev.download::<CovWorkRaw>(cov_work_address(buf.workspace), 1)[0].selected)
    } else {
        0.0
    };
    Ok(Out {
        grad: g,
        stats: dev.download::<LossStatsRaw>(stats, 1)[0].to_core(),
        rollout: dev.download::<RolloutStatsRaw>(rstats, 1)[0].to_core(),
        cov_selected,
    })
}

/// Clip-Cov / KL-Cov: whether the reference's selection is too close to call for a device
/// whose means may differ in the last bits (see the module doc), from the reference's own
/// quantities in f64: the tokens in the loss after the rollout correction, the means, the
/// candidates and the k-th largest.
fn cov_ambiguous<T: Lp>(c: &Case) -> bool {
    let opts = &c.opts;
    if !opts.policy_loss.selects_by_covariance() {
        return false;
    }
    let o = offsets(&c.lens);
    let n = c.logp.len();
    let lp = wide::<T>(&c.logp);
    let old = old_of::<T>(c);
    let mut in_loss: Vec<bool> = (0..n).map(|t| counted(c, t)).collect();
    if let Some(lr) = c.logp_rollout.as_deref().filter(|_| opts.rollout.active()) {
        let prox = conv::<T>(prox_of(c));
        let lr = conv::<T>(lr);
        let (mut w, mut keep) = (vec![0f32; n], vec![0u8; n]);
        let inputs = RolloutInputs {
            logp_old: &prox,
            logp_rollout: &lr,
            seq_offsets: &o,
            mask: c.mask.as_deref(),
        };
        rollout_correction(&inputs, &opts.rollout, &mut w, &mut keep).unwrap();
        in_loss = keep.iter().map(|&k| k != 0).collect();
    }
    let adv = |i: usize, t: usize| f64::from(if c.adv_per_token { c.adv[t] } else { c.adv[i] });
    let toks: Vec<(usize, usize)> = o
        .windows(2)
        .enumerate()
        .flat_map(|(i, w)| (w[0] as usize..w[1] as usize).map(move |t| (i, t)))
        .filter(|&(_, t)| in_loss[t])
        .collect();
    if toks.is_empty() {
        return false;
    }
    let (sa, sl) = toks
        .iter()
        .fold((0.0, 0.0), |(sa, sl), &(i, t)| (sa + adv(i, t), sl + lp[t]));
    let (ma, ml) = (sa / toks.len() as f64, sl / toks.len() as f64);
    let (lo, hi) = (1.0 - opts.eps_low, 1.0 + opts.eps_high);
    let mut cands = Vec::new();
    for &(i, t) in &toks {
        let (a, cov) = (adv(i, t), covariance(adv(i, t), lp[t], ma, ml));
        if opts.policy_loss == PolicyLoss::ClipCov {
            let raw = old.as_ref().map_or(0.0, |o| lp[t] - o[t]);
            let rho = raw.clamp(-opts.log_ratio_clamp, opts.log_ratio_clamp).exp();
            if close(rho, lo)
                || close(rho, hi)
                || close(cov, opts.clip_cov_lb)
                || close(cov, opts.clip_cov_ub)
            {
                return true;
            }
            let clipped = -a * rho.clamp(lo, hi) > -a * rho;
            if clipped || !(cov > opts.clip_cov_lb && cov < opts.clip_cov_ub) {
                continue;
            }
        }
        if !cov.is_nan() {
            cands.push(cov);
        }
    }
    cands.sort_by(|x, y| y.total_cmp(x));
    let k = cov_select_count(opts.cov_ratio, toks.len() as f64);
    match (cands.get(k.wrapping_sub(1)), cands.get(k)) {
        (Some(&x), Some(&y)) => x != y && (x - y).abs() <= 1e-9 * (1.0 + x.abs()),
        _ => false,
    }
}

/// The ratio's old log-probs (in bypass mode the rollout's), widened.
fn old_of<T: Lp>(c: &Case) -> Option<Vec<f64>> {
    if c.opts.bypass == Bypass::On {
        c.logp_rollout.as_deref().map(wide::<T>)
    } else {
        c.logp_old.as_deref().map(wide::<T>)
    }
}

/// The rollout correction's proximal log-probs: `logp_old`, or `logp` on-policy and in bypass
/// mode.
fn prox_of(c: &Case) -> &[f32] {
    match &c.logp_old {
        Some(o) if c.opts.bypass == Bypass::Off => o,
        _ => &c.logp,
    }
}

fn run_kernel<T: Lp>(c: &Case, tuning: Tuning, seed: u64, grad_in_dtype: bool) -> Out {
    launch_on::<T, _>(&mut EmuDevice::default(), c, tuning, seed, grad_in_dtype).unwrap()
}

fn counted(c: &Case, t: usize) -> bool {
    c.mask.as_ref().is_none_or(|m| m[t] != 0)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-4 * (1.0 + b.abs())
}

/// What the checks need from the inputs, in f64 (the reference's arithmetic).
struct Analysis {
    /// Some rejection verdict lies within 1e-4 of its bound: the case is not checked.
    verdict_near: bool,
    /// Tokens whose gradient may fall on the other side of a kink in f32.
    near: Vec<bool>,
    near_count: f64,
    loss_scale: f64,
    ppo_kl_scale: f64,
    kl_scale: f64,
    /// Scales of the rollout sums: |x|, k3, token chi2, sequence chi2, |log-ppl difference|,
    /// weights.
    r_scale: [f64; 6],
}

fn analyse<T: Lp>(c: &Case) -> Analysis {
    let o = offsets(&c.lens);
    let opts = &c.opts;
    let lp = wide::<T>(&c.logp);
    let old = old_of::<T>(c);
    let rf = c.logp_ref.as_deref().map(wide::<T>);
    let lr = c.logp_rollout.as_deref().map(wide::<T>);
    let prox = wide::<T>(prox_of(c));
    let r = &opts.rollout;
    let roll_on = lr.is_some() && r.active();
    let (lo, hi) = (1.0 - opts.eps_low, 1.0 + opts.eps_high);
    let mut an = Analysis {
        verdict_near: false,
        near: vec![false; lp.len()],
        near_count: 0.0,
        loss_scale: 0.0,
        ppo_kl_scale: 0.0,
        kl_scale: 0.0,
        r_scale: [0.0; 6],
    };
    let bound = |k: Rejection| r.bound(k);
    let k1_near = |k: Rejection, s: f64| {
        let b = bound(k);
        b.on() && (close(s, b.upper.ln()) || (b.lower > 0.0 && close(s, b.lower.ln())))
    };
    let up_near = |k: Rejection, s: f64| bound(k).on() && close(s, bound(k).upper);
    let trunc_near = |log_w: f64| {
        let w = log_w.exp();
        close(w, r.is_threshold) || (r.is_threshold_low > 0.0 && close(w, r.is_threshold_low))
    };
    let delta = |t: usize| -> (f64, bool) {
        let raw = old.as_ref().map_or(0.0, |o| lp[t] - o[t]);
        let cl = opts.log_ratio_clamp;
        (raw.clamp(-cl, cl), close(raw.abs(), cl))
    };
    for (i, w) in o.windows(2).enumerate() {
        let range = w[0] as usize..w[1] as usize;
        let toks: Vec<usize> = range.clone().filter(|&t| counted(c, t)).collect();
        let mut seq_near = false;
        if let Some(lr) = &lr {
            let mut s = SequenceRollout::EMPTY;
            for &t in &toks {
                let (x, xh) = rollout_log_ratio(prox[t], lr[t], r.log_ratio_clamp);
                s.push(x, xh);
                let k2 = 0.5 * xh * xh;
                let k3 = xh.exp() - 1.0 - xh;
                an.verdict_near |= k1_near(Rejection::TokenK1, xh)
                    || up_near(Rejection::TokenK2, k2)
                    || up_near(Rejection::TokenK3, k3);
                if roll_on && (close(x.abs(), r.log_ratio_clamp) || trunc_near(xh)) {
                    an.near[t] = true;
                }
                an.r_scale[0] += x.abs();
                an.r_scale[1] += (x.exp() - x - 1.0).abs();
                an.r_scale[2] += (2.0 * xh).exp();
                an.r_scale[5] += r.is_threshold.min(xh.exp()).max(1.0);
            }
            if s.n > 0.0 {
                let n = s.n;
                an.verdict_near |= k1_near(Rejection::SeqSumK1, s.sum_k1)
                    || up_near(Rejection::SeqSumK2, s.sum_k2)
                    || up_near(Rejection::SeqSumK3, s.sum_k3)
                    || k1_near(Rejection::SeqMeanK1, s.sum_k1 / n)
                    || up_near(Rejection::SeqMeanK2, s.sum_k2 / n)
                    || up_near(Rejection::SeqMeanK3, s.sum_k3 / n)
                    || up_near(Rejection::SeqMaxK2, s.max_k2)
                    || up_near(Rejection::SeqMaxK3, s.max_k3);
                let sum = s.sum_x.clamp(-r.log_ratio_clamp, r.log_ratio_clamp);
                seq_near |= roll_on
                    && r.is_level == IsLevel::Sequence
                    && (trunc_near(sum) || close(s.sum_x.abs(), r.log_ratio_clamp));
                an.r_scale[3] += (2.0 * sum).exp();
                an.r_scale[4] += (s.sum_x / n).abs();
                an.r_scale[5] += s.n * r.is_threshold;
            }
        }
        // Per-token kinks of the terms.
        let mut sum_delta = 0.0;
        for &t in &toks {
            let a = f64::from(if c.adv_per_token { c.adv[t] } else { c.adv[i] });
            let (d, d_near) = delta(t);
            sum_delta += d;
            let rho = d.exp();
            let mut k = 0.0;
            let mut k_near = false;
            if let Some(rf) = rf.as_ref().filter(|_| opts.beta > 0.0) {
                let x = rf[t] - lp[t];
                k = kl_term(x, opts).k;
                k_near = close(x.abs(), opts.kl_input_clamp)
                    || (opts.kl_estimator == KlEstimator::K3
                        && close(x.exp() - x - 1.0, opts.kl_output_clamp));
                an.kl_scale += k.abs();
            }
            let clip_near = close(rho, lo) || close(rho, hi);
            let gmpo_near = opts.policy_loss == PolicyLoss::Gmpo
                && (close(d, opts.eps_high) || close(d, -opts.eps_low));
            let dual_near = opts.dual_clip > 1.0
                && a < 0.0
                && close(-a * opts.dual_clip, (-a * rho).max(-a * rho.clamp(lo, hi)));
            an.near[t] |= d_near || k_near || clip_near || gmpo_near || dual_near;
            // An upper bound of |l_t| for the loss tolerance (every term, every weight <= C).
            let wmax = if roll_on {
                r.is_threshold.max(1.0)
            } else {
                1.0
            };
            let pg = a.abs() * (rho.max(hi) + opts.dual_clip) * (1.0 + lp[t].abs()) * 4.0
                / opts.sapo_tau_pos.min(opts.sapo_tau_neg).min(1.0);
            an.loss_scale += wmax * pg + opts.beta * k.abs();
            an.ppo_kl_scale += d.abs();
        }
        if opts.ratio_level != RatioLevel::Token && !toks.is_empty() {
            seq_near |= close(sum_delta / toks.len() as f64, opts.seq_log_ratio_max);
        }
        if opts.policy_loss == PolicyLoss::Vespo {
            // VESPO's clamp of the sequence's log ratio (before the folded rollout weights).
            seq_near |= close(sum_delta, VESPO_LOG_W_MIN) || close(sum_delta, VESPO_LOG_W_MAX);
        }
        // A kink inside a sequence quantity moves every token of the sequence.
        let shared = opts.ratio_level != RatioLevel::Token
            || opts.policy_loss == PolicyLoss::Gmpo
            || opts.policy_loss == PolicyLoss::Vespo
            || (roll_on && r.is_level == IsLevel::Sequence);
        if seq_near || (shared && toks.iter().any(|&t| an.near[t])) {
            for &t in &toks {
                an.near[t] = true;
            }
        }
    }
    an.near_count = an.near.iter().filter(|&&b| b).count() as f64;
    // The loss scale sums per-token bounds of |l|; every aggregation weight is at most 1.
    an
}

fn check_on<T: Lp, D: Device>(
    dev: &mut D,
    c: &Case,
    tuning: Tuning,
    seed: u64,
    grad_in_dtype: bool,
) -> bool {
    let an = analyse::<T>(c);
    if an.verdict_near || cov_ambiguous::<T>(c) {
        return false;
    }
    let want = run_reference::<T>(c);
    let got = launch_on::<T, D>(dev, c, tuning, seed, grad_in_dtype).unwrap();
    let dt = T::DTYPE;
    let ltol = tolerance(Quantity::Loss, dt).unwrap();
    let gtol = tolerance(Quantity::Grad, dt).unwrap();
    let dtol = tolerance(Quantity::GradInputDtype, dt).unwrap();
    let gmax = want
        .grad
        .iter()
        .fold(0f64, |m, &x| m.max(f64::from(x).abs()));
    let ctx = || {
        format!(
            "dtype {} grad_in_dtype {grad_in_dtype} tuning {tuning:?}\n{c:?}",
            dt.name()
        )
    };
    for t in 0..got.grad.len() {
        if !counted(c, t) || want.grad[t].to_bits() == 0 && an.near[t] {
            // Masked: exactly +0 (dropped tokens are checked against the reference's +0 below).
            if !counted(c, t) {
                assert_eq!(got.grad[t].to_bits(), 0, "masked token {t}: {}", ctx());
            }
            continue;
        }
        if an.near[t] {
            continue;
        }
        let (g, w) = (f64::from(got.grad[t]), f64::from(want.grad[t]));
        let ok = if grad_in_dtype {
            let want_t = T::from_f32(want.grad[t]).to_f64();
            if want_t.is_infinite() {
                g == want_t
            } else {
                (g - w).abs() <= dtol.atol + dtol.rtol * w.abs() + gtol.rtol * gmax
            }
        } else {
            gtol.accepts(g, w, gmax)
        };
        assert!(
            ok,
            "grad[{t}]: kernel {g} vs reference {w} (max {gmax}): {}",
            ctx()
        );
    }
    assert_eq!(
        got.cov_selected,
        want.cov_selected,
        "cov_selected: {}",
        ctx()
    );
    let (s, r) = (&got.stats, &want.stats);
    assert_eq!(s.tokens, r.tokens, "tokens: {}", ctx());
    assert_eq!(s.sequences, r.sequences, "sequences: {}", ctx());
    assert_eq!(s.non_finite, r.non_finite, "non_finite: {}", ctx());
    let slack = an.near_count;
    for (name, a, b) in [
        ("clipped", s.clipped, r.clipped),
        ("clipped_low", s.clipped_low, r.clipped_low),
        ("clipped_high", s.clipped_high, r.clipped_high),
        ("dual_clipped", s.dual_clipped, r.dual_clipped),
        (
            "log_ratio_clamped",
            s.log_ratio_clamped,
            r.log_ratio_clamped,
        ),
    ] {
        assert!(
            (a - b).abs() <= slack,
            "{name}: kernel {a} vs reference {b}: {}",
            ctx()
        );
    }
    for (name, a, b, scale) in [
        ("loss", s.loss, r.loss, an.loss_scale),
        ("ppo_kl_sum", s.ppo_kl_sum, r.ppo_kl_sum, an.ppo_kl_scale),
        ("kl_sum", s.kl_sum, r.kl_sum, an.kl_scale),
        ("ratio_sum", s.ratio_sum, r.ratio_sum, r.ratio_sum),
        ("ratio_min", s.ratio_min, r.ratio_min, r.ratio_min),
        ("ratio_max", s.ratio_max, r.ratio_max, r.ratio_max),
    ] {
        assert!(
            ltol.accepts(a, b, scale),
            "{name}: kernel {a} vs reference {b} (scale {scale}): {}",
            ctx()
        );
    }
    let (s, r) = (&got.rollout, &want.rollout);
    for (name, a, b) in [
        ("rollout.tokens", s.tokens, r.tokens),
        ("rollout.sequences", s.sequences, r.sequences),
        (
            "rollout.rejected_tokens",
            s.rejected_tokens,
            r.rejected_tokens,
        ),
        (
            "rollout.rejected_sequences",
            s.rejected_sequences,
            r.rejected_sequences,
        ),
        ("rollout.non_finite", s.non_finite, r.non_finite),
    ] {
        assert_eq!(a, b, "{name}: {}", ctx());
    }
    assert!(
        (s.truncated - r.truncated).abs() <= slack,
        "rollout.truncated {} vs {}: {}",
        s.truncated,
        r.truncated,
        ctx()
    );
    let [sx, sk3, schi, schi_seq, sppl, sw] = an.r_scale;
    for (name, a, b, scale) in [
        ("rollout.kl_sum", s.kl_sum, r.kl_sum, sx),
        ("rollout.k3_sum", s.k3_sum, r.k3_sum, sk3),
        (
            "rollout.chi2_token_sum",
            s.chi2_token_sum,
            r.chi2_token_sum,
            schi,
        ),
        (
            "rollout.chi2_seq_sum",
            s.chi2_seq_sum,
            r.chi2_seq_sum,
            schi_seq,
        ),
        (
            "rollout.log_ppl_diff_sum",
            s.log_ppl_diff_sum,
            r.log_ppl_diff_sum,
            sppl,
        ),
        (
            "rollout.log_ppl_abs_diff_sum",
            s.log_ppl_abs_diff_sum,
            r.log_ppl_abs_diff_sum,
            sppl,
        ),
        ("rollout.weight_sum", s.weight_sum, r.weight_sum, sw),
    ] {
        assert!(
            ltol.accepts(a, b, scale),
            "{name}: kernel {a} vs reference {b} (scale {scale}): {}",
            ctx()
        );
    }
    true
}

/// Checks every dtype; returns whether the case was checked (not discarded).
fn check_all_dtypes(c: &Case, tuning: Tuning, seed: u64, grad_in_dtype: bool) -> bool {
    check_all_dtypes_on(&mut EmuDevice::default(), c, tuning, seed, grad_in_dtype)
}

fn check_all_dtypes_on<D: Device>(
    dev: &mut D,
    c: &Case,
    tuning: Tuning,
    seed: u64,
    grad_in_dtype: bool,
) -> bool {
    let a = check_on::<f32, D>(dev, c, tuning, seed, grad_in_dtype);
    let b = check_on::<half::bf16, D>(dev, c, tuning, seed, grad_in_dtype);
    let d = check_on::<half::f16, D>(dev, c, tuning, seed, grad_in_dtype);
    a && b && d
}

const POLICIES: [(PolicyLoss, RatioLevel); 10] = [
    (PolicyLoss::Clip, RatioLevel::Token),
    (PolicyLoss::Clip, RatioLevel::Sequence),
    (PolicyLoss::Clip, RatioLevel::SequenceToken),
    (PolicyLoss::Cispo, RatioLevel::Token),
    (PolicyLoss::Sapo, RatioLevel::Token),
    (PolicyLoss::Gpg, RatioLevel::Token),
    (PolicyLoss::Gmpo, RatioLevel::Token),
    (PolicyLoss::ClipCov, RatioLevel::Token),
    (PolicyLoss::KlCov, RatioLevel::Token),
    (PolicyLoss::Vespo, RatioLevel::Token),
];

fn rejection_strategy() -> impl Strategy<Value = Vec<(Rejection, f64, f64)>> {
    // Bounds that reject some but not all of the inputs below.
    let one = prop_oneof![
        Just((Rejection::TokenK1, 0.6, 1.8)),
        Just((Rejection::TokenK1, 0.0, 1.5)),
        Just((Rejection::TokenK2, 0.0, 0.08)),
        Just((Rejection::TokenK3, 0.0, 0.1)),
        Just((Rejection::SeqSumK1, 0.3, 3.0)),
        Just((Rejection::SeqSumK2, 0.0, 0.9)),
        Just((Rejection::SeqSumK3, 0.0, 1.1)),
        Just((Rejection::SeqMeanK1, 0.8, 1.25)),
        Just((Rejection::SeqMeanK2, 0.0, 0.05)),
        Just((Rejection::SeqMeanK3, 0.0, 0.06)),
        Just((Rejection::SeqMaxK2, 0.0, 0.3)),
        Just((Rejection::SeqMaxK3, 0.0, 0.35)),
    ];
    prop::collection::vec(one, 0..3)
}

fn opts_strategy() -> impl Strategy<Value = LossOptions> {
    let agg = prop_oneof![
        Just(Aggregation::TokenMean),
        Just(Aggregation::SeqMeanTokenMean),
        Just(Aggregation::SeqMeanTokenSum),
        Just(Aggregation::SeqMeanTokenSumNorm),
        Just(Aggregation::TokenSum),
        Just(Aggregation::TokenSumNorm),
    ];
    (
        (
            agg,
            prop::sample::select(POLICIES.to_vec()),
            prop_oneof![Just(SequenceCount::NonEmpty), Just(SequenceCount::All)],
            prop_oneof![Just((0.2, 0.28)), Just((0.1, 0.3))],
            prop_oneof![Just(0.0), Just(3.0)],
            prop_oneof![Just(0.0), Just(0.04)],
            prop_oneof![Just((1.0, 1.05)), Just((0.5, 2.0))],
            prop_oneof![Just((0.0, 0.0, 0.0)), Just((500.0, 9.0, 64.0))],
        ),
        (
            prop_oneof![
                Just(IsLevel::Off),
                Just(IsLevel::Token),
                Just(IsLevel::Sequence)
            ],
            prop_oneof![Just((2.0, 0.0)), Just((1.2, 0.5))],
            rejection_strategy(),
            prop_oneof![Just(RejectionMode::Drop), Just(RejectionMode::ZeroWeight)],
            any::<bool>(),
        ),
        (
            prop_oneof![Just(2e-4), Just(0.05), Just(0.3), Just(2.0)],
            prop_oneof![Just((1.0, 5.0)), Just((-0.5, 2.0)), Just((-100.0, 100.0))],
            prop_oneof![Just(1.0), Just(0.5)],
        ),
    )
        .prop_map(
            |(
                (
                    aggregation,
                    (policy_loss, ratio_level),
                    sequence_count,
                    (el, eh),
                    dual,
                    beta,
                    taus,
                    (gt, gs, h),
                ),
                (is_level, (thr, thr_low), rej, mode, no_clamps),
                (cov_ratio, (clip_cov_lb, clip_cov_ub), kl_cov_coef),
            )| {
                let mut o = LossOptions {
                    eps_low: el,
                    eps_high: eh,
                    dual_clip: dual,
                    beta,
                    global_tokens: gt,
                    global_sequences: gs,
                    horizon: h,
                    aggregation,
                    ratio_level,
                    policy_loss,
                    sequence_count,
                    kl_estimator: KlEstimator::K3,
                    sapo_tau_pos: taus.0,
                    sapo_tau_neg: taus.1,
                    cov_ratio,
                    clip_cov_lb,
                    clip_cov_ub,
                    kl_cov_coef,
                    ..LossOptions::default()
                };
                o.rollout.is_level = is_level;
                o.rollout.is_threshold = thr;
                o.rollout.is_threshold_low = thr_low;
                o.rollout.rejection_mode = mode;
                for (k, lower, upper) in rej {
                    o.rollout.set_bound(k, lower, upper);
                }
                if no_clamps {
                    o = o.without_clamps();
                }
                if o.policy_loss == PolicyLoss::Vespo && o.rollout.is_level == IsLevel::Sequence {
                    // VESPO folds token weights into its ratio; a sequence weight is refused.
                    o.rollout.is_level = IsLevel::Token;
                }
                o
            },
        )
}

fn case_strategy() -> impl Strategy<Value = Case> {
    let lens = prop::collection::vec(prop_oneof![8 => 0u32..24, 1 => 60u32..140], 0..6);
    (lens, opts_strategy(), any::<(bool, bool, bool, bool, u8)>()).prop_flat_map(
        |(lens, mut opts, (has_old, has_ref, per_tok, has_mask, rollout))| {
            // verl's bypass mode (the rollout log-probs are the old ones) where its inputs are
            // there, and now and then verl's floor under GMPO's weights.
            if !has_old && rollout % 4 != 0 && rollout & 16 != 0 {
                opts.bypass = Bypass::On;
            }
            if rollout & 32 != 0 {
                opts.gmpo_weight_floor = 1e-10;
            }
            let n: usize = lens.iter().sum::<u32>() as usize;
            let b = lens.len();
            let logp = prop::collection::vec(-6.0f32..0.0, n);
            let noise = prop_oneof![12 => -0.6f32..0.6, 1 => Just(0.0f32), 1 => -30.0f32..30.0];
            let vec_of = |s: BoxedStrategy<f32>, on: bool| {
                if on {
                    prop::collection::vec(s, n).prop_map(Some).boxed()
                } else {
                    Just(None).boxed()
                }
            };
            let old = vec_of(noise.boxed(), has_old);
            let rf = vec_of((-3.0f32..3.0).boxed(), has_ref);
            // The rollout engine's log-probs: near the proximal ones, now and then far off;
            // absent in one case of four (no correction, no diagnostics).
            let rnoise = prop_oneof![10 => -0.4f32..0.4, 1 => Just(0.0f32), 1 => -4.0f32..4.0];
            let lr = vec_of(rnoise.boxed(), rollout % 4 != 0);
            let adv = prop::collection::vec(
                prop_oneof![6 => -2.0f32..2.0, 1 => Just(0.0f32)],
                if per_tok { n } else { b },
            );
            let mask = if has_mask {
                (
                    prop::collection::vec(prop_oneof![3 => Just(1u8), 1 => Just(0u8)], n),
                    prop::collection::vec(prop_oneof![4 => Just(false), 1 => Just(true)], b),
                )
                    .prop_map(Some)
                    .boxed()
            } else {
                Just(None).boxed()
            };
            (
                Just(lens),
                logp,
                old,
                rf,
                lr,
                adv,
                Just(per_tok),
                mask,
                Just(opts),
            )
                .prop_map(|(lens, logp, old, rf, lr, adv, per_tok, mask, opts)| {
                    let o = offsets(&lens);
                    let mask = mask.map(|(mut m, drop)| {
                        for (i, d) in drop.iter().enumerate() {
                            if *d {
                                m[o[i] as usize..o[i + 1] as usize].fill(0);
                            }
                        }
                        m
                    });
                    let add = |nz: Vec<f32>| -> Vec<f32> {
                        logp.iter().zip(&nz).map(|(l, z)| l + z).collect()
                    };
                    let logp_old = old.map(add);
                    let logp_ref = rf.map(add);
                    let prox = logp_old.clone().unwrap_or_else(|| logp.clone());
                    let logp_rollout = lr.map(|nz: Vec<f32>| {
                        prox.iter()
                            .zip(&nz)
                            .map(|(p, z)| p + z)
                            .collect::<Vec<f32>>()
                    });
                    let mut logp = logp;
                    let mut logp_rollout = logp_rollout;
                    // Masked tokens carry garbage that must not leak into anything.
                    if let Some(m) = &mask {
                        for (t, &k) in m.iter().enumerate() {
                            if k == 0 && t % 3 == 0 {
                                logp[t] = f32::NAN;
                                if let Some(r) = logp_rollout.as_mut() {
                                    r[t] = f32::INFINITY;
                                }
                            }
                        }
                    }
                    Case {
                        lens,
                        logp,
                        logp_old,
                        logp_ref,
                        logp_rollout,
                        adv,
                        adv_per_token: per_tok,
                        mask,
                        opts,
                    }
                })
        },
    )
}

fn tuning_strategy() -> impl Strategy<Value = Tuning> {
    (
        prop_oneof![Just(32u32), Just(64), Just(256)],
        prop_oneof![Just(None), Just(Some(1u32)), Just(Some(3))],
    )
        .prop_map(|(threads, chunks)| Tuning {
            threads: Some(threads),
            loss_chunks: chunks,
            ..Tuning::default()
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Oracle on random inputs: every dtype, policy loss, aggregation and correction option.
    #[test]
    fn pt_family_and_rollout_match_reference(c in case_strategy(), tuning in tuning_strategy(), seed in any::<u64>(), grad_in_dtype in any::<bool>()) {
        let checked = check_all_dtypes(&c, tuning, seed, grad_in_dtype);
        prop_assume!(checked, "a rejection verdict within 1e-4 of its bound");
    }

    /// Schedule independence with every option: bit-identical gradients under two schedules.
    #[test]
    fn pt_gradient_is_schedule_independent(c in case_strategy(), tuning in tuning_strategy(), seed in any::<u64>()) {
        let a = run_kernel::<f32>(&c, tuning, seed, false);
        let b = run_kernel::<f32>(&c, tuning, seed.wrapping_add(0x9e37_79b9), false);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        prop_assert_eq!(bits(&a.grad), bits(&b.grad));
        prop_assert_eq!(a.stats.tokens, b.stats.tokens);
        prop_assert_eq!(a.rollout.rejected_tokens, b.rollout.rejected_tokens);
    }

    /// `logp_rollout == logp_old` under loose criteria and weights in [0, 2]: every weight is
    /// 1 and nothing is rejected, so the gradient is the uncorrected one, bit for bit.
    #[test]
    fn pt_identical_rollout_is_the_identity(c in case_strategy(), tuning in tuning_strategy()) {
        let mut c = c;
        c.opts.bypass = Bypass::Off; // the plain run below has no rollout log-probs
        let prox = c.logp_old.clone().unwrap_or_else(|| c.logp.clone());
        c.logp_rollout = Some(prox);
        c.opts.rollout.set_bound(Rejection::TokenK1, 0.5, 2.0);
        c.opts.rollout.set_bound(Rejection::SeqMaxK3, 0.0, 1.0);
        c.opts.rollout.is_threshold_low = 0.0;
        let with = run_kernel::<f32>(&c, tuning, 1, false);
        let mut plain = c.clone();
        plain.logp_rollout = None;
        let without = run_kernel::<f32>(&plain, tuning, 1, false);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        prop_assert_eq!(bits(&with.grad), bits(&without.grad));
        prop_assert_eq!(with.stats.tokens, without.stats.tokens);
        prop_assert_eq!(with.rollout.rejected_tokens, 0.0);
        prop_assert_eq!(with.rollout.weight_sum, with.rollout.tokens);
    }
}

fn slice_case(c: &Case, lo: usize, hi: usize) -> Case {
    let o = offsets(&c.lens);
    let (t0, t1) = (o[lo] as usize, o[hi] as usize);
    let tok = |v: &Option<Vec<f32>>| v.as_ref().map(|v| v[t0..t1].to_vec());
    Case {
        lens: c.lens[lo..hi].to_vec(),
        logp: c.logp[t0..t1].to_vec(),
        logp_old: tok(&c.logp_old),
        logp_ref: tok(&c.logp_ref),
        logp_rollout: tok(&c.logp_rollout),
        adv: if c.adv_per_token {
            c.adv[t0..t1].to_vec()
        } else {
            c.adv[lo..hi].to_vec()
        },
        adv_per_token: c.adv_per_token,
        mask: c.mask.as_ref().map(|v| v[t0..t1].to_vec()),
        opts: c.opts,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// With the whole batch's denominators (from the reference, after rejection) passed as
    /// global ones, the micro-batches' gradients are the whole batch's bit for bit and their
    /// counts add up. (Not for Clip-Cov and KL-Cov: their selection is a top-k over each call's
    /// own tokens, on the device as on the CPU.)
    #[test]
    fn pt_micro_batches_add_up(c in case_strategy(), cut in any::<prop::sample::Index>(), tuning in tuning_strategy()) {
        prop_assume!(!c.opts.policy_loss.selects_by_covariance());
        let whole_ref = run_reference::<f32>(&c);
        let h = c.lens.iter().copied().max().unwrap_or(0);
        let n_seq = match c.opts.sequence_count {
            SequenceCount::NonEmpty => whole_ref.stats.sequences,
            SequenceCount::All => c.lens.len() as f64,
        };
        prop_assume!(whole_ref.stats.tokens > 0.0 && n_seq > 0.0 && h > 0);
        let mut whole = c.clone();
        whole.opts.global_tokens = whole_ref.stats.tokens;
        whole.opts.global_sequences = n_seq;
        whole.opts.horizon = f64::from(h);
        let k = cut.index(c.lens.len() + 1);
        let w = run_kernel::<f32>(&whole, tuning, 1, false);
        let a = run_kernel::<f32>(&slice_case(&whole, 0, k), tuning, 2, false);
        let b = run_kernel::<f32>(&slice_case(&whole, k, c.lens.len()), tuning, 3, false);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let joined: Vec<f32> = a.grad.iter().chain(&b.grad).copied().collect();
        prop_assert_eq!(bits(&w.grad), bits(&joined));
        prop_assert_eq!(w.stats.tokens, a.stats.tokens + b.stats.tokens);
        prop_assert_eq!(w.rollout.rejected_tokens, a.rollout.rejected_tokens + b.rollout.rejected_tokens);
        prop_assert_eq!(w.rollout.sequences, a.rollout.sequences + b.rollout.sequences);
    }
}

fn base_case(lens: Vec<u32>) -> Case {
    let n: usize = lens.iter().sum::<u32>() as usize;
    let b = lens.len();
    let logp: Vec<f32> = (0..n).map(|t| -0.5 - (t % 7) as f32 * 0.3).collect();
    let old: Vec<f32> = (0..n)
        .map(|t| logp[t] + ((t % 5) as f32 - 2.0) * 0.13)
        .collect();
    // Rollout log-probs: mostly close; from token 12 on, every 11th token far (x = -1.3) and
    // every 13th the other way (x = +0.9), so the criteria below reject some tokens and
    // sequences (and a first sequence of 12 tokens passes every criterion).
    let rollout: Vec<f32> = (0..n)
        .map(|t| {
            let off = if t >= 12 && t % 11 == 5 {
                1.3
            } else if t >= 12 && t % 13 == 7 {
                -0.9
            } else {
                ((t % 3) as f32 - 1.0) * 0.07
            };
            old[t] + off
        })
        .collect();
    Case {
        logp,
        logp_old: Some(old),
        logp_ref: Some((0..n).map(|t| -0.7 - (t % 3) as f32 * 0.2).collect()),
        logp_rollout: Some(rollout),
        adv: (0..b)
            .map(|i| if i % 2 == 0 { 1.0 } else { -0.7 })
            .collect(),
        adv_per_token: false,
        mask: None,
        lens,
        opts: LossOptions {
            beta: 0.04,
            ..LossOptions::default()
        },
    }
}

/// Every policy loss and ratio level, every aggregation, with and without the correction,
/// on fixed inputs (long sequences over several chunks included).
#[test]
fn every_policy_and_aggregation_on_fixed_inputs() {
    let aggs = [
        Aggregation::TokenMean,
        Aggregation::SeqMeanTokenMean,
        Aggregation::SeqMeanTokenSum,
        Aggregation::SeqMeanTokenSumNorm,
        Aggregation::TokenSum,
        Aggregation::TokenSumNorm,
    ];
    let mut c = base_case(vec![7, 300, 1, 0, 45]);
    let mut m = vec![1u8; c.logp.len()];
    m[10..30].fill(0);
    c.mask = Some(m);
    for (policy, level) in POLICIES {
        for agg in aggs {
            for level_is in [IsLevel::Off, IsLevel::Token, IsLevel::Sequence] {
                if policy == PolicyLoss::Vespo && level_is == IsLevel::Sequence {
                    continue; // refused (VESPO folds token weights into its ratio)
                }
                c.opts.policy_loss = policy;
                c.opts.ratio_level = level;
                c.opts.aggregation = agg;
                c.opts.rollout.is_level = level_is;
                let t = Tuning {
                    threads: Some(64),
                    loss_chunks: Some(3),
                    ..Tuning::default()
                };
                assert!(
                    check_all_dtypes(&c, Tuning::default(), 1, false),
                    "{policy:?} {agg:?}"
                );
                assert!(check_all_dtypes(&c, t, 2, true), "{policy:?} {agg:?}");
            }
        }
    }
}

/// The verl presets the peer suite pins (`tests/tests/peers.rs`, the six classes) on the
/// device: bypass mode (class 1: the rollout log-probs as the old ones, weights not applied,
/// rejections applied; and `verl_gpg` without `logp_old`, verl's `reinforce`), KL-Cov with
/// verl's coefficient 0.1 (class 3) and GMPO with verl's floor under the weights (class 5), with
/// and without weights, with rejection in both modes.
#[test]
fn verl_bypass_kl_cov_and_gmpo_presets() {
    let mut c = base_case(vec![7, 300, 1, 0, 45]);
    let mut m = vec![1u8; c.logp.len()];
    m[10..30].fill(0);
    c.mask = Some(m);
    let old = c.logp_old.take();
    for preset in [LossPreset::VerlBypass, LossPreset::VerlGpg] {
        for is_level in [IsLevel::Off, IsLevel::Token, IsLevel::Sequence] {
            for mode in [RejectionMode::Drop, RejectionMode::ZeroWeight] {
                c.opts = LossOptions::preset(preset);
                c.opts.rollout.is_level = is_level;
                c.opts.rollout.rejection_mode = mode;
                c.opts.rollout.set_bound(Rejection::TokenK2, 0.0, 0.2);
                assert!(
                    check_all_dtypes(&c, Tuning::default(), 3, false),
                    "{preset} {is_level}"
                );
            }
        }
    }
    // Bypass with logp_old given, or without rollout log-probs: refused, as on the CPU.
    c.opts = LossOptions::preset(LossPreset::VerlBypass);
    c.logp_old = old.clone();
    assert!(matches!(
        launch_on::<f32, _>(&mut EmuDevice::default(), &c, Tuning::default(), 0, false),
        Err(KernelError::Core(Error::InvalidArgument))
    ));
    c.logp_old = old;
    for (preset, cov_ratio) in [
        (LossPreset::VerlKlCov, 0.05),
        (LossPreset::VerlGeoMean, 2e-4),
    ] {
        for mode in [RejectionMode::Drop, RejectionMode::ZeroWeight] {
            c.opts = LossOptions::preset(preset);
            assert!(preset != LossPreset::VerlKlCov || c.opts.kl_cov_coef == 0.1);
            c.opts.cov_ratio = cov_ratio;
            c.opts.rollout.is_level = IsLevel::Token;
            c.opts.rollout.rejection_mode = mode;
            c.opts.rollout.set_bound(Rejection::TokenK2, 0.0, 0.2);
            assert!(
                check_all_dtypes(&c, Tuning::default(), 4, false),
                "{preset} {mode}"
            );
        }
    }
}

/// Each rejection criterion alone, in both modes: the fixed inputs make each reject something,
/// and the kernel rejects the same tokens and sequences as the reference.
#[test]
fn every_rejection_criterion_in_both_modes() {
    let crit = [
        (Rejection::TokenK1, 0.5, 2.0),
        (Rejection::TokenK2, 0.0, 0.2),
        (Rejection::TokenK3, 0.0, 0.2),
        (Rejection::SeqSumK1, 0.2, 5.0),
        (Rejection::SeqSumK2, 0.0, 2.0),
        (Rejection::SeqSumK3, 0.0, 2.0),
        (Rejection::SeqMeanK1, 0.9, 1.1),
        (Rejection::SeqMeanK2, 0.0, 0.12),
        (Rejection::SeqMeanK3, 0.0, 0.1),
        (Rejection::SeqMaxK2, 0.0, 0.5),
        (Rejection::SeqMaxK3, 0.0, 0.5),
    ];
    let base = base_case(vec![12, 5, 40, 9, 130]);
    for (k, lower, upper) in crit {
        for mode in [RejectionMode::Drop, RejectionMode::ZeroWeight] {
            let mut c = base.clone();
            c.opts.rollout.set_bound(k, lower, upper);
            c.opts.rollout.rejection_mode = mode;
            c.opts.rollout.is_level = IsLevel::Token;
            assert!(
                check_all_dtypes(&c, Tuning::default(), 3, false),
                "{k:?} {mode:?}"
            );
            let r = run_kernel::<f32>(&c, Tuning::default(), 3, false);
            assert!(
                r.rollout.rejected_tokens > 0.0,
                "{k:?} rejects nothing here"
            );
            assert!(
                r.rollout.rejected_tokens < r.rollout.tokens,
                "{k:?} rejects everything"
            );
            let dropped = mode == RejectionMode::Drop;
            let kept = r.rollout.tokens - r.rollout.rejected_tokens;
            assert_eq!(
                r.stats.tokens,
                if dropped { kept } else { r.rollout.tokens },
                "{k:?}"
            );
        }
    }
    // Chained: the union of the rejections.
    let mut c = base.clone();
    c.opts.rollout.set_bound(Rejection::TokenK2, 0.0, 0.2);
    c.opts.rollout.set_bound(Rejection::SeqMeanK1, 0.9, 1.1);
    assert!(check_all_dtypes(&c, Tuning::default(), 4, false));
}

#[test]
fn dropped_tokens_get_exactly_zero_and_leave_the_counts() {
    let mut c = base_case(vec![30, 20]);
    c.opts.rollout.set_bound(Rejection::TokenK1, 0.5, 2.0);
    let r = run_kernel::<f32>(&c, Tuning::default(), 5, false);
    let refr = run_reference::<f32>(&c);
    let lr = c.logp_rollout.as_ref().unwrap();
    let old = c.logp_old.as_ref().unwrap();
    let mut dropped = 0;
    for t in 0..c.logp.len() {
        let x = f64::from(old[t]) - f64::from(lr[t]);
        if !(0.5f64.ln()..=2f64.ln()).contains(&x) {
            dropped += 1;
            assert_eq!(r.grad[t].to_bits(), 0, "token {t}");
            assert_eq!(refr.grad[t].to_bits(), 0, "token {t}");
        }
    }
    assert!(dropped > 0);
    assert_eq!(r.stats.tokens, 50.0 - f64::from(dropped));
    assert_eq!(r.rollout.rejected_tokens, f64::from(dropped));
}

#[test]
fn non_finite_rollout_log_probs_are_counted_kept_or_dropped() {
    let mut c = base_case(vec![6, 6]);
    c.logp_rollout.as_mut().unwrap()[2] = f32::NAN;
    c.logp_rollout.as_mut().unwrap()[8] = f32::NEG_INFINITY;
    // Diagnostics only (no criterion, weights off): both count in rollout.non_finite; the loss
    // does not read them.
    let r = run_kernel::<f32>(&c, Tuning::default(), 6, false);
    let refr = run_reference::<f32>(&c);
    assert_eq!((r.rollout.non_finite, refr.rollout.non_finite), (2.0, 2.0));
    assert_eq!((r.stats.non_finite, refr.stats.non_finite), (0.0, 0.0));
    // Token weights: the NaN token's weight is NaN, a counted non-finite input.
    c.opts.rollout.is_level = IsLevel::Token;
    let r = run_kernel::<f32>(&c, Tuning::default(), 6, false);
    let refr = run_reference::<f32>(&c);
    assert_eq!(r.stats.non_finite, refr.stats.non_finite);
    assert_eq!(r.stats.non_finite, 2.0);
    // A k1 criterion drops both (NaN fails every bound, x = +inf is beyond the clamp's +20):
    // dropped non-finite tokens still count as non-finite inputs.
    c.opts.rollout.set_bound(Rejection::TokenK1, 0.5, 2.0);
    let r = run_kernel::<f32>(&c, Tuning::default(), 6, false);
    let refr = run_reference::<f32>(&c);
    assert_eq!((r.stats.non_finite, refr.stats.non_finite), (2.0, 2.0));
    assert_eq!(r.stats.tokens, refr.stats.tokens);
    assert!(r.grad[2] == 0.0 && r.grad[8] == 0.0);
}

#[test]
fn sequence_count_all_counts_empty_rows() {
    let mut c = base_case(vec![4, 0, 5, 3]);
    let mut m = vec![1u8; 12];
    m[9..12].fill(0); // the last row has no counted token
    c.mask = Some(m);
    c.opts.aggregation = Aggregation::SeqMeanTokenMean;
    for sc in [SequenceCount::NonEmpty, SequenceCount::All] {
        c.opts.sequence_count = sc;
        assert!(check_all_dtypes(&c, Tuning::default(), 7, false));
    }
    let all = run_kernel::<f32>(&c, Tuning::default(), 7, false);
    c.opts.sequence_count = SequenceCount::NonEmpty;
    let non_empty = run_kernel::<f32>(&c, Tuning::default(), 7, false);
    // 4 rows against 2 non-empty ones: each gradient is half as large.
    for t in 0..9 {
        assert!((all.grad[t] * 2.0 - non_empty.grad[t]).abs() <= 1e-6 * non_empty.grad[t].abs());
    }
}

#[test]
fn cispo_gradient_flows_where_the_ratio_is_clipped() {
    // rho = e^0.5 > 1 + eps_high for every token: the clipped ratio is a constant weight, and
    // the gradient -clip(rho) * A * w is not zero (a clipped surrogate's would be).
    let mut c = base_case(vec![4]);
    c.logp_rollout = None;
    c.opts.beta = 0.0;
    c.opts.policy_loss = PolicyLoss::Cispo;
    c.opts.eps_high = 0.28;
    let old = c.logp.iter().map(|l| l - 0.5).collect();
    c.logp_old = Some(old);
    let r = run_kernel::<f32>(&c, Tuning::default(), 8, false);
    for g in &r.grad {
        assert!((f64::from(*g) + 1.28 / 4.0).abs() < 1e-6, "{g}");
    }
    assert_eq!(r.stats.clipped, 4.0);
    assert!(check_all_dtypes(&c, Tuning::default(), 8, false));
}

#[test]
fn covariance_selection_needs_its_workspace() {
    for p in [PolicyLoss::ClipCov, PolicyLoss::KlCov] {
        let mut c = base_case(vec![3, 5]);
        c.opts.policy_loss = p;
        let need = loss_workspace_bytes(&c.opts, 8);
        assert_eq!(
            need,
            WORKSPACE_BYTES + core::mem::size_of::<CovWorkRaw>().next_multiple_of(16) + 8 * 8
        );
        let mut dev = EmuDevice::default();
        let buf = LossBuffers {
            dtype: Dtype::F32,
            logp: dev.upload(&c.logp),
            logp_old: 0,
            logp_ref: 0,
            adv: dev.upload(&c.adv),
            adv_per_token: false,
            mask: 0,
            seq_offsets: dev.upload(&offsets(&c.lens)),
            n_seq: 2,
            n_tok: 8,
            max_seq_len: 0,
            grad: 0,
            grad_in_input_dtype: false,
            stats: 0,
            workspace: dev.upload(&vec![0u8; need]),
            workspace_len: need - 1,
        };
        // SAFETY: refused before any launch.
        let e = unsafe {
            care_kernels::grpo_loss_with(
                &dev.launcher(1),
                &buf,
                &RolloutBuffers::default(),
                &c.opts,
                Tuning::default(),
            )
        };
        assert!(
            matches!(e, Err(KernelError::Core(Error::InvalidArgument))),
            "{p:?}"
        );
        c.opts.policy_loss = PolicyLoss::Clip;
        assert_eq!(loss_workspace_bytes(&c.opts, 8), WORKSPACE_BYTES);
    }
}

/// Two sequences whose tokens tie in covariance within each sequence: 3000 tokens at
/// cov 0.64 and 2000 at cov 1.44. With `cov_ratio` 0.3, k = 1500 of the 2000 ties at the top
/// are taken, the earlier ones: the cut's tie scan crosses two 1024-token tiles.
#[test]
fn covariance_ties_go_to_the_earlier_tokens_across_tiles() {
    let (na, nb) = (3000usize, 2000usize);
    let n = na + nb;
    let logp: Vec<f32> = (0..n).map(|t| if t < na { -1.0 } else { -3.0 }).collect();
    let mut c = Case {
        lens: vec![na as u32, nb as u32],
        logp_old: Some(logp.iter().map(|l| l - 0.125).collect()),
        logp,
        logp_ref: None,
        logp_rollout: None,
        adv: vec![1.0, -1.0],
        adv_per_token: false,
        mask: None,
        opts: LossOptions {
            policy_loss: PolicyLoss::KlCov,
            cov_ratio: 0.3,
            kl_cov_coef: 0.5,
            ..LossOptions::default()
        },
    };
    let want = run_reference::<f32>(&c);
    assert_eq!(want.cov_selected, 1500.0);
    assert!(check_all_dtypes(&c, Tuning::default(), 3, false));
    let got = run_kernel::<f32>(&c, Tuning::default(), 5, false);
    assert_eq!(got.cov_selected, 1500.0);
    // Selected: the first 1500 tokens of the second sequence, whose gradient carries the
    // extra coef * sign(delta) / N.
    let plain = f64::from(got.grad[na + nb - 1]);
    for t in na..n {
        let extra = f64::from(got.grad[t]) - plain;
        let want_extra = if t < na + 1500 { 0.5 / n as f64 } else { 0.0 };
        assert!((extra - want_extra).abs() < 1e-7, "token {t}: {extra}");
    }
    // Clip-Cov with every candidate in the window and k above the candidates: all are taken.
    c.opts.policy_loss = PolicyLoss::ClipCov;
    c.opts.cov_ratio = 2.0;
    c.opts.clip_cov_lb = 1.0;
    c.opts.clip_cov_ub = 5.0;
    let want = run_reference::<f32>(&c);
    assert_eq!(want.cov_selected, nb as f64);
    assert!(check_all_dtypes(&c, Tuning::default(), 7, false));
    let got = run_kernel::<f32>(&c, Tuning::default(), 9, false);
    assert!(got.grad[na..].iter().all(|&g| g == 0.0));
    assert!(got.grad[..na].iter().all(|&g| g != 0.0));
}

/// Nothing counts (every token masked): nothing is selected and every gradient is 0.
#[test]
fn covariance_selection_of_an_empty_call_selects_nothing() {
    for p in [PolicyLoss::ClipCov, PolicyLoss::KlCov] {
        let mut c = base_case(vec![4, 0, 3]);
        c.opts.policy_loss = p;
        c.mask = Some(vec![0; 7]);
        let got = run_kernel::<f32>(&c, Tuning::default(), 2, false);
        assert_eq!(got.cov_selected, 0.0);
        assert!(got.grad.iter().all(|&g| g.to_bits() == 0));
        assert!(check_all_dtypes(&c, Tuning::default(), 4, false));
    }
}

/// The same random cases as `pt_family_and_rollout_match_reference` (fixed RNG) and the fixed
/// policy sweep, on the GPU (skipped with a message when there is no CUDA driver).
#[test]
fn gpu_family_and_rollout_match_reference() {
    use proptest::test_runner::{RngAlgorithm, TestRng, TestRunner};
    let Some(gpu) = common::gpu("gpu_family_and_rollout_match_reference") else {
        return;
    };
    let gpu = std::cell::RefCell::new(gpu);
    let config = ProptestConfig {
        cases: common::gpu_cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha));
    let strategy = (case_strategy(), tuning_strategy(), any::<bool>());
    runner
        .run(&strategy, |(c, tuning, grad_in_dtype)| {
            check_all_dtypes_on(&mut *gpu.borrow_mut(), &c, tuning, 0, grad_in_dtype);
            Ok(())
        })
        .unwrap();
    let mut gpu = gpu.into_inner();
    let mut c = base_case(vec![3000, 257, 1, 0, 45]);
    c.opts.rollout.set_bound(Rejection::TokenK2, 0.0, 0.2);
    for (policy, level) in POLICIES {
        for is_level in [IsLevel::Token, IsLevel::Sequence] {
            if policy == PolicyLoss::Vespo && is_level == IsLevel::Sequence {
                continue;
            }
            c.opts.policy_loss = policy;
            c.opts.ratio_level = level;
            c.opts.rollout.is_level = is_level;
            assert!(check_all_dtypes_on(
                &mut gpu,
                &c,
                Tuning::default(),
                0,
                false
            ));
        }
    }
}
