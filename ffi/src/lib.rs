//! `care-ffi`: the C ABI of `care` (`libcare.so` and `libcare.a`, built by the `libcare`
//! package; header `include/care.h`).
//!
//! Conventions (also in the README's "C API" section):
//! * **names**: every symbol starts with `care_`. A function that computes a quantity of the
//!   contract is named after it, as in Rust (`care_policy_reward`, `care_group_advantages`,
//!   `care_selective_log_softmax`); a function that makes, reads or changes an object is
//!   `care_<object>_<verb>` (`care_rubric_parse`, `care_loss_stats_add`,
//!   `care_strategy_counts_from_labels`), an accessor `care_<object>_<property>`
//!   (`care_rubric_weights`); device variants put `gpu` after `care_`
//!   (`care_gpu_policy_loss`). Types are `care_<noun>`, constants `CARE_<NAME>`;
//! * every fallible function returns `care_result`, `CARE_OK` (0) on success, codes grouped by
//!   hundreds and never renumbered;
//! * output parameters are written only on success (the one exception: a too-small output
//!   buffer reports the required size);
//! * every buffer is a `(pointer, length)` pair; `(NULL, 0)` is an empty input; every other
//!   NULL pointer is `CARE_ERR_NULL_POINTER`; lengths are checked against each other;
//! * inputs that travel together are size-versioned structs shared by the CPU and GPU entry
//!   points (`care_loss_inputs`, `care_logits`, `care_group_layout`, ...), options are
//!   size-versioned structs too (NULL: the defaults): the first field of each is
//!   `struct_size`, and a smaller one is `CARE_ERR_STRUCT_SIZE`; enum fields are `uint32_t`
//!   (unknown value: `CARE_ERR_INVALID_ARGUMENT`), boolean fields are integers that must be 0
//!   or 1 (`CARE_ERR_INVALID_BOOL`); no function takes more than eight parameters;
//! * handles (`care_rubric`, `care_validation_report`, `care_profile`, `care_profile_report`)
//!   are tokens checked on every call, not addresses: a use after free, a double free or a
//!   handle of another type is `CARE_ERR_INVALID_HANDLE`, never undefined behaviour (see
//!   `handle.rs`); `_free(NULL)` is a no-op;
//! * every body runs inside a panic boundary (`CARE_ERR_PANIC`);
//! * after a failed call, `care_last_error_detail` gives the sentence behind the code (which
//!   argument, which sizes, what to fix), kept per thread until the thread's next call that
//!   returns a `care_result`.
//!
//! # Safety
//! Every exported function is `unsafe` for Rust callers and has the same contract: each
//! non-NULL pointer (including those inside input structs) is valid for its documented length
//! and type, and output buffers do not overlap inputs. Handles need no such promise: any value
//! passed as a handle is checked (a stale or foreign one is `CARE_ERR_INVALID_HANDLE`).
#![deny(missing_docs)]
// The safety contract is the same for every entry point and is written once above.
#![allow(clippy::missing_safety_doc)]

#[macro_use]
mod panic;
#[macro_use]
mod args;
#[macro_use]
mod handle;

pub mod advantage;
pub mod detail;
pub mod gae;
pub mod gpu;
pub mod logsoftmax;
pub mod loss;
pub mod profile;
pub mod result;
pub mod reward;
pub mod rubric;
pub mod version;

pub use result::care_result;
