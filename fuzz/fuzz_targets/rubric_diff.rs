//! Differential: `care-core`'s zero-copy `no_std` rubric validator against the independent
//! serde_json reference of `care-tests` (see `tests/src/oracle.rs` for the exact relation:
//! both accept or both reject, accepted rubrics agree field by field, and JSON syntax errors
//! are seen by both).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(why) = care_tests::oracle::compare(data) {
        panic!("differential mismatch: {why}");
    }
});
