//! Bounded load test of the reward server on loopback.
//!
//! `C` concurrent trainer clients send `R` OpenRLHF `/get_reward` requests in total (each a
//! GRPO group of `G` responses to its own prompt) to `--replicas` servers of `care serve` (in
//! this process, each with its own engine, LLM clients and cache connections; requests go to
//! them in turn), whose LLMs are the stub (the test double) with a fixed latency per call. The
//! cache is a SQLite file per replica (`--cache sqlite`, the default), one Redis shared by all
//! (`--cache redis`: a `redis-server` started on a free port without persistence, or
//! `--redis-url`), or none.
//! Checks that every request is answered once with the right rewards, that the stub saw
//! exactly one generator call per group and one judge call per response (nothing lost, nothing
//! duplicated), and prints latency percentiles, throughput (in all and per replica), and the
//! process CPU time per reward (servers, stub and clients together: an upper bound on care's
//! own overhead). With `--generator-ms 0 --judge-ms 0` (an instant stub) the latency of a
//! group is what the loop adds to the LLMs.
//!
//! ```sh
//! cargo run --release -p care-loop --example loadtest -- --clients 64 --requests 2000 \
//!     --group 8 --generator-ms 100 --judge-ms 50
//! cargo run --release -p care-loop --example loadtest -- --clients 1 --requests 2000 \
//!     --generator-ms 0 --judge-ms 0 --replicas 3 --cache redis
//! ```
//!
//! Bounded: it stops issuing requests after `--max-seconds` (default 120) whatever is left.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use care_loop::config::CacheConfig;
use care_loop::llm::Role;
use care_loop::redis_server::RedisServer;
use care_loop::server::{ServerOptions, router, serve};
use care_loop::stub::{PAPER_RUBRIC, Stub, StubReply, judge_answer};
use care_loop::{BackendKind, Cache, EndpointConfig, Engine, LoopConfig, Metrics};
use serde_json::{Value, json};

struct Args {
    clients: usize,
    requests: usize,
    group: usize,
    generator_ms: u64,
    judge_ms: u64,
    max_seconds: u64,
    /// `sqlite`, `redis` or `none`.
    cache: String,
    redis_url: Option<String>,
    replicas: usize,
    /// Servers in other processes (`care serve`): the clients go to them instead of to servers
    /// started here.
    servers: Vec<String>,
    /// Where the stub listens (the external servers' `base_url` points there).
    stub_listen: String,
}

fn parse() -> Args {
    let mut a = Args {
        clients: 32,
        requests: 500,
        group: 8,
        generator_ms: 100,
        judge_ms: 50,
        max_seconds: 120,
        cache: "sqlite".to_owned(),
        redis_url: None,
        replicas: 1,
        servers: Vec::new(),
        stub_listen: "127.0.0.1:0".to_owned(),
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let v = || {
            argv.get(i + 1)
                .expect("a value after the flag")
                .parse::<u64>()
                .expect("a number")
        };
        match argv[i].as_str() {
            "--clients" => a.clients = v() as usize,
            "--requests" => a.requests = v() as usize,
            "--group" => a.group = v() as usize,
            "--generator-ms" => a.generator_ms = v(),
            "--judge-ms" => a.judge_ms = v(),
            "--max-seconds" => a.max_seconds = v(),
            "--replicas" => a.replicas = v().max(1) as usize,
            "--no-cache" => {
                a.cache = "none".to_owned();
                i += 1;
                continue;
            }
            "--cache" => {
                a.cache = argv.get(i + 1).expect("sqlite, redis or none").clone();
                assert!(
                    matches!(a.cache.as_str(), "sqlite" | "redis" | "none"),
                    "--cache sqlite|redis|none"
                );
            }
            "--servers" => {
                a.servers = argv
                    .get(i + 1)
                    .expect("base URLs of care serve, comma-separated")
                    .split(',')
                    .map(|u| u.trim_end_matches('/').to_owned())
                    .collect();
            }
            "--stub-listen" => {
                a.stub_listen = argv.get(i + 1).expect("an address").clone();
            }
            "--redis-url" => {
                a.redis_url = Some(argv.get(i + 1).expect("a redis:// URL").clone());
            }
            other => panic!("unknown flag {other}"),
        }
        i += 2;
    }
    a
}

fn cpu_seconds() -> f64 {
    // utime + stime of this process, from /proc (Linux); 0 elsewhere.
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |k: usize| f.get(k).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    // Fields 14 and 15 of stat are 11 and 12 after the ")".
    (ticks(11) + ticks(12)) / 100.0
}

#[tokio::main]
async fn main() {
    let a = parse();
    let (gen_d, judge_d) = (
        Duration::from_millis(a.generator_ms),
        Duration::from_millis(a.judge_ms),
    );
    // An instant stub answers without touching the timer.
    let reply = |text: String, d: Duration| {
        if d.is_zero() {
            StubReply::Content(text)
        } else {
            StubReply::Delayed(text, d)
        }
    };
    // The judge's answers, made once: the test double's own cost is not the loop's.
    let answers: Vec<String> = (0..=5).map(|n| judge_answer(PAPER_RUBRIC, n)).collect();
    let stub = Stub::start_on(&a.stub_listen, move |req, _| match req.role {
        Role::Generator => reply(PAPER_RUBRIC.into(), gen_d),
        Role::Judge => {
            let r = req.judged_response().unwrap_or("");
            let n: u8 = r
                .rsplit("score:")
                .next()
                .and_then(|s| s.parse().ok())
                .unwrap_or(9);
            let answer = answers
                .get(usize::from(n))
                .cloned()
                .unwrap_or_else(|| judge_answer(PAPER_RUBRIC, n));
            reply(answer, judge_d)
        }
    })
    .await
    .unwrap();
    let ep = |m: &str| EndpointConfig {
        max_concurrency: 1024,
        timeout_secs: 60.0,
        ..EndpointConfig::new(stub.base_url(), m)
    };
    let cfg = LoopConfig {
        generator: ep("g"),
        judge: ep("j").into(),
        ..LoopConfig::default()
    };
    let dir = std::env::temp_dir().join(format!("care-loadtest-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let redis = match (a.cache.as_str(), &a.redis_url) {
        ("redis", None) => Some(
            // No append-only file: the load test measures the loop, not the disk.
            RedisServer::start_with("loadtest", false)
                .unwrap()
                .expect("--cache redis needs redis-server installed, or --redis-url"),
        ),
        _ => None,
    };
    let redis_url = a
        .redis_url
        .clone()
        .or_else(|| redis.as_ref().map(RedisServer::url));
    let mut urls = Vec::new();
    let mut stops = Vec::new();
    let mut servers = Vec::new();
    eprintln!("stub LLM at {}", stub.base_url());
    for s in &a.servers {
        // An external `care serve`: wait until it answers.
        let c = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(a.max_seconds);
        while c.get(format!("{s}/healthz")).send().await.is_err() {
            assert!(Instant::now() < deadline, "{s} never answered /healthz");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        urls.push(format!("{s}/get_reward"));
    }
    let replicas = if a.servers.is_empty() { a.replicas } else { 0 };
    for r in 0..replicas {
        let cache = match a.cache.as_str() {
            "sqlite" => Some(Cache::open(&dir.join(format!("replica{r}.sqlite"))).unwrap()),
            "redis" => Some(
                Cache::connect_redis(redis_url.as_deref().unwrap(), &CacheConfig::default())
                    .await
                    .unwrap(),
            ),
            _ => None,
        };
        let engine = Arc::new(
            Engine::new(&cfg, BackendKind::Http, cache, Arc::new(Metrics::new())).unwrap(),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        servers.push(tokio::spawn(serve(
            listener,
            router(engine, ServerOptions::default(), "http"),
            async move {
                let _ = stop_rx.await;
            },
        )));
        stops.push(stop_tx);
        urls.push(format!("http://{addr}/get_reward"));
    }
    let urls = Arc::new(urls);
    let next = Arc::new(AtomicUsize::new(0));
    let deadline = Instant::now() + Duration::from_secs(a.max_seconds);
    let cpu0 = cpu_seconds();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..a.clients {
        let (next, urls, group, total) =
            (Arc::clone(&next), Arc::clone(&urls), a.group, a.requests);
        tasks.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut lat = Vec::new();
            let mut done = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total || Instant::now() > deadline {
                    break;
                }
                let prompt = format!("<|user|>request {i}: I failed my driving test again.<|assistant|>");
                let scores: Vec<usize> = (0..group).map(|j| (i + j) % 6).collect();
                let query: Vec<String> = scores.iter().enumerate().map(|(j, s)| format!("{prompt}r{i}-{j} score:{s}")).collect();
                let body = json!({"query": query, "prompts": vec![&prompt; group], "labels": vec![Value::Null; group]});
                let t = Instant::now();
                let resp = client.post(&urls[i % urls.len()]).json(&body).send().await.unwrap();
                assert_eq!(resp.status(), 200);
                let v: Value = resp.json().await.unwrap();
                lat.push(t.elapsed());
                let rewards: Vec<f64> = serde_json::from_value(v["rewards"].clone()).unwrap();
                assert_eq!(rewards.len(), group);
                for (r, s) in rewards.iter().zip(&scores) {
                    assert!((r - *s as f64 / 5.0).abs() < 1e-12, "request {i}: {rewards:?} for {scores:?}");
                }
                done.push(i);
            }
            (lat, done)
        }));
    }
    let mut lat = Vec::new();
    let mut done = Vec::new();
    for t in tasks {
        let (l, d) = t.await.unwrap();
        lat.extend(l);
        done.extend(d);
    }
    let wall = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    for stop in stops {
        let _ = stop.send(());
    }
    for server in servers {
        server.await.unwrap().unwrap();
    }

    // Nothing lost or duplicated: each request answered once, each group one rubric, each
    // response one judgment.
    let n = done.len();
    let unique: HashSet<usize> = done.iter().copied().collect();
    assert_eq!(unique.len(), n, "a request was answered twice");
    let calls = stub.calls();
    let gens = calls.iter().filter(|c| c.role == Role::Generator).count();
    let judged: Vec<&str> = calls.iter().filter_map(|c| c.judged_response()).collect();
    let judged_set: HashSet<&str> = judged.iter().copied().collect();
    assert_eq!(gens, n, "one generator call per group");
    assert_eq!(judged.len(), n * a.group, "one judge call per response");
    assert_eq!(judged_set.len(), judged.len(), "no response judged twice");

    lat.sort();
    let pct = |p: f64| lat[((lat.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1000.0;
    let rewards = (n * a.group) as f64;
    let floor = (a.generator_ms + a.judge_ms) as f64;
    let (replicas, cache) = if a.servers.is_empty() {
        (a.replicas, a.cache.clone())
    } else {
        (a.servers.len(), "external".to_owned())
    };
    println!(
        "replicas={replicas} cache={cache} clients={} requests={n} group={} generator_ms={} judge_ms={}",
        a.clients, a.group, a.generator_ms, a.judge_ms
    );
    println!(
        "| replicas | cache | clients | requests x group | stub latency (gen + judge) | p50 ms | p99 ms | p50 over stub ms | p99 over stub ms | requests/s | requests/s per replica | rewards/s | CPU us / reward |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    println!(
        "| {} | {} | {} | {} x {} | {} + {} ms | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} | {:.0} | {:.0} | {:.0} |",
        replicas,
        cache,
        a.clients,
        n,
        a.group,
        a.generator_ms,
        a.judge_ms,
        pct(0.5),
        pct(0.99),
        pct(0.5) - floor,
        pct(0.99) - floor,
        n as f64 / wall,
        n as f64 / wall / replicas as f64,
        rewards / wall,
        cpu / rewards * 1e6
    );
    drop(redis);
    let _ = std::fs::remove_dir_all(&dir);
}
