//! The Kardia-R1 profile of `care-core` in the loop, against the stub on 127.0.0.1: no
//! generator call, a malformed output rewarded 0 without a judge call, the judge shown the
//! response span only, the emotion term from the turn's gold label.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::sync::Arc;

use care_loop::engine::TurnInput;
use care_loop::fixed::MALFORMED_OUTPUT;
use care_loop::llm::{ChatMessage, Role};
use care_loop::stub::{Stub, StubReply};
use care_loop::{BackendKind, EndpointConfig, Engine, LoopConfig, Metrics};
use serde_json::{Value, json};

fn kardia_answer(score: u8) -> String {
    let profile: Value =
        serde_json::from_str(care_core::profile::Profile::builtin_json("kardia").unwrap()).unwrap();
    let mut items = Vec::new();
    for d in profile["dimensions"].as_array().unwrap() {
        for c in d["criteria"].as_array().unwrap() {
            items.push(
                json!({"category": d["name"], "criterion_title": c["title"], "score": score}),
            );
        }
    }
    json!({ "criterion_scores": items }).to_string()
}

fn output(emotion: &str, response: &str) -> String {
    format!(
        "<|understanding_begin|>The user fears the exam.<|understanding_end|>\
         <|reasoning_begin|>SECRET REASONING<|reasoning_end|>\
         <|emotion_begin|>{emotion}<|emotion_end|>\
         <|response_begin|>{response}<|response_end|>"
    )
}

#[tokio::test]
async fn kardia_settles_malformed_outputs_and_judges_the_response_span() {
    let stub = Stub::start(|req, _| match req.role {
        Role::Generator => panic!("a fixed profile calls no generator"),
        Role::Judge => {
            let span = req.judged_response().unwrap();
            let n: u8 = span.trim_start_matches("score:").parse().unwrap();
            StubReply::Content(kardia_answer(n))
        }
    })
    .await
    .unwrap();
    let cfg = LoopConfig {
        // No generator configured at all: the profile does not need one.
        judge: EndpointConfig {
            backoff_initial_secs: 0.001,
            backoff_max_secs: 0.002,
            ..EndpointConfig::new(stub.base_url(), "judge")
        }
        .into(),
        profile: "kardia".into(),
        ..LoopConfig::default()
    };
    let eng =
        Arc::new(Engine::new(&cfg, BackendKind::Http, None, Arc::new(Metrics::new())).unwrap());
    let r = eng
        .run_turn(TurnInput {
            id: None,
            context: vec![ChatMessage::new(
                "user",
                "My exam is tomorrow and I can't breathe.",
            )],
            responses: vec![
                output("Afraid", "score:5"),
                "I am sure you will be fine!".into(),
                output("joy", "score:3"),
            ],
            gold: Some(json!({"emotion": "fear"})),
            ..TurnInput::default()
        })
        .await
        .unwrap();
    assert_eq!(r.rubric_status, "ok");
    assert_eq!(r.rubric_attempts, 0, "no generator answer was asked for");
    assert_eq!(stub.count(Role::Generator), 0);
    // r = 0.8 * (mean of the five normalized dimensions) + 0.2 * (emotion matches gold).
    assert_eq!(r.rewards[0], Some(1.0));
    assert_eq!(r.rewards[1], Some(0.0));
    assert_eq!(r.responses[1].status, MALFORMED_OUTPUT);
    assert_eq!(r.responses[1].judge_attempts, 0);
    assert!(
        (r.rewards[2].unwrap() - 0.8 * 0.6).abs() < 1e-12,
        "{:?}",
        r.rewards
    );
    // Two judge calls (the malformed output got none), each seeing only the response span.
    let calls = stub.calls();
    assert_eq!(calls.len(), 2);
    for c in &calls {
        assert!(!c.messages[0].content.contains("SECRET REASONING"));
        assert!(!c.messages[0].content.contains("<|response_begin|>"));
    }
    assert_eq!(
        r.responses[0].scores.as_ref().unwrap().len(),
        5,
        "five dimensions"
    );
}

#[test]
fn an_unknown_profile_is_a_configuration_error() {
    let cfg = LoopConfig {
        profile: "nope".into(),
        ..LoopConfig::default()
    };
    let err = Engine::new(&cfg, BackendKind::Scripted, None, Arc::new(Metrics::new())).unwrap_err();
    assert!(err.contains("unknown profile \"nope\""), "{err}");
}
