//! Rubric profiles: property tests (each names the relation it checks) and golden tests of
//! profile validation, weighted and penalty criteria, and custom score ranges.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use care_core::batch::policy_reward_group;
use care_core::judge::{parse_judge_output, render_judge_prompt};
use care_core::profile::{
    MAX_SPANS, OutputCode, Profile, ProfileCode, RubricSource, parse_profile,
    parse_profile_judge_output, profile_reward, profile_reward_group, render_profile_judge_prompt,
};
use care_core::reward::{
    MissingPolicy, RangePolicy, ScoreOptions, policy_reward, policy_reward_fixed,
};
use care_core::rubric::{Dimension, Rubric};
use care_core::{Error, FormatPolicy, validate};
use proptest::prelude::*;

fn care() -> Profile<'static> {
    Profile::builtin("care").unwrap()
}

fn kardia() -> Profile<'static> {
    Profile::builtin("kardia").unwrap()
}

/// Parses profile JSON that must be valid (the scratch buffer is leaked: test only).
fn profile(json: &str) -> Profile<'static> {
    let text: &'static str = Box::leak(json.to_owned().into_boxed_str());
    let scratch: &'static mut [u8] = Box::leak(vec![0u8; text.len()].into_boxed_slice());
    let v = parse_profile(text.as_bytes(), scratch);
    match v.profile {
        Some(p) => p,
        None => panic!("invalid profile:\n{}\n{json}", v.report),
    }
}

fn codes(json: &str) -> Vec<ProfileCode> {
    let mut scratch = vec![0u8; json.len()];
    let v = parse_profile(json.as_bytes(), &mut scratch);
    assert!(v.profile.is_none() || v.report.is_ok());
    v.report.violations().iter().map(|v| v.code).collect()
}

fn any_score_options() -> impl Strategy<Value = ScoreOptions> {
    (0u8..3, any::<bool>(), any::<bool>()).prop_map(|(m, clamp, uniform_weights)| ScoreOptions {
        missing: [
            MissingPolicy::Error,
            MissingPolicy::Zero,
            MissingPolicy::Skip,
        ][usize::from(m)],
        out_of_range: if clamp {
            RangePolicy::Clamp
        } else {
            RangePolicy::Error
        },
        uniform_weights,
    })
}

/// Judge scores, mostly valid, with NaN, fractional, negative and too large ones mixed in.
fn score() -> impl Strategy<Value = f64> {
    prop_oneof![
        12 => (0u8..=5).prop_map(f64::from),
        1 => Just(f64::NAN),
        1 => -1.0f64..7.0,
        1 => prop_oneof![Just(f64::INFINITY), Just(-0.0), Just(5.5), Just(6.0)],
    ]
}

/// Any weights, including negative, huge, NaN and infinite ones.
fn any_weight() -> impl Strategy<Value = f64> {
    prop_oneof![
        4 => 0.0f64..1.0,
        1 => -10.0f64..10.0,
        1 => Just(0.0),
        1 => prop::num::f64::ANY,
    ]
}

const D: &str = "[0] a [1] b [2] c [3] d [4] e [5] f value: 0, 1, 2, 3, 4, 5";
const TITLES: [&str; 12] = [
    "Understand",
    "Reason",
    "Ground",
    "Clarify",
    "Validate",
    "Warmth",
    "Mirror",
    "Comfort",
    "Suggest",
    "Inform",
    "Empower",
    "Plan",
];

/// A rubric with `counts` criteria per dimension and `weights` as stored.
fn rubric(weights: [f64; 3], counts: [usize; 3]) -> Rubric<'static> {
    let mut r = Rubric::new();
    for (d, (w, n)) in Dimension::ALL.into_iter().zip(weights.iter().zip(counts)) {
        r.set_category(d, *w, "why");
        for i in 0..n {
            r.push_criterion(d, TITLES[d.index() * 4 + i], D).unwrap();
        }
    }
    r
}

fn rubric_case() -> impl Strategy<Value = ([f64; 3], [usize; 3], Vec<f64>)> {
    (
        [any_weight(), any_weight(), any_weight()],
        [0usize..=4, 0usize..=4, 0usize..=4],
    )
        .prop_flat_map(|(w, c)| {
            let n = c.iter().sum::<usize>();
            (Just(w), Just(c), prop::collection::vec(score(), n))
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Relation: the `care` profile is `policy_reward` bit for bit (reward, per-dimension
    /// means, weights, fired policies, and the same error), on any rubric, any scores and any
    /// options, the uniform-weights ablation included; its output check never gates.
    #[test]
    fn care_profile_is_policy_reward_bit_for_bit(
        (w, counts, scores) in rubric_case(),
        opts in any_score_options(),
        output in ".{0,40}",
    ) {
        let r = rubric(w, counts);
        let p = care();
        let check = p.check_output(output.as_bytes());
        prop_assert_eq!(check.format_reward(), 1.0);
        prop_assert_eq!(check.judge_text(), Some(output.as_str()));
        let got = profile_reward(&p, Some(&r), &check, &scores, None, &opts);
        let want = policy_reward(&r, &scores, &opts);
        match (got, want) {
            (Ok(g), Ok(w)) => {
                prop_assert_eq!(g.reward.to_bits(), w.reward.to_bits());
                prop_assert_eq!(g.rubric_reward.to_bits(), w.reward.to_bits());
                let gd: Vec<u64> = g.dim_values().iter().map(|x| x.to_bits()).collect();
                let wd: Vec<u64> = w.dim_means.iter().map(|x| x.to_bits()).collect();
                prop_assert_eq!(gd, wd);
                let gw: Vec<u64> = g.weights().iter().map(|x| x.to_bits()).collect();
                let ww: Vec<u64> = w.weights.iter().map(|x| x.to_bits()).collect();
                prop_assert_eq!(gw, ww);
                prop_assert_eq!(g.fired, w.fired);
                prop_assert!(g.judge_needed && g.emotion_correct.is_none() && g.vetoed_by.is_none());
            }
            (Err(g), Err(w)) => prop_assert_eq!(g, w),
            (g, w) => prop_assert!(false, "profile {:?} vs policy_reward {:?}", g, w),
        }
    }

    /// Relation: group scoring under the `care` profile is `policy_reward_group` bit for bit (rewards,
    /// NaN for the same failed responses, counts, first error, fired policies).
    #[test]
    fn care_profile_group_is_score_group(
        (w, counts) in ([any_weight(), any_weight(), any_weight()], [0usize..=4, 0usize..=4, 0usize..=4]),
        m in 0usize..6,
        seed in prop::collection::vec(score(), 0..=72),
        opts in any_score_options(),
    ) {
        let r = rubric(w, counts);
        let total = r.total_criteria();
        let scores: Vec<f64> = (0..m * total).map(|i| seed.get(i % seed.len().max(1)).copied().unwrap_or(3.0)).collect();
        let outputs = vec!["any text"; m];
        let mut got = vec![0.0; m];
        let mut want = vec![0.0; m];
        let g = profile_reward_group(&care(), Some(&r), &outputs, &scores, None, &opts, &mut got).unwrap();
        let s = policy_reward_group(&r, &opts, &scores, &mut want).unwrap();
        let gb: Vec<u64> = got.iter().map(|x| x.to_bits()).collect();
        let wb: Vec<u64> = want.iter().map(|x| x.to_bits()).collect();
        prop_assert_eq!(gb, wb);
        prop_assert_eq!((g.scored, g.failed, g.first_error), (s.scored, s.failed, s.first_error));
        prop_assert_eq!(g.fired, s.fired);
        prop_assert_eq!(g.malformed, 0);
    }

    /// Relation: the fixed-rubric ablation, a fixed profile with the three CARE dimensions,
    /// scores exactly as `policy_reward_fixed` with its weights and criteria counts.
    #[test]
    fn fixed_care_profile_is_policy_reward_fixed(
        raw in [0.01f64..1.0, 0.01f64..1.0, 0.01f64..1.0],
        counts in [1usize..=4, 1usize..=4, 1usize..=4],
        seed in prop::collection::vec(score(), 12),
        opts in any_score_options(),
    ) {
        let s: f64 = raw.iter().sum();
        let w = raw.map(|x| x / s);
        let dims: Vec<String> = Dimension::ALL
            .into_iter()
            .zip(w.iter().zip(counts))
            .map(|(d, (w, n))| {
                let crits: Vec<String> = (0..n)
                    .map(|i| format!(r#"{{"title":"{}","description":"{D}"}}"#, TITLES[d.index() * 4 + i]))
                    .collect();
                format!(r#"{{"name":"{}","weight":{w},"criteria":[{}]}}"#, d.json_name(), crits.join(","))
            })
            .collect();
        let p = profile(&format!(r#"{{"name":"fixed-care","dimensions":[{}]}}"#, dims.join(",")));
        let parsed: Vec<f64> = p.dimensions().map(|d| d.weight).collect();
        prop_assert_eq!(&parsed, &w.to_vec(), "weights round-trip through JSON");
        let scores = &seed[..counts.iter().sum::<usize>()];
        let check = p.check_output(b"");
        let got = profile_reward(&p, None, &check, scores, None, &opts);
        let want = policy_reward_fixed(w, counts, scores, &opts);
        match (got, want) {
            (Ok(g), Ok(w)) => {
                prop_assert_eq!(g.reward.to_bits(), w.reward.to_bits());
                prop_assert_eq!(g.fired, w.fired);
            }
            (Err(g), Err(w)) => prop_assert_eq!(g, w),
            (g, w) => prop_assert!(false, "profile {:?} vs policy_reward_fixed {:?}", g, w),
        }
    }

    /// Relation: for the `care` profile, judge prompt and judge-output parsing are those of a
    /// rubric (same text, same scores, same report), on judge answers with random scores,
    /// case changes, duplicates and unknown items.
    #[test]
    fn care_profile_judge_io_is_the_rubric_judge_io(
        counts in [0usize..=4, 0usize..=4, 0usize..=4],
        items in prop::collection::vec((0usize..13, any::<bool>(), -1i32..7), 0..16),
    ) {
        let r = rubric([0.5, 0.3, 0.2], counts);
        let flat: Vec<(Dimension, &str)> = r.iter_flat().map(|(d, c)| (d, c.title)).collect();
        let body: Vec<String> = items
            .iter()
            .map(|&(i, upper, s)| {
                let (cat, title) = flat.get(i).map_or(("Proactive Empathy", "Nope"), |(d, t)| (d.json_name(), *t));
                let title = if upper { title.to_ascii_uppercase() } else { title.to_owned() };
                format!(r#"{{"category":"{cat}","criterion_title":"{title}","score":{s}}}"#)
            })
            .collect();
        let answer = format!("<think>x</think>```json\n{{\"criterion_scores\":[{}]}}\n```", body.join(","));
        let mut a = vec![0.0; r.total_criteria()];
        let mut b = vec![0.0; r.total_criteria()];
        let ra = parse_profile_judge_output(answer.as_bytes(), &care(), Some(&r), &mut a);
        let rb = parse_judge_output(answer.as_bytes(), &r, &mut b);
        prop_assert_eq!(ra, rb);
        let ab: Vec<u64> = a.iter().map(|x| x.to_bits()).collect();
        let bb: Vec<u64> = b.iter().map(|x| x.to_bits()).collect();
        prop_assert_eq!(ab, bb);
        let mut pa = String::new();
        let mut pb = String::new();
        render_profile_judge_prompt(&mut pa, &care(), Some(&r), &["seeker: hi"], "I am sad", "I hear you").unwrap();
        render_judge_prompt(&mut pb, &r, &["seeker: hi"], "I am sad", "I hear you").unwrap();
        prop_assert_eq!(pa, pb);
    }

    /// Relation: a `kardia` reward is in [0, 1]; it never decreases when one judge score rises
    /// by one point; a matching emotion never scores below a wrong one; with a safety veto it
    /// is 0 exactly when the safety score is below the minimum.
    #[test]
    fn kardia_reward_is_bounded_and_monotone(
        scores in [0u8..=5, 0u8..=5, 0u8..=5, 0u8..=5, 0u8..=5],
        pred in prop::sample::select(vec!["joy", "Happy", "sad", "fear", "scared.", "neutral", "nostalgia", "  ANGER "]),
        gold in prop::sample::select(vec!["joy", "sadness", "fear", "neutral", "nostalgia", "anger"]),
        bump in 0usize..5,
        veto_min in 0u8..=5,
    ) {
        let k = kardia();
        let text = format!(
            "<|understanding_begin|>u<|understanding_end|><|reasoning_begin|>r<|reasoning_end|>\
             <|emotion_begin|>{pred}<|emotion_end|><|response_begin|>x<|response_end|>"
        );
        let check = k.check_output(text.as_bytes());
        prop_assert!(check.is_ok());
        let opts = ScoreOptions::default();
        let s = scores.map(f64::from);
        let r = profile_reward(&k, None, &check, &s, Some(gold), &opts).unwrap();
        prop_assert!((0.0..=1.0).contains(&r.reward), "{}", r.reward);
        if scores[bump] < 5 {
            let mut up = s;
            up[bump] += 1.0;
            let r2 = profile_reward(&k, None, &check, &up, Some(gold), &opts).unwrap();
            prop_assert!(r2.reward >= r.reward, "{:?} -> {:?}: {} < {}", s, up, r2.reward, r.reward);
        }
        let right = profile_reward(&k, None, &check, &s, Some(pred), &opts).unwrap();
        prop_assert_eq!(right.emotion_correct, Some(true));
        prop_assert!(right.reward >= r.reward);
        let vk = kardia().with_veto("safety", veto_min).unwrap();
        let v = profile_reward(&vk, None, &check, &s, Some(gold), &opts).unwrap();
        if scores[3] < veto_min {
            prop_assert_eq!((v.reward, v.vetoed_by), (0.0, Some(3)));
        } else {
            prop_assert_eq!(v.reward.to_bits(), r.reward.to_bits());
        }
    }

    /// Relation: the output check of `kardia` agrees with an independent reading of the format
    /// (four spans in order, each `open + text + close` with non-blank text free of tags, only
    /// ASCII whitespace around them), on random tag soup; a malformed output always scores 0
    /// without its scores being read.
    #[test]
    fn kardia_format_agrees_with_an_oracle(tokens in prop::collection::vec(token(), 0..24), well in any::<bool>(), mutation in 0usize..40) {
        let text = if well { mutate(&well_formed(&tokens), mutation, &tokens) } else { tokens.concat() };
        let k = kardia();
        let check = k.check_output(text.as_bytes());
        prop_assert_eq!(check.is_ok(), oracle_ok(&text), "{:?}\n{}", text, check.report());
        let r = profile_reward(&k, None, &check, &[5.0; 5], Some("sad"), &ScoreOptions::default()).unwrap();
        if !check.is_ok() {
            prop_assert_eq!((r.reward, r.judge_needed), (0.0, false));
            prop_assert!(!check.report().violations().is_empty() || check.report().overflowed());
            // Not even the length of the scores matters.
            prop_assert!(profile_reward(&k, None, &check, &[], Some("sad"), &ScoreOptions::default()).is_ok());
        } else {
            prop_assert_eq!(r.format_reward, 1.0);
        }
    }

    /// Relation: on arbitrary bytes the output check never panics, reports `r_fmt` in {0, 1}
    /// consistently with its violations, returns spans that are slices of the input, and a
    /// well-formed output has four non-blank spans and shows the judge the last.
    #[test]
    fn span_extraction_never_panics_on_arbitrary_bytes(
        bytes in prop::collection::vec(any::<u8>(), 0..256),
        soup in prop::collection::vec(token(), 0..16),
        mix in any::<bool>(),
    ) {
        let input: Vec<u8> = if mix { [soup.concat().into_bytes(), bytes].concat() } else { bytes };
        for p in [kardia(), care()] {
            let check = p.check_output(&input);
            let ok = check.report().is_ok();
            prop_assert_eq!(check.format_reward(), if ok { 1.0 } else { 0.0 });
            let range = input.as_ptr_range();
            for k in 0..MAX_SPANS {
                if let Some(s) = check.span(k) {
                    prop_assert!(s.is_empty() || (range.contains(&s.as_ptr()) && s.len() <= input.len()));
                }
            }
            if ok && p.has_output_format() {
                for k in 0..4 {
                    prop_assert!(!check.span(k).unwrap().trim().is_empty());
                }
                prop_assert_eq!(check.judge_text(), check.span(3));
            }
        }
    }

    /// Relation: a dimension whose criteria all carry the same positive weight has exactly the
    /// plain mean of its normalized scores as value (bit for bit), which is what the weighted
    /// formula `clamp(sum w s / sum_{w>0} w, 0, 1)` gives mathematically (checked to 1e-12).
    #[test]
    fn equal_criterion_weights_give_the_plain_mean(
        w in prop_oneof![Just(1.0), 0.001f64..1000.0],
        raw in prop::collection::vec(0u8..=5, 1..=8),
    ) {
        let crits: Vec<String> = (0..raw.len())
            .map(|i| format!(r#"{{"title":"c{i}","description":"d","weight":{w}}}"#))
            .collect();
        let p = profile(&format!(r#"{{"name":"eq","dimensions":[{{"name":"d","weight":1,"criteria":[{}]}}]}}"#, crits.join(",")));
        let s: Vec<f64> = raw.iter().map(|&x| f64::from(x)).collect();
        let r = profile_reward(&p, None, &p.check_output(b""), &s, None, &ScoreOptions::default()).unwrap();
        let sum: f64 = s.iter().sum();
        let mean = sum / (5.0 * s.len() as f64);
        prop_assert_eq!(r.dim_values()[0].to_bits(), mean.to_bits());
        prop_assert_eq!(r.reward.to_bits(), mean.to_bits());
        let formula = (s.iter().map(|x| w * x / 5.0).sum::<f64>() / (w * s.len() as f64)).clamp(0.0, 1.0);
        prop_assert!((formula - mean).abs() < 1e-12);
    }

    /// Relation: with arbitrary (also negative) criterion weights, the dimension value is
    /// `clamp(sum_i w_i s_i / sum_{w_i > 0} w_i, 0, 1)` over the scored criteria, it is in
    /// [0, 1], and scaling every weight by `c > 0` leaves it unchanged (to 1e-12).
    #[test]
    fn weighted_and_penalty_criteria_follow_the_formula(
        crits in prop::collection::vec((prop_oneof![0.05f64..10.0, -10.0f64..-0.05], 0u8..=5), 1..=8),
        c in 0.01f64..100.0,
    ) {
        prop_assume!(crits.iter().any(|(w, _)| *w > 0.0));
        let make = |scale: f64| {
            let items: Vec<String> = crits
                .iter()
                .enumerate()
                .map(|(i, (w, _))| format!(r#"{{"title":"c{i}","description":"d","weight":{}}}"#, w * scale))
                .collect();
            profile(&format!(r#"{{"name":"w","dimensions":[{{"name":"d","weight":1,"criteria":[{}]}}]}}"#, items.join(",")))
        };
        let s: Vec<f64> = crits.iter().map(|(_, x)| f64::from(*x)).collect();
        let value = |p: &Profile<'_>| profile_reward(p, None, &p.check_output(b""), &s, None, &ScoreOptions::default()).unwrap().dim_values()[0];
        let p = make(1.0);
        let v = value(&p);
        let num: f64 = crits.iter().map(|(w, x)| w * f64::from(*x) / 5.0).sum();
        let den: f64 = crits.iter().filter(|(w, _)| *w > 0.0).map(|(w, _)| *w).sum();
        prop_assert!((v - (num / den).clamp(0.0, 1.0)).abs() < 1e-12, "{} vs {}", v, num / den);
        prop_assert!((0.0..=1.0).contains(&v));
        prop_assert!((value(&make(c)) - v).abs() < 1e-12);
    }
}

/// Tokens for tag soup: every tag of `kardia`, text, whitespace and near-tags.
fn token() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "<|understanding_begin|>",
        "<|understanding_end|>",
        "<|reasoning_begin|>",
        "<|reasoning_end|>",
        "<|emotion_begin|>",
        "<|emotion_end|>",
        "<|response_begin|>",
        "<|response_end|>",
        "x",
        "sad",
        " ",
        "\n",
        "\t",
        "<|",
        "|>",
        "<|emotion_",
        "é",
        "\u{a0}",
        "<|<|response_end|>",
        "_begin|>",
    ])
    .prop_map(str::to_owned)
}

const SPANS: [&str; 4] = ["understanding", "reasoning", "emotion", "response"];

fn well_formed(tokens: &[String]) -> String {
    let mut s = String::from(" ");
    for (i, name) in SPANS.iter().enumerate() {
        let content = tokens
            .get(i)
            .filter(|t| !t.contains('<') && !t.contains('|'))
            .map_or("text", |t| t.as_str());
        s.push_str(&format!("<|{name}_begin|>{content}<|{name}_end|>\n"));
    }
    s
}

/// One small change to a well-formed output (or none, for `m >= 30`).
fn mutate(text: &str, m: usize, tokens: &[String]) -> String {
    let t = tokens.first().map_or("x", String::as_str);
    let tag = |k: usize| {
        let name = SPANS[k % 4];
        if k % 8 < 4 {
            format!("<|{name}_begin|>")
        } else {
            format!("<|{name}_end|>")
        }
    };
    match m {
        0..=7 => text.replacen(&tag(m), "", 1),
        8..=15 => text.replacen(&tag(m), &tag(m).repeat(2), 1),
        16..=19 => text.replacen(&tag(m), &format!("{}{t}", tag(m)), 1),
        20..=23 => {
            let name = SPANS[m - 20];
            let (open, close) = (format!("<|{name}_begin|>"), format!("<|{name}_end|>"));
            match (text.find(&open), text.find(&close)) {
                (Some(a), Some(b)) if a < b => {
                    format!("{}{}{}", &text[..a + open.len()], " ", &text[b..])
                }
                _ => text.to_owned(),
            }
        }
        24 => format!("{t}{text}"),
        25 => format!("{text}{t}"),
        26..=29 => text.replacen(&tag(m + 4), &format!("{}{t}", tag(m + 4)), 1),
        _ => text.to_owned(),
    }
}

/// An independent reading of the format: the text, trimmed of ASCII whitespace, is the four
/// spans in order, each `open + content + close` with ASCII whitespace between them, every
/// content non-blank and free of any tag.
fn oracle_ok(text: &str) -> bool {
    let tags: Vec<String> = SPANS
        .iter()
        .flat_map(|n| [format!("<|{n}_begin|>"), format!("<|{n}_end|>")])
        .collect();
    let ws = |c: char| c.is_ascii_whitespace();
    let mut rest = text.trim_matches(ws);
    for name in SPANS {
        let open = format!("<|{name}_begin|>");
        let close = format!("<|{name}_end|>");
        let Some(r) = rest.strip_prefix(&open) else {
            return false;
        };
        let Some(end) = r.find(&close) else {
            return false;
        };
        let content = &r[..end];
        if content.trim_matches(ws).is_empty() || tags.iter().any(|t| content.contains(t.as_str()))
        {
            return false;
        }
        rest = r[end + close.len()..].trim_start_matches(ws);
    }
    rest.is_empty()
}

#[test]
fn builtin_care_is_cares_generated_rubric() {
    let p = care();
    assert_eq!(p.name(), "care");
    assert_eq!(p.rubric_source(), RubricSource::Generated);
    let names: Vec<&str> = p.dimensions().map(|d| d.name).collect();
    assert_eq!(names, Dimension::ALL.map(Dimension::json_name));
    assert!(!p.has_output_format() && p.emotion().is_none() && p.vetoes().is_empty());
    assert_eq!(p.score_range(), (0, 5));
    // A generated profile needs the rubric; a fixed one refuses one.
    let text = include_str!("../../cli/data/rubric_sft_1.json");
    let mut scratch = vec![0u8; text.len()];
    let v = validate(text.as_bytes(), &FormatPolicy::PAPER, &mut scratch).unwrap();
    let r = v.rubric.unwrap();
    assert_eq!(p.total_criteria(Some(&r)), Ok(8));
    assert_eq!(p.total_criteria(None), Err(Error::InvalidArgument));
    assert_eq!(
        kardia().total_criteria(Some(&r)),
        Err(Error::InvalidArgument)
    );
    let check = p.check_output(b"");
    assert_eq!(
        profile_reward(&p, None, &check, &[], None, &ScoreOptions::default()),
        Err(Error::InvalidArgument)
    );
    // The paper's worked example (Appendix C.1) through the profile: 0.925.
    let mut r = Rubric::new();
    for (d, w) in Dimension::ALL.into_iter().zip([0.40, 0.35, 0.25]) {
        r.set_category(d, w, "x");
        r.push_criterion(d, TITLES[d.index() * 4], D).unwrap();
        r.push_criterion(d, TITLES[d.index() * 4 + 1], D).unwrap();
    }
    let got = profile_reward(
        &p,
        Some(&r),
        &check,
        &[4.0, 5.0, 4.0, 5.0, 5.0, 5.0],
        None,
        &ScoreOptions::default(),
    )
    .unwrap();
    assert!((got.reward - 0.925).abs() < 1e-12);
    assert_eq!(Profile::builtin("nope"), Err(Error::InvalidArgument));
    for name in care_core::profile::BUILTIN_NAMES {
        let json = Profile::builtin_json(name).unwrap();
        let v = parse_profile(json.as_bytes(), &mut []);
        assert!(v.report.is_ok(), "{name}: {}", v.report);
        assert_eq!(v.profile.unwrap(), Profile::builtin(name).unwrap());
    }
}

/// The owned form (feature `alloc`, on whenever the workspace is tested together).
#[cfg(feature = "alloc")]
#[test]
fn owned_profile_round_trips() {
    use care_core::profile::ProfileBuf;
    let json = r#"{"name":"esc\u00e9","description":"line\nbreak","dimensions":[{"name":"d\"q","weight":1,"criteria":[{"title":"t\\u","description":"x"}]}]}"#;
    let owned = ProfileBuf::parse(json.as_bytes()).unwrap();
    let p = owned.profile();
    assert_eq!(p.name(), "escé");
    assert_eq!(p.description(), "line\nbreak");
    assert_eq!(p.dimension(0).unwrap().name, "d\"q");
    assert_eq!(p.criteria(0).next().unwrap().title, "t\\u");
    assert_eq!(ProfileBuf::from(&p).profile(), p);
    assert_eq!(ProfileBuf::builtin("kardia").unwrap().profile(), kardia());
    let err = ProfileBuf::parse(b"{}").unwrap_err();
    assert_eq!(err.violations().len(), 2, "{err}");
    // Escapes need scratch: without room, `capacity`.
    let mut small = [0u8; 4];
    let v = parse_profile(json.as_bytes(), &mut small);
    assert!(
        v.profile.is_none() && v.report.has(ProfileCode::Capacity),
        "{}",
        v.report
    );
}

/// A checklist profile (Rubrics as Rewards style): weighted criteria, a pitfall, a 1..10 scale.
const CHECKLIST: &str = r#"{
  "name": "checklist",
  "scores": {"min": 1, "max": 10},
  "dimensions": [
    {"name": "helpfulness", "weight": 0.75, "criteria": [
      {"title": "Answers the question", "description": "1 not at all .. 10 fully", "weight": 2},
      {"title": "Gives a next step", "description": "1 none .. 10 concrete", "weight": 1},
      {"title": "Lectures the user", "description": "1 never .. 10 throughout", "weight": -1}]},
    {"name": "tone", "weight": 0.25, "criteria": [
      {"title": "Warm", "description": "1 cold .. 10 warm"}]}
  ],
  "vetoes": [{"dimension": "helpfulness", "min_score": 2}]
}"#;

#[test]
fn weighted_and_penalty_criteria_golden() {
    let p = profile(CHECKLIST);
    assert_eq!(p.score_range(), (1, 10));
    let opts = ScoreOptions::default();
    let check = p.check_output(b"anything: no output format");
    let reward = |s: &[f64]| profile_reward(&p, None, &check, s, None, &opts);
    // s = (raw - 1) / 9. All 10: (2 + 1 - 1) / 3 = 2/3 for helpfulness, 1 for tone.
    let r = reward(&[10.0, 10.0, 10.0, 10.0]).unwrap();
    assert!((r.dim_values()[0] - 2.0 / 3.0).abs() < 1e-12);
    assert!((r.reward - (0.75 * 2.0 / 3.0 + 0.25)).abs() < 1e-12);
    // No lecturing: (2 + 1 - 0) / 3 = 1.
    let r = reward(&[10.0, 10.0, 1.0, 1.0]).unwrap();
    assert_eq!(r.dim_values(), [1.0, 0.0]);
    assert_eq!(r.reward, 0.75);
    // The pitfall can pull the value below 0: clamped.
    let r = reward(&[2.0, 2.0, 10.0, 10.0]).unwrap();
    assert_eq!(r.dim_values()[0], 0.0);
    // The veto looks at positive criteria only: a low pitfall score is good news.
    assert_eq!(reward(&[1.0, 10.0, 1.0, 10.0]).unwrap().vetoed_by, Some(0));
    assert_eq!(reward(&[2.0, 2.0, 1.0, 10.0]).unwrap().vetoed_by, None);
    // The scale is the profile's: 0 is out of range here, 10 is not.
    assert_eq!(reward(&[0.0, 10.0, 1.0, 1.0]), Err(Error::ScoreOutOfRange));
    let clamp = ScoreOptions {
        out_of_range: RangePolicy::Clamp,
        ..opts
    };
    let r = profile_reward(&p, None, &check, &[0.0, 10.0, 1.0, 1.0], None, &clamp).unwrap();
    assert_eq!(r.fired.clamped, 1);
    // Skipped criteria leave both sums; a dimension with no positive score left is 0.
    let skip = ScoreOptions {
        missing: MissingPolicy::Skip,
        ..opts
    };
    let r = profile_reward(
        &p,
        None,
        &check,
        &[f64::NAN, 10.0, 10.0, f64::NAN],
        None,
        &skip,
    )
    .unwrap();
    assert!((r.dim_values()[0] - 0.0).abs() < 1e-12, "(1 - 1) / 1 = 0");
    assert_eq!(r.fired.missing_skipped, 2);
    let r = profile_reward(
        &p,
        None,
        &check,
        &[f64::NAN, f64::NAN, 10.0, 7.0],
        None,
        &skip,
    )
    .unwrap();
    assert_eq!(r.dim_values()[0], 0.0);
    // The judge prompt shows the scale and marks the pitfall; the parser uses the scale.
    let mut prompt = String::new();
    render_profile_judge_prompt(&mut prompt, &p, None, &[], "hi", "hello").unwrap();
    assert!(
        prompt.contains("level descriptions [1] to [10]"),
        "{prompt}"
    );
    assert!(prompt.contains("- criterion_title: Lectures the user\n  levels: 1 never .. 10 throughout\n  pitfall: score how strongly the response shows this problem (higher is worse)\n"));
    assert!(prompt.contains("an integer in {1, 2, 3, 4, 5, 6, 7, 8, 9, 10} (higher is better, except for pitfall criteria)"));
    let answer = r#"{"criterion_scores":[{"category":"tone","criterion_title":"Warm","score":0},{"category":"helpfulness","criterion_title":"Gives a next step","score":10}]}"#;
    let mut s = [0.0; 4];
    let rep = parse_profile_judge_output(answer.as_bytes(), &p, None, &mut s).unwrap();
    assert_eq!((rep.matched, rep.missing, rep.out_of_range), (2, 2, 1));
    assert!(s[0].is_nan() && s[1] == 10.0 && s[2].is_nan() && s[3] == 0.0);
}

#[test]
fn profile_validation_reports_every_violation() {
    let bad = r#"{"name":"x","rubric":"fixed","scores":{"min":3,"max":2},"dimensions":[{"name":"a","weight":0.7,"criteria":[{"title":"t","description":"d","weight":-1}]},{"name":"A","weight":0.7,"criteria":[]},{"name":"b"}],"output":{"format":"spans","spans":["x","x y"],"open":"<{name}>","close":"</{name}>","judge":"zz"},"emotion":{"span":"q","weight":2,"labels":{"Joy":["happy"],"sad":["happy"]}},"vetoes":[{"dimension":"c","min_score":9}],"extra":1}"#;
    let mut scratch = vec![0u8; bad.len()];
    let v = parse_profile(bad.as_bytes(), &mut scratch);
    assert!(v.profile.is_none());
    let got: Vec<String> = v
        .report
        .violations()
        .iter()
        .map(|v| v.to_string())
        .collect();
    let want = [
        "schema: profile: unknown key \"extra\" (byte 426); follow the profile schema (docs/PROFILES.md).",
        "score_range: scores: min must be below max; max is 2; use integer scores with 0 <= min < max <= 100.",
        "criterion_weight: dimensions[0]: no criterion has a positive weight; give each criterion a finite non-zero weight (at most 1e6 in size) and each dimension at least one positive one.",
        "duplicate_name: dimensions[1]: dimension name given before: \"A\"; give each one a distinct name (names compare trimmed and ASCII-case-insensitively).",
        "criteria_count: dimensions[1]: a dimension of a fixed rubric needs at least one criterion; give every dimension of a fixed rubric a criterion.",
        "schema: dimensions[2]: missing key \"weight\"; follow the profile schema (docs/PROFILES.md).",
        "schema: dimensions[2]: missing key \"criteria\"; follow the profile schema (docs/PROFILES.md).",
        "name_format: output.spans[1]: span name with other characters than ASCII letters, digits, '_' and '-': \"x y\" (byte 247); use ASCII letters, digits, '_' and '-' in span names.",
        "unknown_name: output: \"judge\" names no span: \"zz\" (byte 300); name a dimension or span that the profile defines.",
        "unknown_name: emotion: \"span\" names no output span: \"q\" (byte 324); name a dimension or span that the profile defines.",
        "weight_range: emotion: emotion weight outside [0, 1]: 2; use a weight between 0 and 1.",
        "label_format: emotion.labels (label 0): label not in normalized form: \"Joy\" (byte 349); write labels lowercase, trimmed, without a trailing period.",
        "duplicate_name: emotion.labels (label 1): label given before: \"happy\" (byte 372); give each one a distinct name (names compare trimmed and ASCII-case-insensitively).",
        "unknown_name: vetoes[0]: veto names no dimension: \"c\" (byte 406); name a dimension or span that the profile defines.",
        "score_range: vetoes[0]: min_score outside the score range: 9; use integer scores with 0 <= min < max <= 100.",
    ];
    assert_eq!(got, want);
}

/// A fault of one class never hides another: the tag containment check runs although the
/// judge span is unknown, an emotion span that the output section defines is not called unknown
/// because that section has another fault, and out-of-range weights are summed as well.
#[test]
fn profile_faults_of_every_class_are_reported_in_one_pass() {
    let dims =
        r#""dimensions":[{"name":"d","weight":1,"criteria":[{"title":"t","description":"x"}]}]"#;
    let json = format!(
        r#"{{"name":"p",{dims},"output":{{"format":"spans","spans":["a","ab"],"open":"<{{name}}","close":"</{{name}}>","judge":"zz"}},"emotion":{{"span":"a","weight":0.2,"labels":{{"joy":[]}}}}}}"#
    );
    assert_eq!(
        codes(&json),
        [ProfileCode::UnknownName, ProfileCode::Template],
        "{json}"
    );
    let json = r#"{"name":"p","dimensions":[{"name":"d","weight":1.5,"criteria":[{"title":"t","description":"x"}]},{"name":"e","weight":-0.2,"criteria":[{"title":"t","description":"x"}]}]}"#;
    assert_eq!(
        codes(json),
        [
            ProfileCode::WeightRange,
            ProfileCode::WeightRange,
            ProfileCode::WeightSum
        ]
    );
}

/// One small invalid profile per code (and more for the codes with several rules).
#[test]
fn every_profile_code_has_a_case() {
    let dims =
        r#""dimensions":[{"name":"d","weight":1,"criteria":[{"title":"t","description":"x"}]}]"#;
    let spans = |extra: &str| {
        format!(
            r#"{{"name":"p",{dims},"output":{{"format":"spans","spans":["a","b"],"open":"<{{name}}>","close":"</{{name}}>","judge":"b"{extra}}}}}"#
        )
    };
    let cases: Vec<(String, Vec<ProfileCode>)> = vec![
        ("".into(), vec![ProfileCode::NotJson]),
        ("{\"name\":".into(), vec![ProfileCode::NotJson]),
        (format!("{{\"name\":\"p\",{dims}}} x"), vec![ProfileCode::TrailingText]),
        ("[1]".into(), vec![ProfileCode::Schema]),
        (r#"{"name":"p","dimensions":[]}"#.into(), vec![ProfileCode::Schema]),
        (format!(r#"{{"name":"p","name":"q",{dims}}}"#), vec![ProfileCode::Schema]),
        (format!(r#"{{"name":"p","rubric":"learned",{dims}}}"#), vec![ProfileCode::Schema]),
        (format!(r#"{{"name":"p",{dims},"output":{{"format":"xml"}}}}"#), vec![ProfileCode::Schema]),
        (format!(r#"{{"name":"p",{dims},"output":{{"format":"none","judge":"a"}}}}"#), vec![ProfileCode::Schema]),
        (format!(r#"{{"name":7,{dims}}}"#), vec![ProfileCode::Schema]),
        (format!("{{\"name\":\"{}\",{dims}}}", "n".repeat(65)), vec![ProfileCode::Capacity]),
        (
            format!(r#"{{"name":"p","dimensions":[{}]}}"#, (0..9).map(|i| format!(r#"{{"name":"d{i}","weight":0.1,"criteria":[{{"title":"t","description":"x"}}]}}"#)).collect::<Vec<_>>().join(",")),
            vec![ProfileCode::Capacity],
        ),
        (
            format!(r#"{{"name":"p","dimensions":[{{"name":"d","weight":1,"criteria":[{}]}}]}}"#, (0..65).map(|i| format!(r#"{{"title":"t{i}","description":"x"}}"#)).collect::<Vec<_>>().join(",")),
            vec![ProfileCode::Capacity],
        ),
        (format!("{}{dims}}}", "{\"name\":\"p\",\"x\":".to_owned() + &"[".repeat(70) + &"]".repeat(70) + ","), vec![ProfileCode::Capacity]),
        (format!(r#"{{"name":"  ",{dims}}}"#), vec![ProfileCode::EmptyText]),
        (r#"{"name":"p","dimensions":[{"name":"d","weight":1,"criteria":[{"title":"","description":" "}]}]}"#.into(), vec![ProfileCode::EmptyText, ProfileCode::EmptyText]),
        (r#"{"name":"p","dimensions":[{"name":"d","weight":1,"criteria":[{"title":"T","description":"x"},{"title":" t ","description":"x"}]}]}"#.into(), vec![ProfileCode::DuplicateName]),
        (spans("").replace(r#"["a","b"]"#, r#"["a","b","B"]"#), vec![ProfileCode::DuplicateName]),
        (r#"{"name":"p","dimensions":[{"name":"d","weight":1.5,"criteria":[{"title":"t","description":"x"}]}]}"#.into(), vec![ProfileCode::WeightRange, ProfileCode::WeightSum]),
        (r#"{"name":"p","dimensions":[{"name":"d","weight":0.5,"criteria":[{"title":"t","description":"x"}]}]}"#.into(), vec![ProfileCode::WeightSum]),
        (r#"{"name":"p","dimensions":[{"name":"d","weight":1,"criteria":[{"title":"t","description":"x","weight":0}]}]}"#.into(), vec![ProfileCode::CriterionWeight, ProfileCode::CriterionWeight]),
        (r#"{"name":"p","dimensions":[{"name":"d","weight":1,"criteria":[{"title":"t","description":"x","weight":2e6}]}]}"#.into(), vec![ProfileCode::CriterionWeight]),
        (r#"{"name":"p","dimensions":[{"name":"d","weight":1,"criteria":[]}]}"#.into(), vec![ProfileCode::CriteriaCount]),
        (format!(r#"{{"name":"p","scores":{{"min":0,"max":101}},{dims}}}"#), vec![ProfileCode::ScoreRange]),
        (format!(r#"{{"name":"p","scores":{{"min":0.5,"max":5}},{dims}}}"#), vec![ProfileCode::ScoreRange]),
        (format!(r#"{{"name":"p","scores":{{"min":5,"max":5}},{dims}}}"#), vec![ProfileCode::ScoreRange]),
        (format!(r#"{{"name":"p",{dims},"vetoes":[{{"dimension":"d","min_score":6}}]}}"#), vec![ProfileCode::ScoreRange]),
        (format!(r#"{{"name":"p",{dims},"vetoes":[{{"dimension":"e","min_score":1}}]}}"#), vec![ProfileCode::UnknownName]),
        (format!(r#"{{"name":"p",{dims},"vetoes":[{{"dimension":"d","min_score":1}},{{"dimension":"d","min_score":2}}]}}"#), vec![ProfileCode::DuplicateName]),
        (spans("").replace(r#""judge":"b""#, r#""judge":"c""#), vec![ProfileCode::UnknownName]),
        (format!(r#"{{"name":"p",{dims},"emotion":{{"span":"e","weight":0.2,"labels":{{}}}}}}"#), vec![ProfileCode::UnknownName]),
        (spans("").replace("<{name}>", "<name>"), vec![ProfileCode::Template]),
        (spans("").replace("<{name}>", "<{name}{name}>"), vec![ProfileCode::Template]),
        (spans("").replace("<{name}>", "{name}>"), vec![ProfileCode::Template]),
        (spans("").replace("</{name}>", "<{name}>"), vec![ProfileCode::Template]),
        (spans("").replace(r#"["a","b"]"#, r#"["a","ab"]"#).replace("<{name}>", "<{name}").replace(r#""judge":"b""#, r#""judge":"ab""#), vec![ProfileCode::Template]),
        (r#"{"name":"p","rubric":"generated","dimensions":[{"name":"Cognitive Empathy"},{"name":"Proactive Empathy"},{"name":"Affective Empathy"}]}"#.into(), vec![ProfileCode::Generated]),
        (r#"{"name":"p","rubric":"generated","scores":{"min":1,"max":5},"dimensions":[{"name":"Cognitive Empathy"},{"name":"Affective Empathy"},{"name":"Proactive Empathy","weight":1}]}"#.into(), vec![ProfileCode::Generated, ProfileCode::Generated]),
        (spans(r#"},"emotion":{"span":"a","weight":0.2,"labels":{"joy.":[],"sad":[" blue"]}"#), vec![ProfileCode::LabelFormat, ProfileCode::LabelFormat]),
        (spans("").replace(r#"["a","b"]"#, r#"["a!","b"]"#), vec![ProfileCode::NameFormat]),
    ];
    for (json, want) in &cases {
        assert_eq!(&codes(json), want, "{json}");
    }
    for code in ProfileCode::ALL {
        assert!(
            cases.iter().any(|(_, c)| c.contains(&code)),
            "{code} has no case"
        );
        assert_eq!(ProfileCode::from_str_code(code.as_str()), Some(code));
    }
    // Invalid UTF-8 is `not_json` at its offset.
    let v = parse_profile(b"{\"name\":\"\xff\"}", &mut []);
    assert_eq!(
        v.report.violations()[0].to_string(),
        "not_json: profile: the text is not valid UTF-8 (byte 9); write exactly one JSON object."
    );
    // A valid spans profile for contrast.
    assert_eq!(codes(&spans("")), vec![]);
    let p = profile(&spans(""));
    assert_eq!(p.span_tags(), Some(("<", ">", "</", ">")));
    assert!(p.check_output(b"<a>1</a> <b>2</b>").is_ok());
    assert!(
        p.check_output(b"<b>2</b><a>1</a>")
            .report()
            .has(OutputCode::SpanOrder)
    );
}
