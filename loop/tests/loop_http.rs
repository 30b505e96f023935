//! The loop against an OpenAI-compatible stub server on 127.0.0.1 (real HTTP both ways; the
//! stub is the test double for the LLM). Timeouts are short so that the whole file runs in a
//! few seconds.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::sync::Arc;
use std::time::Duration;

use care_loop::engine::{TurnInput, TurnResult, response_status, rubric_status};
use care_loop::llm::{ChatMessage, Role};
use care_loop::stub::{PAPER_RUBRIC, Stub, StubReply, StubRequest, judge_answer};
use care_loop::{BackendKind, Cache, EndpointConfig, Engine, LoopConfig, Metrics};

fn fast(url: &str, model: &str) -> EndpointConfig {
    EndpointConfig {
        timeout_secs: 0.3,
        connect_timeout_secs: 0.3,
        backoff_initial_secs: 0.001,
        backoff_max_secs: 0.002,
        max_attempts: 3,
        ..EndpointConfig::new(url, model)
    }
}

fn config(stub: &Stub) -> LoopConfig {
    LoopConfig {
        generator: fast(&stub.base_url(), "gen-model"),
        judge: fast(&stub.base_url(), "judge-model").into(),
        ..LoopConfig::default()
    }
}

fn engine(cfg: &LoopConfig, cache: Option<Cache>) -> Arc<Engine> {
    Arc::new(Engine::new(cfg, BackendKind::Http, cache, Arc::new(Metrics::new())).unwrap())
}

fn bad_rubric() -> String {
    PAPER_RUBRIC.replacen("\"category_weight\": 0.4", "\"category_weight\": 0.5", 1)
}

/// A turn whose responses are `score:N` (the judge below scores every criterion N).
fn turn(tag: &str, scores: &[u8]) -> TurnInput {
    TurnInput {
        id: Some(tag.into()),
        context: vec![
            ChatMessage::new("user", format!("{tag}: I have been feeling lost lately.")),
            ChatMessage::new("assistant", "That sounds heavy. What happened?"),
            ChatMessage::new("user", "My best friend moved away."),
        ],
        responses: scores.iter().map(|s| format!("score:{s}")).collect(),
        ..TurnInput::default()
    }
}

/// The judge's answer to a `score:N` response; anything else gets prose without JSON.
fn judge_by_text(req: &StubRequest) -> StubReply {
    match req.judged_response().and_then(|r| r.strip_prefix("score:")) {
        Some(n) => StubReply::Content(judge_answer(PAPER_RUBRIC, n.parse().unwrap())),
        None => StubReply::Content("I cannot score this.".into()),
    }
}

/// Generator: an invalid rubric first, the valid one on repair. Judge: by text.
fn repairing(req: &StubRequest, _n: usize) -> StubReply {
    match req.role {
        Role::Generator if req.is_retry() => StubReply::Content(PAPER_RUBRIC.into()),
        Role::Generator => StubReply::Content(bad_rubric()),
        Role::Judge => judge_by_text(req),
    }
}

fn rewards(r: &TurnResult) -> Vec<Option<f64>> {
    r.rewards.clone()
}

#[tokio::test]
async fn one_rubric_per_group_repaired_once_and_rewards_in_order() {
    let stub = Stub::start(repairing).await.unwrap();
    let eng = engine(&config(&stub), None);
    let r = eng.run_turn(turn("t1", &[5, 0, 3, 4])).await.unwrap();
    assert_eq!(r.rubric_status, rubric_status::OK);
    assert_eq!(r.rubric_attempts, 2);
    assert_eq!(
        rewards(&r),
        vec![Some(1.0), Some(0.0), Some(0.6), Some(0.8)]
    );
    assert!(
        r.responses
            .iter()
            .all(|x| x.status == response_status::OK && x.judge_attempts == 1)
    );
    assert_eq!(
        r.responses[2].scores.as_ref().unwrap(),
        &vec![vec![3.0; 3], vec![3.0; 2], vec![3.0; 3]]
    );
    // One rubric for the whole group: the first answer and one repair, then four judgments.
    assert_eq!(stub.count(Role::Generator), 2);
    assert_eq!(stub.count(Role::Judge), 4);
    assert_eq!(
        (r.calls.generator, r.calls.judge, r.calls.cached),
        (2, 4, 0)
    );
    // The repair request quotes the validator and carries the invalid answer.
    let calls = stub.calls();
    let repair = calls
        .iter()
        .find(|c| c.role == Role::Generator && c.is_retry())
        .unwrap();
    assert_eq!(repair.messages[2].content, bad_rubric());
    assert!(
        repair.messages[3].content.contains("weight_sum"),
        "{}",
        repair.messages[3].content
    );
    assert!(calls.iter().all(|c| c.model
        == if c.role == Role::Generator {
            "gen-model"
        } else {
            "judge-model"
        }));
    assert_eq!(r.repairs.len(), 1);
    assert_eq!(
        (r.repairs[0].attempt, r.repairs[0].codes.as_slice()),
        (1, &["weight_sum".to_owned()][..])
    );
    let v = r.validation.unwrap();
    assert_eq!(v.format_reward, 1.0);
    assert!(
        r.calls.prompt_tokens > 0,
        "usage is summed from the answers"
    );
}

#[tokio::test]
async fn the_repair_loop_is_bounded_and_ends_in_an_explicit_status() {
    let stub = Stub::start(|req, _| match req.role {
        Role::Generator => StubReply::Content(bad_rubric()),
        Role::Judge => panic!("no judge call without a rubric"),
    })
    .await
    .unwrap();
    let eng = engine(&config(&stub), None);
    let r = eng.run_turn(turn("t", &[5, 5])).await.unwrap();
    assert_eq!(r.rubric_status, rubric_status::INVALID);
    assert_eq!(r.rubric_attempts, 3);
    assert_eq!(
        stub.count(Role::Generator),
        3,
        "exactly rubric_attempts answers"
    );
    assert_eq!(stub.count(Role::Judge), 0);
    assert_eq!(rewards(&r), vec![None, None]);
    assert!(
        r.responses
            .iter()
            .all(|x| x.status == response_status::NO_RUBRIC)
    );
    let v = r.validation.unwrap();
    assert_eq!(v.format_reward, 0.0);
    assert_eq!(v.violations[0].code, "weight_sum");
    assert_eq!(r.rubric_error.unwrap().code, "invalid_rubric");
    assert_eq!(
        r.repairs.iter().map(|x| x.attempt).collect::<Vec<_>>(),
        [1, 2],
        "the third is `validation`"
    );
    let m = eng.metrics().render();
    assert!(
        m.contains("care_rubric_violations_total{code=\"weight_sum\"} 3"),
        "{m}"
    );
    // The output keeps the last invalid answer, so a user can see what the generator wrote.
    assert_eq!(
        r.rubric.map(|x| x.to_value()),
        Some(serde_json::Value::String(bad_rubric()))
    );
}

#[tokio::test]
async fn malformed_judge_answers_are_retried_a_bounded_number_of_times() {
    // "flaky": garbage first, then a good answer; "never": always prose; "partial": always one
    // criterion short.
    let stub = Stub::start(|req, _| match req.role {
        Role::Generator => StubReply::Content(PAPER_RUBRIC.into()),
        Role::Judge => match req.judged_response().unwrap() {
            "flaky" if !req.is_retry() => StubReply::Content("{\"criterion_scores\": [".into()),
            "flaky" => StubReply::Content(format!(
                "<think>ok</think>```json\n{}\n```",
                judge_answer(PAPER_RUBRIC, 4)
            )),
            "partial" => {
                let full = judge_answer(PAPER_RUBRIC, 2);
                let cut = full.rfind(",{").unwrap();
                StubReply::Content(format!("{}]}}", &full[..cut]))
            }
            _ => StubReply::Content("The response is lovely, 10/10.".into()),
        },
    })
    .await
    .unwrap();
    let eng = engine(&config(&stub), None);
    let mut t = turn("t", &[]);
    t.responses = vec!["flaky".into(), "never".into(), "partial".into()];
    let r = eng.run_turn(t).await.unwrap();
    assert_eq!(rewards(&r), vec![Some(0.8), None, None]);
    assert_eq!(r.responses[0].judge_attempts, 2);
    assert_eq!(r.responses[1].status, response_status::JUDGE_INVALID);
    assert_eq!(r.responses[1].judge_attempts, 3);
    assert_eq!(r.responses[1].error.as_ref().unwrap().code, "no_judge_json");
    assert_eq!(r.responses[2].status, response_status::JUDGE_INVALID);
    assert_eq!(r.responses[2].error.as_ref().unwrap().code, "missing_score");
    let per = |resp: &str| {
        stub.calls()
            .iter()
            .filter(|c| c.judged_response() == Some(resp))
            .count()
    };
    assert_eq!((per("flaky"), per("never"), per("partial")), (2, 3, 3));
    // The retry quotes the problem, naming the missing criterion.
    let calls = stub.calls();
    let retry = calls
        .iter()
        .find(|c| c.judged_response() == Some("partial") && c.is_retry())
        .unwrap();
    assert!(
        retry.messages[2]
            .content
            .contains("Respect the Seeker's Autonomy and Pace"),
        "{}",
        retry.messages[2].content
    );
}

#[tokio::test]
async fn http_429_and_500_are_retried_then_reported_with_their_code() {
    // Judge: "busy" gets 429 (Retry-After 0) on its first two attempts, then an answer;
    // "down" always gets 500.
    let busy_seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let b = Arc::clone(&busy_seen);
    let stub = Stub::start(move |req, _| match req.role {
        Role::Generator => StubReply::Content(PAPER_RUBRIC.into()),
        Role::Judge => match req.judged_response().unwrap() {
            "score:3" if b.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < 2 => {
                StubReply::Status(429, Some(0))
            }
            "score:3" => StubReply::Content(judge_answer(PAPER_RUBRIC, 3)),
            _ => StubReply::Status(500, None),
        },
    })
    .await
    .unwrap();
    let eng = engine(&config(&stub), None);
    let mut t = turn("t", &[3]);
    t.responses.push("down".into());
    let r = eng.run_turn(t).await.unwrap();
    assert_eq!(rewards(&r), vec![Some(0.6), None]);
    assert_eq!(r.responses[1].status, response_status::JUDGE_ERROR);
    let e = r.responses[1].error.as_ref().unwrap();
    assert_eq!(e.code, "http_500");
    assert!(e.message.contains("after 3 HTTP attempts"), "{}", e.message);
    assert_eq!(busy_seen.load(std::sync::atomic::Ordering::SeqCst), 3);
    assert_eq!(
        stub.calls()
            .iter()
            .filter(|c| c.judged_response() == Some("down"))
            .count(),
        3
    );
    assert_eq!(r.calls.failed, 1);
    assert_eq!(r.calls.http_attempts, 1 + 3 + 3);
    let m = eng.metrics().render();
    assert!(
        m.contains("care_llm_calls_total{endpoint=\"judge\",code=\"http_429\"} 2"),
        "{m}"
    );
    assert!(
        m.contains("care_llm_calls_total{endpoint=\"judge\",code=\"http_500\"} 3"),
        "{m}"
    );
    assert!(
        m.contains("care_llm_retries_total{endpoint=\"judge\"} 4"),
        "{m}"
    );
    assert!(
        m.contains("care_responses_total{status=\"judge_error\"} 1"),
        "{m}"
    );
}

#[tokio::test]
async fn a_generator_outage_is_a_generator_error_without_judge_calls() {
    let stub = Stub::start(|req, _| match req.role {
        Role::Generator => StubReply::Status(503, None),
        Role::Judge => panic!("no judge call"),
    })
    .await
    .unwrap();
    let eng = engine(&config(&stub), None);
    let r = eng.run_turn(turn("t", &[1, 2])).await.unwrap();
    assert_eq!(r.rubric_status, rubric_status::GENERATOR_ERROR);
    assert_eq!(r.rubric_error.as_ref().unwrap().code, "http_503");
    assert_eq!(
        r.rubric_attempts, 1,
        "one generator answer was asked for (with 3 HTTP attempts)"
    );
    assert_eq!(stub.count(Role::Generator), 3);
    assert_eq!(rewards(&r), vec![None, None]);
}

#[tokio::test]
async fn slow_and_stalled_judges_time_out_per_attempt() {
    let stub = Stub::start(|req, _| match req.role {
        Role::Generator => StubReply::Content(PAPER_RUBRIC.into()),
        Role::Judge => match req.judged_response().unwrap() {
            "slow" => StubReply::Delayed(judge_answer(PAPER_RUBRIC, 5), Duration::from_secs(5)),
            _ => StubReply::Stall,
        },
    })
    .await
    .unwrap();
    let mut cfg = config(&stub);
    cfg.judge.judges[0].endpoint.max_attempts = 2;
    let eng = engine(&cfg, None);
    let mut t = turn("t", &[]);
    t.responses = vec!["slow".into(), "stalled".into()];
    let started = std::time::Instant::now();
    let r = eng.run_turn(t).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "bounded by 2 attempts x 0.3 s"
    );
    for x in &r.responses {
        assert_eq!(x.status, response_status::JUDGE_ERROR);
        assert_eq!(x.error.as_ref().unwrap().code, "timeout");
        assert_eq!(x.reward, None);
    }
    assert_eq!(stub.count(Role::Judge), 4);
}

#[tokio::test]
async fn a_connection_stalled_mid_body_times_out() {
    // A raw TCP server: it sends the status line, headers and half a body, then nothing.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut held = Vec::new();
        while let Ok((mut sock, _)) = listener.accept().await {
            let mut buf = [0u8; 65536];
            let _ = sock.read(&mut buf).await;
            let _ = sock
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"choices\":[")
                .await;
            held.push(sock);
        }
    });
    let cfg = LoopConfig {
        generator: fast(&format!("http://{addr}/v1"), "g"),
        judge: fast(&format!("http://{addr}/v1"), "j").into(),
        ..LoopConfig::default()
    };
    let eng = engine(&cfg, None);
    let r = eng.run_turn(turn("t", &[1])).await.unwrap();
    assert_eq!(r.rubric_status, rubric_status::GENERATOR_ERROR);
    let e = r.rubric_error.unwrap();
    assert!(e.code == "timeout" || e.code == "transport", "{e:?}");
    server.abort();
}

#[tokio::test]
async fn a_refused_connection_is_a_connect_error() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    }; // closed again: nothing listens there
    let url = format!("http://127.0.0.1:{port}/v1");
    let cfg = LoopConfig {
        generator: fast(&url, "g"),
        judge: fast(&url, "j").into(),
        ..LoopConfig::default()
    };
    let r = engine(&cfg, None).run_turn(turn("t", &[1])).await.unwrap();
    assert_eq!(r.rubric_error.unwrap().code, "connect");
    assert_eq!(r.calls.http_attempts, 3);
}

#[tokio::test]
async fn a_rerun_from_the_cache_makes_zero_calls_and_gives_the_same_result() {
    let dir = tempdir("rerun");
    let path = dir.join("cache.sqlite");
    let stub = Stub::start(repairing).await.unwrap();
    let cfg = config(&stub);
    let first = engine(&cfg, Some(Cache::open(&path).unwrap()))
        .run_turn(turn("t", &[1, 2, 3]))
        .await
        .unwrap();
    let made = stub.calls().len();
    assert_eq!(made, 2 + 3);
    // A new engine (a new process would be the same) on the same file.
    let eng = engine(&cfg, Some(Cache::open(&path).unwrap()));
    let second = eng.run_turn(turn("t", &[1, 2, 3])).await.unwrap();
    assert_eq!(stub.calls().len(), made, "no LLM call on the rerun");
    assert_eq!(
        (
            second.calls.generator,
            second.calls.judge,
            second.calls.cached
        ),
        (0, 0, 5)
    );
    assert_eq!(second.rewards, first.rewards);
    assert_eq!(second.responses, first.responses);
    assert_eq!(second.rubric, first.rubric);
    let m = eng.metrics().render();
    assert!(
        m.contains("care_cache_lookups_total{endpoint=\"judge\",result=\"hit\"} 3"),
        "{m}"
    );
    // Another judge model is another key: the judge is asked again, the rubric is not.
    let mut other = cfg.clone();
    other.judge.judges[0].endpoint.model = "judge-model-2".into();
    let third = engine(&other, Some(Cache::open(&path).unwrap()))
        .run_turn(turn("t", &[1, 2, 3]))
        .await
        .unwrap();
    assert_eq!((third.calls.generator, third.calls.judge), (0, 3));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn concurrent_requests_for_one_turn_share_one_rubric_and_one_judgment() {
    let stub = Stub::start(|req, _| match req.role {
        Role::Generator => StubReply::Delayed(PAPER_RUBRIC.into(), Duration::from_millis(100)),
        Role::Judge => match judge_by_text(req) {
            StubReply::Content(c) => StubReply::Delayed(c, Duration::from_millis(50)),
            other => other,
        },
    })
    .await
    .unwrap();
    let eng = engine(&config(&stub), None);
    let (a, b) = tokio::join!(
        eng.run_turn(turn("same", &[2, 4])),
        eng.run_turn(turn("same", &[4]))
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.rewards, vec![Some(0.4), Some(0.8)]);
    assert_eq!(b.rewards, vec![Some(0.8)]);
    assert_eq!(stub.count(Role::Generator), 1);
    assert_eq!(
        stub.count(Role::Judge),
        2,
        "score:4 is judged once for both requests"
    );
}

#[tokio::test]
async fn bad_turns_are_input_errors_not_statuses() {
    let stub = Stub::start(repairing).await.unwrap();
    let eng = engine(&config(&stub), None);
    let mut t = turn("t", &[1]);
    t.context
        .push(ChatMessage::new("assistant", "trailing supporter turn"));
    assert_eq!(eng.run_turn(t).await.unwrap_err().code, "bad_input");
    let t = turn("t", &[]);
    assert!(
        eng.run_turn(t)
            .await
            .unwrap_err()
            .message
            .contains("responses is empty")
    );
    assert_eq!(stub.calls().len(), 0);
}

pub fn tempdir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("care-loop-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}
