//! `care loss`: the clipped-ratio policy loss of one micro-batch per line (SPEC §10).

use care_core::grpo::{Advantages, LossInputs, LossOptions, LossStats, policy_loss};
use serde_json::Value;

use crate::input::{f32_array, mask_array, object, optional, required, u32_array};
use crate::json::{LineError, Obj};

/// Resolved options: the core's [`LossOptions`].
pub type Options = LossOptions;

/// Reads `{"logp", "logp_old"?, "logp_ref"?, "seq_offsets", "mask"?, "advantages"}` and writes
/// `loss`, `grad` and `stats`.
pub fn run(opts: &Options, value: &Value, o: &mut Obj<'_>) -> Result<(), LineError> {
    let m = object(value)?;
    // null log-probs are allowed (NaN): a masked token's inputs are never read.
    let logp = f32_array(required(m, "logp")?, "logp", true)?;
    let logp_old = optional(m, "logp_old")
        .map(|v| f32_array(v, "logp_old", true))
        .transpose()?;
    let logp_ref = optional(m, "logp_ref")
        .map(|v| f32_array(v, "logp_ref", true))
        .transpose()?;
    let seq_offsets = u32_array(required(m, "seq_offsets")?, "seq_offsets")?;
    let mask = optional(m, "mask")
        .map(|v| mask_array(v, "mask"))
        .transpose()?;
    let adv = f32_array(required(m, "advantages")?, "advantages", false)?;
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
                "\"advantages\" has {} values; expected {sequences} (one per sequence) or {} (one per token)",
                adv.len(),
                logp.len()
            ),
        ));
    };
    let inputs = LossInputs {
        logp: &logp,
        logp_old: logp_old.as_deref(),
        logp_ref: logp_ref.as_deref(),
        seq_offsets: &seq_offsets,
        mask: mask.as_deref(),
        advantages,
        logp_rollout: None,
    };
    let mut grad = vec![0.0f32; logp.len()];
    let out = policy_loss(&inputs, opts, &mut grad)?;
    o.f64("loss", out.loss).f32s("grad", &grad);
    o.obj("stats", |s| write_stats(s, &out.stats));
    Ok(())
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
