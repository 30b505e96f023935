//! A fleet: three `care serve` processes on one real `redis-server` (a free loopback port; the
//! test is skipped with a line on stderr where the binary is absent, and fails under
//! `CARE_REQUIRE_REDIS=1`, which CI sets), with the stub LLM in this process.
//!
//! The samples of each group are sent one request each, round-robin across the replicas and
//! all at once (as a load balancer in front of per-sample reward calls spreads them). The
//! generator stub writes a different rubric on every call (its `weight_rationale` names the
//! call), so a second generator call for one dialogue would show as a second rubric.
//!
//! Then the chaos run: one replica is killed (SIGKILL) and Redis is killed and restarted while
//! requests are in flight. The client acts as the load balancer: a request that finds no
//! replica goes to the next one, and a 503 is asked again after its `Retry-After`. Every
//! request must be answered, each dialogue with one rubric, every request sent again later
//! answered identically, and the stub's calls must stay within the bound of
//! docs/REWARD_LOOP.md ("Deploying a fleet").
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use care_loop::llm::Role;
use care_loop::redis_server::RedisServer;
use care_loop::stub::{PAPER_RUBRIC, Stub, StubReply, StubRequest, judge_answer};
use serde_json::{Value, json};

const REPLICAS: usize = 3;
const SAMPLES: usize = 6;

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("care-fleet-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

struct Replica {
    child: Child,
    url: String,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_replica(config: &Path, cache: &str) -> Replica {
    let child = Command::new(env!("CARGO_BIN_EXE_care"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--cache",
            cache,
            "--config",
        ])
        .arg(config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Owned at once: killed and waited for on every path, panics included.
    let mut replica = Replica {
        child,
        url: String::new(),
    };
    let mut err = BufReader::new(replica.child.stderr.take().unwrap());
    let mut l = String::new();
    loop {
        l.clear();
        assert!(
            err.read_line(&mut l).unwrap() > 0,
            "care serve exited before listening"
        );
        if let Some(rest) = l.split("listening on ").nth(1) {
            replica.url = rest.split_whitespace().next().unwrap().to_owned();
            std::thread::spawn(move || {
                let mut sink = String::new();
                let _ = err.read_to_string(&mut sink);
            });
            return replica;
        }
    }
}

/// The stub: the generator's `n`-th call answers the paper's rubric with "call n" in its first
/// `weight_rationale` when `varying`, else the same rubric every time; the judge scores by the
/// response's `score:N`.
async fn llm(varying: bool) -> Stub {
    let generator_calls = Arc::new(AtomicUsize::new(0));
    Stub::start(move |req: &StubRequest, _| match req.role {
        Role::Generator => {
            let n = generator_calls.fetch_add(1, Ordering::SeqCst);
            let rubric = if varying {
                PAPER_RUBRIC.replacen(
                    "This is the highest-weighted category",
                    &format!("Generator call {n}: this is the highest-weighted category"),
                    1,
                )
            } else {
                PAPER_RUBRIC.to_owned()
            };
            StubReply::Delayed(rubric, Duration::from_millis(150))
        }
        Role::Judge => {
            let n: u8 = req
                .judged_response()
                .and_then(|r| r.rsplit("score:").next())
                .and_then(|s| s.parse().ok())
                .unwrap();
            StubReply::Delayed(judge_answer(PAPER_RUBRIC, n), Duration::from_millis(40))
        }
    })
    .await
    .unwrap()
}

fn config(dir: &Path, stub: &Stub, when_down: &str) -> PathBuf {
    let ep = |model: &str| {
        json!({"base_url": stub.base_url(), "model": model, "timeout_secs": 10.0,
               "backoff_initial_secs": 0.001, "backoff_max_secs": 0.002})
    };
    let path = dir.join("loop.json");
    let cfg = json!({
        "generator": ep("g"), "judge": ep("j"),
        "cache": {"lease_secs": 1.0, "probe_secs": 0.1, "op_timeout_secs": 0.3,
                  "when_down": when_down},
    });
    std::fs::write(&path, cfg.to_string()).unwrap();
    path
}

/// Sample `j` of group `g`: its id, its request body and its expected reward. Sample 5 repeats
/// sample 0's response (one judge call for both).
fn sample(run: &str, g: usize, j: usize) -> (String, Value, f64) {
    let k = if j == SAMPLES - 1 { 0 } else { j };
    let score = (g + k) % 6;
    let body = json!({"turns": [{
        "id": format!("{run}-g{g}-s{j}"),
        "context": [{"role": "user", "content": format!("{run} dialogue {g}: I failed my driving test again.")}],
        "responses": [format!("{run} g{g} r{k} score:{score}")],
    }]});
    (format!("{run}-g{g}-s{j}"), body, score as f64 / 5.0)
}

/// What a reply says: the rubric's first rationale (which generator call wrote it) and the
/// reward.
fn answer(v: &Value) -> (String, f64) {
    let r = &v["results"][0];
    (
        r["rubric"]["categories"][0]["weight_rationale"]
            .as_str()
            .unwrap()
            .to_owned(),
        r["rewards"][0].as_f64().unwrap(),
    )
}

#[derive(Default, Debug)]
struct Seen {
    refused_503: usize,
    no_replica: usize,
}

/// Sends `body` as a load balancer would: first to replica `first`, then to the next one when
/// a replica does not answer; a 503 is asked again after its Retry-After (bounded).
async fn send(
    c: &reqwest::Client,
    urls: &[String],
    first: usize,
    body: &Value,
    seen: &Arc<std::sync::Mutex<Seen>>,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut i = first;
    loop {
        assert!(Instant::now() < deadline, "no answer within 30 s: {body}");
        let url = format!("{}/v1/reward", urls[i % urls.len()]);
        match c.post(&url).json(body).send().await {
            Err(_) => {
                seen.lock().unwrap().no_replica += 1;
                i += 1;
            }
            Ok(r) if r.status() == 503 => {
                let after: u64 = r.headers()["retry-after"]
                    .to_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                let v: Value = r.json().await.unwrap();
                assert_eq!(v["error"]["code"], "cache_unavailable", "{v}");
                seen.lock().unwrap().refused_503 += 1;
                // Retry-After says 1 s; a load balancer may try another replica sooner.
                assert!(after >= 1);
                tokio::time::sleep(Duration::from_millis(100)).await;
                i += 1;
            }
            Ok(r) => {
                assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
                return r.json().await.unwrap();
            }
        }
    }
}

async fn health(c: &reqwest::Client, url: &str) -> Value {
    c.get(format!("{url}/healthz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_make_one_generator_call_per_dialogue_and_one_judge_call_per_response() {
    let Some(redis) = RedisServer::start("fleet: three replicas, one call per dialogue").unwrap()
    else {
        return;
    };
    let dir = tempdir("healthy");
    let stub = llm(true).await;
    let cfg = config(&dir, &stub, "serve");
    let replicas: Vec<Replica> = (0..REPLICAS)
        .map(|_| start_replica(&cfg, &redis.url()))
        .collect();
    let urls: Vec<String> = replicas.iter().map(|r| r.url.clone()).collect();
    let c = reqwest::Client::new();
    for u in &urls {
        let h = health(&c, u).await;
        assert_eq!(
            (&h["cache_backend"], &h["cache_state"]),
            (&json!("redis"), &json!("ok")),
            "{h}"
        );
    }
    let groups = 6;
    let seen = Arc::new(std::sync::Mutex::new(Seen::default()));
    let mut tasks = Vec::new();
    for g in 0..groups {
        for j in 0..SAMPLES {
            let (id, body, want) = sample("h", g, j);
            let (c, urls, seen) = (c.clone(), urls.clone(), Arc::clone(&seen));
            let first = g * SAMPLES + j;
            tasks.push(tokio::spawn(async move {
                let v = send(&c, &urls, first, &body, &seen).await;
                (id, g, want, answer(&v))
            }));
        }
    }
    let mut rubric_of: HashMap<usize, String> = HashMap::new();
    for t in tasks {
        let (id, g, want, (rubric, reward)) = t.await.unwrap();
        assert_eq!(reward, want, "{id}");
        let first = rubric_of.entry(g).or_insert_with(|| rubric.clone());
        assert_eq!(*first, rubric, "{id}: a second rubric for dialogue {g}");
    }
    let s = seen.lock().unwrap();
    assert_eq!((s.refused_503, s.no_replica), (0, 0));
    // Fleet-wide: one generator call per dialogue, one judge call per distinct response.
    assert_eq!(stub.count(Role::Generator), groups);
    let judged: Vec<String> = stub
        .calls()
        .iter()
        .filter_map(|r| r.judged_response().map(str::to_owned))
        .collect();
    assert_eq!(judged.len(), groups * (SAMPLES - 1));
    assert_eq!(judged.iter().collect::<HashSet<_>>().len(), judged.len());
    drop(replicas);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The chaos run of `when_down`: `refuse` with a generator that varies per call (a second
/// call for a dialogue would be a second rubric), or `serve` with one that does not (a replica
/// serving without the store makes its own calls: only the call counts can tell).
async fn chaos(when_down: &str) {
    let varying = when_down == "refuse";
    let who = format!("fleet: chaos under when_down {when_down}");
    let Some(mut redis) = RedisServer::start(&who).unwrap() else {
        return;
    };
    let dir = tempdir(&format!("chaos-{when_down}"));
    let stub = llm(varying).await;
    let cfg = config(&dir, &stub, when_down);
    let mut replicas: Vec<Option<Replica>> = (0..REPLICAS)
        .map(|_| Some(start_replica(&cfg, &redis.url())))
        .collect();
    let urls: Vec<String> = replicas
        .iter()
        .map(|r| r.as_ref().unwrap().url.clone())
        .collect();
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let groups = 8;
    let seen = Arc::new(std::sync::Mutex::new(Seen::default()));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for g in 0..groups {
        for j in 0..SAMPLES {
            let (id, body, want) = sample(when_down, g, j);
            let (c, urls, seen) = (c.clone(), urls.clone(), Arc::clone(&seen));
            let first = g * SAMPLES + j;
            // Spread over 1.2 s, so requests are in flight through every fault below.
            let at = Duration::from_millis(25 * first as u64);
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep(at).await;
                let v = send(&c, &urls, first, &body, &seen).await;
                (id, g, first, body, want, answer(&v))
            }));
        }
    }
    // The faults: replica 2 dies at 0.3 s; Redis crashes at 0.5 s and is back at 0.9 s.
    tokio::time::sleep(Duration::from_millis(300).saturating_sub(started.elapsed())).await;
    replicas[2] = None;
    tokio::time::sleep(Duration::from_millis(500).saturating_sub(started.elapsed())).await;
    redis.kill();
    tokio::time::sleep(Duration::from_millis(900).saturating_sub(started.elapsed())).await;
    let mut redis = tokio::task::spawn_blocking(move || {
        redis.restart().unwrap();
        redis
    })
    .await
    .unwrap();

    let mut first_answers = Vec::new();
    let mut rubric_of: HashMap<usize, String> = HashMap::new();
    for t in tasks {
        let (id, g, first, body, want, (rubric, reward)) = t.await.unwrap();
        assert_eq!(reward, want, "{id}");
        let r0 = rubric_of.entry(g).or_insert_with(|| rubric.clone());
        assert_eq!(*r0, rubric, "{id}: a second rubric for dialogue {g}");
        first_answers.push((id, first, body, (rubric, reward)));
    }
    // Once the live replicas use the store again, every request asked again gets the same
    // answer (from the store now).
    let live = &urls[..2];
    let deadline = Instant::now() + Duration::from_secs(10);
    for u in live {
        while health(&c, u).await["cache_state"] != "ok" {
            assert!(Instant::now() < deadline, "{u} never used the store again");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let calls_before_resend = stub.calls().len();
    for (id, first, body, was) in &first_answers {
        let v = send(&c, live, *first, body, &seen).await;
        assert_eq!(answer(&v), *was, "{id} answered twice differently");
        assert_eq!(v["results"][0]["calls"]["cached"], 2, "{id}: {v}");
    }
    assert_eq!(stub.calls().len(), calls_before_resend);

    // The bound (docs/REWARD_LOOP.md): one call per distinct call, plus one for a replica that
    // died making it, plus one for a holder whose write met the outage; under `serve`, plus
    // one per replica during the outage.
    let bound = if when_down == "serve" {
        2 + REPLICAS
    } else {
        3
    };
    let mut per_key: HashMap<String, usize> = HashMap::new();
    for r in stub.calls() {
        let key = match r.role {
            Role::Generator => r.transcript().unwrap().to_owned(),
            Role::Judge => r.judged_response().unwrap().to_owned(),
        };
        *per_key.entry(key).or_default() += 1;
    }
    assert_eq!(per_key.len(), groups * (1 + SAMPLES - 1));
    let worst = per_key.values().copied().max().unwrap();
    let extra: usize = per_key.values().map(|n| n - 1).sum();
    let s = seen.lock().unwrap();
    eprintln!(
        "fleet chaos ({when_down}): {} requests, {} refused with 503, {} sent to a dead replica, {} calls for {} distinct ({} extra, at most {} for one)",
        first_answers.len(),
        s.refused_503,
        s.no_replica,
        stub.calls().len(),
        per_key.len(),
        extra,
        worst
    );
    assert!(worst <= bound, "{per_key:?}");
    if when_down == "serve" {
        assert_eq!(s.refused_503, 0, "serve never refuses");
    }
    drop(replicas);
    redis.kill();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_and_redis_restarted_mid_run_under_refuse_never_answer_twice_differently()
{
    chaos("refuse").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_and_redis_restarted_mid_run_under_serve_answer_every_request() {
    chaos("serve").await;
}
