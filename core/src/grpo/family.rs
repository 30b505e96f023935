//! The policy-loss family beyond the clipped ratio (SPEC §17): the per-token
//! terms of CISPO, SAPO, GPG and KL-Cov, GMPO's clipped log ratio, and the deterministic covariance
//! selection of Clip-Cov and KL-Cov. Each function returns a term's loss and its derivative in
//! `logp`; the loss loop adds the aggregation weight, the rollout weight and the KL term.
//!
//! With `rho = exp(delta)`, `delta = clamp(logp - logp_old, -C, C)` and advantage `A`:
//!
//! ```text
//! CISPO     l = -sg(clip(rho, 1 - eps_low, 1 + eps_high)) * A * logp     dl/dlogp = -clip(rho) A
//! SAPO      l = -A * (4 / tau) * sigmoid(tau (rho - 1))                  tau = tau_pos if A > 0,
//!           dl/dlogp = -A * 4 s (1 - s) * rho,  s = sigmoid(tau (rho - 1))     else tau_neg
//! GPG       l = -A * logp                                                 dl/dlogp = -A
//! KL-Cov    l = -A * rho + [t selected] * coef * |delta|
//!           dl/dlogp = -A * rho + [t selected] * coef * sign(delta)
//! Clip-Cov  l = [t not selected] * (the clipped surrogate)
//! GMPO      d~_t = sgn(A_t) * min(sgn(A_t) delta_t, sgn(A_t) clip(delta_t, -eps_low, eps_high))
//!           l_i = -mean_t(A_t) * exp(mean_t d~_t), the same for every token of sequence i
//! VESPO     ln w_i = clamp(sum_t delta_t, ln 1e-8, 20), phi = exp(lam + k ln w_i - lam w_i)
//!           l = -sg(phi) * A * logp                                       dl/dlogp = -phi A
//!           (k, lam) = (k_pos, lam_pos) if A >= 0, else (k_neg, lam_neg)
//! ```
//!
//! Where `delta` hit the log-ratio clamp, every derivative that flows through `rho` or `delta`
//! is 0 (as for the clipped surrogate); CISPO's and GPG's flow through `logp` alone.
//!
//! **Covariance selection** (Clip-Cov, KL-Cov; Cui et al. 2025, "The Entropy Mechanism of
//! Reinforcement Learning for Reasoning Language Models"). Over the counted tokens of the call,
//! `cov_t = (A_t - mean A) * (logp_t - mean logp)`. KL-Cov selects the `k = max(1,
//! floor(ratio * N))` tokens with the largest covariance; Clip-Cov selects `k` tokens among the
//! candidates with `lb < cov_t < ub` that the clipped surrogate does not already clip. verl
//! samples Clip-Cov's `k` uniformly at random and leaves KL-Cov's ties to `torch.topk`; here
//! both take the largest covariances, ties going to the earlier token, so the result is a
//! function of the inputs. [`top_k`] finds the cut without allocating: a radix select over the
//! totally ordered bit patterns of `f64`, 8 bits a pass (8 counting passes, a 256-bin
//! histogram on the stack), the same cut the CUDA pre-passes compute.

use crate::names::named_enum;

/// Which policy-gradient term the loss uses (SPEC §17).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum PolicyLoss {
    /// The clipped ratio (PPO/GRPO; with the sequence ratio levels, GSPO and GSPO-token).
    /// verl `vanilla`, `gspo`; TRL `grpo`/`dapo`/...; OpenRLHF `ppo`, `gspo`. Default.
    #[default]
    Clip = 0,
    /// CISPO (MiniMax-M1): the clipped ratio as a detached weight on `A * logp`.
    Cispo = 1,
    /// SAPO (Qwen): a soft sigmoid gate on the ratio instead of the clip.
    Sapo = 2,
    /// GPG: plain policy gradient `-A * logp` (REINFORCE; no ratio).
    Gpg = 3,
    /// Clip-Cov: the clipped surrogate with the gradient of high-covariance tokens detached.
    ClipCov = 4,
    /// KL-Cov: the unclipped ratio plus `|delta|` on high-covariance tokens.
    KlCov = 5,
    /// GMPO: the geometric mean of the token ratios, clipped in log space, per sequence.
    Gmpo = 6,
    /// VESPO (TRL `vespo`): a detached Gamma weight of the sequence's importance ratio on
    /// `A * logp`.
    Vespo = 7,
}

named_enum!(PolicyLoss, "policy loss", {
    Clip => "clip", "The clipped ratio (PPO/GRPO; GSPO with a sequence ratio level)";
    Cispo => "cispo", "CISPO: the clipped ratio as a detached weight on A * logp";
    Sapo => "sapo", "SAPO: a soft sigmoid gate on the ratio";
    Gpg => "gpg", "GPG: plain policy gradient -A * logp";
    ClipCov => "clip_cov", "Clip-Cov: high-covariance tokens get no gradient";
    KlCov => "kl_cov", "KL-Cov: |log ratio| penalty on high-covariance tokens";
    Gmpo => "gmpo", "GMPO: geometric mean of the token ratios, clipped in log space";
    Vespo => "vespo", "VESPO: a Gamma weight of the sequence ratio on A * logp";
});

impl PolicyLoss {
    /// Whether the loss selects tokens by covariance (needs a pass over the whole call first).
    pub const fn selects_by_covariance(self) -> bool {
        matches!(self, PolicyLoss::ClipCov | PolicyLoss::KlCov)
    }
}

/// One token's policy-gradient term: its loss and its derivative in `logp` (before the
/// aggregation and rollout weights).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PgTerm {
    /// The term `l`.
    pub loss: f64,
    /// `dl / dlogp`.
    pub dloss_dlogp: f64,
    /// The loss's clip bound (CISPO: the weight was clipped).
    pub clipped: bool,
}

/// CISPO at ratio `rho` (`clamped`: the log ratio hit its clamp, which does not matter here:
/// the gradient flows through `logp` only). The weight is clipped to `[lo, hi]`.
#[inline]
pub fn cispo_term(rho: f64, logp: f64, a: f64, lo: f64, hi: f64) -> PgTerm {
    let (w, clipped) = if rho > hi {
        (hi, true)
    } else if rho < lo {
        (lo, true)
    } else {
        (rho, false)
    };
    PgTerm {
        loss: -w * a * logp,
        dloss_dlogp: -w * a,
        clipped,
    }
}

/// SAPO at ratio `rho`; `clamped` zeroes the derivative (it flows through `rho`).
#[inline]
pub fn sapo_term(rho: f64, a: f64, tau_pos: f64, tau_neg: f64, clamped: bool) -> PgTerm {
    let tau = if a > 0.0 { tau_pos } else { tau_neg };
    let s = sigmoid(tau * (rho - 1.0));
    let d = if clamped {
        0.0
    } else {
        -a * 4.0 * s * (1.0 - s) * rho
    };
    PgTerm {
        loss: -a * (4.0 / tau) * s,
        dloss_dlogp: d,
        clipped: false,
    }
}

/// `1 / (1 + exp(-x))`, without overflow for large `|x|`.
#[inline]
pub fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + libm::exp(-x))
    } else {
        let e = libm::exp(x);
        e / (1.0 + e)
    }
}

/// GPG (plain policy gradient).
#[inline]
pub fn gpg_term(logp: f64, a: f64) -> PgTerm {
    PgTerm {
        loss: -a * logp,
        dloss_dlogp: -a,
        clipped: false,
    }
}

/// KL-Cov at ratio `rho = exp(delta)`: `-A rho`, plus `coef * |delta|` on a selected token.
#[inline]
pub fn kl_cov_term(
    rho: f64,
    delta: f64,
    a: f64,
    selected: bool,
    coef: f64,
    clamped: bool,
) -> PgTerm {
    let (mut loss, mut d) = (-a * rho, -a * rho);
    if selected {
        loss += coef * delta.abs();
        let s = if delta > 0.0 {
            1.0
        } else if delta < 0.0 {
            -1.0
        } else {
            0.0
        };
        d += coef * s;
    }
    PgTerm {
        loss,
        dloss_dlogp: if clamped { 0.0 } else { d },
        clipped: false,
    }
}

/// VESPO's bounds on the sequence's log importance ratio, `[ln 1e-8, 20]` (TRL's
/// `get_gamma_weights`).
pub const VESPO_LOG_W_MIN: f64 = -18.420_680_743_952_367;
/// The upper bound of VESPO's log ratio.
pub const VESPO_LOG_W_MAX: f64 = 20.0;

/// VESPO's Gamma weight `phi = exp(lam + k ln w - lam w)` of the sequence's clamped log ratio
/// `log_w` (normalized so `phi(1) = 1`), with `(k, lam)` by the sign of the advantage (`A >= 0`:
/// the positive pair; `lam` at least `1e-4`); a non-finite `phi` is 0, as TRL's `nan_to_num`.
#[inline]
pub fn vespo_weight(log_w: f64, a: f64, k: (f64, f64), lam: (f64, f64)) -> f64 {
    let (k, lam) = if a >= 0.0 { (k.0, lam.0) } else { (k.1, lam.1) };
    let lam = if lam < 1e-4 { 1e-4 } else { lam };
    let phi = libm::exp(lam + k * log_w - lam * libm::exp(log_w));
    if phi.is_finite() { phi } else { 0.0 }
}

/// The VESPO term of a token with the weight `phi` of its sequence: `-phi * A * logp`, gradient
/// `-phi * A` (the weight is a constant).
#[inline]
pub fn vespo_term(phi: f64, logp: f64, a: f64) -> PgTerm {
    PgTerm {
        loss: -phi * a * logp,
        dloss_dlogp: -phi * a,
        clipped: false,
    }
}

/// GMPO's clipped log ratio of one token: `(d~, grad)` where `grad = d d~ / d delta` is 1 where
/// the unclipped branch binds (ties included) and 0 where the clip binds or `A = 0`.
#[inline]
pub fn gmpo_log_ratio(delta: f64, a: f64, eps_low: f64, eps_high: f64) -> (f64, f64) {
    let c = if delta > eps_high {
        eps_high
    } else if delta < -eps_low {
        -eps_low
    } else {
        delta
    };
    if a > 0.0 {
        // min(delta, c)
        if c < delta { (c, 0.0) } else { (delta, 1.0) }
    } else if a < 0.0 {
        // -min(-delta, -c) = max(delta, c)
        if c > delta { (c, 0.0) } else { (delta, 1.0) }
    } else {
        (0.0, 0.0)
    }
}

/// The covariance `(a - mean_a) * (logp - mean_logp)` with `-0.0` folded into `+0.0`, so
/// that equal values compare equal in [`top_k`].
#[inline]
pub fn covariance(a: f64, logp: f64, mean_a: f64, mean_logp: f64) -> f64 {
    let c = (a - mean_a) * (logp - mean_logp);
    if c == 0.0 { 0.0 } else { c }
}

/// A total order on non-NaN `f64` as `u64` keys (larger value, larger key).
#[inline]
fn key(x: f64) -> u64 {
    let b = x.to_bits();
    if b >> 63 == 1 { !b } else { b | (1 << 63) }
}

/// The cut of a top-`k` selection: token `t` with candidate value `v` is selected iff
/// `key(v) > above`, or `key(v) == above` and fewer than `ties` earlier tokens with that key
/// were selected. Use [`Selection::take`] in token order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Selection {
    above: u64,
    ties: u64,
    all: bool,
}

impl Selection {
    /// Selects nothing.
    pub const NONE: Selection = Selection {
        above: u64::MAX,
        ties: 0,
        all: false,
    };

    /// Decides the next candidate in token order (call once per candidate, in order; `None` for
    /// a token that is not a candidate).
    #[inline]
    pub fn take(&mut self, value: Option<f64>) -> bool {
        let Some(v) = value.filter(|v| !v.is_nan()) else {
            return false;
        };
        if self.all {
            return true;
        }
        let k = key(v);
        if k > self.above {
            true
        } else if k == self.above && self.ties > 0 {
            self.ties -= 1;
            true
        } else {
            false
        }
    }
}

/// The top-`k` [`Selection`] of the candidates that `values()` yields in token order (`None` or
/// NaN: not a candidate): the `k` largest values, ties to the earlier one. `values` is called
/// 8 times and must yield the same sequence each time.
///
/// A radix select of the cut `K`, the `k`-th largest key counted with multiplicity (so the
/// largest `K` with at least `k` keys at or above it): pass `r` counts, among the keys whose
/// top `8r` bits equal the digits chosen so far, each value of the next 8 bits, and takes the
/// largest digit at which the count from the top reaches the keys still to take.
pub fn top_k<I: Iterator<Item = Option<f64>>>(k: usize, values: impl Fn() -> I) -> Selection {
    if k == 0 {
        return Selection::NONE;
    }
    let (mut prefix, mut rem) = (0u64, k);
    for round in 0..8u32 {
        let shift = 56 - 8 * round;
        let mut hist = [0usize; 256];
        for v in values().flatten().filter(|v| !v.is_nan()) {
            let key = key(v);
            // Round 0 counts every key; later rounds those under the chosen prefix.
            if round == 0 || key >> (shift + 8) == prefix >> (shift + 8) {
                hist[(key >> shift) as usize & 255] += 1;
            }
        }
        if round == 0 && hist.iter().sum::<usize>() <= k {
            return Selection {
                above: 0,
                ties: 0,
                all: true,
            };
        }
        // The largest digit whose count from the top reaches `rem` (it exists: the keys under
        // the prefix number at least `rem`).
        let mut above = 0usize;
        for d in (0..256usize).rev() {
            if above + hist[d] >= rem {
                prefix |= (d as u64) << shift;
                rem -= above;
                break;
            }
            above += hist[d];
        }
    }
    // `rem` keys equal to the cut are still to take: the earliest ones.
    Selection {
        above: prefix,
        ties: rem as u64,
        all: false,
    }
}

/// The number of tokens a covariance loss selects among `n` counted tokens:
/// `max(1, floor(ratio * n))` (0 when `n = 0`), verl's `clip_num` / `k_percent_nums`.
#[inline]
pub fn cov_select_count(ratio: f64, n: f64) -> usize {
    if n <= 0.0 {
        return 0;
    }
    let k = libm::floor(ratio * n);
    if k >= 1.0 { k as usize } else { 1 }
}
