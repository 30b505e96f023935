//! The shared cache on a real `redis-server` (started on a free loopback port; skipped with a
//! line on stderr where it is not installed, an error under `CARE_REQUIRE_REDIS=1`), with
//! several engines in one process standing for replicas, each with its own connections:
//! single flight across them, written once, a dead holder's lease taken over, degraded mode
//! while the store is down and its recovery, and a store with another schema refused.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use care_loop::cache::Cache;
use care_loop::config::CacheConfig;
use care_loop::engine::{TurnInput, TurnResult, response_status, rubric_status};
use care_loop::llm::{ChatMessage, Role};
use care_loop::redis_server::RedisServer;
use care_loop::stub::{PAPER_RUBRIC, Stub, StubReply, judge_answer};
use care_loop::{BackendKind, EndpointConfig, Engine, LoopConfig, Metrics};

fn redis(who: &str) -> Option<RedisServer> {
    RedisServer::start(who).unwrap()
}

/// Generator after `gen_ms`; judge by the response's `score:N`, after `judge_ms`.
async fn llm(gen_ms: u64, judge_ms: u64) -> Stub {
    Stub::start(move |req, _| match req.role {
        Role::Generator => StubReply::Delayed(PAPER_RUBRIC.into(), Duration::from_millis(gen_ms)),
        Role::Judge => {
            let n: u8 = req
                .judged_response()
                .and_then(|r| r.rsplit("score:").next())
                .and_then(|s| s.parse().ok())
                .unwrap();
            StubReply::Delayed(
                judge_answer(PAPER_RUBRIC, n),
                Duration::from_millis(judge_ms),
            )
        }
    })
    .await
    .unwrap()
}

fn cache_cfg() -> CacheConfig {
    CacheConfig {
        lease_secs: 0.6,
        probe_secs: 0.1,
        op_timeout_secs: 0.5,
        pool_size: 2,
        ..CacheConfig::default()
    }
}

/// One replica: its own engine, metrics and connections to the store.
async fn replica(stub: &Stub, url: &str) -> (Arc<Engine>, Arc<Metrics>) {
    let ep = |m: &str| EndpointConfig {
        timeout_secs: 5.0,
        ..EndpointConfig::new(stub.base_url(), m)
    };
    let cfg = LoopConfig {
        generator: ep("g"),
        judge: ep("j").into(),
        cache: cache_cfg(),
        ..LoopConfig::default()
    };
    let cache = Cache::connect_redis(url, &cfg.cache).await.unwrap();
    let metrics = Arc::new(Metrics::new());
    let e = Engine::new(&cfg, BackendKind::Http, Some(cache), Arc::clone(&metrics)).unwrap();
    (Arc::new(e), metrics)
}

fn turn(id: &str, scores: &[u8]) -> TurnInput {
    TurnInput {
        id: Some(id.into()),
        context: vec![ChatMessage::new("user", format!("{id}: I failed my exam."))],
        responses: scores
            .iter()
            .enumerate()
            .map(|(j, s)| format!("{id}-{j} score:{s}"))
            .collect(),
        gold: None,
        ..TurnInput::default()
    }
}

fn metric(m: &Metrics, prefix: &str) -> f64 {
    m.render()
        .lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .map_or(0.0, |v| v.parse().unwrap())
}

fn assert_ok(r: &TurnResult, scores: &[u8]) {
    assert_eq!(r.rubric_status, rubric_status::OK);
    let want: Vec<Option<f64>> = scores.iter().map(|s| Some(f64::from(*s) / 5.0)).collect();
    assert_eq!(r.rewards, want);
    assert!(r.responses.iter().all(|x| x.status == response_status::OK));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_make_each_call_once_and_answer_alike() {
    let Some(server) = redis("three_replicas_make_each_call_once_and_answer_alike") else {
        return;
    };
    let stub = llm(150, 50).await;
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(replica(&stub, &server.url()).await);
    }
    // One group split across the replicas, all at once: each replica has two of the six
    // responses (one of them, "t-dup", is judged on two replicas).
    let scores = [5u8, 0, 3, 4, 1, 2];
    let mut tasks = Vec::new();
    for (i, (e, _)) in replicas.iter().enumerate() {
        let mut t = turn("t", &scores);
        t.responses = vec![t.responses[2 * i].clone(), t.responses[2 * i + 1].clone()];
        if i == 2 {
            t.responses.push("t-0 score:5".into());
        }
        let e = Arc::clone(e);
        tasks.push(tokio::spawn(async move { e.run_turn(t).await.unwrap() }));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    // One generator call for the dialogue, one judge call per distinct response, fleet-wide.
    assert_eq!(stub.count(Role::Generator), 1);
    assert_eq!(stub.count(Role::Judge), 6);
    // The same rubric in every reply; the rewards of the split group are the whole group's.
    for r in &results {
        assert_eq!(r.rubric, results[0].rubric);
        assert_eq!(r.rubric_status, rubric_status::OK);
    }
    let got: Vec<Option<f64>> = results.iter().flat_map(|r| r.rewards.clone()).collect();
    assert_eq!(got, [1.0, 0.0, 0.6, 0.8, 0.2, 0.4, 1.0].map(Some).to_vec());
    // Two replicas waited for the rubric the third one made.
    let waited: f64 = replicas
        .iter()
        .map(|(_, m)| {
            metric(
                m,
                "care_cache_waits_total{endpoint=\"generator\",outcome=\"result\"}",
            )
        })
        .sum();
    assert_eq!(waited, 2.0);
    // Written once: one key per call, with the configured TTL; no lease left behind.
    let mut c = server.connection().unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg("care:call:*").query(&mut c).unwrap();
    assert_eq!(keys.len(), 7);
    let ttl: i64 = redis::cmd("TTL").arg(&keys[0]).query(&mut c).unwrap();
    assert!(ttl > 7 * 24 * 3600 - 60 && ttl <= 7 * 24 * 3600, "{ttl}");
    let leases: Vec<String> = redis::cmd("KEYS")
        .arg("care:lease:*")
        .query(&mut c)
        .unwrap();
    assert!(leases.is_empty(), "{leases:?}");
    // A fresh replica (a restart) starts warm.
    let (fresh, _) = replica(&stub, &server.url()).await;
    let r = fresh.run_turn(turn("t", &scores)).await.unwrap();
    assert_ok(&r, &scores);
    assert_eq!(
        (r.calls.generator, r.calls.judge, r.calls.cached),
        (0, 0, 7)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_holders_lease_is_taken_over_when_it_expires() {
    let Some(server) = redis("a_dead_holders_lease_is_taken_over_when_it_expires") else {
        return;
    };
    // The generator answers slowly for the first replica only: long enough to see its lease.
    let stub = llm(0, 0).await;
    let slow = Stub::start(|_, _| StubReply::Stall).await.unwrap();
    let (a, _) = replica(&slow, &server.url()).await;
    let task = tokio::spawn(async move { a.run_turn(turn("d", &[4])).await });
    let mut c = server.connection().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let lease = loop {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("care:lease:*")
            .query(&mut c)
            .unwrap();
        if let Some(k) = keys.into_iter().next() {
            break k;
        }
        assert!(Instant::now() < deadline, "replica a never took the lease");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    // Replica a dies holding it: its token is gone (no renewal, no release will match) and the
    // lease runs out 0.5 s from now.
    let _: () = redis::cmd("SET")
        .arg(&lease)
        .arg("a-dead-replica")
        .arg("PX")
        .arg(500)
        .query(&mut c)
        .unwrap();
    task.abort();
    let started = Instant::now();
    let (b, mb) = replica(&stub, &server.url()).await;
    let r = b.run_turn(turn("d", &[4])).await.unwrap();
    assert_ok(&r, &[4]);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(400),
        "b waited for the lease: {took:?}"
    );
    assert_eq!(
        metric(
            &mb,
            "care_cache_waits_total{endpoint=\"generator\",outcome=\"lease\"}"
        ),
        1.0
    );
    assert_eq!(stub.count(Role::Generator), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_store_degrades_then_recovers_and_gets_the_calls_made_meanwhile() {
    let Some(mut server) =
        redis("an_unreachable_store_degrades_then_recovers_and_gets_the_calls_made_meanwhile")
    else {
        return;
    };
    let stub = llm(0, 0).await;
    let (e, m) = replica(&stub, &server.url()).await;
    let cache = || e.cache().unwrap();
    let r = e.run_turn(turn("before", &[1, 2])).await.unwrap();
    assert_ok(&r, &[1, 2]);
    assert_eq!(cache().status().state, "ok");

    server.kill();
    // Still served, without the store; it says so.
    let r = e.run_turn(turn("during", &[3, 4])).await.unwrap();
    assert_ok(&r, &[3, 4]);
    assert_eq!(cache().status().state, "degraded");
    assert_eq!(metric(&m, "care_cache_degraded "), 1.0);
    let calls = stub.calls().len();
    // The same turn again: from memory, no LLM call.
    let r = e.run_turn(turn("during", &[3, 4])).await.unwrap();
    assert_ok(&r, &[3, 4]);
    assert_eq!(r.calls.cached, 3);
    assert_eq!(stub.calls().len(), calls);
    // What was stored before the outage is not reachable now: asked again.
    let r = e.run_turn(turn("before", &[1, 2])).await.unwrap();
    assert_ok(&r, &[1, 2]);
    assert_eq!(r.calls.cached, 0);

    server.restart().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while cache().status().state != "ok" {
        assert!(Instant::now() < deadline, "the cache never came back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(metric(&m, "care_cache_degraded "), 0.0);
    // The store kept what it had (append-only file) and got the calls made meanwhile.
    assert_eq!(cache().len().await.unwrap(), 6);
    let (other, _) = replica(&stub, &server.url()).await;
    let r = other.run_turn(turn("during", &[3, 4])).await.unwrap();
    assert_ok(&r, &[3, 4]);
    assert_eq!(r.calls.cached, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_with_another_schema_is_refused_and_one_that_is_down_is_not() {
    let Some(server) = redis("a_store_with_another_schema_is_refused_and_one_that_is_down_is_not")
    else {
        return;
    };
    let mut c = server.connection().unwrap();
    let _: () = redis::cmd("SET")
        .arg("care:schema")
        .arg(99)
        .query(&mut c)
        .unwrap();
    let err = Cache::connect_redis(&server.url(), &cache_cfg())
        .await
        .unwrap_err();
    assert!(err.contains("care:schema") && err.contains("99"), "{err}");
    // Another prefix is another namespace.
    let ok = CacheConfig {
        key_prefix: "run2:".into(),
        ..cache_cfg()
    };
    let cache = Cache::connect_redis(&server.url(), &ok).await.unwrap();
    assert_eq!(cache.status().state, "ok");
    // Nothing listens: the cache starts degraded instead of failing.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("redis://{}/0", l.local_addr().unwrap())
    };
    let cache = Cache::connect_redis(&dead, &cache_cfg()).await.unwrap();
    assert_eq!(cache.status().state, "degraded");
    let m = Arc::new(Metrics::new());
    cache.bind_metrics(Arc::clone(&m));
    assert_eq!(metric(&m, "care_cache_degraded "), 1.0);
    let bad = CacheConfig {
        lease_secs: 0.0,
        ..cache_cfg()
    };
    let err = Cache::connect_redis(&server.url(), &bad).await.unwrap_err();
    assert!(err.contains("cache.lease_secs"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_when_down_refuse_an_unreachable_store_refuses_the_turn() {
    let Some(mut server) = redis("under_when_down_refuse_an_unreachable_store_refuses_the_turn")
    else {
        return;
    };
    let stub = llm(0, 0).await;
    let ep = |m: &str| EndpointConfig::new(stub.base_url(), m);
    let cfg = LoopConfig {
        generator: ep("g"),
        judge: ep("j").into(),
        cache: CacheConfig {
            when_down: "refuse".into(),
            ..cache_cfg()
        },
        ..LoopConfig::default()
    };
    let cache = Cache::connect_redis(&server.url(), &cfg.cache)
        .await
        .unwrap();
    let e = Arc::new(
        Engine::new(
            &cfg,
            BackendKind::Http,
            Some(cache),
            Arc::new(Metrics::new()),
        )
        .unwrap(),
    );
    let r = e.run_turn(turn("a", &[2])).await.unwrap();
    assert_ok(&r, &[2]);
    server.kill();
    let calls = stub.calls().len();
    let err = e.run_turn(turn("b", &[3])).await.unwrap_err();
    assert_eq!(err.code, care_loop::cache::CACHE_UNAVAILABLE);
    assert!(
        err.message.contains("when_down is refuse"),
        "{}",
        err.message
    );
    // Refused before any LLM call (the lookup found the store down).
    assert_eq!(stub.calls().len(), calls);
    server.restart().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while e.cache().unwrap().status().state != "ok" {
        assert!(Instant::now() < deadline, "the cache never came back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = e.run_turn(turn("b", &[3])).await.unwrap();
    assert_ok(&r, &[3]);
    let bad = CacheConfig {
        when_down: "wait".into(),
        ..cache_cfg()
    };
    assert!(bad.check().unwrap_err().contains("serve or refuse"));
}
