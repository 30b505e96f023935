//! The clipped-ratio policy loss, its gradient and stats on the CPU (SPEC §10).

use core::ffi::c_char;
use core::mem::{align_of, size_of};

use care_core::grpo::{
    Advantages, Aggregation, KlEstimator, LogProb, LossInputs, LossOptions, LossPreset, LossStats,
    RatioLevel,
};
use half::{bf16, f16};

use crate::args::{self, Out};
use crate::result::{care_result, map_error};

/// How per-token losses are combined (`care_loss_options.aggregation`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum care_aggregation {
    /// `w = 1 / N_tok` (default).
    CARE_AGGREGATION_TOKEN_MEAN = 0,
    /// `w = 1 / (n_i * N_seq)`.
    CARE_AGGREGATION_SEQ_MEAN_TOKEN_MEAN = 1,
    /// `w = 1 / N_seq`.
    CARE_AGGREGATION_SEQ_MEAN_TOKEN_SUM = 2,
    /// `w = 1 / (N_seq * H)` (Dr. GRPO).
    CARE_AGGREGATION_SEQ_MEAN_TOKEN_SUM_NORM = 3,
    /// `w = 1`.
    CARE_AGGREGATION_TOKEN_SUM = 4,
}

/// The KL-to-reference estimator (`care_loss_options.kl_estimator`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum care_kl_estimator {
    /// `k1 = -x`.
    CARE_KL_K1 = 0,
    /// `|x|`.
    CARE_KL_ABS = 1,
    /// `x^2 / 2`.
    CARE_KL_K2 = 2,
    /// `clamp(exp(x) - x - 1, -Ko, Ko)` (default).
    CARE_KL_K3 = 3,
}

/// Per-token (PPO/GRPO) or per-sequence (GSPO) ratio (`care_loss_options.ratio_level`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum care_ratio_level {
    /// `rho_t = exp(delta_t)` (default).
    CARE_RATIO_TOKEN = 0,
    /// GSPO: one ratio per sequence from the mean log ratio.
    CARE_RATIO_SEQUENCE = 1,
}

/// Named loss option sets (also by name: `"verl"`, `"trl"`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum care_loss_preset {
    /// verl vanilla policy loss: eps 0.2/0.2, dual clip 3, token mean.
    CARE_LOSS_PRESET_VERL = 0,
    /// TRL `dapo`: eps 0.2/0.2, no dual clip, token mean.
    CARE_LOSS_PRESET_TRL = 1,
}

/// Whether `advantages` holds one value per sequence or one per token.
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum care_advantages_kind {
    /// `advantages[B]`, broadcast to the tokens of each sequence.
    CARE_ADVANTAGES_PER_SEQUENCE = 0,
    /// `advantages[T]`, one per token.
    CARE_ADVANTAGES_PER_TOKEN = 1,
}

/// Options of the policy loss. Initialize with `care_loss_options_default` or
/// `care_loss_options_preset` (they set `struct_size`), then change fields. A denominator of
/// 0 means "this call's own count"; pass global counts so that micro-batches add up.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_loss_options {
    /// `sizeof(care_loss_options)`; lets the struct grow without breaking old callers.
    pub struct_size: u32,
    /// A `care_aggregation`.
    pub aggregation: u32,
    /// A `care_ratio_level`.
    pub ratio_level: u32,
    /// A `care_kl_estimator`.
    pub kl_estimator: u32,
    /// Lower clip width (0.2): `rho` is clipped below at `1 - eps_low`.
    pub eps_low: f64,
    /// Upper clip width (0.2): `rho` is clipped above at `1 + eps_high`.
    pub eps_high: f64,
    /// Dual-clip constant `c` (off when `<= 1`; default 0, verl preset 3).
    pub dual_clip: f64,
    /// Bound on `|logp - logp_old|` before `exp` (20).
    pub log_ratio_clamp: f64,
    /// GSPO only: upper bound on the mean log ratio (10).
    pub seq_log_ratio_max: f64,
    /// KL coefficient `beta` (0 = no KL term).
    pub beta: f64,
    /// Bound on `|logp_ref - logp|` before the KL estimator (20).
    pub kl_input_clamp: f64,
    /// Bound on the `k3` value (10).
    pub kl_output_clamp: f64,
    /// Global counted-token count `N_tok` (0 = this call's).
    pub global_tokens: f64,
    /// Global sequence count `N_seq` (0 = this call's).
    pub global_sequences: f64,
    /// Dr. GRPO horizon `H` (0 = the longest sequence of this call).
    pub horizon: f64,
}

/// Loss statistics as sums that add across micro-batches and ranks (all-reduce the first
/// twelve with a sum, `ratio_min` with min, `ratio_max` with max).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_loss_stats {
    /// Counted tokens.
    pub tokens: f64,
    /// Sequences with at least one counted token.
    pub sequences: f64,
    /// This call's part of the loss.
    pub loss: f64,
    /// Tokens where the clipped branch binds.
    pub clipped: f64,
    /// Tokens with `rho < 1 - eps_low` and `A < 0`.
    pub clipped_low: f64,
    /// Tokens with `rho > 1 + eps_high` and `A > 0`.
    pub clipped_high: f64,
    /// Tokens where the dual clip binds.
    pub dual_clipped: f64,
    /// `sum (logp_old - logp)` (verl `ppo_kl` times tokens).
    pub ppo_kl_sum: f64,
    /// `sum k` of the KL estimator (without `beta`).
    pub kl_sum: f64,
    /// `sum rho`.
    pub ratio_sum: f64,
    /// Counted tokens whose log ratio hit the clamp.
    pub log_ratio_clamped: f64,
    /// Counted tokens with a non-finite input.
    pub non_finite: f64,
    /// Smallest `rho` (`+inf` when no token counted).
    pub ratio_min: f64,
    /// Largest `rho` (`-inf` when no token counted).
    pub ratio_max: f64,
}

// `care_loss_stats` is written as the core's `#[repr(C)]` `LossStats`: fourteen `f64`s in the
// same order (checked here and by a test that compares field values).
const _: () = {
    assert!(size_of::<care_loss_stats>() == size_of::<LossStats>());
    assert!(align_of::<care_loss_stats>() == align_of::<LossStats>());
};

const AGGREGATIONS: [Aggregation; 5] = [
    Aggregation::TokenMean,
    Aggregation::SeqMeanTokenMean,
    Aggregation::SeqMeanTokenSum,
    Aggregation::SeqMeanTokenSumNorm,
    Aggregation::TokenSum,
];
const RATIO_LEVELS: [RatioLevel; 2] = [RatioLevel::Token, RatioLevel::Sequence];
const KL_ESTIMATORS: [KlEstimator; 4] = [
    KlEstimator::K1,
    KlEstimator::Abs,
    KlEstimator::K2,
    KlEstimator::K3,
];

fn to_c(o: &LossOptions) -> care_loss_options {
    care_loss_options {
        struct_size: size_of::<care_loss_options>() as u32,
        aggregation: o.aggregation as u32,
        ratio_level: o.ratio_level as u32,
        kl_estimator: o.kl_estimator as u32,
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
    }
}

pub(crate) fn stats_to_c(s: &LossStats) -> care_loss_stats {
    care_loss_stats {
        tokens: s.tokens,
        sequences: s.sequences,
        loss: s.loss,
        clipped: s.clipped,
        clipped_low: s.clipped_low,
        clipped_high: s.clipped_high,
        dual_clipped: s.dual_clipped,
        ppo_kl_sum: s.ppo_kl_sum,
        kl_sum: s.kl_sum,
        ratio_sum: s.ratio_sum,
        log_ratio_clamped: s.log_ratio_clamped,
        non_finite: s.non_finite,
        ratio_min: s.ratio_min,
        ratio_max: s.ratio_max,
    }
}

/// The presets the C struct can express: the later ones need the policy-loss family, the
/// rollout correction, the new aggregation or the sequence count, which `care_loss_options` does
/// not carry yet, and a preset must never be handed out with a field silently dropped.
const C_LOSS_PRESETS: [LossPreset; 2] = [LossPreset::Verl, LossPreset::Trl];

/// Reads the caller's loss options (NULL: SPEC defaults), checking every enum value.
///
/// # Safety
/// As for [`args::options`].
pub(crate) unsafe fn read_options(p: *const care_loss_options) -> Result<LossOptions, care_result> {
    // SAFETY: forwarded contract.
    let c = unsafe { args::options(p, to_c(&LossOptions::default())) }?;
    Ok(LossOptions {
        eps_low: c.eps_low,
        eps_high: c.eps_high,
        dual_clip: c.dual_clip,
        log_ratio_clamp: c.log_ratio_clamp,
        seq_log_ratio_max: c.seq_log_ratio_max,
        beta: c.beta,
        kl_input_clamp: c.kl_input_clamp,
        kl_output_clamp: c.kl_output_clamp,
        global_tokens: c.global_tokens,
        global_sequences: c.global_sequences,
        horizon: c.horizon,
        aggregation: args::enum_arg(c.aggregation, &AGGREGATIONS)?,
        ratio_level: args::enum_arg(c.ratio_level, &RATIO_LEVELS)?,
        kl_estimator: args::enum_arg(c.kl_estimator, &KL_ESTIMATORS)?,
        // Not in the C struct yet (the policy-loss family, the rollout correction, the
        // sequence count): the defaults.
        ..LossOptions::default()
    })
}

/// Writes the SPEC §10 default loss options into `*options_out` (eps 0.2/0.2, no dual clip,
/// clamps 20/10/20/10, beta 0, k3, token ratio, token mean, local denominators).
///
/// ```c
/// care_loss_options lo;
/// care_loss_options_default(&lo);
/// lo.global_tokens = (double)tokens_on_all_ranks;
/// ```
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_loss_options_default(
    options_out: *mut care_loss_options,
) -> care_result {
    ffi_panic_boundary! {
        let out = tri!(Out::new(options_out));
        // SAFETY: checked non-NULL and aligned; valid for a write (contract).
        unsafe { out.write(to_c(&LossOptions::default())) };
        care_result::CARE_OK
    }
}

/// Writes the options of a `care_loss_preset` into `*options_out`.
/// Errors: `CARE_ERR_INVALID_ARGUMENT` for an unknown preset.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_loss_options_preset(
    preset: u32,
    options_out: *mut care_loss_options,
) -> care_result {
    ffi_panic_boundary! {
        let out = tri!(Out::new(options_out));
        let p = tri!(args::enum_arg(preset, &C_LOSS_PRESETS));
        // SAFETY: checked non-NULL and aligned; valid for a write (contract).
        unsafe { out.write(to_c(&LossOptions::preset(p))) };
        care_result::CARE_OK
    }
}

/// Writes the options of the loss preset named `(name, name_len)` (`"verl"`, `"trl"`).
/// Errors: `CARE_ERR_INVALID_ARGUMENT` for an unknown name.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_loss_options_preset_by_name(
    name: *const c_char,
    name_len: usize,
    options_out: *mut care_loss_options,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY: forwarded contract.
        let name = tri!(unsafe { args::text(name, name_len) });
        let out = tri!(Out::new(options_out));
        let p = tri!(
            LossPreset::from_name(name)
                .filter(|p| C_LOSS_PRESETS.contains(p))
                .ok_or(care_result::CARE_ERR_INVALID_ARGUMENT)
        );
        // SAFETY: checked non-NULL and aligned; valid for a write (contract).
        unsafe { out.write(to_c(&LossOptions::preset(p))) };
        care_result::CARE_OK
    }
}

/// The shared body of the three dtype entry points.
///
/// # Safety
/// The contract of the entry points.
#[allow(clippy::too_many_arguments)]
unsafe fn policy_loss_impl<T: LogProb>(
    logp: *const T,
    logp_len: usize,
    logp_old: *const T,
    logp_old_len: usize,
    logp_ref: *const T,
    logp_ref_len: usize,
    seq_offsets: *const u32,
    seq_offsets_len: usize,
    mask: *const u8,
    mask_len: usize,
    advantages: *const f32,
    advantages_len: usize,
    advantages_kind: u32,
    options: *const care_loss_options,
    grad_out: *mut f32,
    grad_len: usize,
    loss_out: *mut f64,
    stats_out: *mut care_loss_stats,
) -> care_result {
    // SAFETY (all blocks below): forwarded contract of the entry point.
    let logp = tri!(unsafe { args::slice(logp, logp_len) });
    let logp_old = tri!(unsafe { args::opt_slice(logp_old, logp_old_len) });
    let logp_ref = tri!(unsafe { args::opt_slice(logp_ref, logp_ref_len) });
    let seq_offsets = tri!(unsafe { args::slice(seq_offsets, seq_offsets_len) });
    let mask = tri!(unsafe { args::opt_slice(mask, mask_len) });
    let adv = tri!(unsafe { args::slice(advantages, advantages_len) });
    let advantages = match advantages_kind {
        0 => Advantages::PerSequence(adv),
        1 => Advantages::PerToken(adv),
        _ => return care_result::CARE_ERR_INVALID_ARGUMENT,
    };
    let opts = tri!(unsafe { read_options(options) });
    let loss_out = tri!(Out::new(loss_out));
    let stats_out = if stats_out.is_null() {
        None
    } else {
        Some(tri!(Out::new(stats_out)))
    };
    let grad = tri!(unsafe { args::slice_mut(grad_out, grad_len) });
    let inputs = LossInputs {
        logp,
        logp_old,
        logp_ref,
        seq_offsets,
        mask,
        advantages,
        // The C struct has no rollout log-probs yet.
        logp_rollout: None,
    };
    match care_core::grpo::policy_loss(&inputs, &opts, grad) {
        Ok(out) => {
            unsafe { loss_out.write(out.loss) };
            if let Some(s) = stats_out {
                unsafe { s.write(stats_to_c(&out.stats)) };
            }
            care_result::CARE_OK
        }
        Err(e) => map_error(e),
    }
}

/// The clipped-ratio policy loss of one micro-batch with `f32` log-probs, its gradient
/// `grad_out[T] = dL/dlogp` and, if `stats_out` is not NULL, its stats.
///
/// Token layout: `seq_offsets[B + 1]` CSR offsets (last = `T`). `logp[T]`; `logp_old` optional
/// (NULL, 0: on-policy); `logp_ref` optional (KL term when `beta > 0`); `mask` optional
/// (non-zero = counted); `advantages[B]` or `[T]` per `advantages_kind`
/// (`care_advantages_kind`); `options` NULL for the defaults. Every given per-token length must
/// equal `logp_len` (`CARE_ERR_LENGTH_MISMATCH`).
///
/// ```c
/// double loss; care_loss_stats st; float grad[T];
/// care_result r = care_policy_loss_f32(logp, T, logp_old, T, NULL, 0, offs, B + 1, mask, T,
///                                      adv, B, CARE_ADVANTAGES_PER_SEQUENCE, NULL,
///                                      grad, T, &loss, &st);
/// ```
#[allow(clippy::too_many_arguments)] // one (pointer, length) pair per buffer
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_policy_loss_f32(
    logp: *const f32,
    logp_len: usize,
    logp_old: *const f32,
    logp_old_len: usize,
    logp_ref: *const f32,
    logp_ref_len: usize,
    seq_offsets: *const u32,
    seq_offsets_len: usize,
    mask: *const u8,
    mask_len: usize,
    advantages: *const f32,
    advantages_len: usize,
    advantages_kind: u32,
    options: *const care_loss_options,
    grad_out: *mut f32,
    grad_len: usize,
    loss_out: *mut f64,
    stats_out: *mut care_loss_stats,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY: the entry point's contract.
        unsafe {
            policy_loss_impl(
                logp, logp_len, logp_old, logp_old_len, logp_ref, logp_ref_len, seq_offsets,
                seq_offsets_len, mask, mask_len, advantages, advantages_len, advantages_kind,
                options, grad_out, grad_len, loss_out, stats_out,
            )
        }
    }
}

/// As `care_policy_loss_f32`, with bf16 log-probs given as their raw 16-bit patterns
/// (`uint16_t`, e.g. `torch.bfloat16` storage). The gradient is `f32`.
#[allow(clippy::too_many_arguments)] // one (pointer, length) pair per buffer
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_policy_loss_bf16(
    logp: *const u16,
    logp_len: usize,
    logp_old: *const u16,
    logp_old_len: usize,
    logp_ref: *const u16,
    logp_ref_len: usize,
    seq_offsets: *const u32,
    seq_offsets_len: usize,
    mask: *const u8,
    mask_len: usize,
    advantages: *const f32,
    advantages_len: usize,
    advantages_kind: u32,
    options: *const care_loss_options,
    grad_out: *mut f32,
    grad_len: usize,
    loss_out: *mut f64,
    stats_out: *mut care_loss_stats,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY: the entry point's contract; `bf16` is `repr(transparent)` over `u16`.
        unsafe {
            policy_loss_impl(
                logp.cast::<bf16>(), logp_len, logp_old.cast::<bf16>(), logp_old_len,
                logp_ref.cast::<bf16>(), logp_ref_len, seq_offsets, seq_offsets_len, mask,
                mask_len, advantages, advantages_len, advantages_kind, options, grad_out,
                grad_len, loss_out, stats_out,
            )
        }
    }
}

/// As `care_policy_loss_f32`, with IEEE half (f16) log-probs given as their raw 16-bit
/// patterns (`uint16_t`). The gradient is `f32`.
#[allow(clippy::too_many_arguments)] // one (pointer, length) pair per buffer
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_policy_loss_f16(
    logp: *const u16,
    logp_len: usize,
    logp_old: *const u16,
    logp_old_len: usize,
    logp_ref: *const u16,
    logp_ref_len: usize,
    seq_offsets: *const u32,
    seq_offsets_len: usize,
    mask: *const u8,
    mask_len: usize,
    advantages: *const f32,
    advantages_len: usize,
    advantages_kind: u32,
    options: *const care_loss_options,
    grad_out: *mut f32,
    grad_len: usize,
    loss_out: *mut f64,
    stats_out: *mut care_loss_stats,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY: the entry point's contract; `f16` is `repr(transparent)` over `u16`.
        unsafe {
            policy_loss_impl(
                logp.cast::<f16>(), logp_len, logp_old.cast::<f16>(), logp_old_len,
                logp_ref.cast::<f16>(), logp_ref_len, seq_offsets, seq_offsets_len, mask,
                mask_len, advantages, advantages_len, advantages_kind, options, grad_out,
                grad_len, loss_out, stats_out,
            )
        }
    }
}

/// Adds the stats of another micro-batch or rank into `*acc` (sums add, min/max combine).
/// Start from `care_loss_stats_empty`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_loss_stats_add(
    acc: *mut care_loss_stats,
    other: *const care_loss_stats,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY: forwarded contract.
        let o = *tri!(unsafe { args::as_ref(other) });
        let out = tri!(Out::new(acc));
        // SAFETY: checked non-NULL and aligned; `acc` is initialized (contract).
        let mut a = unsafe { *acc };
        a.tokens += o.tokens;
        a.sequences += o.sequences;
        a.loss += o.loss;
        a.clipped += o.clipped;
        a.clipped_low += o.clipped_low;
        a.clipped_high += o.clipped_high;
        a.dual_clipped += o.dual_clipped;
        a.ppo_kl_sum += o.ppo_kl_sum;
        a.kl_sum += o.kl_sum;
        a.ratio_sum += o.ratio_sum;
        a.log_ratio_clamped += o.log_ratio_clamped;
        a.non_finite += o.non_finite;
        a.ratio_min = a.ratio_min.min(o.ratio_min);
        a.ratio_max = a.ratio_max.max(o.ratio_max);
        // SAFETY: as above.
        unsafe { out.write(a) };
        care_result::CARE_OK
    }
}

/// Writes the identity of `care_loss_stats_add` (zero sums, `ratio_min = +inf`,
/// `ratio_max = -inf`) into `*stats_out`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_loss_stats_empty(stats_out: *mut care_loss_stats) -> care_result {
    ffi_panic_boundary! {
        let out = tri!(Out::new(stats_out));
        // SAFETY: checked non-NULL and aligned; valid for a write (contract).
        unsafe { out.write(stats_to_c(&LossStats::EMPTY)) };
        care_result::CARE_OK
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_enum_values_index_the_core_tables() {
        for (i, a) in AGGREGATIONS.iter().enumerate() {
            assert_eq!(*a as usize, i);
        }
        for (i, r) in RATIO_LEVELS.iter().enumerate() {
            assert_eq!(*r as usize, i);
        }
        for (i, k) in KL_ESTIMATORS.iter().enumerate() {
            assert_eq!(*k as usize, i);
        }
        for (i, p) in LossPreset::ALL.iter().enumerate() {
            assert_eq!(*p as usize, i);
        }
        assert_eq!(care_aggregation::CARE_AGGREGATION_TOKEN_SUM as usize, 4);
        assert_eq!(
            care_kl_estimator::CARE_KL_K3 as usize,
            KlEstimator::K3 as usize
        );
        assert_eq!(
            care_ratio_level::CARE_RATIO_SEQUENCE as usize,
            RatioLevel::Sequence as usize
        );
        assert_eq!(
            care_loss_preset::CARE_LOSS_PRESET_TRL as usize,
            LossPreset::Trl as usize
        );
    }

    #[test]
    fn options_round_trip_through_the_c_struct() {
        for p in C_LOSS_PRESETS {
            let o = LossOptions::preset(p);
            // SAFETY: pointer to a live, fully initialized struct.
            assert_eq!(unsafe { read_options(&to_c(&o)) }, Ok(o));
        }
        let mut c = to_c(&LossOptions::default());
        c.kl_estimator = 4;
        // SAFETY: as above.
        assert_eq!(
            unsafe { read_options(&c) },
            Err(care_result::CARE_ERR_INVALID_ARGUMENT)
        );
    }

    #[test]
    fn stats_add_matches_the_core() {
        let a = LossStats {
            tokens: 3.0,
            loss: 0.5,
            ratio_min: 0.9,
            ratio_max: 1.1,
            ..LossStats::EMPTY
        };
        let b = LossStats {
            tokens: 2.0,
            clipped: 1.0,
            ratio_min: 0.7,
            ratio_max: 1.0,
            ..LossStats::EMPTY
        };
        let mut want = a;
        want.add(&b);
        let mut acc = stats_to_c(&a);
        // SAFETY: live structs.
        assert_eq!(
            unsafe { care_loss_stats_add(&mut acc, &stats_to_c(&b)) },
            care_result::CARE_OK
        );
        assert_eq!(acc, stats_to_c(&want));
    }

    #[test]
    fn c_stats_struct_is_the_core_layout() {
        use care_core::grpo::{LOSS_STATS_LAYOUT, LOSS_STATS_SIZE};
        assert_eq!(size_of::<care_loss_stats>(), LOSS_STATS_SIZE);
        // A distinct value in every field of the core struct, placed through the table; the C
        // struct must hold each at the table's offset (same order, and `stats_to_c` copies
        // every field by its own name).
        let mut s = LossStats::EMPTY;
        for (i, f) in LOSS_STATS_LAYOUT.iter().enumerate() {
            // SAFETY: the table puts an f64 at every offset of `LossStats` (checked in core).
            unsafe {
                (&raw mut s)
                    .cast::<u8>()
                    .add(f.offset)
                    .cast::<f64>()
                    .write(i as f64 + 0.5)
            };
        }
        let c = stats_to_c(&s);
        for (i, f) in LOSS_STATS_LAYOUT.iter().enumerate() {
            // SAFETY: same size (asserted above); all fields are f64.
            let got = unsafe {
                (&raw const c)
                    .cast::<u8>()
                    .add(f.offset)
                    .cast::<f64>()
                    .read()
            };
            assert_eq!(got, i as f64 + 0.5, "care_loss_stats.{}", f.name);
        }
    }
}
