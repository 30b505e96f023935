//! The options of the policy loss, their enums and presets.

use crate::error::{InvalidOption, domain};
use crate::names::named_enum;
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

named_enum!(Aggregation, "aggregation", {
    TokenMean => "token_mean", "Mean over all counted tokens";
    SeqMeanTokenMean => "seq_mean_token_mean", "Mean over sequences of the per-sequence token mean";
    SeqMeanTokenSum => "seq_mean_token_sum", "Mean over sequences of the per-sequence token sum";
    SeqMeanTokenSumNorm => "seq_mean_token_sum_norm", "Token sum per sequence over N_seq * horizon (Dr. GRPO)";
    TokenSum => "token_sum", "Plain sum";
});

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

named_enum!(KlEstimator, "KL estimator", {
    K1 => "k1", "k1 = -x";
    Abs => "abs", "|x|";
    K2 => "k2", "x^2 / 2";
    K3 => "k3", "exp(x) - x - 1, clamped";
});

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

named_enum!(RatioLevel, "ratio level", {
    Token => "token", "Per-token ratio (PPO/GRPO)";
    Sequence => "sequence", "Per-sequence ratio (GSPO)";
});

/// Options of [`policy_loss`](super::policy_loss). Plain `#[repr(C)]` data, mirrored by the C ABI and the kernels.
///
/// Field order (C): the eleven `f64` fields in declaration order (`eps_low` ... `horizon`), then
/// `aggregation: u32, ratio_level: u32, kl_estimator: u32`, then 4 bytes of tail padding
/// (104 bytes). A denominator field of `0.0` means "use this call's own count".
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(deny_unknown_fields)
)]
pub struct LossOptions {
    /// Lower clip width: `rho` is clipped below at `1 - eps_low` (0.2). Finite, `>= 0`.
    pub eps_low: f64,
    /// Upper clip width: `rho` is clipped above at `1 + eps_high` (0.2; DAPO uses 0.28).
    pub eps_high: f64,
    /// Dual-clip constant `c`: for `A < 0`, `l = min(l, -A * c)`. Off when `<= 1` (0 = off,
    /// default; the `verl` preset uses 3).
    pub dual_clip: f64,
    /// Bound on `|logp - logp_old|` before `exp` (20). `> 0`; `f64::INFINITY` turns it off.
    #[cfg_attr(feature = "serde", serde(with = "crate::serde_impls::float"))]
    pub log_ratio_clamp: f64,
    /// GSPO only: upper bound on the mean log ratio before `exp` (10). Not NaN.
    #[cfg_attr(feature = "serde", serde(with = "crate::serde_impls::float"))]
    pub seq_log_ratio_max: f64,
    /// KL coefficient `beta` (0 = no KL term). Finite, `>= 0`.
    pub beta: f64,
    /// Bound on `|logp_ref - logp|` before the KL estimator (20). `> 0`.
    #[cfg_attr(feature = "serde", serde(with = "crate::serde_impls::float"))]
    pub kl_input_clamp: f64,
    /// Bound on the `k3` value (10). `> 0`.
    #[cfg_attr(feature = "serde", serde(with = "crate::serde_impls::float"))]
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

named_enum!(LossPreset, "loss preset", {
    Verl => "verl", "verl: dual clip c = 3";
    Trl => "trl", "TRL (dapo): the defaults";
});

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

    /// Checks every field against the domain its documentation gives.
    ///
    /// # Errors
    /// The first field outside its domain.
    pub fn check(&self) -> core::result::Result<(), InvalidOption> {
        use domain::{FINITE_NON_NEGATIVE, NOT_NAN, POSITIVE, finite_non_negative as fin};
        let pos = |x: f64| x > 0.0; // false for NaN; true for +inf
        InvalidOption::require(fin(self.eps_low), "eps_low", FINITE_NON_NEGATIVE)?;
        InvalidOption::require(fin(self.eps_high), "eps_high", FINITE_NON_NEGATIVE)?;
        InvalidOption::require(fin(self.dual_clip), "dual_clip", FINITE_NON_NEGATIVE)?;
        InvalidOption::require(pos(self.log_ratio_clamp), "log_ratio_clamp", POSITIVE)?;
        InvalidOption::require(
            !self.seq_log_ratio_max.is_nan(),
            "seq_log_ratio_max",
            NOT_NAN,
        )?;
        InvalidOption::require(fin(self.beta), "beta", FINITE_NON_NEGATIVE)?;
        InvalidOption::require(pos(self.kl_input_clamp), "kl_input_clamp", POSITIVE)?;
        InvalidOption::require(pos(self.kl_output_clamp), "kl_output_clamp", POSITIVE)?;
        InvalidOption::require(
            fin(self.global_tokens),
            "global_tokens",
            FINITE_NON_NEGATIVE,
        )?;
        InvalidOption::require(
            fin(self.global_sequences),
            "global_sequences",
            FINITE_NON_NEGATIVE,
        )?;
        InvalidOption::require(fin(self.horizon), "horizon", FINITE_NON_NEGATIVE)
    }

    /// [`LossOptions::check`] as an [`Error`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when a field is outside its domain.
    pub fn validate(&self) -> Result<()> {
        self.check().map_err(Error::from)
    }

    pub(super) fn dual_clip_on(&self) -> bool {
        self.dual_clip > 1.0
    }
}
