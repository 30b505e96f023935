//! Group advantages on the CPU (SPEC §9), their cross-rank form (§11) and the token broadcast.

use core::ffi::c_char;
use core::mem::{align_of, offset_of, size_of};

use care_core::grpo::{
    AdvantageOptions, Baseline, GroupLayout, GroupStats, GroupSums, Preset, Scale, SingletonPolicy,
    StdKind,
};

use crate::args::{self, Out};
use crate::result::{care_result, to_code};

/// The baseline subtracted from each reward (`care_advantage_options.baseline`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum care_baseline {
    /// The group mean of the valid rewards (GRPO; default).
    CARE_BASELINE_MEAN = 0,
    /// The mean of the other valid rewards of the group (RLOO).
    CARE_BASELINE_LEAVE_ONE_OUT = 1,
    /// Nothing is subtracted.
    CARE_BASELINE_NONE = 2,
}

/// What the centered reward is divided by (`care_advantage_options.scale`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum care_scale {
    /// The std of the group's valid rewards (default).
    CARE_SCALE_GROUP_STD = 0,
    /// The std of all valid rewards of the batch (TRL `scale_rewards="batch"`).
    CARE_SCALE_BATCH_STD = 1,
    /// No scaling (Dr. GRPO, RLOO).
    CARE_SCALE_NONE = 2,
}

/// Which variance estimator the std uses (`care_advantage_options.std_kind`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum care_std_kind {
    /// Divides by `n - 1` (default).
    CARE_STD_UNBIASED = 0,
    /// Divides by `n`.
    CARE_STD_BIASED = 1,
}

/// What a group with exactly one valid sample gets (`care_advantage_options.singleton`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum care_singleton_policy {
    /// Advantage 0 (default).
    CARE_SINGLETON_ZERO = 0,
    /// Baseline 0 and std 1, as verl does.
    CARE_SINGLETON_RAW = 1,
    /// Fail with `CARE_ERR_SINGLETON_GROUP`.
    CARE_SINGLETON_ERROR = 2,
}

/// Named advantage option sets that reproduce a trainer exactly (also by name:
/// `"verl"`, `"trl"`, `"trl_batch"`, `"openrlhf"`, `"dr_grpo"`, `"rloo"`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum care_advantage_preset {
    /// verl `grpo`: mean, group std, unbiased, eps 1e-6, singleton raw.
    CARE_ADVANTAGE_PRESET_VERL = 0,
    /// TRL: mean, group std, unbiased, eps 1e-4, singleton zero.
    CARE_ADVANTAGE_PRESET_TRL = 1,
    /// TRL with the batch std.
    CARE_ADVANTAGE_PRESET_TRL_BATCH = 2,
    /// OpenRLHF `group_norm`: eps 1e-9, singleton error.
    CARE_ADVANTAGE_PRESET_OPENRLHF = 3,
    /// Dr. GRPO: mean baseline, no scale.
    CARE_ADVANTAGE_PRESET_DR_GRPO = 4,
    /// RLOO: leave-one-out baseline, no scale.
    CARE_ADVANTAGE_PRESET_RLOO = 5,
}

/// Options of the advantage functions. Initialize with `care_advantage_options_default` or
/// `care_advantage_options_preset`, which set `struct_size`; then change fields. Enum fields
/// hold `care_baseline`, `care_scale`, `care_std_kind` and `care_singleton_policy` values.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_advantage_options {
    /// `sizeof(care_advantage_options)`; lets the struct grow without breaking old callers.
    pub struct_size: u32,
    /// A `care_baseline`.
    pub baseline: u32,
    /// A `care_scale`.
    pub scale: u32,
    /// A `care_std_kind`.
    pub std_kind: u32,
    /// A `care_singleton_policy`.
    pub singleton: u32,
    /// Reserved, set to 0 (keeps `eps` 8-byte aligned on every target).
    pub reserved: u32,
    /// Added to the std before dividing; finite and `>= 0` (default 1e-6).
    pub eps: f64,
}

/// Per-group statistics of the valid rewards.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_group_stats {
    /// Valid samples in the group.
    pub count: u32,
    /// Mean of the valid rewards (0 for an empty group).
    pub mean: f32,
    /// Std of the valid rewards (0 when undefined).
    pub std: f32,
    /// 1 when all valid rewards of a non-empty group are exactly equal, else 0.
    pub zero_variance: u32,
}

/// Count and sum of a group's valid rewards on one rank; all-reduce `2 * B` doubles with a sum.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_group_sums {
    /// Number of valid samples (an integer stored as a double).
    pub count: f64,
    /// Sum of the valid rewards.
    pub sum: f64,
}

// The C structs are reinterpreted as the core's `#[repr(C)]` structs: same size, alignment and
// field offsets, checked at compile time.
const _: () = {
    assert!(size_of::<care_group_stats>() == size_of::<GroupStats>());
    assert!(align_of::<care_group_stats>() == align_of::<GroupStats>());
    assert!(offset_of!(care_group_stats, count) == offset_of!(GroupStats, count));
    assert!(offset_of!(care_group_stats, mean) == offset_of!(GroupStats, mean));
    assert!(offset_of!(care_group_stats, std) == offset_of!(GroupStats, std));
    assert!(offset_of!(care_group_stats, zero_variance) == offset_of!(GroupStats, zero_variance));
    assert!(size_of::<care_group_sums>() == size_of::<GroupSums>());
    assert!(align_of::<care_group_sums>() == align_of::<GroupSums>());
    assert!(offset_of!(care_group_sums, count) == offset_of!(GroupSums, count));
    assert!(offset_of!(care_group_sums, sum) == offset_of!(GroupSums, sum));
};

const BASELINES: [Baseline; 3] = [Baseline::Mean, Baseline::LeaveOneOut, Baseline::None];
/// The presets the C struct can express: the later ones need the std floor, the GPG factor or
/// per-sample inputs (lengths, external baselines) that `care_advantage_options` does not carry
/// yet, and a preset must never be handed out with a field silently dropped.
const C_PRESETS: [Preset; 6] = [
    Preset::Verl,
    Preset::Trl,
    Preset::TrlBatch,
    Preset::OpenRlhf,
    Preset::DrGrpo,
    Preset::Rloo,
];
const SCALES: [Scale; 3] = [Scale::GroupStd, Scale::BatchStd, Scale::None];
const STD_KINDS: [StdKind; 2] = [StdKind::Unbiased, StdKind::Biased];
const SINGLETONS: [SingletonPolicy; 3] = [
    SingletonPolicy::Zero,
    SingletonPolicy::Raw,
    SingletonPolicy::Error,
];

fn to_c(o: &AdvantageOptions) -> care_advantage_options {
    care_advantage_options {
        struct_size: size_of::<care_advantage_options>() as u32,
        baseline: o.baseline as u32,
        scale: o.scale as u32,
        std_kind: o.std_kind as u32,
        singleton: o.singleton as u32,
        reserved: 0,
        eps: o.eps,
    }
}

/// Reads the caller's options (NULL: SPEC defaults), checking every enum value.
///
/// # Safety
/// As for [`args::options`].
pub(crate) unsafe fn read_options(
    p: *const care_advantage_options,
) -> Result<AdvantageOptions, care_result> {
    // SAFETY: forwarded contract.
    let c = unsafe { args::options(p, to_c(&AdvantageOptions::default())) }?;
    Ok(AdvantageOptions {
        baseline: args::enum_arg(c.baseline, &BASELINES)?,
        scale: args::enum_arg(c.scale, &SCALES)?,
        std_kind: args::enum_arg(c.std_kind, &STD_KINDS)?,
        singleton: args::enum_arg(c.singleton, &SINGLETONS)?,
        eps: c.eps,
        // Not in the C struct yet (std floor, GPG factor): the defaults, off.
        ..AdvantageOptions::default()
    })
}

/// The group layout: fixed `group_size` when `group_offsets` is NULL, CSR offsets otherwise
/// (then `group_size` must be 0, so that a caller never passes both by mistake).
///
/// # Safety
/// As for [`args::opt_slice`].
pub(crate) unsafe fn read_layout<'a>(
    group_size: u32,
    offsets: *const u32,
    offsets_len: usize,
) -> Result<GroupLayout<'a>, care_result> {
    // SAFETY: forwarded contract.
    match unsafe { args::opt_slice(offsets, offsets_len) }? {
        None => Ok(GroupLayout::Fixed {
            group_size: group_size as usize,
        }),
        Some(o) if group_size == 0 => Ok(GroupLayout::Offsets(o)),
        Some(_) => Err(care_result::CARE_ERR_INVALID_ARGUMENT),
    }
}

/// Writes the SPEC §9 default advantage options (mean, group std, unbiased, eps 1e-6,
/// singleton zero) into `*options_out`, with `struct_size` set.
///
/// ```c
/// care_advantage_options opts;
/// care_advantage_options_default(&opts);
/// opts.scale = CARE_SCALE_NONE;   /* Dr. GRPO */
/// ```
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_advantage_options_default(
    options_out: *mut care_advantage_options,
) -> care_result {
    ffi_panic_boundary! {
        let out = tri!(Out::new(options_out));
        // SAFETY: checked non-NULL and aligned; valid for a write (contract).
        unsafe { out.write(to_c(&AdvantageOptions::default())) };
        care_result::CARE_OK
    }
}

/// Writes the options of a `care_advantage_preset` into `*options_out`.
/// Errors: `CARE_ERR_INVALID_ARGUMENT` for an unknown preset.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_advantage_options_preset(
    preset: u32,
    options_out: *mut care_advantage_options,
) -> care_result {
    ffi_panic_boundary! {
        let out = tri!(Out::new(options_out));
        let p = tri!(args::enum_arg(preset, &C_PRESETS));
        // SAFETY: checked non-NULL and aligned; valid for a write (contract).
        unsafe { out.write(to_c(&AdvantageOptions::preset(p))) };
        care_result::CARE_OK
    }
}

/// Writes the options of the preset named `(name, name_len)` (`"verl"`, `"trl"`,
/// `"trl_batch"`, `"openrlhf"`, `"dr_grpo"`, `"rloo"`) into `*options_out`.
/// Errors: `CARE_ERR_INVALID_ARGUMENT` for an unknown name.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_advantage_options_preset_by_name(
    name: *const c_char,
    name_len: usize,
    options_out: *mut care_advantage_options,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY: forwarded contract.
        let name = tri!(unsafe { args::text(name, name_len) });
        let out = tri!(Out::new(options_out));
        let p = tri!(
            Preset::from_name(name)
                .filter(|p| C_PRESETS.contains(p))
                .ok_or(care_result::CARE_ERR_INVALID_ARGUMENT)
        );
        // SAFETY: checked non-NULL and aligned; valid for a write (contract).
        unsafe { out.write(to_c(&AdvantageOptions::preset(p))) };
        care_result::CARE_OK
    }
}

/// Group-relative advantages of one batch (single rank, CPU).
///
/// `rewards[n]`; `valid[valid_len]` optional (NULL, 0: all valid; else `valid_len == n`, non-zero =
/// valid; a NaN reward is invalid too); layout: `group_size` samples per group when
/// `group_offsets` is NULL, else CSR `group_offsets[B + 1]` with `group_size == 0`; `options`
/// NULL for the defaults. Writes `advantages_out[n]` and, if not NULL, `stats_out[B]`.
///
/// ```c
/// float adv[8];
/// care_result r = care_group_advantages(rewards, 8, NULL, 0, 4, NULL, 0, NULL,
///                                       adv, 8, NULL, 0);
/// ```
#[allow(clippy::too_many_arguments)] // one (pointer, length) pair per buffer
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_group_advantages(
    rewards: *const f32,
    n: usize,
    valid: *const u8,
    valid_len: usize,
    group_size: u32,
    group_offsets: *const u32,
    group_offsets_len: usize,
    options: *const care_advantage_options,
    advantages_out: *mut f32,
    advantages_len: usize,
    stats_out: *mut care_group_stats,
    stats_len: usize,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let rewards = tri!(unsafe { args::slice(rewards, n) });
        let valid = tri!(unsafe { args::opt_slice(valid, valid_len) });
        let layout = tri!(unsafe { read_layout(group_size, group_offsets, group_offsets_len) });
        let opts = tri!(unsafe { read_options(options) });
        let out = tri!(unsafe { args::slice_mut(advantages_out, advantages_len) });
        let stats = tri!(unsafe { args::opt_slice_mut(stats_out.cast::<GroupStats>(), stats_len) });
        to_code(care_core::grpo::group_advantages(rewards, valid, layout, &opts, out, stats))
    }
}

/// Cross-rank step 1: this rank's count and sum per group into `sums_out[B]` (all-reduce the
/// `2 * B` doubles with a sum). Arguments as `care_group_advantages`.
#[allow(clippy::too_many_arguments)] // one (pointer, length) pair per buffer
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_group_partial_sums(
    rewards: *const f32,
    n: usize,
    valid: *const u8,
    valid_len: usize,
    group_size: u32,
    group_offsets: *const u32,
    group_offsets_len: usize,
    sums_out: *mut care_group_sums,
    sums_len: usize,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let rewards = tri!(unsafe { args::slice(rewards, n) });
        let valid = tri!(unsafe { args::opt_slice(valid, valid_len) });
        let layout = tri!(unsafe { read_layout(group_size, group_offsets, group_offsets_len) });
        let out = tri!(unsafe { args::slice_mut(sums_out.cast::<GroupSums>(), sums_len) });
        to_code(care_core::grpo::group_partial_sums(rewards, valid, layout, out))
    }
}

/// Cross-rank step 2: centered sums of squares around the reduced (global) group means into
/// `m2_out[B]` (all-reduce with a sum). `sums[B]` are the all-reduced step-1 sums.
#[allow(clippy::too_many_arguments)] // one (pointer, length) pair per buffer
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_group_partial_squares(
    rewards: *const f32,
    n: usize,
    valid: *const u8,
    valid_len: usize,
    group_size: u32,
    group_offsets: *const u32,
    group_offsets_len: usize,
    sums: *const care_group_sums,
    sums_len: usize,
    m2_out: *mut f64,
    m2_len: usize,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let rewards = tri!(unsafe { args::slice(rewards, n) });
        let valid = tri!(unsafe { args::opt_slice(valid, valid_len) });
        let layout = tri!(unsafe { read_layout(group_size, group_offsets, group_offsets_len) });
        let sums = tri!(unsafe { args::slice(sums.cast::<GroupSums>(), sums_len) });
        let out = tri!(unsafe { args::slice_mut(m2_out, m2_len) });
        to_code(care_core::grpo::group_partial_squares(rewards, valid, layout, sums, out))
    }
}

/// Cross-rank step 3: this rank's advantages from the all-reduced `sums[B]` and `m2[B]`;
/// equal to `care_group_advantages` on the whole batch. Other arguments as there.
#[allow(clippy::too_many_arguments)] // one (pointer, length) pair per buffer
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_group_advantages_finalize(
    rewards: *const f32,
    n: usize,
    valid: *const u8,
    valid_len: usize,
    group_size: u32,
    group_offsets: *const u32,
    group_offsets_len: usize,
    sums: *const care_group_sums,
    sums_len: usize,
    m2: *const f64,
    m2_len: usize,
    options: *const care_advantage_options,
    advantages_out: *mut f32,
    advantages_len: usize,
    stats_out: *mut care_group_stats,
    stats_len: usize,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let rewards = tri!(unsafe { args::slice(rewards, n) });
        let valid = tri!(unsafe { args::opt_slice(valid, valid_len) });
        let layout = tri!(unsafe { read_layout(group_size, group_offsets, group_offsets_len) });
        let sums = tri!(unsafe { args::slice(sums.cast::<GroupSums>(), sums_len) });
        let m2 = tri!(unsafe { args::slice(m2, m2_len) });
        let opts = tri!(unsafe { read_options(options) });
        let out = tri!(unsafe { args::slice_mut(advantages_out, advantages_len) });
        let stats = tri!(unsafe { args::opt_slice_mut(stats_out.cast::<GroupStats>(), stats_len) });
        to_code(care_core::grpo::group_advantages_finalize(
            rewards, valid, layout, sums, m2, &opts, out, stats,
        ))
    }
}

/// Broadcasts per-sequence advantages onto tokens: `tokens_out[t] = advantages[seq(t)] *
/// mask[t]`. `seq_offsets[B + 1]` is the CSR token layout (last entry = `tokens_len`);
/// `advantages[B]`; `mask[mask_len]` optional (`mask_len == tokens_len`).
#[allow(clippy::too_many_arguments)] // one (pointer, length) pair per buffer
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_broadcast_to_tokens(
    advantages: *const f32,
    advantages_len: usize,
    seq_offsets: *const u32,
    seq_offsets_len: usize,
    mask: *const u8,
    mask_len: usize,
    tokens_out: *mut f32,
    tokens_len: usize,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let adv = tri!(unsafe { args::slice(advantages, advantages_len) });
        let offs = tri!(unsafe { args::slice(seq_offsets, seq_offsets_len) });
        let mask = tri!(unsafe { args::opt_slice(mask, mask_len) });
        let out = tri!(unsafe { args::slice_mut(tokens_out, tokens_len) });
        to_code(care_core::grpo::broadcast_to_tokens(adv, offs, mask, out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_enum_values_index_the_core_tables() {
        assert_eq!(
            BASELINES[care_baseline::CARE_BASELINE_LEAVE_ONE_OUT as usize],
            Baseline::LeaveOneOut
        );
        assert_eq!(SCALES[care_scale::CARE_SCALE_NONE as usize], Scale::None);
        assert_eq!(
            STD_KINDS[care_std_kind::CARE_STD_BIASED as usize],
            StdKind::Biased
        );
        assert_eq!(
            SINGLETONS[care_singleton_policy::CARE_SINGLETON_ERROR as usize],
            SingletonPolicy::Error
        );
        for (i, p) in Preset::ALL.iter().enumerate() {
            assert_eq!(*p as usize, i, "Preset::ALL is indexed by the C enum value");
        }
        assert_eq!(
            Preset::ALL[care_advantage_preset::CARE_ADVANTAGE_PRESET_RLOO as usize],
            Preset::Rloo
        );
        for b in BASELINES {
            assert_eq!(BASELINES[b as usize], b);
        }
        for s in SCALES {
            assert_eq!(SCALES[s as usize], s);
        }
        for s in SINGLETONS {
            assert_eq!(SINGLETONS[s as usize], s);
        }
    }

    #[test]
    fn options_round_trip_through_the_c_struct() {
        for p in C_PRESETS {
            let o = AdvantageOptions::preset(p);
            let c = to_c(&o);
            // SAFETY: pointer to a live, fully initialized struct.
            assert_eq!(unsafe { read_options(&c) }, Ok(o));
        }
        let mut c = to_c(&AdvantageOptions::default());
        c.struct_size = 8;
        // SAFETY: as above.
        assert_eq!(
            unsafe { read_options(&c) },
            Err(care_result::CARE_ERR_STRUCT_SIZE)
        );
        c.struct_size = size_of::<care_advantage_options>() as u32;
        c.scale = 3;
        // SAFETY: as above.
        assert_eq!(
            unsafe { read_options(&c) },
            Err(care_result::CARE_ERR_INVALID_ARGUMENT)
        );
    }
}
