//! The options of the policy loss, their enums and presets.

use crate::error::{InvalidOption, domain};
use crate::grpo::family::PolicyLoss;
use crate::grpo::rollout::RolloutOptions;
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
    /// `w = 1 / H`: every sequence's token sum over the horizon, summed (verl's
    /// `seq-mean-token-sum-norm` up to early 2026, which has no sequence mean).
    TokenSumNorm = 5,
}

named_enum!(Aggregation, "aggregation", {
    TokenMean => "token_mean", "Mean over all counted tokens";
    SeqMeanTokenMean => "seq_mean_token_mean", "Mean over sequences of the per-sequence token mean";
    SeqMeanTokenSum => "seq_mean_token_sum", "Mean over sequences of the per-sequence token sum";
    SeqMeanTokenSumNorm => "seq_mean_token_sum_norm", "Token sum per sequence over N_seq * horizon (Dr. GRPO)";
    TokenSum => "token_sum", "Plain sum";
    TokenSumNorm => "token_sum_norm", "Token sum over the horizon, no sequence mean (verl <= 2025)";
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
    /// GSPO-token: the value of the sequence ratio with the gradient of the token's own log-prob,
    /// `s_i,t = sg(rho_i) * exp(logp_t - sg(logp_t))`, so per-token advantages keep their own
    /// gradient (verl `gspo`). Equal to [`RatioLevel::Sequence`] when the advantage is constant
    /// within a sequence.
    SequenceToken = 2,
}

named_enum!(RatioLevel, "ratio level", {
    Token => "token", "Per-token ratio (PPO/GRPO)";
    Sequence => "sequence", "Per-sequence ratio (GSPO)";
    SequenceToken => "sequence_token", "Sequence ratio value, token gradient (GSPO-token, verl gspo)";
});

/// Which sequences the local sequence count `N_seq` counts when `global_sequences` is 0.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum SequenceCount {
    /// Sequences with at least one counted token (default; verl, OpenRLHF).
    #[default]
    NonEmpty = 0,
    /// Every sequence of the call, fully masked ones included (TRL `grpo`/`dr_grpo`/`sapo`,
    /// verl `geo_mean`).
    All = 1,
}

named_enum!(SequenceCount, "sequence count", {
    NonEmpty => "non_empty", "Sequences with a counted token (verl, OpenRLHF)";
    All => "all", "Every sequence, fully masked ones included (TRL)";
});

/// Where the old log-probs of the ratio come from (verl's `bypass_mode`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Bypass {
    /// `logp_old` as given (absent: on-policy, ratio 1); the rollout correction's importance
    /// weights multiply the policy-gradient term (default; verl's decoupled mode).
    #[default]
    Off = 0,
    /// verl `bypass_mode` with `loss_type = ppo_clip`: no `logp_old` is given and
    /// `logp_rollout` stands in for it, so the ratio is `pi / pi_rollout`; the rollout
    /// correction compares `logp` (as constants) with `logp_rollout`, its rejections apply and
    /// its importance weights are reported but not applied (the ratio already is the importance
    /// ratio). verl's `loss_type = reinforce` needs no switch: it is [`PolicyLoss::Gpg`] without
    /// `logp_old`.
    On = 1,
}

named_enum!(Bypass, "bypass mode", {
    Off => "off", "logp_old as given; importance weights applied (verl decoupled mode)";
    On => "on", "logp_rollout is the old policy; weights reported only (verl bypass ppo_clip)";
});

/// Options of [`policy_loss`](super::policy_loss). Plain `#[repr(C)]` data, mirrored by the C ABI and the kernels.
///
/// Field order (C): the eleven `f64` fields in declaration order (`eps_low` ... `horizon`), then
/// `aggregation: u32, ratio_level: u32, kl_estimator: u32, policy_loss: u32`, the six `f64`
/// fields `sapo_tau_pos` ... `kl_cov_coef`, `rollout` (208 bytes), `sequence_count: u32`,
/// `bypass: u32`, `gmpo_weight_floor: f64` and the four `f64` VESPO fields (408 bytes; the
/// first 100 bytes are those of the 2025 layout). A denominator field of `0.0` means "use this
/// call's own count".
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
    /// The policy-gradient term (SPEC §17); the ratio levels other than
    /// `token` need [`PolicyLoss::Clip`].
    pub policy_loss: PolicyLoss,
    /// SAPO gate temperature for `A > 0` (1.0). Finite, `> 0`.
    pub sapo_tau_pos: f64,
    /// SAPO gate temperature for `A <= 0` (1.05). Finite, `> 0`.
    pub sapo_tau_neg: f64,
    /// Clip-Cov / KL-Cov: the share of counted tokens selected, `k = max(1, floor(ratio * N))`
    /// (`2e-4`). Finite, `> 0`.
    pub cov_ratio: f64,
    /// Clip-Cov: candidates have a covariance strictly above this (1.0). Finite.
    pub clip_cov_lb: f64,
    /// Clip-Cov: candidates have a covariance strictly below this (5.0). Finite, `>= lb`.
    pub clip_cov_ub: f64,
    /// KL-Cov: the coefficient of `|delta|` on selected tokens (1.0, the fallback of verl's
    /// `compute_policy_loss_kl_cov`; verl's configuration default is 0.1, the `verl_kl_cov`
    /// preset). Finite, `>= 0`.
    pub kl_cov_coef: f64,
    /// Rollout correction, applied when `logp_rollout` is given (off by default).
    pub rollout: RolloutOptions,
    /// What the local `N_seq` counts.
    pub sequence_count: SequenceCount,
    /// Where the ratio's old log-probs come from ([`Bypass::On`]: `logp_rollout`, verl's bypass
    /// mode; needs `logp_rollout` and no `logp_old`).
    #[cfg_attr(feature = "serde", serde(default))]
    pub bypass: Bypass,
    /// GMPO with rollout weights: the sequence weight is `exp(mean_t ln(omega_t + floor))`
    /// (0, the exact geometric mean, by default; verl adds `1e-10`, the `verl_geo_mean`
    /// preset). Finite, `>= 0`.
    #[cfg_attr(feature = "serde", serde(default))]
    pub gmpo_weight_floor: f64,
    /// VESPO: the power `k` of the Gamma weight for `A >= 0` (2, TRL's). Finite, `>= 0`.
    #[cfg_attr(feature = "serde", serde(default = "vespo_k_pos"))]
    pub vespo_k_pos: f64,
    /// VESPO: the decay `lambda` for `A >= 0` (3). Finite, `> 0`.
    #[cfg_attr(feature = "serde", serde(default = "vespo_lambda_pos"))]
    pub vespo_lambda_pos: f64,
    /// VESPO: `k` for `A < 0` (3). Finite, `>= 0`.
    #[cfg_attr(feature = "serde", serde(default = "vespo_k_neg"))]
    pub vespo_k_neg: f64,
    /// VESPO: `lambda` for `A < 0` (2). Finite, `> 0`.
    #[cfg_attr(feature = "serde", serde(default = "vespo_lambda_neg"))]
    pub vespo_lambda_neg: f64,
}

#[cfg(feature = "serde")]
fn vespo_k_pos() -> f64 {
    2.0
}
#[cfg(feature = "serde")]
fn vespo_lambda_pos() -> f64 {
    3.0
}
#[cfg(feature = "serde")]
fn vespo_k_neg() -> f64 {
    3.0
}
#[cfg(feature = "serde")]
fn vespo_lambda_neg() -> f64 {
    2.0
}

/// Named loss option sets that reproduce a peer's configuration on ordinary inputs (log ratios
/// inside the clamps; see GRPO.md for every remaining difference). Each keeps the safety clamps;
/// [`LossOptions::without_clamps`] turns them off for a bit-for-bit match on extreme inputs.
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
    /// verl `vanilla` with `seq-mean-token-mean`.
    VerlSeqMeanTokenMean = 2,
    /// verl `vanilla` with `seq-mean-token-sum`.
    VerlSeqMeanTokenSum = 3,
    /// verl `vanilla` with `seq-mean-token-sum-norm` as verl computed it until 2026: every
    /// sequence's token sum over the horizon (the padded length), with no sequence mean
    /// ([`Aggregation::TokenSumNorm`]). verl since 2026 divides by the sequence count too:
    /// `verl` with [`Aggregation::SeqMeanTokenSumNorm`].
    VerlSeqMeanTokenSumNorm = 4,
    /// verl `gspo`: the GSPO-token ratio ([`RatioLevel::SequenceToken`]), mean log ratio capped
    /// at 10, `seq-mean-token-mean` (verl forces it), no dual clip.
    VerlGspo = 5,
    /// verl `sapo`: `tau_pos = 1`, `tau_neg = 1.05`, `seq-mean-token-mean` (verl forces it).
    VerlSapo = 6,
    /// verl `cispo`: the weight clipped to `[1 - 0.2, 1 + 0.2]`, `token-mean`.
    VerlCispo = 7,
    /// verl `gpg`: `-A * logp`, `token-mean`.
    VerlGpg = 8,
    /// verl `clip_cov`: ratio `2e-4`, window `(1, 5)`, `token-mean`, no dual clip; the `k`
    /// candidates with the largest covariance (verl samples them at random).
    VerlClipCov = 9,
    /// verl `kl_cov`: ratio `2e-4`, coefficient 0.1 (verl's `ppo_kl_coef` default),
    /// `token-mean`.
    VerlKlCov = 10,
    /// verl `geo_mean` (GMPO): the log ratio clipped to `[-0.2, 0.2]`, the mean over every
    /// row of the micro-batch (`torch.mean`: [`SequenceCount::All`]), the rollout weights'
    /// geometric mean taken of `omega + 1e-10`.
    VerlGeoMean = 11,
    /// TRL `grpo`: `seq_mean_token_mean` over every row, fully masked ones included.
    TrlGrpo = 12,
    /// TRL `bnpo`: the token mean over the micro-batch's own tokens (the options of `trl`;
    /// TRL divides by the gradient-accumulation steps as well).
    TrlBnpo = 13,
    /// TRL `dr_grpo`: the token sum over `rows * max_completion_length` (pass
    /// `max_completion_length` as `horizon`; every row counts).
    TrlDrGrpo = 14,
    /// TRL `dapo` (its default): the options of `trl`.
    TrlDapo = 15,
    /// TRL `cispo` with `epsilon_high = 5` (its documented recommendation): the weight capped at
    /// 5 with no lower bound, the global token mean.
    TrlCispo = 16,
    /// TRL `sapo`: `tau_pos = 1`, `tau_neg = 1.05`, the `grpo` normalization (every row).
    TrlSapo = 17,
    /// OpenRLHF `PolicyLoss` `ppo` with `token_level_loss` (default): eps 0.2/0.2, clamp 20,
    /// the token mean, no dual clip (its default `dual_clip = None`).
    OpenRlhf = 18,
    /// OpenRLHF `ppo` with `token_level_loss = False`: `seq_mean_token_mean`.
    OpenRlhfSeq = 19,
    /// OpenRLHF `gspo`: the sequence ratio with the gradient through the mean
    /// ([`RatioLevel::Sequence`]), `seq_mean_token_mean`.
    OpenRlhfGspo = 20,
    /// verl `bypass_mode` with its default `loss_type = ppo_clip`: `verl` with
    /// [`Bypass::On`] (pass `logp_rollout`, not `logp_old`).
    VerlBypass = 21,
    /// TRL `luspo` (with the `importance_sampling_level="sequence"` it requires): the
    /// sequence ratio through the mean, each sequence's loss times its length, the mean over
    /// every row (`seq_mean_token_sum` with [`SequenceCount::All`]).
    TrlLuspo = 22,
    /// TRL `vespo`: [`PolicyLoss::Vespo`] with `k = 2 / 3`, `lambda = 3 / 2` (`A >= 0` / `< 0`),
    /// the global token mean.
    TrlVespo = 23,
}

named_enum!(LossPreset, "loss preset", {
    Verl => "verl", "verl vanilla: dual clip c = 3, token-mean";
    Trl => "trl", "TRL (dapo): the defaults";
    VerlSeqMeanTokenMean => "verl_seq_mean_token_mean", "verl vanilla, seq-mean-token-mean";
    VerlSeqMeanTokenSum => "verl_seq_mean_token_sum", "verl vanilla, seq-mean-token-sum";
    VerlSeqMeanTokenSumNorm => "verl_seq_mean_token_sum_norm", "verl vanilla, token sum over the horizon";
    VerlGspo => "verl_gspo", "verl gspo: GSPO-token ratio, seq-mean-token-mean";
    VerlSapo => "verl_sapo", "verl sapo: tau 1 / 1.05, seq-mean-token-mean";
    VerlCispo => "verl_cispo", "verl cispo: weight clipped to [0.8, 1.2], token-mean";
    VerlGpg => "verl_gpg", "verl gpg: -A * logp, token-mean";
    VerlClipCov => "verl_clip_cov", "verl clip_cov: ratio 2e-4, window (1, 5)";
    VerlKlCov => "verl_kl_cov", "verl kl_cov: ratio 2e-4, coefficient 0.1";
    VerlGeoMean => "verl_geo_mean", "verl geo_mean (GMPO): log clip 0.2, mean over rows";
    TrlGrpo => "trl_grpo", "TRL grpo: seq-mean-token-mean over every row";
    TrlBnpo => "trl_bnpo", "TRL bnpo: local token mean";
    TrlDrGrpo => "trl_dr_grpo", "TRL dr_grpo: token sum over rows * horizon";
    TrlDapo => "trl_dapo", "TRL dapo: global token mean";
    TrlCispo => "trl_cispo", "TRL cispo: weight capped at 5, global token mean";
    TrlSapo => "trl_sapo", "TRL sapo: tau 1 / 1.05, grpo normalization";
    OpenRlhf => "openrlhf", "OpenRLHF ppo: token-level loss";
    OpenRlhfSeq => "openrlhf_seq", "OpenRLHF ppo with token_level_loss = False";
    OpenRlhfGspo => "openrlhf_gspo", "OpenRLHF gspo: sequence ratio through the mean";
    VerlBypass => "verl_bypass", "verl bypass_mode ppo_clip: logp_rollout is the old policy";
    TrlLuspo => "trl_luspo", "TRL luspo: sequence ratio, length-weighted sequence losses";
    TrlVespo => "trl_vespo", "TRL vespo: Gamma weight of the sequence ratio on A * logp";
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
            policy_loss: PolicyLoss::Clip,
            sapo_tau_pos: 1.0,
            sapo_tau_neg: 1.05,
            cov_ratio: 2e-4,
            clip_cov_lb: 1.0,
            clip_cov_ub: 5.0,
            kl_cov_coef: 1.0,
            rollout: RolloutOptions::DEFAULT,
            sequence_count: SequenceCount::NonEmpty,
            bypass: Bypass::Off,
            gmpo_weight_floor: 0.0,
            vespo_k_pos: 2.0,
            vespo_lambda_pos: 3.0,
            vespo_k_neg: 3.0,
            vespo_lambda_neg: 2.0,
        }
    }
}

impl LossOptions {
    /// The options of a preset.
    pub fn preset(preset: LossPreset) -> Self {
        use Aggregation::*;
        use LossPreset as P;
        let base = LossOptions::default();
        let verl = LossOptions {
            dual_clip: 3.0,
            ..base
        };
        let all_rows = SequenceCount::All;
        match preset {
            P::Verl => verl,
            P::Trl | P::TrlBnpo | P::TrlDapo | P::OpenRlhf => base,
            P::VerlSeqMeanTokenMean => LossOptions {
                aggregation: SeqMeanTokenMean,
                ..verl
            },
            P::VerlSeqMeanTokenSum => LossOptions {
                aggregation: SeqMeanTokenSum,
                ..verl
            },
            P::VerlSeqMeanTokenSumNorm => LossOptions {
                aggregation: TokenSumNorm,
                ..verl
            },
            P::VerlGspo => LossOptions {
                ratio_level: RatioLevel::SequenceToken,
                aggregation: SeqMeanTokenMean,
                ..base
            },
            P::VerlSapo => LossOptions {
                policy_loss: PolicyLoss::Sapo,
                aggregation: SeqMeanTokenMean,
                ..base
            },
            P::VerlCispo => LossOptions {
                policy_loss: PolicyLoss::Cispo,
                ..base
            },
            P::VerlGpg => LossOptions {
                policy_loss: PolicyLoss::Gpg,
                ..base
            },
            P::VerlClipCov => LossOptions {
                policy_loss: PolicyLoss::ClipCov,
                ..base
            },
            P::VerlKlCov => LossOptions {
                policy_loss: PolicyLoss::KlCov,
                kl_cov_coef: 0.1,
                ..base
            },
            P::VerlGeoMean => LossOptions {
                policy_loss: PolicyLoss::Gmpo,
                aggregation: SeqMeanTokenMean,
                sequence_count: all_rows,
                gmpo_weight_floor: 1e-10,
                ..base
            },
            P::VerlBypass => LossOptions {
                bypass: Bypass::On,
                ..verl
            },
            P::TrlLuspo => LossOptions {
                ratio_level: RatioLevel::Sequence,
                aggregation: SeqMeanTokenSum,
                sequence_count: all_rows,
                ..base
            },
            P::TrlVespo => LossOptions {
                policy_loss: PolicyLoss::Vespo,
                ..base
            },
            P::TrlGrpo => LossOptions {
                aggregation: SeqMeanTokenMean,
                sequence_count: all_rows,
                ..base
            },
            P::TrlDrGrpo => LossOptions {
                aggregation: SeqMeanTokenSumNorm,
                sequence_count: all_rows,
                ..base
            },
            P::TrlCispo => LossOptions {
                policy_loss: PolicyLoss::Cispo,
                eps_low: 1.0,
                eps_high: 4.0,
                ..base
            },
            P::TrlSapo => LossOptions {
                policy_loss: PolicyLoss::Sapo,
                aggregation: SeqMeanTokenMean,
                sequence_count: all_rows,
                ..base
            },
            P::OpenRlhfSeq => LossOptions {
                aggregation: SeqMeanTokenMean,
                ..base
            },
            P::OpenRlhfGspo => LossOptions {
                ratio_level: RatioLevel::Sequence,
                aggregation: SeqMeanTokenMean,
                ..base
            },
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
        InvalidOption::require(fin(self.horizon), "horizon", FINITE_NON_NEGATIVE)?;
        use domain::{FINITE, FINITE_POSITIVE, finite_positive as fpos};
        InvalidOption::require(fpos(self.sapo_tau_pos), "sapo_tau_pos", FINITE_POSITIVE)?;
        InvalidOption::require(fpos(self.sapo_tau_neg), "sapo_tau_neg", FINITE_POSITIVE)?;
        InvalidOption::require(fpos(self.cov_ratio), "cov_ratio", FINITE_POSITIVE)?;
        InvalidOption::require(self.clip_cov_lb.is_finite(), "clip_cov_lb", FINITE)?;
        InvalidOption::require(
            self.clip_cov_ub.is_finite() && self.clip_cov_ub >= self.clip_cov_lb,
            "clip_cov_ub",
            "finite and >= clip_cov_lb",
        )?;
        InvalidOption::require(fin(self.kl_cov_coef), "kl_cov_coef", FINITE_NON_NEGATIVE)?;
        InvalidOption::require(
            fin(self.gmpo_weight_floor),
            "gmpo_weight_floor",
            FINITE_NON_NEGATIVE,
        )?;
        InvalidOption::require(fin(self.vespo_k_pos), "vespo_k_pos", FINITE_NON_NEGATIVE)?;
        InvalidOption::require(fin(self.vespo_k_neg), "vespo_k_neg", FINITE_NON_NEGATIVE)?;
        InvalidOption::require(
            fpos(self.vespo_lambda_pos),
            "vespo_lambda_pos",
            FINITE_POSITIVE,
        )?;
        InvalidOption::require(
            fpos(self.vespo_lambda_neg),
            "vespo_lambda_neg",
            FINITE_POSITIVE,
        )?;
        InvalidOption::require(
            self.policy_loss != PolicyLoss::Vespo
                || self.rollout.is_level != crate::grpo::IsLevel::Sequence,
            "rollout.is_level",
            "token or off under VESPO (its weights fold into the sequence ratio per token)",
        )?;
        InvalidOption::require(
            self.ratio_level == RatioLevel::Token || self.policy_loss == PolicyLoss::Clip,
            "ratio_level",
            "token unless the policy loss is clip",
        )?;
        self.rollout.check()
    }

    /// The options with every safety clamp off (log ratio, GSPO mean, KL input, `k3` output,
    /// rollout log ratio), so that a peer without them is reproduced bit for bit on extreme
    /// inputs (TRL, Liger and the peers' GSPO clamp nothing).
    pub fn without_clamps(self) -> Self {
        LossOptions {
            log_ratio_clamp: f64::INFINITY,
            seq_log_ratio_max: f64::INFINITY,
            kl_input_clamp: f64::INFINITY,
            kl_output_clamp: f64::INFINITY,
            rollout: RolloutOptions {
                log_ratio_clamp: f64::INFINITY,
                ..self.rollout
            },
            ..self
        }
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
