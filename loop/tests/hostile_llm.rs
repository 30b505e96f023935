//! The loop against hostile LLM endpoints, over real HTTP on 127.0.0.1 (the stub is the test
//! double for the LLM): absurd `Retry-After` values, huge answers with and without a
//! `Content-Length`, event streams that never end. Each ends in a clear status with its own
//! code, within the configured bounds; the bytes the stub produced are counted, so a bound on
//! what the client read is a counted fact.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use care_loop::engine::{TurnInput, response_status, rubric_status};
use care_loop::llm::{ChatMessage, Role, decode_answer, parse_retry_after};
use care_loop::stub::{PAPER_RUBRIC, Stub, StubReply, judge_answer};
use care_loop::{BackendKind, EndpointConfig, Engine, LoopConfig, Metrics};
use serde_json::json;

fn fast(url: &str, model: &str) -> EndpointConfig {
    EndpointConfig {
        timeout_secs: 20.0,
        backoff_initial_secs: 0.001,
        backoff_max_secs: 0.05,
        max_attempts: 3,
        ..EndpointConfig::new(url, model)
    }
}

fn engine(stub: &Stub) -> Arc<Engine> {
    let cfg = LoopConfig {
        generator: fast(&stub.base_url(), "g"),
        judge: fast(&stub.base_url(), "j").into(),
        ..LoopConfig::default()
    };
    Arc::new(Engine::new(&cfg, BackendKind::Http, None, Arc::new(Metrics::new())).unwrap())
}

fn turn() -> TurnInput {
    TurnInput {
        id: None,
        context: vec![ChatMessage::new(
            "user",
            "I failed my exam and I feel awful.",
        )],
        responses: vec!["score:4".into()],
        gold: None,
        ..TurnInput::default()
    }
}

/// Issue case: `Retry-After: 1e20` (and its relatives) made `Duration::from_secs_f64` panic
/// before the cap; the generator's turn then failed as `internal`. Now the wait is capped at
/// `backoff_max_secs` and the call retried.
#[tokio::test]
async fn retry_after_beyond_any_duration_is_capped_not_a_panic() {
    for value in [
        "1e20",
        "1e400",
        "inf",
        "18446744073709551616",
        "-5",
        "nan",
        "Wed, 21 Oct 2015 07:28:00 GMT",
        "x",
    ] {
        let v = value.to_owned();
        let stub = Stub::start(move |req, n| match (req.role, n) {
            (_, 0) => StubReply::StatusRetryAfter(429, v.clone()),
            (Role::Generator, _) => StubReply::Content(PAPER_RUBRIC.into()),
            (Role::Judge, _) => StubReply::Content(judge_answer(PAPER_RUBRIC, 4)),
        })
        .await
        .unwrap();
        let started = Instant::now();
        let r = engine(&stub).run_turn(turn()).await.unwrap();
        assert_eq!(r.rubric_status, rubric_status::OK, "Retry-After: {value}");
        assert_eq!(r.responses[0].status, response_status::OK, "{value}");
        assert_eq!(
            r.calls.http_attempts, 3,
            "{value}: one retry of the generator"
        );
        // Capped at backoff_max_secs (0.05 s): a generous bound that only a real wait breaks.
        assert!(started.elapsed() < Duration::from_secs(10), "{value}");
    }
    // The parse keeps what was sent; the cap is applied before any Duration exists.
    assert_eq!(parse_retry_after(" 1e20 "), Some(1e20));
    assert_eq!(parse_retry_after("inf"), Some(f64::INFINITY));
    assert_eq!(parse_retry_after("-1"), None);
    assert_eq!(parse_retry_after("NaN"), None);
}

/// The judge side of the same: every answer a 503 with `Retry-After: 1e20` is `judge_error`
/// `http_503` after `max_attempts`, never a panic reported as `internal`.
#[tokio::test]
async fn a_judge_that_always_says_retry_after_1e20_is_a_judge_error() {
    let stub = Stub::start(|req, _| match req.role {
        Role::Generator => StubReply::Content(PAPER_RUBRIC.into()),
        Role::Judge => StubReply::StatusRetryAfter(503, "1e20".into()),
    })
    .await
    .unwrap();
    let r = engine(&stub).run_turn(turn()).await.unwrap();
    let resp = &r.responses[0];
    assert_eq!(resp.status, response_status::JUDGE_ERROR);
    assert_eq!(resp.error.as_ref().unwrap().code, "http_503");
    assert_eq!(stub.count(Role::Judge), 3);
}

/// Issue case: answers were read whole (256 MB cost 519 MB RSS). Now an answer is read as it
/// arrives up to `max_answer_bytes`: longer is `answer_too_long`, not retried, and the client
/// stops reading, so the stub produces little more than the cap (counted).
#[tokio::test]
async fn a_huge_answer_is_answer_too_long_and_read_no_further_than_the_cap() {
    for declared in [false, true] {
        let stub = Stub::start(move |req, _| match req.role {
            Role::Generator => StubReply::Content(PAPER_RUBRIC.into()),
            Role::Judge => StubReply::Huge {
                bytes: 256 << 20,
                declared,
            },
        })
        .await
        .unwrap();
        let r = engine(&stub).run_turn(turn()).await.unwrap();
        let resp = &r.responses[0];
        assert_eq!(
            resp.status,
            response_status::JUDGE_ERROR,
            "declared {declared}"
        );
        let e = resp.error.as_ref().unwrap();
        assert_eq!(e.code, "answer_too_long", "{e:?}");
        assert!(
            e.message.contains("max_answer_bytes (1048576 bytes)"),
            "{e:?}"
        );
        assert_eq!(stub.count(Role::Judge), 1, "not retried");
        // Give the stub a moment to notice the closed connection, then count what it made:
        // the 1 MiB cap plus what the sockets buffer, far from the 256 MiB it would send.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let made = stub.streamed_bytes();
        assert!(
            made < 48 << 20,
            "declared {declared}: {made} bytes produced"
        );
        if declared {
            // Refused from the Content-Length alone.
            assert!(made < 16 << 20, "{made}");
        }
    }
}

/// Issue case: a fast endless event stream grew `care reward` until an address-space limit
/// aborted it. Now the stream ends at the cap, for the generator too (`generator_error`).
#[tokio::test]
async fn an_endless_event_stream_ends_at_the_cap() {
    let stub = Stub::start(|_, _| StubReply::EndlessSse).await.unwrap();
    let r = engine(&stub).run_turn(turn()).await.unwrap();
    assert_eq!(r.rubric_status, rubric_status::GENERATOR_ERROR);
    let e = r.rubric_error.as_ref().unwrap();
    assert_eq!(e.code, "answer_too_long");
    assert!(
        e.message.contains("65536 bytes"),
        "the generator's cap: {e:?}"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        stub.streamed_bytes() < 48 << 20,
        "{}",
        stub.streamed_bytes()
    );
}

/// A configured cap is the cap: a judge answer of 2 KiB against `max_answer_bytes: 1024`.
#[tokio::test]
async fn max_answer_bytes_is_configurable() {
    let stub = Stub::start(|req, _| match req.role {
        Role::Generator => StubReply::Content(PAPER_RUBRIC.into()),
        Role::Judge => StubReply::Content(format!(
            "{} {}",
            "x".repeat(2048),
            judge_answer(PAPER_RUBRIC, 4)
        )),
    })
    .await
    .unwrap();
    let mut cfg = LoopConfig {
        generator: fast(&stub.base_url(), "g"),
        judge: fast(&stub.base_url(), "j").into(),
        ..LoopConfig::default()
    };
    cfg.judge.judges[0].endpoint.max_answer_bytes = Some(1024);
    let e = Arc::new(Engine::new(&cfg, BackendKind::Http, None, Arc::new(Metrics::new())).unwrap());
    let r = e.run_turn(turn()).await.unwrap();
    assert_eq!(
        r.responses[0].error.as_ref().unwrap().code,
        "answer_too_long"
    );
    cfg.judge.judges[0].endpoint.max_answer_bytes = Some(1 << 20);
    let e = Arc::new(Engine::new(&cfg, BackendKind::Http, None, Arc::new(Metrics::new())).unwrap());
    let r = e.run_turn(turn()).await.unwrap();
    assert_eq!(r.responses[0].status, response_status::OK);
}

/// A server that streams although asked not to: the answer is the concatenated deltas (the
/// reasoning deltas when there is no content), usage from the chunk that carries it.
#[tokio::test]
async fn an_event_stream_answer_is_read_from_its_deltas() {
    let answer = judge_answer(PAPER_RUBRIC, 5);
    let (a, b) = answer.split_at(answer.len() / 2);
    let chunk =
        |piece: &str| json!({"choices": [{"index": 0, "delta": {"content": piece}}]}).to_string();
    let events = vec![
        chunk(a),
        chunk(b),
        json!({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}).to_string(),
    ];
    let stub = Stub::start(move |req, _| match req.role {
        Role::Generator => StubReply::Content(PAPER_RUBRIC.into()),
        Role::Judge => StubReply::Sse(events.clone()),
    })
    .await
    .unwrap();
    let r = engine(&stub).run_turn(turn()).await.unwrap();
    assert_eq!(r.responses[0].status, response_status::OK, "{r:?}");
    assert_eq!(r.rewards[0], Some(1.0));

    let (text, usage) = decode_answer(
        Some("text/event-stream; charset=utf-8"),
        b": comment\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"think\"}}]}\n\ndata: [DONE]\n\ndata: junk\n",
    )
    .unwrap();
    assert_eq!((text.as_str(), usage.prompt_tokens), ("think", 0));
    assert!(decode_answer(Some("text/event-stream"), b"data: {not json}\n\n").is_err());
    assert!(decode_answer(Some("text/event-stream"), b"").is_err());
    assert!(decode_answer(None, b"{\"choices\":[]}").is_err());
}

/// A response's error can quote what an LLM wrote (the missing criteria by title, from the
/// generator's rubric): it is cut to `MAX_ERROR_MESSAGE_BYTES`, since every response keeps its
/// error until its request is answered.
#[tokio::test]
async fn an_error_quoting_llm_text_is_cut_to_a_bounded_length() {
    // Every title made 5,000 characters long (in place: the key order must stay valid).
    let mut rubric = String::new();
    for (i, line) in PAPER_RUBRIC.lines().enumerate() {
        match line.split_once("\"title\": \"") {
            Some((head, _)) => {
                rubric.push_str(&format!("{head}\"title\": \"{i}{}\",", "t".repeat(5000)));
            }
            None => rubric.push_str(line),
        }
        rubric.push('\n');
    }
    let stub = Stub::start(move |req, _| match req.role {
        Role::Generator => StubReply::Content(rubric.clone()),
        Role::Judge => StubReply::Content("{\"criterion_scores\":[]}".into()),
    })
    .await
    .unwrap();
    let r = engine(&stub).run_turn(turn()).await.unwrap();
    assert_eq!(r.rubric_status, rubric_status::OK, "{r:?}");
    let e = r.responses[0].error.as_ref().unwrap();
    assert_eq!(e.code, "missing_score");
    assert!(
        e.message.len() <= care_loop::engine::MAX_ERROR_MESSAGE_BYTES,
        "{}",
        e.message.len()
    );
    assert!(e.message.ends_with("..."));
}
