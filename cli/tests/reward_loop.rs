//! `care reward` and `care serve` as processes: against the scripted backend (the README
//! quick start) and against the OpenAI-compatible stub on 127.0.0.1, including a process
//! killed mid-run and restarted.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use care_loop::llm::Role;
use care_loop::stub::{PAPER_RUBRIC, Stub, StubReply, StubRequest, judge_answer};
use serde_json::{Value, json};

const DEMO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/data/reward_demo.jsonl");

fn care() -> Command {
    Command::new(env!("CARGO_BIN_EXE_care"))
}

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("care-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn lines(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn scripted_quick_start_then_a_rerun_from_the_cache() {
    let dir = tempdir("scripted");
    let cache = dir.join("c.sqlite");
    let run = || {
        let out = care()
            .args(["reward", "--scripted", "--cache"])
            .arg(&cache)
            .arg(DEMO)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stderr).contains("no LLM is called"));
        lines(&out.stdout)
    };
    let first = run();
    assert_eq!(first.len(), 1);
    let l = &first[0];
    assert_eq!(l["line"], 1);
    assert_eq!(l["id"], "demo-1");
    assert_eq!(l["rubric_status"], "ok");
    assert_eq!(
        l["rubric_attempts"], 2,
        "the scripted generator's first rubric needs a repair"
    );
    // Response 1 is the paper's worked example (SPEC section 7): 0.925.
    assert_eq!(l["rewards"][0], 0.925);
    assert_eq!(l["rewards"][6], Value::Null);
    assert_eq!(l["responses"][6]["status"], "judge_invalid");
    assert_eq!(l["responses"][6]["judge_attempts"], 3);
    assert_eq!(l["calls"]["generator"], 2);
    assert_eq!(l["calls"]["judge"], 6 + 3);
    let second = run();
    assert_eq!(second[0]["rewards"], l["rewards"]);
    assert_eq!(second[0]["calls"]["generator"], 0);
    assert_eq!(second[0]["calls"]["judge"], 0);
    assert_eq!(second[0]["calls"]["cached"], 11);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unknown_member_of_a_turn_is_an_error_line_naming_it() {
    let dir = tempdir("unknown-member");
    let input = dir.join("in.jsonl");
    std::fs::write(
        &input,
        "{\"id\":1,\"context\":[{\"role\":\"user\",\"content\":\"hi\"}],\"respones\":[\"x\"]}\n",
    )
    .unwrap();
    let out = care()
        .args(["reward", "--scripted", "--cache"])
        .arg(dir.join("c.sqlite"))
        .arg(&input)
        .output()
        .unwrap();
    let l = lines(&out.stdout);
    assert_eq!(l.len(), 1, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(l[0]["error"]["code"], "bad_input", "{}", l[0]);
    let msg = l[0]["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("unknown field `respones`") && msg.contains("`responses`"),
        "{msg}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn usage_and_config_errors_are_one_line_and_status_2() {
    let out = care()
        .args([
            "reward",
            "--scripted",
            "--no-cache",
            "--judge-url",
            "http://x/v1",
            DEMO,
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--scripted replays"));
    let dir = tempdir("badcfg");
    let cfg = dir.join("loop.json");
    std::fs::write(
        &cfg,
        r#"{"judge": {"base_url": "http://127.0.0.1:9/v1", "modle": "x"}}"#,
    )
    .unwrap();
    let out = care()
        .args(["reward", "--no-cache", "--config"])
        .arg(&cfg)
        .arg(DEMO)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown field `modle`"), "{err}");
    std::fs::write(&cfg, r#"{"judge": {"base_url": "http://127.0.0.1:9/v1"}}"#).unwrap();
    let out = care()
        .args(["reward", "--no-cache", "--config"])
        .arg(&cfg)
        .arg(DEMO)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no generator endpoint (")
            && err.contains(
                "sets no generator.base_url): give --generator-url URL and --generator-model NAME"
            ),
        "{err}"
    );
    std::fs::write(
        &cfg,
        r#"{"judge": {"base_url": "http://127.0.0.1:9/v1", "model": "j", "timeout_secs": 0}}"#,
    )
    .unwrap();
    let out = care()
        .args(["reward", "--no-cache", "--profile", "kardia", "--config"])
        .arg(&cfg)
        .arg(DEMO)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "config {}: judge.timeout_secs 0 must be",
            cfg.display()
        )),
        "a field only the file sets keeps its name and gets the file: {err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The stderr of a `care reward` run that must fail with status 2.
fn usage_error(args: &[&str]) -> String {
    let out = care().args(args).stdin(Stdio::null()).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{args:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn configuration_errors_name_the_flags_a_user_typed() {
    // Nothing given: the flags that give an endpoint, --config and --scripted.
    let err = usage_error(&["reward", DEMO]);
    for want in [
        "--generator-url",
        "--generator-model",
        "--config",
        "--scripted",
    ] {
        assert!(err.contains(want), "{want} not in {err}");
    }
    assert!(!err.contains("generator.base_url is empty"), "{err}");
    // A judge is still missing under kardia (which needs no generator).
    let err = usage_error(&["reward", "--profile", "kardia", DEMO]);
    assert!(
        err.contains("no judge endpoint: give --judge-url URL and --judge-model NAME"),
        "{err}"
    );
    // A value typed on the command line is named by its flag.
    let err = usage_error(&[
        "reward",
        "--profile",
        "kardia",
        "--judge-url",
        "127.0.0.1:8001",
        "--judge-model",
        "j",
        DEMO,
    ]);
    assert!(
        err.contains("--judge-url \"127.0.0.1:8001\" must start with http:// or https://"),
        "{err}"
    );
    let err = usage_error(&[
        "reward",
        "--profile",
        "kardia",
        "--judge-url",
        "http://127.0.0.1:8001/v1",
        DEMO,
    ]);
    assert!(
        err.contains("no judge model: give --judge-model NAME"),
        "{err}"
    );
    let err = usage_error(&["reward", "--scripted", "--profile", "kardai", DEMO]);
    assert!(
        err.contains("--profile: unknown profile \"kardai\""),
        "{err}"
    );
}

/// A scratch directory as the working directory and cache home of one `care` run.
fn in_scratch(name: &str) -> (PathBuf, Command) {
    let dir = tempdir(name);
    let mut c = care();
    c.current_dir(&dir)
        .env_remove("XDG_CACHE_HOME")
        .env("HOME", dir.join("home"))
        .stdin(Stdio::null());
    (dir, c)
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn the_cache_lives_in_the_xdg_cache_dir_is_printed_and_scripted_keeps_none() {
    // --scripted: no cache file anywhere, and the run says so.
    let (dir, mut c) = in_scratch("cache-scripted");
    c.env("XDG_CACHE_HOME", dir.join("xdg"));
    let out = c.args(["reward", "--scripted", DEMO]).output().unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("care: cache: none (--scripted"), "{err}");
    assert_eq!(files_under(&dir), Vec::<PathBuf>::new());
    let _ = std::fs::remove_dir_all(&dir);

    // A real endpoint: $XDG_CACHE_HOME/care/care-cache.sqlite, printed; nothing in the cwd.
    // (The judge is never called: the input is empty.)
    let endpoint = [
        "reward",
        "--profile",
        "kardia",
        "--judge-url",
        "http://127.0.0.1:9/v1",
        "--judge-model",
        "j",
    ];
    let (dir, mut c) = in_scratch("cache-xdg");
    let xdg = dir.join("xdg");
    c.env("XDG_CACHE_HOME", &xdg);
    let out = c.args(endpoint).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want = xdg.join("care").join("care-cache.sqlite");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("care: cache: {}", want.display())),
        "{err}"
    );
    assert_eq!(files_under(&dir), vec![want]);
    let _ = std::fs::remove_dir_all(&dir);

    // No XDG_CACHE_HOME (or a relative one, which the XDG rule ignores): ~/.cache/care/.
    let (dir, mut c) = in_scratch("cache-home");
    c.env("XDG_CACHE_HOME", "relative/cache");
    let out = c.args(endpoint).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want = dir.join("home/.cache/care/care-cache.sqlite");
    assert_eq!(files_under(&dir), vec![want]);
    let _ = std::fs::remove_dir_all(&dir);

    // A configuration error leaves no cache file behind.
    let (dir, mut c) = in_scratch("cache-bad-flag");
    c.env("XDG_CACHE_HOME", dir.join("xdg"));
    let out = c
        .args(["reward", "--profile", "kardia", "--judge-url", "nope"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(files_under(&dir), Vec::<PathBuf>::new());
    let _ = std::fs::remove_dir_all(&dir);
}

const KARDIA_DEMO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/data/reward_demo_kardia.jsonl");

#[test]
fn the_summary_counts_responses_by_status() {
    // The CARE demo under the kardia profile: the turn has no gold emotion, so every response
    // is refused before any judge call, and the summary says so instead of "7 responses
    // rewarded".
    let out = care()
        .args(["reward", "--scripted", "--profile", "kardia", DEMO])
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "care reward: 1 line (0 error lines), 7 responses: 7 missing_gold (no reward)"
        ) && err.contains("no response was judged"),
        "{err}"
    );
    assert!(!err.contains("rewarded"), "{err}");
    // The bundled Kardia-format input: the scripted judge scores its three well-formed outputs.
    let out = care()
        .args(["reward", "--scripted", "--profile", "kardia", KARDIA_DEMO])
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("5 responses: 3 ok, 2 malformed_output (reward 0"),
        "{err}"
    );
    let l = &lines(&out.stdout)[0];
    let status: Vec<&str> = l["responses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        status,
        ["ok", "ok", "malformed_output", "ok", "malformed_output"]
    );
    let r: Vec<f64> = serde_json::from_value(l["rewards"].clone()).unwrap();
    assert!(
        r[0] > r[1] && r[1] > 0.0 && r[2] == 0.0 && r[4] == 0.0,
        "{r:?}"
    );
}

#[test]
fn the_kardia_demo_input_is_the_kardia_demo_group() {
    let group: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/data/demo_kardia.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let demo: Value =
        serde_json::from_str(std::fs::read_to_string(KARDIA_DEMO).unwrap().trim()).unwrap();
    let outputs: Vec<&Value> = group["responses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["output"])
        .collect();
    assert_eq!(
        demo["responses"]
            .as_array()
            .unwrap()
            .iter()
            .collect::<Vec<_>>(),
        outputs
    );
    assert_eq!(demo["gold"]["emotion"], group["gold_emotion"]);
    let ctx = demo["context"].as_array().unwrap();
    assert_eq!(ctx.last().unwrap()["content"], group["seeker"]);
    assert_eq!(
        ctx[0]["content"],
        format!("Persona: {}", group["persona"].as_str().unwrap())
    );
}

fn config_file(dir: &Path, stub: &Stub) -> PathBuf {
    let ep = |model: &str| {
        json!({"base_url": stub.base_url(), "model": model, "timeout_secs": 30.0,
               "backoff_initial_secs": 0.001, "backoff_max_secs": 0.002})
    };
    let path = dir.join("loop.json");
    let cfg = json!({"generator": ep("g"), "judge": ep("j"), "turn_concurrency": 4});
    std::fs::write(&path, cfg.to_string()).unwrap();
    path
}

fn turn(tag: &str, responses: &[&str]) -> String {
    json!({"id": tag, "context": [{"role": "user", "content": format!("{tag}: my dog died")}], "responses": responses})
        .to_string()
}

fn judge(req: &StubRequest) -> StubReply {
    let n: u8 = req
        .judged_response()
        .unwrap()
        .trim_start_matches("score:")
        .parse()
        .unwrap();
    StubReply::Content(judge_answer(PAPER_RUBRIC, n))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reward_with_a_panel_of_judges_in_the_config() {
    use care_loop::stub::{PanelJudge, panel_reply, rubric_criteria};
    let criteria = rubric_criteria(PAPER_RUBRIC);
    let stub = Stub::start(move |req, _| match req.role {
        Role::Generator => StubReply::Content(PAPER_RUBRIC.into()),
        Role::Judge => {
            let n: u8 = req.judged_response().unwrap()[6..].parse().unwrap();
            let offset = if req.model == "up" { 1 } else { 0 };
            panel_reply(req, &criteria, PanelJudge::Offset(offset), |_| n)
        }
    })
    .await
    .unwrap();
    let dir = tempdir("panel");
    let ep = |model: &str| json!({"base_url": stub.base_url(), "model": model, "backoff_initial_secs": 0.001});
    let config = dir.join("panel.json");
    let cfg = json!({"generator": ep("g"), "judge": [ep("plain"), ep("up")],
                     "panel": {"shuffle_criteria": true}});
    std::fs::write(&config, cfg.to_string()).unwrap();
    let input = dir.join("in.jsonl");
    std::fs::write(&input, turn("p1", &["score:1", "score:3"])).unwrap();
    let out = tokio::task::spawn_blocking(move || {
        care()
            .args(["reward", "--no-cache", "--config"])
            .arg(&config)
            .arg(&input)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let l = &lines(&out.stdout)[0];
    // The mean of the two judges: n and n + 1 on every criterion, so (2n + 1) / 10.
    let near = |v: &Value, x: f64| (v.as_f64().unwrap() - x).abs() < 1e-9;
    assert!(
        near(&l["rewards"][0], 0.3) && near(&l["rewards"][1], 0.7),
        "{l}"
    );
    let p = &l["responses"][1]["panel"];
    assert_eq!(p["judges"][0]["judge"], "plain");
    assert!(near(&p["judges"][1]["reward"], 0.8));
    assert_eq!(l["calls"]["judge"], 4);
    assert!(
        stderr
            .contains("judge agreement (Krippendorff's alpha, interval): 0.7000 over 2 responses"),
        "{stderr}"
    );
    // The judge flags set one judge: with a panel they are refused, naming what to do.
    let config = dir.join("panel.json");
    let out = care()
        .args(["reward", "--judge-model", "x", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("a panel of 2 judges"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_run_restarts_without_repeating_completed_calls() {
    let dir = tempdir("kill");
    let input = dir.join("in.jsonl");
    std::fs::write(
        &input,
        [
            turn("t1", &["score:5", "score:4"]),
            turn("t2", &["score:3"]),
            turn("t3", &["score:2", "score:1"]),
        ]
        .join("\n"),
    )
    .unwrap();
    let cache = dir.join("c.sqlite");

    // Run 1: t3's judge never answers; the process is killed (SIGKILL) once everything else
    // has completed.
    let stub1 = Stub::start(|req, _| match req.role {
        Role::Generator => StubReply::Content(PAPER_RUBRIC.into()),
        Role::Judge if req.messages[0].content.contains("t3:") => StubReply::Stall,
        Role::Judge => judge(req),
    })
    .await
    .unwrap();
    let cfg1 = config_file(&dir, &stub1);
    let mut child = care()
        .args(["reward", "--config"])
        .arg(&cfg1)
        .arg("--cache")
        .arg(&cache)
        .arg(&input)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while stub1.calls().len() < 3 + 2 + 1 + 2 {
        assert!(
            Instant::now() < deadline,
            "run 1 did not reach t3's judge: {}",
            stub1.calls().len()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // t1 and t2 are written once their lines are final; read them before the kill.
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = Vec::new();
    for _ in 0..2 {
        let mut l = String::new();
        stdout.read_line(&mut l).unwrap();
        first.push(serde_json::from_str::<Value>(&l).unwrap());
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let mut rest = String::new();
    let _ = stdout.read_to_string(&mut rest);
    assert_eq!(rest, "", "t3 was never written");

    // Run 2: a new process, a healthy judge, the same cache.
    let stub2 = Stub::start(|req, _| match req.role {
        Role::Generator => StubReply::Content(PAPER_RUBRIC.into()),
        Role::Judge => judge(req),
    })
    .await
    .unwrap();
    let cfg2 = config_file(&dir, &stub2);
    let out = care()
        .args(["reward", "--strict", "--config"])
        .arg(&cfg2)
        .arg("--cache")
        .arg(&cache)
        .arg(&input)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let second = lines(&out.stdout);
    assert_eq!(second.len(), 3);
    assert_eq!(
        stub2.count(Role::Generator),
        0,
        "every rubric completed in run 1"
    );
    assert_eq!(
        stub2.count(Role::Judge),
        2,
        "only t3's two judgments were missing"
    );
    assert_eq!(second[0]["rewards"], first[0]["rewards"]);
    assert_eq!(second[1]["rewards"], first[1]["rewards"]);
    assert_eq!(second[2]["rewards"], json!([0.4, 0.2]));
    assert_eq!(second[0]["calls"]["cached"], 3);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Starts `care serve` on a free port; returns the child and its base URL.
// The child is returned to the caller, which waits for it (the lint cannot see past the return).
#[allow(clippy::zombie_processes)]
fn start_server(args: &[&str]) -> (std::process::Child, String) {
    let mut child = care()
        .arg("serve")
        .args(args)
        .args(["--listen", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut l = String::new();
    loop {
        l.clear();
        assert!(
            err.read_line(&mut l).unwrap() > 0,
            "care serve exited before listening"
        );
        if let Some(rest) = l.split("listening on ").nth(1) {
            let url = rest.split_whitespace().next().unwrap().to_owned();
            // Keep draining stderr so the server never blocks on a full pipe.
            std::thread::spawn(move || {
                let mut sink = String::new();
                let _ = err.read_to_string(&mut sink);
            });
            return (child, url);
        }
    }
}

#[tokio::test]
async fn serve_scripted_answers_openrlhf_and_stops_on_sigterm() {
    let (mut child, url) = start_server(&["--scripted", "--no-cache"]);
    let demo: Value = serde_json::from_str(std::fs::read_to_string(DEMO).unwrap().trim()).unwrap();
    let prompt = "<|im_start|>user ...<|im_end|>\n<|im_start|>assistant\n";
    let label = demo["context"].to_string();
    let responses: Vec<String> = demo["responses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_owned())
        .collect();
    let body = json!({
        "query": responses.iter().map(|r| format!("{prompt}{r}")).collect::<Vec<_>>(),
        "prompts": vec![prompt; responses.len()],
        "labels": vec![label; responses.len()],
    });
    let c = reqwest::Client::new();
    let resp = c
        .post(format!("{url}/get_reward"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["rewards"][0], 0.925);
    assert_eq!(v["extra_logs"]["care_valid"][6], 0.0);
    // The 7th response has no reward: it gets the mean of the six valid ones.
    let r: Vec<f64> = serde_json::from_value(v["rewards"].clone()).unwrap();
    let mean = r[..6].iter().sum::<f64>() / 6.0;
    assert!((r[6] - mean).abs() < 1e-12);
    let h: Value = c
        .get(format!("{url}/healthz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(h["backend"], "scripted");
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            assert!(s.success(), "care serve exits 0 after SIGTERM: {s:?}");
            break;
        }
        assert!(Instant::now() < deadline, "care serve did not stop");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The README's ready `/get_reward` request: an OpenRLHF batch of the demo turn.
const GET_REWARD_DEMO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/data/get_reward_demo.json");

#[tokio::test]
async fn the_bundled_openrlhf_batch_is_the_demo_turn_and_gets_its_rewards() {
    let demo: Value = serde_json::from_str(std::fs::read_to_string(DEMO).unwrap().trim()).unwrap();
    let text = std::fs::read_to_string(GET_REWARD_DEMO).unwrap();
    let batch: Value = serde_json::from_str(&text).unwrap();
    let responses = demo["responses"].as_array().unwrap();
    let n = responses.len();
    for i in 0..n {
        let prompt = batch["prompts"][i].as_str().unwrap();
        let query = batch["query"][i].as_str().unwrap();
        assert_eq!(
            query.strip_prefix(prompt),
            responses[i].as_str(),
            "query[{i}]"
        );
        let label: Value = serde_json::from_str(batch["labels"][i].as_str().unwrap()).unwrap();
        assert_eq!(label, demo["context"], "labels[{i}]");
    }
    let (mut child, url) = start_server(&["--scripted"]);
    let resp = reqwest::Client::new()
        .post(format!("{url}/get_reward"))
        .body(text)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["rewards"][0], 0.925);
    let mut valid = vec![1.0; n - 1];
    valid.push(0.0);
    assert_eq!(v["extra_logs"]["care_valid"], json!(valid));
    child.kill().unwrap();
    let _ = child.wait();
}

#[test]
fn the_demo_input_is_the_demo_group() {
    // reward_demo.jsonl is derived from demo_group.json (chat messages instead of
    // "seeker: ..." lines, plus one response without a recorded judgment): keep them in step.
    let group: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/data/demo_group.json"))
            .unwrap(),
    )
    .unwrap();
    let demo: Value = serde_json::from_str(std::fs::read_to_string(DEMO).unwrap().trim()).unwrap();
    let lines: Vec<String> = demo["context"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let who = if m["role"] == "user" {
                "seeker"
            } else {
                "supporter"
            };
            format!("{who}: {}", m["content"].as_str().unwrap())
        })
        .collect();
    assert_eq!(json!(lines), group["context"]);
    let texts: Vec<&Value> = group["responses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["text"])
        .collect();
    let demo_resp = demo["responses"].as_array().unwrap();
    assert_eq!(demo_resp.len(), texts.len() + 1);
    for (a, b) in demo_resp.iter().zip(texts) {
        assert_eq!(a, b);
    }
}
