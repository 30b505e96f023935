//! **A test double**: the stub LLM (`care_loop::stub`) as a process, for tests in another
//! language (the Python trainer tests) that run a real `care serve` against it.
//!
//! The generator answers the paper's `rubric_sft_1`; the judge scores every criterion of the
//! profile with one score: `N` when the judged response is `score:N`, else a hash of the
//! response modulo 6 (arbitrary text, such as a tiny policy's completions, gets a fixed score).
//! `GET /stub/calls` lists every request it saw.
//!
//! ```sh
//! cargo run -p care-loop --example stub_llm -- --profile care --judge-ms 0
//! # stderr: stub_llm: listening on http://127.0.0.1:PORT/v1
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::time::Duration;

use care_loop::llm::Role;
use care_loop::stub::{PAPER_RUBRIC, Stub, StubReply, judge_answer};
use serde_json::{Value, json};

/// Every criterion of the built-in fixed profile `name` scored `score`.
fn fixed_answer(name: &str, score: u8) -> String {
    let json = care_core::profile::Profile::builtin_json(name).expect("a built-in profile");
    let profile: Value = serde_json::from_str(json).unwrap();
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

/// FNV-1a: a fixed score for any text, the same in every run.
fn score_of(text: &str) -> u8 {
    if let Some(n) = text
        .strip_prefix("score:")
        .and_then(|n| n.trim().parse().ok())
    {
        return n;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    (h % 6) as u8
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut profile = "care".to_owned();
    let mut judge_ms = 0u64;
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let value = argv.get(i + 1).cloned().unwrap_or_default();
        match argv[i].as_str() {
            "--profile" => profile = value,
            "--judge-ms" => judge_ms = value.parse().expect("--judge-ms N"),
            other => panic!("unknown flag {other}: use --profile care|kardia, --judge-ms N"),
        }
        i += 2;
    }
    let delay = Duration::from_millis(judge_ms);
    let stub = Stub::start(move |req, _| match req.role {
        Role::Generator => StubReply::Content(PAPER_RUBRIC.to_owned()),
        Role::Judge => {
            let score = score_of(req.judged_response().unwrap_or(""));
            let answer = if profile == "care" {
                judge_answer(PAPER_RUBRIC, score)
            } else {
                fixed_answer(&profile, score)
            };
            StubReply::Delayed(answer, delay)
        }
    })
    .await
    .unwrap();
    let _ = writeln!(
        std::io::stderr(),
        "stub_llm: listening on {} (GET /stub/calls lists the requests)",
        stub.base_url()
    );
    std::future::pending::<()>().await;
}
