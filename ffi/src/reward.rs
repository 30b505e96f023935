//! Rewards (SPEC §5-8): the policy reward of one response and of a GRPO group, the preference,
//! alignment and generator rewards, strategy counts, judge prompt rendering and judge output
//! parsing.

use core::ffi::c_char;
use core::mem::size_of;

use care_core::reward::Fired;
use care_core::strategy::UnknownLabelPolicy;
use care_core::{
    GeneratorOptions, MissingPolicy, PreferenceOptions, RangePolicy, ScoreOptions, ScoreScale,
    StrategyCounts,
};

use crate::args::{self, Out};
use crate::handle;
use crate::result::{care_result, map_error};
use crate::rubric::{self, care_format_policy, care_rubric};

/// What to do when a criterion has no score (a NaN score).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum care_missing_policy {
    /// Fail with `CARE_ERR_MISSING_SCORE` (default).
    CARE_MISSING_ERROR = 0,
    /// Score it 0.
    CARE_MISSING_ZERO = 1,
    /// Drop it from its dimension's mean.
    CARE_MISSING_SKIP = 2,
}

/// What to do with a score outside `0..=5` or not an integer.
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum care_range_policy {
    /// Fail with `CARE_ERR_SCORE_OUT_OF_RANGE` (default).
    CARE_RANGE_ERROR = 0,
    /// Round to the nearest integer, then clamp to `0..=5`.
    CARE_RANGE_CLAMP = 1,
}

/// The score scale of the preference reward.
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum care_score_scale {
    /// Differences of normalized scores `raw / 5` (default).
    CARE_SCORE_SCALE_NORMALIZED = 0,
    /// Differences of raw `0..=5` scores.
    CARE_SCORE_SCALE_RAW = 1,
}

/// What to do with a strategy label that maps to no dimension.
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum care_unknown_label_policy {
    /// Fail with `CARE_ERR_UNKNOWN_LABEL` (default).
    CARE_UNKNOWN_LABEL_ERROR = 0,
    /// Skip it (counted in `care_strategy_counts.unknown`).
    CARE_UNKNOWN_LABEL_IGNORE = 1,
}

/// Score policies shared by every score-based reward. Initialize with
/// `care_score_options_default`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_score_options {
    /// `sizeof(care_score_options)`.
    pub struct_size: u32,
    /// A `care_missing_policy`.
    pub missing: u32,
    /// A `care_range_policy`.
    pub out_of_range: u32,
    /// 1: ignore the rubric's weights and use 1/3 each (paper Table 3 ablation); 0: use them.
    pub uniform_weights: u32,
}

/// Options of the preference reward. Initialize with `care_preference_options_default`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_preference_options {
    /// `sizeof(care_preference_options)`.
    pub struct_size: u32,
    /// A `care_score_scale`.
    pub scale: u32,
    /// Temperature `tau > 0` (0.7).
    pub tau: f64,
}

/// Options of the generator reward. Initialize with `care_generator_options_default`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_generator_options {
    /// `sizeof(care_generator_options)`.
    pub struct_size: u32,
    /// A `care_unknown_label_policy` for the chosen tactics.
    pub unknown_labels: u32,
    /// Weight of `r_align` (0.1).
    pub lambda: f64,
    /// Weight of `r_fmt` (0.3).
    pub gamma: f64,
}

/// Which score policies fired (no silent defaults).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct care_fired {
    /// Missing scores replaced by 0.
    pub missing_zeroed: u32,
    /// Missing scores dropped.
    pub missing_skipped: u32,
    /// Scores rounded and/or clamped.
    pub clamped: u32,
    /// 1 when the stored weights were off the simplex and were normalized.
    pub weights_adjusted: u32,
    /// 1 when uniform weights were used.
    pub uniform_weights: u32,
}

/// The details behind a policy or preference reward.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_reward_detail {
    /// Per-dimension mean term (Cog, Aff, Pro); 0 for a dimension with no scored criterion.
    pub dim_means: [f64; 3],
    /// The weights used (on the simplex).
    pub weights: [f64; 3],
    /// Which policies fired.
    pub fired: care_fired,
}

/// What happened while scoring the responses of `care_policy_reward_group`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_group_report {
    /// Responses with a finite reward.
    pub scored: u32,
    /// Responses that got a NaN reward because a score broke an `error` policy.
    pub failed: u32,
    /// Index of the first failed response, or -1.
    pub first_error_index: i64,
    /// The `care_result` of the first failure, or `CARE_OK`.
    pub first_error_code: u32,
    /// Policies fired, summed over the batch.
    pub fired: care_fired,
}

/// Per-dimension counts of a tactic set.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct care_strategy_counts {
    /// Distinct known labels per dimension (Cog, Aff, Pro).
    pub counts: [u32; 3],
    /// Labels skipped because they are unknown (policy ignore).
    pub unknown: u32,
    /// Labels skipped because they repeat an earlier one.
    pub duplicates: u32,
}

/// The generator reward and its parts.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_generator_result {
    /// `r_phi = r_pref + lambda * r_align + gamma * r_fmt`.
    pub reward: f64,
    /// Preference reward on the parsed rubric (0 when it did not parse).
    pub r_pref: f64,
    /// Alignment reward on the parsed rubric (0 when it did not parse).
    pub r_align: f64,
    /// 1.0 when the text passes the format contract, else 0.0.
    pub r_fmt: f64,
    /// 1 when the rubric parsed at all.
    pub parsed: u32,
    /// Number of format violations found (capped at 64).
    pub violations: u32,
    /// 1 when alignment violation T (top) occurred.
    pub top_violation: u32,
    /// Number of alignment violations Z (zero).
    pub zero_violations: u32,
    /// Strategy counts of the chosen tactics.
    pub counts: care_strategy_counts,
    /// Policies fired while computing `r_pref`.
    pub fired: care_fired,
}

/// What the judge-output parser found.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct care_judge_report {
    /// Criteria that received a score.
    pub matched: u32,
    /// Of those, matched only ASCII-case-insensitively.
    pub case_insensitive: u32,
    /// Rubric criteria without a score (NaN in the output).
    pub missing: u32,
    /// Items naming an already scored criterion (the first score is kept).
    pub duplicates: u32,
    /// Items naming no criterion of the rubric.
    pub unknown: u32,
    /// Items whose score is not a number or numeric string.
    pub invalid_scores: u32,
    /// Matched scores that are non-integral or outside `0..=5` (passed through).
    pub out_of_range: u32,
    /// Items that are not objects or lack a key.
    pub malformed_items: u32,
}

/// The raw scores of a chosen and a rejected response under one rubric (the inputs of
/// `care_preference_reward`): two flat arrays of `care_rubric_total_criteria` scores each.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_preference_pair {
    /// `sizeof(care_preference_pair)`.
    pub struct_size: u32,
    /// Scores of the chosen response (`0..=5`, NaN = missing).
    pub chosen: *const f64,
    /// Length of `chosen`.
    pub chosen_len: usize,
    /// Scores of the rejected response; `rejected_len == chosen_len`.
    pub rejected: *const f64,
    /// Length of `rejected`.
    pub rejected_len: usize,
}

/// The inputs of `care_generator_reward`: the generated rubric text, the judge scores of a
/// chosen and a rejected response under it, and the chosen response's tactic labels.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_generator_inputs {
    /// `sizeof(care_generator_inputs)`.
    pub struct_size: u32,
    /// Rubric JSON (UTF-8 expected; not NUL-terminated).
    pub text: *const c_char,
    /// Bytes of `text`.
    pub text_len: usize,
    /// Scores of the chosen response over the parsed rubric's criteria.
    pub chosen: *const f64,
    /// Length of `chosen`.
    pub chosen_len: usize,
    /// Scores of the rejected response.
    pub rejected: *const f64,
    /// Length of `rejected`.
    pub rejected_len: usize,
    /// `label_count` tactic labels (UTF-8, not NUL-terminated), or (NULL, 0) for none.
    pub labels: *const *const c_char,
    /// Byte length of each label.
    pub label_lens: *const usize,
    /// Number of labels.
    pub label_count: usize,
}

/// The inputs of `care_judge_prompt_render`: the dialogue so far, the seeker's latest turn and
/// the candidate response (all UTF-8, not NUL-terminated).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_judge_prompt_inputs {
    /// `sizeof(care_judge_prompt_inputs)`.
    pub struct_size: u32,
    /// `context_count` earlier dialogue lines, or (NULL, 0) for none.
    pub context: *const *const c_char,
    /// Byte length of each context line.
    pub context_lens: *const usize,
    /// Number of context lines.
    pub context_count: usize,
    /// The seeker's latest turn.
    pub seeker_turn: *const c_char,
    /// Bytes of `seeker_turn`.
    pub seeker_turn_len: usize,
    /// The candidate response to be judged.
    pub response: *const c_char,
    /// Bytes of `response`.
    pub response_len: usize,
}

/// The C value of a core enum variant: its position in the core's `ALL` (which holds every
/// variant, so the fallback is never taken).
fn index_of<T: PartialEq>(table: &[T], v: &T) -> u32 {
    table.iter().position(|t| t == v).unwrap_or(0) as u32
}

fn score_to_c(o: &ScoreOptions) -> care_score_options {
    care_score_options {
        struct_size: size_of::<care_score_options>() as u32,
        missing: index_of(&MissingPolicy::ALL, &o.missing),
        out_of_range: index_of(&RangePolicy::ALL, &o.out_of_range),
        uniform_weights: u32::from(o.uniform_weights),
    }
}

fn pref_to_c(o: &PreferenceOptions) -> care_preference_options {
    care_preference_options {
        struct_size: size_of::<care_preference_options>() as u32,
        scale: index_of(&ScoreScale::ALL, &o.scale),
        tau: o.tau,
    }
}

fn generator_to_c(o: &GeneratorOptions) -> care_generator_options {
    care_generator_options {
        struct_size: size_of::<care_generator_options>() as u32,
        unknown_labels: index_of(&UnknownLabelPolicy::ALL, &o.labels),
        lambda: o.lambda,
        gamma: o.gamma,
    }
}

/// # Safety
/// As for [`args::options`].
pub(crate) unsafe fn read_score(p: *const care_score_options) -> Result<ScoreOptions, care_result> {
    // SAFETY: forwarded contract.
    let c = unsafe { args::options(p, score_to_c(&ScoreOptions::default())) }?;
    let o = ScoreOptions {
        missing: args::enum_arg("care_score_options.missing", c.missing, &MissingPolicy::ALL)?,
        out_of_range: args::enum_arg(
            "care_score_options.out_of_range",
            c.out_of_range,
            &RangePolicy::ALL,
        )?,
        uniform_weights: args::flag("care_score_options.uniform_weights", c.uniform_weights)?,
    };
    args::option_check("care_score_options", o.check())?;
    Ok(o)
}

/// # Safety
/// As for [`args::options`].
unsafe fn read_pref(p: *const care_preference_options) -> Result<PreferenceOptions, care_result> {
    // SAFETY: forwarded contract.
    let c = unsafe { args::options(p, pref_to_c(&PreferenceOptions::PAPER)) }?;
    let o = PreferenceOptions {
        tau: c.tau,
        scale: args::enum_arg("care_preference_options.scale", c.scale, &ScoreScale::ALL)?,
    };
    args::option_check("care_preference_options", o.check())?;
    Ok(o)
}

/// The optional detail output of the policy and preference rewards.
fn reward_detail(dim_means: [f64; 3], weights: [f64; 3], fired: &Fired) -> care_reward_detail {
    care_reward_detail {
        dim_means,
        weights,
        fired: fired_to_c(fired),
    }
}

pub(crate) fn fired_to_c(f: &Fired) -> care_fired {
    care_fired {
        missing_zeroed: f.missing_zeroed,
        missing_skipped: f.missing_skipped,
        clamped: f.clamped,
        weights_adjusted: u32::from(f.weights_adjusted),
        uniform_weights: u32::from(f.uniform_weights),
    }
}

fn counts_to_c(c: &StrategyCounts) -> care_strategy_counts {
    care_strategy_counts {
        counts: c.counts,
        unknown: c.unknown,
        duplicates: c.duplicates,
    }
}

/// The labels of a `(const char *const *labels, const size_t *lens, size_t count)` triple.
///
/// # Safety
/// `labels` and `lens` are `(NULL, 0)` or point to `count` entries; each label points to
/// `lens[i]` bytes.
pub(crate) unsafe fn read_labels<'a>(
    labels: *const *const c_char,
    lens: *const usize,
    count: usize,
) -> Result<Vec<&'a str>, care_result> {
    // SAFETY (both blocks): forwarded contract.
    let ptrs = unsafe { args::slice(labels, count) }?;
    let lens = unsafe { args::slice(lens, count) }?;
    ptrs.iter()
        .zip(lens)
        .map(|(&p, &n)| unsafe { args::text(p, n) })
        .collect()
}

/// Writes the default score policies (missing: error, out of range: error, stored weights).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_score_options_default(
    options_out: *mut care_score_options,
) -> care_result {
    ffi_panic_boundary! {
        let out = tri!(Out::new(options_out));
        // SAFETY: checked non-NULL and aligned; valid for a write (contract).
        unsafe { out.write(score_to_c(&ScoreOptions::default())) };
        care_result::CARE_OK
    }
}

/// Writes the paper's preference options (`tau = 0.7`, normalized scores).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_preference_options_default(
    options_out: *mut care_preference_options,
) -> care_result {
    ffi_panic_boundary! {
        let out = tri!(Out::new(options_out));
        // SAFETY: checked non-NULL and aligned; valid for a write (contract).
        unsafe { out.write(pref_to_c(&PreferenceOptions::PAPER)) };
        care_result::CARE_OK
    }
}

/// Writes the paper's generator options (`lambda = 0.1`, `gamma = 0.3`, unknown labels: error).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_generator_options_default(
    options_out: *mut care_generator_options,
) -> care_result {
    ffi_panic_boundary! {
        let out = tri!(Out::new(options_out));
        // SAFETY: checked non-NULL and aligned; valid for a write (contract).
        unsafe { out.write(generator_to_c(&GeneratorOptions::PAPER)) };
        care_result::CARE_OK
    }
}

/// The policy reward (paper Eq. 5) of one response: `scores[scores_len]` are raw judge scores
/// (`0..=5`, NaN = missing) in flat rubric order (`scores_len == care_rubric_total_criteria`).
/// Writes `*reward_out` and, if not NULL, `*detail_out`. `options` NULL: defaults.
///
/// ```c
/// double scores[6] = {4, 5, 4, 5, 5, 5}, reward;
/// care_result r = care_policy_reward(rubric, scores, 6, NULL, &reward, NULL);
/// ```
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_policy_reward(
    rubric: *const care_rubric,
    scores: *const f64,
    scores_len: usize,
    options: *const care_score_options,
    reward_out: *mut f64,
    detail_out: *mut care_reward_detail,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let r = tri!(handle::get(rubric));
        let scores = tri!(unsafe { args::slice(scores, scores_len) });
        let opts = tri!(unsafe { read_score(options) });
        let out = tri!(Out::new(reward_out));
        let detail = tri!(Out::optional(detail_out));
        let p = match care_core::reward::policy_reward_fixed(r.weights, r.counts, scores, &opts) {
            Ok(p) => p,
            Err(e) => return score_error(e, "scores", scores, r.counts),
        };
        unsafe { out.write(p.reward) };
        if let Some(d) = detail {
            unsafe { d.write(reward_detail(p.dim_means, p.weights, &p.fired)) };
        }
        care_result::CARE_OK
    }
}

/// The policy reward of the `rewards_len` responses of one GRPO group (or of a whole batch)
/// under one rubric. `scores` is response-major: response `j`'s scores are
/// `scores[j * total .. (j + 1) * total]` (`scores_len == rewards_len * total`, else
/// `CARE_ERR_LENGTH_MISMATCH`). A response that breaks an `error` policy gets a NaN reward
/// (an invalid sample for the advantage functions) and is counted in `*report_out` (optional);
/// the call itself succeeds. Safe to call from many threads on one shared rubric.
///
/// ```c
/// double rewards[G];
/// care_group_report rep;
/// care_result r = care_policy_reward_group(rubric, scores, G * total, NULL, rewards, G, &rep);
/// ```
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_policy_reward_group(
    rubric: *const care_rubric,
    scores: *const f64,
    scores_len: usize,
    options: *const care_score_options,
    rewards_out: *mut f64,
    rewards_len: usize,
    report_out: *mut care_group_report,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let r = tri!(handle::get(rubric));
        let scores = tri!(unsafe { args::slice(scores, scores_len) });
        let opts = tri!(unsafe { read_score(options) });
        let report = tri!(Out::optional(report_out));
        let out = tri!(unsafe { args::slice_mut(rewards_out, rewards_len) });
        // Checked here, before the core writes `out`, so that outputs stay untouched on error.
        let per_response: usize = r.counts.iter().sum();
        if rewards_len.checked_mul(per_response) != Some(scores.len()) {
            return crate::detail::fail(
                care_result::CARE_ERR_LENGTH_MISMATCH,
                format_args!(
                    "scores_len is {} but rewards_len {rewards_len} responses times the \
                     rubric's {per_response} criteria is {}; the scores are one row of \
                     {per_response} per response",
                    scores.len(),
                    rewards_len.saturating_mul(per_response)
                ),
            );
        }
        let g = match care_core::batch::policy_reward_group_fixed(r.weights, r.counts, &opts, scores, out) {
            Ok(g) => g,
            Err(e) => return map_error(e),
        };
        if let Some(rep) = report {
            let (idx, code) = match g.first_error {
                Some((i, e)) => (i64::try_from(i).unwrap_or(i64::MAX), map_error(e)),
                None => (-1, care_result::CARE_OK),
            };
            let c = care_group_report {
                scored: g.scored,
                failed: g.failed,
                first_error_index: idx,
                first_error_code: code as u32,
                fired: fired_to_c(&g.fired),
            };
            unsafe { rep.write(c) };
        }
        care_result::CARE_OK
    }
}

/// The preference reward (paper Eq. 3) of the chosen over the rejected response of `pair`
/// under one rubric (both flat score arrays of `care_rubric_total_criteria` raw scores).
/// Antisymmetric. `score_options` / `preference_options` NULL: defaults (`tau = 0.7`).
///
/// ```c
/// care_preference_pair pair = {sizeof pair, chosen, total, rejected, total};
/// double reward;
/// care_result r = care_preference_reward(rubric, &pair, NULL, NULL, &reward, NULL);
/// ```
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_preference_reward(
    rubric: *const care_rubric,
    pair: *const care_preference_pair,
    score_options: *const care_score_options,
    preference_options: *const care_preference_options,
    reward_out: *mut f64,
    detail_out: *mut care_reward_detail,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let r = tri!(handle::get(rubric));
        let pair = tri!(unsafe { args::input(pair) });
        let chosen = tri!(unsafe { args::slice(pair.chosen, pair.chosen_len) });
        let rejected = tri!(unsafe { args::slice(pair.rejected, pair.rejected_len) });
        if chosen.len() != rejected.len() {
            return args::mismatch(
                "care_preference_pair.chosen_len",
                chosen.len(),
                "rejected_len",
                rejected.len(),
            );
        }
        let score = tri!(unsafe { read_score(score_options) });
        let pref = tri!(unsafe { read_pref(preference_options) });
        let out = tri!(Out::new(reward_out));
        let detail = tri!(Out::optional(detail_out));
        let p = match care_core::reward::preference_reward_fixed(
            r.weights, r.counts, chosen, rejected, &score, &pref,
        ) {
            Ok(p) => p,
            Err(e) => {
                // The two arrays have one length (checked above): name the one at fault.
                let (what, scores) = if first_score_fault(e, chosen).is_none()
                    && first_score_fault(e, rejected).is_some()
                {
                    ("care_preference_pair.rejected", rejected)
                } else {
                    ("care_preference_pair.chosen", chosen)
                };
                return score_error(e, what, scores, r.counts);
            }
        };
        unsafe { out.write(p.reward) };
        if let Some(d) = detail {
            unsafe { d.write(reward_detail(p.dim_means, p.weights, &p.fired)) };
        }
        care_result::CARE_OK
    }
}

/// The index and value of the first score in `scores` that raises `e` under the `error`
/// policies (`MissingScore`: a NaN; `ScoreOutOfRange`: not an integer in `0..=5`).
fn first_score_fault(e: care_core::Error, scores: &[f64]) -> Option<(usize, f64)> {
    let bad = |x: f64| match e {
        care_core::Error::MissingScore => x.is_nan(),
        care_core::Error::ScoreOutOfRange => {
            let integer_in_range = (0.0..=5.0).contains(&x) && x.round() == x;
            !x.is_nan() && !integer_in_range
        }
        _ => false,
    };
    scores.iter().copied().enumerate().find(|&(_, x)| bad(x))
}

/// The detail of `CARE_ERR_SCORE_SHAPE`: both sizes, from the length alone (a wrong length is
/// refused before anything is sized by it).
fn shape_detail(what: &str, len: usize, [c, a, p]: [usize; 3]) {
    crate::detail::set_if_empty(format_args!(
        "{what}_len is {len} but the rubric has {} criteria ({c} Cognitive, {a} Affective, \
         {p} Proactive); pass one raw score per criterion, in the order of \
         care_rubric_criterion",
        c.saturating_add(a).saturating_add(p)
    ));
}

/// The code of a scoring error of the core, with a detail that names the array (`what`) and
/// says what to fix: both sizes when the scores do not fit the rubric, the first missing or
/// out-of-range score and the policy that refused it.
fn score_error(e: care_core::Error, what: &str, scores: &[f64], counts: [usize; 3]) -> care_result {
    use care_core::Error;
    match e {
        Error::ScoreShape => shape_detail(what, scores.len(), counts),
        Error::MissingScore => {
            if let Some((i, _)) = first_score_fault(e, scores) {
                crate::detail::set_if_empty(format_args!(
                    "{what}[{i}] is NaN (no score) and care_score_options.missing is \
                     CARE_MISSING_ERROR; give a score, or choose CARE_MISSING_ZERO or \
                     CARE_MISSING_SKIP"
                ));
            }
        }
        Error::ScoreOutOfRange => {
            if let Some((i, x)) = first_score_fault(e, scores) {
                crate::detail::set_if_empty(format_args!(
                    "{what}[{i}] is {x}, not an integer in 0..=5, and \
                     care_score_options.out_of_range is CARE_RANGE_ERROR; pass raw 0..5 judge \
                     scores, or choose CARE_RANGE_CLAMP"
                ));
            }
        }
        _ => {}
    }
    map_error(e)
}

/// Counts strategy labels per dimension (paper Eq. 2; ESConv and MINT labels, trimmed and
/// case-insensitive, `[Question]` accepted, a repeated label counted once) into the
/// `care_strategy_counts` at `*counts_out`. Labels are `count` UTF-8 strings given as
/// `labels[i]` with byte length `label_lens[i]`; `unknown_policy` is a
/// `care_unknown_label_policy`.
///
/// ```c
/// const char *labels[] = {"Question", "Affirmation and Reassurance"};
/// size_t lens[] = {8, 27};
/// care_strategy_counts c;
/// care_strategy_counts_from_labels(labels, lens, 2, CARE_UNKNOWN_LABEL_ERROR, &c);
/// ```
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_strategy_counts_from_labels(
    labels: *const *const c_char,
    label_lens: *const usize,
    count: usize,
    unknown_policy: u32,
    counts_out: *mut care_strategy_counts,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY: forwarded contract.
        let labels = tri!(unsafe { read_labels(labels, label_lens, count) });
        let policy = tri!(args::enum_arg("unknown_policy", unknown_policy, &UnknownLabelPolicy::ALL));
        let out = tri!(Out::new(counts_out));
        let c = match care_core::strategy_counts(&labels, policy) {
            Ok(c) => c,
            Err(e) => return map_error(e),
        };
        // SAFETY: checked non-NULL and aligned; valid for a write (contract).
        unsafe { out.write(counts_to_c(&c)) };
        care_result::CARE_OK
    }
}

/// The alignment reward `r_align` (SPEC §6) of weights `weights[3]` (normalized as for scoring)
/// and strategy counts `counts[3]`: 0, 0.5 or 1 into `*reward_out`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_alignment_reward(
    weights: *const f64,
    weights_len: usize,
    counts: *const u32,
    counts_len: usize,
    reward_out: *mut f64,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (both blocks): forwarded contract.
        let w = tri!(unsafe { args::slice(weights, weights_len) });
        let n = tri!(unsafe { args::slice(counts, counts_len) });
        let out = tri!(Out::new(reward_out));
        let (Ok(w), Ok(n)) = (<[f64; 3]>::try_from(w), <[u32; 3]>::try_from(n)) else {
            return crate::detail::fail(
                care_result::CARE_ERR_LENGTH_MISMATCH,
                format_args!(
                    "weights_len is {weights_len} and counts_len is {counts_len}; both must be \
                     3 (cognitive, affective, proactive)"
                ),
            );
        };
        // SAFETY: checked non-NULL and aligned; valid for a write (contract).
        unsafe { out.write(care_core::alignment_reward(w, n)) };
        care_result::CARE_OK
    }
}

/// The generator reward (paper Eq. 4) of rubric text: validates `inputs->text` under `policy`,
/// then `r_pref` of `inputs->chosen` over `inputs->rejected` scores (flat arrays over the parsed
/// rubric's criteria; ignored when it does not parse), `r_align` of the chosen response's
/// tactic labels, and `r_fmt`. Every options pointer may be NULL (paper defaults).
///
/// ```c
/// care_generator_inputs in = {sizeof in, json, json_len, chosen, total, rejected, total,
///                             labels, lens, 2};
/// care_generator_result g;
/// care_result r = care_generator_reward(&in, NULL, NULL, NULL, NULL, &g);
/// ```
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_generator_reward(
    inputs: *const care_generator_inputs,
    policy: *const care_format_policy,
    score_options: *const care_score_options,
    preference_options: *const care_preference_options,
    generator_options: *const care_generator_options,
    result_out: *mut care_generator_result,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let i = tri!(unsafe { args::input(inputs) });
        let text = tri!(unsafe { args::slice(i.text.cast::<u8>(), i.text_len) });
        let chosen = tri!(unsafe { args::slice(i.chosen, i.chosen_len) });
        let rejected = tri!(unsafe { args::slice(i.rejected, i.rejected_len) });
        let labels = tri!(unsafe { read_labels(i.labels, i.label_lens, i.label_count) });
        let format = tri!(unsafe { rubric::read_policy(policy) });
        let score = tri!(unsafe { read_score(score_options) });
        let pref = tri!(unsafe { read_pref(preference_options) });
        let g = tri!(unsafe {
            args::options(generator_options, generator_to_c(&GeneratorOptions::PAPER))
        });
        let out = tri!(Out::new(result_out));
        let opts = GeneratorOptions {
            lambda: g.lambda,
            gamma: g.gamma,
            preference: pref,
            score,
            format,
            labels: tri!(args::enum_arg("care_generator_options.unknown_labels", g.unknown_labels, &UnknownLabelPolicy::ALL)),
        };
        tri!(args::option_check("care_generator_options", opts.check()));
        let mut scratch = tri!(args::working("the rubric text's scratch", text.len(), 0u8));
        let r = match care_core::generator_reward(
            text, &mut scratch, chosen, rejected, &labels, &opts,
        ) {
            Ok(r) => r,
            Err(e) => return map_error(e),
        };
        let c = care_generator_result {
            reward: r.reward,
            r_pref: r.r_pref,
            r_align: r.r_align,
            r_fmt: r.r_fmt,
            parsed: u32::from(r.parsed),
            violations: r.violations,
            top_violation: u32::from(r.alignment.top_violation),
            zero_violations: r.alignment.zero_violations,
            counts: counts_to_c(&r.counts),
            fired: fired_to_c(&r.fired),
        };
        unsafe { out.write(c) };
        care_result::CARE_OK
    }
}

/// Renders the rubric-conditioned judge prompt for `inputs` (dialogue context lines, the
/// seeker's latest turn, the candidate response; then every criterion with its anchors and the
/// output shape) into `(buf, buf_len)` (UTF-8, not NUL-terminated) and its length into
/// `*len_out`. When the buffer is too small, nothing is copied, `*len_out` receives the size
/// needed and the result is `CARE_ERR_BUFFER_TOO_SMALL`; pass `(NULL, 0)` to ask for the size
/// first.
///
/// ```c
/// care_judge_prompt_inputs in = {sizeof in, ctx, ctx_lens, n_ctx, seeker, seeker_len,
///                                resp, resp_len};
/// size_t need = 0;
/// care_judge_prompt_render(rubric, &in, NULL, 0, &need);   /* CARE_ERR_BUFFER_TOO_SMALL */
/// char *prompt = malloc(need);
/// care_judge_prompt_render(rubric, &in, prompt, need, &need);
/// ```
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_judge_prompt_render(
    rubric: *const care_rubric,
    inputs: *const care_judge_prompt_inputs,
    buf: *mut c_char,
    buf_len: usize,
    len_out: *mut usize,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let r = tri!(handle::get(rubric));
        let i = tri!(unsafe { args::input(inputs) });
        let context = tri!(unsafe { read_labels(i.context, i.context_lens, i.context_count) });
        let seeker = tri!(unsafe { args::text(i.seeker_turn, i.seeker_turn_len) });
        let response = tri!(unsafe { args::text(i.response, i.response_len) });
        let mut prompt = String::new();
        let view = r.buf.rubric();
        if care_core::render_judge_prompt(&mut prompt, &view, &context, seeker, response).is_err() {
            return care_result::CARE_ERR_INTERNAL;
        }
        unsafe { args::write_bytes(prompt.as_bytes(), buf, buf_len, len_out) }
    }
}

/// Parses a judge's answer into raw scores in flat rubric order: `scores_out[scores_len]` with
/// `scores_len == care_rubric_total_criteria` (`CARE_ERR_SCORE_SHAPE` otherwise), NaN where the
/// judge gave no usable score; `*report_out` (optional) says what was matched. Lenient about
/// the envelope (think blocks, code fences, prose), strict about the content.
/// Errors: `CARE_ERR_NO_JUDGE_JSON`, `CARE_ERR_INVALID_UTF8`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_judge_output_parse(
    rubric: *const care_rubric,
    text: *const c_char,
    text_len: usize,
    scores_out: *mut f64,
    scores_len: usize,
    report_out: *mut care_judge_report,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let r = tri!(handle::get(rubric));
        let text = tri!(unsafe { args::slice(text.cast::<u8>(), text_len) });
        let report = tri!(Out::optional(report_out));
        let view = r.buf.rubric();
        // The length is checked before anything is sized by it: a wrong `scores_len` (however
        // large) is `CARE_ERR_SCORE_SHAPE` without an allocation.
        if scores_len != view.total_criteria() {
            shape_detail("scores", scores_len, r.counts);
            return care_result::CARE_ERR_SCORE_SHAPE;
        }
        let out = tri!(unsafe { args::slice_mut(scores_out, scores_len) });
        // Parse into a local buffer (on the stack: a rubric has at most MAX_TOTAL_CRITERIA
        // criteria): the core fills its output with NaN even when it then fails, and outputs
        // are only written on success.
        let mut local = [f64::NAN; care_core::rubric::MAX_TOTAL_CRITERIA];
        let Some(scores) = local.get_mut(..scores_len) else {
            return care_result::CARE_ERR_SCORE_SHAPE;
        };
        let rep = match care_core::parse_judge_output(text, &view, scores) {
            Ok(rep) => rep,
            Err(e) => {
                if e == care_core::Error::NoJudgeJson {
                    crate::detail::set_if_empty(format_args!(
                        "the judge answer ({text_len} bytes) holds no JSON object with \
                         \"criterion_scores\" (think blocks, code fences and prose around it are \
                         skipped); ask the judge again, quoting the expected format"
                    ));
                    return map_error(e);
                }
                return score_error(e, "scores", scores, r.counts);
            }
        };
        out.copy_from_slice(scores);
        if let Some(o) = report {
            unsafe { o.write(judge_report_to_c(&rep)) };
        }
        care_result::CARE_OK
    }
}

pub(crate) fn judge_report_to_c(rep: &care_core::JudgeReport) -> care_judge_report {
    care_judge_report {
        matched: rep.matched,
        case_insensitive: rep.case_insensitive,
        missing: rep.missing,
        duplicates: rep.duplicates,
        unknown: rep.unknown,
        invalid_scores: rep.invalid_scores,
        out_of_range: rep.out_of_range,
        malformed_items: rep.malformed_items,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_enum_values_index_the_core_tables() {
        assert_eq!(
            MissingPolicy::ALL[care_missing_policy::CARE_MISSING_SKIP as usize],
            MissingPolicy::Skip
        );
        assert_eq!(
            MissingPolicy::ALL[care_missing_policy::CARE_MISSING_ZERO as usize],
            MissingPolicy::Zero
        );
        assert_eq!(
            RangePolicy::ALL[care_range_policy::CARE_RANGE_CLAMP as usize],
            RangePolicy::Clamp
        );
        assert_eq!(
            ScoreScale::ALL[care_score_scale::CARE_SCORE_SCALE_RAW as usize],
            ScoreScale::Raw
        );
        assert_eq!(
            UnknownLabelPolicy::ALL[care_unknown_label_policy::CARE_UNKNOWN_LABEL_IGNORE as usize],
            UnknownLabelPolicy::Ignore
        );
    }

    #[test]
    fn options_round_trip_through_the_c_structs() {
        let s = ScoreOptions {
            missing: MissingPolicy::Skip,
            out_of_range: RangePolicy::Clamp,
            uniform_weights: true,
        };
        // SAFETY: pointers to live, fully initialized structs.
        unsafe {
            assert_eq!(read_score(&score_to_c(&s)), Ok(s));
            assert_eq!(read_score(core::ptr::null()), Ok(ScoreOptions::default()));
            let p = PreferenceOptions {
                tau: 0.5,
                scale: ScoreScale::Raw,
            };
            assert_eq!(read_pref(&pref_to_c(&p)), Ok(p));
        }
    }
}
