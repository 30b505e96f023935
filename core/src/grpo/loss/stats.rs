//! The statistics of the policy loss (sums that add across micro-batches and ranks).

use crate::grpo::rollout::RolloutStats;

/// Statistics of one call as sums, so that they add across micro-batches and ranks.
///
/// Field order (C): fourteen `f64`s in declaration order. The first twelve combine by sum
/// (one `SUM` all-reduce over `f64[12]`), `ratio_min` by min and `ratio_max` by max; the empty
/// value ([`LossStats::EMPTY`]) has `ratio_min = +inf`, `ratio_max = -inf`. Means are
/// `sum / tokens` (for example verl's `ppo_kl = ppo_kl_sum / tokens`,
/// `clipfrac = clipped / tokens`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct LossStats {
    /// Counted tokens (mask 1).
    #[cfg_attr(feature = "serde", serde(with = "crate::serde_impls::float"))]
    pub tokens: f64,
    /// Sequences with at least one counted token.
    #[cfg_attr(feature = "serde", serde(with = "crate::serde_impls::float"))]
    pub sequences: f64,
    /// This call's part of the loss, `sum_t w_t * l_t` (sums to `L` with global denominators).
    #[cfg_attr(feature = "serde", serde(with = "crate::serde_impls::float"))]
    pub loss: f64,
    /// Tokens where the clipped branch binds (`pg2 > pg1`).
    #[cfg_attr(feature = "serde", serde(with = "crate::serde_impls::float"))]
    pub clipped: f64,
    /// Tokens with `rho < 1 - eps_low` and `A < 0`.
    #[cfg_attr(feature = "serde", serde(with = "crate::serde_impls::float"))]
    pub clipped_low: f64,
    /// Tokens with `rho > 1 + eps_high` and `A > 0`.
    #[cfg_attr(feature = "serde", serde(with = "crate::serde_impls::float"))]
    pub clipped_high: f64,
    /// Tokens where the dual clip binds (`A < 0`, `-A * c < max(pg1, pg2)`).
    #[cfg_attr(feature = "serde", serde(with = "crate::serde_impls::float"))]
    pub dual_clipped: f64,
    /// `sum (logp_old - logp)` with the clamped log ratio (verl `ppo_kl`; 0 on-policy).
    #[cfg_attr(feature = "serde", serde(with = "crate::serde_impls::float"))]
    pub ppo_kl_sum: f64,
    /// `sum k` of the KL estimator (unweighted, no `beta`; 0 when the KL term is off).
    #[cfg_attr(feature = "serde", serde(with = "crate::serde_impls::float"))]
    pub kl_sum: f64,
    /// `sum rho` (GSPO: the sequence ratio, once per counted token).
    #[cfg_attr(feature = "serde", serde(with = "crate::serde_impls::float"))]
    pub ratio_sum: f64,
    /// Counted tokens whose log ratio hit the clamp (`|logp - logp_old| > log_ratio_clamp`).
    #[cfg_attr(feature = "serde", serde(with = "crate::serde_impls::float"))]
    pub log_ratio_clamped: f64,
    /// Counted tokens with at least one non-finite input that the loss reads (`logp`,
    /// `logp_old` if given, `logp_ref` if the KL term is on, the advantage; with the rollout
    /// correction active, `logp_rollout`, and the log-probs of tokens it drops, which its
    /// sequence weight and criteria read). When non-zero, the loss and gradient may be
    /// non-finite.
    #[cfg_attr(feature = "serde", serde(with = "crate::serde_impls::float"))]
    pub non_finite: f64,
    /// Smallest `rho` (`+inf` when no token counted).
    #[cfg_attr(feature = "serde", serde(with = "crate::serde_impls::float"))]
    pub ratio_min: f64,
    /// Largest `rho` (`-inf` when no token counted).
    #[cfg_attr(feature = "serde", serde(with = "crate::serde_impls::float"))]
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

/// Result of [`policy_loss`](super::policy_loss).
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct LossOutput {
    /// `L = sum_t w_t * l_t` over this call's counted tokens (equal to `stats.loss`).
    pub loss: f64,
    /// Statistics as sums.
    pub stats: LossStats,
    /// The rollout correction's diagnostics (all zero without `logp_rollout`).
    pub rollout: RolloutStats,
    /// Tokens the covariance selection of Clip-Cov or KL-Cov chose (0 for the other losses);
    /// a sum, like the statistics.
    pub cov_selected: f64,
}
