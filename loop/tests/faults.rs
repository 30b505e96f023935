//! A fault of the server's own (a panic in the loop, standing in for any bug) is the server's
//! answer, never the client's: 500 `internal` from `care serve` (it was a 400), one `internal`
//! error line from `care reward`, which goes on with the next lines (it used to stop with exit
//! status 2 and lose them). The panic comes from a profile that wraps the paper's and panics on
//! one response; the backend is the scripted replay (no LLM is asked).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::sync::Arc;

use care_loop::llm::ChatMessage;
use care_loop::profile::{
    CareProfile, Dialogue, JudgeProblem, Prepared, RubricCheck, RubricProfile,
};
use care_loop::server::{Server, ServerOptions};
use care_loop::{BackendKind, Engine, LoopConfig, Metrics};
use serde_json::{Value, json};

/// The paper's profile, except that a response `PANIC` panics (a bug, in a test double).
#[derive(Debug)]
struct Faulty(CareProfile);

impl RubricProfile for Faulty {
    fn name(&self) -> &str {
        "faulty"
    }
    fn generator_messages(&self, dialogue: &Dialogue) -> Vec<ChatMessage> {
        self.0.generator_messages(dialogue)
    }
    fn check_rubric(&self, text: &str) -> RubricCheck {
        self.0.check_rubric(text)
    }
    fn repair_message(&self, check: &RubricCheck) -> String {
        self.0.repair_message(check)
    }
    fn layout(&self, rubric: &str) -> Vec<usize> {
        self.0.layout(rubric)
    }
    fn prepare_response(&self, response: &str) -> Prepared {
        assert_ne!(response, "PANIC", "a planted bug");
        self.0.prepare_response(response)
    }
    fn judge_messages(&self, rubric: &str, dialogue: &Dialogue, span: &str) -> Vec<ChatMessage> {
        self.0.judge_messages(rubric, dialogue, span)
    }
    fn parse_answer(&self, rubric: &str, answer: &str) -> Result<Vec<f64>, JudgeProblem> {
        self.0.parse_answer(rubric, answer)
    }
    fn score_group(
        &self,
        rubric: &str,
        responses: &[String],
        scores: &[Option<Vec<f64>>],
        gold: Option<&Value>,
    ) -> Vec<Option<f64>> {
        self.0.score_group(rubric, responses, scores, gold)
    }
}

fn engine() -> Arc<Engine> {
    Arc::new(
        Engine::with_profile(
            &LoopConfig::default(),
            BackendKind::Scripted,
            None,
            Arc::new(Metrics::new()),
            Arc::new(Faulty(CareProfile::new(false))),
        )
        .unwrap(),
    )
}

fn turn(response: &str) -> Value {
    json!({"context": [{"role": "user", "content": "I feel alone."}], "responses": [response]})
}

#[tokio::test]
async fn a_fault_of_the_server_is_500_internal_and_the_server_goes_on() {
    let server = Server::new(engine(), ServerOptions::default(), "scripted");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        server
            .serve(listener, async move {
                let _ = rx.await;
            })
            .await
    });
    let c = reqwest::Client::new();
    let url = format!("http://{addr}/v1/reward");
    let r = c
        .post(&url)
        .json(&json!({"turns": [turn("fine"), turn("PANIC")]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 500);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "internal", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("turns[1]"),
        "{v}"
    );
    let r = c
        .post(&url)
        .json(&json!({"turns": [turn("fine")]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = c
        .post(format!("http://{addr}/get_reward"))
        .json(&json!({"query": ["pPANIC"], "prompts": ["p"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 500);
    tx.send(()).unwrap();
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_fault_in_one_line_of_care_reward_is_that_line_and_the_run_goes_on() {
    let input = format!(
        "{}\n{}\n{}\n",
        turn("fine"),
        turn("PANIC"),
        turn("also fine")
    );
    let mut out = Vec::new();
    let summary = care_loop::batch::run_jsonl(engine(), input.as_bytes(), &mut out, 1 << 20)
        .await
        .unwrap();
    let lines: Vec<Value> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[1]["line"], 2);
    assert_eq!(lines[1]["error"]["code"], "internal", "{}", lines[1]);
    assert_eq!(lines[0]["rubric_status"], "ok");
    assert_eq!(lines[2]["rubric_status"], "ok");
    assert_eq!((summary.lines, summary.failed_lines), (3, 1));
}
