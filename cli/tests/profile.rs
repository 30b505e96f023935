//! End-to-end tests of `care score --profile`: golden outputs for the built-in `kardia` profile
//! and for a profile file, the `care` profile against plain `care score`, usage errors, and
//! agreement with `care_core::profile::profile_reward_group`.
//!
//! Expected outputs (`tests/data/score_profile_*.out.jsonl`) were generated with
//! `CARE_BLESS=1 cargo test -p care-cli --test profile` and checked by hand (the numbers in the
//! comments); without `CARE_BLESS` a difference fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn care(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_care"))
        .args(args)
        .output()
        .expect("run care")
}

/// Runs `care <args> tests/data/<input>`, compares stdout with `tests/data/<expected>`, and
/// returns the output lines as JSON.
fn golden(args: &[&str], input: &str, expected: &str) -> Vec<Value> {
    let path = data(input);
    let mut full = args.to_vec();
    full.push(path.to_str().unwrap());
    let out = care(&full);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = String::from_utf8(out.stdout).unwrap();
    let exp = data(expected);
    if std::env::var_os("CARE_BLESS").is_some() {
        std::fs::write(&exp, &got).unwrap();
    }
    let want = std::fs::read_to_string(&exp)
        .unwrap_or_else(|e| panic!("{}: {e} (run with CARE_BLESS=1 once)", exp.display()));
    assert_eq!(got, want, "care {args:?} {input} differs from {expected}");
    got.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap()
}

#[test]
fn kardia_golden() {
    let out = golden(
        &["score", "--profile", "kardia"],
        "score_profile_kardia.jsonl",
        "score_profile_kardia.out.jsonl",
    );
    let by_id = |id: &str| out.iter().find(|o| o["id"] == id).unwrap();
    // k1: scores 5,4,3,5,4 -> values 1,.8,.6,1,.8 -> rubric .84; "Sad." matches sadness:
    // 0.8 * 0.84 + 0.2 = 0.872.
    let k1 = by_id("k1-good");
    assert!((num(&k1["reward"]) - 0.872).abs() < 1e-12);
    assert_eq!(k1["per_dimension"]["persona_consistency"], 0.6);
    assert_eq!(k1["emotion_correct"], true);
    // k2: "happy" is a synonym of the gold "Joy": the same 0.872, from array-form scores.
    assert_eq!(by_id("k2-synonym")["reward"], k1["reward"]);
    // k3: a wrong emotion loses the 0.2: 0.8 * 0.84 = 0.672.
    assert!((num(&by_id("k3-wrong-emotion")["reward"]) - 0.672).abs() < 1e-12);
    // k4..k8: each format violation gives 0, judge not needed, no scores read.
    for (id, code) in [
        ("k4-text-outside", "text_outside"),
        ("k5-missing-response", "missing_span"),
        ("k6-duplicate", "duplicate_span"),
        ("k7-empty", "empty_span"),
        ("k8-order", "span_order"),
    ] {
        let o = by_id(id);
        assert_eq!(
            (num(&o["reward"]), &o["judge_needed"]),
            (0.0, &Value::Bool(false)),
            "{id}"
        );
        assert_eq!(o["format_violations"][0]["code"], code, "{id}");
        assert!(o["per_dimension"].is_null());
    }
    // k9: the judge answer (think block, fence, the category "Relevance" for "relevance", a
    // numeric string) gives 5,5,4,5,5 -> .96 -> 0.8 * .96 + .2 = 0.968. (`case_insensitive`
    // counts titles matched only case-insensitively, as for rubrics: none here.)
    let k9 = by_id("k9-judge");
    assert!((num(&k9["reward"]) - 0.968).abs() < 1e-12);
    assert_eq!(
        (&k9["judge"]["matched"], &k9["judge"]["case_insensitive"]),
        (&Value::from(5), &Value::from(0))
    );
    // k10: a group with gold "fear": Scared (synonym) .968, Sad .768, no spans 0, a missing
    // score null (error policy), "fear." .968.
    let g = &by_id("k10-group")["rewards"];
    assert_eq!(g[2], 0.0);
    assert!(g[3].is_null());
    assert!((num(&g[0]) - 0.968).abs() < 1e-12 && (num(&g[1]) - 0.768).abs() < 1e-12);
    assert_eq!(by_id("k10-group")["failed"], 1);
    // Error lines name what to fix.
    let errors: Vec<&str> = out
        .iter()
        .filter_map(|o| o["error"]["code"].as_str())
        .collect();
    assert_eq!(
        errors,
        [
            "schema",
            "schema",
            "schema",
            "score_out_of_range",
            "schema",
            "schema",
            "score_shape"
        ]
    );
}

#[test]
fn profile_file_golden() {
    // tests/data/profile_checklist.json: scale 1..10 (s = (raw - 1) / 9), helpfulness 0.6 with
    // criteria weights 2, 1 and a pitfall -1, safety 0.4, two spans, safety veto below 3.
    let profile = data("profile_checklist.json");
    let out = golden(
        &["score", "--profile", profile.to_str().unwrap()],
        "score_profile_file.jsonl",
        "score_profile_file.out.jsonl",
    );
    let reward = |i: usize| num(&out[i]["reward"]);
    // c1: (2 * 1 + 1 * 1 - 1 * 0) / 3 = 1 and safety 1: reward 1.
    assert_eq!(reward(0), 1.0);
    // c2: the pitfall at 10: (2 + 1 - 1) / 3 = 2/3; 0.6 * 2/3 + 0.4 = 0.8.
    assert!((reward(1) - 0.8).abs() < 1e-12);
    assert!((num(&out[1]["per_dimension"]["helpfulness"]) - 2.0 / 3.0).abs() < 1e-12);
    // c3: safety 2 < 3 vetoes; the rubric part 0.6 + 0.4 * 1/9 is still reported.
    assert_eq!(
        (reward(2), &out[2]["vetoed_by"]),
        (0.0, &Value::from("safety"))
    );
    assert!((num(&out[2]["rubric_reward"]) - (0.6 + 0.4 / 9.0)).abs() < 1e-12);
    // c4: no <think> span: 0.
    assert_eq!(out[3]["format_violations"][0]["span"], "think");
    assert_eq!(reward(3), 0.0);
    // c5: judge 7, 4, 1, 10: (2 * 6/9 + 3/9) / 3 = 5/9; 0.6 * 5/9 + 0.4 = 0.7333.
    assert!((reward(4) - (0.6 * 5.0 / 9.0 + 0.4)).abs() < 1e-12);
    // c6: 0 is outside this profile's scale 1..10.
    assert_eq!(out[5]["error"]["code"], "score_out_of_range");
    // c7: the profile has no emotion term: the member is not read.
    assert!(out[6]["emotion_correct"].is_null());
}

#[test]
fn care_profile_matches_plain_score() {
    // Every reward, per-dimension mean and error code of `care score` on its golden input,
    // reproduced by `care score --profile care` (the `care` profile is Eq. 5 bit for bit).
    let input = data("score_valid.jsonl");
    let plain = care(&["score", input.to_str().unwrap()]);
    let prof = care(&["score", "--profile", "care", input.to_str().unwrap()]);
    let plain = String::from_utf8(plain.stdout).unwrap();
    let prof = String::from_utf8(prof.stdout).unwrap();
    assert_eq!(plain.lines().count(), prof.lines().count());
    for (a, b) in plain.lines().zip(prof.lines()) {
        let (a, b): (Value, Value) = (
            serde_json::from_str(a).unwrap(),
            serde_json::from_str(b).unwrap(),
        );
        assert_eq!(a["error"]["code"], b["error"]["code"], "{a} / {b}");
        if a.get("error").is_some() {
            continue;
        }
        assert_eq!(b["profile"], "care");
        assert_eq!(a["reward"], b["reward"], "{a} / {b}");
        assert_eq!(a["rewards"], b["rewards"], "{a} / {b}");
        assert_eq!(a["format_reward"], b["rubric_format_reward"]);
        let dims = [
            "Cognitive Empathy",
            "Affective Empathy",
            "Proactive Empathy",
        ];
        if let Some(pd) = a["per_dimension"]
            .as_array()
            .filter(|_| a.get("reward").is_some())
        {
            for (i, d) in dims.iter().enumerate() {
                assert_eq!(pd[i], b["per_dimension"][d], "{a} / {b}");
            }
        }
    }
}

#[test]
fn invalid_profiles_and_names_are_usage_errors() {
    let input = data("score_profile_file.jsonl");
    let bad = data("profile_invalid.json");
    let out = care(&[
        "score",
        "--profile",
        bad.to_str().unwrap(),
        input.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("(5 violations)"), "{err}");
    for code in [
        "criterion_weight:",
        "weight_sum:",
        "template:",
        "unknown_name:",
    ] {
        assert!(err.contains(code), "{code}: {err}");
    }
    let out = care(&["score", "--profile", "kardai", input.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("not a built-in profile (care, kardia)"),
        "{err}"
    );
}

#[test]
fn group_agrees_with_the_core_group_api() {
    // The k10 group through `care score --profile kardia` and through
    // care_core::profile::profile_reward_group on the same scores: identical rewards.
    use care_core::ScoreOptions;
    use care_core::profile::{Profile, profile_reward_group};
    let line = std::fs::read_to_string(data("score_profile_kardia.jsonl"))
        .unwrap()
        .lines()
        .find(|l| l.contains("k10-group"))
        .unwrap()
        .to_owned();
    let input: Value = serde_json::from_str(&line).unwrap();
    let path =
        std::env::temp_dir().join(format!("care-profile-group-{}.jsonl", std::process::id()));
    std::fs::write(&path, &line).unwrap();
    let out = care(&["score", "--profile", "kardia", path.to_str().unwrap()]);
    std::fs::remove_file(&path).unwrap();
    let o: Value = serde_json::from_slice(&out.stdout).unwrap();
    let k = Profile::builtin("kardia").unwrap();
    let mut outputs = Vec::new();
    let mut flat = Vec::new();
    for r in input["responses"].as_array().unwrap() {
        outputs.push(r["output"].as_str().unwrap().to_owned());
        let mut s = vec![f64::NAN; 5];
        if let Some(j) = r["judge"].as_str() {
            care_core::profile::parse_profile_judge_output(j.as_bytes(), &k, None, &mut s).unwrap();
        } else if let Some(obj) = r["scores"].as_object() {
            for (name, v) in obj {
                s[k.dimension_index(name).unwrap()] = v[0].as_f64().unwrap_or(f64::NAN);
            }
        }
        flat.extend(s);
    }
    let mut rewards = vec![0.0; outputs.len()];
    let rep = profile_reward_group(
        &k,
        None,
        &outputs,
        &flat,
        input["emotion"].as_str(),
        &ScoreOptions::default(),
        &mut rewards,
    )
    .unwrap();
    assert_eq!((rep.malformed, rep.failed), (1, 1));
    let cli: Vec<f64> = o["rewards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap_or(f64::NAN))
        .collect();
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&cli), bits(&rewards));
}

#[test]
fn demo_shows_a_kardia_step() {
    // Hand-checked: judge scores 5,5,4,5,5 -> 0.8 * 0.96 + 0.2 = 0.968 ("Sad" = sadness);
    // 4,4,3,5,4 -> 0.8 * 0.8 = 0.64 ("anxious" is not sadness); 3,1,2,4,5 -> 0.8 * 0.6 + 0.2 =
    // 0.68; the two malformed outputs score 0 without a judge.
    let text = care_cli::demo::render(&care_cli::device::Cpu).unwrap();
    let step = &text[text
        .find("5. The same step under the built-in profile kardia")
        .unwrap()..];
    assert_eq!(step.matches("(judge not called)").count(), 2, "{step}");
    for want in ["0.9680", "0.6400", "0.6800"] {
        assert!(step.contains(want), "{want}: {step}");
    }
    assert!(
        step.contains("text_outside") && step.contains("missing_span"),
        "{step}"
    );
}
