//! The clipped-ratio policy loss and its analytic gradient (SPEC §10).
//!
//! Per counted token `t` (mask 1), with advantage `A`, weight `w_t` from the aggregation:
//!
//! ```text
//! delta = clamp(logp - logp_old, -C, C)          C = log_ratio_clamp (20); logp_old absent: 0
//! rho   = exp(delta)                             (GSPO: exp(min(mean_t delta, seq_log_ratio_max)))
//! pg1   = -A * rho
//! pg2   = -A * clip(rho, 1 - eps_low, 1 + eps_high)
//! l     = max(pg1, pg2)                          ties: the unclipped branch pg1
//! l     = min(l, -A * c)   if c = dual_clip > 1 and A < 0
//! x     = clamp(logp_ref - logp, -Ck, Ck)        Ck = kl_input_clamp (20)
//! k     = k1: -x | abs: |x| | k2: x^2/2 | k3: clamp(exp(x) - x - 1, -Ko, Ko)    Ko = 10
//! l    += beta * k                               only when beta > 0 and logp_ref is given
//! L     = sum_t w_t * l
//! dL/dlogp_t = w_t * (-A * rho * [pg1 branch binds] * [delta not clamped]
//!                     + beta * dk/dlogp)         dk/dlogp: 1 | -sign(x) | -x | 1 - exp(x),
//!                                                0 where the KL input or output clamp binds
//! ```
//!
//! The pieces are the public pure functions [`log_ratio`], [`sequence_ratio`], [`surrogate`],
//! [`kl_term`], [`token_loss_and_grad`] and [`aggregation_weight`]; [`policy_loss`] only loops
//! over sequences and tokens: for GSPO, one pass for the mean log ratio, one for the token terms
//! (summing `w_t * dl/drho` over the sequence), and one to add the gradient through the mean. A token with
//! mask 0 contributes loss 0 and gets gradient exactly `0.0`, whatever its inputs.
//!
//! The common case (token ratio level, no KL term) runs a specialized loop over blocks of
//! tokens that performs the same operations in the same order on each value, so its gradient,
//! loss and statistics have the same bits as the general loop (a property test runs both on
//! the same inputs and compares every bit).

#[cfg(test)]
#[path = "loss_fast_path_tests.rs"]
mod fast_path_tests;

use super::layout::validate_offsets;
use super::logprob::LogProb;
use crate::{Error, Result};

/// How per-token losses are combined into `L = sum_t w_t * l_t` (SPEC §10).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Aggregation {
    /// `w = 1 / N_tok` (default; verl `token-mean`, TRL `dapo`, OpenRLHF).
    #[default]
    TokenMean = 0,
    /// `w = 1 / (n_i * N_seq)` (original GRPO, TRL `grpo`, GSPO).
    SeqMeanTokenMean = 1,
    /// `w = 1 / N_seq` (verl `seq-mean-token-sum`).
    SeqMeanTokenSum = 2,
    /// `w = 1 / (N_seq * H)` (Dr. GRPO, verl `seq-mean-token-sum-norm`).
    SeqMeanTokenSumNorm = 3,
    /// `w = 1`.
    TokenSum = 4,
}

/// The KL-to-reference estimator, with `x = logp_ref - logp` (clamped).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum KlEstimator {
    /// `k1 = -x` (verl `kl`/`k1`).
    K1 = 0,
    /// `|x|` (verl `abs`).
    Abs = 1,
    /// `x^2 / 2` (verl `mse`/`k2`).
    K2 = 2,
    /// `clamp(exp(x) - x - 1, -Ko, Ko)` (verl `low_var_kl`/`k3`, TRL; default).
    #[default]
    K3 = 3,
}

/// Whether the ratio is per token (PPO/GRPO) or per sequence (GSPO).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum RatioLevel {
    /// `rho_t = exp(delta_t)` (default).
    #[default]
    Token = 0,
    /// GSPO: `rho_i = exp(min(mean_t delta_t, seq_log_ratio_max))` over the counted tokens of
    /// sequence `i`, used for each of its tokens; the gradient flows through the mean.
    Sequence = 1,
}

/// Options of [`policy_loss`]. Plain `#[repr(C)]` data, mirrored by the C ABI and the kernels.
///
/// Field order (C): the eleven `f64` fields in declaration order (`eps_low` ... `horizon`), then
/// `aggregation: u32, ratio_level: u32, kl_estimator: u32`, then 4 bytes of tail padding
/// (104 bytes). A denominator field of `0.0` means "use this call's own count".
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossOptions {
    /// Lower clip width: `rho` is clipped below at `1 - eps_low` (0.2). Finite, `>= 0`.
    pub eps_low: f64,
    /// Upper clip width: `rho` is clipped above at `1 + eps_high` (0.2; DAPO uses 0.28).
    pub eps_high: f64,
    /// Dual-clip constant `c`: for `A < 0`, `l = min(l, -A * c)`. Off when `<= 1` (0 = off,
    /// default; the `verl` preset uses 3).
    pub dual_clip: f64,
    /// Bound on `|logp - logp_old|` before `exp` (20). `> 0`; `f64::INFINITY` turns it off.
    pub log_ratio_clamp: f64,
    /// GSPO only: upper bound on the mean log ratio before `exp` (10). Not NaN.
    pub seq_log_ratio_max: f64,
    /// KL coefficient `beta` (0 = no KL term). Finite, `>= 0`.
    pub beta: f64,
    /// Bound on `|logp_ref - logp|` before the KL estimator (20). `> 0`.
    pub kl_input_clamp: f64,
    /// Bound on the `k3` value (10). `> 0`.
    pub kl_output_clamp: f64,
    /// Global counted-token count `N_tok` (all ranks, all micro-batches); 0 = this call's.
    pub global_tokens: f64,
    /// Global count `N_seq` of sequences with a counted token; 0 = this call's.
    pub global_sequences: f64,
    /// Dr. GRPO horizon `H`; 0 = the longest sequence of this call (`seq[i+1] - seq[i]`).
    pub horizon: f64,
    /// How token losses are combined.
    pub aggregation: Aggregation,
    /// Token- or sequence-level ratio.
    pub ratio_level: RatioLevel,
    /// KL estimator used when `beta > 0` and `logp_ref` is given.
    pub kl_estimator: KlEstimator,
}

/// Named loss option sets that match an anchor trainer.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LossPreset {
    /// verl `vanilla` policy loss: eps 0.2/0.2, dual clip `c = 3`, log-ratio clamp 20,
    /// `token-mean`, KL `k3` (off: `beta = 0`, as verl's `use_kl_loss = False`).
    Verl = 0,
    /// TRL `loss_type="dapo"` (default): eps 0.2/0.2, no dual clip, token mean over the global
    /// token count, KL `k3` (off: TRL's default `beta = 0`). TRL does not clamp the log ratio;
    /// the preset keeps the clamp at 20, which agrees with TRL wherever TRL's result is finite.
    Trl = 1,
}

impl LossPreset {
    /// Every preset, in number order.
    pub const ALL: [LossPreset; 2] = [LossPreset::Verl, LossPreset::Trl];

    /// The preset's name: `verl` or `trl`.
    pub const fn name(self) -> &'static str {
        match self {
            LossPreset::Verl => "verl",
            LossPreset::Trl => "trl",
        }
    }

    /// Looks a preset up by its exact name; `None` for an unknown name.
    pub fn from_name(name: &str) -> Option<LossPreset> {
        LossPreset::ALL.into_iter().find(|p| p.name() == name)
    }
}

impl Default for LossOptions {
    /// SPEC §10 defaults: eps 0.2/0.2, no dual clip, clamps 20/10/20/10, `beta = 0`, `k3`,
    /// token ratio, token mean, local denominators.
    fn default() -> Self {
        LossOptions {
            eps_low: 0.2,
            eps_high: 0.2,
            dual_clip: 0.0,
            log_ratio_clamp: 20.0,
            seq_log_ratio_max: 10.0,
            beta: 0.0,
            kl_input_clamp: 20.0,
            kl_output_clamp: 10.0,
            global_tokens: 0.0,
            global_sequences: 0.0,
            horizon: 0.0,
            aggregation: Aggregation::TokenMean,
            ratio_level: RatioLevel::Token,
            kl_estimator: KlEstimator::K3,
        }
    }
}

impl LossOptions {
    /// The options of a preset.
    pub fn preset(preset: LossPreset) -> Self {
        let base = LossOptions::default();
        match preset {
            LossPreset::Verl => LossOptions {
                dual_clip: 3.0,
                ..base
            },
            LossPreset::Trl => base,
        }
    }

    /// Checks the numeric fields (see each field's domain).
    /// Errors: [`Error::InvalidArgument`].
    pub fn validate(&self) -> Result<()> {
        let fin_nonneg = |x: f64| x.is_finite() && x >= 0.0;
        let pos = |x: f64| x > 0.0; // false for NaN; true for +inf
        let ok = fin_nonneg(self.eps_low)
            && fin_nonneg(self.eps_high)
            && fin_nonneg(self.dual_clip)
            && pos(self.log_ratio_clamp)
            && !self.seq_log_ratio_max.is_nan()
            && fin_nonneg(self.beta)
            && pos(self.kl_input_clamp)
            && pos(self.kl_output_clamp)
            && fin_nonneg(self.global_tokens)
            && fin_nonneg(self.global_sequences)
            && fin_nonneg(self.horizon);
        if ok {
            Ok(())
        } else {
            Err(Error::InvalidArgument)
        }
    }

    fn dual_clip_on(&self) -> bool {
        self.dual_clip > 1.0
    }
}

/// Advantages for [`policy_loss`]: one per sequence (broadcast to its tokens) or one per token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Advantages<'a> {
    /// `B` values, one per sequence.
    PerSequence(&'a [f32]),
    /// `T` values, one per token.
    PerToken(&'a [f32]),
}

/// Inputs of [`policy_loss`] for one micro-batch, all on the token layout `seq_offsets`.
#[derive(Clone, Copy, Debug)]
pub struct LossInputs<'a, T: LogProb> {
    /// Current policy log-probs `logp[T]`.
    pub logp: &'a [T],
    /// Behaviour (rollout/old) log-probs `[T]`; `None` means on-policy (`delta = 0`, `rho = 1`,
    /// the gradient still flows).
    pub logp_old: Option<&'a [T]>,
    /// Reference log-probs `[T]` for the KL term; `None` disables it.
    pub logp_ref: Option<&'a [T]>,
    /// CSR sequence offsets, `B + 1` entries, last `= T` (a padded `[B, L]` tensor is
    /// `[0, L, 2L, ...]`).
    pub seq_offsets: &'a [u32],
    /// Token mask `[T]`, non-zero = the token counts; `None` = all count.
    pub mask: Option<&'a [u8]>,
    /// Per-sequence or per-token advantages.
    pub advantages: Advantages<'a>,
}

/// Statistics of one call as sums, so that they add across micro-batches and ranks.
///
/// Field order (C): fourteen `f64`s in declaration order. The first twelve combine by sum
/// (one `SUM` all-reduce over `f64[12]`), `ratio_min` by min and `ratio_max` by max; the empty
/// value ([`LossStats::EMPTY`]) has `ratio_min = +inf`, `ratio_max = -inf`. Means are
/// `sum / tokens` (for example verl's `ppo_kl = ppo_kl_sum / tokens`,
/// `clipfrac = clipped / tokens`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossStats {
    /// Counted tokens (mask 1).
    pub tokens: f64,
    /// Sequences with at least one counted token.
    pub sequences: f64,
    /// This call's part of the loss, `sum_t w_t * l_t` (sums to `L` with global denominators).
    pub loss: f64,
    /// Tokens where the clipped branch binds (`pg2 > pg1`).
    pub clipped: f64,
    /// Tokens with `rho < 1 - eps_low` and `A < 0`.
    pub clipped_low: f64,
    /// Tokens with `rho > 1 + eps_high` and `A > 0`.
    pub clipped_high: f64,
    /// Tokens where the dual clip binds (`A < 0`, `-A * c < max(pg1, pg2)`).
    pub dual_clipped: f64,
    /// `sum (logp_old - logp)` with the clamped log ratio (verl `ppo_kl`; 0 on-policy).
    pub ppo_kl_sum: f64,
    /// `sum k` of the KL estimator (unweighted, no `beta`; 0 when the KL term is off).
    pub kl_sum: f64,
    /// `sum rho` (GSPO: the sequence ratio, once per counted token).
    pub ratio_sum: f64,
    /// Counted tokens whose log ratio hit the clamp (`|logp - logp_old| > log_ratio_clamp`).
    pub log_ratio_clamped: f64,
    /// Counted tokens with at least one non-finite input that the loss reads (`logp`,
    /// `logp_old` if given, `logp_ref` if the KL term is on, the advantage). When non-zero, the
    /// loss and gradient may be non-finite.
    pub non_finite: f64,
    /// Smallest `rho` (`+inf` when no token counted).
    pub ratio_min: f64,
    /// Largest `rho` (`-inf` when no token counted).
    pub ratio_max: f64,
}

impl LossStats {
    /// The identity of [`LossStats::add`]: zero sums, `ratio_min = +inf`, `ratio_max = -inf`.
    pub const EMPTY: LossStats = LossStats {
        tokens: 0.0,
        sequences: 0.0,
        loss: 0.0,
        clipped: 0.0,
        clipped_low: 0.0,
        clipped_high: 0.0,
        dual_clipped: 0.0,
        ppo_kl_sum: 0.0,
        kl_sum: 0.0,
        ratio_sum: 0.0,
        log_ratio_clamped: 0.0,
        non_finite: 0.0,
        ratio_min: f64::INFINITY,
        ratio_max: f64::NEG_INFINITY,
    };

    /// Merges the stats of another micro-batch or rank: sums add, min/max combine by min/max.
    pub fn add(&mut self, o: &LossStats) {
        self.tokens += o.tokens;
        self.sequences += o.sequences;
        self.loss += o.loss;
        self.clipped += o.clipped;
        self.clipped_low += o.clipped_low;
        self.clipped_high += o.clipped_high;
        self.dual_clipped += o.dual_clipped;
        self.ppo_kl_sum += o.ppo_kl_sum;
        self.kl_sum += o.kl_sum;
        self.ratio_sum += o.ratio_sum;
        self.log_ratio_clamped += o.log_ratio_clamped;
        self.non_finite += o.non_finite;
        self.ratio_min = self.ratio_min.min(o.ratio_min);
        self.ratio_max = self.ratio_max.max(o.ratio_max);
    }
}

impl Default for LossStats {
    fn default() -> Self {
        LossStats::EMPTY
    }
}

/// Result of [`policy_loss`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossOutput {
    /// `L = sum_t w_t * l_t` over this call's counted tokens (equal to `stats.loss`).
    pub loss: f64,
    /// Statistics as sums.
    pub stats: LossStats,
}

/// The clipped surrogate of one token at ratio `rho`: the loss and its derivative in `rho`.
#[derive(Clone, Copy, Debug, PartialEq)]
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
/// and `opts.beta > 0`. Sequence-level (GSPO) terms are assembled by [`policy_loss`] from
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
    }
}

#[inline]
fn counted(mask: Option<&[u8]>, t: usize) -> bool {
    mask.is_none_or(|m| m[t] != 0)
}

#[inline]
fn finite_or_absent(x: Option<f64>) -> bool {
    x.is_none_or(f64::is_finite)
}

/// The number of counted tokens in `range` (all of them without a mask).
#[inline]
fn counted_in(mask: Option<&[u8]>, range: core::ops::Range<usize>) -> usize {
    // Byte-wide partial counts (at most 255 per chunk) vectorize well.
    let chunk = |c: &[u8]| usize::from(c.iter().fold(0u8, |n, &x| n + u8::from(x != 0)));
    match mask {
        Some(m) => m[range].chunks(255).map(chunk).sum(),
        None => range.len(),
    }
}

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
/// token-level loop of [`policy_loss`]. A block goes through five passes, so that no loop
/// that carries a running `f64` value calls `exp`, and most loops vectorize: (0)
/// [`Block::load`] widens the inputs, (1) [`Block::log_ratios`] computes `delta` and the
/// non-finite and clamp counts, (2) `rho = exp(delta)`, (3) the surrogate, the gradient, the
/// loss term `w * l` and the other counts, element-wise, and (4) the `f64` sums in token
/// order ((2) to (4): [`Block::ratios_and_terms`]). The operations per token are those of
/// [`token_loss_and_grad`] with `logp_ref = None`, so every result has the bits of the
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
            let narrow = super::narrow_f32(wt * d);
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

/// [`policy_loss`] at the token ratio level without the KL term (the common case), after the
/// checks and with the denominators `[N_tok, N_seq, H]`, in blocks of tokens (see [`Block`]).
/// Leaves `tokens` and `sequences` of the result at 0. Bit-identical to the general loop.
fn token_level_no_kl<T: LogProb>(
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
fn policy_loss_with<T: LogProb>(
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
            grad[t] = super::narrow_f32(wt * tt.grad);
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
                grad[t] = super::narrow_f32(g);
            }
        }
    }
    Ok(LossOutput {
        loss: st.loss,
        stats: st,
    })
}
