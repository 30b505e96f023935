//! Judge-output parsing on arbitrary bytes against a paper rubric: never panics, every
//! matched score is finite, unmatched criteria are NaN, and the report's counts add up.
#![no_main]

use care_core::{FormatPolicy, RubricBuf, parse_judge_output, validate};
use libfuzzer_sys::fuzz_target;
use std::sync::LazyLock;

static RUBRIC: LazyLock<RubricBuf> = LazyLock::new(|| {
    let text = include_bytes!("../../cli/data/rubric_sft_1.json");
    let mut scratch = vec![0u8; text.len()];
    let v = validate(text, &FormatPolicy::PAPER, &mut scratch).expect("the paper policy is valid");
    RubricBuf::from(v.rubric.as_ref().expect("the paper fixture parses"))
});

fuzz_target!(|data: &[u8]| {
    let rubric = RUBRIC.rubric();
    let total = rubric.total_criteria();
    let mut out = vec![0.0f64; total];
    match parse_judge_output(data, &rubric, &mut out) {
        Ok(rep) => {
            let scored = out.iter().filter(|x| !x.is_nan()).count();
            assert!(out.iter().all(|x| x.is_nan() || x.is_finite()), "{out:?}");
            assert_eq!(rep.matched as usize, scored, "{rep:?}");
            assert_eq!(rep.missing as usize, total - scored, "{rep:?}");
            assert!(rep.case_insensitive <= rep.matched && rep.out_of_range <= rep.matched);
        }
        Err(e) => {
            assert!(
                out.iter().all(|x| x.is_nan()),
                "outputs after {e:?}: {out:?}"
            );
        }
    }
    // A wrong output length is an error, not an out-of-bounds write.
    let mut short = vec![0.0f64; total.saturating_sub(1)];
    assert!(parse_judge_output(data, &rubric, &mut short).is_err());
});
