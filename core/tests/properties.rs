//! Property tests of the rubric side of `care-core`. Each test names the relation it checks.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use care_core::align::alignment;
use care_core::batch::{GroupReport, policy_reward_group_fixed};
use care_core::format::{FormatPolicy, Validation, validate, validate_str, validate_str_into};
use care_core::judge::parse_judge_output;
use care_core::reward::{
    MissingPolicy, PreferenceOptions, RangePolicy, ScoreOptions, policy_reward_fixed,
    preference_reward_fixed,
};
use care_core::rubric::{Dimension, Rubric};
use care_core::simplex::{is_on_simplex, normalize_l1, project_to_simplex, scoring_weights};
use proptest::prelude::*;

/// Integer judge scores 0..=5 for `counts` criteria.
fn layout() -> impl Strategy<Value = ([usize; 3], Vec<f64>)> {
    [0usize..=4, 0usize..=4, 0usize..=4].prop_flat_map(|c| {
        let n = c.iter().sum::<usize>();
        (
            Just(c),
            prop::collection::vec((0u8..=5).prop_map(f64::from), n),
        )
    })
}

/// Any weights, including negative, huge, NaN and infinite ones.
fn any_weights() -> impl Strategy<Value = [f64; 3]> {
    let w = prop_oneof![
        4 => 0.0f64..1.0,
        1 => -10.0f64..10.0,
        1 => Just(0.0),
        1 => prop::num::f64::ANY,
    ];
    [w.clone(), w.clone(), w]
}

/// A group of `m` responses under `counts` whose scores are mostly valid, with NaN, fractional,
/// negative, too large and infinite ones mixed in.
fn group_layout() -> impl Strategy<Value = ([usize; 3], usize, Vec<f64>)> {
    ([0usize..=6, 0usize..=6, 0usize..=6], 0usize..8).prop_flat_map(|(c, m)| {
        let n = c.iter().sum::<usize>() * m;
        let score = prop_oneof![
            12 => (0u8..=5).prop_map(f64::from),
            1 => Just(f64::NAN),
            1 => -1.0f64..7.0,
            1 => prop_oneof![Just(f64::INFINITY), Just(-0.0), Just(5.5), Just(-1.0), Just(6.0)],
        ];
        (Just(c), Just(m), prop::collection::vec(score, n))
    })
}

fn any_score_options() -> impl Strategy<Value = ScoreOptions> {
    (0u8..3, any::<bool>(), any::<bool>()).prop_map(|(missing, clamp, uniform_weights)| {
        ScoreOptions {
            missing: [
                MissingPolicy::Error,
                MissingPolicy::Zero,
                MissingPolicy::Skip,
            ][usize::from(missing)],
            out_of_range: if clamp {
                RangePolicy::Clamp
            } else {
                RangePolicy::Error
            },
            uniform_weights,
        }
    })
}

fn fixture(name: &str) -> Vec<u8> {
    let p = format!("{}/../cli/data/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&p).unwrap()
}

proptest! {
    /// Scoring a group (which has a fast path for plain integer scores) gives every response
    /// exactly, bit for bit, the reward `policy_reward_fixed` gives it alone (NaN for a failure),
    /// and the report counts and merges what the single calls report.
    #[test]
    fn group_scoring_is_bit_identical_to_scoring_each_response(
        w in any_weights(),
        (counts, m, s) in group_layout(),
        opts in any_score_options(),
    ) {
        let mut out = vec![0.25; m];
        let rep = policy_reward_group_fixed(w, counts, &opts, &s, &mut out).unwrap();
        let total: usize = counts.iter().sum();
        let mut want = GroupReport::default();
        for (j, &got) in out.iter().enumerate() {
            match policy_reward_fixed(w, counts, &s[j * total..(j + 1) * total], &opts) {
                Ok(r) => {
                    prop_assert_eq!(got.to_bits(), r.reward.to_bits(), "response {}", j);
                    want.scored += 1;
                    want.fired.merge(&r.fired);
                }
                Err(e) => {
                    prop_assert!(got.is_nan(), "response {}: {}", j, got);
                    want.failed += 1;
                    want.first_error = want.first_error.or(Some((j, e)));
                }
            }
        }
        prop_assert_eq!(rep, want);
    }

    /// `validate_str` (no UTF-8 check) reports exactly what `validate` reports on the same
    /// text, for arbitrary text and for corrupted copies of a paper fixture.
    #[test]
    fn validate_str_agrees_with_validate(
        text in prop_oneof!["\\PC{0,64}", "[{}\\[\\]\",: 0-9a-z\\\\]{0,64}"],
        cut in 0usize..4000,
    ) {
        let fixture = String::from_utf8(fixture("rubric_sft_1.json")).unwrap();
        let mut end = cut.min(fixture.len());
        while !fixture.is_char_boundary(end) {
            end -= 1;
        }
        for t in [text.clone(), format!("{}{}", &fixture[..end], text)] {
            let mut s1 = vec![0u8; t.len()];
            let mut s2 = vec![0u8; t.len()];
            let a = validate(t.as_bytes(), &FormatPolicy::PAPER, &mut s1).unwrap();
            let b = validate_str(&t, &FormatPolicy::PAPER, &mut s2).unwrap();
            prop_assert_eq!(a, b);
        }
    }

    /// `validate_str_into` leaves in `out` exactly what `validate_str` returns, whatever
    /// `out` held before (here: the validation of another text, a broken fixture with many
    /// violations or a valid one), so a reused `Validation` never leaks an earlier rubric or
    /// violation; an invalid policy is an error that leaves `out` unchanged.
    #[test]
    fn validate_str_into_equals_validate_str_on_a_used_validation(
        text in prop_oneof!["\\PC{0,64}", "[{}\\[\\]\",: 0-9a-z\\\\]{0,64}"],
        cut in 0usize..4000,
        before in 0usize..3,
    ) {
        let fixture = String::from_utf8(fixture("rubric_sft_1.json")).unwrap();
        let mut end = cut.min(fixture.len());
        while !fixture.is_char_boundary(end) {
            end -= 1;
        }
        let earlier = [
            fixture.clone(),
            fixture.replace("[3]", "[9]").replace("0.", "7."),
            "[1, 2".to_owned(),
        ];
        let mut s0 = vec![0u8; 4096 + fixture.len()];
        for t in [text.clone(), format!("{}{}", &fixture[..end], text)] {
            let mut s1 = vec![0u8; t.len()];
            let mut s2 = vec![0u8; t.len()];
            let mut s3 = vec![0u8; t.len()];
            let want = validate_str(&t, &FormatPolicy::PAPER, &mut s1).unwrap();
            let mut out = Validation::default();
            validate_str_into(&earlier[before], &FormatPolicy::PAPER, &mut s0, &mut out).unwrap();
            let held = out.clone();
            let bad = FormatPolicy { min_criteria: 9, max_criteria: 1, ..FormatPolicy::PAPER };
            prop_assert!(validate_str_into(&t, &bad, &mut s3, &mut out).is_err());
            prop_assert_eq!(&out, &held);
            validate_str_into(&t, &FormatPolicy::PAPER, &mut s2, &mut out).unwrap();
            prop_assert_eq!(out, want);
        }
    }

    /// r_theta in [0, 1] for any weights and any in-range scores.
    #[test]
    fn r_theta_in_unit_interval(w in any_weights(), (counts, s) in layout()) {
        let r = policy_reward_fixed(w, counts, &s, &ScoreOptions::default()).unwrap();
        prop_assert!((0.0..=1.0).contains(&r.reward), "{}", r.reward);
    }

    /// r_pref in (-1, 1), and swapping chosen and rejected negates it exactly.
    #[test]
    fn r_pref_bounded_and_antisymmetric(
        w in any_weights(),
        (counts, a) in layout(),
        seed in prop::collection::vec(0u8..=5, 12),
    ) {
        let b: Vec<f64> = a.iter().zip(seed.iter().cycle()).map(|(_, &x)| f64::from(x)).collect();
        let o = ScoreOptions::default();
        let p = PreferenceOptions::default();
        let ab = preference_reward_fixed(w, counts, &a, &b, &o, &p).unwrap().reward;
        let ba = preference_reward_fixed(w, counts, &b, &a, &o, &p).unwrap().reward;
        prop_assert!(ab > -1.0 && ab < 1.0, "{ab}");
        prop_assert_eq!(ab, -ba);
    }

    /// r_align takes only the values 0, 0.5 and 1.
    #[test]
    fn r_align_in_three_values(w in any_weights(), n in [0u32..4, 0u32..4, 0u32..4]) {
        let a = alignment(w, n);
        prop_assert!(a.reward == 0.0 || a.reward == 0.5 || a.reward == 1.0, "{}", a.reward);
        let v = u32::from(a.top_violation) + a.zero_violations;
        prop_assert_eq!(a.reward, (1.0 - 0.5 * f64::from(v)).max(0.0));
    }

    /// r_theta is non-decreasing in every single score.
    #[test]
    fn r_theta_monotone_in_each_score(w in any_weights(), (counts, s) in layout(), pick in any::<prop::sample::Index>()) {
        prop_assume!(!s.is_empty());
        let i = pick.index(s.len());
        prop_assume!(s[i] < 5.0);
        let mut up = s.clone();
        up[i] += 1.0;
        let o = ScoreOptions::default();
        let lo = policy_reward_fixed(w, counts, &s, &o).unwrap().reward;
        let hi = policy_reward_fixed(w, counts, &up, &o).unwrap().reward;
        prop_assert!(hi >= lo, "{lo} -> {hi}");
    }

    /// r_theta is unchanged (exactly) when the criteria of each dimension are permuted together
    /// with their scores, in a Rubric built in either order.
    #[test]
    fn r_theta_invariant_under_criterion_order(w in any_weights(), (counts, s) in layout(), rot in 0usize..4) {
        let mut permuted = Vec::with_capacity(s.len());
        let mut start = 0;
        for &n in &counts {
            let mut dim = s[start..start + n].to_vec();
            if n > 0 {
                dim.rotate_left(rot % n);
                dim.reverse();
            }
            permuted.extend(dim);
            start += n;
        }
        let o = ScoreOptions::default();
        let a = policy_reward_fixed(w, counts, &s, &o).unwrap();
        let b = policy_reward_fixed(w, counts, &permuted, &o).unwrap();
        prop_assert_eq!(a.reward, b.reward);
        // The same through a Rubric.
        let mut r = Rubric::new();
        for d in Dimension::ALL {
            r.set_category(d, w[d.index()], "");
            for _ in 0..counts[d.index()] {
                r.push_criterion(d, "t", "d").unwrap();
            }
        }
        let c = care_core::reward::policy_reward(&r, &permuted, &o).unwrap();
        prop_assert_eq!(a.reward, c.reward);
    }

    /// Every normalization lands on the simplex: L1 for non-negative weights with a positive
    /// sum, Euclidean projection for any finite weights, scoring weights for anything at all.
    #[test]
    fn weights_after_normalization_are_on_the_simplex(
        nonneg in [0.0f64..1e6, 0.0f64..1e6, 0.0f64..1e6],
        finite in [-1e6f64..1e6, -1e6f64..1e6, -1e6f64..1e6],
        any in any_weights(),
    ) {
        if nonneg.iter().any(|&x| x > 0.0) {
            prop_assert!(is_on_simplex(&normalize_l1(nonneg).unwrap(), 1e-12));
        }
        prop_assert!(is_on_simplex(&project_to_simplex(finite).unwrap(), 1e-9));
        prop_assert!(is_on_simplex(&scoring_weights(any), 1e-12));
    }

    /// Validating any byte string never panics; r_fmt is 0 or 1, and 1 only with a rubric.
    #[test]
    fn validate_any_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let mut scratch = [0u8; 256];
        let v = validate(&bytes, &FormatPolicy::lenient(), &mut scratch).unwrap();
        let f = v.r_fmt();
        prop_assert!(f == 0.0 || f == 1.0);
        prop_assert!(f == 0.0 || v.rubric.is_some());
        let mut s = String::new();
        v.report.write_feedback(&mut s).unwrap();
        let mut out = [0.0; 4];
        let mut r = Rubric::new();
        for d in Dimension::ALL {
            r.push_criterion(d, "t", "d").unwrap();
        }
        r.push_criterion(Dimension::Cognitive, "u", "d").unwrap();
        let _ = parse_judge_output(&bytes, &r, &mut out);
    }

    /// Validating a corrupted paper rubric (bytes overwritten, truncated, or spliced) never
    /// panics, and every violation message renders.
    #[test]
    fn validate_corrupted_fixture_never_panics(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let mut text = fixture("rubric_sft_1.json");
        for (i, b) in &edits {
            let k = i.index(text.len());
            text[k] = *b;
        }
        if truncate {
            text.truncate(cut.index(text.len()));
        }
        for policy in [FormatPolicy::PAPER, FormatPolicy { meta_words: true, ..FormatPolicy::lenient() }] {
            let mut scratch = [0u8; 64];
            let v = validate(&text, &policy, &mut scratch).unwrap();
            for x in v.report.violations() {
                prop_assert!(!x.to_string().is_empty());
            }
            if let Some(r) = v.rubric {
                prop_assert!(r.total_criteria() <= care_core::rubric::MAX_TOTAL_CRITERIA);
            }
        }
    }

    /// Judge parsing of JSON-ish text never panics and never writes outside its contract:
    /// every output is NaN or a finite number.
    #[test]
    fn judge_parse_jsonish_never_panics(
        parts in prop::collection::vec(prop_oneof![
            Just("{"), Just("}"), Just("["), Just("]"), Just(","), Just(":"), Just("\""),
            Just("criterion_scores"), Just("category"), Just("criterion_title"), Just("score"),
            Just("Cognitive Empathy"), Just("t"), Just("3"), Just("```json\n"), Just("```"),
            Just("</think>"), Just("\\u00"), Just(" "),
        ], 0..64),
    ) {
        let text: String = parts.concat();
        let mut r = Rubric::new();
        r.push_criterion(Dimension::Cognitive, "t", "d").unwrap();
        let mut out = [0.0; 1];
        if parse_judge_output(text.as_bytes(), &r, &mut out).is_ok() {
            prop_assert!(out[0].is_nan() || out[0].is_finite());
        }
    }

    /// Decoding round-trips: a title encoded by serde_json (escapes for quotes, backslashes,
    /// control characters; optionally every non-ASCII char as \uXXXX) comes back equal, and
    /// a scratch buffer of `text.len()` bytes is always enough.
    #[test]
    fn escaped_strings_round_trip(title in "\\PC{1,24}", ascii_only in any::<bool>()) {
        prop_assume!(!title.trim().is_empty());
        let mut enc = serde_json::to_string(&title).unwrap();
        if ascii_only {
            let mut e = String::new();
            for c in enc.chars() {
                if c.is_ascii() {
                    e.push(c);
                } else {
                    let mut buf = [0u16; 2];
                    for u in c.encode_utf16(&mut buf) {
                        e.push_str(&format!("\\u{u:04x}"));
                    }
                }
            }
            enc = e;
        }
        let d = "[0] a [1] b [2] c [3] d [4] e [5] f value: 0, 1, 2, 3, 4, 5";
        let text = format!(
            r#"{{"categories":[{{"category":"Cognitive Empathy","weight_rationale":{enc},"category_weight":1,"criteria":[{{"title":{enc},"description":"{d}"}},{{"title":"other","description":"{d}"}}]}}]}}"#
        );
        let mut scratch = vec![0u8; text.len()];
        let v = validate(text.as_bytes(), &FormatPolicy::PAPER, &mut scratch).unwrap();
        prop_assert!(!v.report.has(care_core::ViolationCode::Capacity));
        let r = v.rubric.unwrap();
        prop_assert_eq!(r.criteria(Dimension::Cognitive)[0].title, title.as_str());
        prop_assert_eq!(r.category(Dimension::Cognitive).rationale, title.as_str());
    }
}
