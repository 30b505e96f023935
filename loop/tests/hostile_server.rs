//! `care serve` against hostile clients, over real sockets on 127.0.0.1: requests too large
//! for the budget, half-sent requests and silent connections (raw `TcpStream`s), connection
//! floods, clients that leave mid-request, missing or wrong keys. The LLMs are the stub (the
//! test double). No test asserts a speed, except the stated `/healthz` latency bound under a
//! large request, with a margin only a real stall can break.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use care_loop::llm::Role;
use care_loop::server::{Server, ServerOptions, Stopped, exposure_warning};
use care_loop::stub::{PAPER_RUBRIC, Stub, StubReply, judge_answer};
use care_loop::{BackendKind, EndpointConfig, Engine, LoopConfig, Metrics};
use serde_json::{Value, json};
use tokio::sync::oneshot;

fn fast(url: &str, model: &str) -> EndpointConfig {
    EndpointConfig {
        timeout_secs: 30.0,
        backoff_initial_secs: 0.001,
        backoff_max_secs: 0.002,
        max_attempts: 2,
        ..EndpointConfig::new(url, model)
    }
}

struct Running {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<Stopped>>,
    engine: Arc<Engine>,
    stub: Stub,
}

impl Running {
    /// A server whose judge answers `score:N` responses after `judge_delay` (`Stall` for
    /// `None`), with `opts`.
    async fn start(opts: ServerOptions, judge_delay: Option<Duration>) -> Running {
        let stub = Stub::start(move |req, _| match req.role {
            Role::Generator => StubReply::Content(PAPER_RUBRIC.into()),
            Role::Judge => match judge_delay {
                None => StubReply::Stall,
                Some(d) => {
                    let n = req
                        .judged_response()
                        .and_then(|r| r.strip_prefix("score:"))
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(3);
                    StubReply::Delayed(judge_answer(PAPER_RUBRIC, n), d)
                }
            },
        })
        .await
        .unwrap();
        let cfg = LoopConfig {
            generator: fast(&stub.base_url(), "g"),
            judge: fast(&stub.base_url(), "j").into(),
            ..LoopConfig::default()
        };
        let engine =
            Arc::new(Engine::new(&cfg, BackendKind::Http, None, Arc::new(Metrics::new())).unwrap());
        opts.check().unwrap();
        let server = Server::new(Arc::clone(&engine), opts, "http");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            server
                .serve(listener, async move {
                    let _ = rx.await;
                })
                .await
        });
        Running {
            addr,
            stop: Some(tx),
            task,
            engine,
            stub,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    async fn metrics(&self) -> String {
        reqwest::get(self.url("/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    async fn stop(mut self) -> Stopped {
        self.stop.take().unwrap().send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(30), &mut self.task)
            .await
            .unwrap()
            .unwrap()
            .unwrap()
    }
}

fn dialogue(tag: &str) -> Value {
    json!([{"role": "user", "content": format!("{tag}: I cannot sleep since my dog died.")}])
}

async fn post(url: &str, body: &Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(url)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let v = r.json().await.unwrap_or(Value::Null);
    (status, v)
}

/// Issue case: 100k distinct prompts in a 2.2 MB `/get_reward` body took 1.59 GB and 12.7 s
/// while `/healthz` timed out (300k aborted the server). Now: 413 `too_many_responses` at once,
/// before any turn is built; a batch within `--max-responses` but over `--max-turns` is 413
/// `too_many_turns`; the server stays healthy and the budget is free again.
#[tokio::test]
async fn too_many_prompts_or_turns_are_413_before_any_work() {
    let s = Running::start(ServerOptions::default(), Some(Duration::ZERO)).await;
    for n in [100_000usize, 300_000] {
        let prompts: Vec<String> = (0..n).map(|i| format!("p{i}")).collect();
        let query: Vec<String> = prompts.iter().map(|p| format!("{p}score:4")).collect();
        let (status, v) = post(
            &s.url("/get_reward"),
            &json!({"query": query, "prompts": prompts}),
        )
        .await;
        assert_eq!(status, 413, "{v}");
        assert_eq!(v["error"]["code"], "too_many_responses", "{v}");
    }
    let prompts: Vec<String> = (0..3000).map(|i| format!("p{i}")).collect();
    let query: Vec<String> = prompts.iter().map(|p| format!("{p}score:4")).collect();
    let (status, v) = post(
        &s.url("/get_reward"),
        &json!({"query": query, "prompts": prompts}),
    )
    .await;
    assert_eq!(status, 413, "{v}");
    assert_eq!(v["error"]["code"], "too_many_turns", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--max-turns"),
        "{v}"
    );
    // /v1/reward: too many turns, a dialogue or a response over --max-text-bytes.
    let turns: Vec<Value> = (0..2049)
        .map(|i| json!({"context": dialogue(&i.to_string()), "responses": ["a"]}))
        .collect();
    let (status, v) = post(&s.url("/v1/reward"), &json!({ "turns": turns })).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (413, Some("too_many_turns"))
    );
    let long = "x".repeat((1 << 20) + 1);
    let body = json!({"turns": [{"context": dialogue("a"), "responses": ["ok"]},
                                {"context": [{"role": "user", "content": long}], "responses": ["a"]}]});
    let (status, v) = post(&s.url("/v1/reward"), &body).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (413, Some("text_too_long")),
        "{v}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("turns[1]"),
        "{v}"
    );
    let body = json!({"turns": [{"context": dialogue("a"), "responses": ["ok", long]}]});
    let (status, v) = post(&s.url("/v1/reward"), &body).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (413, Some("text_too_long")),
        "{v}"
    );
    // Healthy, nothing held, and a normal request still works.
    let (status, v) = post(
        &s.url("/v1/reward"),
        &json!({"turns": [{"context": dialogue("ok"), "responses": ["score:5"]}]}),
    )
    .await;
    assert_eq!(
        (status, v["results"][0]["rewards"][0].as_f64()),
        (200, Some(1.0)),
        "{v}"
    );
    let m = s.metrics().await;
    for kind in ["bytes", "turns", "responses"] {
        let line = format!("care_http_budget_in_use{{kind=\"{kind}\"}} 0");
        assert!(m.contains(&line), "{line} in\n{m}");
    }
    assert!(
        m.contains("care_http_requests_total{route=\"/get_reward\",status=\"413\"} 3"),
        "{m}"
    );
    s.stop().await;
}

/// A body of many tiny JSON values would decode into many times its size: it is charged for
/// its decoded form before it is decoded, and refused (413) when that is over the budget.
#[tokio::test]
async fn a_body_of_tiny_values_is_charged_for_what_it_decodes_into() {
    let opts = ServerOptions {
        max_body_bytes: 8 << 20,
        max_inflight_bytes: 64 << 20,
        ..ServerOptions::default()
    };
    let s = Running::start(opts, Some(Duration::ZERO)).await;
    // 2M zero labels: 4 MB of text that serde_json would make into 64+ MB of values.
    let mut body = String::from("{\"query\":[],\"prompts\":[],\"labels\":[");
    body.push_str(&"0,".repeat(2_000_000));
    body.push_str("0]}");
    let r = reqwest::Client::new()
        .post(s.url("/get_reward"))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "body_too_large");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("JSON values"),
        "{v}"
    );
    // Over --max-body-bytes by its Content-Length: refused before a byte of it is read.
    let r = reqwest::Client::new()
        .post(s.url("/v1/reward"))
        .body(vec![b' '; 9 << 20])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    s.stop().await;
}

/// The server-wide budget: while one request holds the turns in flight, another is 429 with
/// `Retry-After`; afterwards it is taken.
#[tokio::test]
async fn a_full_budget_is_429_with_retry_after_and_frees_afterwards() {
    let opts = ServerOptions {
        max_turns: 2,
        max_inflight_turns: 2,
        ..ServerOptions::default()
    };
    let s = Running::start(opts, Some(Duration::from_millis(800))).await;
    let url = s.url("/v1/reward");
    let first = tokio::spawn(async move {
        let body = json!({"turns": [{"context": dialogue("a"), "responses": ["score:4"]},
                                    {"context": dialogue("b"), "responses": ["score:2"]}]});
        post(&url, &body).await
    });
    for _ in 0..400 {
        if s.stub.count(Role::Judge) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let r = reqwest::Client::new()
        .post(s.url("/v1/reward"))
        .json(&json!({"turns": [{"context": dialogue("c"), "responses": ["score:5"]}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "1");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "busy");
    assert_eq!(first.await.unwrap().0, 200);
    let (status, _) = post(
        &s.url("/v1/reward"),
        &json!({"turns": [{"context": dialogue("c"), "responses": ["score:5"]}]}),
    )
    .await;
    assert_eq!(status, 200);
    s.stop().await;
}

/// Issue case 6: a client that left during a slow judge kept `care_http_requests_in_flight`
/// up for good and was never counted. Now the dropped handler decrements the gauge, is
/// counted with status 499, and leaves no shared computation behind.
#[tokio::test]
async fn a_client_that_leaves_mid_request_is_counted_and_leaves_nothing_behind() {
    let s = Running::start(ServerOptions::default(), None).await;
    for route in ["/get_reward", "/v1/reward"] {
        let body = if route == "/get_reward" {
            json!({"query": ["pscore:4", "pscore:2"], "prompts": ["p", "p"]}).to_string()
        } else {
            json!({"turns": [{"context": dialogue(route), "responses": ["score:4"]}]}).to_string()
        };
        let judged = s.stub.count(Role::Judge);
        let mut c = TcpStream::connect(s.addr).unwrap();
        write!(
            c,
            "POST {route} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        // Wait until the stalled judge has the request, then leave.
        for _ in 0..1000 {
            if s.stub.count(Role::Judge) > judged {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(
            s.stub.count(Role::Judge) > judged,
            "{route}: the judge was never asked"
        );
        drop(c);
    }
    let mut m = String::new();
    for _ in 0..400 {
        m = s.metrics().await;
        if m.contains("care_http_requests_in_flight 0") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(m.contains("care_http_requests_in_flight 0"), "{m}");
    for route in ["/get_reward", "/v1/reward"] {
        let line = format!("care_http_requests_total{{route=\"{route}\",status=\"499\"}} 1");
        assert!(m.contains(&line), "{line} in\n{m}");
    }
    assert_eq!(s.engine.flights_in_progress(), 0);
    assert!(
        m.contains("care_http_budget_in_use{kind=\"responses\"} 0"),
        "{m}"
    );
    s.stop().await;
}

/// Reads from a raw connection until the server closes it; `None` when it is still open after
/// `within`. Returns what the server sent.
fn closed_within(c: &mut TcpStream, within: Duration) -> Option<String> {
    c.set_read_timeout(Some(within)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match c.read(&mut buf) {
            Ok(0) => return Some(String::from_utf8_lossy(&got).into_owned()),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return Some(String::from_utf8_lossy(&got).into_owned());
            }
            Err(_) => return None,
        }
    }
}

/// Issue case 4: partial requests held connections forever. Now half-sent headers, a
/// connection that sends nothing, and an idle kept-alive connection are all closed after the
/// header timeout; a body that stops coming is 408.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_silent_connections_are_closed_after_their_timeouts() {
    let opts = ServerOptions {
        header_timeout: Duration::from_millis(500),
        body_timeout: Duration::from_millis(500),
        ..ServerOptions::default()
    };
    let s = Running::start(opts, Some(Duration::ZERO)).await;
    let addr = s.addr;
    tokio::task::spawn_blocking(move || {
        let mut half = TcpStream::connect(addr).unwrap();
        half.write_all(b"POST /v1/reward HTTP/1.1\r\nhost: x\r\ncontent-le")
            .unwrap();
        let mut silent = TcpStream::connect(addr).unwrap();
        let mut kept = TcpStream::connect(addr).unwrap();
        kept.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            .unwrap();
        let mut slow_body = TcpStream::connect(addr).unwrap();
        slow_body
            .write_all(
                b"POST /v1/reward HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{\"turns\"",
            )
            .unwrap();
        // Generous: the timeouts are 0.5 s; only a connection held for good fails this.
        let within = Duration::from_secs(20);
        assert!(
            closed_within(&mut half, within).is_some(),
            "half-sent headers"
        );
        assert!(
            closed_within(&mut silent, within).is_some(),
            "silent connection"
        );
        let answered = closed_within(&mut kept, within).expect("idle kept-alive connection");
        assert!(answered.starts_with("HTTP/1.1 200"), "{answered}");
        let answered = closed_within(&mut slow_body, within).expect("slow body");
        assert!(answered.starts_with("HTTP/1.1 408"), "{answered}");
        assert!(answered.contains("\"body_timeout\""), "{answered}");
    })
    .await
    .unwrap();
    s.stop().await;
}

/// Issue case 4: 20,000 held connections made `/healthz` time out. Now connections beyond
/// `--max-connections` are answered 503 (JSON) and closed, the held ones are closed by the
/// header timeout, and the server answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_cap_are_refused_with_503() {
    let opts = ServerOptions {
        max_connections: 8,
        header_timeout: Duration::from_secs(2),
        ..ServerOptions::default()
    };
    let s = Running::start(opts, Some(Duration::ZERO)).await;
    let addr = s.addr;
    tokio::task::spawn_blocking(move || {
        let held: Vec<TcpStream> = (0..8).map(|_| TcpStream::connect(addr).unwrap()).collect();
        std::thread::sleep(Duration::from_millis(200));
        let mut extra = TcpStream::connect(addr).unwrap();
        let _ = extra.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n");
        let answer = closed_within(&mut extra, Duration::from_secs(20)).unwrap();
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        assert!(answer.contains("too_many_connections"), "{answer}");
        drop(held);
    })
    .await
    .unwrap();
    let mut ok = false;
    for _ in 0..100 {
        if let Ok(r) = reqwest::get(s.url("/healthz")).await {
            ok = r.status() == 200;
            if ok {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ok, "/healthz after the flood");
    let m = s.metrics().await;
    assert!(!m.contains("care_http_connections_refused_total 0"), "{m}");
    s.stop().await;
}

/// Optional bearer-token auth: every route but `/healthz` needs the key; a missing or wrong
/// one is 401 with `WWW-Authenticate: Bearer` (and counted).
#[tokio::test]
async fn the_key_is_required_everywhere_but_healthz() {
    let opts = ServerOptions {
        api_key: Some("s3cret-token".into()),
        ..ServerOptions::default()
    };
    assert!(
        !format!("{opts:?}").contains("s3cret"),
        "the key stays out of logs"
    );
    let s = Running::start(opts, Some(Duration::ZERO)).await;
    let c = reqwest::Client::new();
    let body = json!({"turns": [{"context": dialogue("k"), "responses": ["score:5"]}]});
    for auth in [
        None,
        Some("Bearer wrong"),
        Some("Bearer s3cret-toke"),
        Some("s3cret-token"),
    ] {
        let mut req = c.post(s.url("/v1/reward")).json(&body);
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 401, "{auth:?}");
        assert_eq!(r.headers()["www-authenticate"], "Bearer");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "unauthorized");
    }
    assert_eq!(c.get(s.url("/metrics")).send().await.unwrap().status(), 401);
    let ok = c
        .post(s.url("/v1/reward"))
        .bearer_auth("s3cret-token")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    let h: Value = reqwest::get(s.url("/healthz"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (h["status"].as_str(), h["auth"].as_bool()),
        (Some("ok"), Some(true))
    );
    assert!(h.get("warning").is_none());
    let m = c
        .get(s.url("/metrics"))
        .bearer_auth("s3cret-token")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        m.contains("care_http_requests_total{route=\"/v1/reward\",status=\"401\"} 4"),
        "{m}"
    );
    s.stop().await;
}

/// Issue case 7: listening beyond loopback without a key is said loudly, also in `/healthz`.
#[tokio::test]
async fn listening_beyond_loopback_without_a_key_is_a_warning_in_healthz() {
    let public: SocketAddr = "0.0.0.0:8000".parse().unwrap();
    let w = exposure_warning(&public, false).unwrap();
    assert!(
        w.contains("without authentication") && w.contains("--api-key-env"),
        "{w}"
    );
    assert_eq!(exposure_warning(&public, true), None);
    assert_eq!(
        exposure_warning(&"127.0.0.1:8000".parse().unwrap(), false),
        None
    );
    assert_eq!(
        exposure_warning(&"[::1]:8000".parse().unwrap(), false),
        None
    );
    assert!(exposure_warning(&"[::]:8000".parse().unwrap(), false).is_some());
    let opts = ServerOptions {
        warning: Some(w.clone()),
        ..ServerOptions::default()
    };
    let s = Running::start(opts, Some(Duration::ZERO)).await;
    let h: Value = reqwest::get(s.url("/healthz"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(h["warning"], Value::String(w));
    assert_eq!(h["auth"], false);
    s.stop().await;
}

/// Issue case 5: a stop waited forever on a client that had sent half a request. Now such a
/// connection (no request in progress) is closed at once, a request in progress finishes, and
/// one still running at the deadline is cut and reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_closes_idle_connections_at_once_and_cuts_requests_at_the_deadline() {
    let opts = ServerOptions {
        shutdown_timeout: Duration::from_millis(300),
        ..ServerOptions::default()
    };
    let s = Running::start(opts, None).await;
    let mut half = TcpStream::connect(s.addr).unwrap();
    half.write_all(b"POST /v1/reward HTTP/1.1\r\nhost: x\r\n")
        .unwrap();
    let url = s.url("/v1/reward");
    let stuck = tokio::spawn(async move {
        let body = json!({"turns": [{"context": dialogue("stuck"), "responses": ["score:1"]}]});
        reqwest::Client::new().post(url).json(&body).send().await
    });
    for _ in 0..1000 {
        if s.stub.count(Role::Judge) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stopped = s.stop().await;
    assert_eq!(stopped.requests_cut, vec![("/v1/reward", 1)]);
    assert_eq!(stopped.connections_cut, 1);
    let line = stopped.summary(Duration::from_millis(300));
    assert!(
        line.contains("cut 1 request(s) in flight (/v1/reward: 1) on 1 connection(s)"),
        "{line}"
    );
    assert!(
        stuck.await.unwrap().is_err(),
        "the cut request gets no answer"
    );
    assert!(closed_within(&mut half, Duration::from_secs(5)).is_some());
}

/// Issue case 3's other half: `/healthz` keeps answering while a large request runs. The
/// request has 4,096 responses in 256 turns and a judge that takes 20 ms per call, so the
/// loop is busy for seconds (32 judge calls at a time) while a thread of its own asks
/// /healthz every 20 ms over a fresh raw connection (so the probe does not queue behind the
/// test's own client and stub, which share the server's runtime here). The stated bound is
/// 100 ms (docs/RELIABILITY.md, with the command that measures it on a quiet machine); this
/// test asserts 5 s, which only a real stall (the old behaviour: a timeout) breaks on a
/// shared, loaded machine, and prints what it saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_keeps_answering_while_a_large_request_runs() {
    let s = Running::start(ServerOptions::default(), Some(Duration::from_millis(20))).await;
    let prompts: Vec<String> = (0..4096).map(|i| format!("prompt {} ", i / 16)).collect();
    let query: Vec<String> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| format!("{p}score:{} variant {i}", i % 6))
        .collect();
    let body = json!({"query": query, "prompts": prompts});
    let url = s.url("/get_reward");
    let started = Instant::now();
    let big = tokio::spawn(async move { post(&url, &body).await });
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (addr, stop) = (s.addr, Arc::clone(&done));
    let probe = std::thread::spawn(move || {
        let (mut worst, mut n) = (Duration::ZERO, 0u32);
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            let t = Instant::now();
            let mut c = TcpStream::connect(addr).unwrap();
            c.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                .unwrap();
            let answer =
                closed_within(&mut c, Duration::from_secs(30)).expect("/healthz stalled for 30 s");
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
            worst = worst.max(t.elapsed());
            n += 1;
            std::thread::sleep(Duration::from_millis(20));
        }
        (worst, n)
    });
    let (status, v) = big.await.unwrap();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let (worst, n) = tokio::task::spawn_blocking(move || probe.join().unwrap())
        .await
        .unwrap();
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["rewards"].as_array().unwrap().len(), 4096);
    eprintln!(
        "healthz under load: {n} probes over {:.1} s, slowest {:.1} ms",
        started.elapsed().as_secs_f64(),
        worst.as_secs_f64() * 1e3
    );
    assert!(n > 3, "the large request ran too briefly to test anything");
    assert!(worst < Duration::from_secs(5), "/healthz took {worst:?}");
    s.stop().await;
}
