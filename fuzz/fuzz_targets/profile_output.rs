//! Rubric profiles on arbitrary bytes: the output check and reward of the built-in `kardia`
//! profile, and profile JSON parsing of the same bytes. Never panics; `r_fmt` is 1 exactly when
//! no violation is reported; spans are slices of the input; a malformed output scores 0 without
//! its scores being read; every reward is in [0, 1]; a profile that parses has no violation and
//! can check, judge-parse and score its own input.
#![no_main]

use care_core::ScoreOptions;
use care_core::profile::{Profile, parse_profile, parse_profile_judge_output, profile_reward};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let kardia = Profile::builtin("kardia").expect("the built-in profile parses");
    let check = kardia.check_output(data);
    assert_eq!(
        check.is_ok(),
        check.report().violations().is_empty() && !check.report().overflowed()
    );
    let range = data.as_ptr_range();
    for k in 0..kardia.span_count() {
        if let Some(s) = check.span(k)
            && !s.is_empty()
        {
            assert!(range.contains(&s.as_ptr()) && s.len() <= data.len());
        }
    }
    let opts = ScoreOptions::default();
    let r = profile_reward(
        &kardia,
        None,
        &check,
        &[4.0, 5.0, 3.0, 5.0, 2.0],
        Some("sad"),
        &opts,
    )
    .expect("valid scores and a gold label");
    assert!((0.0..=1.0).contains(&r.reward), "{r:?}");
    if !check.is_ok() {
        assert_eq!((r.reward, r.judge_needed), (0.0, false));
    } else {
        assert!(check.judge_text().is_some_and(|t| !t.trim().is_empty()));
    }

    let mut scratch = vec![0u8; data.len()];
    let v = parse_profile(data, &mut scratch);
    let Some(p) = v.profile else {
        assert!(!v.report.is_ok());
        return;
    };
    assert!(v.report.is_ok());
    let check = p.check_output(data);
    // A fixed profile scores on its own; a generated one needs a rubric (an error, not a panic).
    let Ok(total) = p.total_criteria(None) else {
        return;
    };
    let mut scores = vec![0.0; total];
    let _ = parse_profile_judge_output(data, &p, None, &mut scores);
    let (lo, _) = p.score_range();
    let scores = vec![f64::from(lo); total];
    let r = profile_reward(&p, None, &check, &scores, Some("joy"), &opts).expect("in-range scores");
    assert!((0.0..=1.0).contains(&r.reward), "{r:?}");
});
