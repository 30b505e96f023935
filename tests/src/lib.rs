//! `care-tests`: reliability checks of `care` that span crates.
//!
//! The library half is [`oracle`]: an independent implementation of the rubric format contract
//! (SPEC §2, §3 under the `paper` policy) on top of `serde_json`, written from the SPEC and not
//! from `care-core`'s source. The differential fuzz target (`fuzz/fuzz_targets/rubric_diff.rs`)
//! and the tests in `tests/` compare it with the zero-copy `no_std` validator of `care-core`.
//! [`peers`] transcribes the GRPO formulas of verl, TRL and OpenRLHF, independently of
//! `care-core`, for the differential suite of the GRPO step (`tests/peers.rs`).
//! The integration tests hold the hostile-input tests and the named regression tests.
#![deny(missing_docs)]

pub mod oracle;
pub mod peers;
