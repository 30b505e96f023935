//! Reward health end to end: `care serve --log` under the loop (OpenRLHF requests on
//! loopback, the stub LLM as generator and judge), then `care analyze` on the log. A judge
//! that pays for length is flagged; a judge whose scores do not depend on length passes.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use care_loop::llm::Role;
use care_loop::stub::{PAPER_RUBRIC, Stub, StubReply, StubRequest, judge_answer};
use serde_json::{Value, json};

fn care() -> Command {
    Command::new(env!("CARGO_BIN_EXE_care"))
}

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("care-health-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Starts `care serve`; returns the child and its base URL.
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
            std::thread::spawn(move || {
                let mut sink = String::new();
                let _ = err.read_to_string(&mut sink);
            });
            return (child, url);
        }
    }
}

fn stop(mut child: std::process::Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            assert!(s.success(), "care serve exits 0 after SIGTERM: {s:?}");
            return;
        }
        assert!(Instant::now() < deadline, "care serve did not stop");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A small deterministic generator for the planted data.
struct Lcg(u64);
impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

/// The planted judges: the score of a response as the stub judge gives it to every
/// criterion (1..=4, never the ceiling 5 nor the floor 0).
#[derive(Clone, Copy)]
enum Judge {
    /// Pays for length: longer responses score higher.
    Length,
    /// Reads the quality the response was planted with (`q:N`), whatever its length.
    Quality,
}

fn score(judge: Judge, response: &str) -> u8 {
    match judge {
        Judge::Length => 1 + (response.chars().count() / 100).min(3) as u8,
        Judge::Quality => response
            .strip_prefix("q:")
            .and_then(|r| r.get(..1))
            .and_then(|d| d.parse().ok())
            .unwrap(),
    }
}

const GROUPS: usize = 40;
const GROUP_SIZE: usize = 6;

/// Runs `care serve --log` against the stub with `judge`, sends the planted groups through
/// OpenRLHF's `/get_reward`, stops the server, and returns the log's path.
async fn serve_and_log(dir: &Path, judge: Judge) -> PathBuf {
    let stub = Stub::start(move |req: &StubRequest, _| match req.role {
        Role::Generator => StubReply::Content(PAPER_RUBRIC.into()),
        Role::Judge => {
            let r = req.judged_response().unwrap();
            StubReply::Content(judge_answer(PAPER_RUBRIC, score(judge, r)))
        }
    })
    .await
    .unwrap();
    let ep = |model: &str| {
        json!({"base_url": stub.base_url(), "model": model, "timeout_secs": 30.0,
               "backoff_initial_secs": 0.001, "backoff_max_secs": 0.002})
    };
    let cfg = dir.join("loop.json");
    std::fs::write(
        &cfg,
        json!({"generator": ep("g"), "judge": ep("j")}).to_string(),
    )
    .unwrap();
    let log = dir.join("serve.jsonl");
    let (child, url) = start_server(&[
        "--config",
        cfg.to_str().unwrap(),
        "--no-cache",
        "--log",
        log.to_str().unwrap(),
    ]);
    let client = reqwest::Client::new();
    let mut rng = Lcg(7);
    for g in 0..GROUPS {
        // Turns 1..=10: a context with that many seeker messages.
        let turns = 1 + g % 10;
        let mut context = Vec::new();
        for t in 0..turns {
            if t > 0 {
                context.push(json!({"role": "assistant", "content": format!("reply {t}")}));
            }
            context.push(
                json!({"role": "user", "content": format!("group {g}, message {t}: my dog died")}),
            );
        }
        let prompt = format!("<prompt {g}>");
        let responses: Vec<String> = (0..GROUP_SIZE)
            .map(|j| {
                let q = 1 + (j + g) % 4;
                let len = 20 + rng.below(380) as usize;
                let body = "I hear you. ".repeat(len / 12 + 1);
                format!("q:{q} {}", &body[..len])
            })
            .collect();
        let body = json!({
            "query": responses.iter().map(|r| format!("{prompt}{r}")).collect::<Vec<_>>(),
            "prompts": vec![prompt.clone(); GROUP_SIZE],
            "labels": vec![Value::Array(context.clone()); GROUP_SIZE],
        });
        let resp = client
            .post(format!("{url}/get_reward"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    }
    let metrics = client
        .get(format!("{url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        !metrics.contains("care_log_records_total{result=\"dropped\"}"),
        "no record was dropped: {metrics}"
    );
    stop(child);
    log
}

/// A report CSV as rows of `column -> value` (RFC 4180: quoted fields may hold commas).
fn csv_rows(path: &Path) -> Vec<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut records: Vec<Vec<String>> = Vec::new();
    let (mut row, mut field, mut quoted) = (Vec::new(), String::new(), false);
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            (true, '"') => quoted = false,
            (true, c) => field.push(c),
            (false, '"') => quoted = true,
            (false, ',') => row.push(std::mem::take(&mut field)),
            (false, '\r') => {}
            (false, '\n') => {
                row.push(std::mem::take(&mut field));
                records.push(std::mem::take(&mut row));
            }
            (false, c) => field.push(c),
        }
    }
    let mut it = records.into_iter();
    let header = it.next().unwrap();
    it.map(|r| header.iter().cloned().zip(r).collect())
        .collect()
}

fn analyze(log: &Path, out: &Path) -> Vec<BTreeMap<String, String>> {
    let o = care()
        .args([
            "analyze",
            log.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    csv_rows(&out.join("health_flags.csv"))
}

fn status<'a>(flags: &'a [BTreeMap<String, String>], check: &str) -> &'a str {
    flags
        .iter()
        .find(|r| r["check"] == check)
        .unwrap_or_else(|| panic!("no check {check}: {flags:?}"))["status"]
        .as_str()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_log_flags_a_length_paying_judge_and_passes_a_clean_one() {
    let dir = tempdir("length");
    let log = serve_and_log(&dir, Judge::Length).await;
    let records: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        records.len(),
        GROUPS * GROUP_SIZE,
        "one record per response"
    );
    let first = &records[0];
    assert_eq!(first["care_log"], 1);
    assert_eq!(first["group_size"], GROUP_SIZE);
    assert_eq!(first["turn"], 1);
    assert_eq!(first["rubric_status"], "ok");
    assert_eq!(first["rubric_weights"], json!([0.4, 0.25, 0.35]));
    assert!(first["response_chars"].as_u64().unwrap() >= 20);
    let flags = analyze(&log, &dir.join("report"));
    assert_eq!(status(&flags, "length_rho"), "FLAGGED", "{flags:?}");
    for check in [
        "zero_spread",
        "ceiling",
        "floor",
        "null_reward",
        "judge_retry",
        "rubric_failure",
        "rubric_repair",
        "entropy",
    ] {
        assert_eq!(status(&flags, check), "ok", "{check}: {flags:?}");
    }
    let md = std::fs::read_to_string(dir.join("report/report.md")).unwrap();
    assert!(md.contains("## Reward health"), "{md}");
    assert!(md.contains("(no variant): FLAGGED by length_rho"), "{md}");
    let html = std::fs::read_to_string(dir.join("report/index.html")).unwrap();
    assert!(html.contains("<h2 id=\"health\">Reward health</h2>"));
    assert!(
        html.contains("Reward health: Spearman"),
        "the rho chart is inline"
    );
    for chart in ["health_length.svg", "health_groups.svg", "health_loop.svg"] {
        assert!(dir.join("report").join(chart).is_file(), "{chart}");
    }

    let clean = tempdir("clean");
    let log = serve_and_log(&clean, Judge::Quality).await;
    let flags = analyze(&log, &clean.join("report"));
    for f in &flags {
        assert_eq!(f["status"], "ok", "{f:?}");
    }
    let md = std::fs::read_to_string(clean.join("report/report.md")).unwrap();
    assert!(md.contains("(no variant): passed"), "{md}");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&clean);
}

/// `care reward` output is a reward-health input as it is: the scripted demo turn (one repair,
/// six rewards, one response the judge never scores after three answers).
#[test]
fn care_reward_output_feeds_the_health_views() {
    let dir = tempdir("reward-lines");
    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/data/reward_demo.jsonl");
    let out = care()
        .args(["reward", "--scripted", "--no-cache", demo])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = dir.join("rewards.jsonl");
    std::fs::write(&lines, &out.stdout).unwrap();
    let line: Value = serde_json::from_slice(&out.stdout).unwrap();
    let chars: Vec<u64> = serde_json::from_value(line["response_chars"].clone()).unwrap();
    let texts: Value = serde_json::from_str(std::fs::read_to_string(demo).unwrap().trim()).unwrap();
    let want: Vec<u64> = texts["responses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().chars().count() as u64)
        .collect();
    assert_eq!(chars, want, "response_chars are the responses' lengths");
    let report = dir.join("report");
    let o = care()
        .args([
            "analyze",
            lines.to_str().unwrap(),
            "--out",
            report.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let rows = csv_rows(&report.join("health_loop.csv"));
    let get = |k: &str| rows[0][k].clone();
    assert_eq!(get("responses"), "7");
    assert_eq!(get("groups"), "1");
    assert_eq!(get("null_reward"), (1.0f64 / 7.0).to_string());
    assert_eq!(
        get("rubric_repaired"),
        "1",
        "the scripted generator needs one repair"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
