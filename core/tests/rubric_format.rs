//! The format contract (SPEC §3): the two paper fixtures validate cleanly, and every violation
//! code has one failing input that produces it at the right location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use care_core::format::{
    FormatPolicy, ViolationCode as V, find_meta_word, format_reward, validate,
};
use care_core::rubric::Dimension;

fn fixture(name: &str) -> Vec<u8> {
    let p = format!("{}/../cli/data/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&p).unwrap_or_else(|e| panic!("read {p}: {e}"))
}

const DESC: &str =
    "[0] none. [1] weak. [2] some. [3] fair. [4] good. [5] great. value: 0, 1, 2, 3, 4, 5";

/// A valid rubric built from parts, so each test can break exactly one thing.
fn rubric_json(weights: [&str; 3], crit_per_cat: usize) -> String {
    let names = [
        "Cognitive Empathy",
        "Affective Empathy",
        "Proactive Empathy",
    ];
    let cats: Vec<String> = names
        .iter()
        .zip(weights)
        .enumerate()
        .map(|(ci, (n, w))| {
            let crits: Vec<String> = (0..crit_per_cat)
                .map(|k| format!(r#"{{"title":"T{ci}{k}","description":"{DESC}"}}"#))
                .collect();
            format!(
                r#"{{"category":"{n}","weight_rationale":"because","category_weight":{w},"criteria":[{}]}}"#,
                crits.join(",")
            )
        })
        .collect();
    format!(r#"{{"categories":[{}]}}"#, cats.join(","))
}

fn valid() -> String {
    rubric_json(["0.4", "0.35", "0.25"], 2)
}

fn codes(text: &str) -> Vec<V> {
    codes_with(text, &FormatPolicy::PAPER)
}

fn codes_with(text: &str, p: &FormatPolicy) -> Vec<V> {
    let mut scratch = [0u8; 4096];
    let v = validate(text.as_bytes(), p, &mut scratch).unwrap();
    v.report.violations().iter().map(|x| x.code).collect()
}

#[test]
fn paper_fixtures_are_valid() {
    for name in ["rubric_sft_1.json", "rubric_sft_2.json"] {
        let text = fixture(name);
        let mut scratch = [0u8; 8192];
        let v = validate(&text, &FormatPolicy::PAPER, &mut scratch).unwrap();
        assert!(v.report.is_ok(), "{name}: {}", v.report);
        assert!(v.is_valid());
        assert_eq!(v.r_fmt(), 1.0);
        let r = v.rubric.unwrap();
        assert!((r.weights().iter().sum::<f64>() - 1.0).abs() < 1e-9);
        assert!(r.counts().iter().all(|&n| (2..=4).contains(&n)));
    }
    let text = fixture("rubric_sft_1.json");
    let mut scratch = [0u8; 8192];
    let r = validate(&text, &FormatPolicy::PAPER, &mut scratch)
        .unwrap()
        .rubric
        .unwrap();
    assert_eq!(r.weights(), [0.4, 0.25, 0.35]);
    assert_eq!(r.counts(), [3, 2, 3]);
    // The weights' text as written, for exact comparisons (SPEC §7, preference outcome).
    let spelled = rubric_json(["4E-1", "0.350", "0.25"], 2);
    let mut scratch2 = [0u8; 4096];
    let v = validate(spelled.as_bytes(), &FormatPolicy::PAPER, &mut scratch2).unwrap();
    assert_eq!(v.rubric.unwrap().weight_texts(), ["4E-1", "0.350", "0.25"]);
    assert_eq!(
        r.criteria(Dimension::Affective)[0].title,
        "Validate the Feeling of Awkwardness"
    );
}

#[test]
fn built_valid_rubric_is_valid() {
    assert_eq!(codes(&valid()), vec![]);
    assert_eq!(
        format_reward(valid().as_bytes(), &FormatPolicy::PAPER, &mut []).unwrap(),
        1.0
    );
}

#[test]
fn weights_not_summing_to_one_give_exactly_one_weight_sum() {
    let t = rubric_json(["0.5", "0.3", "0.1"], 2);
    assert_eq!(codes(&t), vec![V::WeightSum]);
    // Within the tolerance is fine; outside a looser tolerance too.
    assert_eq!(codes(&rubric_json(["0.4", "0.35", "0.2505"], 2)), vec![]);
    let loose = FormatPolicy {
        weight_tolerance: 0.2,
        ..FormatPolicy::PAPER
    };
    assert_eq!(codes_with(&t, &loose), vec![]);
    // A NaN tolerance is not a policy: the call fails, naming the field.
    let nan = FormatPolicy {
        weight_tolerance: f64::NAN,
        ..FormatPolicy::PAPER
    };
    let mut scratch = [0u8; 64];
    assert_eq!(
        validate(valid().as_bytes(), &nan, &mut scratch).err(),
        Some(care_core::Error::InvalidArgument)
    );
    assert_eq!(nan.check().map_err(|e| e.field), Err("weight_tolerance"));
}

#[test]
fn missing_anchor_gives_level_format_at_that_criterion() {
    let t = valid().replacen("[3] fair. ", "", 1); // first description: Cognitive, criterion 0
    let mut scratch = [0u8; 4096];
    let v = validate(t.as_bytes(), &FormatPolicy::PAPER, &mut scratch).unwrap();
    let vs = v.report.violations();
    assert_eq!(vs.len(), 1, "{}", v.report);
    assert_eq!(vs[0].code, V::LevelFormat);
    assert_eq!(vs[0].category, Some(0));
    assert_eq!(vs[0].dimension, Some(Dimension::Cognitive));
    assert_eq!(vs[0].criterion, Some(0));
    let msg = vs[0].to_string();
    assert!(
        msg.starts_with(
            "level_format: categories[0] (Cognitive Empathy).criteria[0]: missing anchor \"[3]\""
        ),
        "{msg}"
    );
    // The rubric still parses and is scorable.
    assert_eq!(v.rubric.unwrap().total_criteria(), 6);
    assert_eq!(v.report.r_fmt(), 0.0);
}

#[test]
fn level_format_variants() {
    let bad = [
        DESC.replace(" value: 0, 1, 2, 3, 4, 5", ""), // no suffix
        DESC.replace("[2] some. [3] fair.", "[3] fair. [2] some."), // out of order
        DESC.replace("[4] good.", "[4] good. [4] again."), // twice
        DESC.replace("[1] weak.", "[1]   "),          // blank level text
        DESC.replace("[5] great. ", "[5] "),          // blank before suffix
        DESC.replace("value: 0, 1, 2, 3, 4, 5", "value: 0,1,2,3,4,5"),
    ];
    for d in bad {
        let t = valid().replacen(DESC, &d, 1);
        assert_eq!(codes(&t), vec![V::LevelFormat], "{d}");
    }
    // Trailing whitespace after the suffix is fine.
    let t = valid().replacen(DESC, &format!("{DESC}  "), 1);
    assert_eq!(codes(&t), vec![]);
}

#[test]
fn not_json() {
    for t in [
        "",
        "   ",
        "{\"categories\": [",
        "not json at all",
        "{\"a\" 1}",
    ] {
        let mut scratch = [0u8; 64];
        let v = validate(t.as_bytes(), &FormatPolicy::PAPER, &mut scratch).unwrap();
        assert!(v.rubric.is_none(), "{t}");
        let c: Vec<V> = v.report.violations().iter().map(|x| x.code).collect();
        assert_eq!(c, vec![V::NotJson], "{t}");
        assert!(v.report.violations()[0].offset.is_some());
        assert_eq!(v.r_fmt(), 0.0);
    }
    // Invalid UTF-8 is not JSON either, reported at the first bad byte.
    let mut scratch = [0u8; 64];
    let v = validate(b"{\"a\xff\":1}", &FormatPolicy::PAPER, &mut scratch).unwrap();
    assert_eq!(v.report.violations()[0].code, V::NotJson);
    assert_eq!(v.report.violations()[0].offset, Some(3));
}

#[test]
fn trailing_text() {
    assert_eq!(
        codes(&format!("{} thanks!", valid())),
        vec![V::TrailingText]
    );
    assert_eq!(
        codes(&format!("Here it is: {}", valid())),
        vec![V::TrailingText]
    );
    assert_eq!(codes(&format!("\n {} \n", valid())), vec![]);
    // Think blocks and fences are trailing text under the paper policy...
    let think = format!("<think>hmm {{}}</think>\n{}", valid());
    let fenced = format!("```json\n{}\n```", valid());
    let lone = format!("reasoning...</think>{}", valid());
    for t in [&think, &fenced, &lone] {
        assert!(codes(t).contains(&V::TrailingText), "{t}");
    }
    // ...and accepted by the lenient options.
    let p = FormatPolicy {
        allow_think: true,
        allow_code_fence: true,
        ..FormatPolicy::PAPER
    };
    for t in [&think, &fenced, &lone] {
        assert_eq!(codes_with(t, &p), vec![], "{t}");
    }
    let both = format!("<think>x</think>\n```json\n{}\n```\n", valid());
    assert_eq!(codes_with(&both, &p), vec![]);
}

#[test]
fn schema() {
    let cases = [
        "[]".to_string(),
        "{}".to_string(),
        r#"{"categories": {}}"#.to_string(),
        valid().replacen(r#""category_weight":0.4"#, r#""category_weight":"0.4""#, 1),
        valid().replacen(r#","weight_rationale":"because""#, "", 1),
        valid().replacen(r#""title":"T00","#, r#""title":"T00","extra":1,"#, 1),
        valid().replacen(r#"{"categories":["#, r#"{"note":"x","categories":["#, 1),
        valid().replacen(r#""title":"T00""#, r#""title":7"#, 1),
        valid().replacen(r#""title":"T00","#, r#""title":"T00","title":"T0x","#, 1),
    ];
    for t in &cases {
        let c = codes(t);
        assert!(c.contains(&V::Schema), "{t}: {c:?}");
    }
    // One schema violation for a wrong-typed weight, and nothing else cascades into weight_sum.
    assert_eq!(codes(&cases[3]), vec![V::Schema]);
    // The envelope is an option.
    let env = format!(r#"{{"analysis":{{"x":1}},"rubric":{}}}"#, valid());
    assert!(codes(&env).contains(&V::Schema));
    let p = FormatPolicy {
        allow_envelope: true,
        ..FormatPolicy::PAPER
    };
    assert_eq!(codes_with(&env, &p), vec![]);
    assert_eq!(codes_with(&valid(), &p), vec![]);
}

#[test]
fn categories() {
    let unknown = valid().replacen("Affective Empathy", "Emotional Empathy", 1);
    assert_eq!(
        codes(&unknown),
        vec![V::UnknownCategory, V::MissingCategory]
    );
    let dup = valid().replacen("Proactive Empathy", "Affective Empathy", 1);
    assert_eq!(codes(&dup), vec![V::DuplicateCategory, V::MissingCategory]);
    let case = valid().replacen("Cognitive Empathy", "cognitive empathy", 1);
    assert!(codes(&case).contains(&V::UnknownCategory));
    // Swapping Cognitive and Proactive names: order violation (weights stay valid).
    let swapped = valid()
        .replacen("Cognitive Empathy", "@@", 1)
        .replacen("Proactive Empathy", "Cognitive Empathy", 1)
        .replacen("@@", "Proactive Empathy", 1);
    assert_eq!(codes(&swapped), vec![V::CategoryOrder, V::CategoryOrder]);
    let p = FormatPolicy {
        require_order: false,
        ..FormatPolicy::PAPER
    };
    assert_eq!(codes_with(&swapped, &p), vec![]);
}

#[test]
fn missing_category_still_parses() {
    let t = rubric_json(["0.6", "0.4", "0.0"], 2);
    let start = t.find(r#",{"category":"Proactive"#).unwrap();
    let end = t.rfind("]}").unwrap();
    let t = format!("{}{}", &t[..start], &t[end..]);
    let mut scratch = [0u8; 64];
    let v = validate(t.as_bytes(), &FormatPolicy::PAPER, &mut scratch).unwrap();
    let c: Vec<V> = v.report.violations().iter().map(|x| x.code).collect();
    assert_eq!(c, vec![V::MissingCategory]);
    assert_eq!(
        v.report.violations()[0].dimension,
        Some(Dimension::Proactive)
    );
    let r = v.rubric.unwrap();
    assert_eq!(r.counts(), [2, 2, 0]);
    assert!(!r.category(Dimension::Proactive).present);
}

#[test]
fn key_order() {
    let t = valid().replacen(
        r#""weight_rationale":"because","category_weight":0.4"#,
        r#""category_weight":0.4,"weight_rationale":"because""#,
        1,
    );
    assert_eq!(codes(&t), vec![V::KeyOrder]);
    let t2 = valid().replacen(
        &format!(r#""title":"T00","description":"{DESC}""#),
        &format!(r#""description":"{DESC}","title":"T00""#),
        1,
    );
    assert_eq!(codes(&t2), vec![V::KeyOrder]);
    let p = FormatPolicy {
        require_key_order: false,
        ..FormatPolicy::PAPER
    };
    assert_eq!(codes_with(&t, &p), vec![]);
    assert_eq!(codes_with(&t2, &p), vec![]);
}

#[test]
fn weight_range() {
    let t = rubric_json(["1.2", "-0.1", "-0.1"], 2);
    assert_eq!(
        codes(&t),
        vec![V::WeightRange, V::WeightRange, V::WeightRange]
    );
    let t = rubric_json(["1e400", "0", "0"], 2);
    assert!(codes(&t).contains(&V::WeightRange));
}

#[test]
fn criteria_count_and_capacity() {
    assert_eq!(
        codes(&rubric_json(["0.4", "0.35", "0.25"], 1)),
        vec![V::CriteriaCount; 3]
    );
    assert_eq!(codes(&rubric_json(["0.4", "0.35", "0.25"], 4)), vec![]);
    assert_eq!(
        codes(&rubric_json(["0.4", "0.35", "0.25"], 5)),
        vec![V::CriteriaCount; 3]
    );
    let p = FormatPolicy {
        min_criteria: 1,
        max_criteria: 40,
        ..FormatPolicy::PAPER
    };
    // 17 > MAX_CRITERIA: capacity, once per category, and the rest still parses.
    let t = rubric_json(["0.4", "0.35", "0.25"], 17);
    let mut scratch = [0u8; 64];
    let v = validate(t.as_bytes(), &p, &mut scratch).unwrap();
    let c: Vec<V> = v.report.violations().iter().map(|x| x.code).collect();
    assert_eq!(c, vec![V::Capacity; 3]);
    assert_eq!(v.rubric.unwrap().counts(), [16, 16, 16]);
}

#[test]
fn duplicate_title() {
    let t = valid().replacen(r#""title":"T21""#, r#""title":"  t00 ""#, 1);
    let mut scratch = [0u8; 64];
    let v = validate(t.as_bytes(), &FormatPolicy::PAPER, &mut scratch).unwrap();
    let vs = v.report.violations();
    assert_eq!(vs.len(), 1, "{}", v.report);
    assert_eq!(vs[0].code, V::DuplicateTitle);
    assert_eq!((vs[0].category, vs[0].criterion), (Some(2), Some(1)));
}

#[test]
fn empty_text() {
    let t = valid().replacen(r#""title":"T10""#, r#""title":"  ""#, 1);
    assert_eq!(codes(&t), vec![V::EmptyText]);
    let t = valid().replacen(
        r#""weight_rationale":"because""#,
        r#""weight_rationale":"\n""#,
        1,
    );
    assert_eq!(codes(&t), vec![V::EmptyText]);
    let t = valid().replacen(DESC, " ", 1);
    assert_eq!(codes(&t), vec![V::EmptyText, V::LevelFormat]);
}

#[test]
fn capacity_for_scratch_and_nesting() {
    // A string with escapes needs scratch; none given.
    let t = valid().replacen("because", r#"because \"quoted\""#, 1);
    let v = validate(t.as_bytes(), &FormatPolicy::PAPER, &mut []).unwrap();
    let c: Vec<V> = v.report.violations().iter().map(|x| x.code).collect();
    assert_eq!(c, vec![V::Capacity]);
    // With scratch it is decoded.
    let mut scratch = [0u8; 64];
    let v = validate(t.as_bytes(), &FormatPolicy::PAPER, &mut scratch).unwrap();
    assert!(v.is_valid());
    assert_eq!(
        v.rubric.unwrap().category(Dimension::Cognitive).rationale,
        "because \"quoted\""
    );
    // Hostile nesting is an error, not a stack overflow.
    let deep = "[".repeat(100_000);
    let v = validate(deep.as_bytes(), &FormatPolicy::PAPER, &mut []).unwrap();
    assert!(v.rubric.is_none());
    assert_eq!(v.report.violations()[0].code, V::Capacity);
}

#[test]
fn meta_word_lint() {
    let t = valid().replacen("because", "unlike the gold reply", 1);
    assert_eq!(codes(&t), vec![]);
    let p = FormatPolicy {
        meta_words: true,
        ..FormatPolicy::PAPER
    };
    assert_eq!(codes_with(&t, &p), vec![V::MetaWord]);
    assert_eq!(find_meta_word("the Ground\n Truth"), Some("ground truth"));
    assert_eq!(find_meta_word("a TARGET reply"), Some("target reply"));
    assert_eq!(find_meta_word("goldfish idealistic referenced"), None);
    assert_eq!(find_meta_word("(ideal)"), Some("ideal"));
    assert_eq!(codes_with(&valid(), &p), vec![]);
}

#[test]
fn reports_all_violations_and_overflows() {
    // Many independent problems at once: all reported.
    let t = rubric_json(["0.5", "0.3", "0.1"], 1)
        .replacen("Affective Empathy", "Feelings", 1)
        .replacen(r#""title":"T00""#, r#""title":"""#, 1);
    let c = codes(&t);
    for want in [
        V::CriteriaCount,
        V::UnknownCategory,
        V::MissingCategory,
        V::EmptyText,
    ] {
        assert!(c.contains(&want), "{want:?} in {c:?}");
    }
    // The weight sum is only judged when all three categories are there (no cascade).
    assert!(!c.contains(&V::WeightSum));
    // More than MAX_VIOLATIONS: overflow flag, r_fmt 0.
    let p = FormatPolicy {
        max_criteria: 200,
        ..FormatPolicy::PAPER
    };
    let crits: Vec<String> = (0..100)
        .map(|_| r#"{"title":"","description":""}"#.to_string())
        .collect();
    let t = format!(
        r#"{{"categories":[{{"category":"Cognitive Empathy","weight_rationale":"x","category_weight":1,"criteria":[{}]}}]}}"#,
        crits.join(",")
    );
    let mut scratch = [0u8; 64];
    let v = validate(t.as_bytes(), &p, &mut scratch).unwrap();
    assert_eq!(
        v.report.violations().len(),
        care_core::format::MAX_VIOLATIONS
    );
    assert!(v.report.overflowed());
    assert_eq!(v.r_fmt(), 0.0);
    let mut feedback = String::new();
    v.report.write_feedback(&mut feedback).unwrap();
    assert!(feedback.ends_with("(more violations were found than reported)\n"));
}

#[test]
fn codes_and_numbers_are_stable() {
    let all = care_core::format::ViolationCode::ALL;
    let strs: Vec<&str> = all.iter().map(|c| c.as_str()).collect();
    assert_eq!(
        strs,
        [
            "not_json",
            "trailing_text",
            "schema",
            "unknown_category",
            "duplicate_category",
            "missing_category",
            "category_order",
            "key_order",
            "weight_range",
            "weight_sum",
            "criteria_count",
            "level_format",
            "duplicate_title",
            "empty_text",
            "capacity",
            "meta_word"
        ]
    );
    for (i, c) in all.iter().enumerate() {
        assert_eq!(usize::from(c.number()), i + 1);
        assert_eq!(V::from_number(c.number()), Some(*c));
        assert_eq!(V::from_str_code(c.as_str()), Some(*c));
    }
}
