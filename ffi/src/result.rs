//! `care_result`: the one status code every fallible C function returns.
//!
//! The numbers of core failures are `care_core::Error::number()` (mapped exhaustively by
//! [`map_error`], checked by a test over `Error::ALL`). Codes that only the C ABI can produce take
//! numbers from 150 upward in their group, so that new core variants (which take the next free
//! number after the existing ones) never collide with them. Codes are never renumbered.

use care_core::Error;

/// Status of a C API call: `CARE_OK` (0) or an error code grouped by hundreds (1xx arguments,
/// 2xx parse and format, 3xx rubric invariants and scores, 4xx numerics and layouts, 5xx CUDA,
/// 9xx internal). Get a description with `care_result_message`.
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum care_result {
    /// Success; output parameters have been written.
    CARE_OK = 0,

    // ---- 1xx: arguments (101-104 = care_core::Error) -------------------------------------
    /// Two inputs that must have matching lengths do not.
    CARE_ERR_LENGTH_MISMATCH = 101,
    /// An argument is outside its documented domain (includes unknown enum values).
    CARE_ERR_INVALID_ARGUMENT = 102,
    /// A caller-provided output buffer is too small (the required size is reported).
    CARE_ERR_BUFFER_TOO_SMALL = 103,
    /// An empty input where at least one element is required.
    CARE_ERR_EMPTY = 104,
    /// A required pointer argument is NULL.
    CARE_ERR_NULL_POINTER = 150,
    /// An input or options struct's `struct_size` is smaller than the fields this library reads.
    CARE_ERR_STRUCT_SIZE = 151,
    /// An index (dimension, criterion, violation) is out of range.
    CARE_ERR_OUT_OF_RANGE = 152,
    /// A boolean field of an input or options struct holds a value other than 0 or 1.
    CARE_ERR_INVALID_BOOL = 153,
    /// A handle argument is not a live handle of its type: already freed (a use after free or
    /// a double free), of another handle type, or never returned by this library. Nothing was
    /// read through it and nothing changed.
    CARE_ERR_INVALID_HANDLE = 154,

    // ---- 2xx: parse and format (= care_core::Error) ----------------------------------------
    /// The text is not one JSON value.
    CARE_ERR_NOT_JSON = 201,
    /// Non-whitespace text before or after the JSON value.
    CARE_ERR_TRAILING_TEXT = 202,
    /// Wrong JSON type, missing key or unknown key.
    CARE_ERR_SCHEMA = 203,
    /// The input exceeds a fixed capacity.
    CARE_ERR_CAPACITY = 204,
    /// The input is not valid UTF-8.
    CARE_ERR_INVALID_UTF8 = 205,
    /// The rubric parsed but breaks the format contract (see the validation report).
    CARE_ERR_FORMAT_VIOLATION = 206,
    /// The judge output holds no JSON object with `criterion_scores`.
    CARE_ERR_NO_JUDGE_JSON = 207,
    /// The profile JSON breaks the profile schema (`care_profile_validate` lists every
    /// violation).
    CARE_ERR_INVALID_PROFILE = 250,

    // ---- 3xx: rubric invariants and scores (= care_core::Error) ----------------------------
    /// Weights that are negative, non-finite, or sum to zero where a positive sum is required.
    CARE_ERR_INVALID_WEIGHTS = 301,
    /// A criterion has no score and the missing-score policy is `error`.
    CARE_ERR_MISSING_SCORE = 302,
    /// A score outside `0..=5` or non-integral, and the out-of-range policy is `error`.
    CARE_ERR_SCORE_OUT_OF_RANGE = 303,
    /// A strategy label that maps to no dimension, and the unknown-label policy is `error`.
    CARE_ERR_UNKNOWN_LABEL = 304,
    /// A judge score names a criterion that the rubric does not have.
    CARE_ERR_UNKNOWN_CRITERION = 305,
    /// The score layout does not match the rubric's criteria.
    CARE_ERR_SCORE_SHAPE = 306,

    // ---- 4xx: numerics and layouts (= care_core::Error) ------------------------------------
    /// Invalid group or sequence offsets, or a group size of 0 / not dividing the length.
    CARE_ERR_INVALID_LAYOUT = 401,
    /// A group has exactly one valid sample and the singleton policy is `error`.
    CARE_ERR_SINGLETON_GROUP = 402,
    /// A non-finite value where only finite values are allowed.
    CARE_ERR_NON_FINITE = 403,

    // ---- 5xx: CUDA ---------------------------------------------------------------------------
    /// No CUDA driver (`libcuda.so.1`) or no device is present, or GPU support is not built in.
    CARE_ERR_CUDA_UNAVAILABLE = 501,
    /// A CUDA driver call failed (bad device pointer, wrong context, launch failure).
    CARE_ERR_CUDA_DRIVER = 502,
    /// Compiling or loading the kernels failed (NVRTC or module load).
    CARE_ERR_CUDA_COMPILE = 503,

    // ---- 9xx: internal -------------------------------------------------------------------------
    /// A Rust panic was caught at the API boundary; the library state is unchanged.
    CARE_ERR_PANIC = 901,
    /// A core error this version of the C ABI does not know (a bug: please report it).
    CARE_ERR_INTERNAL = 902,
}

/// cbindgen:ignore
impl care_result {
    /// Every code, in number order (for the message table test and the header check).
    pub const ALL: [care_result; 32] = [
        care_result::CARE_OK,
        care_result::CARE_ERR_LENGTH_MISMATCH,
        care_result::CARE_ERR_INVALID_ARGUMENT,
        care_result::CARE_ERR_BUFFER_TOO_SMALL,
        care_result::CARE_ERR_EMPTY,
        care_result::CARE_ERR_NULL_POINTER,
        care_result::CARE_ERR_STRUCT_SIZE,
        care_result::CARE_ERR_OUT_OF_RANGE,
        care_result::CARE_ERR_INVALID_BOOL,
        care_result::CARE_ERR_INVALID_HANDLE,
        care_result::CARE_ERR_NOT_JSON,
        care_result::CARE_ERR_TRAILING_TEXT,
        care_result::CARE_ERR_SCHEMA,
        care_result::CARE_ERR_CAPACITY,
        care_result::CARE_ERR_INVALID_UTF8,
        care_result::CARE_ERR_FORMAT_VIOLATION,
        care_result::CARE_ERR_NO_JUDGE_JSON,
        care_result::CARE_ERR_INVALID_PROFILE,
        care_result::CARE_ERR_INVALID_WEIGHTS,
        care_result::CARE_ERR_MISSING_SCORE,
        care_result::CARE_ERR_SCORE_OUT_OF_RANGE,
        care_result::CARE_ERR_UNKNOWN_LABEL,
        care_result::CARE_ERR_UNKNOWN_CRITERION,
        care_result::CARE_ERR_SCORE_SHAPE,
        care_result::CARE_ERR_INVALID_LAYOUT,
        care_result::CARE_ERR_SINGLETON_GROUP,
        care_result::CARE_ERR_NON_FINITE,
        care_result::CARE_ERR_CUDA_UNAVAILABLE,
        care_result::CARE_ERR_CUDA_DRIVER,
        care_result::CARE_ERR_CUDA_COMPILE,
        care_result::CARE_ERR_PANIC,
        care_result::CARE_ERR_INTERNAL,
    ];

    /// The code for a number, if it is one (C passes codes back as plain integers).
    pub fn from_number(n: u32) -> Option<care_result> {
        care_result::ALL.iter().copied().find(|r| *r as u32 == n)
    }

    /// A NUL-terminated, one-line description (static storage).
    pub const fn message_cstr(self) -> &'static core::ffi::CStr {
        use care_result::*;
        match self {
            CARE_OK => c"ok",
            CARE_ERR_LENGTH_MISMATCH => c"input lengths do not match",
            CARE_ERR_INVALID_ARGUMENT => c"argument outside its valid domain",
            CARE_ERR_BUFFER_TOO_SMALL => c"output or scratch buffer too small",
            CARE_ERR_EMPTY => c"input is empty",
            CARE_ERR_NULL_POINTER => c"a required pointer argument is NULL",
            CARE_ERR_STRUCT_SIZE => {
                c"struct_size smaller than the struct (set it to sizeof, or use the _default function)"
            }
            CARE_ERR_OUT_OF_RANGE => c"index out of range",
            CARE_ERR_INVALID_BOOL => c"a boolean field is neither 0 nor 1",
            CARE_ERR_INVALID_HANDLE => {
                c"not a live handle of this type (already freed, of another type, or not from this library)"
            }
            CARE_ERR_NOT_JSON => c"text is not one JSON value",
            CARE_ERR_TRAILING_TEXT => c"text before or after the JSON value",
            CARE_ERR_SCHEMA => c"wrong JSON type, missing key or unknown key",
            CARE_ERR_CAPACITY => c"input exceeds a fixed capacity",
            CARE_ERR_INVALID_UTF8 => c"input is not valid UTF-8",
            CARE_ERR_FORMAT_VIOLATION => c"rubric breaks the format contract",
            CARE_ERR_NO_JUDGE_JSON => c"judge output holds no criterion_scores object",
            CARE_ERR_INVALID_PROFILE => {
                c"profile breaks the profile schema (care_profile_validate lists every violation)"
            }
            CARE_ERR_INVALID_WEIGHTS => c"weights are negative, non-finite or sum to zero",
            CARE_ERR_MISSING_SCORE => c"a criterion has no score",
            CARE_ERR_SCORE_OUT_OF_RANGE => c"score outside 0..=5 or not an integer",
            CARE_ERR_UNKNOWN_LABEL => c"strategy label maps to no dimension",
            CARE_ERR_UNKNOWN_CRITERION => c"score names a criterion the rubric does not have",
            CARE_ERR_SCORE_SHAPE => c"scores do not match the rubric's criteria",
            CARE_ERR_INVALID_LAYOUT => c"invalid group or sequence layout",
            CARE_ERR_SINGLETON_GROUP => c"group with a single valid sample",
            CARE_ERR_NON_FINITE => c"non-finite value",
            CARE_ERR_CUDA_UNAVAILABLE => c"no CUDA driver or device (or GPU support not built in)",
            CARE_ERR_CUDA_DRIVER => c"a CUDA driver call failed",
            CARE_ERR_CUDA_COMPILE => c"compiling or loading the CUDA kernels failed",
            CARE_ERR_PANIC => c"internal panic caught at the C boundary",
            CARE_ERR_INTERNAL => c"unknown internal error",
        }
    }
}

/// Maps a core error to its C code: the same number (see the module docs).
pub fn map_error(e: Error) -> care_result {
    use care_result::*;
    match e {
        Error::LengthMismatch => CARE_ERR_LENGTH_MISMATCH,
        Error::InvalidArgument => CARE_ERR_INVALID_ARGUMENT,
        Error::BufferTooSmall => CARE_ERR_BUFFER_TOO_SMALL,
        Error::Empty => CARE_ERR_EMPTY,
        Error::NotJson => CARE_ERR_NOT_JSON,
        Error::TrailingText => CARE_ERR_TRAILING_TEXT,
        Error::Schema => CARE_ERR_SCHEMA,
        Error::Capacity => CARE_ERR_CAPACITY,
        Error::InvalidUtf8 => CARE_ERR_INVALID_UTF8,
        Error::FormatViolation => CARE_ERR_FORMAT_VIOLATION,
        Error::NoJudgeJson => CARE_ERR_NO_JUDGE_JSON,
        Error::InvalidWeights => CARE_ERR_INVALID_WEIGHTS,
        Error::MissingScore => CARE_ERR_MISSING_SCORE,
        Error::ScoreOutOfRange => CARE_ERR_SCORE_OUT_OF_RANGE,
        Error::UnknownLabel => CARE_ERR_UNKNOWN_LABEL,
        Error::UnknownCriterion => CARE_ERR_UNKNOWN_CRITERION,
        Error::ScoreShape => CARE_ERR_SCORE_SHAPE,
        Error::InvalidLayout => CARE_ERR_INVALID_LAYOUT,
        Error::SingletonGroup => CARE_ERR_SINGLETON_GROUP,
        Error::NonFinite => CARE_ERR_NON_FINITE,
        // `Error` is `#[non_exhaustive]`: a variant added to the core after this table was
        // written gets a clear "internal" code instead of a wrong one; the test below fails
        // as soon as `Error::ALL` lists such a variant, so the table gets updated.
        _ => CARE_ERR_INTERNAL,
    }
}

impl From<Error> for care_result {
    fn from(e: Error) -> Self {
        map_error(e)
    }
}

/// A NUL-terminated, static, one-line description of `result` (any integer is accepted; unknown
/// numbers give "unknown result code"). Never NULL; do not free.
///
/// ```c
/// care_result r = care_rubric_parse(...);
/// if (r != CARE_OK) fprintf(stderr, "care: %s (%u)\n", care_result_message(r), r);
/// ```
#[unsafe(no_mangle)]
pub extern "C" fn care_result_message(result: u32) -> *const core::ffi::c_char {
    ffi_panic_boundary! {
        match care_result::from_number(result) {
            Some(r) => r.message_cstr().as_ptr(),
            None => c"unknown result code".as_ptr(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_core_error_maps_to_its_own_number() {
        for e in Error::ALL {
            let r = map_error(e);
            assert_ne!(r, care_result::CARE_ERR_INTERNAL, "{e:?} is not mapped");
            assert_eq!(r as u32, e.number(), "{e:?}");
        }
    }

    #[test]
    fn codes_are_unique_grouped_and_ffi_only_codes_avoid_core_numbers() {
        let codes: Vec<u32> = care_result::ALL.iter().map(|r| *r as u32).collect();
        for (i, a) in codes.iter().enumerate() {
            assert!(!codes[i + 1..].contains(a), "duplicate code {a}");
            assert!(*a == 0 || (100..1000).contains(a));
        }
        let core: Vec<u32> = Error::ALL.iter().map(|e| e.number()).collect();
        for c in &codes {
            let is_ffi_only = !core.contains(c);
            if is_ffi_only && (100..500).contains(c) {
                assert!(
                    c % 100 >= 50,
                    "FFI-only code {c} may collide with a future core code"
                );
            }
        }
    }

    #[test]
    fn message_lookup_round_trips() {
        for r in care_result::ALL {
            assert_eq!(care_result::from_number(r as u32), Some(r));
            // SAFETY: the function returns a pointer to a static NUL-terminated string.
            let s = unsafe { core::ffi::CStr::from_ptr(care_result_message(r as u32)) };
            assert!(!s.to_bytes().is_empty());
        }
        // SAFETY: as above.
        let s = unsafe { core::ffi::CStr::from_ptr(care_result_message(7)) };
        assert_eq!(s.to_bytes(), b"unknown result code");
    }
}
