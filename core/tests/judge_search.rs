//! Where the judge-output parser finds the `criterion_scores` object (SPEC §8): anywhere in
//! the text, whatever number of brace snippets come before it, in one linear pass.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use care_core::judge::parse_judge_output;
use care_core::rubric::{Dimension, Rubric};
use care_core::{Error, JudgeReport};

const D: &str = "[0] a [1] b [2] c [3] d [4] e [5] f value: 0, 1, 2, 3, 4, 5";

fn rubric() -> Rubric<'static> {
    let mut r = Rubric::new();
    r.set_category(Dimension::Cognitive, 0.5, "x");
    r.push_criterion(Dimension::Cognitive, "Understand", D)
        .unwrap();
    r.set_category(Dimension::Affective, 0.3, "x");
    r.push_criterion(Dimension::Affective, "Validate", D)
        .unwrap();
    r.set_category(Dimension::Proactive, 0.2, "x");
    r.push_criterion(Dimension::Proactive, "Suggest", D)
        .unwrap();
    r
}

const ANSWER: &str = r#"{"criterion_scores":[{"category":"Cognitive Empathy","criterion_title":"Understand","score":4},{"category":"Affective Empathy","criterion_title":"Validate","score":2},{"category":"Proactive Empathy","criterion_title":"Suggest","score":5}]}"#;

fn parse(text: &str) -> (Result<JudgeReport, Error>, Vec<u64>) {
    let mut out = [0.0; 3];
    let r = parse_judge_output(text.as_bytes(), &rubric(), &mut out);
    (r, out.iter().map(|x| x.to_bits()).collect())
}

/// Brace snippets that are not judge answers, each followed by prose that ends it: complete
/// objects without `criterion_scores`, invalid JSON, an unclosed string cut by a newline,
/// an object whose `criterion_scores` is not an array, template placeholders.
const SNIPPETS: [&str; 10] = [
    "{x}",
    "{}",
    r#"{"a": 1}"#,
    r#"{"a": [1, {"b": 2}]}"#,
    "{ not json }",
    "{\"note\": \"unfinished\n",
    r#"{"criterion_scores": 3}"#,
    "{{name}}",
    "function() { return {}; }",
    r#"{"a": "}"}"#,
];

#[test]
fn the_answer_is_found_after_any_number_of_brace_snippets() {
    let (want_r, want) = parse(ANSWER);
    assert_eq!(want_r.unwrap().matched, 3);
    // Counts around 64 (a natural bound for a search that tries candidates one by one) and far
    // beyond it.
    for n in [0usize, 1, 63, 64, 65, 1000, 20_000] {
        for snippet in SNIPPETS {
            let mut text = String::from("Let me think about the template.\n");
            for k in 0..n {
                text.push_str(snippet);
                text.push_str(if k % 2 == 0 { " and then " } else { ".\n" });
            }
            text.push_str("Final answer: ");
            text.push_str(ANSWER);
            let (r, got) = parse(&text);
            assert_eq!(r, want_r, "{n} x {snippet:?}");
            assert_eq!(got, want, "{n} x {snippet:?}");
        }
    }
}

#[test]
fn an_answer_after_snippets_in_a_fence_and_after_a_think_block() {
    let (want_r, want) = parse(ANSWER);
    let prose = "{x} ".repeat(500);
    let fenced = format!("{prose}\n```json\n{prose}{ANSWER}\n```\n{prose}");
    let thought = format!("<think>{prose}{ANSWER}</think>{prose}{ANSWER}");
    for t in [&fenced, &thought] {
        let (r, got) = parse(t);
        assert_eq!((r, got), (want_r, want.clone()));
    }
}

#[test]
fn no_answer_among_many_snippets_is_still_no_judge_json() {
    let text = SNIPPETS.join(" . ").repeat(2000);
    let (r, got) = parse(&text);
    assert_eq!(r, Err(Error::NoJudgeJson));
    assert!(got.iter().all(|b| f64::from_bits(*b).is_nan()));
}

#[test]
fn which_candidate_is_first() {
    let zeros = ANSWER.replace(":4}", ":0}");
    // A complete object that holds an answer is skipped whole: the answer inside a wrapper
    // object is not taken, the later bare one is.
    let wrapped = format!(r#"{{"result": {zeros}}} then {ANSWER}"#);
    assert_eq!(parse(&wrapped).1, parse(ANSWER).1);
    // A broken wrapper leaves the complete answer it held as a candidate.
    let broken = format!(r#"{{"result": {ANSWER}, oops"#);
    assert_eq!(parse(&broken).1, parse(ANSWER).1);
    // Of two answers the first complete one counts.
    let two = format!("{ANSWER} or maybe {zeros}");
    assert_eq!(parse(&two).1, parse(ANSWER).1);
    // A brace inside a string of a broken candidate is text: the answer that starts there
    // is not tried (documented), so the later answer is taken.
    let in_string = format!(r#"{{"note": "see {zeros}" and {ANSWER}"#);
    assert_eq!(parse(&in_string).1, parse(ANSWER).1);
}

proptest::proptest! {
    /// Relation: prefixing the judge's text with any sequence of non-judge brace snippets (each
    /// ended by prose) does not change the parse: same report, same scores bit for bit.
    #[test]
    fn non_judge_snippets_before_the_answer_do_not_change_the_parse(
        picks in proptest::collection::vec((0..SNIPPETS.len(), 0..3usize), 0..200),
        fenced in proptest::bool::ANY,
    ) {
        let seps = [" so ", ".\n", "; "];
        let body = if fenced { format!("```json\n{ANSWER}\n```") } else { ANSWER.to_owned() };
        let mut text = String::new();
        for (k, s) in &picks {
            text.push_str(SNIPPETS[*k]);
            text.push_str(seps[*s]);
        }
        text.push_str(&body);
        proptest::prop_assert_eq!(parse(&text), parse(ANSWER));
    }
}
