//! `care serve` over real HTTP on 127.0.0.1: OpenRLHF's `/get_reward`, the JSON API for
//! groups, health, metrics and graceful shutdown, with the stub as the LLM.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use care_loop::engine::OnFailure;
use care_loop::llm::Role;
use care_loop::server::{ServerOptions, router, serve};
use care_loop::stub::{PAPER_RUBRIC, Stub, StubReply, StubRequest, judge_answer};
use care_loop::{BackendKind, EndpointConfig, Engine, LoopConfig, Metrics};
use serde_json::{Value, json};
use tokio::sync::oneshot;

fn fast(url: &str, model: &str) -> EndpointConfig {
    EndpointConfig {
        timeout_secs: 2.0,
        backoff_initial_secs: 0.001,
        backoff_max_secs: 0.002,
        max_attempts: 2,
        ..EndpointConfig::new(url, model)
    }
}

fn judge_by_text(req: &StubRequest, delay: Duration) -> StubReply {
    match req.judged_response().and_then(|r| r.strip_prefix("score:")) {
        Some(n) => StubReply::Delayed(judge_answer(PAPER_RUBRIC, n.parse().unwrap()), delay),
        None => StubReply::Content("no idea".into()),
    }
}

struct Server {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    stub: Stub,
}

impl Server {
    async fn start(policy: OnFailure, judge_delay: Duration) -> Server {
        let stub = Stub::start(move |req, _| match req.role {
            Role::Generator => StubReply::Content(PAPER_RUBRIC.into()),
            Role::Judge => judge_by_text(req, judge_delay),
        })
        .await
        .unwrap();
        let cfg = LoopConfig {
            generator: fast(&stub.base_url(), "g"),
            judge: fast(&stub.base_url(), "j").into(),
            judge_attempts: 2,
            ..LoopConfig::default()
        };
        let engine =
            Arc::new(Engine::new(&cfg, BackendKind::Http, None, Arc::new(Metrics::new())).unwrap());
        let opts = ServerOptions {
            openrlhf_on_failure: policy,
            ..ServerOptions::default()
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, router(engine, opts, "http"), async move {
            let _ = rx.await;
        }));
        Server {
            addr,
            stop: Some(tx),
            task,
            stub,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

fn messages(tag: &str) -> Value {
    json!([
        {"role": "user", "content": format!("{tag}: nobody calls me anymore")},
        {"role": "assistant", "content": "That sounds lonely."},
        {"role": "user", "content": "I guess I stopped calling too."}
    ])
}

#[tokio::test]
async fn openrlhf_get_reward_groups_by_prompt_and_imputes_failures_explicitly() {
    let s = Server::start(OnFailure::GroupMean, Duration::ZERO).await;
    // Two prompts, interleaved as a trainer may send them. Prompt A's context comes from its
    // label (a JSON string of chat messages), prompt B's from the prompt text itself.
    let (pa, pb) = ("<|user|>A<|assistant|>", "<|user|>B<|assistant|>");
    let label_a = messages("A").to_string();
    let body = json!({
        "query": [
            format!("{pa}score:5"), format!("{pb}score:1"), format!("{pa}score:3"),
            format!("{pb}gibberish"), format!("{pa} score:4 \n"), format!("{pb}score:3"),
        ],
        "prompts": [pa, pb, pa, pb, pa, pb],
        "labels": [label_a, null, label_a, null, label_a, null],
    });
    let resp = reqwest::Client::new()
        .post(s.url("/get_reward"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    let rewards: Vec<f64> = serde_json::from_value(v["rewards"].clone()).unwrap();
    // B's "gibberish" has no usable judgment: it gets the mean of B's valid rewards (0.2, 0.6).
    let expect = [1.0, 0.2, 0.6, 0.4, 0.8, 0.6];
    for (got, want) in rewards.iter().zip(expect) {
        assert!((got - want).abs() < 1e-12, "{rewards:?}");
    }
    assert_eq!(v["scores"], v["rewards"]);
    assert_eq!(
        v["extra_logs"]["care_valid"],
        json!([1.0, 1.0, 1.0, 0.0, 1.0, 1.0])
    );
    assert_eq!(
        v["extra_logs"]["care_judge_attempts"],
        json!([1.0, 1.0, 1.0, 2.0, 1.0, 1.0])
    );
    // One rubric per prompt, one judgment per distinct response.
    assert_eq!(s.stub.count(Role::Generator), 2);
    let gen_contexts: Vec<String> = s
        .stub
        .calls()
        .iter()
        .filter(|c| c.role == Role::Generator)
        .map(|c| c.transcript().unwrap().to_owned())
        .collect();
    assert!(
        gen_contexts
            .iter()
            .any(|t| t.contains("seeker: A: nobody calls me anymore")),
        "{gen_contexts:?}"
    );
    assert!(
        gen_contexts
            .iter()
            .any(|t| t.contains("seeker: <|user|>B<|assistant|>")),
        "{gen_contexts:?}"
    );

    // Shape errors name the sample.
    let bad = json!({"query": ["xyz"], "prompts": ["abc"]});
    let resp = reqwest::Client::new()
        .post(s.url("/get_reward"))
        .json(&bad)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert!(
        v["error"]["message"].as_str().unwrap().contains("query[0]"),
        "{v}"
    );
    let resp = reqwest::Client::new()
        .post(s.url("/get_reward"))
        .json(&json!({"query": ["x"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
}

#[tokio::test]
async fn the_error_policy_refuses_instead_of_imputing_and_names_every_failure() {
    let s = Server::start(OnFailure::Error, Duration::ZERO).await;
    // Two groups (prompts p and q), failures in both: every failed query is named by its
    // index in the batch, its group and its place in the group, not only the first group's.
    let body = json!({
        "query": ["pscore:2", "pnope", "qscore:1", "qnope", "qalso nope"],
        "prompts": ["p", "p", "q", "q", "q"],
        "labels": [null, null, null, null, null],
    });
    let resp = reqwest::Client::new()
        .post(s.url("/get_reward"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 502);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "no_reward");
    let msg = v["error"]["message"].as_str().unwrap();
    for want in [
        "no reward for 3 of 5 queries in 2 of 2 groups",
        "query[1] (group 0, responses[1], rubric ok): judge_invalid",
        "query[3] (group 1, responses[1], rubric ok): judge_invalid",
        "query[4] (group 1, responses[2], rubric ok): judge_invalid",
    ] {
        assert!(msg.contains(want), "{want:?} not in {msg}");
    }
    assert!(
        !msg.contains("query[0]") && !msg.contains("query[2]"),
        "{msg}"
    );

    // The JSON API under `error` names the failures of every turn too.
    let turns = json!({"turns": [
        {"context": messages("A"), "responses": ["score:5", "nope"]},
        {"context": messages("B"), "responses": ["nope", "score:1"]},
    ], "on_failure": "error"});
    let resp = reqwest::Client::new()
        .post(s.url("/v1/reward"))
        .json(&turns)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 502);
    let v: Value = resp.json().await.unwrap();
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("turns[0]: rubric ok; no reward for responses[1]: judge_invalid")
            && msg.contains("turns[1]: rubric ok; no reward for responses[0]: judge_invalid"),
        "{msg}"
    );
}

#[tokio::test]
async fn json_api_health_and_metrics() {
    let s = Server::start(OnFailure::GroupMean, Duration::ZERO).await;
    let c = reqwest::Client::new();
    let body = json!({"turns": [
        {"id": 7, "context": messages("X"), "responses": ["score:5", "???"], "gold": {"chosen": 0}},
        {"context": messages("Y"), "responses": ["score:0"]}
    ]});
    let v: Value = c
        .post(s.url("/v1/reward"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let r = &v["results"];
    assert_eq!(r[0]["id"], 7);
    assert_eq!(
        r[0]["rewards"],
        json!([1.0, null]),
        "the JSON API's default is null"
    );
    assert_eq!(r[0]["responses"][1]["status"], "judge_invalid");
    assert_eq!(r[0]["gold"], json!({"chosen": 0}));
    assert_eq!(r[0]["rubric_status"], "ok");
    assert_eq!(r[1]["rewards"], json!([0.0]));
    let body = json!({"turns": [{"context": messages("X"), "responses": ["score:5", "???"]}], "on_failure": "group_mean"});
    let v: Value = c
        .post(s.url("/v1/reward"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["results"][0]["rewards"], json!([1.0, 1.0]));
    assert_eq!(
        v["results"][0]["responses"][1]["reward"],
        Value::Null,
        "the truth stays null"
    );
    // A bad turn names itself.
    let body = json!({"turns": [{"context": [], "responses": ["a"]}]});
    let resp = c
        .post(s.url("/v1/reward"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("turns[0]"),
        "{v}"
    );
    let resp = c
        .post(s.url("/v1/reward"))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);

    let h: Value = c
        .get(s.url("/healthz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(h["status"], "ok");
    let m = c.get(s.url("/metrics")).send().await.unwrap();
    assert!(
        m.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text")
    );
    let text = m.text().await.unwrap();
    for needle in [
        "care_http_requests_total{route=\"/v1/reward\",status=\"200\"} 2",
        "care_http_requests_total{route=\"/v1/reward\",status=\"400\"} 2",
        "care_http_request_duration_seconds_bucket{",
        "care_llm_calls_total{endpoint=\"generator\",code=\"ok\"} 3",
        "care_llm_tokens_total{endpoint=\"judge\",kind=\"prompt\"}",
        "care_rubrics_total{status=\"ok\"} 3",
        "care_responses_total{status=\"judge_invalid\"} 2",
        "care_http_requests_in_flight 0",
    ] {
        assert!(text.contains(needle), "missing {needle} in\n{text}");
    }
}

#[tokio::test]
async fn graceful_shutdown_finishes_the_request_in_flight() {
    let mut s = Server::start(OnFailure::GroupMean, Duration::from_millis(400)).await;
    let url = s.url("/get_reward");
    let req = tokio::spawn(async move {
        let body = json!({"query": ["pscore:4"], "prompts": ["p"]});
        reqwest::Client::new().post(url).json(&body).send().await
    });
    // Wait until the judge call is in flight, then ask the server to stop.
    for _ in 0..200 {
        if s.stub.count(Role::Judge) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(s.stub.count(Role::Judge), 1);
    s.stop.take().unwrap().send(()).unwrap();
    let resp = req.await.unwrap().unwrap();
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["rewards"], json!([0.8]));
    tokio::time::timeout(Duration::from_secs(5), &mut s.task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    // Stopped: nothing listens any more.
    assert!(
        reqwest::Client::new()
            .get(s.url("/healthz"))
            .send()
            .await
            .is_err()
    );
}
