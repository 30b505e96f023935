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

use std::sync::Arc;

use care_loop::llm::{ChatMessage, Role};
use care_loop::log::ResponseLog;
use care_loop::stub::{
    PAPER_RUBRIC, PanelJudge, Stub, StubReply, StubRequest, judge_answer, panel_reply,
    rubric_criteria,
};
use care_loop::{
    BackendKind, EndpointConfig, Engine, JudgeConfig, JudgeSpec, LoopConfig, Metrics, PanelConfig,
};
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

// ---------------------------------------------------------------------------------------------
// Judge panels: agreement and flags.

/// Krippendorff's alpha (interval) by its definition, pair by pair (not the one-pass form the
/// report uses): D_o over ordered pairs within units, D_e over ordered pairs of all pairable
/// values, alpha = 1 - D_o / D_e.
fn alpha_by_pairs(units: &[Vec<f64>]) -> f64 {
    let pairable: Vec<&Vec<f64>> = units.iter().filter(|u| u.len() >= 2).collect();
    let n = pairable.iter().map(|u| u.len()).sum::<usize>() as f64;
    let mut d_o = 0.0;
    for u in &pairable {
        let mut s = 0.0;
        for (i, a) in u.iter().enumerate() {
            for (j, b) in u.iter().enumerate() {
                if i != j {
                    s += (a - b) * (a - b);
                }
            }
        }
        d_o += s / (u.len() as f64 - 1.0);
    }
    d_o /= n;
    let all: Vec<f64> = pairable.iter().flat_map(|u| u.iter().copied()).collect();
    let mut d_e = 0.0;
    for (i, a) in all.iter().enumerate() {
        for (j, b) in all.iter().enumerate() {
            if i != j {
                d_e += (a - b) * (a - b);
            }
        }
    }
    d_e /= n * (n - 1.0);
    1.0 - d_o / d_e
}

/// The agreement units of one response's `panel` member: the valid judges' rewards, and per
/// criterion their scores (a judge is valid when it has a reward).
fn panel_units(panel: &Value) -> (Vec<f64>, Vec<Vec<f64>>) {
    let ok: Vec<&Value> = panel["judges"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|j| !j["reward"].is_null())
        .collect();
    let rewards = ok.iter().map(|j| j["reward"].as_f64().unwrap()).collect();
    let flat: Vec<Vec<f64>> = ok
        .iter()
        .map(|j| {
            j["scores"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|d| d.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()))
                .collect()
        })
        .collect();
    let criteria = (0..flat[0].len())
        .map(|c| flat.iter().map(|f| f[c]).collect())
        .collect();
    (rewards, criteria)
}

fn analyze_args(input: &Path, out: &Path, extra: &[&str]) {
    let o = care()
        .arg("analyze")
        .arg(input)
        .arg("--out")
        .arg(out)
        .args(extra)
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn row<'a>(rows: &'a [BTreeMap<String, String>], variant: &str) -> &'a BTreeMap<String, String> {
    rows.iter()
        .find(|r| r["variant"] == variant)
        .unwrap_or_else(|| panic!("no row for {variant}: {rows:?}"))
}

fn flag_status<'a>(flags: &'a [BTreeMap<String, String>], variant: &str) -> Option<&'a str> {
    flags
        .iter()
        .find(|r| r["variant"] == variant && r["check"] == "panel_alpha")
        .map(|r| r["status"].as_str())
}

#[test]
fn a_panels_agreement_is_krippendorffs_alpha_and_is_flagged_below_0_667() {
    // `care reward` lines of three variants: a 3-judge panel whose judges mostly agree, one
    // whose judges score at random (one judge failed on one response: that unit has two
    // values), and a single judge.
    let fixture = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/panel_health.jsonl"
    ));
    let text = std::fs::read_to_string(fixture).unwrap();
    // Per variant: reward units, criterion units, responses, flagged responses.
    type Units = (Vec<Vec<f64>>, Vec<Vec<f64>>, u64, u64);
    let mut units: BTreeMap<String, Units> = BTreeMap::new();
    for line in text.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let variant = v["meta"]["variant"].as_str().unwrap().to_owned();
        for r in v["responses"].as_array().unwrap() {
            if r["panel"].is_null() {
                continue;
            }
            let (rw, cr) = panel_units(&r["panel"]);
            let e = units.entry(variant.clone()).or_default();
            e.0.push(rw);
            e.1.extend(cr);
            e.2 += 1;
            e.3 += u64::from(r["panel"]["flagged"].as_bool().unwrap());
        }
    }
    let dir = tempdir("panel-alpha");
    let out = dir.join("report");
    analyze_args(fixture, &out, &[]);
    let panel = csv_rows(&out.join("health_panel.csv"));
    let flags = csv_rows(&out.join("health_flags.csv"));
    let f = |r: &BTreeMap<String, String>, k: &str| r[k].parse::<f64>().unwrap();
    let mut alphas = BTreeMap::new();
    for (variant, (rewards, criteria, responses, flagged)) in &units {
        let r = row(&panel, variant);
        assert_eq!(r["panel"], "panel");
        assert_eq!(r["judges"], "3");
        assert_eq!(r["responses"], responses.to_string());
        assert_eq!(r["flagged"], flagged.to_string());
        let (want_r, want_s) = (alpha_by_pairs(rewards), alpha_by_pairs(criteria));
        assert!(
            (f(r, "reward_alpha") - want_r).abs() < 1e-12,
            "{variant}: {r:?} {want_r}"
        );
        assert!(
            (f(r, "score_alpha") - want_s).abs() < 1e-12,
            "{variant}: {r:?} {want_s}"
        );
        assert_eq!(r["reward_units"], rewards.len().to_string());
        assert_eq!(r["score_units"], criteria.len().to_string());
        alphas.insert(variant.clone(), want_r);
    }
    // The fixture is built so that one panel is above the bound and the other below.
    assert!(
        alphas["agree"] > 0.667 && alphas["disagree"] < 0.667,
        "{alphas:?}"
    );
    assert_eq!(flag_status(&flags, "agree"), Some("ok"));
    assert_eq!(flag_status(&flags, "disagree"), Some("FLAGGED"));
    // A single judge: no panel, no alpha, no agreement check.
    let single = row(&panel, "single");
    assert_eq!(single["panel"], "no panel");
    assert_eq!(single["reward_alpha"], "");
    assert_eq!(flag_status(&flags, "single"), None);
    // The panel's judge answers are one per judge: not retries.
    let retry = |v: &str| {
        flags
            .iter()
            .find(|r| r["variant"] == v && r["check"] == "judge_retry")
            .unwrap()["status"]
            .clone()
    };
    assert_eq!(retry("agree"), "ok");
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    let line = |v: &str| {
        md.lines()
            .find(|l| l.contains(&format!("{v}: ")) && l.contains("Judges:"))
            .unwrap_or_else(|| panic!("no summary of {v}: {md}"))
            .to_owned()
    };
    assert!(line("single").contains("Judges: no panel."), "{md}");
    assert!(
        line("agree").contains(&format!(
            "Judges: a panel of 3; Krippendorff's alpha {:.3} over 12 responses",
            alphas["agree"]
        )),
        "{md}"
    );
    assert!(line("disagree").contains("FLAGGED by") && line("disagree").contains("panel_alpha"));

    // The threshold is a setting: above the agreeing panel's alpha, it is flagged too; below
    // the disagreeing one's, neither is.
    let out2 = dir.join("report2");
    let hi = format!("panel_alpha={}", (alphas["agree"] + 1.0) / 2.0);
    analyze_args(fixture, &out2, &["--health", &hi]);
    let flags = csv_rows(&out2.join("health_flags.csv"));
    assert_eq!(flag_status(&flags, "agree"), Some("FLAGGED"));
    let out3 = dir.join("report3");
    let lo = format!("panel_alpha={}", alphas["disagree"] - 0.1);
    analyze_args(fixture, &out3, &["--health", &lo]);
    let flags = csv_rows(&out3.join("health_flags.csv"));
    assert_eq!(flag_status(&flags, "disagree"), Some("ok"));
    assert_eq!(flag_status(&flags, "agree"), Some("ok"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_panels_log_records_carry_its_judges_and_give_the_same_agreement() {
    // Three stub judges that disagree in known ways: one at the base score, one a point above,
    // one that gives the criterion listed first a 5.
    let criteria = rubric_criteria(PAPER_RUBRIC);
    let stub = Stub::start(move |req: &StubRequest, _| match req.role {
        Role::Generator => StubReply::Content(PAPER_RUBRIC.into()),
        Role::Judge => {
            let n: u8 = req
                .judged_response()
                .unwrap()
                .trim_start_matches("score:")
                .split_whitespace()
                .next()
                .unwrap()
                .parse()
                .unwrap();
            let persona = match req.model.as_str() {
                "plain" => PanelJudge::Offset(0),
                "up" => PanelJudge::Offset(1),
                _ => PanelJudge::FirstListed(5),
            };
            panel_reply(req, &criteria, persona, |_| n)
        }
    })
    .await
    .unwrap();
    let ep = |model: &str| EndpointConfig {
        timeout_secs: 5.0,
        backoff_initial_secs: 0.001,
        backoff_max_secs: 0.002,
        max_attempts: 1,
        ..EndpointConfig::new(stub.base_url(), model)
    };
    let cfg = LoopConfig {
        generator: ep("gen"),
        judge: JudgeConfig::panel(
            ["plain", "up", "first"]
                .iter()
                .map(|m| JudgeSpec::new(ep(m)))
                .collect(),
        ),
        panel: PanelConfig {
            max_spread: Some(0.2),
            ..PanelConfig::default()
        },
        ..LoopConfig::default()
    };
    let metrics = Arc::new(Metrics::new());
    let engine =
        Arc::new(Engine::new(&cfg, BackendKind::Http, None, Arc::clone(&metrics)).unwrap());
    let dir = tempdir("panel-log");
    let log_path = dir.join("serve.jsonl");
    let log = ResponseLog::open(&log_path, 1 << 20, 16, Arc::clone(&metrics)).unwrap();
    let mut reward_lines = String::new();
    let mut results = Vec::new();
    for (t, responses) in [
        ["score:1", "score:2", "score:3"],
        ["score:4", "score:0", "score:2"],
    ]
    .iter()
    .enumerate()
    {
        let input = care_loop::engine::TurnInput {
            id: Some(json!(t)),
            context: vec![ChatMessage::new("user", format!("turn {t}: I feel lost."))],
            responses: responses.iter().map(|s| (*s).to_owned()).collect(),
            ..care_loop::engine::TurnInput::default()
        };
        let r = engine.run_turn(input).await.unwrap();
        log.record_turn(1, &r);
        reward_lines.push_str(&serde_json::to_string(&r).unwrap());
        reward_lines.push('\n');
        results.push(r);
    }
    log.close();

    // The record's `panel` is the result's `responses[j].panel`, member for member.
    let records: Vec<Value> = std::fs::read_to_string(&log_path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 6);
    let mut all_rewards = Vec::new();
    let mut all_criteria = Vec::new();
    for (i, rec) in records.iter().enumerate() {
        let want =
            serde_json::to_value(&results[i / 3]).unwrap()["responses"][i % 3]["panel"].clone();
        assert!(want.is_object());
        assert_eq!(rec["panel"], want, "record {i}");
        let (rw, cr) = panel_units(&rec["panel"]);
        assert_eq!(rw.len(), 3);
        all_rewards.push(rw);
        all_criteria.extend(cr);
    }

    // `care analyze` on the log and on the `care reward` lines of the same turns: the same
    // panel view, and the alpha of the definition and of the engine's own accumulator.
    let reward_path = dir.join("reward.jsonl");
    std::fs::write(&reward_path, reward_lines).unwrap();
    let (from_log, from_lines) = (dir.join("log-report"), dir.join("reward-report"));
    analyze_args(&log_path, &from_log, &[]);
    analyze_args(&reward_path, &from_lines, &[]);
    let a = csv_rows(&from_log.join("health_panel.csv"));
    let b = csv_rows(&from_lines.join("health_panel.csv"));
    assert_eq!(a, b);
    let r = &a[0];
    assert_eq!((r["panel"].as_str(), r["judges"].as_str()), ("panel", "3"));
    assert_eq!(r["responses"], "6");
    let flagged = records
        .iter()
        .filter(|rec| rec["panel"]["flagged"] == json!(true))
        .count();
    assert!(
        flagged > 0,
        "the first-listed judge spreads the rewards past 0.2"
    );
    assert_eq!(r["flagged"], flagged.to_string());
    let got = r["reward_alpha"].parse::<f64>().unwrap();
    assert!((got - alpha_by_pairs(&all_rewards)).abs() < 1e-12, "{got}");
    let got_s = r["score_alpha"].parse::<f64>().unwrap();
    assert!(
        (got_s - alpha_by_pairs(&all_criteria)).abs() < 1e-12,
        "{got_s}"
    );
    let (engine_reward, engine_score) = engine.panel_agreement().unwrap();
    assert!((got - engine_reward.value().unwrap()).abs() < 1e-12);
    assert!((got_s - engine_score.value().unwrap()).abs() < 1e-12);
    let _ = std::fs::remove_dir_all(&dir);
}
