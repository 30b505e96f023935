//! The policy loss (every policy loss of the family, every ratio level and aggregation, the
//! rollout correction with rollout log-probs) on arbitrary token layouts, masks, values, dtypes
//! and options: no panic, no out-of-bounds, masked (and dropped) tokens get a gradient of
//! exactly 0 whatever their inputs, nothing is written on error, the stats count the counted
//! tokens (those the rollout correction drops excluded), and the loss and gradient are finite
//! whenever every counted input is finite and the options are in a realistic range (beta and
//! the KL-Cov coefficient <= 1e6, SAPO temperatures >= 1e-3, clamp bounds <= 50, global
//! denominators 0 or >= 1; outside it `exp` of a clamp bound can overflow). Any finite advantage
//! is in range: the f32 gradient saturates at `f32::MAX` (see `care-tests`' regressions).
#![no_main]

use arbitrary::Arbitrary;
use care_core::grpo::{
    Advantages, Aggregation, IsLevel, KlEstimator, LogProb, LossInputs, LossOptions, PolicyLoss,
    RatioLevel, RejectBound, Rejection, RejectionMode, RolloutOptions, SequenceCount, policy_loss,
};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Opts {
    eps_low: f64,
    eps_high: f64,
    dual_clip: f64,
    log_ratio_clamp: f64,
    seq_log_ratio_max: f64,
    beta: f64,
    kl_input_clamp: f64,
    kl_output_clamp: f64,
    global_tokens: f64,
    global_sequences: f64,
    horizon: f64,
    aggregation: u8,
    ratio_level: u8,
    kl: u8,
    policy_loss: u8,
    all_rows: bool,
    sapo_tau: (f64, f64),
    cov: (f64, f64, f64, f64),
    rollout: RolloutOpts,
    /// Use the defaults for most fields (so valid options are common).
    defaults: bool,
}

#[derive(Arbitrary, Debug)]
struct RolloutOpts {
    is_level: u8,
    is_threshold: f64,
    is_threshold_low: f64,
    log_ratio_clamp: f64,
    /// (criterion, lower, upper), a few at a time.
    reject: Vec<(u8, f64, f64)>,
    zero_weight: bool,
    /// Use defaults with a few valid bounds (so valid corrections are common).
    defaults: bool,
}

#[derive(Arbitrary, Debug)]
struct Input {
    seq_lens: Vec<u8>,
    raw_offsets: Option<Vec<u32>>,
    logp: Vec<f32>,
    logp_old: Option<Vec<f32>>,
    logp_ref: Option<Vec<f32>>,
    logp_rollout: Option<Vec<f32>>,
    mask: Option<Vec<bool>>,
    adv: Vec<f32>,
    per_token: bool,
    grad_len_delta: i8,
    dtype: u8,
    opts: Opts,
}

fn rollout(r: &RolloutOpts) -> RolloutOptions {
    let is_level = IsLevel::ALL[usize::from(r.is_level) % IsLevel::ALL.len()];
    let rejection_mode = if r.zero_weight {
        RejectionMode::ZeroWeight
    } else {
        RejectionMode::Drop
    };
    let mut o = RolloutOptions {
        is_level,
        rejection_mode,
        ..RolloutOptions::default()
    };
    if r.defaults {
        for &(k, _, u) in r.reject.iter().take(3) {
            let c = Rejection::ALL[usize::from(k) % Rejection::ALL.len()];
            let u = 1.0 + u.abs().min(4.0);
            o.reject[c as usize] = if c.is_k1() {
                RejectBound::ratio(u)
            } else {
                RejectBound {
                    lower: 0.0,
                    upper: u - 1.0 + 1e-3,
                }
            };
        }
        return o;
    }
    o.is_threshold = r.is_threshold;
    o.is_threshold_low = r.is_threshold_low;
    o.log_ratio_clamp = r.log_ratio_clamp;
    for &(k, l, u) in r.reject.iter().take(4) {
        o.reject[usize::from(k) % Rejection::ALL.len()] = RejectBound { lower: l, upper: u };
    }
    o
}

fn options(o: &Opts) -> LossOptions {
    let d = LossOptions::default();
    let aggregation = Aggregation::ALL[usize::from(o.aggregation) % Aggregation::ALL.len()];
    let ratio_level = RatioLevel::ALL[usize::from(o.ratio_level) % RatioLevel::ALL.len()];
    let kl_estimator = KlEstimator::ALL[usize::from(o.kl % 4)];
    let policy_loss = PolicyLoss::ALL[usize::from(o.policy_loss) % PolicyLoss::ALL.len()];
    let sequence_count = if o.all_rows {
        SequenceCount::All
    } else {
        SequenceCount::NonEmpty
    };
    if o.defaults {
        return LossOptions {
            beta: o.beta.abs().min(1.0),
            aggregation,
            // Ratio levels beyond token need the clipped ratio.
            ratio_level: if policy_loss == PolicyLoss::Clip {
                ratio_level
            } else {
                RatioLevel::Token
            },
            kl_estimator,
            policy_loss,
            sequence_count,
            cov_ratio: 0.25,
            clip_cov_lb: -1.0,
            clip_cov_ub: 1.0,
            rollout: rollout(&o.rollout),
            ..d
        };
    }
    LossOptions {
        policy_loss,
        sequence_count,
        sapo_tau_pos: o.sapo_tau.0,
        sapo_tau_neg: o.sapo_tau.1,
        cov_ratio: o.cov.0,
        clip_cov_lb: o.cov.1,
        clip_cov_ub: o.cov.2,
        kl_cov_coef: o.cov.3,
        rollout: rollout(&o.rollout),
        eps_low: o.eps_low,
        eps_high: o.eps_high,
        dual_clip: o.dual_clip,
        log_ratio_clamp: o.log_ratio_clamp,
        seq_log_ratio_max: o.seq_log_ratio_max,
        beta: o.beta,
        kl_input_clamp: o.kl_input_clamp,
        kl_output_clamp: o.kl_output_clamp,
        global_tokens: o.global_tokens,
        global_sequences: o.global_sequences,
        horizon: o.horizon,
        aggregation,
        ratio_level,
        kl_estimator,
        ..d
    }
}

fn realistic(o: &LossOptions, adv: &[f32]) -> bool {
    let denom = |x: f64| x == 0.0 || x >= 1.0;
    adv.iter().all(|a| a.is_finite())
        && o.beta <= 1e6
        && o.log_ratio_clamp <= 50.0
        && o.seq_log_ratio_max <= 50.0
        && o.kl_input_clamp <= 50.0
        && o.kl_output_clamp <= 50.0
        && o.kl_cov_coef <= 1e6
        && o.sapo_tau_pos >= 1e-3
        && o.sapo_tau_neg >= 1e-3
        && o.rollout.log_ratio_clamp <= 50.0
        && denom(o.global_tokens)
        && denom(o.global_sequences)
        && denom(o.horizon)
}

fn per_token(v: &[f32], t: usize) -> Vec<f32> {
    (0..t).map(|i| v.get(i).copied().unwrap_or(-1.0)).collect()
}

fn run<T: LogProb>(inp: &Input, conv: impl Fn(f32) -> T) {
    let offsets: Vec<u32> = match &inp.raw_offsets {
        Some(o) => o.clone(),
        None => {
            let mut o = vec![0u32];
            for &k in &inp.seq_lens {
                o.push(o.last().unwrap() + u32::from(k));
            }
            o
        }
    };
    // Per-token buffers have the layout's length (capped), so most inputs pass the checks.
    let t = (offsets.last().copied().unwrap_or(0) as usize).min(1 << 14);
    let b = offsets.len().saturating_sub(1);
    let logp: Vec<T> = per_token(&inp.logp, t).into_iter().map(&conv).collect();
    let old: Option<Vec<T>> = inp
        .logp_old
        .as_ref()
        .map(|v| per_token(v, t).into_iter().map(&conv).collect());
    let rf: Option<Vec<T>> = inp
        .logp_ref
        .as_ref()
        .map(|v| per_token(v, t).into_iter().map(&conv).collect());
    let roll: Option<Vec<T>> = inp
        .logp_rollout
        .as_ref()
        .map(|v| per_token(v, t).into_iter().map(&conv).collect());
    let mask: Option<Vec<u8>> = inp.mask.as_ref().map(|m| {
        (0..t)
            .map(|i| u8::from(m.get(i).copied().unwrap_or(true)))
            .collect()
    });
    let adv_len = if inp.per_token { t } else { b };
    let adv: Vec<f32> = (0..adv_len)
        .map(|i| inp.adv.get(i).copied().unwrap_or(0.5))
        .collect();
    let opts = options(&inp.opts);
    let grad_len = t.saturating_add_signed(isize::from(inp.grad_len_delta % 2));
    let mut grad = vec![99.0f32; grad_len];
    let inputs = LossInputs {
        logp: &logp,
        logp_old: old.as_deref(),
        logp_ref: rf.as_deref(),
        seq_offsets: &offsets,
        mask: mask.as_deref(),
        advantages: if inp.per_token {
            Advantages::PerToken(&adv)
        } else {
            Advantages::PerSequence(&adv)
        },
        logp_rollout: roll.as_deref(),
    };
    match policy_loss(&inputs, &opts, &mut grad) {
        Ok(out) => {
            assert_eq!(grad_len, t);
            let counted = |i: usize| mask.as_ref().is_none_or(|m| m[i] != 0);
            let n_counted = (0..t).filter(|&i| counted(i)).count() as f64;
            // The rollout correction's diagnostics count the tokens before rejection.
            if roll.is_some() {
                assert_eq!(out.rollout.tokens, n_counted);
            }
            let dropped = roll.is_some()
                && opts.rollout.active()
                && opts.rollout.rejection_mode == RejectionMode::Drop;
            let kept = n_counted
                - if dropped {
                    out.rollout.rejected_tokens
                } else {
                    0.0
                };
            assert_eq!(out.stats.tokens, kept);
            assert!(out.loss == out.stats.loss || (out.loss.is_nan() && out.stats.loss.is_nan()));
            for (i, g) in grad.iter().enumerate() {
                if !counted(i) {
                    assert!(*g == 0.0, "masked token {i}: grad {g}");
                }
            }
            if out.stats.non_finite == 0.0 && realistic(&opts, &adv) {
                assert!(out.loss.is_finite(), "loss {} for {inp:?}", out.loss);
                for (i, g) in grad.iter().enumerate() {
                    assert!(g.is_finite(), "grad[{i}] = {g} for {inp:?}");
                }
            }
        }
        Err(_) => assert!(grad.iter().all(|&g| g == 99.0), "written on error"),
    }
}

fuzz_target!(|inp: Input| {
    match inp.dtype % 3 {
        0 => run::<f32>(&inp, |x| x),
        1 => run::<half::bf16>(&inp, half::bf16::from_f32),
        _ => run::<half::f16>(&inp, half::f16::from_f32),
    }
});
