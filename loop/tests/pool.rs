//! Endpoint pools over real HTTP on 127.0.0.1: a judge `base_url` that lists several stub
//! replicas. Requests go to the replica with the fewest in flight, a failing replica is ejected
//! (for its `Retry-After` when it sent one) and probed back, and the metrics carry the replica.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::sync::Arc;
use std::time::Duration;

use care_loop::engine::{TurnInput, response_status};
use care_loop::llm::{ChatMessage, Role};
use care_loop::stub::{PAPER_RUBRIC, Stub, StubReply, StubRequest, judge_answer};
use care_loop::{BackendKind, EndpointConfig, Engine, LoopConfig, Metrics};

fn judge_by_text(req: &StubRequest, delay: Duration) -> StubReply {
    let n: u8 = req
        .judged_response()
        .and_then(|r| r.rsplit("score:").next())
        .and_then(|s| s.parse().ok())
        .unwrap();
    StubReply::Delayed(judge_answer(PAPER_RUBRIC, n), delay)
}

async fn llm(delay: Duration) -> Stub {
    Stub::start(move |req, _| match req.role {
        Role::Generator => StubReply::Content(PAPER_RUBRIC.into()),
        Role::Judge => judge_by_text(req, delay),
    })
    .await
    .unwrap()
}

fn engine(generator: &Stub, judges: Vec<String>, eject_secs: f64) -> (Arc<Engine>, Arc<Metrics>) {
    let cfg = LoopConfig {
        generator: EndpointConfig::new(generator.base_url(), "g"),
        judge: EndpointConfig {
            backoff_initial_secs: 0.001,
            backoff_max_secs: 0.002,
            eject_secs,
            eject_max_secs: 60.0,
            timeout_secs: 5.0,
            ..EndpointConfig::new(judges, "j")
        }
        .into(),
        ..LoopConfig::default()
    };
    let metrics = Arc::new(Metrics::new());
    let e = Engine::new(&cfg, BackendKind::Http, None, Arc::clone(&metrics)).unwrap();
    (Arc::new(e), metrics)
}

fn turn(id: &str, n: usize) -> TurnInput {
    TurnInput {
        id: Some(id.into()),
        context: vec![ChatMessage::new("user", format!("{id}: I failed my exam."))],
        responses: (0..n)
            .map(|j| format!("{id}-{j} score:{}", j % 6))
            .collect(),
        gold: None,
        ..TurnInput::default()
    }
}

fn metric(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .map_or(0.0, |v| v.parse().unwrap())
}

#[tokio::test]
async fn concurrent_calls_spread_over_the_replicas_with_the_fewest_in_flight() {
    let g = llm(Duration::ZERO).await;
    let (a, b) = (
        llm(Duration::from_millis(50)).await,
        llm(Duration::from_millis(50)).await,
    );
    let (eng, metrics) = engine(&g, vec![a.base_url(), b.base_url()], 1.0);
    let r = eng.run_turn(turn("t", 20)).await.unwrap();
    assert!(r.responses.iter().all(|x| x.status == response_status::OK));
    // Twenty judge calls at once on one runtime thread: ten each.
    assert_eq!((a.count(Role::Judge), b.count(Role::Judge)), (10, 10));
    let text = metrics.render();
    for stub in [&a, &b] {
        let url = stub.base_url();
        assert_eq!(
            metric(
                &text,
                &format!(
                    "care_llm_endpoint_attempts_total{{endpoint=\"judge\",base_url=\"{url}\",code=\"ok\"}}"
                )
            ),
            10.0,
            "{text}"
        );
        assert_eq!(
            metric(
                &text,
                &format!("care_llm_endpoint_in_flight{{endpoint=\"judge\",base_url=\"{url}\"}}")
            ),
            0.0
        );
    }
}

#[tokio::test]
async fn retry_after_ejects_only_the_replica_that_sent_it() {
    let g = llm(Duration::ZERO).await;
    let busy = Stub::start(|_, _| StubReply::Status(429, Some(30)))
        .await
        .unwrap();
    let good = llm(Duration::ZERO).await;
    let (eng, metrics) = engine(&g, vec![busy.base_url(), good.base_url()], 1.0);
    // One call first (the first choice of a fresh pool is its first replica): the busy replica
    // answers 429 with Retry-After: 30 and the retry goes to the other one at once. (Calls
    // started at the same moment as that one would each have been spread before the answer.)
    let r = eng.run_turn(turn("first", 1)).await.unwrap();
    assert_eq!(r.responses[0].status, response_status::OK);
    assert_eq!(r.responses[0].judge_attempts, 1);
    assert_eq!(busy.calls().len(), 1);
    for i in 0..4 {
        let r = eng.run_turn(turn(&format!("t{i}"), 6)).await.unwrap();
        assert!(r.responses.iter().all(|x| x.status == response_status::OK));
    }
    // The busy replica saw one request: its Retry-After (30 s) keeps it out for the run; the
    // retry went to the other replica at once, without waiting 30 s.
    assert_eq!(busy.calls().len(), 1);
    assert_eq!(good.count(Role::Judge), 25);
    let text = metrics.render();
    let busy_url = busy.base_url();
    assert_eq!(
        metric(
            &text,
            &format!(
                "care_llm_endpoint_ejections_total{{endpoint=\"judge\",base_url=\"{busy_url}\"}}"
            )
        ),
        1.0
    );
    assert_eq!(
        metric(
            &text,
            &format!("care_llm_endpoint_up{{endpoint=\"judge\",base_url=\"{busy_url}\"}}")
        ),
        0.0
    );
    assert_eq!(
        metric(
            &text,
            &format!(
                "care_llm_endpoint_attempts_total{{endpoint=\"judge\",base_url=\"{busy_url}\",code=\"http_429\"}}"
            )
        ),
        1.0
    );
}

#[tokio::test]
async fn a_dead_replica_is_ejected_then_probed_and_ejected_for_twice_as_long() {
    let g = llm(Duration::ZERO).await;
    let good = llm(Duration::ZERO).await;
    // A replica that refuses connections: a port bound and released.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/v1", l.local_addr().unwrap())
    };
    let (eng, metrics) = engine(&g, vec![dead.clone(), good.base_url()], 1.0);
    let r = eng.run_turn(turn("first", 1)).await.unwrap();
    assert_eq!(r.responses[0].status, response_status::OK);
    let r = eng.run_turn(turn("a", 6)).await.unwrap();
    assert!(r.responses.iter().all(|x| x.status == response_status::OK));
    let refused = |text: &str| {
        metric(
            text,
            &format!(
                "care_llm_endpoint_attempts_total{{endpoint=\"judge\",base_url=\"{dead}\",code=\"connect\"}}"
            ),
        )
    };
    // Ejected after its first refusal (the group went to the live replica).
    assert_eq!(refused(&metrics.render()), 1.0);
    // After the ejection period, one request probes it; refused again, it is ejected for
    // twice as long, and nothing is lost.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let r = eng.run_turn(turn("b", 6)).await.unwrap();
    assert!(r.responses.iter().all(|x| x.status == response_status::OK));
    assert_eq!(refused(&metrics.render()), 2.0);
    let r = eng.run_turn(turn("c", 6)).await.unwrap();
    assert!(r.responses.iter().all(|x| x.status == response_status::OK));
    assert_eq!(refused(&metrics.render()), 2.0, "ejected for 2 s now");
    assert_eq!(good.count(Role::Judge), 19);
}
