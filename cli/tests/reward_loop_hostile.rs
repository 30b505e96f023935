//! `care reward` and `care serve` as processes against hostile LLMs (the stub, the test
//! double, on 127.0.0.1) and hostile clients (raw sockets): an absurd `Retry-After`, an
//! endless event stream under an address-space limit, batches far over the limits under an
//! address-space limit, SIGTERM with a half-sent request and with a request that never ends,
//! and a server listening beyond loopback with and without a key.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use care_loop::llm::Role;
use care_loop::stub::{PAPER_RUBRIC, Stub, StubReply, judge_answer};
use serde_json::{Value, json};

fn care() -> Command {
    Command::new(env!("CARGO_BIN_EXE_care"))
}

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("care-hostile-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn config_file(dir: &Path, stub: &Stub) -> PathBuf {
    let ep = |model: &str| {
        json!({"base_url": stub.base_url(), "model": model, "timeout_secs": 60.0,
               "backoff_initial_secs": 0.001, "backoff_max_secs": 0.05})
    };
    let path = dir.join("loop.json");
    let cfg = json!({"generator": ep("g"), "judge": ep("j"), "turn_concurrency": 4});
    std::fs::write(&path, cfg.to_string()).unwrap();
    path
}

fn turn(tag: &str) -> String {
    json!({"id": tag, "context": [{"role": "user", "content": format!("{tag}: I lost my job")}], "responses": ["score:4"]})
        .to_string()
}

/// Caps the child's address space (`ulimit -v`), as an orchestrator's memory limit would.
fn limit_address_space(cmd: &mut Command, bytes: u64) {
    // SAFETY: the closure only calls setrlimit, which is async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: bytes,
                rlim_max: bytes,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
}

/// Runs `care reward` on `input` with `cmd`'s setup, in a thread (the stub serves on this
/// test's runtime meanwhile).
async fn reward(cmd: Command, input: String) -> Output {
    tokio::task::spawn_blocking(move || {
        let mut cmd = cmd;
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap()
}

fn lines(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Issue case 1: `Retry-After: 1e20` made the generator's call panic and `care reward` exit 2
/// with the later lines never written. Now the wait is capped and every line is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn care_reward_survives_retry_after_1e20_and_writes_every_line() {
    let stub = Stub::start(|req, n| match (req.role, n) {
        (_, 0) => StubReply::StatusRetryAfter(429, "1e20".into()),
        (Role::Generator, _) => StubReply::Content(PAPER_RUBRIC.into()),
        (Role::Judge, _) => StubReply::Content(judge_answer(PAPER_RUBRIC, 4)),
    })
    .await
    .unwrap();
    let dir = tempdir("retry-after");
    let mut cmd = care();
    cmd.args(["reward", "--no-cache", "--config"])
        .arg(config_file(&dir, &stub))
        .arg("-");
    let input = format!("{}\n{}\n{}\n", turn("a"), turn("b"), turn("c"));
    let out = reward(cmd, input).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let l = lines(&out);
    assert_eq!(l.len(), 3);
    for x in &l {
        assert_eq!(x["rubric_status"], "ok", "{x}");
        assert_eq!(x["rewards"][0], 0.8);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue case 2: a fast 1.5 GB event stream aborted `care reward` under a 3 GB address-space
/// limit (SIGABRT, output lost). Now the endless stream ends at the answer cap: the line says
/// `generator_error` `answer_too_long`, the next line is rewarded, exit 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn care_reward_under_an_address_space_limit_survives_an_endless_event_stream() {
    let stub = Stub::start(|req, _| match req.role {
        Role::Generator if req.transcript().is_some_and(|t| t.contains("endless")) => {
            StubReply::EndlessSse
        }
        Role::Generator => StubReply::Content(PAPER_RUBRIC.into()),
        Role::Judge => StubReply::Content(judge_answer(PAPER_RUBRIC, 4)),
    })
    .await
    .unwrap();
    let dir = tempdir("endless");
    let mut cmd = care();
    cmd.args(["reward", "--no-cache", "--config"])
        .arg(config_file(&dir, &stub))
        .arg("-");
    limit_address_space(&mut cmd, 3 << 30);
    let out = reward(cmd, format!("{}\n{}\n", turn("endless"), turn("fine"))).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let l = lines(&out);
    assert_eq!(l.len(), 2);
    assert_eq!(l[0]["rubric_status"], "generator_error");
    assert_eq!(l[0]["rubric_error"]["code"], "answer_too_long");
    assert_eq!(l[1]["rewards"][0], 0.8);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A `care serve` child with its stderr collected in the background.
struct Served {
    child: Child,
    url: String,
    stderr: Arc<Mutex<String>>,
}

impl Served {
    // The child is waited for in `wait_exit` (the lint cannot see past the struct).
    #[allow(clippy::zombie_processes)]
    fn start(args: &[&str], env: &[(&str, &str)], address_space: Option<u64>) -> Served {
        let mut cmd = care();
        cmd.arg("serve")
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        if let Some(b) = address_space {
            limit_address_space(&mut cmd, b);
        }
        let mut child = cmd.spawn().unwrap();
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut l = String::new();
        loop {
            l.clear();
            assert!(
                err.read_line(&mut l).unwrap() > 0,
                "care serve exited before listening: {}",
                stderr.lock().unwrap()
            );
            stderr.lock().unwrap().push_str(&l);
            if let Some(rest) = l.split("listening on ").nth(1) {
                let url = rest.split_whitespace().next().unwrap().to_owned();
                let sink = Arc::clone(&stderr);
                std::thread::spawn(move || {
                    let mut line = String::new();
                    while err.read_line(&mut line).unwrap_or(0) > 0 {
                        sink.lock().unwrap().push_str(&line);
                        line.clear();
                    }
                });
                return Served { child, url, stderr };
            }
        }
    }

    fn port(&self) -> u16 {
        self.url.rsplit(':').next().unwrap().parse().unwrap()
    }

    fn local(&self) -> String {
        format!("http://127.0.0.1:{}", self.port())
    }

    fn term(&self) {
        let s = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(s.success());
    }

    /// Waits for the exit (at most `within`), returning the status and all of stderr.
    fn wait_exit(&mut self, within: Duration) -> (std::process::ExitStatus, String) {
        let deadline = Instant::now() + within;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                std::thread::sleep(Duration::from_millis(100));
                return (s, self.stderr.lock().unwrap().clone());
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("care serve did not stop: {}", self.stderr.lock().unwrap());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Issue case 5: SIGTERM waited forever on a client that had sent half a request. Now the
/// server stops at once (a body still arriving is answered 503 `shutting_down`, a silent
/// connection closed), exits 0, and says so.
#[test]
fn sigterm_with_a_half_sent_request_stops_at_once() {
    let mut s = Served::start(
        &["--scripted", "--no-cache", "--listen", "127.0.0.1:0"],
        &[],
        None,
    );
    let mut half = TcpStream::connect(("127.0.0.1", s.port())).unwrap();
    half.write_all(b"POST /get_reward HTTP/1.1\r\nhost: x\r\ncontent-length: 50\r\n\r\n{\"qu")
        .unwrap();
    let mut silent = TcpStream::connect(("127.0.0.1", s.port())).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    s.term();
    // The default deadline is 30 s; a stop that waits on these connections takes that long.
    let (status, err) = s.wait_exit(Duration::from_secs(20));
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(
        err.contains("care serve: stopped after finishing the requests in flight"),
        "{err}"
    );
    // The request whose body was still arriving is told why; the silent one just closed.
    let mut answer = String::new();
    half.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = half.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("\"shutting_down\""), "{answer}");
    let mut buf = [0u8; 64];
    silent
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert!(matches!(silent.read(&mut buf), Ok(0) | Err(_)));
}

/// The shutdown deadline: a request whose judge never answers is cut after
/// `--shutdown-timeout-secs`, the process exits 0 and stderr names what was cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_cuts_a_request_that_never_ends_at_the_deadline_and_says_so() {
    let stub = Stub::start(|req, _| match req.role {
        Role::Generator => StubReply::Content(PAPER_RUBRIC.into()),
        Role::Judge => StubReply::Stall,
    })
    .await
    .unwrap();
    let dir = tempdir("deadline");
    let cfg = config_file(&dir, &stub);
    let mut s = Served::start(
        &[
            "--no-cache",
            "--config",
            cfg.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--shutdown-timeout-secs",
            "1",
        ],
        &[],
        None,
    );
    let url = format!("{}/v1/reward", s.local());
    let body = json!({"turns": [{"context": [{"role": "user", "content": "hello?"}], "responses": ["score:1"]}]});
    let pending =
        tokio::spawn(async move { reqwest::Client::new().post(url).json(&body).send().await });
    for _ in 0..2000 {
        if stub.count(Role::Judge) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(stub.count(Role::Judge) > 0);
    s.term();
    let (status, err) = tokio::task::spawn_blocking(move || s.wait_exit(Duration::from_secs(20)))
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(
        err.contains("stopped at the shutdown deadline of 1 s: cut 1 request(s) in flight (/v1/reward: 1) on 1 connection(s)"),
        "{err}"
    );
    assert!(pending.await.unwrap().is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue case 7: `--listen 0.0.0.0` without a key served anyone, silently. Now stderr and
/// `/healthz` warn; with `--api-key-env` the routes need the key and the warning is gone; an
/// unset variable is a usage error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listening_beyond_loopback_warns_unless_a_key_is_required() {
    let mut open = Served::start(
        &["--scripted", "--no-cache", "--listen", "0.0.0.0:0"],
        &[],
        None,
    );
    let h: Value = reqwest::get(format!("{}/healthz", open.local()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        h["warning"]
            .as_str()
            .unwrap()
            .contains("without authentication"),
        "{h}"
    );
    assert!(
        open.stderr
            .lock()
            .unwrap()
            .contains("care serve: WARNING: listening on 0.0.0.0:")
    );
    open.term();
    assert_eq!(open.wait_exit(Duration::from_secs(20)).0.code(), Some(0));

    let mut keyed = Served::start(
        &[
            "--scripted",
            "--no-cache",
            "--listen",
            "0.0.0.0:0",
            "--api-key-env",
            "CARE_TEST_KEY",
        ],
        &[("CARE_TEST_KEY", "k-123")],
        None,
    );
    let h: Value = reqwest::get(format!("{}/healthz", keyed.local()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(h.get("warning").is_none(), "{h}");
    assert_eq!(h["auth"], true);
    let c = reqwest::Client::new();
    let body = json!({"query": ["p hi"], "prompts": ["p"]});
    let r = c
        .post(format!("{}/get_reward", keyed.local()))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = c
        .post(format!("{}/get_reward", keyed.local()))
        .bearer_auth("k-123")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(!keyed.stderr.lock().unwrap().contains("WARNING"));
    keyed.term();
    assert_eq!(keyed.wait_exit(Duration::from_secs(20)).0.code(), Some(0));

    let out = care()
        .args([
            "serve",
            "--scripted",
            "--api-key-env",
            "CARE_TEST_UNSET_KEY",
        ])
        .env_remove("CARE_TEST_UNSET_KEY")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("CARE_TEST_UNSET_KEY"));
    for bad in [
        ["--header-timeout-secs", "1e20"],
        ["--max-turns", "0"],
        ["--max-body-bytes", "4294967296"],
    ] {
        let out = care()
            .args(["serve", "--scripted"])
            .args(bad)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(bad[0]),
            "{bad:?}"
        );
    }
}

/// Issue case 3: 300k distinct prompts (7 MB, under the body limit) aborted the server. Under
/// an address-space limit of 3 GiB it now answers 413, as it does for 30M tiny labels (57 MiB
/// of text that decode into about 2 GB of JSON values), and stays healthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn care_serve_under_an_address_space_limit_refuses_oversized_batches_and_stays_up() {
    let mut s = Served::start(
        &["--scripted", "--no-cache", "--listen", "127.0.0.1:0"],
        &[],
        Some(3 << 30),
    );
    let prompts: Vec<String> = (0..300_000).map(|i| format!("prompt {i} ")).collect();
    let query: Vec<String> = prompts.iter().map(|p| format!("{p}response")).collect();
    let c = reqwest::Client::new();
    let r = c
        .post(format!("{}/get_reward", s.local()))
        .json(&json!({"query": query, "prompts": prompts}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    let mut tiny = String::from("{\"query\":[],\"prompts\":[],\"labels\":[");
    tiny.push_str(&"0,".repeat(30_000_000));
    tiny.push_str("0]}");
    let r = c
        .post(format!("{}/get_reward", s.local()))
        .body(tiny)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    let h = c
        .get(format!("{}/healthz", s.local()))
        .send()
        .await
        .unwrap();
    assert_eq!(h.status(), 200);
    s.term();
    let (status, err) = tokio::task::spawn_blocking(move || s.wait_exit(Duration::from_secs(20)))
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0), "{err}");
}
