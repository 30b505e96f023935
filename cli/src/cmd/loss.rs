//! `care loss`: the policy loss of one micro-batch per line (SPEC §10 and the policy-loss
//! family of SPEC §17), with the rollout correction (SPEC §16) when the line has rollout
//! log-probs.

use crate::input::{
    Line, check_layout, f32_array, mask_array, object, optional, required, same_length, u32_array,
    values,
};
use crate::json::{LineError, Obj};
use care_core::grpo::{
    Advantages, Bypass, GroupLayout, LossInputs, LossOptions, LossStats, RolloutStats, policy_loss,
};

/// Resolved options: the core's [`LossOptions`].
pub type Options = LossOptions;

/// The members of an input line (besides `id` and `meta`).
pub const MEMBERS: &[&str] = &[
    "logp",
    "logp_old",
    "logp_ref",
    "logp_rollout",
    "seq_offsets",
    "mask",
    "advantages",
];

/// Reads `{"logp", "logp_old"?, "logp_ref"?, "logp_rollout"?, "seq_offsets", "mask"?,
/// "advantages"}` and writes `loss`, `grad` and `stats`; `rollout` (the diagnostics) when
/// `logp_rollout` is given; `cov_selected` for Clip-Cov and KL-Cov.
pub fn run(opts: &Options, line: &Line<'_>, o: &mut Obj<'_>) -> Result<(), LineError> {
    let m = object(line)?;
    // null log-probs are allowed (NaN): a masked token's inputs are never read.
    let logp = f32_array(required(m, "logp")?, "logp", true)?;
    let logp_old = optional(m, "logp_old")
        .map(|v| f32_array(v, "logp_old", true))
        .transpose()?;
    let logp_ref = optional(m, "logp_ref")
        .map(|v| f32_array(v, "logp_ref", true))
        .transpose()?;
    let logp_rollout = optional(m, "logp_rollout")
        .map(|v| f32_array(v, "logp_rollout", true))
        .transpose()?;
    if opts.beta > 0.0 && logp_ref.is_none() {
        // The core reads `beta > 0` without reference log-probs as "no KL term"; from the
        // command line that is a flag that silently does nothing, so it is an error.
        return Err(LineError::schema(format!(
            "missing key \"logp_ref\": --beta {} adds a KL term, which needs the reference log-probs (or use --beta 0)",
            opts.beta
        )));
    }
    if opts.bypass == Bypass::On && (logp_old.is_some() || logp_rollout.is_none()) {
        // Bypass mode takes the old log-probs from the rollout's: say which half is wrong.
        return Err(LineError::new(
            care_core::Error::InvalidArgument.code(),
            if logp_old.is_some() {
                "\"logp_old\" is given but --bypass on takes the old log-probs from \"logp_rollout\" (drop one of them)"
            } else {
                "missing key \"logp_rollout\": --bypass on takes the old log-probs from it (or use --bypass off)"
            },
        ));
    }
    let seq_offsets = u32_array(required(m, "seq_offsets")?, "seq_offsets")?;
    let mask = optional(m, "mask")
        .map(|v| mask_array(v, "mask"))
        .transpose()?;
    let adv = f32_array(required(m, "advantages")?, "advantages", false)?;
    let n = logp.len();
    for (name, len) in [
        ("logp_old", logp_old.as_ref().map(Vec::len)),
        ("logp_ref", logp_ref.as_ref().map(Vec::len)),
        ("logp_rollout", logp_rollout.as_ref().map(Vec::len)),
        ("mask", mask.as_ref().map(Vec::len)),
    ] {
        if let Some(len) = len {
            same_length(name, len, "logp", n)?;
        }
    }
    let layout = GroupLayout::Offsets(&seq_offsets);
    check_layout(layout, n, "seq_offsets", "logp")?;
    let sequences = seq_offsets.len().saturating_sub(1);
    // One advantage per sequence, else one per token (SPEC §10); when B == T both read alike.
    let advantages = if adv.len() == sequences {
        Advantages::PerSequence(&adv)
    } else if adv.len() == logp.len() {
        Advantages::PerToken(&adv)
    } else {
        return Err(LineError::new(
            care_core::Error::LengthMismatch.code(),
            format!(
                "\"advantages\" has {}; expected {sequences} (one per sequence of \"seq_offsets\") or {} (one per token of \"logp\")",
                values(adv.len()),
                logp.len()
            ),
        ));
    };
    // JSON cannot carry the NaN loss that a null (or, through the core's arithmetic, any
    // non-finite) input on a counted token would give: such a line is an error naming the first
    // such input, never a success line with `"loss": null`. Masked tokens are never read.
    let arrays = [
        Some(("logp", &logp[..])),
        logp_old.as_deref().map(|a| ("logp_old", a)),
        // Read only for the KL term.
        logp_ref
            .as_deref()
            .filter(|_| opts.beta > 0.0)
            .map(|a| ("logp_ref", a)),
        // The old log-probs in bypass mode.
        logp_rollout
            .as_deref()
            .filter(|_| opts.bypass == Bypass::On)
            .map(|a| ("logp_rollout", a)),
    ];
    for t in (0..logp.len()).filter(|&t| mask.as_ref().is_none_or(|m| m.get(t) != Some(&0))) {
        for (name, a) in arrays.iter().flatten() {
            if a.get(t).is_some_and(|x| !x.is_finite()) {
                return Err(LineError::new(
                    care_core::Error::NonFinite.code(),
                    format!(
                        "\"{name}\"[{t}] is null on a counted token (give a number, or mask the token out with \"mask\")"
                    ),
                ));
            }
        }
    }
    let inputs = LossInputs {
        logp: &logp,
        logp_old: logp_old.as_deref(),
        logp_ref: logp_ref.as_deref(),
        seq_offsets: &seq_offsets,
        mask: mask.as_deref(),
        advantages,
        logp_rollout: logp_rollout.as_deref(),
    };
    let mut grad = vec![0.0f32; logp.len()];
    let out = policy_loss(&inputs, opts, &mut grad)?;
    if !out.loss.is_finite() || out.stats.non_finite != 0.0 {
        // Unreachable with the inputs checked above; kept so that no success line ever carries
        // a null loss.
        return Err(LineError::new(
            care_core::Error::NonFinite.code(),
            "the loss is not finite",
        ));
    }
    o.f64("loss", out.loss).f32s("grad", &grad);
    o.obj("stats", |s| write_stats(s, &out.stats));
    if logp_rollout.is_some() {
        o.obj("rollout", |s| write_rollout_stats(s, &out.rollout));
    }
    if opts.policy_loss.selects_by_covariance() {
        o.f64("cov_selected", out.cov_selected);
    }
    Ok(())
}

/// The rollout correction's diagnostics, in the core's field order (all sums).
pub fn write_rollout_stats(s: &mut Obj<'_>, st: &RolloutStats) {
    for (name, v) in RolloutStats::FIELDS.iter().zip(st.values()) {
        s.f64(name, v);
    }
}

/// The stats members, in the core's field order (`ratio_min`/`ratio_max` are `null` when no
/// token counted: JSON has no infinity).
pub fn write_stats(s: &mut Obj<'_>, st: &LossStats) {
    s.f64("tokens", st.tokens)
        .f64("sequences", st.sequences)
        .f64("loss", st.loss)
        .f64("clipped", st.clipped)
        .f64("clipped_low", st.clipped_low)
        .f64("clipped_high", st.clipped_high)
        .f64("dual_clipped", st.dual_clipped)
        .f64("ppo_kl_sum", st.ppo_kl_sum)
        .f64("kl_sum", st.kl_sum)
        .f64("ratio_sum", st.ratio_sum)
        .f64("log_ratio_clamped", st.log_ratio_clamped)
        .f64("non_finite", st.non_finite)
        .f64("ratio_min", st.ratio_min)
        .f64("ratio_max", st.ratio_max);
}
