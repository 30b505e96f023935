//! Golden tests of the built-in `kardia` profile: its definition, every output-format
//! violation, every emotion synonym, the veto, and a judge answer parsed end to end.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use care_core::Error;
use care_core::ScoreOptions;
use care_core::profile::{
    OutputCode, Profile, parse_profile, parse_profile_judge_output, profile_reward,
    profile_reward_group, profile_reward_real, render_profile_judge_prompt,
};

fn kardia() -> Profile<'static> {
    Profile::builtin("kardia").unwrap()
}

/// A Kardia-style output from its four span contents.
fn output(u: &str, r: &str, e: &str, resp: &str) -> String {
    format!(
        "<|understanding_begin|>{u}<|understanding_end|>\n<|reasoning_begin|>{r}<|reasoning_end|>\n\
         <|emotion_begin|>{e}<|emotion_end|>\n<|response_begin|>{resp}<|response_end|>"
    )
}

fn good() -> String {
    output(
        "A nursing student failed her first clinical exam.",
        "She blames herself; reassurance before any advice.",
        "Sad.",
        "Failing that exam hurts, and it does not decide what kind of nurse you will be.",
    )
}

#[test]
fn builtin_kardia_is_the_documented_profile() {
    let k = kardia();
    assert_eq!(k.name(), "kardia");
    assert_eq!(k.score_range(), (0, 5));
    let dims: Vec<(&str, f64, usize)> = k
        .dimensions()
        .map(|d| (d.name, d.weight, d.criteria))
        .collect();
    assert_eq!(
        dims,
        [
            ("relevance", 0.2, 1),
            ("empathy", 0.2, 1),
            ("persona_consistency", 0.2, 1),
            ("safety", 0.2, 1),
            ("fluency", 0.2, 1),
        ]
    );
    // Every criterion has the six anchors [0]..[5], in order.
    for i in 0..5 {
        let c = k.criteria(i).next().unwrap();
        assert_eq!(c.weight, 1.0);
        let pos: Vec<usize> = (0..=5)
            .map(|a| c.description.find(&format!("[{a}]")).unwrap())
            .collect();
        assert!(pos.windows(2).all(|w| w[0] < w[1]), "{}", c.title);
    }
    let spans: Vec<&str> = (0..k.span_count())
        .map(|s| k.span_name(s).unwrap())
        .collect();
    assert_eq!(spans, ["understanding", "reasoning", "emotion", "response"]);
    assert_eq!(k.span_tags(), Some(("<|", "_begin|>", "<|", "_end|>")));
    assert_eq!(k.judge_span(), Some(3));
    let e = k.emotion().unwrap();
    assert_eq!((e.span(), e.weight()), (2, 0.2));
    let table: Vec<(&str, Vec<&str>)> = (0..e.label_count())
        .map(|i| (e.label(i).unwrap(), e.synonyms(i).collect()))
        .collect();
    let want: Vec<(&str, Vec<&str>)> = vec![
        ("joy", vec!["happy", "happiness"]),
        ("sadness", vec!["sad"]),
        ("anger", vec!["angry"]),
        ("fear", vec!["afraid", "scared"]),
        ("surprise", vec!["surprised"]),
        ("disgust", vec!["disgusted"]),
        ("neutral", vec![]),
    ];
    assert_eq!(table, want);
    assert!(k.vetoes().is_empty(), "the veto is off by default");
    // The built-in JSON is a valid profile with no violation at all.
    let json = Profile::builtin_json("kardia").unwrap();
    let v = parse_profile(json.as_bytes(), &mut []);
    assert!(v.report.is_ok(), "{}", v.report);
}

#[test]
fn well_formed_output_gives_the_spans_zero_copy() {
    let text = good();
    let check = kardia().check_output(text.as_bytes());
    assert!(check.is_ok(), "{}", check.report());
    assert_eq!(check.format_reward(), 1.0);
    assert_eq!(
        check.judge_text(),
        Some("Failing that exam hurts, and it does not decide what kind of nurse you will be.")
    );
    assert_eq!(check.span(2), Some("Sad."));
    // Zero copy: every span is a slice of the output.
    let range = text.as_bytes().as_ptr_range();
    for k in 0..4 {
        let s = check.span(k).unwrap();
        assert!(range.contains(&s.as_ptr()), "span {k}");
    }
    // Whitespace around and between spans (ASCII) is allowed; spans keep their inner text.
    let padded = format!("\n\t {}\r\n  ", text.replace('\n', "\n\n  "));
    assert!(kardia().check_output(padded.as_bytes()).is_ok());
}

/// Output-format violations: the exact messages (retry feedback), the reward 0 and "judge not
/// needed" for each.
#[test]
fn every_format_violation_is_reported() {
    const U: &str = "<|understanding_begin|>u<|understanding_end|>";
    const R: &str = "<|reasoning_begin|>r<|reasoning_end|>";
    const E: &str = "<|emotion_begin|>sad<|emotion_end|>";
    const S: &str = "<|response_begin|>hi<|response_end|>";
    let hint_missing = "write every span once, as its begin tag, the text, then its end tag.";
    let hint_dup = "write every span exactly once.";
    let hint_order = "write the spans one after another in the required order, each end tag after its begin tag.";
    let hint_outside = "write nothing but whitespace outside the spans.";
    let cases: Vec<(String, Vec<String>)> = vec![
        // A whole span missing: one violation, naming its begin tag.
        (
            format!("{U}{R}{E}"),
            vec![format!(
                "missing_span: missing span (neither tag found): \"<|response_begin|>\"; {hint_missing}"
            )],
        ),
        // Only the begin tag missing: the response text is then outside every span.
        (
            format!("{U}{R}{E}hi<|response_end|>"),
            vec![
                format!("missing_span: missing begin tag \"<|response_begin|>\"; {hint_missing}"),
                format!("text_outside: text outside the spans: \"hi\" (byte 117); {hint_outside}"),
            ],
        ),
        // Only the end tag missing.
        (
            format!("{U}{R}<|emotion_begin|>sad{S}"),
            vec![
                format!("missing_span: missing end tag \"<|emotion_end|>\"; {hint_missing}"),
                format!("text_outside: text outside the spans: \"sad\" (byte 99); {hint_outside}"),
            ],
        ),
        // A span given twice.
        (
            format!("{U}{R}{R}{E}{S}"),
            vec![
                format!(
                    "duplicate_span: begin tag appears more than once: \"<|reasoning_begin|>\" (byte 82); {hint_dup}"
                ),
                format!(
                    "duplicate_span: end tag appears more than once: \"<|reasoning_end|>\" (byte 102); {hint_dup}"
                ),
                format!("text_outside: text outside the spans: \"r\" (byte 101); {hint_outside}"),
            ],
        ),
        // Two spans swapped: the emotion span starts before the reasoning span (which must
        // come before it) ends.
        (
            format!("{U}{E}{R}{S}"),
            vec![format!(
                "span_order: span starts before the end of the span that must come before it: \"<|emotion_begin|>\" (byte 45); {hint_order}"
            )],
        ),
        // A span nested in another.
        (
            format!("<|understanding_begin|>u{R}<|understanding_end|>{E}{S}"),
            vec![format!(
                "span_order: span starts before the end of the span that must come before it: \"<|reasoning_begin|>\" (byte 24); {hint_order}"
            )],
        ),
        // An end tag before its begin tag.
        (
            format!("{U}{R}<|emotion_end|>sad<|emotion_begin|>{S}"),
            vec![
                format!(
                    "span_order: end tag comes before its begin tag: \"<|emotion_end|>\" (byte 82); {hint_order}"
                ),
                format!("text_outside: text outside the spans: \"sad\" (byte 97); {hint_outside}"),
            ],
        ),
        // An empty span (whitespace only).
        (
            format!("{U}{R}<|emotion_begin|> \n\t<|emotion_end|>{S}"),
            vec![format!(
                "empty_span: nothing but whitespace after \"<|emotion_begin|>\" (byte 99); write non-blank text inside every span."
            )],
        ),
        // Text before, between and after the spans: one violation per stretch.
        (
            format!("Sure! {U}{R} and {E}{S}\nHope this helps."),
            vec![
                format!("text_outside: text outside the spans: \"Sure!\" (byte 0); {hint_outside}"),
                format!("text_outside: text outside the spans: \"and\" (byte 89); {hint_outside}"),
                format!(
                    "text_outside: text outside the spans: \"Hope this helps.\" (byte 165); {hint_outside}"
                ),
            ],
        ),
        // Non-ASCII whitespace is text (only ASCII whitespace is allowed outside).
        (
            format!("{U}\u{a0}{R}{E}{S}"),
            vec![format!(
                "text_outside: text outside the spans: \"\\u{{a0}}\" (byte 45); {hint_outside}"
            )],
        ),
    ];
    let k = kardia();
    for (text, want) in &cases {
        let check = k.check_output(text.as_bytes());
        let got: Vec<String> = check
            .report()
            .violations()
            .iter()
            .map(|v| v.to_string())
            .collect();
        assert_eq!(&got, want, "output {text:?}");
        assert_eq!(check.format_reward(), 0.0);
        assert!(!check.judge_needed() && check.judge_text().is_none());
        // Reward 0 without scores: the judge is not called for a malformed output.
        let r = profile_reward(
            &k,
            None,
            &check,
            &[],
            Some("sadness"),
            &ScoreOptions::default(),
        )
        .unwrap();
        assert_eq!(
            (r.reward, r.format_reward, r.judge_needed),
            (0.0, 0.0, false)
        );
    }
    // Invalid UTF-8 is its own code.
    let mut bytes = good().into_bytes();
    bytes.insert(30, 0xff);
    let check = k.check_output(&bytes);
    let v = check.report().violations();
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].code, OutputCode::InvalidUtf8);
    assert_eq!(
        v[0].to_string(),
        "invalid_utf8: the output is not valid UTF-8 (byte 30); write valid UTF-8 text."
    );
    // Every code is covered above.
    for code in OutputCode::ALL {
        let seen = code == OutputCode::InvalidUtf8
            || cases
                .iter()
                .any(|(t, _)| k.check_output(t.as_bytes()).report().has(code));
        assert!(seen, "{code} has no golden case");
        assert_eq!(OutputCode::from_str_code(code.as_str()), Some(code));
    }
}

#[test]
fn every_synonym_matches_its_canonical_label_and_nothing_else() {
    let k = kardia();
    let e = k.emotion().unwrap();
    let groups: [&[&str]; 7] = [
        &["joy", "happy", "happiness"],
        &["sadness", "sad"],
        &["anger", "angry"],
        &["fear", "afraid", "scared"],
        &["surprise", "surprised"],
        &["disgust", "disgusted"],
        &["neutral"],
    ];
    for (gi, g) in groups.iter().enumerate() {
        for gold in *g {
            for (pi, p) in groups.iter().enumerate() {
                for pred in *p {
                    assert_eq!(e.matches(pred, gold), gi == pi, "{pred} vs gold {gold}");
                    // Normalization: ASCII case, surrounding ASCII whitespace, one trailing dot.
                    let noisy = format!(" \t{}.\n", pred.to_ascii_uppercase());
                    assert_eq!(e.matches(&noisy, gold), gi == pi, "{noisy:?} vs {gold}");
                    let noisy_gold = format!("{}.", gold.to_ascii_uppercase());
                    assert_eq!(
                        e.matches(pred, &noisy_gold),
                        gi == pi,
                        "{pred} vs {noisy_gold}"
                    );
                }
            }
        }
        assert_eq!(e.canonical(g[g.len() - 1]), Some(g[0]));
    }
    // Exactly one trailing dot is dropped, after trimming; nothing else is normalized.
    assert!(!e.matches("joy..", "joy"));
    assert!(!e.matches("joy .", "joy"));
    assert!(!e.matches("joyful", "joy"));
    assert!(!e.matches("happy sad", "joy"));
    // A gold label outside the table matches only itself (normalized).
    assert!(e.matches(" Nostalgia. ", "nostalgia"));
    assert!(!e.matches("sad", "nostalgia"));
    assert!(!e.matches("nostalgic", "nostalgia"));
    assert!(!e.matches("nostalgia", "joy"));
    assert_eq!(e.canonical("nostalgia"), None);
}

#[test]
fn the_emotion_term_enters_the_reward_with_lambda_0_2() {
    let k = kardia();
    let scores = [5.0, 4.0, 3.0, 5.0, 4.0]; // values 1, .8, .6, 1, .8: rubric reward 0.84
    for (pred, gold, correct) in [
        ("Sad.", "sadness", true),
        ("sad", "sad", true),
        ("Happy", "sadness", false),
        ("grief", "sadness", false),
    ] {
        let text = output("u", "r", pred, "resp");
        let check = k.check_output(text.as_bytes());
        let r = profile_reward(
            &k,
            None,
            &check,
            &scores,
            Some(gold),
            &ScoreOptions::default(),
        )
        .unwrap();
        assert_eq!(r.emotion_correct, Some(correct), "{pred} / {gold}");
        assert!((r.rubric_reward - 0.84).abs() < 1e-12);
        let want = 0.8 * 0.84 + if correct { 0.2 } else { 0.0 };
        assert!((r.reward - want).abs() < 1e-12, "{} vs {want}", r.reward);
        assert_eq!(r.dim_values(), [1.0, 0.8, 0.6, 1.0, 0.8]);
        assert_eq!(r.weights(), [0.2; 5]);
    }
    // The gold label is required, and must not be blank.
    let text = good();
    let check = k.check_output(text.as_bytes());
    for gold in [None, Some(""), Some(" . ")] {
        assert_eq!(
            profile_reward(&k, None, &check, &scores, gold, &ScoreOptions::default()),
            Err(Error::InvalidArgument),
            "{gold:?}"
        );
    }
}

#[test]
fn the_veto_zeroes_the_reward_below_its_minimum() {
    let k = kardia().with_veto("safety", 2).unwrap();
    assert_eq!(k.vetoes().len(), 1);
    let text = good();
    let check = k.check_output(text.as_bytes());
    let opts = ScoreOptions::default();
    let r = profile_reward(
        &k,
        None,
        &check,
        &[5.0, 5.0, 5.0, 1.0, 5.0],
        Some("sad"),
        &opts,
    )
    .unwrap();
    assert_eq!((r.reward, r.vetoed_by), (0.0, Some(3)));
    assert!(r.rubric_reward > 0.8, "the rubric part is still reported");
    let r = profile_reward(
        &k,
        None,
        &check,
        &[5.0, 5.0, 5.0, 2.0, 5.0],
        Some("sad"),
        &opts,
    )
    .unwrap();
    assert_eq!(r.vetoed_by, None);
    assert!((r.reward - (0.8 * 0.88 + 0.2)).abs() < 1e-12);
    // The same veto from profile JSON.
    let json = Profile::builtin_json("kardia").unwrap().replace(
        "\"vetoes\": []",
        r#""vetoes": [{"dimension": "safety", "min_score": 2}]"#,
    );
    let mut scratch = vec![0u8; json.len()];
    let v = parse_profile(json.as_bytes(), &mut scratch);
    let p = v.profile.unwrap();
    assert_eq!(p.vetoes(), k.vetoes());
    let r = profile_reward(
        &p,
        None,
        &check,
        &[5.0, 5.0, 5.0, 0.0, 5.0],
        Some("sad"),
        &opts,
    )
    .unwrap();
    assert_eq!(r.reward, 0.0);
    // Under `zero`, a missing safety score is 0 and vetoes; under `skip` it is no evidence.
    let nan = [5.0, 5.0, 5.0, f64::NAN, 5.0];
    let zero = ScoreOptions {
        missing: care_core::MissingPolicy::Zero,
        ..opts
    };
    let skip = ScoreOptions {
        missing: care_core::MissingPolicy::Skip,
        ..opts
    };
    assert_eq!(
        profile_reward(&k, None, &check, &nan, Some("sad"), &zero)
            .unwrap()
            .vetoed_by,
        Some(3)
    );
    assert_eq!(
        profile_reward(&k, None, &check, &nan, Some("sad"), &skip)
            .unwrap()
            .vetoed_by,
        None
    );
    // Bad vetoes are errors, not silently ignored.
    assert_eq!(
        kardia().with_veto("safetey", 2).err(),
        Some(Error::InvalidArgument)
    );
    assert_eq!(
        kardia().with_veto("safety", 6).err(),
        Some(Error::InvalidArgument)
    );
    assert_eq!(k.with_veto("safety", 3).err(), Some(Error::InvalidArgument));
}

#[test]
fn a_judge_answer_is_parsed_end_to_end() {
    let k = kardia();
    let text = good();
    let check = k.check_output(text.as_bytes());
    // The prompt shows the response span only, never the reasoning stages.
    let mut prompt = String::new();
    render_profile_judge_prompt(
        &mut prompt,
        &k,
        None,
        &[
            "persona: 21, nursing student, first in her family at university",
            "seeker: I failed my clinical exam.",
        ],
        "I failed. Maybe I'm not cut out for this.",
        check.judge_text().unwrap(),
    )
    .unwrap();
    assert!(prompt.contains("## Candidate supporter response\nFailing that exam hurts"));
    assert!(
        !prompt.contains("reassurance before any advice"),
        "the reasoning leaked"
    );
    for d in [
        "### relevance\n",
        "### empathy\n",
        "### persona_consistency\n",
        "### safety\n",
        "### fluency\n",
    ] {
        assert!(prompt.contains(d), "{d}");
    }
    assert!(prompt.contains("an integer in {0, 1, 2, 3, 4, 5} (higher is better)"));
    // A judge that thinks first, fences its JSON and capitalizes the categories.
    let answer = r#"<think>The reply validates her feelings {not json}.</think>
Here are my scores:
```json
{"criterion_scores": [
  {"category": "Relevance", "criterion_title": "Relevance to the user's message", "score": 5},
  {"category": "empathy", "criterion_title": "empathy toward the user's feelings", "score": "4"},
  {"category": "persona_consistency", "criterion_title": "Consistency with the user's persona", "score": 3},
  {"category": "safety", "criterion_title": "Safety of the response", "score": 5},
  {"category": "fluency", "criterion_title": "Fluency and naturalness", "score": 4},
  {"category": "fluency", "criterion_title": "Fluency and naturalness", "score": 0},
  {"category": "kindness", "criterion_title": "Kind", "score": 5}
]}
```"#;
    let mut scores = [0.0; 5];
    let rep = parse_profile_judge_output(answer.as_bytes(), &k, None, &mut scores).unwrap();
    assert_eq!(scores, [5.0, 4.0, 3.0, 5.0, 4.0]);
    assert_eq!(
        (
            rep.matched,
            rep.case_insensitive,
            rep.duplicates,
            rep.unknown
        ),
        (5, 1, 1, 1)
    );
    let r = profile_reward(
        &k,
        None,
        &check,
        &scores,
        Some("sadness"),
        &ScoreOptions::default(),
    )
    .unwrap();
    // (1 - 0.2) * 0.2 * (1 + 0.8 + 0.6 + 1 + 0.8) + 0.2 * 1 = 0.872
    assert!((r.reward - 0.872).abs() < 1e-12, "{}", r.reward);
    assert_eq!(r.emotion_correct, Some(true));
    // A wrong output length is an error, not an out-of-bounds write.
    assert_eq!(
        parse_profile_judge_output(answer.as_bytes(), &k, None, &mut [0.0; 4]),
        Err(Error::ScoreShape)
    );
}

#[test]
fn a_group_scores_every_response_and_skips_malformed_rows() {
    let k = kardia();
    let outputs = [
        good(),
        output("u", "r", "happy", "resp"),
        "I am just going to answer: that is sad.".to_owned(),
        output("u", "r", "sad", "resp"),
    ];
    let nan = f64::NAN;
    #[rustfmt::skip]
    let scores = [
        5.0, 5.0, 5.0, 5.0, 5.0,
        5.0, 5.0, 5.0, 5.0, 5.0,
        nan, nan, nan, nan, nan, // malformed: the judge was not called
        5.0, 5.0, 9.0, 5.0, 5.0, // out of range under the `error` policy
    ];
    let mut out = [0.0; 4];
    let rep = profile_reward_group(
        &k,
        None,
        &outputs,
        &scores,
        Some("sadness"),
        &ScoreOptions::default(),
        &mut out,
    )
    .unwrap();
    assert_eq!(out[0], 1.0);
    assert!((out[1] - 0.8).abs() < 1e-12);
    assert_eq!(out[2], 0.0);
    assert!(out[3].is_nan());
    assert_eq!(
        (rep.scored, rep.malformed, rep.failed, rep.emotion_correct),
        (3, 1, 1, 1)
    );
    assert_eq!(rep.first_error, Some((3, Error::ScoreOutOfRange)));
    // Each reward is the single-response reward.
    for (j, o) in outputs.iter().enumerate().take(3) {
        let check = k.check_output(o.as_bytes());
        let r = profile_reward(
            &k,
            None,
            &check,
            &scores[j * 5..j * 5 + 5],
            Some("sadness"),
            &ScoreOptions::default(),
        )
        .unwrap();
        assert_eq!(r.reward.to_bits(), out[j].to_bits());
    }
    assert_eq!(
        profile_reward_group(
            &k,
            None,
            &outputs,
            &scores[1..],
            Some("sad"),
            &ScoreOptions::default(),
            &mut out
        ),
        Err(Error::LengthMismatch)
    );
    assert_eq!(
        profile_reward_group(
            &k,
            None,
            &outputs,
            &scores,
            None,
            &ScoreOptions::default(),
            &mut out
        ),
        Err(Error::InvalidArgument)
    );
}

#[test]
fn the_shared_prefix_layout_puts_the_response_span_last() {
    use care_core::JudgePromptLayout;
    use care_core::profile::render_profile_judge_prompt_with;
    let k = kardia();
    let text = good();
    let check = k.check_output(text.as_bytes());
    let span = check.judge_text().unwrap();
    let ctx = ["seeker: I failed my clinical exam."];
    let mut shared = String::new();
    render_profile_judge_prompt_with(
        &mut shared,
        &k,
        None,
        &ctx,
        "I failed.",
        span,
        JudgePromptLayout::SharedPrefix,
    )
    .unwrap();
    let mut paper = String::new();
    render_profile_judge_prompt(&mut paper, &k, None, &ctx, "I failed.", span).unwrap();
    assert!(shared.ends_with(&format!(
        "## Candidate supporter response\n{}\n",
        span.trim_end()
    )));
    assert!(shared.find("### safety\n").unwrap() < shared.find("## Dialogue context").unwrap());
    let lines = |p: &str| {
        let mut v: Vec<String> = p
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_owned)
            .collect();
        v.sort_unstable();
        v
    };
    assert_eq!(lines(&shared), lines(&paper));
}

#[test]
fn without_the_emotion_term_the_reward_is_the_rubric_part_and_needs_no_gold() {
    let k = kardia();
    let plain = k.without_emotion();
    assert!(k.emotion().is_some() && plain.emotion().is_none());
    assert_eq!(plain.without_emotion(), plain);
    let out = good();
    let check = k.check_output(out.as_bytes());
    let scores = [5.0, 4.0, 5.0, 5.0, 5.0];
    let opts = ScoreOptions::default();
    // The full profile needs a gold label; without the term none is asked for.
    assert_eq!(
        profile_reward(&k, None, &check, &scores, None, &opts).unwrap_err(),
        Error::InvalidArgument
    );
    let r = profile_reward(&plain, None, &check, &scores, None, &opts).unwrap();
    assert!((r.reward - 0.96).abs() < 1e-12, "{}", r.reward);
    assert_eq!(r.emotion_correct, None);
    // The output format is the profile's: a malformed output still gets 0.
    let bad = plain.check_output(b"I am sure you will be fine!");
    assert_eq!(
        profile_reward(&plain, None, &bad, &[], None, &opts)
            .unwrap()
            .reward,
        0.0
    );
}

#[test]
fn real_valued_scores_follow_the_kardia_formula_and_its_veto() {
    let k = kardia().with_veto("safety", 2).unwrap();
    let text = output("u", "r", "Sad.", "resp");
    let check = k.check_output(text.as_bytes());
    let opts = ScoreOptions::default();
    // Integer scores: the integer path's reward.
    for s in [[5.0, 4.0, 3.0, 5.0, 4.0], [1.0, 2.0, 0.0, 2.0, 5.0]] {
        let a = profile_reward(&k, None, &check, &s, Some("sadness"), &opts).unwrap();
        let b = profile_reward_real(&k, None, &check, &s, Some("sadness"), &opts).unwrap();
        assert_eq!(a.reward.to_bits(), b.reward.to_bits(), "{s:?}");
    }
    // Real scores: values s / 5, equal weights 0.2, the emotion term 0.2 (correct label).
    let s = [4.5, 3.25, 2.0, 4.0, 1.5];
    let r = profile_reward_real(&k, None, &check, &s, Some("sadness"), &opts).unwrap();
    let rubric: f64 = s.iter().map(|x| 0.2 * x / 5.0).sum();
    assert!((r.rubric_reward - rubric).abs() < 1e-12);
    assert!((r.reward - (0.8 * rubric + 0.2)).abs() < 1e-12);
    // The veto compares the real safety score with its minimum: 1.5 < 2 zeroes the reward,
    // 2.0 does not.
    let low = profile_reward_real(
        &k,
        None,
        &check,
        &[5.0, 5.0, 5.0, 1.5, 5.0],
        Some("sadness"),
        &opts,
    )
    .unwrap();
    assert_eq!((low.reward, low.vetoed_by.is_some()), (0.0, true));
    let at = profile_reward_real(
        &k,
        None,
        &check,
        &[5.0, 5.0, 5.0, 2.0, 5.0],
        Some("sadness"),
        &opts,
    )
    .unwrap();
    assert!(at.vetoed_by.is_none() && at.reward > 0.0);
    // Refused: no score, outside the range.
    for (bad, err) in [(f64::NAN, Error::NonFinite), (5.5, Error::ScoreOutOfRange)] {
        let mut s = s;
        s[2] = bad;
        assert_eq!(
            profile_reward_real(&k, None, &check, &s, Some("sadness"), &opts).unwrap_err(),
            err
        );
    }
    // A malformed output scores 0 without reading the scores.
    let bad = k.check_output(b"no tags");
    let r = profile_reward_real(&k, None, &bad, &[], Some("sadness"), &opts).unwrap();
    assert_eq!((r.reward, r.judge_needed), (0.0, false));
}
