//! `care-ffi`: the C ABI of `care` (`libcare.so`, `libcare.a`, header `include/care.h`).
//!
//! Conventions (also in the README's "C API" section):
//! * names are `care_<noun>_<verb>`; every fallible function returns `care_result`, `CARE_OK`
//!   (0) on success, codes grouped by hundreds and never renumbered;
//! * output parameters are written only on success (the one exception: a too-small output
//!   buffer reports the required size);
//! * every buffer is a `(pointer, length)` pair; `(NULL, 0)` is an empty input; every other
//!   NULL pointer is `CARE_ERR_NULL_POINTER`; lengths are checked against each other;
//! * `_free(NULL)` is a no-op; every body runs inside a panic boundary (`CARE_ERR_PANIC`).
//!
//! # Safety
//! Every exported function is `unsafe` for Rust callers and has the same contract: each
//! non-NULL pointer is valid for its documented length and type, handles come from this
//! library and are not used after their `_free`, and output buffers do not overlap inputs.
#![deny(missing_docs)]
// The safety contract is the same for every entry point and is written once above.
#![allow(clippy::missing_safety_doc)]

#[macro_use]
mod panic;
#[macro_use]
mod args;
mod handle;

pub mod advantage;
pub mod gpu;
pub mod logsoftmax;
pub mod loss;
pub mod result;
pub mod reward;
pub mod rubric;
pub mod version;

pub use result::care_result;
