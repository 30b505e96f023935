//! `care reward`'s runner: JSON Lines in input order, error lines for bad input, and a run
//! stopped mid-way that resumes from the cache without repeating a completed call.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use care_loop::batch::{DEFAULT_MAX_LINE_BYTES, RunSummary, run_jsonl};
use care_loop::llm::Role;
use care_loop::stub::{PAPER_RUBRIC, Stub, StubReply, StubRequest, judge_answer};
use care_loop::{BackendKind, Cache, EndpointConfig, Engine, LoopConfig, Metrics};
use serde_json::{Value, json};

fn config(stub: &Stub) -> LoopConfig {
    let ep = |m: &str| EndpointConfig {
        timeout_secs: 30.0,
        backoff_initial_secs: 0.001,
        backoff_max_secs: 0.002,
        ..EndpointConfig::new(stub.base_url(), m)
    };
    LoopConfig {
        generator: ep("g"),
        judge: ep("j").into(),
        turn_concurrency: 4,
        ..LoopConfig::default()
    }
}

fn line(tag: &str, responses: &[&str]) -> String {
    json!({
        "id": tag,
        "context": [{"role": "user", "content": format!("{tag}: I can't sleep before exams.")}],
        "responses": responses,
    })
    .to_string()
}

fn judge(req: &StubRequest, delay_for_t1: bool) -> StubReply {
    let r = req.judged_response().unwrap();
    let n: u8 = r.trim_start_matches("score:").parse().unwrap();
    let answer = judge_answer(PAPER_RUBRIC, n);
    let prompt = &req.messages[0].content;
    if delay_for_t1 && prompt.contains("t1:") {
        // The first turn finishes last: the output must still come in input order.
        StubReply::Delayed(answer, Duration::from_millis(150))
    } else {
        StubReply::Content(answer)
    }
}

#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl Write for Shared {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Shared {
    fn lines(&self) -> Vec<Value> {
        String::from_utf8(self.0.lock().unwrap().clone())
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

#[tokio::test]
async fn one_line_out_per_line_in_and_in_order() {
    let stub = Stub::start(|req, _| match req.role {
        Role::Generator => StubReply::Content(PAPER_RUBRIC.into()),
        Role::Judge => judge(req, true),
    })
    .await
    .unwrap();
    let eng = Arc::new(
        Engine::new(
            &config(&stub),
            BackendKind::Http,
            None,
            Arc::new(Metrics::new()),
        )
        .unwrap(),
    );
    let input = [
        line("t1", &["score:5", "score:0"]),
        "{not json".to_owned(),
        line("t2", &["score:1"]),
        r#"{"context":[{"role":"user","content":"hi"}],"responses":[]}"#.to_owned(),
        String::new(),
        line("t3", &["score:2", "score:3"]),
    ]
    .join("\n");
    let out = Shared::default();
    let mut w = out.clone();
    let s = run_jsonl(eng, input.as_bytes(), &mut w, DEFAULT_MAX_LINE_BYTES)
        .await
        .unwrap();
    assert_eq!(
        s,
        RunSummary {
            lines: 6,
            failed_lines: 3,
            responses_without_reward: 0,
            responses_rewarded: 5,
            by_status: [("ok", 5)].into_iter().collect(),
        }
    );
    let lines = out.lines();
    let nums: Vec<u64> = lines.iter().map(|l| l["line"].as_u64().unwrap()).collect();
    assert_eq!(nums, [1, 2, 3, 4, 5, 6]);
    assert_eq!(lines[0]["id"], "t1");
    assert_eq!(lines[0]["rewards"], json!([1.0, 0.0]));
    assert_eq!(lines[1]["error"]["code"], "not_json");
    assert_eq!(lines[2]["rewards"], json!([0.2]));
    assert_eq!(lines[3]["error"]["code"], "bad_input");
    assert_eq!(lines[4]["error"]["code"], "not_json");
    assert_eq!(lines[5]["rewards"], json!([0.4, 0.6]));
    assert_eq!(lines[5]["calls"]["generator"], 1);
}

#[tokio::test]
async fn a_line_over_the_limit_is_an_error_line_and_the_rest_goes_on() {
    let stub = Stub::start(|req, _| match req.role {
        Role::Generator => StubReply::Content(PAPER_RUBRIC.into()),
        Role::Judge => judge(req, false),
    })
    .await
    .unwrap();
    let eng = Arc::new(
        Engine::new(
            &config(&stub),
            BackendKind::Http,
            None,
            Arc::new(Metrics::new()),
        )
        .unwrap(),
    );
    let long = line("big", &[&"x".repeat(5000)]);
    let input = format!("{long}\n{}\n", line("t", &["score:5"]));
    let out = Shared::default();
    let mut w = out.clone();
    run_jsonl(eng, input.as_bytes(), &mut w, 1000)
        .await
        .unwrap();
    let lines = out.lines();
    assert_eq!(lines[0]["error"]["code"], "line_too_long");
    assert_eq!(lines[1]["rewards"], json!([1.0]));
}

#[tokio::test]
async fn a_run_stopped_mid_way_resumes_without_repeating_a_completed_call() {
    let dir = std::env::temp_dir().join(format!("care-loop-resume-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cache.sqlite");
    let input = [
        line("t1", &["score:5", "score:4"]),
        line("t2", &["score:3"]),
        line("t3", &["score:2", "score:1"]),
    ]
    .join("\n");

    // Run 1: the judge never answers for t3, so the run is stopped while t3 is in flight.
    let stub1 = Stub::start(|req, _| match req.role {
        Role::Generator => StubReply::Content(PAPER_RUBRIC.into()),
        Role::Judge if req.messages[0].content.contains("t3:") => StubReply::Stall,
        Role::Judge => judge(req, false),
    })
    .await
    .unwrap();
    let eng = Arc::new(
        Engine::new(
            &config(&stub1),
            BackendKind::Http,
            Some(Cache::open(&path).unwrap()),
            Arc::new(Metrics::new()),
        )
        .unwrap(),
    );
    let out1 = Shared::default();
    let mut w = out1.clone();
    let inp = input.clone();
    let run = tokio::spawn(async move {
        run_jsonl(eng, inp.as_bytes(), &mut w, DEFAULT_MAX_LINE_BYTES).await
    });
    for _ in 0..400 {
        let t3_judged = stub1
            .calls()
            .iter()
            .filter(|c| c.messages[0].content.contains("t3:"))
            .count();
        if t3_judged == 2 && out1.lines().len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    run.abort(); // the stop: nothing more of run 1 happens
    let _ = run.await;
    let first = out1.lines();
    assert_eq!(first.len(), 2, "t1 and t2 were written before the stop");
    assert_eq!(
        stub1.count(Role::Generator),
        3,
        "t3's rubric completed in run 1"
    );

    // Run 2, a fresh engine on the same cache and a healthy judge.
    let stub2 = Stub::start(|req, _| match req.role {
        Role::Generator => StubReply::Content(PAPER_RUBRIC.into()),
        Role::Judge => judge(req, false),
    })
    .await
    .unwrap();
    let eng = Arc::new(
        Engine::new(
            &config(&stub2),
            BackendKind::Http,
            Some(Cache::open(&path).unwrap()),
            Arc::new(Metrics::new()),
        )
        .unwrap(),
    );
    let out2 = Shared::default();
    let mut w = out2.clone();
    run_jsonl(eng, input.as_bytes(), &mut w, DEFAULT_MAX_LINE_BYTES)
        .await
        .unwrap();
    // Only t3's two judgments were missing; nothing else is asked again.
    assert_eq!(stub2.count(Role::Generator), 0);
    assert_eq!(stub2.count(Role::Judge), 2);
    assert!(
        stub2
            .calls()
            .iter()
            .all(|c| c.messages[0].content.contains("t3:"))
    );
    let second = out2.lines();
    assert_eq!(second.len(), 3);
    for k in 0..2 {
        assert_eq!(second[k]["rewards"], first[k]["rewards"]);
        assert_eq!(
            second[k]["calls"]["cached"].as_u64().unwrap(),
            first[k]["calls"]["generator"].as_u64().unwrap()
                + first[k]["calls"]["judge"].as_u64().unwrap()
        );
    }
    assert_eq!(second[2]["rewards"], json!([0.4, 0.2]));
    assert_eq!(second[2]["calls"]["cached"], 1);
    assert_eq!(second[2]["calls"]["judge"], 2);
    let _ = std::fs::remove_dir_all(&dir);
}
