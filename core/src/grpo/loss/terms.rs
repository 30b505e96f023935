//! The per-token terms of the loss: pure functions a kernel mirrors line by line.

use super::options::{Aggregation, KlEstimator, LossOptions};

/// The clipped surrogate of one token at ratio `rho`: the loss and its derivative in `rho`.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Surrogate {
    /// `min(max(pg1, pg2), -A * c)` (the `min` only with the dual clip on and `A < 0`).
    pub loss: f64,
    /// `d loss / d rho`: `-A` where `pg1` binds, else 0 (clipped or dual-clipped).
    pub dloss_drho: f64,
    /// The clipped branch binds: `pg2 > pg1`.
    pub clipped: bool,
    /// `rho < 1 - eps_low` and `A < 0`.
    pub clipped_low: bool,
    /// `rho > 1 + eps_high` and `A > 0`.
    pub clipped_high: bool,
    /// The dual clip binds.
    pub dual_clipped: bool,
}

/// The clipped (and optionally dual-clipped) surrogate of SPEC §10 at ratio `rho`, advantage `a`.
#[inline]
pub fn surrogate(rho: f64, a: f64, opts: &LossOptions) -> Surrogate {
    let lo = 1.0 - opts.eps_low;
    let hi = 1.0 + opts.eps_high;
    let pg1 = -a * rho;
    // Written out rather than f64::clamp, which panics when lo > hi (impossible for validated
    // options, but this function is public).
    let clipped_rho = if rho < lo {
        lo
    } else if rho > hi {
        hi
    } else {
        rho
    };
    let pg2 = -a * clipped_rho;
    let clipped = pg2 > pg1;
    let (mut loss, mut dloss_drho) = if clipped { (pg2, 0.0) } else { (pg1, -a) };
    let mut dual_clipped = false;
    if opts.dual_clip_on() && a < 0.0 {
        let cap = -a * opts.dual_clip;
        if cap < loss {
            loss = cap;
            dloss_drho = 0.0;
            dual_clipped = true;
        }
    }
    Surrogate {
        loss,
        dloss_drho,
        clipped,
        clipped_low: rho < lo && a < 0.0,
        clipped_high: rho > hi && a > 0.0,
        dual_clipped,
    }
}

/// One KL estimator value and its derivative in `logp`.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct KlTerm {
    /// The estimator value `k`.
    pub k: f64,
    /// `dk / dlogp` (0 where the input or output clamp binds).
    pub dk_dlogp: f64,
}

/// The KL estimator of SPEC §10 at `x_raw = logp_ref - logp` (clamped here to
/// `±kl_input_clamp`; `k3` also clamped to `±kl_output_clamp`).
#[inline]
pub fn kl_term(x_raw: f64, opts: &LossOptions) -> KlTerm {
    let c = opts.kl_input_clamp;
    let in_clamped = x_raw > c || x_raw < -c;
    let x = if x_raw > c {
        c
    } else if x_raw < -c {
        -c
    } else {
        x_raw
    };
    let live = if in_clamped { 0.0 } else { 1.0 };
    match opts.kl_estimator {
        KlEstimator::K1 => KlTerm {
            k: -x,
            dk_dlogp: live,
        },
        KlEstimator::Abs => {
            let s = if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                0.0
            };
            KlTerm {
                k: x.abs(),
                dk_dlogp: -s * live,
            }
        }
        KlEstimator::K2 => KlTerm {
            k: 0.5 * x * x,
            dk_dlogp: -x * live,
        },
        KlEstimator::K3 => {
            let ex = libm::exp(x);
            let raw = ex - x - 1.0;
            let o = opts.kl_output_clamp;
            if raw > o {
                KlTerm {
                    k: o,
                    dk_dlogp: 0.0,
                }
            } else if raw < -o {
                KlTerm {
                    k: -o,
                    dk_dlogp: 0.0,
                }
            } else {
                KlTerm {
                    k: raw,
                    dk_dlogp: (1.0 - ex) * live,
                }
            }
        }
    }
}

/// Everything one token contributes, before the aggregation weight.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct TokenTerms {
    /// `l_t`: surrogate plus `beta * k`.
    pub loss: f64,
    /// `d l_t / d logp_t` at token ratio level (multiply by `w_t` for `dL/dlogp_t`).
    pub grad: f64,
    /// The ratio `rho` used.
    pub ratio: f64,
    /// The (clamped) log ratio `delta`.
    pub log_ratio: f64,
    /// `|logp - logp_old|` exceeded the clamp (the surrogate's gradient is then 0).
    pub log_ratio_clamped: bool,
    /// The surrogate part.
    pub surrogate: Surrogate,
    /// The KL estimator value (0 when the KL term is off).
    pub kl: f64,
}

/// The clamped log ratio `delta = clamp(logp - logp_old, -bound, bound)` and whether the clamp
/// bound (`logp_old = None`, on-policy: `(0, false)`). A NaN difference passes through unclamped.
#[inline]
pub fn log_ratio(logp: f64, logp_old: Option<f64>, bound: f64) -> (f64, bool) {
    let raw = match logp_old {
        Some(old) => logp - old,
        None => 0.0,
    };
    if raw > bound {
        (bound, true)
    } else if raw < -bound {
        (-bound, true)
    } else {
        (raw, false)
    }
}

/// The GSPO sequence ratio `rho_i = exp(min(sum_delta / n_i, max))` from the sum of the clamped
/// log ratios of the sequence's `n_i > 0` counted tokens, and whether the cap bound (then the
/// gradient through the mean is 0).
#[inline]
pub fn sequence_ratio(sum_delta: f64, n_i: f64, max: f64) -> (f64, bool) {
    let mean = sum_delta / n_i;
    let capped = mean > max;
    (libm::exp(if capped { max } else { mean }), capped)
}

/// Loss and gradient of one counted token at the token ratio level (the formula block of this
/// module's docs). `logp_old = None` is on-policy; the KL term is added when `logp_ref` is given
/// and `opts.beta > 0`. Sequence-level (GSPO) terms are assembled by [`policy_loss`](super::policy_loss) from
/// [`surrogate`] and [`kl_term`].
#[inline]
pub fn token_loss_and_grad(
    logp: f64,
    logp_old: Option<f64>,
    logp_ref: Option<f64>,
    adv: f64,
    opts: &LossOptions,
) -> TokenTerms {
    let (delta, clamped) = log_ratio(logp, logp_old, opts.log_ratio_clamp);
    let rho = libm::exp(delta);
    let s = surrogate(rho, adv, opts);
    let mut grad = if clamped { 0.0 } else { s.dloss_drho * rho };
    let mut loss = s.loss;
    let mut kl = 0.0;
    if let Some(r) = logp_ref.filter(|_| opts.beta > 0.0) {
        let k = kl_term(r - logp, opts);
        loss += opts.beta * k.k;
        grad += opts.beta * k.dk_dlogp;
        kl = k.k;
    }
    TokenTerms {
        loss,
        grad,
        ratio: rho,
        log_ratio: delta,
        log_ratio_clamped: clamped,
        surrogate: s,
        kl,
    }
}

/// The aggregation weight `w_t` of a token of a sequence with `n_i` counted tokens, given the
/// denominators `N_tok`, `N_seq` and `H`. A zero denominator gives weight 0 (nothing counted).
#[inline]
pub fn aggregation_weight(agg: Aggregation, n_i: f64, n_tok: f64, n_seq: f64, h: f64) -> f64 {
    let inv = |d: f64| if d > 0.0 { 1.0 / d } else { 0.0 };
    match agg {
        Aggregation::TokenMean => inv(n_tok),
        Aggregation::SeqMeanTokenMean => inv(n_i * n_seq),
        Aggregation::SeqMeanTokenSum => inv(n_seq),
        Aggregation::SeqMeanTokenSumNorm => inv(n_seq * h),
        Aggregation::TokenSum => 1.0,
        Aggregation::TokenSumNorm => inv(h),
    }
}
