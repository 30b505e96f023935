//! Group advantages on the CPU (SPEC §9), their cross-rank form (§11) and the token broadcast.

use core::ffi::c_char;
use core::mem::{align_of, offset_of, size_of};

use care_core::grpo::{
    AdvantageOptions, Baseline, GroupInputs, GroupLayout, GroupStats, GroupSums, Preset, Reweight,
    Scale, SingletonPolicy, StdKind,
};

use crate::args::{self, Out};
use crate::result::{care_result, map_error};

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
    /// OPO: the length-weighted group mean `sum_j l_j r_j / sum_j l_j` (needs
    /// `care_rewards.lengths`).
    CARE_BASELINE_LENGTH_WEIGHTED = 3,
    /// ReMax: one baseline reward per sample, `A = r_i - b_i` (needs `care_rewards.baselines`).
    CARE_BASELINE_EXTERNAL = 4,
    /// pass@k: `A_i = max_j r_j - max_{j != i} r_j` (only a group's best sample gets credit).
    CARE_BASELINE_PASS_K = 5,
}

/// A factor on the batch's advantages (`care_advantage_options.reweight`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum care_reweight {
    /// None (default).
    CARE_REWEIGHT_NONE = 0,
    /// GPG: `alpha = N / (N - M)`, `M` the valid samples of groups without signal.
    CARE_REWEIGHT_GPG = 1,
    /// verl `gpg`: `alpha = N / max(1, K)`, `K` the valid samples with a nonzero reward (not in
    /// the cross-rank form: `care_group_advantages_finalize` refuses it).
    CARE_REWEIGHT_NONZERO = 2,
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
/// `"verl"`, `"trl"`, `"trl_batch"`, `"openrlhf"`, `"dr_grpo"`, `"rloo"`, `"opo"`, `"remax"`,
/// `"grpo_passk"`, `"gpg"`, `"reinforce_pp_baseline"`).
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
    /// verl `opo`: length-weighted baseline, no scale (needs `care_rewards.lengths`).
    CARE_ADVANTAGE_PRESET_OPO = 6,
    /// verl `remax`: external baseline (the greedy response's reward), no scale (needs
    /// `care_rewards.baselines`).
    CARE_ADVANTAGE_PRESET_REMAX = 7,
    /// verl `grpo_passk`: pass@k baseline, group std.
    CARE_ADVANTAGE_PRESET_GRPO_PASSK = 8,
    /// GPG (paper): mean baseline, no scale, `alpha = N / (N - M)`.
    CARE_ADVANTAGE_PRESET_GPG = 9,
    /// verl `reinforce_plus_plus_baseline`, group part: mean baseline, no scale.
    CARE_ADVANTAGE_PRESET_REINFORCE_PP_BASELINE = 10,
    /// verl `gpg`: mean baseline, no scale, `alpha = N / count_nonzero(r)`, singleton raw.
    CARE_ADVANTAGE_PRESET_VERL_GPG = 11,
}

/// Options of the advantage functions. Initialize with `care_advantage_options_default` or
/// `care_advantage_options_preset`, which set `struct_size`; then change fields. Enum fields
/// hold `care_baseline`, `care_scale`, `care_std_kind`, `care_singleton_policy` and
/// `care_reweight` values.
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
    /// A `care_reweight` (0: none, the value every earlier caller left in this field).
    pub reweight: u32,
    /// Added to the std before dividing; finite and `>= 0` (default 1e-6).
    pub eps: f64,
    /// Lower bound of the std the advantages are divided by: `max(std, std_floor) + eps`;
    /// finite and `>= 0` (default 0: off).
    pub std_floor: f64,
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

fn to_c(o: &AdvantageOptions) -> care_advantage_options {
    care_advantage_options {
        struct_size: size_of::<care_advantage_options>() as u32,
        baseline: o.baseline as u32,
        scale: o.scale as u32,
        std_kind: o.std_kind as u32,
        singleton: o.singleton as u32,
        reweight: o.reweight as u32,
        eps: o.eps,
        std_floor: o.std_floor,
    }
}

/// Reads the caller's options (NULL: SPEC defaults): every enum value decoded, then the
/// core's `AdvantageOptions::validate`.
///
/// # Safety
/// As for [`args::options`].
pub(crate) unsafe fn read_options(
    p: *const care_advantage_options,
) -> Result<AdvantageOptions, care_result> {
    // SAFETY: forwarded contract.
    let c = unsafe { args::options(p, to_c(&AdvantageOptions::default())) }?;
    let o = AdvantageOptions {
        baseline: args::enum_arg(
            "care_advantage_options.baseline",
            c.baseline,
            &Baseline::ALL,
        )?,
        scale: args::enum_arg("care_advantage_options.scale", c.scale, &Scale::ALL)?,
        std_kind: args::enum_arg("care_advantage_options.std_kind", c.std_kind, &StdKind::ALL)?,
        singleton: args::enum_arg(
            "care_advantage_options.singleton",
            c.singleton,
            &SingletonPolicy::ALL,
        )?,
        eps: c.eps,
        std_floor: c.std_floor,
        reweight: args::enum_arg(
            "care_advantage_options.reweight",
            c.reweight,
            &Reweight::ALL,
        )?,
    };
    // The core's own rules, checked here too so that a GPU call reports them before it needs
    // a driver, exactly as the CPU does.
    args::option_check("care_advantage_options", o.check())?;
    Ok(o)
}

/// The rewards of a batch: `rewards[rewards_len]` and which of them are valid. `valid` is
/// optional ((NULL, 0): all valid; else `valid_len == rewards_len`, non-zero = valid); a NaN
/// reward is invalid too. The per-sample inputs of two baselines are optional too, (NULL, 0)
/// unless the options' baseline reads them: `lengths` (`CARE_BASELINE_LENGTH_WEIGHTED`, each
/// response's token count) and `baselines` (`CARE_BASELINE_EXTERNAL`); each has
/// `rewards_len` entries. Host memory for the CPU functions, device memory for the GPU ones.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_rewards {
    /// `sizeof(care_rewards)`.
    pub struct_size: u32,
    /// One reward per sample, groups contiguous.
    pub rewards: *const f32,
    /// Number of samples `N`.
    pub rewards_len: usize,
    /// Optional validity flags, one per sample.
    pub valid: *const u8,
    /// 0 or `rewards_len`.
    pub valid_len: usize,
    /// Optional response lengths in tokens, one per sample.
    pub lengths: *const u32,
    /// 0 or `rewards_len`.
    pub lengths_len: usize,
    /// Optional baseline rewards, one per sample.
    pub baselines: *const f32,
    /// 0 or `rewards_len`.
    pub baselines_len: usize,
}

/// How samples form groups (one group = the responses to one prompt): `group_size` samples per
/// group when `offsets` is (NULL, 0), else CSR `offsets[B + 1]` (first 0, non-decreasing, last
/// `N`) with `group_size` 0, so that a layout never says two things at once
/// (`CARE_ERR_INVALID_ARGUMENT`). Host or device memory like the rewards it describes.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_group_layout {
    /// `sizeof(care_group_layout)`.
    pub struct_size: u32,
    /// Samples per group (fixed layout; must divide `N`), or 0 with `offsets`.
    pub group_size: u32,
    /// CSR group offsets (ragged groups), or NULL.
    pub offsets: *const u32,
    /// `B + 1`, or 0.
    pub offsets_len: usize,
}

/// Where the advantage functions write: `advantages[advantages_len]` (`== N`) and, optionally,
/// one `care_group_stats` per group (`stats_len == B`; (NULL, 0) to skip).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_advantage_outputs {
    /// `sizeof(care_advantage_outputs)`.
    pub struct_size: u32,
    /// One advantage per sample.
    pub advantages: *mut f32,
    /// `N`.
    pub advantages_len: usize,
    /// Optional per-group statistics.
    pub stats: *mut care_group_stats,
    /// 0 or `B`.
    pub stats_len: usize,
}

/// The checked rewards of a `care_rewards` struct: the rewards, their validity and the optional
/// per-sample lengths and baselines, each of `rewards_len` entries when present. Every function
/// that reads the struct checks all of it, whether or not it uses every member.
///
/// # Safety
/// As for [`args::input`]; the struct's pointers are valid for their lengths.
#[allow(clippy::type_complexity)]
pub(crate) unsafe fn read_rewards_all<'a>(
    p: *const care_rewards,
) -> Result<
    (
        &'a [f32],
        Option<&'a [u8]>,
        Option<&'a [u32]>,
        Option<&'a [f32]>,
    ),
    care_result,
> {
    // SAFETY (all blocks): forwarded contract.
    let r = unsafe { args::input(p) }?;
    let rewards = unsafe { args::slice(r.rewards, r.rewards_len) }?;
    let valid = unsafe { args::opt_slice(r.valid, r.valid_len) }?;
    let lengths = unsafe { args::opt_slice(r.lengths, r.lengths_len) }?;
    let baselines = unsafe { args::opt_slice(r.baselines, r.baselines_len) }?;
    let n = rewards.len();
    if let Some(l) = lengths.filter(|l| l.len() != n) {
        return Err(args::mismatch(
            "care_rewards.lengths_len",
            l.len(),
            "rewards_len",
            n,
        ));
    }
    if let Some(b) = baselines.filter(|b| b.len() != n) {
        return Err(args::mismatch(
            "care_rewards.baselines_len",
            b.len(),
            "rewards_len",
            n,
        ));
    }
    Ok((rewards, valid, lengths, baselines))
}

/// The rewards and their validity of a `care_rewards` struct (all of it checked, see
/// [`read_rewards_all`]).
///
/// # Safety
/// As for [`read_rewards_all`].
pub(crate) unsafe fn read_rewards<'a>(
    p: *const care_rewards,
) -> Result<(&'a [f32], Option<&'a [u8]>), care_result> {
    // SAFETY: forwarded contract.
    let (rewards, valid, _, _) = unsafe { read_rewards_all(p) }?;
    Ok((rewards, valid))
}

/// The core's group inputs from a `care_rewards` struct and a layout.
///
/// # Safety
/// As for [`read_rewards_all`] and [`read_layout`].
pub(crate) unsafe fn read_group_inputs<'a>(
    p: *const care_rewards,
    layout: *const care_group_layout,
) -> Result<GroupInputs<'a>, care_result> {
    // SAFETY (both blocks): forwarded contract.
    let (rewards, valid, lengths, baselines) = unsafe { read_rewards_all(p) }?;
    Ok(GroupInputs {
        rewards,
        valid,
        layout: unsafe { read_layout(layout) }?,
        lengths,
        baselines,
    })
}

/// The group layout of a `care_group_layout` struct.
///
/// # Safety
/// As for [`args::input`]; `offsets` is valid for `offsets_len` elements.
pub(crate) unsafe fn read_layout<'a>(
    p: *const care_group_layout,
) -> Result<GroupLayout<'a>, care_result> {
    // SAFETY (both blocks): forwarded contract.
    let l = unsafe { args::input(p) }?;
    match unsafe { args::opt_slice(l.offsets, l.offsets_len) }? {
        None => Ok(GroupLayout::Fixed {
            group_size: l.group_size as usize,
        }),
        Some(o) if l.group_size == 0 => Ok(GroupLayout::Offsets(o)),
        Some(_) => Err(care_result::CARE_ERR_INVALID_ARGUMENT),
    }
}

/// A length the group functions check: its name, its length and the length it must have,
/// which is either the number of samples or the number of groups.
#[derive(Clone, Copy)]
enum Want {
    /// One per sample (`rewards_len`).
    Samples,
    /// One per group (`B`).
    Groups,
}

/// Describes the fault behind a `CARE_ERR_INVALID_LAYOUT` (the layout against `n` rewards) or
/// `CARE_ERR_LENGTH_MISMATCH` (the first of `lens` that is not its [`Want`]) of a group
/// function; other codes are returned untouched. Returns `code`.
fn explain_groups(
    code: care_result,
    layout: &GroupLayout<'_>,
    n: usize,
    lens: &[(&str, Option<usize>, Want)],
) -> care_result {
    use crate::detail::set_if_empty;
    let offsets = if matches!(layout, GroupLayout::Offsets(_)) {
        "care_group_layout.offsets"
    } else {
        "care_group_layout.group_size"
    };
    if code == care_result::CARE_ERR_INVALID_LAYOUT {
        if let Some(f) = layout.fault(n) {
            set_if_empty(format_args!("{}", f.named(offsets, "care_rewards.rewards")));
        }
    } else if code == care_result::CARE_ERR_LENGTH_MISMATCH {
        let b = layout.validate(n).ok();
        for &(name, len, want) in lens {
            let Some(len) = len else { continue };
            let (must, what) = match (want, b) {
                (Want::Samples, _) => (n, "rewards_len"),
                (Want::Groups, Some(b)) => (b, "the number of groups"),
                (Want::Groups, None) => continue,
            };
            if len != must {
                set_if_empty(format_args!(
                    "{name} is {len} but {what} is {must}; they must be equal"
                ));
                break;
            }
        }
    }
    code
}

/// The checked output slices of a `care_advantage_outputs` struct (stats as the core's type).
///
/// # Safety
/// As for [`args::input`]; the struct's pointers are valid for writes of their lengths.
unsafe fn read_outputs<'a>(
    p: *const care_advantage_outputs,
) -> Result<(&'a mut [f32], Option<&'a mut [GroupStats]>), care_result> {
    // SAFETY (all blocks): forwarded contract; `care_group_stats` is laid out as `GroupStats`
    // (checked at compile time above).
    let o = unsafe { args::input(p) }?;
    let adv = unsafe { args::slice_mut(o.advantages, o.advantages_len) }?;
    let stats = unsafe { args::opt_slice_mut(o.stats.cast::<GroupStats>(), o.stats_len) }?;
    Ok((adv, stats))
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
        let p = tri!(args::enum_arg("preset", preset, &Preset::ALL));
        // SAFETY: checked non-NULL and aligned; valid for a write (contract).
        unsafe { out.write(to_c(&AdvantageOptions::preset(p))) };
        care_result::CARE_OK
    }
}

/// Writes the options of the preset named `(name, name_len)` (the names of
/// `care_advantage_preset`: `"verl"`, `"trl"`, ..., `"reinforce_pp_baseline"`) into
/// `*options_out`.
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
        let p = tri!(Preset::from_name(name).ok_or(care_result::CARE_ERR_INVALID_ARGUMENT));
        // SAFETY: checked non-NULL and aligned; valid for a write (contract).
        unsafe { out.write(to_c(&AdvantageOptions::preset(p))) };
        care_result::CARE_OK
    }
}

/// Group-relative advantages of one batch (single rank, CPU): `rewards` (with their validity),
/// grouped by `layout`, under `options` (NULL: the defaults), into `outputs`.
///
/// ```c
/// care_rewards in = {sizeof in, rewards, 8, NULL, 0};
/// care_group_layout groups = {sizeof groups, 4, NULL, 0};       /* two groups of four */
/// float adv[8];
/// care_advantage_outputs out = {sizeof out, adv, 8, NULL, 0};
/// care_result r = care_group_advantages(&in, &groups, NULL, &out);
/// ```
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_group_advantages(
    rewards: *const care_rewards,
    layout: *const care_group_layout,
    options: *const care_advantage_options,
    outputs: *const care_advantage_outputs,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let inputs = tri!(unsafe { read_group_inputs(rewards, layout) });
        let opts = tri!(unsafe { read_options(options) });
        let (out, stats) = tri!(unsafe { read_outputs(outputs) });
        let lens = [
            ("care_rewards.valid_len", inputs.valid.map(<[u8]>::len), Want::Samples),
            ("care_advantage_outputs.advantages_len", Some(out.len()), Want::Samples),
            ("care_advantage_outputs.stats_len", stats.as_deref().map(<[GroupStats]>::len), Want::Groups),
        ];
        let (layout, n) = (inputs.layout, inputs.rewards.len());
        match care_core::grpo::group_advantages_with(&inputs, &opts, out, stats) {
            Ok(()) => care_result::CARE_OK,
            Err(e) => explain_groups(map_error(e), &layout, n, &lens),
        }
    }
}

/// Cross-rank step 1: this rank's count and sum of valid rewards per group into `sums_out[B]`
/// (all-reduce the `2 * B` doubles with a sum). Arguments as `care_group_advantages`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_group_partial_sums(
    rewards: *const care_rewards,
    layout: *const care_group_layout,
    sums_out: *mut care_group_sums,
    sums_len: usize,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let (rewards, valid) = tri!(unsafe { read_rewards(rewards) });
        let layout = tri!(unsafe { read_layout(layout) });
        let out = tri!(unsafe { args::slice_mut(sums_out.cast::<GroupSums>(), sums_len) });
        let lens = [
            ("care_rewards.valid_len", valid.map(<[u8]>::len), Want::Samples),
            ("sums_len", Some(sums_len), Want::Groups),
        ];
        match care_core::grpo::group_partial_sums(rewards, valid, layout, out) {
            Ok(()) => care_result::CARE_OK,
            Err(e) => explain_groups(map_error(e), &layout, rewards.len(), &lens),
        }
    }
}

/// Cross-rank step 2: centered sums of squares around the reduced (global) group means into
/// `m2_out[B]` (all-reduce with a sum). `sums[B]` are the all-reduced step-1 sums.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_group_partial_squares(
    rewards: *const care_rewards,
    layout: *const care_group_layout,
    sums: *const care_group_sums,
    sums_len: usize,
    m2_out: *mut f64,
    m2_len: usize,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let (rewards, valid) = tri!(unsafe { read_rewards(rewards) });
        let layout = tri!(unsafe { read_layout(layout) });
        let sums = tri!(unsafe { args::slice(sums.cast::<GroupSums>(), sums_len) });
        let out = tri!(unsafe { args::slice_mut(m2_out, m2_len) });
        let lens = [
            ("care_rewards.valid_len", valid.map(<[u8]>::len), Want::Samples),
            ("sums_len", Some(sums_len), Want::Groups),
            ("m2_len", Some(m2_len), Want::Groups),
        ];
        match care_core::grpo::group_partial_squares(rewards, valid, layout, sums, out) {
            Ok(()) => care_result::CARE_OK,
            Err(e) => explain_groups(map_error(e), &layout, rewards.len(), &lens),
        }
    }
}

/// Cross-rank step 3: this rank's advantages from the all-reduced `sums[B]` and `m2[B]`;
/// equal to `care_group_advantages` on the whole batch. Other arguments as there.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_group_advantages_finalize(
    rewards: *const care_rewards,
    layout: *const care_group_layout,
    sums: *const care_group_sums,
    sums_len: usize,
    m2: *const f64,
    m2_len: usize,
    options: *const care_advantage_options,
    outputs: *const care_advantage_outputs,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let inputs = tri!(unsafe { read_group_inputs(rewards, layout) });
        let sums = tri!(unsafe { args::slice(sums.cast::<GroupSums>(), sums_len) });
        let m2 = tri!(unsafe { args::slice(m2, m2_len) });
        let opts = tri!(unsafe { read_options(options) });
        let (out, stats) = tri!(unsafe { read_outputs(outputs) });
        let lens = [
            ("care_rewards.valid_len", inputs.valid.map(<[u8]>::len), Want::Samples),
            ("sums_len", Some(sums_len), Want::Groups),
            ("m2_len", Some(m2_len), Want::Groups),
            ("care_advantage_outputs.advantages_len", Some(out.len()), Want::Samples),
            ("care_advantage_outputs.stats_len", stats.as_deref().map(<[GroupStats]>::len), Want::Groups),
        ];
        let (layout, n) = (inputs.layout, inputs.rewards.len());
        match care_core::grpo::group_advantages_finalize_with(&inputs, sums, m2, &opts, out, stats) {
            Ok(()) => care_result::CARE_OK,
            Err(e) => explain_groups(map_error(e), &layout, n, &lens),
        }
    }
}

/// Broadcasts per-sequence advantages onto tokens: `tokens_out[t] = advantages[seq(t)] *
/// mask[t]`. `seq_offsets[B + 1]` is the CSR token layout (last entry = `tokens_len`);
/// `advantages[B]`; `mask[mask_len]` optional (`mask_len == tokens_len`).
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
        match care_core::grpo::broadcast_to_tokens(adv, offs, mask, out) {
            Ok(()) => care_result::CARE_OK,
            Err(e) => {
                let code = map_error(e);
                let detail = if let Some(f) = care_core::grpo::offsets_fault(offs, tokens_len) {
                    Some(format!("{}", f.named("seq_offsets", "tokens_out")))
                } else if adv.len() != offs.len() - 1 {
                    Some(format!(
                        "advantages_len is {} but there are {} sequences (seq_offsets_len - 1); \
                         they must be equal",
                        adv.len(),
                        offs.len() - 1
                    ))
                } else {
                    mask.filter(|m| m.len() != tokens_len).map(|m| {
                        format!("mask_len is {} but tokens_len is {tokens_len}; they must be equal", m.len())
                    })
                };
                if let Some(d) = detail {
                    crate::detail::set_if_empty(format_args!("{d}"));
                }
                code
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_enum_values_index_the_core_tables() {
        assert_eq!(
            Baseline::ALL[care_baseline::CARE_BASELINE_LEAVE_ONE_OUT as usize],
            Baseline::LeaveOneOut
        );
        assert_eq!(
            Scale::ALL[care_scale::CARE_SCALE_NONE as usize],
            Scale::None
        );
        assert_eq!(
            StdKind::ALL[care_std_kind::CARE_STD_BIASED as usize],
            StdKind::Biased
        );
        assert_eq!(
            SingletonPolicy::ALL[care_singleton_policy::CARE_SINGLETON_ERROR as usize],
            SingletonPolicy::Error
        );
        for (i, p) in Preset::ALL.iter().enumerate() {
            assert_eq!(*p as usize, i, "Preset::ALL is indexed by the C enum value");
        }
        assert_eq!(
            Preset::ALL[care_advantage_preset::CARE_ADVANTAGE_PRESET_RLOO as usize],
            Preset::Rloo
        );
        for b in Baseline::ALL {
            assert_eq!(Baseline::ALL[b as usize], b);
        }
        for s in Scale::ALL {
            assert_eq!(Scale::ALL[s as usize], s);
        }
        for s in SingletonPolicy::ALL {
            assert_eq!(SingletonPolicy::ALL[s as usize], s);
        }
        for r in Reweight::ALL {
            assert_eq!(Reweight::ALL[r as usize], r);
        }
        // Every core value has its C name: the last constant of each enum is the last value.
        assert_eq!(
            Baseline::ALL[Baseline::ALL.len() - 1] as u32,
            care_baseline::CARE_BASELINE_PASS_K as u32
        );
        assert_eq!(
            Preset::ALL[Preset::ALL.len() - 1] as u32,
            care_advantage_preset::CARE_ADVANTAGE_PRESET_VERL_GPG as u32
        );
        assert_eq!(
            Reweight::ALL[Reweight::ALL.len() - 1] as u32,
            care_reweight::CARE_REWEIGHT_NONZERO as u32
        );
    }

    #[test]
    fn options_round_trip_through_the_c_struct() {
        for p in Preset::ALL {
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
