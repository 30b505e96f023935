//! Rubric parse + validate on arbitrary bytes under an arbitrary policy and scratch size:
//! never panics, an invalid policy (and only that) is an error, `r_fmt` is 0 or 1, a valid
//! rubric really satisfies the checked invariants, and every violation renders a message.
#![no_main]

use care_core::format::MAX_VIOLATIONS;
use care_core::{Dimension, FormatPolicy, validate};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Byte 0: policy flags; byte 1: criteria bounds; byte 2: scratch size (a fraction of the
    // text, to reach the `capacity` path); the rest is the rubric text.
    let (head, text) = data.split_at(data.len().min(3));
    let b = |i: usize| head.get(i).copied().unwrap_or(0);
    let policy = FormatPolicy {
        allow_think: b(0) & 1 != 0,
        allow_code_fence: b(0) & 2 != 0,
        allow_envelope: b(0) & 4 != 0,
        require_order: b(0) & 8 == 0,
        require_key_order: b(0) & 16 == 0,
        meta_words: b(0) & 32 != 0,
        weight_tolerance: if b(0) & 64 != 0 { f64::NAN } else { 1e-3 },
        min_criteria: b(1) & 7,
        max_criteria: b(1) >> 3,
    };
    let scratch_len = if b(2) == 0 {
        text.len()
    } else {
        text.len() * usize::from(b(2)) / 256
    };
    let mut scratch = vec![0u8; scratch_len];
    let v = match validate(text, &policy, &mut scratch) {
        Ok(v) => v,
        Err(e) => {
            assert_eq!(e, care_core::Error::InvalidArgument);
            assert!(policy.check().is_err(), "{policy:?} rejected");
            return;
        }
    };
    assert!(policy.check().is_ok(), "{policy:?} accepted");
    let r = v.r_fmt();
    assert!(r == 0.0 || r == 1.0, "r_fmt {r}");
    assert!(v.report.violations().len() <= MAX_VIOLATIONS);
    if v.is_valid() {
        assert_eq!(r, 1.0);
        let rubric = v.rubric.as_ref().unwrap();
        let w = rubric.weights();
        assert!(w.iter().all(|x| (0.0..=1.0).contains(x)), "weights {w:?}");
        assert!((w.iter().sum::<f64>() - 1.0).abs() <= 1e-3, "weights {w:?}");
        for d in Dimension::ALL {
            let n = rubric.criteria(d).len();
            assert!(
                (usize::from(policy.min_criteria)..=usize::from(policy.max_criteria)).contains(&n)
            );
            for c in rubric.criteria(d) {
                assert!(!c.title.trim().is_empty() && !c.description.trim().is_empty());
            }
        }
    } else {
        assert_eq!(r, 0.0);
    }
    let mut s = String::new();
    for viol in v.report.violations() {
        viol.write_message(&mut s).unwrap();
        assert!(!viol.code.as_str().is_empty());
    }
    v.report.write_feedback(&mut s).unwrap();
    // The one-line contract of messages: feedback for a retry prompt is line-oriented.
    for viol in v.report.violations() {
        let mut m = String::new();
        viol.write_message(&mut m).unwrap();
        assert!(!m.contains('\n'), "multi-line message {m:?}");
    }
    // Scoring a recovered rubric never panics and stays in range.
    if let Some(rubric) = v.rubric.as_ref() {
        let scores = vec![3.0; rubric.total_criteria()];
        if let Ok(p) = care_core::policy_reward(rubric, &scores, &Default::default()) {
            assert!((0.0..=1.0).contains(&p.reward), "r_theta {}", p.reward);
        }
    }
});
