//! Judge I/O (SPEC §8): prompt rendering and the lenient judge-output parser.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use care_core::Error;
use care_core::format::{FormatPolicy, validate};
use care_core::judge::{parse_judge_output, render_judge_prompt};
use care_core::reward::{ScoreOptions, policy_reward};
use care_core::rubric::{Dimension, Rubric};

const D: &str = "[0] a [1] b [2] c [3] d [4] e [5] f value: 0, 1, 2, 3, 4, 5";

fn rubric() -> Rubric<'static> {
    let mut r = Rubric::new();
    r.set_category(Dimension::Cognitive, 0.5, "x");
    r.push_criterion(Dimension::Cognitive, "Understand", D)
        .unwrap();
    r.push_criterion(Dimension::Cognitive, "Reason", D).unwrap();
    r.set_category(Dimension::Affective, 0.3, "x");
    r.push_criterion(Dimension::Affective, "Validate Feelings", D)
        .unwrap();
    r.set_category(Dimension::Proactive, 0.2, "x");
    r.push_criterion(Dimension::Proactive, "Suggest", D)
        .unwrap();
    r
}

fn item(cat: &str, title: &str, score: &str) -> String {
    format!(r#"{{"category":"{cat}","criterion_title":"{title}","score":{score}}}"#)
}

fn full(scores: [&str; 4]) -> String {
    format!(
        r#"{{"criterion_scores":[{},{},{},{}]}}"#,
        item("Cognitive Empathy", "Understand", scores[0]),
        item("Cognitive Empathy", "Reason", scores[1]),
        item("Affective Empathy", "Validate Feelings", scores[2]),
        item("Proactive Empathy", "Suggest", scores[3]),
    )
}

fn parse(text: &str) -> (Result<care_core::JudgeReport, Error>, [f64; 4]) {
    let mut out = [0.0; 4];
    let r = parse_judge_output(text.as_bytes(), &rubric(), &mut out);
    (r, out)
}

#[test]
fn clean_output() {
    let (r, out) = parse(&full(["4", "5", "3", "0"]));
    let r = r.unwrap();
    assert_eq!(out, [4.0, 5.0, 3.0, 0.0]);
    assert!(r.is_clean());
    assert_eq!(r.matched, 4);
}

#[test]
fn envelope_leniency() {
    let body = full(["1", "2", "3", "4"]);
    let think = format!("<think>maybe {{\"criterion_scores\":[]}}</think>\n{body}");
    let lone = format!("I think scores are... </think> {body}");
    let prose = format!("Here are my scores: {body} Hope this helps!");
    let fenced_last = format!(
        "```json\n{}\n```\nWait, correction:\n```json\n{body}\n```",
        full(["0", "0", "0", "0"])
    );
    let fence_over_bare = format!(
        "{} and finally\n```json\n{body}\n```",
        full(["0", "0", "0", "0"])
    );
    for t in [&think, &lone, &prose, &fenced_last, &fence_over_bare] {
        let (r, out) = parse(t);
        assert!(r.unwrap().is_clean(), "{t}");
        assert_eq!(out, [1.0, 2.0, 3.0, 4.0], "{t}");
    }
    // Extra keys of the judge schema are ignored.
    let extra = format!(
        r#"{{"category_quality_checks":{{"Cognitive Empathy":{{"criteria_clear":true}}}},{},"revision_advice":"ok"}}"#,
        &full(["1", "2", "3", "4"])[1..full(["1", "2", "3", "4"]).len() - 1]
    );
    let (r, out) = parse(&extra);
    assert!(r.unwrap().is_clean(), "{extra}");
    assert_eq!(out, [1.0, 2.0, 3.0, 4.0]);
}

#[test]
fn no_json() {
    for t in [
        "",
        "no scores",
        "{\"scores\": []}",
        "{\"criterion_scores\": 3}",
        "[1,2]",
    ] {
        let (r, out) = parse(t);
        assert_eq!(r, Err(Error::NoJudgeJson), "{t}");
        assert!(out.iter().all(|x| x.is_nan()));
    }
    assert_eq!(
        parse_judge_output(b"\xff", &rubric(), &mut [0.0; 4]),
        Err(Error::InvalidUtf8)
    );
    assert_eq!(
        parse_judge_output(b"{}", &rubric(), &mut [0.0; 3]),
        Err(Error::ScoreShape)
    );
}

#[test]
fn matching_rules() {
    // Trimmed titles, case-insensitive fallback for titles and categories.
    let t = format!(
        r#"{{"criterion_scores":[{},{},{},{}]}}"#,
        item(" cognitive empathy ", "  understand", "4"),
        item("Cognitive Empathy", "Reason  ", "5"),
        item("Affective Empathy", "validate feelings", "3"),
        item("Proactive Empathy", "Suggest", "2"),
    );
    let (r, out) = parse(&t);
    let r = r.unwrap();
    assert_eq!(out, [4.0, 5.0, 3.0, 2.0]);
    assert_eq!(r.case_insensitive, 2);
    // Wrong category: unknown, and the criterion stays missing.
    let t = format!(
        r#"{{"criterion_scores":[{},{}]}}"#,
        item("Affective Empathy", "Understand", "4"),
        item("Cognitive Empathy", "Reason", "5"),
    );
    let (r, out) = parse(&t);
    let r = r.unwrap();
    assert_eq!((r.unknown, r.missing, r.matched), (1, 3, 1));
    assert!(out[0].is_nan() && out[1] == 5.0);
}

#[test]
fn duplicates_keep_the_first() {
    let t = format!(
        r#"{{"criterion_scores":[{},{},{},{},{}]}}"#,
        item("Cognitive Empathy", "Understand", "4"),
        item("Cognitive Empathy", "UNDERSTAND", "1"),
        item("Cognitive Empathy", "Reason", "5"),
        item("Affective Empathy", "Validate Feelings", "3"),
        item("Proactive Empathy", "Suggest", "2"),
    );
    let (r, out) = parse(&t);
    assert_eq!(r.unwrap().duplicates, 1);
    assert_eq!(out[0], 4.0);
}

#[test]
fn score_forms() {
    let (r, out) = parse(&full([r#""4""#, r#"" 5 ""#, "3.0", "2"]));
    assert!(r.unwrap().is_clean());
    assert_eq!(out, [4.0, 5.0, 3.0, 2.0]);
    // Not numbers: left missing and reported.
    let (r, out) = parse(&full(["null", r#""high""#, r#""NaN""#, "true"]));
    let r = r.unwrap();
    assert_eq!((r.invalid_scores, r.missing), (4, 4));
    assert!(out.iter().all(|x| x.is_nan()));
    // Out of range or fractional: passed through and reported; the range policy decides.
    let (r, out) = parse(&full(["7", "3.5", "-1", "1e0"]));
    let r = r.unwrap();
    assert_eq!(r.out_of_range, 3);
    assert_eq!(out, [7.0, 3.5, -1.0, 1.0]);
    let rub = rubric();
    assert_eq!(
        policy_reward(&rub, &out, &ScoreOptions::default()),
        Err(Error::ScoreOutOfRange)
    );
}

#[test]
fn escaped_titles_match() {
    let mut r = Rubric::new();
    r.set_category(Dimension::Cognitive, 1.0, "x");
    r.push_criterion(Dimension::Cognitive, "Say \"hi\" / café", D)
        .unwrap();
    let t = r#"{"criterion_scores":[{"category":"Cognitive\u0020Empathy","criterion_title":"Say \"hi\" \/ caf\u00e9","score":3}]}"#;
    let mut out = [0.0; 1];
    let rep = parse_judge_output(t.as_bytes(), &r, &mut out).unwrap();
    assert!(rep.is_clean());
    assert_eq!(out, [3.0]);
}

#[test]
fn prompt_lists_everything() {
    let text = std::fs::read(format!(
        "{}/../cli/data/rubric_sft_2.json",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let mut scratch = [0u8; 1024];
    let v = validate(&text, &FormatPolicy::PAPER, &mut scratch).unwrap();
    let r = v.rubric.unwrap();
    let mut p = String::new();
    render_judge_prompt(
        &mut p,
        &r,
        &["seeker: hello", "supporter: hi, how are you?"],
        "seeker: not great",
        "I'm sorry to hear that.",
    )
    .unwrap();
    assert!(p.contains("seeker: hello\nsupporter: hi, how are you?\n"));
    assert!(p.contains("## Seeker's latest turn\nseeker: not great\n"));
    assert!(p.contains("## Candidate supporter response\nI'm sorry to hear that.\n"));
    for (d, c) in r.iter_flat() {
        assert!(p.contains(d.json_name()));
        assert!(p.contains(c.title.trim()), "{}", c.title);
        assert!(p.contains(c.description.trim()));
    }
    assert!(p.contains("\"criterion_scores\""));
    // Rendering into a fixed buffer fails cleanly when it is too small.
    let mut small = heapless::String::<64>::new();
    assert!(render_judge_prompt(&mut small, &r, &[], "s", "r").is_err());
}

#[test]
fn round_trip_render_then_parse_titles() {
    // Every title the prompt shows is matched when the judge copies it.
    let r = rubric();
    let mut items = Vec::new();
    for (d, c) in r.iter_flat() {
        items.push(item(d.json_name(), c.title, "3"));
    }
    let t = format!(r#"{{"criterion_scores":[{}]}}"#, items.join(","));
    let mut out = [0.0; 4];
    assert!(
        parse_judge_output(t.as_bytes(), &r, &mut out)
            .unwrap()
            .is_clean()
    );
    assert_eq!(out, [3.0; 4]);
}

/// The non-blank lines of a prompt, sorted: two layouts of one prompt hold the same lines.
fn sorted_lines(p: &str) -> Vec<&str> {
    let mut v: Vec<&str> = p.lines().filter(|l| !l.trim().is_empty()).collect();
    v.sort_unstable();
    v
}

#[test]
fn both_layouts_hold_the_same_text_and_only_shared_prefix_ends_with_the_response() {
    use care_core::judge::{JudgePromptLayout, render_judge_prompt_with};
    let r = rubric();
    let ctx = ["seeker: hello", "supporter: hi, how are you?"];
    let render = |layout, response: &str| {
        let mut p = String::new();
        render_judge_prompt_with(&mut p, &r, &ctx, "seeker: not great", response, layout).unwrap();
        p
    };
    let mut paper_fn = String::new();
    render_judge_prompt(&mut paper_fn, &r, &ctx, "seeker: not great", "I hear you.").unwrap();
    assert_eq!(render(JudgePromptLayout::Paper, "I hear you."), paper_fn);
    let shared = render(JudgePromptLayout::SharedPrefix, "I hear you.");
    assert_eq!(sorted_lines(&shared), sorted_lines(&paper_fn));
    assert!(shared.ends_with("## Candidate supporter response\nI hear you.\n"));
    // The rubric and the output shape come before the dialogue.
    let at = |s: &str| shared.find(s).unwrap();
    assert!(at("## Rubric") < at("## Output"));
    assert!(at("## Output") < at("## Dialogue context"));
    assert!(at("## Dialogue context") < at("## Seeker's latest turn"));
    // Two responses of one group: everything before the response is one prefix.
    let other = render(JudgePromptLayout::SharedPrefix, "That sounds hard.");
    let head = shared.len() - "I hear you.\n".len();
    assert_eq!(shared[..head], other[..head]);
    // The paper order shares only what precedes the response.
    let paper_other = render(JudgePromptLayout::Paper, "That sounds hard.");
    let common = paper_fn
        .bytes()
        .zip(paper_other.bytes())
        .take_while(|(a, b)| a == b)
        .count();
    assert!(common < paper_fn.find("## Rubric").unwrap());
    // Names: one stable string per layout, the default is the shared prefix.
    assert_eq!(
        JudgePromptLayout::default(),
        JudgePromptLayout::SharedPrefix
    );
    for (l, n) in JudgePromptLayout::ALL.iter().zip(JudgePromptLayout::NAMES) {
        assert_eq!(n.parse::<JudgePromptLayout>().unwrap(), *l);
        assert_eq!(l.to_string(), n);
    }
    assert!("Paper".parse::<JudgePromptLayout>().is_err());
}

#[test]
fn an_answer_built_from_either_layout_parses_to_the_same_scores() {
    use care_core::judge::{JudgePromptLayout, render_judge_prompt_with};
    // A judge that copies the titles it is shown, category by category, gives the same
    // answer under both layouts, and it parses to the same scores.
    let r = rubric();
    let mut answers = Vec::new();
    for layout in JudgePromptLayout::ALL {
        let mut p = String::new();
        render_judge_prompt_with(&mut p, &r, &[], "seeker: hi", "ok", layout).unwrap();
        let mut items = Vec::new();
        let mut cat = "";
        for line in p.lines() {
            if let Some(d) = line.strip_prefix("### ") {
                cat = d;
            } else if let Some(t) = line.strip_prefix("- criterion_title: ") {
                items.push(item(cat, t, &(items.len() + 1).to_string()));
            }
        }
        let answer = format!(r#"{{"criterion_scores":[{}]}}"#, items.join(","));
        let mut scores = [f64::NAN; 4];
        parse_judge_output(answer.as_bytes(), &r, &mut scores).unwrap();
        answers.push((answer, scores));
    }
    assert_eq!(answers[0], answers[1]);
    assert_eq!(answers[0].1, [1.0, 2.0, 3.0, 4.0]);
}
