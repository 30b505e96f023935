//! Rollout correction (SPEC §16): importance weights and rejection masks from the
//! inference engine's log-probs, and the off-policy diagnostics as sums.
//!
//! The rollout engine (vLLM, SGLang, an FP8 kernel, a stale checkpoint) samples with
//! `pi_rollout`; the trainer recomputes `logp_old` (the proximal policy `pi_old`). Per counted
//! token, with `S = log_ratio_clamp` (20, verl's `SAFETY_BOUND`; infinity turns it off):
//!
//! ```text
//! x_t  = logp_old_t - logp_rollout_t             log rho_t, rho_t = pi_old / pi_rollout
//! x^_t = clamp(x_t, -S, S)
//! token weight     w_t = clamp(exp(x^_t), C_low, C)              C = is_threshold (TIS),
//!                                                                C_low = is_threshold_low (0)
//! sequence weight  w_i = clamp(exp(clamp(sum_t x_t, -S, S)), C_low, C)   every token of seq i
//! k1_t = x^_t   k2_t = x^_t^2 / 2   k3_t = exp(x^_t) - 1 - x^_t
//! token_kJ      keeps a token when its own kJ_t passes
//! seq_sum_kJ    keeps a sequence when sum_t kJ_t passes      (sums over its counted tokens)
//! seq_mean_kJ   keeps a sequence when mean_t kJ_t passes
//! seq_max_kJ    keeps a sequence when max_t kJ_t passes      (k2, k3 only)
//! passes: k1: ln(lower) <= stat <= ln(upper);  k2, k3: stat <= upper;  NaN never passes
//! ```
//!
//! Every enabled criterion must pass (they chain with AND). A rejected token either leaves the
//! loss as if its mask were 0 ([`RejectionMode::Drop`], verl's rejection sampling: it drops out
//! of every count and denominator) or keeps its place with importance weight 0
//! ([`RejectionMode::ZeroWeight`]: TRL's `*_mask` modes, OpenRLHF's `icepop` and
//! `seq-mask-tis`, verl's IcePop weights). The weights multiply the policy-gradient term only
//! and are constants for the gradient (detached), as importance sampling requires. Weights and rejections are computed from the mask *before* rejection, as
//! verl does. Without `logp_old` (on-policy), the proximal policy is the current one: `x_t` uses
//! `logp_t` as a constant (verl's bypass mode).
//!
//! Differences from verl's `rollout_corr_helper.py` (on purpose): the `k1` bounds apply to the
//! ratio `rho = pi_old / pi_rollout` as the method's write-up states (`C_lower <= rho <=
//! C_upper`); verl's code bounds `1 / rho`, which is the same for the default `lower = 1 /
//! upper`. The diagnostics are sums over counted tokens and over sequences with a counted token
//! (verl averages over every row). There is no batch normalization of the weights (it needs the
//! batch mean before the loss; divide by `weight_sum / tokens` of a first pass if wanted).

use super::layout::validate_offsets;
use super::logprob::LogProb;
use crate::error::{InvalidOption, domain};
use crate::names::named_enum;
use crate::{Error, Result};

/// How importance weights are formed from the rollout log ratio (verl `rollout_is`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum IsLevel {
    /// No importance weights (every weight 1; default).
    #[default]
    Off = 0,
    /// One weight per token, `min(rho_t, C)` (token TIS).
    Token = 1,
    /// One weight per sequence, `min(prod_t rho_t, C)` (sequence TIS).
    Sequence = 2,
}

named_enum!(IsLevel, "importance-weight level", {
    Off => "off", "No importance weights";
    Token => "token", "One truncated weight per token (token TIS)";
    Sequence => "sequence", "One truncated weight per sequence (sequence TIS)";
});

/// What a rejected token becomes.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum RejectionMode {
    /// Masked out: it leaves the loss and every count, as verl's `rollout_rs` (default).
    #[default]
    Drop = 0,
    /// Importance weight 0 on its policy-gradient term; it stays counted (denominators, KL
    /// term), as TRL's `*_mask` modes and OpenRLHF's `icepop` / `seq-mask-tis`.
    ZeroWeight = 1,
}

named_enum!(RejectionMode, "rejection mode", {
    Drop => "drop", "A rejected token leaves the loss and every count (verl)";
    ZeroWeight => "zero_weight", "A rejected token keeps its place with weight 0 (TRL, OpenRLHF)";
});

/// A rejection criterion (verl `rollout_rs`): a divergence statistic per token or per sequence.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rejection {
    /// `k1_t = log rho_t` within `[ln lower, ln upper]`.
    TokenK1 = 0,
    /// `k2_t = (log rho_t)^2 / 2 <= upper`.
    TokenK2 = 1,
    /// `k3_t = rho_t - 1 - log rho_t <= upper`.
    TokenK3 = 2,
    /// `sum_t k1_t = log prod_t rho_t` within `[ln lower, ln upper]`.
    SeqSumK1 = 3,
    /// `sum_t k2_t <= upper`.
    SeqSumK2 = 4,
    /// `sum_t k3_t <= upper`.
    SeqSumK3 = 5,
    /// `mean_t k1_t` (the log of the geometric-mean ratio) within `[ln lower, ln upper]`.
    SeqMeanK1 = 6,
    /// `mean_t k2_t <= upper`.
    SeqMeanK2 = 7,
    /// `mean_t k3_t <= upper`.
    SeqMeanK3 = 8,
    /// `max_t k2_t <= upper`.
    SeqMaxK2 = 9,
    /// `max_t k3_t <= upper`.
    SeqMaxK3 = 10,
}

named_enum!(Rejection, "rejection criterion", {
    TokenK1 => "token_k1", "Token log ratio within [ln lower, ln upper]";
    TokenK2 => "token_k2", "Token (log ratio)^2 / 2 <= upper";
    TokenK3 => "token_k3", "Token rho - 1 - log rho <= upper";
    SeqSumK1 => "seq_sum_k1", "Sequence sum of log ratios within [ln lower, ln upper]";
    SeqSumK2 => "seq_sum_k2", "Sequence sum of k2 <= upper";
    SeqSumK3 => "seq_sum_k3", "Sequence sum of k3 <= upper";
    SeqMeanK1 => "seq_mean_k1", "Sequence mean log ratio within [ln lower, ln upper]";
    SeqMeanK2 => "seq_mean_k2", "Sequence mean of k2 <= upper";
    SeqMeanK3 => "seq_mean_k3", "Sequence mean of k3 <= upper";
    SeqMaxK2 => "seq_max_k2", "Sequence max of k2 <= upper";
    SeqMaxK3 => "seq_max_k3", "Sequence max of k3 <= upper";
});

impl Rejection {
    /// Whether the criterion bounds `k1` (a log ratio, with a lower and an upper ratio bound);
    /// the others bound `k2`/`k3` from above only.
    pub const fn is_k1(self) -> bool {
        matches!(
            self,
            Rejection::TokenK1 | Rejection::SeqSumK1 | Rejection::SeqMeanK1
        )
    }

    /// Whether the criterion looks at each token on its own (else at the whole sequence).
    pub const fn is_token_level(self) -> bool {
        matches!(
            self,
            Rejection::TokenK1 | Rejection::TokenK2 | Rejection::TokenK3
        )
    }
}

/// The threshold of one [`Rejection`] criterion. `upper = 0` turns the criterion off (the
/// zeroed struct rejects nothing).
///
/// Field order (C): `lower: f64, upper: f64`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(deny_unknown_fields)
)]
pub struct RejectBound {
    /// `k1` criteria: the lower ratio bound, `0 <= lower <= upper`, finite (0 = no lower
    /// bound; verl's one-number threshold `u` is `lower = 1 / u`, see [`RejectBound::ratio`]).
    /// Other criteria: must be 0.
    pub lower: f64,
    /// `k1` criteria: the upper ratio bound; others: the upper bound on the statistic. `> 0`
    /// (`+inf` allowed) to enable, 0 = off.
    #[cfg_attr(feature = "serde", serde(with = "crate::serde_impls::float"))]
    pub upper: f64,
}

impl RejectBound {
    /// verl's one-number ratio threshold `u` of a `k1` criterion: `[1 / u, u]`.
    pub fn ratio(u: f64) -> RejectBound {
        RejectBound {
            lower: 1.0 / u,
            upper: u,
        }
    }

    /// The criterion is enabled.
    #[inline]
    pub fn on(&self) -> bool {
        self.upper != 0.0
    }
}

/// Options of the rollout correction. Plain `#[repr(C)]` data.
///
/// Field order (C): `is_threshold: f64, is_threshold_low: f64, log_ratio_clamp: f64,
/// reject: RejectBound[11], is_level: u32, rejection_mode: u32` (208 bytes, no padding). The
/// zeroed `reject` table rejects nothing.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(deny_unknown_fields)
)]
pub struct RolloutOptions {
    /// Truncation `C` of the importance weights (TIS; verl `rollout_is_threshold`, 2).
    /// `> 0`; `+inf` keeps the weights untruncated.
    #[cfg_attr(feature = "serde", serde(with = "crate::serde_impls::float"))]
    pub is_threshold: f64,
    /// Lower truncation `C_low` of the importance weights (0 = none, verl; OpenRLHF `tis` and
    /// TRL `*_truncate` take one). `0 <= C_low <= C`, finite.
    pub is_threshold_low: f64,
    /// Bound `S` on the rollout log ratio before `exp` (20, verl's `SAFETY_BOUND`). `> 0`;
    /// `+inf` turns it off.
    #[cfg_attr(feature = "serde", serde(with = "crate::serde_impls::float"))]
    pub log_ratio_clamp: f64,
    /// One threshold per [`Rejection`], indexed by its number.
    pub reject: [RejectBound; 11],
    /// Importance-weight level (off by default).
    pub is_level: IsLevel,
    /// What a rejected token becomes.
    pub rejection_mode: RejectionMode,
}

impl Default for RolloutOptions {
    /// [`RolloutOptions::DEFAULT`].
    fn default() -> Self {
        RolloutOptions::DEFAULT
    }
}

impl RolloutOptions {
    /// No weights, no rejection, truncation 2, clamp 20 (verl's defaults).
    pub const DEFAULT: RolloutOptions = RolloutOptions {
        is_threshold: 2.0,
        is_threshold_low: 0.0,
        log_ratio_clamp: 20.0,
        reject: [RejectBound {
            lower: 0.0,
            upper: 0.0,
        }; 11],
        is_level: IsLevel::Off,
        rejection_mode: RejectionMode::Drop,
    };

    /// The threshold of one criterion.
    #[inline]
    pub fn bound(&self, r: Rejection) -> RejectBound {
        self.reject[r as usize]
    }

    /// Sets (or, with `upper = 0`, clears) the threshold of one criterion.
    #[inline]
    pub fn set_bound(&mut self, r: Rejection, lower: f64, upper: f64) {
        self.reject[r as usize] = RejectBound { lower, upper };
    }

    /// Sets the rejection criteria from verl's `rollout_rs` and `rollout_rs_threshold`
    /// strings (the other criteria are turned off): `options` is a comma-separated list of
    /// [`Rejection`] names; `thresholds` holds one entry shared by every option or one per
    /// option, in order. A `k1` entry is `lower_upper` (ratio bounds, `0 <= lower <= upper`) or
    /// one number `u`, meaning `[1 / u, u]`; the others are one upper bound. Nothing allocates;
    /// the result is checked like every option.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an unknown or repeated name, a count of thresholds that is
    /// neither 1 nor the number of options, an entry that is not a number (or a `k2`/`k3`
    /// entry with a lower bound), or bounds outside their domain. On error `self` is unchanged.
    pub fn set_rejections(&mut self, options: &str, thresholds: &str) -> Result<()> {
        let entries = || thresholds.split(',').map(str::trim);
        let n_thr = entries().count();
        let names = || options.split(',').map(str::trim).filter(|s| !s.is_empty());
        let n_opt = names().count();
        if n_opt == 0 || !(n_thr == 1 || n_thr == n_opt) {
            return Err(Error::InvalidArgument);
        }
        let mut out = RolloutOptions {
            reject: [RejectBound::default(); 11],
            ..*self
        };
        for (i, name) in names().enumerate() {
            let r = Rejection::from_name(name).ok_or(Error::InvalidArgument)?;
            if out.bound(r).on() {
                return Err(Error::InvalidArgument); // named twice
            }
            let spec = entries()
                .nth(if n_thr == 1 { 0 } else { i })
                .ok_or(Error::InvalidArgument)?;
            let num = |t: &str| t.trim().parse::<f64>().map_err(|_| Error::InvalidArgument);
            let b = match spec.split_once('_') {
                Some((lo, hi)) if r.is_k1() => RejectBound {
                    lower: num(lo)?,
                    upper: num(hi)?,
                },
                Some(_) => return Err(Error::InvalidArgument),
                None if r.is_k1() => RejectBound::ratio(num(spec)?),
                None => RejectBound {
                    lower: 0.0,
                    upper: num(spec)?,
                },
            };
            // 0 would mean "off", NaN and negatives are out of the domain.
            if b.upper.is_nan() || b.upper <= 0.0 {
                return Err(Error::InvalidArgument);
            }
            out.reject[r as usize] = b;
        }
        out.validate()?;
        *self = out;
        Ok(())
    }

    /// Whether the correction changes anything (weights or rejection); the diagnostics are
    /// computed whenever rollout log-probs are given.
    pub fn active(&self) -> bool {
        self.is_level != IsLevel::Off || self.reject.iter().any(RejectBound::on)
    }

    /// Checks the numeric fields. Errors: [`Error::InvalidArgument`] for a truncation or clamp
    /// that is not `> 0`, a lower truncation that is negative, not finite or above the upper
    /// one, an enabled bound that is not `> 0`, a `k1` lower bound that is negative, not finite
    /// or above the upper bound, or a lower bound on a `k2`/`k3` criterion or on a disabled one.
    pub fn validate(&self) -> Result<()> {
        self.check().map_err(Error::from)
    }

    /// [`RolloutOptions::validate`], naming the first field outside its domain.
    ///
    /// # Errors
    /// The first field outside its domain.
    pub fn check(&self) -> core::result::Result<(), InvalidOption> {
        let pos = |x: f64| x > 0.0; // false for NaN, true for +inf
        InvalidOption::require(
            pos(self.is_threshold),
            "rollout.is_threshold",
            domain::POSITIVE,
        )?;
        let low = self.is_threshold_low;
        InvalidOption::require(
            low.is_finite() && low >= 0.0 && low <= self.is_threshold,
            "rollout.is_threshold_low",
            "finite, >= 0 and <= is_threshold",
        )?;
        InvalidOption::require(
            pos(self.log_ratio_clamp),
            "rollout.log_ratio_clamp",
            domain::POSITIVE,
        )?;
        for r in Rejection::ALL {
            let b = self.bound(r);
            let ok = if !b.on() {
                b.lower == 0.0
            } else if r.is_k1() {
                pos(b.upper) && b.lower.is_finite() && b.lower >= 0.0 && b.lower <= b.upper
            } else {
                pos(b.upper) && b.lower == 0.0
            };
            let expected = if r.is_k1() {
                "0 (off) or > 0, with 0 <= lower <= upper"
            } else {
                "0 (off) or > 0, with lower 0"
            };
            InvalidOption::require(ok, "rollout.reject", expected)?;
        }
        Ok(())
    }

    /// The thresholds resolved for the hot loop: log bounds of the `k1` criteria.
    pub(crate) fn resolved(&self) -> Resolved {
        let k1 = |r: Rejection| -> Option<(f64, f64)> {
            let b = self.bound(r);
            // ln 0 = -inf: no lower bound.
            b.on().then(|| (libm::log(b.lower), libm::log(b.upper)))
        };
        let up = |r: Rejection| -> Option<f64> {
            let b = self.bound(r);
            b.on().then_some(b.upper)
        };
        Resolved {
            token_k1: k1(Rejection::TokenK1),
            token_k2: up(Rejection::TokenK2),
            token_k3: up(Rejection::TokenK3),
            sum_k1: k1(Rejection::SeqSumK1),
            sum_k2: up(Rejection::SeqSumK2),
            sum_k3: up(Rejection::SeqSumK3),
            mean_k1: k1(Rejection::SeqMeanK1),
            mean_k2: up(Rejection::SeqMeanK2),
            mean_k3: up(Rejection::SeqMeanK3),
            max_k2: up(Rejection::SeqMaxK2),
            max_k3: up(Rejection::SeqMaxK3),
            is_level: self.is_level,
            is_threshold: self.is_threshold,
            is_threshold_low: self.is_threshold_low,
            clamp: self.log_ratio_clamp,
            zero_weight: self.rejection_mode == RejectionMode::ZeroWeight,
        }
    }
}

/// [`RolloutOptions`] with the `k1` bounds in log space (`None` = criterion off).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Resolved {
    token_k1: Option<(f64, f64)>,
    token_k2: Option<f64>,
    token_k3: Option<f64>,
    sum_k1: Option<(f64, f64)>,
    sum_k2: Option<f64>,
    sum_k3: Option<f64>,
    mean_k1: Option<(f64, f64)>,
    mean_k2: Option<f64>,
    mean_k3: Option<f64>,
    max_k2: Option<f64>,
    max_k3: Option<f64>,
    pub(crate) is_level: IsLevel,
    is_threshold: f64,
    is_threshold_low: f64,
    pub(crate) clamp: f64,
    /// Rejected tokens stay counted with weight 0 ([`RejectionMode::ZeroWeight`]).
    pub(crate) zero_weight: bool,
}

#[inline]
fn within((lo, hi): (f64, f64), x: f64) -> bool {
    x >= lo && x <= hi
}

#[inline]
fn below(upper: f64, x: f64) -> bool {
    x <= upper
}

/// The three divergence statistics of one token at the clamped log ratio `x^`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenDivergence {
    /// `k1 = x^` (the log ratio itself).
    pub k1: f64,
    /// `k2 = x^^2 / 2`.
    pub k2: f64,
    /// `k3 = exp(x^) - 1 - x^` (`>= 0`).
    pub k3: f64,
}

/// The clamped rollout log ratio `x^ = clamp(logp_prox - logp_rollout, -bound, bound)` and its
/// unclamped value `x`. NaN passes through.
#[inline]
pub fn rollout_log_ratio(logp_prox: f64, logp_rollout: f64, bound: f64) -> (f64, f64) {
    let x = logp_prox - logp_rollout;
    let xh = if x > bound {
        bound
    } else if x < -bound {
        -bound
    } else {
        x
    };
    (x, xh)
}

/// The divergence statistics `k1`, `k2`, `k3` at a clamped log ratio.
#[inline]
pub fn token_divergence(x_hat: f64) -> TokenDivergence {
    TokenDivergence {
        k1: x_hat,
        k2: 0.5 * x_hat * x_hat,
        k3: libm::exp(x_hat) - 1.0 - x_hat,
    }
}

/// A truncated importance weight `clamp(exp(log_w), low, high)` and whether a truncation
/// bound (NaN passes through untruncated).
#[inline]
pub fn truncated_weight(log_w: f64, low: f64, high: f64) -> (f64, bool) {
    let w = libm::exp(log_w);
    if w > high {
        (high, true)
    } else if w < low {
        (low, true)
    } else {
        (w, false)
    }
}

/// Running per-sequence sums of the rollout statistics over the counted tokens (a segmented
/// reduction: the CUDA kernel mirrors it, one sequence per block).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SequenceRollout {
    /// Counted tokens.
    pub n: f64,
    /// `sum_t x_t` (unclamped: the sequence weight clamps the sum, as verl does).
    pub sum_x: f64,
    /// `sum_t k1_t` (clamped per token: the rejection statistic).
    pub sum_k1: f64,
    /// `sum_t k2_t`.
    pub sum_k2: f64,
    /// `sum_t k3_t`.
    pub sum_k3: f64,
    /// `max_t k2_t` (0 without tokens).
    pub max_k2: f64,
    /// `max_t k3_t` (0 without tokens).
    pub max_k3: f64,
    /// Some token's statistic was NaN: `x^` itself, or `k3 = inf - 1 - inf` when the clamp is
    /// off and `x^ = +inf` (a max over NaN is NaN: the max criteria reject the sequence).
    pub nan: bool,
}

impl SequenceRollout {
    /// The empty sequence.
    pub const EMPTY: SequenceRollout = SequenceRollout {
        n: 0.0,
        sum_x: 0.0,
        sum_k1: 0.0,
        sum_k2: 0.0,
        sum_k3: 0.0,
        max_k2: 0.0,
        max_k3: 0.0,
        nan: false,
    };

    /// Adds one counted token with unclamped log ratio `x` and clamped `x_hat`.
    #[inline]
    pub fn push(&mut self, x: f64, x_hat: f64) {
        let d = token_divergence(x_hat);
        self.sum_x += x;
        self.sum_k1 += d.k1;
        self.sum_k2 += d.k2;
        self.sum_k3 += d.k3;
        if self.n == 0.0 {
            self.max_k2 = d.k2;
            self.max_k3 = d.k3;
        } else {
            self.max_k2 = if d.k2 > self.max_k2 {
                d.k2
            } else {
                self.max_k2
            };
            self.max_k3 = if d.k3 > self.max_k3 {
                d.k3
            } else {
                self.max_k3
            };
        }
        self.nan |= x_hat.is_nan() || d.k3.is_nan();
        self.n += 1.0;
    }

    /// Whether the sequence passes every enabled sequence-level criterion (a sequence without
    /// counted tokens always passes: it has nothing to reject).
    pub(crate) fn kept(&self, r: &Resolved) -> bool {
        if self.n == 0.0 {
            return true;
        }
        let n = self.n;
        let max_ok = |b: Option<f64>, m: f64| b.is_none_or(|u| !self.nan && below(u, m));
        r.sum_k1.is_none_or(|b| within(b, self.sum_k1))
            && r.sum_k2.is_none_or(|u| below(u, self.sum_k2))
            && r.sum_k3.is_none_or(|u| below(u, self.sum_k3))
            && r.mean_k1.is_none_or(|b| within(b, self.sum_k1 / n))
            && r.mean_k2.is_none_or(|u| below(u, self.sum_k2 / n))
            && r.mean_k3.is_none_or(|u| below(u, self.sum_k3 / n))
            && max_ok(r.max_k2, self.max_k2)
            && max_ok(r.max_k3, self.max_k3)
    }

    /// The sequence importance weight `min(exp(clamp(sum_x, -S, S)), C)` and whether `C` bound.
    #[inline]
    pub(crate) fn weight(&self, r: &Resolved) -> (f64, bool) {
        let (_, s) = rollout_log_ratio(self.sum_x, 0.0, r.clamp);
        truncated_weight(s, r.is_threshold_low, r.is_threshold)
    }
}

/// Whether one token passes every enabled token-level criterion.
#[inline]
pub(crate) fn token_kept(r: &Resolved, x_hat: f64) -> bool {
    let d = token_divergence(x_hat);
    r.token_k1.is_none_or(|b| within(b, d.k1))
        && r.token_k2.is_none_or(|u| below(u, d.k2))
        && r.token_k3.is_none_or(|u| below(u, d.k3))
}

/// The weight of one kept token: `(weight, truncated)`. `seq` is the sequence's
/// `(weight, truncated)` (used at [`IsLevel::Sequence`]).
#[inline]
pub(crate) fn token_weight(r: &Resolved, x_hat: f64, seq: (f64, bool)) -> (f64, bool) {
    match r.is_level {
        IsLevel::Off => (1.0, false),
        IsLevel::Token => truncated_weight(x_hat, r.is_threshold_low, r.is_threshold),
        IsLevel::Sequence => seq,
    }
}

/// Off-policy diagnostics of the rollout correction as sums, so that they add across
/// micro-batches and ranks (one `SUM` all-reduce over `f64[13]`).
///
/// Field order (C): thirteen `f64`s in declaration order. Means: `kl_sum / tokens` (verl
/// `rollout_corr/kl`), `k3_sum / tokens` (`k3_kl`), `log_ppl_diff_sum / sequences`
/// (`log_ppl_diff`), `chi2_token_sum / tokens - 1` (`chi2_token`), `chi2_seq_sum / sequences
/// - 1` (`chi2_seq`), `rejected_tokens / tokens` (`rollout_rs_masked_fraction`),
/// `rejected_sequences / sequences`, `truncated / tokens`, `weight_sum / tokens`
/// (`rollout_is_mean`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RolloutStats {
    /// Counted tokens before rejection.
    pub tokens: f64,
    /// Sequences with a counted token before rejection.
    pub sequences: f64,
    /// Counted tokens rejected (by a token- or sequence-level criterion).
    pub rejected_tokens: f64,
    /// Sequences with at least one rejected token.
    pub rejected_sequences: f64,
    /// Counted tokens whose importance weight hit the truncation `C`.
    pub truncated: f64,
    /// `sum w` over the counted tokens (before rejection; 1 per token with weights off).
    pub weight_sum: f64,
    /// `sum (logp_rollout - logp_old)`: the k1 estimate of `KL(pi_rollout || pi_old)`.
    pub kl_sum: f64,
    /// `sum (rho - log rho - 1)` (unclamped): the k3 estimate of the same KL.
    pub k3_sum: f64,
    /// `sum_i mean_t (logp_rollout - logp_old)` over sequences: the log-perplexity difference
    /// `log(ppl_old / ppl_rollout)`.
    pub log_ppl_diff_sum: f64,
    /// `sum_i |mean_t (logp_rollout - logp_old)|`.
    pub log_ppl_abs_diff_sum: f64,
    /// `sum_t rho^_t^2` (clamped ratio): `chi2_token = chi2_token_sum / tokens - 1`.
    pub chi2_token_sum: f64,
    /// `sum_i exp(2 clamp(sum_t x_t, -S, S))`: `chi2_seq = chi2_seq_sum / sequences - 1`.
    pub chi2_seq_sum: f64,
    /// Counted tokens with a non-finite `logp_old` (or `logp`) or `logp_rollout`.
    pub non_finite: f64,
}

impl RolloutStats {
    /// The field names, in declaration order: the names every surface uses (CLI members,
    /// Python's `ROLLOUT_STATS_FIELDS`), in the order of [`RolloutStats::values`].
    pub const FIELDS: [&'static str; 13] = [
        "tokens",
        "sequences",
        "rejected_tokens",
        "rejected_sequences",
        "truncated",
        "weight_sum",
        "kl_sum",
        "k3_sum",
        "log_ppl_diff_sum",
        "log_ppl_abs_diff_sum",
        "chi2_token_sum",
        "chi2_seq_sum",
        "non_finite",
    ];

    /// The values in [`RolloutStats::FIELDS`] order (destructured, so a field added to the
    /// struct fails to compile here until it is named).
    pub fn values(&self) -> [f64; 13] {
        let RolloutStats {
            tokens,
            sequences,
            rejected_tokens,
            rejected_sequences,
            truncated,
            weight_sum,
            kl_sum,
            k3_sum,
            log_ppl_diff_sum,
            log_ppl_abs_diff_sum,
            chi2_token_sum,
            chi2_seq_sum,
            non_finite,
        } = *self;
        [
            tokens,
            sequences,
            rejected_tokens,
            rejected_sequences,
            truncated,
            weight_sum,
            kl_sum,
            k3_sum,
            log_ppl_diff_sum,
            log_ppl_abs_diff_sum,
            chi2_token_sum,
            chi2_seq_sum,
            non_finite,
        ]
    }

    /// Merges the stats of another micro-batch or rank (every field is a sum).
    pub fn add(&mut self, o: &RolloutStats) {
        self.tokens += o.tokens;
        self.sequences += o.sequences;
        self.rejected_tokens += o.rejected_tokens;
        self.rejected_sequences += o.rejected_sequences;
        self.truncated += o.truncated;
        self.weight_sum += o.weight_sum;
        self.kl_sum += o.kl_sum;
        self.k3_sum += o.k3_sum;
        self.log_ppl_diff_sum += o.log_ppl_diff_sum;
        self.log_ppl_abs_diff_sum += o.log_ppl_abs_diff_sum;
        self.chi2_token_sum += o.chi2_token_sum;
        self.chi2_seq_sum += o.chi2_seq_sum;
        self.non_finite += o.non_finite;
    }

    /// Adds the per-sequence diagnostics of a sequence with counted tokens.
    pub(crate) fn add_sequence(&mut self, s: &SequenceRollout, r: &Resolved) {
        if s.n == 0.0 {
            return;
        }
        self.sequences += 1.0;
        let d = -s.sum_x / s.n;
        self.log_ppl_diff_sum += d;
        self.log_ppl_abs_diff_sum += d.abs();
        let (_, sum) = rollout_log_ratio(s.sum_x, 0.0, r.clamp);
        self.chi2_seq_sum += libm::exp(2.0 * sum);
    }

    /// Adds the per-token diagnostics of a counted token (`finite`: both log-probs are).
    #[inline]
    pub(crate) fn add_token(&mut self, tc: &TokenCorrection, finite: bool) {
        let x = tc.x;
        self.tokens += 1.0;
        self.kl_sum -= x;
        self.k3_sum += libm::exp(x) - x - 1.0;
        let rho = libm::exp(tc.x_hat);
        self.chi2_token_sum += rho * rho;
        self.weight_sum += tc.weight.0;
        self.truncated += f64::from(u8::from(tc.weight.1));
        self.non_finite += f64::from(u8::from(!finite));
        self.rejected_tokens += f64::from(u8::from(!tc.kept));
    }
}

/// Inputs of [`rollout_correction`] on the token layout of SPEC §10.
#[derive(Clone, Copy, Debug)]
pub struct RolloutInputs<'a, T: LogProb> {
    /// The proximal policy's log-probs (`logp_old`; the current `logp` when training
    /// on-policy).
    pub logp_old: &'a [T],
    /// The rollout engine's log-probs.
    pub logp_rollout: &'a [T],
    /// CSR sequence offsets, `B + 1` entries, last `= T`.
    pub seq_offsets: &'a [u32],
    /// Token mask `[T]`, non-zero = counted; `None` = all count.
    pub mask: Option<&'a [u8]>,
}

/// The statistics of one sequence `range` (its counted tokens), as [`SequenceRollout`].
pub(crate) fn sequence_rollout<T: LogProb>(
    prox: &[T],
    rollout: &[T],
    mask: Option<&[u8]>,
    range: core::ops::Range<usize>,
    clamp: f64,
) -> SequenceRollout {
    let mut s = SequenceRollout::EMPTY;
    for t in range {
        if mask.is_none_or(|m| m[t] != 0) {
            let (x, xh) = rollout_log_ratio(prox[t].to_f64(), rollout[t].to_f64(), clamp);
            s.push(x, xh);
        }
    }
    s
}

/// The sequence-level verdict of the correction: kept by every sequence criterion, and the
/// sequence weight `(weight, truncated)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct SeqCorrection {
    pub kept: bool,
    pub weight: (f64, bool),
}

/// One counted token's correction: its log ratios, whether it is kept (sequence and token
/// criteria), and its weight before rejection `(weight, truncated)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct TokenCorrection {
    pub x: f64,
    pub x_hat: f64,
    pub kept: bool,
    pub weight: (f64, bool),
}

impl TokenCorrection {
    /// The importance weight the policy-gradient term gets (`Some(0)` for a token rejected
    /// under [`RejectionMode::ZeroWeight`]), or `None` for a token that leaves the loss.
    #[inline]
    pub(crate) fn omega(&self, r: &Resolved) -> Option<f64> {
        if self.kept {
            Some(self.weight.0)
        } else if r.zero_weight {
            Some(0.0)
        } else {
            None
        }
    }
}

/// The sequence verdict of `seq` (a pass over its counted tokens, done by the caller).
#[inline]
pub(crate) fn correct_sequence(seq: &SequenceRollout, r: &Resolved) -> SeqCorrection {
    SeqCorrection {
        kept: seq.kept(r),
        weight: seq.weight(r),
    }
}

/// The correction of one counted token of a sequence with verdict `sc`.
#[inline]
pub(crate) fn correct_token(
    r: &Resolved,
    sc: &SeqCorrection,
    prox: f64,
    rollout: f64,
) -> TokenCorrection {
    let (x, x_hat) = rollout_log_ratio(prox, rollout, r.clamp);
    TokenCorrection {
        x,
        x_hat,
        kept: sc.kept && token_kept(r, x_hat),
        weight: token_weight(r, x_hat, sc.weight),
    }
}

/// The rollout correction of one micro-batch on its own: writes the importance weight
/// `weights[t]` (0 for tokens that are masked or rejected) and the mask after rejection
/// `keep[t]` (1 = still counted: a rejected token is 0 under [`RejectionMode::Drop`] and 1 under
/// [`RejectionMode::ZeroWeight`]), and returns the diagnostics. [`policy_loss`] applies the
/// same correction itself when given `logp_rollout`; this function is for trainers that apply
/// the weights in their own loss.
///
/// Errors: [`Error::InvalidArgument`] (options), [`Error::InvalidLayout`] (offsets),
/// [`Error::LengthMismatch`] (any slice of the wrong length). Checks run before any write.
///
/// [`policy_loss`]: super::policy_loss
pub fn rollout_correction<T: LogProb>(
    inputs: &RolloutInputs<'_, T>,
    opts: &RolloutOptions,
    weights: &mut [f32],
    keep: &mut [u8],
) -> Result<RolloutStats> {
    opts.validate()?;
    let n = inputs.logp_old.len();
    validate_offsets(inputs.seq_offsets, n)?;
    if inputs.logp_rollout.len() != n
        || weights.len() != n
        || keep.len() != n
        || inputs.mask.is_some_and(|m| m.len() != n)
    {
        return Err(Error::LengthMismatch);
    }
    let r = opts.resolved();
    let mut st = RolloutStats::default();
    for w in inputs.seq_offsets.windows(2) {
        let range = w[0] as usize..w[1] as usize;
        let seq = sequence_rollout(
            inputs.logp_old,
            inputs.logp_rollout,
            inputs.mask,
            range.clone(),
            r.clamp,
        );
        st.add_sequence(&seq, &r);
        let sc = correct_sequence(&seq, &r);
        let mut rejected_any = false;
        for t in range {
            if inputs.mask.is_some_and(|m| m[t] == 0) {
                (weights[t], keep[t]) = (0.0, 0);
                continue;
            }
            let (old, rol) = (inputs.logp_old[t].to_f64(), inputs.logp_rollout[t].to_f64());
            let tc = correct_token(&r, &sc, old, rol);
            st.add_token(&tc, old.is_finite() && rol.is_finite());
            rejected_any |= !tc.kept;
            keep[t] = u8::from(tc.omega(&r).is_some());
            weights[t] = super::narrow_f32(tc.omega(&r).unwrap_or(0.0));
        }
        st.rejected_sequences += f64::from(u8::from(rejected_any));
    }
    Ok(st)
}
