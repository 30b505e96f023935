//! Rubrics: the format policy, parsing into an immutable shareable handle, accessors, the
//! validation report and the format reward `r_fmt` (SPEC §1-3).

use core::ffi::c_char;
use core::fmt::Write as _;
use core::mem::size_of;

use care_core::format::{MAX_VIOLATIONS, Report, ViolationCode};
use care_core::{Dimension, FormatPolicy, RubricBuf};

use crate::args::{self, Out};
use crate::handle;
use crate::result::{care_result, map_error};

/// A parsed, valid rubric: immutable and safe to share across threads.
///
/// Lifetime: `care_rubric_parse` returns a new handle; `care_rubric_clone` returns another
/// handle to the same rubric; every handle is released exactly once with `care_rubric_free`,
/// and the rubric is freed with its last handle (after any call using it has returned). A
/// handle is a token checked on every call, not an address: using a handle after its
/// `care_rubric_free` (from any thread, even while a clone is alive), freeing it twice, or
/// passing a handle of another type is detected and returns `CARE_ERR_INVALID_HANDLE`.
/// Strings borrowed from a rubric (`care_rubric_criterion`) stay valid while any handle to it
/// is alive.
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub struct care_rubric {
    _private: [u8; 0],
}

/// What a `care_rubric` points to: the owned rubric plus the numbers every score call needs,
/// computed once at parse time.
#[derive(Debug)]
pub(crate) struct RubricHandle {
    pub(crate) buf: RubricBuf,
    pub(crate) weights: [f64; 3],
    pub(crate) counts: [usize; 3],
}

handle_type!(care_rubric => RubricHandle, 1);

/// The report of a format validation: every violation with its code, location and message.
///
/// Lifetime: owned by the caller who got it from `care_rubric_validate` and released exactly
/// once with `care_validation_report_free`. It is immutable, so it may be read from several
/// threads at once. A use after free, a double free or a handle of another type is detected
/// (`CARE_ERR_INVALID_HANDLE`), as for `care_rubric`.
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub struct care_validation_report {
    _private: [u8; 0],
}

/// What a `care_validation_report` points to.
#[derive(Debug)]
pub(crate) struct ReportHandle {
    report: Report,
    parsed: bool,
}

handle_type!(care_validation_report => ReportHandle, 2);

/// A dimension of the rubric (index of every `[3]` array of this API).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum care_dimension {
    /// Cognitive empathy (`"Cognitive Empathy"`).
    CARE_DIMENSION_COGNITIVE = 0,
    /// Affective empathy (`"Affective Empathy"`).
    CARE_DIMENSION_AFFECTIVE = 1,
    /// Proactive empathy (`"Proactive Empathy"`).
    CARE_DIMENSION_PROACTIVE = 2,
}

/// The stable format-violation codes of SPEC §3 (`care_violation.code`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum care_violation_code {
    /// The text is not one JSON value.
    CARE_VIOLATION_NOT_JSON = 1,
    /// Text before or after the JSON value.
    CARE_VIOLATION_TRAILING_TEXT = 2,
    /// Wrong JSON type, missing, unknown or duplicate key.
    CARE_VIOLATION_SCHEMA = 3,
    /// A category name that is not one of the three.
    CARE_VIOLATION_UNKNOWN_CATEGORY = 4,
    /// A category given twice.
    CARE_VIOLATION_DUPLICATE_CATEGORY = 5,
    /// A category missing.
    CARE_VIOLATION_MISSING_CATEGORY = 6,
    /// Categories out of order.
    CARE_VIOLATION_CATEGORY_ORDER = 7,
    /// Keys out of order.
    CARE_VIOLATION_KEY_ORDER = 8,
    /// `category_weight` outside `[0, 1]`.
    CARE_VIOLATION_WEIGHT_RANGE = 9,
    /// Weights do not sum to 1.
    CARE_VIOLATION_WEIGHT_SUM = 10,
    /// Criteria per category out of range.
    CARE_VIOLATION_CRITERIA_COUNT = 11,
    /// A description without the level anchors or the `value:` suffix.
    CARE_VIOLATION_LEVEL_FORMAT = 12,
    /// Two criteria with the same title.
    CARE_VIOLATION_DUPLICATE_TITLE = 13,
    /// A blank title, description or rationale.
    CARE_VIOLATION_EMPTY_TEXT = 14,
    /// The input exceeds a fixed capacity.
    CARE_VIOLATION_CAPACITY = 15,
    /// A forbidden meta word (lint, off by default).
    CARE_VIOLATION_META_WORD = 16,
}

/// The options of the format contract. Initialize with `care_format_policy_default` (the
/// paper's contract, behind `r_fmt`) or `care_format_policy_lenient`; every flag is 0 or 1
/// (anything else is `CARE_ERR_INVALID_BOOL`).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_format_policy {
    /// `sizeof(care_format_policy)`; lets the struct grow without breaking old callers.
    pub struct_size: u32,
    /// Strip a leading `<think>...</think>` block (or everything up to a lone `</think>`).
    pub allow_think: u8,
    /// Accept one ```` ```json ```` code fence around the value.
    pub allow_code_fence: u8,
    /// Accept the envelope `{"analysis": ..., "rubric": {...}}`.
    pub allow_envelope: u8,
    /// Require categories in the order Cognitive, Affective, Proactive.
    pub require_order: u8,
    /// Require the key order of categories and criteria.
    pub require_key_order: u8,
    /// Lint for meta words (gold, reference, ...).
    pub meta_words: u8,
    /// Fewest criteria per category (2).
    pub min_criteria: u8,
    /// Most criteria per category (4).
    pub max_criteria: u8,
    /// Allowed `|sum(w) - 1|` (1e-3).
    pub weight_tolerance: f64,
}

/// One format violation. Indices are -1 where they do not apply.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct care_violation {
    /// A `care_violation_code`.
    pub code: u32,
    /// Position of the category in the `categories` array, or -1.
    pub category: i32,
    /// The `care_dimension` of that category, or -1 when unknown.
    pub dimension: i32,
    /// Position of the criterion in its category's `criteria` array, or -1.
    pub criterion: i32,
    /// Byte offset in the input, or -1.
    pub offset: i64,
}

fn policy_to_c(p: &FormatPolicy) -> care_format_policy {
    care_format_policy {
        struct_size: size_of::<care_format_policy>() as u32,
        allow_think: u8::from(p.allow_think),
        allow_code_fence: u8::from(p.allow_code_fence),
        allow_envelope: u8::from(p.allow_envelope),
        require_order: u8::from(p.require_order),
        require_key_order: u8::from(p.require_key_order),
        meta_words: u8::from(p.meta_words),
        min_criteria: p.min_criteria,
        max_criteria: p.max_criteria,
        weight_tolerance: p.weight_tolerance,
    }
}

/// Reads the caller's format policy (NULL: the paper's contract): flags decoded, then the
/// core's `FormatPolicy::validate`.
///
/// # Safety
/// As for [`args::options`].
pub(crate) unsafe fn read_policy(
    p: *const care_format_policy,
) -> Result<FormatPolicy, care_result> {
    // SAFETY: forwarded contract.
    let c = unsafe { args::options(p, policy_to_c(&FormatPolicy::PAPER)) }?;
    let policy = FormatPolicy {
        allow_think: args::flag("care_format_policy.allow_think", c.allow_think)?,
        allow_code_fence: args::flag("care_format_policy.allow_code_fence", c.allow_code_fence)?,
        allow_envelope: args::flag("care_format_policy.allow_envelope", c.allow_envelope)?,
        weight_tolerance: c.weight_tolerance,
        require_order: args::flag("care_format_policy.require_order", c.require_order)?,
        require_key_order: args::flag("care_format_policy.require_key_order", c.require_key_order)?,
        min_criteria: c.min_criteria,
        max_criteria: c.max_criteria,
        meta_words: args::flag("care_format_policy.meta_words", c.meta_words)?,
    };
    args::option_check("care_format_policy", policy.check())?;
    Ok(policy)
}

/// The code `care_rubric_parse` returns for a text with violations: the parse-level code when
/// the text could not be read as a rubric, else `CARE_ERR_FORMAT_VIOLATION`.
fn parse_failure(report: &Report) -> care_result {
    // The detail: every violation with its location, as the validator words it (the key that
    // is missing, the weight that is off), so the caller need not ask for the report.
    struct Feedback<'a>(&'a Report);
    impl core::fmt::Display for Feedback<'_> {
        fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
            let n = self.0.violations().len();
            write!(
                f,
                "the rubric breaks the format contract ({n} violation{}): ",
                if n == 1 { "" } else { "s" }
            )?;
            for (i, v) in self.0.violations().iter().enumerate() {
                if i > 0 {
                    f.write_str("; ")?;
                }
                v.write_message(f)?;
            }
            if self.0.overflowed() {
                f.write_str("; more were found than reported")?;
            }
            Ok(())
        }
    }
    crate::detail::set_if_empty(format_args!("{}", Feedback(report)));
    let first = report.violations().first().map(|v| v.code);
    match first {
        Some(ViolationCode::NotJson) => care_result::CARE_ERR_NOT_JSON,
        Some(ViolationCode::TrailingText) => care_result::CARE_ERR_TRAILING_TEXT,
        Some(ViolationCode::Schema) => care_result::CARE_ERR_SCHEMA,
        Some(ViolationCode::Capacity) => care_result::CARE_ERR_CAPACITY,
        _ => care_result::CARE_ERR_FORMAT_VIOLATION,
    }
}

/// Validates `text` (scratch for strings with escapes: decoding never grows a string, so the
/// input's length is enough).
fn validate_owned(
    text: &[u8],
    policy: &FormatPolicy,
) -> Result<(Option<RubricBuf>, Report), care_result> {
    let mut scratch = args::working("the rubric text's scratch", text.len(), 0u8)?;
    let v = care_core::validate(text, policy, &mut scratch).map_err(map_error)?;
    let ok = v.is_valid();
    Ok((v.rubric.filter(|_| ok).map(RubricBuf::from), v.report))
}

/// Wraps an owned rubric for a handle.
pub(crate) fn rubric_handle(buf: RubricBuf) -> RubricHandle {
    let (weights, counts) = {
        let r = buf.rubric();
        (r.weights(), r.counts())
    };
    RubricHandle {
        buf,
        weights,
        counts,
    }
}

/// Writes the paper's format contract (the policy behind `r_fmt`) into `*policy_out`.
///
/// ```c
/// care_format_policy policy;
/// care_format_policy_default(&policy);
/// policy.max_criteria = 6;
/// ```
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_format_policy_default(
    policy_out: *mut care_format_policy,
) -> care_result {
    ffi_panic_boundary! {
        let out = tri!(Out::new(policy_out));
        // SAFETY: checked non-NULL and aligned; valid for a write (contract).
        unsafe { out.write(policy_to_c(&FormatPolicy::PAPER)) };
        care_result::CARE_OK
    }
}

/// Writes the lenient policy (think blocks, code fences and the envelope accepted; otherwise
/// the paper's contract) into `*policy_out`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_format_policy_lenient(
    policy_out: *mut care_format_policy,
) -> care_result {
    ffi_panic_boundary! {
        let out = tri!(Out::new(policy_out));
        // SAFETY: checked non-NULL and aligned; valid for a write (contract).
        unsafe { out.write(policy_to_c(&FormatPolicy::lenient())) };
        care_result::CARE_OK
    }
}

/// Parses rubric JSON `(text, text_len)` under `policy` (NULL: the paper's contract) into a new
/// handle in `*rubric_out`. Only a rubric that passes every check is accepted: otherwise the
/// result is `CARE_ERR_NOT_JSON`, `CARE_ERR_TRAILING_TEXT`, `CARE_ERR_SCHEMA` or
/// `CARE_ERR_CAPACITY` when it could not be read, else `CARE_ERR_FORMAT_VIOLATION` (call
/// `care_rubric_validate` for the details). The text is copied; the handle is immutable and
/// may be used from many threads at once.
///
/// ```c
/// const care_rubric *rubric = NULL;
/// care_result r = care_rubric_parse(json, json_len, NULL, &rubric);
/// if (r != CARE_OK) { fprintf(stderr, "%s\n", care_result_message(r)); return 1; }
/// /* ... */
/// care_rubric_free(rubric);
/// ```
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_rubric_parse(
    text: *const c_char,
    text_len: usize,
    policy: *const care_format_policy,
    rubric_out: *mut *const care_rubric,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let text = tri!(unsafe { args::slice(text.cast::<u8>(), text_len) });
        let policy = tri!(unsafe { read_policy(policy) });
        let out = tri!(Out::new(rubric_out));
        let (buf, report) = tri!(validate_owned(text, &policy));
        match buf {
            Some(buf) => {
                let h = tri!(handle::insert::<care_rubric>(rubric_handle(buf)));
                unsafe { out.write(h) };
                care_result::CARE_OK
            }
            None => parse_failure(&report),
        }
    }
}

/// Writes a new handle to the same rubric into `*rubric_out` (for handing the rubric to another
/// thread or owner). The two handles are independent: each is released once with
/// `care_rubric_free`, and freeing one leaves the other valid. `CARE_ERR_INVALID_HANDLE` when
/// `rubric` is not a live rubric handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_rubric_clone(
    rubric: *const care_rubric,
    rubric_out: *mut *const care_rubric,
) -> care_result {
    ffi_panic_boundary! {
        let out = tri!(Out::new(rubric_out));
        let p = tri!(handle::clone(rubric));
        // SAFETY: checked non-NULL and aligned; valid for a write (contract).
        unsafe { out.write(p) };
        care_result::CARE_OK
    }
}

/// Releases the handle `rubric`; the rubric itself is freed with its last handle, once no call
/// that uses it is running. `care_rubric_free(NULL)` does nothing and returns `CARE_OK`.
/// A handle that was already freed (a double free) or is not a rubric handle returns
/// `CARE_ERR_INVALID_HANDLE` and changes nothing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_rubric_free(rubric: *const care_rubric) -> care_result {
    ffi_panic_boundary! {
        handle::free_code(rubric)
    }
}

/// Writes the rubric's three stored weights (Cog, Aff, Pro) into `weights_out[3]`.
/// `weights_len` must be 3 (`CARE_ERR_LENGTH_MISMATCH`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_rubric_weights(
    rubric: *const care_rubric,
    weights_out: *mut f64,
    weights_len: usize,
) -> care_result {
    ffi_panic_boundary! {
        let r = tri!(handle::get(rubric));
        // SAFETY: forwarded contract.
        let out = tri!(unsafe { args::slice_mut(weights_out, weights_len) });
        if out.len() != 3 {
            return args::mismatch("weights_len", out.len(), "the number of dimensions", 3);
        }
        out.copy_from_slice(&r.weights);
        care_result::CARE_OK
    }
}

/// Writes the number of criteria of each dimension into `counts_out[3]` (`counts_len == 3`).
/// Their sum is the length of one response's score array.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_rubric_criteria_counts(
    rubric: *const care_rubric,
    counts_out: *mut usize,
    counts_len: usize,
) -> care_result {
    ffi_panic_boundary! {
        let r = tri!(handle::get(rubric));
        // SAFETY: forwarded contract.
        let out = tri!(unsafe { args::slice_mut(counts_out, counts_len) });
        if out.len() != 3 {
            return args::mismatch("counts_len", out.len(), "the number of dimensions", 3);
        }
        out.copy_from_slice(&r.counts);
        care_result::CARE_OK
    }
}

/// Writes the total number of criteria (the length of one response's flat score array:
/// Cog criteria, then Aff, then Pro) into `*total_out`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_rubric_total_criteria(
    rubric: *const care_rubric,
    total_out: *mut usize,
) -> care_result {
    ffi_panic_boundary! {
        let r = tri!(handle::get(rubric));
        let out = tri!(Out::new(total_out));
        // SAFETY: checked non-NULL and aligned; valid for a write (contract).
        unsafe { out.write(r.counts.iter().sum()) };
        care_result::CARE_OK
    }
}

/// Borrows the title and description of criterion `index` of `dimension` (a `care_dimension`).
/// The strings are UTF-8, not NUL-terminated, and live as long as the rubric handle.
/// Errors: `CARE_ERR_INVALID_ARGUMENT` (unknown dimension), `CARE_ERR_OUT_OF_RANGE` (index).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_rubric_criterion(
    rubric: *const care_rubric,
    dimension: u32,
    index: usize,
    title_out: *mut *const c_char,
    title_len_out: *mut usize,
    description_out: *mut *const c_char,
    description_len_out: *mut usize,
) -> care_result {
    ffi_panic_boundary! {
        let r = tri!(handle::get(rubric));
        let t_out = tri!(Out::new(title_out));
        let tl_out = tri!(Out::new(title_len_out));
        let d_out = tri!(Out::new(description_out));
        let dl_out = tri!(Out::new(description_len_out));
        let d = tri!(args::enum_arg("dimension", dimension, &Dimension::ALL));
        let view = r.buf.rubric();
        let Some(c) = view.criteria(d).get(index) else {
            return care_result::CARE_ERR_OUT_OF_RANGE;
        };
        // SAFETY: all four checked non-NULL and aligned; valid for writes (contract). The
        // strings point into the handle's own text, which lives as long as the handle.
        unsafe {
            t_out.write(c.title.as_ptr().cast());
            tl_out.write(c.title.len());
            d_out.write(c.description.as_ptr().cast());
            dl_out.write(c.description.len());
        }
        care_result::CARE_OK
    }
}

/// Validates rubric JSON under `policy` (NULL: the paper's contract) and writes a new report
/// into `*report_out`, whatever the text holds (a report with no violation means `r_fmt = 1`).
///
/// ```c
/// care_validation_report *rep = NULL;
/// care_rubric_validate(json, json_len, NULL, &rep);
/// size_t n = 0;
/// care_validation_report_count(rep, &n);
/// for (size_t i = 0; i < n; i++) {
///   char msg[512]; size_t len = 0;
///   if (care_validation_report_message(rep, i, msg, sizeof msg, &len) == CARE_OK)
///     printf("%.*s\n", (int)len, msg);
/// }
/// care_validation_report_free(rep);
/// ```
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_rubric_validate(
    text: *const c_char,
    text_len: usize,
    policy: *const care_format_policy,
    report_out: *mut *mut care_validation_report,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let text = tri!(unsafe { args::slice(text.cast::<u8>(), text_len) });
        let policy = tri!(unsafe { read_policy(policy) });
        let out = tri!(Out::new(report_out));
        let mut scratch = tri!(args::working("the rubric text's scratch", text.len(), 0u8));
        let v = tri!(care_core::validate(text, &policy, &mut scratch).map_err(map_error));
        let parsed = v.rubric.is_some();
        let rep = ReportHandle { report: v.report, parsed };
        let h = tri!(handle::insert::<care_validation_report>(rep));
        unsafe { out.write(h.cast_mut()) };
        care_result::CARE_OK
    }
}

/// The format reward `r_fmt` of rubric JSON under `policy` (NULL: the paper's contract): 1.0
/// when the text passes every check, else 0.0, into `*reward_out`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_format_reward(
    text: *const c_char,
    text_len: usize,
    policy: *const care_format_policy,
    reward_out: *mut f64,
) -> care_result {
    ffi_panic_boundary! {
        // SAFETY (all blocks below): forwarded contract of the entry point.
        let text = tri!(unsafe { args::slice(text.cast::<u8>(), text_len) });
        let policy = tri!(unsafe { read_policy(policy) });
        let out = tri!(Out::new(reward_out));
        let mut scratch = tri!(args::working("the rubric text's scratch", text.len(), 0u8));
        let r = tri!(care_core::format_reward(text, &policy, &mut scratch).map_err(map_error));
        unsafe { out.write(r) };
        care_result::CARE_OK
    }
}

/// Writes the number of violations kept in the report (at most 64) into `*count_out`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_validation_report_count(
    report: *const care_validation_report,
    count_out: *mut usize,
) -> care_result {
    ffi_panic_boundary! {
        let r = tri!(handle::get(report));
        let out = tri!(Out::new(count_out));
        // SAFETY: checked non-NULL and aligned; valid for a write (contract).
        unsafe { out.write(r.report.violations().len()) };
        care_result::CARE_OK
    }
}

/// Writes the report's summary: `*r_fmt_out` (1.0 or 0.0), `*parsed_out` (1 when a rubric was
/// recovered from the text, even with violations) and `*overflowed_out` (1 when more than 64
/// violations were found and only the first 64 are kept).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_validation_report_summary(
    report: *const care_validation_report,
    r_fmt_out: *mut f64,
    parsed_out: *mut u32,
    overflowed_out: *mut u32,
) -> care_result {
    ffi_panic_boundary! {
        let r = tri!(handle::get(report));
        let f = tri!(Out::new(r_fmt_out));
        let p = tri!(Out::new(parsed_out));
        let o = tri!(Out::new(overflowed_out));
        let r_fmt = if r.parsed { r.report.r_fmt() } else { 0.0 };
        // SAFETY: all checked non-NULL and aligned; valid for writes (contract).
        unsafe {
            f.write(r_fmt);
            p.write(u32::from(r.parsed));
            o.write(u32::from(r.report.overflowed()));
        }
        care_result::CARE_OK
    }
}

/// Writes violation `index` (code and location) into `*violation_out`.
/// Errors: `CARE_ERR_OUT_OF_RANGE` when `index >= count`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_validation_report_violation(
    report: *const care_validation_report,
    index: usize,
    violation_out: *mut care_violation,
) -> care_result {
    ffi_panic_boundary! {
        let r = tri!(handle::get(report));
        let out = tri!(Out::new(violation_out));
        let Some(v) = r.report.violations().get(index) else {
            return care_result::CARE_ERR_OUT_OF_RANGE;
        };
        let c = care_violation {
            code: u32::from(v.code.number()),
            category: v.category.map_or(-1, i32::from),
            dimension: v.dimension.map_or(-1, |d| d.index() as i32),
            criterion: v.criterion.map_or(-1, i32::from),
            offset: v.offset.and_then(|o| i64::try_from(o).ok()).unwrap_or(-1),
        };
        // SAFETY: checked non-NULL and aligned; valid for a write (contract).
        unsafe { out.write(c) };
        care_result::CARE_OK
    }
}

/// Copies the one-line message of violation `index` (UTF-8, not NUL-terminated, ready for a
/// retry prompt) into `(buf, buf_len)` and its length into `*len_out`. When the buffer is too
/// small, nothing is copied, `*len_out` receives the size needed and the result is
/// `CARE_ERR_BUFFER_TOO_SMALL`; pass `(NULL, 0)` to ask for the size.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_validation_report_message(
    report: *const care_validation_report,
    index: usize,
    buf: *mut c_char,
    buf_len: usize,
    len_out: *mut usize,
) -> care_result {
    ffi_panic_boundary! {
        let r = tri!(handle::get(report));
        let Some(v) = r.report.violations().get(index) else {
            // Check the other pointers first so that NULL is reported as NULL.
            tri!(Out::new(len_out));
            return care_result::CARE_ERR_OUT_OF_RANGE;
        };
        let mut msg = String::new();
        if v.write_message(&mut msg).is_err() {
            return care_result::CARE_ERR_INTERNAL;
        }
        // SAFETY: forwarded contract.
        unsafe { args::write_bytes(msg.as_bytes(), buf, buf_len, len_out) }
    }
}

/// Copies the whole validator feedback (every message, one per line) into `(buf, buf_len)`,
/// with the size protocol of `care_validation_report_message`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_validation_report_feedback(
    report: *const care_validation_report,
    buf: *mut c_char,
    buf_len: usize,
    len_out: *mut usize,
) -> care_result {
    ffi_panic_boundary! {
        let r = tri!(handle::get(report));
        let mut msg = String::new();
        if write!(msg, "{}", r.report).is_err() {
            return care_result::CARE_ERR_INTERNAL;
        }
        // SAFETY: forwarded contract.
        unsafe { args::write_bytes(msg.as_bytes(), buf, buf_len, len_out) }
    }
}

/// Frees a validation report. `care_validation_report_free(NULL)` does nothing and returns
/// `CARE_OK`; a report that was already freed or a handle of another type returns
/// `CARE_ERR_INVALID_HANDLE`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_validation_report_free(
    report: *mut care_validation_report,
) -> care_result {
    ffi_panic_boundary! {
        handle::free_code(report.cast_const())
    }
}

const _: () = assert!(MAX_VIOLATIONS == 64, "the C docs say 64");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_violation_codes_are_the_core_numbers() {
        let c = [
            care_violation_code::CARE_VIOLATION_NOT_JSON,
            care_violation_code::CARE_VIOLATION_TRAILING_TEXT,
            care_violation_code::CARE_VIOLATION_SCHEMA,
            care_violation_code::CARE_VIOLATION_UNKNOWN_CATEGORY,
            care_violation_code::CARE_VIOLATION_DUPLICATE_CATEGORY,
            care_violation_code::CARE_VIOLATION_MISSING_CATEGORY,
            care_violation_code::CARE_VIOLATION_CATEGORY_ORDER,
            care_violation_code::CARE_VIOLATION_KEY_ORDER,
            care_violation_code::CARE_VIOLATION_WEIGHT_RANGE,
            care_violation_code::CARE_VIOLATION_WEIGHT_SUM,
            care_violation_code::CARE_VIOLATION_CRITERIA_COUNT,
            care_violation_code::CARE_VIOLATION_LEVEL_FORMAT,
            care_violation_code::CARE_VIOLATION_DUPLICATE_TITLE,
            care_violation_code::CARE_VIOLATION_EMPTY_TEXT,
            care_violation_code::CARE_VIOLATION_CAPACITY,
            care_violation_code::CARE_VIOLATION_META_WORD,
        ];
        assert_eq!(
            c.len(),
            ViolationCode::ALL.len(),
            "every core code has a C value"
        );
        for (c, v) in c.iter().zip(ViolationCode::ALL) {
            assert_eq!(*c as u32, u32::from(v.number()), "{v:?}");
            assert!(
                format!("{c:?}").ends_with(&v.as_str().to_ascii_uppercase()),
                "{c:?} vs {v:?}"
            );
        }
        for d in Dimension::ALL {
            assert_eq!(Dimension::ALL[d.index()], d);
        }
        assert_eq!(
            care_dimension::CARE_DIMENSION_PROACTIVE as usize,
            Dimension::Proactive.index()
        );
    }

    #[test]
    fn policy_round_trips_through_the_c_struct() {
        for p in [FormatPolicy::PAPER, FormatPolicy::lenient()] {
            // SAFETY: pointer to a live, fully initialized struct.
            assert_eq!(unsafe { read_policy(&policy_to_c(&p)) }, Ok(p));
        }
        let mut c = policy_to_c(&FormatPolicy::PAPER);
        c.min_criteria = 5;
        // SAFETY: as above.
        assert_eq!(
            unsafe { read_policy(&c) },
            Err(care_result::CARE_ERR_INVALID_ARGUMENT)
        );
    }
}
