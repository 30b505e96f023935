//! The judge prompt layouts in the loop: under the default `shared_prefix` layout the judge
//! prompts of one group share at least 85% of their bytes as a common prefix (what a server
//! with prefix caching prefills once per group), for every bundled demo group; the paper
//! layout shares far less; and the answers give the same scores and rewards under both.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::sync::Arc;

use care_core::JudgePromptLayout;
use care_loop::engine::TurnInput;
use care_loop::fixed::FixedProfile;
use care_loop::llm::ChatMessage;
use care_loop::profile::{CareProfile, Dialogue, Prepared, RubricProfile};
use care_loop::stub::PAPER_RUBRIC;
use care_loop::{BackendKind, Engine, LoopConfig, Metrics};
use serde_json::Value;

fn data(name: &str) -> String {
    std::fs::read_to_string(format!("{}/../cli/data/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

/// For each prompt of a group, the fraction of its bytes in the prefix common to all of them.
fn shared_fractions(prompts: &[String]) -> Vec<f64> {
    let first = prompts[0].as_bytes();
    let common = prompts
        .iter()
        .map(|p| {
            first
                .iter()
                .zip(p.as_bytes())
                .take_while(|(a, b)| a == b)
                .count()
        })
        .min()
        .unwrap();
    prompts
        .iter()
        .map(|p| common as f64 / p.len() as f64)
        .collect()
}

/// A demo group: its name, profile, rubric, dialogue and responses.
type Group = (
    &'static str,
    Box<dyn RubricProfile>,
    String,
    Dialogue,
    Vec<String>,
);

/// The bundled demo groups.
fn groups(layout: JudgePromptLayout) -> Vec<Group> {
    let mut out: Vec<Group> = Vec::new();
    let care = || Box::new(CareProfile::new(false).with_layout(layout)) as Box<dyn RubricProfile>;
    // cli/data/demo_group.json: the paper's rubric and six responses.
    let g: Value = serde_json::from_str(&data("demo_group.json")).unwrap();
    // Its context is "seeker: ..." / "supporter: ..." lines.
    let context: Vec<ChatMessage> = g["context"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            let l = l.as_str().unwrap();
            match l.strip_prefix("supporter: ") {
                Some(t) => ChatMessage::new("assistant", t),
                None => ChatMessage::new("user", l.strip_prefix("seeker: ").unwrap_or(l)),
            }
        })
        .collect();
    let responses: Vec<String> = g["responses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["text"].as_str().unwrap().to_owned())
        .collect();
    // Its rubric names a file of cli/data.
    let rubric = data(g["rubric"].as_str().unwrap());
    out.push((
        "demo_group.json",
        care(),
        rubric,
        Dialogue::new(context).unwrap(),
        responses,
    ));
    // cli/data/reward_demo.jsonl: each line, under the rubric the scripted generator repairs to.
    for line in data("reward_demo.jsonl").lines() {
        let t: TurnInput = serde_json::from_str(line).unwrap();
        out.push((
            "reward_demo.jsonl",
            care(),
            PAPER_RUBRIC.to_owned(),
            Dialogue::new(t.context).unwrap(),
            t.responses,
        ));
    }
    // cli/data/demo_kardia.json: the fixed Kardia-R1 rubric, the well-formed outputs' spans.
    let k: Value = serde_json::from_str(&data("demo_kardia.json")).unwrap();
    let kardia = FixedProfile::builtin("kardia").unwrap().with_layout(layout);
    let spans: Vec<String> = k["responses"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(
            |r| match kardia.prepare_response(r["output"].as_str().unwrap()) {
                Prepared::Judge(span) => Some(span),
                Prepared::Settled { .. } => None,
            },
        )
        .collect();
    assert!(spans.len() >= 2, "the Kardia demo has well-formed outputs");
    let dialogue = Dialogue::new(vec![ChatMessage::new(
        "user",
        k["seeker"].as_str().unwrap(),
    )])
    .unwrap();
    out.push((
        "demo_kardia.json",
        Box::new(kardia),
        String::new(),
        dialogue,
        spans,
    ));
    out
}

fn prompts(
    profile: &dyn RubricProfile,
    rubric: &str,
    dialogue: &Dialogue,
    responses: &[String],
) -> Vec<String> {
    responses
        .iter()
        .map(|r| {
            let m = profile.judge_messages(rubric, dialogue, r);
            assert_eq!(m.len(), 1);
            m[0].content.clone()
        })
        .collect()
}

#[test]
fn the_default_layout_shares_at_least_85_percent_of_each_prompt_in_every_demo_group() {
    assert_eq!(
        LoopConfig::default().layout().unwrap(),
        JudgePromptLayout::SharedPrefix
    );
    let shared = groups(JudgePromptLayout::SharedPrefix);
    let paper = groups(JudgePromptLayout::Paper);
    for ((name, profile, rubric, dialogue, responses), (_, pp, _, _, _)) in
        shared.iter().zip(&paper)
    {
        let sp = prompts(profile.as_ref(), rubric, dialogue, responses);
        let pa = prompts(pp.as_ref(), rubric, dialogue, responses);
        assert!(
            sp.iter().all(|p| p.contains("## Rubric")),
            "{name}: no rubric rendered"
        );
        let f = shared_fractions(&sp);
        let fp = shared_fractions(&pa);
        let min = f.iter().copied().fold(1.0, f64::min);
        let min_paper = fp.iter().copied().fold(1.0, f64::min);
        eprintln!(
            "{name}: {} prompts, shared prefix {:.1}% (least), paper order {:.1}%",
            sp.len(),
            100.0 * min,
            100.0 * min_paper
        );
        assert!(min >= 0.85, "{name}: {f:?}");
        assert!(min_paper < 0.5, "{name}: the paper order shares {fp:?}");
    }
}

#[test]
fn the_scripted_demo_gives_the_same_scores_and_rewards_under_both_layouts() {
    let run = |layout: &str| {
        let cfg = LoopConfig {
            judge_prompt_layout: layout.to_owned(),
            ..LoopConfig::default()
        };
        let engine = Arc::new(
            Engine::new(&cfg, BackendKind::Scripted, None, Arc::new(Metrics::new())).unwrap(),
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        data("reward_demo.jsonl")
            .lines()
            .map(|line| {
                let t: TurnInput = serde_json::from_str(line).unwrap();
                let r = rt.block_on(engine.run_turn(t)).unwrap();
                serde_json::to_value(&r).unwrap()
            })
            .collect::<Vec<Value>>()
    };
    let shared = run("shared_prefix");
    let paper = run("paper");
    assert_eq!(shared, paper);
    // The demo line: six judged responses and one without a recording.
    let rewards = shared[0]["rewards"].as_array().unwrap();
    assert_eq!(rewards[0], 0.925);
    assert_eq!(rewards.iter().filter(|r| r.is_number()).count(), 6);
    let bad = LoopConfig {
        judge_prompt_layout: "response_first".into(),
        ..LoopConfig::default()
    };
    let e = Engine::new(&bad, BackendKind::Scripted, None, Arc::new(Metrics::new())).unwrap_err();
    assert!(
        e.contains("judge_prompt_layout") && e.contains("shared_prefix, paper"),
        "{e}"
    );
}
