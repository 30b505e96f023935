//! Rubric profiles (`docs/PROFILES.md`): a profile handle (built in by name, or parsed from
//! JSON with a report of every violation), the output-format check with the spans as offsets
//! into the caller's buffer, the reward of one response and of a GRPO group, and the profile's
//! judge prompt and judge-output parser.

use core::ffi::c_char;
use core::fmt::Write as _;

use care_core::ScoreOptions;
use care_core::profile::{
    self, MAX_DIMENSIONS, MAX_OUTPUT_VIOLATIONS, MAX_SPANS, OutputCheck, Profile, ProfileBuf,
    ProfileCode, ProfilePath, ProfileReport, ProfileReward, RubricSource,
};

use crate::args::{self, Out};
use crate::handle;
use crate::result::{care_result, map_error};
use crate::reward::{
    self, care_fired, care_judge_prompt_inputs, care_judge_report, care_score_options,
};
use crate::rubric::{RubricHandle, care_rubric};

/// Most dimensions of a profile (the length of the per-dimension arrays).
pub const CARE_PROFILE_MAX_DIMENSIONS: usize = 8;
/// Most output spans of a profile.
pub const CARE_PROFILE_MAX_SPANS: usize = 8;
/// Most violations a `care_output_check` holds (more set `overflowed`).
pub const CARE_OUTPUT_MAX_VIOLATIONS: usize = 32;

const _: () = assert!(CARE_PROFILE_MAX_DIMENSIONS == MAX_DIMENSIONS);
const _: () = assert!(CARE_PROFILE_MAX_SPANS == MAX_SPANS);
const _: () = assert!(CARE_OUTPUT_MAX_VIOLATIONS == MAX_OUTPUT_VIOLATIONS);

/// A parsed, valid rubric profile: immutable and safe to share across threads.
///
/// Lifetime: `care_profile_builtin` and `care_profile_parse` return a new handle;
/// `care_profile_clone` returns another handle to the same profile; every handle is released
/// exactly once with `care_profile_free`, and the profile is freed with its last handle (after
/// any call using it has returned). A use after free (from any thread, even while a clone is
/// alive), a double free or a handle of another type is detected: `CARE_ERR_INVALID_HANDLE`.
/// Strings borrowed from a profile (`care_profile_name`, `care_profile_dimension`,
/// `care_profile_span_name`) stay valid while any handle to it is alive.
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub struct care_profile {
    _private: [u8; 0],
}

handle_type!(care_profile => ProfileBuf, 3);

/// The report of a profile validation: every violation of the profile schema with its code,
/// where it is and a message that says what to fix.
///
/// Lifetime: owned by the caller who got it from `care_profile_validate`, released exactly once
/// with `care_profile_report_free`; immutable, so it may be read from several threads. Misuse
/// is detected as for `care_profile` (`CARE_ERR_INVALID_HANDLE`).
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub struct care_profile_report {
    _private: [u8; 0],
}

handle_type!(care_profile_report => ProfileReport, 4);

/// The stable codes of profile validation (`care_profile_violation.code`; the numbers of
/// `care_core::profile::ProfileCode`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum care_profile_code {
    /// The text is not one JSON value (or not UTF-8).
    CARE_PROFILE_CODE_NOT_JSON = 1,
    /// Text after the JSON value.
    CARE_PROFILE_CODE_TRAILING_TEXT = 2,
    /// Wrong type, missing, unknown or duplicate key, a value outside its word list.
    CARE_PROFILE_CODE_SCHEMA = 3,
    /// More dimensions, criteria, spans, labels or vetoes than this library stores, or a name
    /// too long.
    CARE_PROFILE_CODE_CAPACITY = 4,
    /// A blank name, title, description or label.
    CARE_PROFILE_CODE_EMPTY_TEXT = 5,
    /// Two dimensions, criteria of one dimension, spans or labels with the same name.
    CARE_PROFILE_CODE_DUPLICATE_NAME = 6,
    /// A dimension or emotion weight outside `[0, 1]`.
    CARE_PROFILE_CODE_WEIGHT_RANGE = 7,
    /// Dimension weights that do not sum to 1.
    CARE_PROFILE_CODE_WEIGHT_SUM = 8,
    /// A criterion weight that is zero, not finite or too large, or a dimension without a
    /// positive one.
    CARE_PROFILE_CODE_CRITERION_WEIGHT = 9,
    /// A dimension of a fixed rubric without criteria.
    CARE_PROFILE_CODE_CRITERIA_COUNT = 10,
    /// A score range that is not `0 <= min < max <= 100`, or a veto outside it.
    CARE_PROFILE_CODE_SCORE_RANGE = 11,
    /// A veto, judge span or emotion span that names nothing the profile defines.
    CARE_PROFILE_CODE_UNKNOWN_NAME = 12,
    /// A malformed tag template, or tags of which one contains another.
    CARE_PROFILE_CODE_TEMPLATE = 13,
    /// A generated rubric that is not CARE's three dimensions on 0..5.
    CARE_PROFILE_CODE_GENERATED = 14,
    /// An emotion label not in normalized form.
    CARE_PROFILE_CODE_LABEL_FORMAT = 15,
    /// A span name with characters other than ASCII letters, digits, `_` and `-`.
    CARE_PROFILE_CODE_NAME_FORMAT = 16,
}

/// Where in the profile a violation is (`care_profile_violation.path`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum care_profile_path {
    /// The document, or a top-level key (named in the message).
    CARE_PROFILE_PATH_ROOT = 0,
    /// A top-level member (`scores`, `output`, `emotion`; named in the message).
    CARE_PROFILE_PATH_MEMBER = 1,
    /// `dimensions[index]`.
    CARE_PROFILE_PATH_DIMENSION = 2,
    /// `dimensions[index].criteria[subindex]`.
    CARE_PROFILE_PATH_CRITERION = 3,
    /// `output.spans[index]`.
    CARE_PROFILE_PATH_SPAN = 4,
    /// Label `index` of `emotion.labels`.
    CARE_PROFILE_PATH_LABEL = 5,
    /// `vetoes[index]`.
    CARE_PROFILE_PATH_VETO = 6,
}

/// The stable codes of the output-format check (`care_output_violation.code`; the numbers of
/// `care_core::profile::OutputCode`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum care_output_code {
    /// The output is not valid UTF-8.
    CARE_OUTPUT_CODE_INVALID_UTF8 = 1,
    /// A span's begin tag, end tag or both are missing.
    CARE_OUTPUT_CODE_MISSING_SPAN = 2,
    /// A begin or end tag appears more than once.
    CARE_OUTPUT_CODE_DUPLICATE_SPAN = 3,
    /// Spans out of order, or an end tag before its begin tag.
    CARE_OUTPUT_CODE_SPAN_ORDER = 4,
    /// A span holds nothing but whitespace.
    CARE_OUTPUT_CODE_EMPTY_SPAN = 5,
    /// Non-whitespace text outside the spans.
    CARE_OUTPUT_CODE_TEXT_OUTSIDE = 6,
}

/// Where a profile's rubric comes from (`care_profile_info.rubric_source`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum care_rubric_source {
    /// The profile holds the rubric (Kardia-R1, checklists): pass no `care_rubric`.
    CARE_RUBRIC_SOURCE_FIXED = 0,
    /// A rubric generated per prompt supplies weights and criteria (CARE): pass its
    /// `care_rubric` to every scoring and judge call.
    CARE_RUBRIC_SOURCE_GENERATED = 1,
}

/// One violation of the profile schema. Indices and the offset are -1 where they do not apply.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct care_profile_violation {
    /// A `care_profile_code`.
    pub code: u32,
    /// A `care_profile_path`.
    pub path: u32,
    /// The dimension, span, label or veto index of the path, or -1.
    pub index: i32,
    /// The criterion index (`CARE_PROFILE_PATH_CRITERION`), or -1.
    pub subindex: i32,
    /// Byte offset in the profile text, or -1.
    pub offset: i64,
}

/// What a profile holds, in numbers.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_profile_info {
    /// Number of dimensions (1 to `CARE_PROFILE_MAX_DIMENSIONS`).
    pub dimensions: u32,
    /// Number of output spans (0: no output format, every output is well-formed).
    pub spans: u32,
    /// The span the judge sees, or -1 without an output format (it sees the whole output).
    pub judge_span: i32,
    /// A `care_rubric_source`.
    pub rubric_source: u32,
    /// The judge's integer score range `min..=max`.
    pub score_min: u32,
    /// See `score_min`.
    pub score_max: u32,
    /// 1 when the profile has an emotion term (every reward call then needs a gold label).
    pub has_emotion: u32,
    /// The span that holds the predicted emotion, or -1.
    pub emotion_span: i32,
    /// `lambda`, the weight of the emotion term (0 without one).
    pub emotion_weight: f64,
    /// Number of vetoes.
    pub vetoes: u32,
}

/// A span of the caller's output buffer: `output[offset .. offset + len]`, trimmed of ASCII
/// whitespace. `located` is 0 when the span was not found (then `offset` and `len` are 0).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct care_span {
    /// 1 when the span was found, else 0.
    pub located: u32,
    /// Byte offset of the span's content in the output.
    pub offset: usize,
    /// Byte length of the span's content.
    pub len: usize,
}

/// One violation of the output format. `span` and `offset` are -1 where they do not apply.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct care_output_violation {
    /// A `care_output_code`.
    pub code: u32,
    /// The span it concerns, or -1.
    pub span: i32,
    /// Byte offset in the output, or -1.
    pub offset: i64,
}

/// The result of `care_profile_check_output`. Every span is an offset and length into the
/// buffer that was checked (no copy); they stay meaningful as long as that buffer does.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_output_check {
    /// `r_fmt`: 1.0 when the output has the profile's format (always, without one), else 0.0.
    pub format_reward: f64,
    /// 1 when the output is well-formed, so the judge must be called; 0 when it is malformed
    /// (its reward is 0 whatever the judge says: skip the call).
    pub judge_needed: u32,
    /// What the judge sees: the judge span, or the whole output without an output format.
    /// Not located when the judge is not needed (or when a profile without a format gets an
    /// output that is not UTF-8).
    pub judge: care_span,
    /// Number of entries of `spans` in use (the profile's span count).
    pub span_count: u32,
    /// Each span's content, in profile order (located also in a malformed output, where it
    /// could be found, for diagnostics).
    pub spans: [care_span; CARE_PROFILE_MAX_SPANS],
    /// Number of entries of `violations` in use.
    pub violation_count: u32,
    /// 1 when more violations were found than `violations` holds.
    pub overflowed: u32,
    /// The violations, span by span, then the text outside in output order.
    pub violations: [care_output_violation; CARE_OUTPUT_MAX_VIOLATIONS],
}

/// One response to score under a profile (the inputs of `care_profile_reward`).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_profile_response {
    /// `sizeof(care_profile_response)`.
    pub struct_size: u32,
    /// The prompt's generated rubric for a generated profile (`care`); NULL for a fixed one.
    pub rubric: *const care_rubric,
    /// The policy output (any bytes; not NUL-terminated).
    pub output: *const c_char,
    /// Bytes of `output`.
    pub output_len: usize,
    /// Raw judge scores in the profile's range, flat in profile order
    /// (`care_profile_total_criteria` of them), NaN = missing. Not read, and may be (NULL, 0),
    /// when the output is malformed.
    pub scores: *const f64,
    /// Length of `scores`.
    pub scores_len: usize,
    /// The gold emotion label (UTF-8), required by a profile with an emotion term; (NULL, 0)
    /// for none.
    pub gold_emotion: *const c_char,
    /// Bytes of `gold_emotion`.
    pub gold_emotion_len: usize,
}

/// The `M` responses of one GRPO group under one profile (the inputs of
/// `care_profile_reward_group`): one prompt, so one rubric and one gold label.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_profile_group {
    /// `sizeof(care_profile_group)`.
    pub struct_size: u32,
    /// As in `care_profile_response`.
    pub rubric: *const care_rubric,
    /// `output_count` policy outputs (any bytes, not NUL-terminated).
    pub outputs: *const *const c_char,
    /// Byte length of each output.
    pub output_lens: *const usize,
    /// `M`, the number of responses.
    pub output_count: usize,
    /// `M * total` raw scores, response-major (the rows of malformed outputs are not read).
    pub scores: *const f64,
    /// Length of `scores`.
    pub scores_len: usize,
    /// As in `care_profile_response`.
    pub gold_emotion: *const c_char,
    /// Bytes of `gold_emotion`.
    pub gold_emotion_len: usize,
}

/// The reward of one response under a profile, with what produced it.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_profile_reward_result {
    /// `r = r_fmt * (1 - veto) * ((1 - lambda) * rubric_reward + lambda * r_emo)`, in
    /// `[0, 1]`; NaN for a response of a group whose scores broke an `error` policy.
    pub reward: f64,
    /// `r_fmt`: 1.0 or 0.0.
    pub format_reward: f64,
    /// 0 when the output is malformed: the reward is 0 and the scores were not read.
    pub judge_needed: u32,
    /// `code` of this response: `CARE_OK`, or (in a group) why its reward is NaN.
    pub code: u32,
    /// `sum_d w_d * v_d` in `[0, 1]` (0 when the scores were not read; NaN when `code` is not
    /// `CARE_OK`).
    pub rubric_reward: f64,
    /// 1 when the emotion span matches the gold label, 0 when it does not, -1 without an
    /// emotion term or when the output has no emotion span.
    pub emotion_correct: i32,
    /// The first dimension (profile order) whose veto set the reward to 0, or -1.
    pub vetoed_by: i32,
    /// Number of entries of `dim_values` and `weights` in use (the profile's dimensions).
    pub dimensions: u32,
    /// The value `v_d` of each dimension in `[0, 1]`, profile order (0 when the scores were not
    /// read; NaN when `code` is not `CARE_OK`).
    pub dim_values: [f64; CARE_PROFILE_MAX_DIMENSIONS],
    /// The dimension weights used (on the simplex), profile order (NaN when `code` is not
    /// `CARE_OK`).
    pub weights: [f64; CARE_PROFILE_MAX_DIMENSIONS],
    /// Which score policies fired.
    pub fired: care_fired,
}

/// Where `care_profile_reward_group` writes (pointers into caller memory).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_profile_group_outputs {
    /// `sizeof(care_profile_group_outputs)`.
    pub struct_size: u32,
    /// `M` rewards (required).
    pub rewards: *mut f64,
    /// Length of `rewards`: `M`.
    pub rewards_len: usize,
    /// Optional per-response details: (NULL, 0), or `M` entries.
    pub details: *mut care_profile_reward_result,
    /// Length of `details`: 0 or `M`.
    pub details_len: usize,
}

/// What happened while scoring a group under a profile.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_profile_group_report {
    /// Responses with a finite reward (malformed ones included: they score 0).
    pub scored: u32,
    /// Of those, responses whose output is malformed (reward 0, judge not needed).
    pub malformed: u32,
    /// Of those, responses whose reward a veto set to 0.
    pub vetoed: u32,
    /// Responses whose emotion span matches the gold label.
    pub emotion_correct: u32,
    /// Responses that got a NaN reward because a score broke an `error` policy.
    pub failed: u32,
    /// Index of the first failed response, or -1.
    pub first_error_index: i64,
    /// The `care_result` of the first failure, or `CARE_OK`.
    pub first_error_code: u32,
    /// Policies fired, summed over the group.
    pub fired: care_fired,
}

// ---- helpers ------------------------------------------------------------------------------

/// A rubric handle that may be NULL (a fixed profile takes none).
fn opt_rubric(p: *const care_rubric) -> Result<Option<std::sync::Arc<RubricHandle>>, care_result> {
    if p.is_null() {
        Ok(None)
    } else {
        handle::get(p).map(Some)
    }
}

/// Optional UTF-8 text: `(NULL, 0)` is `None`.
///
/// # Safety
/// As for [`args::opt_slice`].
unsafe fn opt_text<'a>(p: *const c_char, len: usize) -> Result<Option<&'a str>, care_result> {
    // SAFETY: forwarded contract.
    match unsafe { args::opt_slice(p.cast::<u8>(), len) }? {
        None => Ok(None),
        Some(b) => core::str::from_utf8(b)
            .map(Some)
            .map_err(|_| care_result::CARE_ERR_INVALID_UTF8),
    }
}

/// `count` byte strings given as pointers and lengths (any bytes; not NUL-terminated).
///
/// # Safety
/// `ptrs` and `lens` are `(NULL, 0)` or point to `count` entries; each pointer points to
/// `lens[i]` bytes.
unsafe fn byte_strings<'a>(
    ptrs: *const *const c_char,
    lens: *const usize,
    count: usize,
) -> Result<Vec<&'a [u8]>, care_result> {
    // SAFETY (all blocks): forwarded contract.
    let ptrs = unsafe { args::slice(ptrs, count) }?;
    let lens = unsafe { args::slice(lens, count) }?;
    ptrs.iter()
        .zip(lens)
        .map(|(&p, &n)| unsafe { args::slice(p.cast::<u8>(), n) })
        .collect()
}

/// A borrowed string as `(pointer, length)` outputs.
///
/// # Safety
/// Both outputs are valid for writes (checked by [`Out::new`]).
unsafe fn write_str(s: &str, ptr_out: Out<*const c_char>, len_out: Out<usize>) {
    // SAFETY: forwarded contract.
    unsafe {
        ptr_out.write(s.as_ptr().cast());
        len_out.write(s.len());
    }
}

/// Index of a core enum value in its `ALL` table (which holds every variant).
fn index_of<T: PartialEq>(table: &[T], v: &T) -> u32 {
    table.iter().position(|t| t == v).unwrap_or(0) as u32
}

fn opt_index(v: Option<usize>) -> i32 {
    v.and_then(|i| i32::try_from(i).ok()).unwrap_or(-1)
}

fn opt_offset(v: Option<usize>) -> i64 {
    v.and_then(|o| i64::try_from(o).ok()).unwrap_or(-1)
}

/// The span of `s` inside `base` (a subslice of it, as every span of the check is).
fn span_in(base: &[u8], s: Option<&str>) -> Result<care_span, care_result> {
    let Some(s) = s else {
        return Ok(care_span::default());
    };
    let offset = (s.as_ptr() as usize).wrapping_sub(base.as_ptr() as usize);
    match offset.checked_add(s.len()) {
        Some(end) if end <= base.len() => Ok(care_span {
            located: 1,
            offset,
            len: s.len(),
        }),
        // The core returns slices of the output; anything else is a bug, not a span.
        _ => Err(care_result::CARE_ERR_INTERNAL),
    }
}

fn check_to_c(
    profile: &Profile<'_>,
    output: &[u8],
    c: &OutputCheck<'_>,
) -> Result<care_output_check, care_result> {
    let mut spans = [care_span::default(); CARE_PROFILE_MAX_SPANS];
    let n = profile.span_count();
    for (k, slot) in spans.iter_mut().enumerate().take(n) {
        *slot = span_in(output, c.span(k))?;
    }
    let mut violations = [care_output_violation::default(); CARE_OUTPUT_MAX_VIOLATIONS];
    let kept = c.report().violations();
    for (slot, v) in violations.iter_mut().zip(kept) {
        *slot = care_output_violation {
            code: u32::from(v.code.number()),
            span: opt_index(v.span.map(usize::from)),
            offset: opt_offset(v.offset),
        };
    }
    Ok(care_output_check {
        format_reward: c.format_reward(),
        judge_needed: u32::from(c.judge_needed()),
        judge: span_in(output, c.judge_text())?,
        span_count: n as u32,
        spans,
        violation_count: kept.len() as u32,
        overflowed: u32::from(c.report().overflowed()),
        violations,
    })
}

fn reward_to_c(r: &ProfileReward) -> care_profile_reward_result {
    let mut dim_values = [0.0; CARE_PROFILE_MAX_DIMENSIONS];
    let mut weights = [0.0; CARE_PROFILE_MAX_DIMENSIONS];
    for (slot, v) in dim_values.iter_mut().zip(r.dim_values()) {
        *slot = *v;
    }
    for (slot, w) in weights.iter_mut().zip(r.weights()) {
        *slot = *w;
    }
    care_profile_reward_result {
        reward: r.reward,
        format_reward: r.format_reward,
        judge_needed: u32::from(r.judge_needed),
        code: care_result::CARE_OK as u32,
        rubric_reward: r.rubric_reward,
        emotion_correct: r.emotion_correct.map_or(-1, i32::from),
        vetoed_by: r.vetoed_by.map_or(-1, i32::from),
        dimensions: r.dim_values().len() as u32,
        dim_values,
        weights,
        fired: reward::fired_to_c(&r.fired),
    }
}

/// The detail of a group response whose scores broke an `error` policy: its reward is NaN.
fn failed_to_c(
    profile: &Profile<'_>,
    check: &OutputCheck<'_>,
    code: care_result,
) -> care_profile_reward_result {
    let n = profile.dimension_count();
    let mut nan = [0.0; CARE_PROFILE_MAX_DIMENSIONS];
    for x in nan.iter_mut().take(n) {
        *x = f64::NAN;
    }
    care_profile_reward_result {
        reward: f64::NAN,
        format_reward: check.format_reward(),
        judge_needed: u32::from(check.judge_needed()),
        code: code as u32,
        rubric_reward: f64::NAN,
        emotion_correct: -1,
        vetoed_by: -1,
        dimensions: n as u32,
        dim_values: nan,
        weights: nan,
        fired: reward::fired_to_c(&care_core::reward::Fired::default()),
    }
}

/// The code `care_profile_parse` returns for an invalid profile.
fn parse_failure(report: &ProfileReport) -> care_result {
    // The detail names every violation with its path (the first ones, within the detail's
    // length cap), so the caller need not ask for the report.
    let n = report.violations().len();
    let mut text = String::new();
    for (i, v) in report.violations().iter().enumerate() {
        if i > 0 {
            text.push_str("; ");
        }
        let _ = write!(text, "{v}");
    }
    crate::detail::set_if_empty(format_args!(
        "the profile is invalid ({n} violation{}): {text}",
        if n == 1 { "" } else { "s" }
    ));
    match report.violations().first().map(|v| v.code) {
        Some(ProfileCode::NotJson) => care_result::CARE_ERR_NOT_JSON,
        Some(ProfileCode::TrailingText) => care_result::CARE_ERR_TRAILING_TEXT,
        _ => care_result::CARE_ERR_INVALID_PROFILE,
    }
}

fn violation_to_c(v: &profile::ProfileViolation) -> care_profile_violation {
    let (path, index, subindex) = match v.path {
        ProfilePath::Member(_) => (care_profile_path::CARE_PROFILE_PATH_MEMBER, -1, -1),
        ProfilePath::Dimension(i) => (
            care_profile_path::CARE_PROFILE_PATH_DIMENSION,
            i32::from(i),
            -1,
        ),
        ProfilePath::Criterion(i, j) => (
            care_profile_path::CARE_PROFILE_PATH_CRITERION,
            i32::from(i),
            i32::from(j),
        ),
        ProfilePath::Span(k) => (care_profile_path::CARE_PROFILE_PATH_SPAN, i32::from(k), -1),
        ProfilePath::Label(i) => (care_profile_path::CARE_PROFILE_PATH_LABEL, i32::from(i), -1),
        ProfilePath::Veto(i) => (care_profile_path::CARE_PROFILE_PATH_VETO, i32::from(i), -1),
        // `Root`, and any path a newer core adds (the message names it).
        _ => (care_profile_path::CARE_PROFILE_PATH_ROOT, -1, -1),
    };
    care_profile_violation {
        code: u32::from(v.code.number()),
        path: path as u32,
        index,
        subindex,
        offset: opt_offset(v.offset),
    }
}

// ---- handles --------------------------------------------------------------------------------

/// Writes a new handle to the built-in profile `name` (`"care"` or `"kardia"`, UTF-8, not
/// NUL-terminated) into `*profile_out`. An unknown name is `CARE_ERR_INVALID_ARGUMENT`.
///
/// ```c
/// const care_profile *kardia = NULL;
/// if (care_profile_builtin("kardia", 6, &kardia) != CARE_OK) return 1;
/// /* ... */
/// care_profile_free(kardia);
/// ```
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_profile_builtin(
    name: *const c_char,
    name_len: usize,
    profile_out: *mut *const care_profile,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY: forwarded contract.
        let name = tri!(unsafe { args::text(name, name_len) });
        let out = tri!(Out::new(profile_out));
        let buf = tri!(ProfileBuf::builtin(name).map_err(map_error));
        let h = tri!(handle::insert::<care_profile>(buf));
        // SAFETY: checked non-NULL and aligned; valid for a write (contract).
        unsafe { out.write(h) };
        care_result::CARE_OK
    }
}

/// Parses profile JSON `(text, text_len)` (the schema of `docs/PROFILES.md`; copied) into a
/// new handle in `*profile_out`. Only a profile without any violation is accepted: otherwise
/// the result is `CARE_ERR_NOT_JSON` or `CARE_ERR_TRAILING_TEXT` when the text is not one JSON
/// value, else `CARE_ERR_INVALID_PROFILE` (call `care_profile_validate` for every violation).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_profile_parse(
    text: *const c_char,
    text_len: usize,
    profile_out: *mut *const care_profile,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY: forwarded contract.
        let text = tri!(unsafe { args::slice(text.cast::<u8>(), text_len) });
        let out = tri!(Out::new(profile_out));
        let buf = match ProfileBuf::parse(text) {
            Ok(buf) => buf,
            Err(report) => return parse_failure(&report),
        };
        let h = tri!(handle::insert::<care_profile>(buf));
        // SAFETY: checked non-NULL and aligned; valid for a write (contract).
        unsafe { out.write(h) };
        care_result::CARE_OK
    }
}

/// Validates profile JSON and writes a new report into `*report_out`, whatever the text holds
/// (a report without violations means `care_profile_parse` accepts the text).
///
/// ```c
/// care_profile_report *rep = NULL;
/// care_profile_validate(json, json_len, &rep);
/// size_t n = 0; uint32_t more = 0;
/// care_profile_report_count(rep, &n, &more);
/// for (size_t i = 0; i < n; i++) {
///   char msg[512]; size_t len = 0;
///   if (care_profile_report_message(rep, i, msg, sizeof msg, &len) == CARE_OK)
///     printf("%.*s\n", (int)len, msg);
/// }
/// care_profile_report_free(rep);
/// ```
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_profile_validate(
    text: *const c_char,
    text_len: usize,
    report_out: *mut *mut care_profile_report,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY: forwarded contract.
        let text = tri!(unsafe { args::slice(text.cast::<u8>(), text_len) });
        let out = tri!(Out::new(report_out));
        // Decoding never makes a string longer, so the text's length is enough scratch; a text
        // refused for its length needs none.
        let need = if text.len() > profile::MAX_PROFILE_TEXT_BYTES { 0 } else { text.len() };
        let mut scratch = tri!(args::working("the profile text's scratch", need, 0u8));
        let report = profile::parse_profile(text, &mut scratch).report;
        let h = tri!(handle::insert::<care_profile_report>(report));
        // SAFETY: checked non-NULL and aligned; valid for a write (contract).
        unsafe { out.write(h.cast_mut()) };
        care_result::CARE_OK
    }
}

/// Writes a new handle to the same profile into `*profile_out`; the two handles are
/// independent (each is released once with `care_profile_free`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_profile_clone(
    profile: *const care_profile,
    profile_out: *mut *const care_profile,
) -> care_result {
    ffi_panic_boundary! {
        let out = tri!(Out::new(profile_out));
        let p = tri!(handle::clone(profile));
        // SAFETY: checked non-NULL and aligned; valid for a write (contract).
        unsafe { out.write(p) };
        care_result::CARE_OK
    }
}

/// Releases the handle `profile`; the profile is freed with its last handle, once no call that
/// uses it is running. NULL does nothing (`CARE_OK`); a handle already freed or of another type
/// is `CARE_ERR_INVALID_HANDLE` and changes nothing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_profile_free(profile: *const care_profile) -> care_result {
    ffi_panic_boundary! {
        handle::free_code(profile)
    }
}

/// Borrows the profile's name (UTF-8, not NUL-terminated; lives as long as the profile).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_profile_name(
    profile: *const care_profile,
    name_out: *mut *const c_char,
    name_len_out: *mut usize,
) -> care_result {
    ffi_panic_boundary! {
        let p = tri!(handle::get(profile));
        let n = tri!(Out::new(name_out));
        let l = tri!(Out::new(name_len_out));
        // SAFETY: both checked; the string lives in the profile, which a handle keeps alive.
        unsafe { write_str(p.profile().name(), n, l) };
        care_result::CARE_OK
    }
}

/// Writes the profile's shape (dimensions, spans, judge span, score range, emotion term,
/// vetoes) into `*info_out`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_profile_describe(
    profile: *const care_profile,
    info_out: *mut care_profile_info,
) -> care_result {
    ffi_panic_boundary! {
        let p = tri!(handle::get(profile));
        let out = tri!(Out::new(info_out));
        let view = p.profile();
        let (lo, hi) = view.score_range();
        let emotion = view.emotion();
        let info = care_profile_info {
            dimensions: view.dimension_count() as u32,
            spans: view.span_count() as u32,
            judge_span: opt_index(view.judge_span()),
            rubric_source: index_of(&RubricSource::ALL, &view.rubric_source()),
            score_min: u32::from(lo),
            score_max: u32::from(hi),
            has_emotion: u32::from(emotion.is_some()),
            emotion_span: opt_index(emotion.map(|e| e.span())),
            emotion_weight: emotion.map_or(0.0, |e| e.weight()),
            vetoes: view.vetoes().len() as u32,
        };
        // SAFETY: checked non-NULL and aligned; valid for a write (contract).
        unsafe { out.write(info) };
        care_result::CARE_OK
    }
}

/// Dimension `index` of the profile: its name (borrowed, lives as long as the profile), its
/// weight as written (0 for a generated rubric, whose weights come per prompt) and its number
/// of fixed criteria (0 for a generated rubric). `CARE_ERR_OUT_OF_RANGE` for an index past the
/// last dimension.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_profile_dimension(
    profile: *const care_profile,
    index: usize,
    name_out: *mut *const c_char,
    name_len_out: *mut usize,
    weight_out: *mut f64,
    criteria_out: *mut usize,
) -> care_result {
    ffi_panic_boundary! {
        let p = tri!(handle::get(profile));
        let n = tri!(Out::new(name_out));
        let l = tri!(Out::new(name_len_out));
        let w = tri!(Out::new(weight_out));
        let c = tri!(Out::new(criteria_out));
        let Some(d) = p.profile().dimension(index) else {
            return care_result::CARE_ERR_OUT_OF_RANGE;
        };
        // SAFETY: all checked non-NULL and aligned; the name lives in the profile.
        unsafe {
            write_str(d.name, n, l);
            w.write(d.weight);
            c.write(d.criteria);
        }
        care_result::CARE_OK
    }
}

/// Borrows the name of output span `index` (lives as long as the profile);
/// `CARE_ERR_OUT_OF_RANGE` past the last span (and always for a profile without spans).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_profile_span_name(
    profile: *const care_profile,
    index: usize,
    name_out: *mut *const c_char,
    name_len_out: *mut usize,
) -> care_result {
    ffi_panic_boundary! {
        let p = tri!(handle::get(profile));
        let n = tri!(Out::new(name_out));
        let l = tri!(Out::new(name_len_out));
        let Some(name) = p.profile().span_name(index) else {
            return care_result::CARE_ERR_OUT_OF_RANGE;
        };
        // SAFETY: both checked; the name lives in the profile.
        unsafe { write_str(name, n, l) };
        care_result::CARE_OK
    }
}

/// Writes the length of one response's flat score array into `*total_out`: the profile's
/// criteria for a fixed profile (`rubric` NULL), the rubric's for a generated one (`rubric`
/// required). A rubric for a fixed profile, or none for a generated one, is
/// `CARE_ERR_INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_profile_total_criteria(
    profile: *const care_profile,
    rubric: *const care_rubric,
    total_out: *mut usize,
) -> care_result {
    ffi_panic_boundary! {
        let p = tri!(handle::get(profile));
        let r = tri!(opt_rubric(rubric));
        let out = tri!(Out::new(total_out));
        let view = r.as_ref().map(|r| r.buf.rubric());
        let total = tri!(p.profile().total_criteria(view.as_ref()).map_err(map_error));
        // SAFETY: checked non-NULL and aligned; valid for a write (contract).
        unsafe { out.write(total) };
        care_result::CARE_OK
    }
}

// ---- the output-format check -----------------------------------------------------------------

/// Checks a policy output `(output, output_len)` (any bytes) against the profile's output
/// format and writes `r_fmt`, whether the judge is needed, the judge span, every span and every
/// violation into `*check_out`. Spans are offsets and lengths into `output`: nothing is copied.
/// Never fails on the output's content (a malformed output is a result, not an error).
///
/// ```c
/// care_output_check chk;
/// care_profile_check_output(kardia, out, out_len, &chk);
/// if (chk.judge_needed)   /* render the judge prompt with out + chk.judge.offset */
///   judge(out + chk.judge.offset, chk.judge.len);
/// ```
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_profile_check_output(
    profile: *const care_profile,
    output: *const c_char,
    output_len: usize,
    check_out: *mut care_output_check,
) -> care_result {
    ffi_panic_boundary! {
        let p = tri!(handle::get(profile));
        // SAFETY: forwarded contract.
        let output = tri!(unsafe { args::slice(output.cast::<u8>(), output_len) });
        let out = tri!(Out::new(check_out));
        let view = p.profile();
        let check = view.check_output(output);
        let c = tri!(check_to_c(&view, output, &check));
        // SAFETY: checked non-NULL and aligned; valid for a write (contract).
        unsafe { out.write(c) };
        care_result::CARE_OK
    }
}

/// Copies the output check's feedback (one message per violation, one per line, each saying
/// what to fix; empty for a well-formed output) into `(buf, buf_len)` and its length into
/// `*len_out`, with the size protocol of `care_validation_report_message` (pass `(NULL, 0)` to
/// ask for the size; `CARE_ERR_BUFFER_TOO_SMALL` reports it).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_profile_output_feedback(
    profile: *const care_profile,
    output: *const c_char,
    output_len: usize,
    buf: *mut c_char,
    buf_len: usize,
    len_out: *mut usize,
) -> care_result {
    ffi_panic_boundary! {
        let p = tri!(handle::get(profile));
        // SAFETY: forwarded contract.
        let output = tri!(unsafe { args::slice(output.cast::<u8>(), output_len) });
        let view = p.profile();
        let check = view.check_output(output);
        let msg = check.report().to_string();
        // SAFETY: forwarded contract.
        unsafe { args::write_bytes(msg.as_bytes(), buf, buf_len, len_out) }
    }
}

// ---- rewards ------------------------------------------------------------------------------------

/// The reward of one response under `profile` (the profile's formula, `docs/PROFILES.md`):
/// checks `response->output`, then scores `response->scores` (not read when the output is
/// malformed) under `options` (NULL: defaults; the missing and out-of-range policies apply
/// with the profile's score range) and writes everything into `*result_out`.
///
/// Errors: `CARE_ERR_INVALID_ARGUMENT` for a rubric that does not fit the profile (see
/// `care_profile_total_criteria`) or a missing or blank gold label under an emotion term;
/// `CARE_ERR_SCORE_SHAPE` when a well-formed output's scores have the wrong length;
/// `CARE_ERR_MISSING_SCORE` and `CARE_ERR_SCORE_OUT_OF_RANGE` under the `error` policies.
///
/// ```c
/// care_profile_response in = {sizeof in, NULL, out, out_len, scores, 5, "sadness", 7};
/// care_profile_reward_result r;
/// care_profile_reward(kardia, &in, NULL, &r);
/// ```
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_profile_reward(
    profile: *const care_profile,
    response: *const care_profile_response,
    options: *const care_score_options,
    result_out: *mut care_profile_reward_result,
) -> care_result {
    ffi_panic_boundary! {
        let p = tri!(handle::get(profile));
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let i = tri!(unsafe { args::input(response) });
        let r = tri!(opt_rubric(i.rubric));
        let output = tri!(unsafe { args::slice(i.output.cast::<u8>(), i.output_len) });
        let scores = tri!(unsafe { args::slice(i.scores, i.scores_len) });
        let gold = tri!(unsafe { opt_text(i.gold_emotion, i.gold_emotion_len) });
        let opts = tri!(unsafe { reward::read_score(options) });
        let out = tri!(Out::new(result_out));
        let view = p.profile();
        let rubric = r.as_ref().map(|r| r.buf.rubric());
        let check = view.check_output(output);
        let res = tri!(
            profile::profile_reward(&view, rubric.as_ref(), &check, scores, gold, &opts)
                .map_err(map_error)
        );
        unsafe { out.write(reward_to_c(&res)) };
        care_result::CARE_OK
    }
}

/// The rewards of the `M` responses of one GRPO group under one profile, in one call:
/// `outputs->rewards[j]` gets the reward of `group->outputs[j]` scored with row `j` of
/// `group->scores` (`M * total`, response-major; rows of malformed outputs are not read). A
/// response whose scores break an `error` policy gets a NaN reward (an invalid sample for the
/// advantage functions) and is counted in `*report_out` (optional); the call itself fails only
/// on its arguments. `outputs->details` (optional) gets each response's full result.
///
/// ```c
/// care_profile_group g = {sizeof g, NULL, outs, out_lens, M, scores, M * 5, "sadness", 7};
/// double rewards[M];
/// care_profile_group_outputs o = {sizeof o, rewards, M, NULL, 0};
/// care_profile_group_report rep;
/// care_profile_reward_group(kardia, &g, NULL, &o, &rep);
/// ```
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_profile_reward_group(
    profile: *const care_profile,
    group: *const care_profile_group,
    options: *const care_score_options,
    outputs: *const care_profile_group_outputs,
    report_out: *mut care_profile_group_report,
) -> care_result {
    ffi_panic_boundary! {
        let p = tri!(handle::get(profile));
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let g = tri!(unsafe { args::input(group) });
        let r = tri!(opt_rubric(g.rubric));
        let texts = tri!(unsafe { byte_strings(g.outputs, g.output_lens, g.output_count) });
        let scores = tri!(unsafe { args::slice(g.scores, g.scores_len) });
        let gold = tri!(unsafe { opt_text(g.gold_emotion, g.gold_emotion_len) });
        let opts = tri!(unsafe { reward::read_score(options) });
        let o = tri!(unsafe { args::input(outputs) });
        let rewards = tri!(unsafe { args::slice_mut(o.rewards, o.rewards_len) });
        let details = tri!(unsafe { args::opt_slice_mut(o.details, o.details_len) });
        let report = tri!(Out::optional(report_out));
        let m = texts.len();
        if rewards.len() != m {
            return args::mismatch("rewards_len", rewards.len(), "the number of texts", m);
        }
        if let Some(d) = details.as_ref().filter(|d| d.len() != m) {
            return args::mismatch("details_len", d.len(), "the number of texts", m);
        }
        let view = p.profile();
        let rubric = r.as_ref().map(|r| r.buf.rubric());
        // Checked here so that every failure is found before the first output is written.
        let total = tri!(view.total_criteria(rubric.as_ref()).map_err(map_error));
        if m.checked_mul(total) != Some(scores.len()) {
            return crate::detail::fail(
                care_result::CARE_ERR_LENGTH_MISMATCH,
                format_args!(
                    "scores_len is {} but {m} responses times {total} criteria is {}; the \
                     scores are one row of {total} per response",
                    scores.len(),
                    m.saturating_mul(total)
                ),
            );
        }
        // Into a local buffer: the outputs are written only when the whole call succeeds.
        let mut local = tri!(args::working("the rewards", m, 0.0));
        let rep = tri!(
            profile::profile_reward_group(&view, rubric.as_ref(), &texts, scores, gold, &opts, &mut local)
                .map_err(map_error)
        );
        if let Some(details) = details {
            fill_details(&view, rubric.as_ref(), &texts, scores, total, gold, &opts, details);
        }
        rewards.copy_from_slice(&local);
        if let Some(out) = report {
            let (idx, code) = match rep.first_error {
                Some((i, e)) => (i64::try_from(i).unwrap_or(i64::MAX), map_error(e)),
                None => (-1, care_result::CARE_OK),
            };
            let c = care_profile_group_report {
                scored: rep.scored,
                malformed: rep.malformed,
                vetoed: rep.vetoed,
                emotion_correct: rep.emotion_correct,
                failed: rep.failed,
                first_error_index: idx,
                first_error_code: code as u32,
                fired: reward::fired_to_c(&rep.fired),
            };
            unsafe { out.write(c) };
        }
        care_result::CARE_OK
    }
}

/// Each response's full result, as `care_profile_reward` gives it (the same core function the
/// group's rewards come from), or the detail of a failed response.
#[allow(clippy::too_many_arguments)] // the group's inputs, passed on as they are
fn fill_details(
    view: &Profile<'_>,
    rubric: Option<&care_core::Rubric<'_>>,
    texts: &[&[u8]],
    scores: &[f64],
    total: usize,
    gold: Option<&str>,
    opts: &ScoreOptions,
    details: &mut [care_profile_reward_result],
) {
    for (j, (slot, text)) in details.iter_mut().zip(texts).enumerate() {
        let check = view.check_output(text);
        let row = scores.get(j * total..(j + 1) * total).unwrap_or(&[]);
        *slot = match profile::profile_reward(view, rubric, &check, row, gold, opts) {
            Ok(r) => reward_to_c(&r),
            Err(e) => failed_to_c(view, &check, map_error(e)),
        };
    }
}

// ---- judge I/O -----------------------------------------------------------------------------------

/// Renders the judge prompt of `profile` for one response into `(buf, buf_len)` (UTF-8, not
/// NUL-terminated) and its length into `*len_out`, with the size protocol of
/// `care_judge_prompt_render`. Categories are the profile's dimension names, with every
/// criterion and its anchors (a pitfall marked as one) and the profile's score range. For a
/// profile with spans, `inputs->response` is the judge span (`care_output_check.judge`). A
/// generated profile takes the prompt's `rubric` (and then renders exactly
/// `care_judge_prompt_render`); a fixed one takes NULL (`CARE_ERR_INVALID_ARGUMENT` otherwise).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_profile_judge_prompt_render(
    profile: *const care_profile,
    rubric: *const care_rubric,
    inputs: *const care_judge_prompt_inputs,
    buf: *mut c_char,
    buf_len: usize,
    len_out: *mut usize,
) -> care_result {
    ffi_panic_boundary! {
        let p = tri!(handle::get(profile));
        let r = tri!(opt_rubric(rubric));
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let i = tri!(unsafe { args::input(inputs) });
        let context =
            tri!(unsafe { reward::read_labels(i.context, i.context_lens, i.context_count) });
        let seeker = tri!(unsafe { args::text(i.seeker_turn, i.seeker_turn_len) });
        let response = tri!(unsafe { args::text(i.response, i.response_len) });
        tri!(Out::new(len_out));
        let view = p.profile();
        let rubric = r.as_ref().map(|r| r.buf.rubric());
        let mut prompt = String::new();
        tri!(
            profile::render_profile_judge_prompt(
                &mut prompt, &view, rubric.as_ref(), &context, seeker, response,
            )
            .map_err(map_error)
        );
        unsafe { args::write_bytes(prompt.as_bytes(), buf, buf_len, len_out) }
    }
}

/// Parses a judge's answer for `profile` into raw scores in flat profile order:
/// `scores_out[scores_len]` with `scores_len == care_profile_total_criteria`
/// (`CARE_ERR_SCORE_SHAPE` otherwise), NaN where the judge gave no usable score;
/// `*report_out` (optional) says what was matched. The envelope rules are those of
/// `care_judge_output_parse`; items match a dimension by name and a criterion by title.
/// `rubric` as for `care_profile_judge_prompt_render`.
/// Errors: `CARE_ERR_NO_JUDGE_JSON`, `CARE_ERR_INVALID_UTF8`, `CARE_ERR_INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_profile_judge_output_parse(
    profile: *const care_profile,
    rubric: *const care_rubric,
    text: *const c_char,
    text_len: usize,
    scores_out: *mut f64,
    scores_len: usize,
    report_out: *mut care_judge_report,
) -> care_result {
    ffi_panic_boundary! {
        let p = tri!(handle::get(profile));
        let r = tri!(opt_rubric(rubric));
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let text = tri!(unsafe { args::slice(text.cast::<u8>(), text_len) });
        let report = tri!(Out::optional(report_out));
        let view = p.profile();
        let rubric = r.as_ref().map(|r| r.buf.rubric());
        // The length is checked before anything is sized by it: a wrong `scores_len` (however
        // large) is `CARE_ERR_SCORE_SHAPE` without an allocation.
        let total = tri!(view.total_criteria(rubric.as_ref()).map_err(map_error));
        if scores_len != total {
            crate::detail::set_if_empty(format_args!(
                "scores_len is {scores_len} but the profile judges {total} criteria; pass one \
                 raw score per criterion (care_profile_total_criteria)"
            ));
            return care_result::CARE_ERR_SCORE_SHAPE;
        }
        let out = tri!(unsafe { args::slice_mut(scores_out, scores_len) });
        // Into a local buffer on the stack (a profile or rubric has at most
        // MAX_PROFILE_CRITERIA criteria): outputs are written only on success.
        let mut local = [f64::NAN; care_core::profile::MAX_PROFILE_CRITERIA];
        let Some(scores) = local.get_mut(..scores_len) else {
            return care_result::CARE_ERR_SCORE_SHAPE;
        };
        let rep = tri!(
            profile::parse_profile_judge_output(text, &view, rubric.as_ref(), scores)
                .map_err(map_error)
        );
        out.copy_from_slice(scores);
        if let Some(o) = report {
            unsafe { o.write(reward::judge_report_to_c(&rep)) };
        }
        care_result::CARE_OK
    }
}

// ---- the profile report ----------------------------------------------------------------------------

/// Writes the number of violations kept in the report (at most 64) into `*count_out` and, when
/// `overflowed_out` is not NULL, 1 into it when more were found than kept (else 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_profile_report_count(
    report: *const care_profile_report,
    count_out: *mut usize,
    overflowed_out: *mut u32,
) -> care_result {
    ffi_panic_boundary! {
        let r = tri!(handle::get(report));
        let count = tri!(Out::new(count_out));
        let over = tri!(Out::optional(overflowed_out));
        // SAFETY: checked non-NULL and aligned; valid for writes (contract).
        unsafe {
            count.write(r.violations().len());
            if let Some(o) = over {
                o.write(u32::from(r.overflowed()));
            }
        }
        care_result::CARE_OK
    }
}

/// Writes violation `index` (code, path, offset) into `*violation_out`;
/// `CARE_ERR_OUT_OF_RANGE` when `index >= count`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_profile_report_violation(
    report: *const care_profile_report,
    index: usize,
    violation_out: *mut care_profile_violation,
) -> care_result {
    ffi_panic_boundary! {
        let r = tri!(handle::get(report));
        let out = tri!(Out::new(violation_out));
        let Some(v) = r.violations().get(index) else {
            return care_result::CARE_ERR_OUT_OF_RANGE;
        };
        // SAFETY: checked non-NULL and aligned; valid for a write (contract).
        unsafe { out.write(violation_to_c(v)) };
        care_result::CARE_OK
    }
}

/// Copies the one-line message of violation `index` (its code, where it is, what is wrong and
/// what to fix; UTF-8, not NUL-terminated) into `(buf, buf_len)`, with the size protocol of
/// `care_validation_report_message`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_profile_report_message(
    report: *const care_profile_report,
    index: usize,
    buf: *mut c_char,
    buf_len: usize,
    len_out: *mut usize,
) -> care_result {
    ffi_panic_boundary! {
        let r = tri!(handle::get(report));
        let Some(v) = r.violations().get(index) else {
            // Check the other pointers first so that NULL is reported as NULL.
            tri!(Out::new(len_out));
            return care_result::CARE_ERR_OUT_OF_RANGE;
        };
        let msg = v.to_string();
        // SAFETY: forwarded contract.
        unsafe { args::write_bytes(msg.as_bytes(), buf, buf_len, len_out) }
    }
}

/// Copies every message, one per line, into `(buf, buf_len)`, with the size protocol of
/// `care_validation_report_message`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_profile_report_feedback(
    report: *const care_profile_report,
    buf: *mut c_char,
    buf_len: usize,
    len_out: *mut usize,
) -> care_result {
    ffi_panic_boundary! {
        let r = tri!(handle::get(report));
        let msg = r.to_string();
        // SAFETY: forwarded contract.
        unsafe { args::write_bytes(msg.as_bytes(), buf, buf_len, len_out) }
    }
}

/// Frees a profile report. NULL does nothing (`CARE_OK`); a report already freed or a handle of
/// another type is `CARE_ERR_INVALID_HANDLE`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_profile_report_free(report: *mut care_profile_report) -> care_result {
    ffi_panic_boundary! {
        handle::free_code(report.cast_const())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use care_core::profile::OutputCode;

    #[test]
    fn c_codes_are_the_core_numbers_and_names() {
        let profile_codes = [
            care_profile_code::CARE_PROFILE_CODE_NOT_JSON,
            care_profile_code::CARE_PROFILE_CODE_TRAILING_TEXT,
            care_profile_code::CARE_PROFILE_CODE_SCHEMA,
            care_profile_code::CARE_PROFILE_CODE_CAPACITY,
            care_profile_code::CARE_PROFILE_CODE_EMPTY_TEXT,
            care_profile_code::CARE_PROFILE_CODE_DUPLICATE_NAME,
            care_profile_code::CARE_PROFILE_CODE_WEIGHT_RANGE,
            care_profile_code::CARE_PROFILE_CODE_WEIGHT_SUM,
            care_profile_code::CARE_PROFILE_CODE_CRITERION_WEIGHT,
            care_profile_code::CARE_PROFILE_CODE_CRITERIA_COUNT,
            care_profile_code::CARE_PROFILE_CODE_SCORE_RANGE,
            care_profile_code::CARE_PROFILE_CODE_UNKNOWN_NAME,
            care_profile_code::CARE_PROFILE_CODE_TEMPLATE,
            care_profile_code::CARE_PROFILE_CODE_GENERATED,
            care_profile_code::CARE_PROFILE_CODE_LABEL_FORMAT,
            care_profile_code::CARE_PROFILE_CODE_NAME_FORMAT,
        ];
        assert_eq!(profile_codes.len(), ProfileCode::ALL.len());
        for (c, v) in profile_codes.iter().zip(ProfileCode::ALL) {
            assert_eq!(*c as u32, u32::from(v.number()), "{v:?}");
            assert!(
                format!("{c:?}").ends_with(&v.as_str().to_ascii_uppercase()),
                "{c:?} vs {v:?}"
            );
        }
        let output_codes = [
            care_output_code::CARE_OUTPUT_CODE_INVALID_UTF8,
            care_output_code::CARE_OUTPUT_CODE_MISSING_SPAN,
            care_output_code::CARE_OUTPUT_CODE_DUPLICATE_SPAN,
            care_output_code::CARE_OUTPUT_CODE_SPAN_ORDER,
            care_output_code::CARE_OUTPUT_CODE_EMPTY_SPAN,
            care_output_code::CARE_OUTPUT_CODE_TEXT_OUTSIDE,
        ];
        assert_eq!(output_codes.len(), OutputCode::ALL.len());
        for (c, v) in output_codes.iter().zip(OutputCode::ALL) {
            assert_eq!(*c as u32, u32::from(v.number()), "{v:?}");
            assert!(
                format!("{c:?}").ends_with(&v.as_str().to_ascii_uppercase()),
                "{c:?} vs {v:?}"
            );
        }
        for (c, v) in [
            care_rubric_source::CARE_RUBRIC_SOURCE_FIXED,
            care_rubric_source::CARE_RUBRIC_SOURCE_GENERATED,
        ]
        .iter()
        .zip(RubricSource::ALL)
        {
            assert_eq!(*c as u32, index_of(&RubricSource::ALL, &v), "{v:?}");
            assert!(format!("{c:?}").ends_with(&v.as_str().to_ascii_uppercase()));
        }
    }
}
