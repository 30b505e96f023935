//! The `care` binary as trainers run it: as a co-process answering line by line, at the end of
//! a pipe whose reader may fail, with closed or unusable standard streams, under a memory
//! limit, with absurd thread counts. Each test spawns the real binary.
//!
//! No test asserts a duration: where an answer could fail to come (a co-process waiting for a
//! line that is never answered), a generous timeout turns the hang into a failure.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Long enough for a loaded CI machine; only reached when an answer never comes.
const HANG: Duration = Duration::from_secs(60);

fn care() -> Command {
    Command::new(env!("CARGO_BIN_EXE_care"))
}

fn tmp(name: &str, contents: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("care-streaming-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path
}

fn adv_line(id: usize) -> String {
    format!(
        r#"{{"id":{id},"rewards":[1,0,0.5,{}],"group_size":2}}"#,
        id % 3
    )
}

/// Reads `child`'s stdout line by line on a thread; the lines arrive on the receiver.
fn lines_of(child: &mut Child) -> mpsc::Receiver<String> {
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            if tx.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    rx
}

/// Runs `cmd` to completion, killing it and failing the test when it takes longer than
/// `limit` (a co-process waiting for an answer that never comes). `None`: it could not start.
fn output_within(mut cmd: Command, limit: Duration) -> Option<Output> {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    match rx.recv_timeout(limit) {
        Ok(out) => Some(out.unwrap()),
        Err(_) => {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!("{cmd:?} did not finish within {limit:?}");
        }
    }
}

fn one_stderr_line(out: &Output) -> String {
    let err = String::from_utf8(out.stderr.clone()).unwrap();
    assert_eq!(err.lines().count(), 1, "exactly one stderr line: {err:?}");
    assert!(err.ends_with('\n'));
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{err}"
    );
    err
}

/// Runs `cmd` with `setup` applied in the child before `exec` (closing a descriptor, setting a
/// resource limit).
fn run_with(
    mut cmd: Command,
    setup: impl Fn() -> std::io::Result<()> + Send + Sync + 'static,
) -> Output {
    // SAFETY: `setup` only makes async-signal-safe system calls (close, setrlimit).
    unsafe {
        cmd.pre_exec(setup);
    }
    cmd.output().unwrap()
}

#[test]
fn a_co_process_gets_each_answer_while_its_stdin_stays_open() {
    for (sub, threads) in [("advantages", "1"), ("advantages", "0"), ("validate", "2")] {
        let mut child = care()
            .args([sub, "--threads", threads, "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let answers = lines_of(&mut child);
        let mut stdin = child.stdin.take().unwrap();
        // One line at a time: write it, read its answer, with stdin still open.
        for k in 1..=40 {
            let line = if sub == "validate" {
                r#"{"text":"not a rubric"}"#.to_owned()
            } else {
                adv_line(k)
            };
            writeln!(stdin, "{line}").unwrap();
            stdin.flush().unwrap();
            let answer = answers
                .recv_timeout(HANG)
                .unwrap_or_else(|_| panic!("{sub}: no answer to line {k} while stdin is open"));
            assert!(answer.starts_with(&format!("{{\"line\":{k},")), "{answer}");
        }
        // A burst of lines, then their answers, in order.
        for k in 41..=60 {
            writeln!(stdin, "{}", adv_line(k)).unwrap();
        }
        stdin.flush().unwrap();
        for k in 41..=60 {
            let answer = answers.recv_timeout(HANG).unwrap();
            assert!(answer.starts_with(&format!("{{\"line\":{k},")), "{answer}");
        }
        drop(stdin);
        assert!(child.wait().unwrap().success());
        assert!(
            answers.recv_timeout(HANG).is_err(),
            "nothing after the last answer"
        );
    }
}

#[test]
fn the_python_co_process_example_runs() {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/python/care_coprocess.py"
    );
    let mut cmd = Command::new("python3");
    cmd.arg(script).env("CARE", env!("CARGO_BIN_EXE_care"));
    let Some(out) = output_within(cmd, HANG) else {
        eprintln!("skipped: python3 not found");
        return;
    };
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(text.lines().count(), 3, "{text}");
    assert!(text.starts_with("step-0: advantages ["), "{text}");
}

#[test]
fn a_pipe_that_pauses_often_gives_the_same_bytes_as_a_file() {
    let mut input = String::new();
    for k in 0..20_000 {
        if k % 97 == 5 {
            input.push_str("{not json}\n");
        } else {
            input.push_str(&adv_line(k));
            input.push('\n');
        }
    }
    let path = tmp("pauses.jsonl", input.as_bytes());
    let want = care().args(["advantages"]).arg(&path).output().unwrap();
    assert!(want.status.success());
    let mut child = care()
        .args(["advantages", "--threads", "2", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let bytes = input.into_bytes();
    let writer = std::thread::spawn(move || {
        // Pieces of odd sizes, cut mid-line, with pauses: many short reads and chunk cuts.
        let mut at = 0;
        let mut k = 0usize;
        while at < bytes.len() {
            let n = (1 + (k * 7919) % 6000).min(bytes.len() - at);
            stdin.write_all(&bytes[at..at + n]).unwrap();
            stdin.flush().unwrap();
            at += n;
            k += 1;
            if k.is_multiple_of(50) {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    });
    let mut got = Vec::new();
    child.stdout.take().unwrap().read_to_end(&mut got).unwrap();
    writer.join().unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!(
        String::from_utf8(got).unwrap(),
        String::from_utf8(want.stdout).unwrap()
    );
}

#[test]
fn write_failures_are_exit_2_with_the_cause_named() {
    let input = tmp(
        "w.jsonl",
        format!("{}\n{}\n", adv_line(1), adv_line(2)).as_bytes(),
    );
    // stdout closed.
    let mut cmd = care();
    cmd.arg("advantages").arg(&input);
    let out = run_with(cmd, || {
        // SAFETY: closing fd 1 in the child before exec.
        unsafe { libc::close(1) };
        Ok(())
    });
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        one_stderr_line(&out),
        "care: stdout is closed: Bad file descriptor (EBADF)\n"
    );
    // stdout open for reading only: every write fails with EBADF.
    let out = care()
        .arg("advantages")
        .arg(&input)
        .stdout(File::open(&input).unwrap())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = one_stderr_line(&out);
    assert!(err.starts_with("care: cannot write to stdout: "), "{err}");
    assert!(err.contains("(EBADF)"), "{err}");
    // A full device.
    if let Ok(full) = OpenOptions::new().write(true).open("/dev/full") {
        for flags in [&["--threads", "1"][..], &["--strict"][..]] {
            let out = care()
                .arg("advantages")
                .args(flags)
                .arg(&input)
                .stdout(full.try_clone().unwrap())
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(2));
            let err = one_stderr_line(&out);
            assert!(err.starts_with("care: cannot write to stdout: "), "{err}");
            assert!(err.contains("(ENOSPC)"), "{err}");
        }
    }
}

#[test]
fn care_demo_reports_write_failures_by_the_same_rule() {
    // stdout closed: one line, status 2 (it was status 0 with the table lost).
    let mut cmd = care();
    cmd.arg("demo");
    let out = run_with(cmd, || {
        // SAFETY: closing fd 1 in the child before exec.
        unsafe { libc::close(1) };
        Ok(())
    });
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        one_stderr_line(&out),
        "care: stdout is closed: Bad file descriptor (EBADF)\n"
    );
    if let Ok(full) = OpenOptions::new().write(true).open("/dev/full") {
        let out = care().arg("demo").stdout(full).output().unwrap();
        assert_eq!(out.status.code(), Some(2));
        let err = one_stderr_line(&out);
        assert!(err.starts_with("care: cannot write to stdout: "), "{err}");
        assert!(err.contains("(ENOSPC)"), "{err}");
    }
    // A reader that is gone (almost surely before the table, rendered first, is written):
    // EPIPE is status 0, no message.
    let mut child = care()
        .arg("demo")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let done = child.wait_with_output().unwrap();
    assert_eq!(done.status.code(), Some(0));
    assert_eq!(String::from_utf8(done.stderr).unwrap(), "");
}

#[test]
fn a_reader_that_goes_away_is_not_an_error() {
    // The documented EPIPE behaviour: `care ... | head` exits 0 without a message.
    let mut big = String::new();
    for k in 0..200_000 {
        big.push_str(&adv_line(k));
        big.push('\n');
    }
    let input = tmp("epipe.jsonl", big.as_bytes());
    let mut child = care()
        .arg("advantages")
        .arg(&input)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    out.read_line(&mut first).unwrap();
    assert!(first.starts_with("{\"line\":1,"));
    drop(out);
    let done = child.wait_with_output().unwrap();
    assert_eq!(done.status.code(), Some(0));
    assert_eq!(String::from_utf8(done.stderr).unwrap(), "");
}

#[test]
fn a_closed_or_unreadable_stdin_is_an_error_not_empty_input() {
    let mut cmd = care();
    cmd.args(["advantages", "-"]);
    let out = run_with(cmd, || {
        // SAFETY: closing fd 0 in the child before exec.
        unsafe { libc::close(0) };
        Ok(())
    });
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        one_stderr_line(&out),
        "care: stdin is closed: Bad file descriptor (EBADF)\n"
    );
    // stdin open for writing only: reading it fails.
    let path = tmp("write-only", b"");
    let out = care()
        .args(["advantages", "--strict", "-"])
        .stdin(OpenOptions::new().write(true).open(&path).unwrap())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = one_stderr_line(&out);
    assert!(err.starts_with("care: cannot read stdin: "), "{err}");
    assert!(err.contains("(EBADF)"), "{err}");
    // An empty stdin is still empty input.
    let out = care()
        .args(["advantages", "-"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!((out.status.code(), out.stdout.len()), (Some(0), 0));
}

#[test]
fn thread_counts_are_bounded_and_spawn_failures_are_one_line() {
    let mut many = String::new();
    for k in 0..5000 {
        many.push_str(&adv_line(k));
        many.push('\n');
    }
    let input = tmp("threads.jsonl", many.as_bytes());
    let out = care()
        .args(["advantages", "--threads", "100000"])
        .arg(&input)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = one_stderr_line(&out);
    assert!(
        err.contains("--threads 100000") && err.contains("1024"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
    // The help states the limit.
    let help = care().args(["advantages", "--help"]).output().unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    assert!(
        help.contains(&format!("at most {}", care_cli::engine::MAX_THREADS)),
        "{help}"
    );
    // 1000 threads need about 2 GB of stack address space: under a 256 MiB limit starting
    // them fails, before anything is read or written.
    let mut cmd = care();
    cmd.args(["advantages", "--threads", "1000"]).arg(&input);
    let out = run_with(cmd, || limit_address_space(256 << 20));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = one_stderr_line(&out);
    assert!(
        err.starts_with("care: cannot start 1000 worker threads (--threads): "),
        "{err}"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn the_input_id_is_echoed_byte_for_byte() {
    let ids = [
        "18446744073709551616",
        "1e2",
        "-0",
        "1.50",
        "-12345678901234567890123",
        r#""a\"b\\c\u00e9\ud83d\ude00""#,
        r#"{"run": [1, 2.0, {"x": null}], "k" : "v"}"#,
        "[]",
        "true",
        "null",
    ];
    let mut input = String::new();
    for id in ids {
        input.push_str(&format!(
            r#"{{"id": {id} , "rewards":[1,0],"group_size":2}}"#
        ));
        input.push('\n');
    }
    // Also on an error line's sibling: ids are copied for every subcommand.
    input.push_str(r#"{"id":1e2,"logp":[-1],"seq_offsets":[0,1],"advantages":[1]}"#);
    input.push('\n');
    let path = tmp("ids.jsonl", input.as_bytes());
    let out = care().arg("advantages").arg(&path).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    for (k, id) in ids.iter().enumerate() {
        let want = format!(r#"{{"line":{},"id":{id},"advantages":"#, k + 1);
        assert!(lines[k].starts_with(&want), "{} vs {want}", lines[k]);
        serde_json::from_str::<serde_json::Value>(lines[k]).unwrap();
    }
    let out = care().arg("loss").arg(&path).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.lines()
            .last()
            .unwrap()
            .starts_with(r#"{"line":11,"id":1e2,"loss":"#),
        "{text}"
    );
}

// ---- memory -------------------------------------------------------------------------------

/// Caps the child's address space (`ulimit -v`).
fn limit_address_space(bytes: u64) -> std::io::Result<()> {
    let lim = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: bytes,
    };
    // SAFETY: setrlimit with a valid struct.
    if unsafe { libc::setrlimit(libc::RLIMIT_AS, &lim) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

const MIB: usize = 1 << 20;

/// The line limit of the memory tests.
const MAX_LINE: usize = 4 * MIB;

/// The peak-memory bound of docs/RELIABILITY.md ("Streaming") for `--threads 2` and `--max-line-bytes L` (4 MiB), with
/// `C` = 8 MiB chunks, `T` = 2 workers, `R` = one 256 KiB read and `O` = max(L, 1 MiB): input
/// `2 (C + L + R) + L + R`, work
/// `K min(C + L, T L)` with `K` = 16, output `0.75 C + 3 O`, plus the process itself (binary,
/// stacks, allocator), which a debug build keeps under 64 MiB of address space. About
/// 240 MiB, where holding a chunk's output or a `serde_json::Value` per number needs 320 to
/// 550 MiB for the same lines.
fn address_space_limit() -> u64 {
    let (c, l, r, t, k) = (8 * MIB, MAX_LINE, MIB / 4, 2, 16);
    let o = l.max(MIB);
    let bound = 2 * (c + l + r) + l + r + k * (c + l).min(t * l) + 3 * c / 4 + 3 * o;
    (bound + 64 * MIB) as u64
}

/// Runs `sub` on `lines` under the address-space limit with 2 worker threads and one malloc
/// arena (arena reservations would make the limit depend on the machine), and returns its
/// output lines.
fn run_limited(sub: &str, lines: &[String]) -> Vec<String> {
    let path = tmp(&format!("mem-{sub}.jsonl"), lines.join("\n").as_bytes());
    let mut cmd = care();
    cmd.args([sub, "--threads", "2", "--max-line-bytes"])
        .arg(MAX_LINE.to_string())
        .arg(&path)
        .env("MALLOC_ARENA_MAX", "1");
    let limit = address_space_limit();
    let out = run_with(cmd, move || limit_address_space(limit));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{sub} under {limit} bytes: {:?} {err}",
        out.status
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let got: Vec<String> = text.lines().map(str::to_owned).collect();
    assert_eq!(
        got.len(),
        lines.len(),
        "{sub}: one output line per input line"
    );
    for (k, l) in got.iter().enumerate() {
        assert!(
            l.starts_with(&format!("{{\"line\":{},", k + 1)),
            "{sub}: {}",
            &l[..l.len().min(200)]
        );
        assert!(
            l.len() <= MAX_LINE,
            "{sub}: line {} is {} bytes",
            k + 1,
            l.len()
        );
    }
    got
}

/// A line of `{"<key>":[x,x,...]<rest>}` of about `bytes` bytes.
fn big_array_line(key: &str, x: &str, bytes: usize, rest: &str) -> (String, usize) {
    let n = (bytes - rest.len() - key.len() - 8) / (x.len() + 1);
    let mut s = String::with_capacity(bytes);
    s.push_str(&format!("{{\"{key}\":["));
    for k in 0..n {
        if k > 0 {
            s.push(',');
        }
        s.push_str(x);
    }
    s.push(']');
    s.push_str(rest);
    s.push('}');
    (s, n)
}

fn assert_output_too_long(line: &str) {
    assert!(
        line.contains(r#""code":"output_too_long""#),
        "{}",
        &line[..line.len().min(300)]
    );
}

#[test]
fn advantages_with_lines_near_the_maximum_stay_within_the_memory_bound() {
    let small = adv_line(7);
    // Singleton groups: the output is about 26 times the input, far over the output limit.
    let (big, _) = big_array_line("rewards", "0", MAX_LINE - 100, r#","group_size":1"#);
    // Groups of 8 whose output fits: about 2.5 times a quarter-size input.
    let (fits, n) = big_array_line("rewards", "0.5", MAX_LINE / 4, r#","group_size":8"#);
    let got = run_limited(
        "advantages",
        &[
            small.clone(),
            big.clone(),
            big.clone(),
            fits.clone(),
            big,
            small,
        ],
    );
    assert!(
        got[0].contains(r#""advantages":[0.70710576,-0.70710576"#),
        "{}",
        got[0]
    );
    assert_output_too_long(&got[1]);
    assert_output_too_long(&got[2]);
    let v: serde_json::Value = serde_json::from_str(&got[3]).unwrap();
    assert_eq!(v["advantages"].as_array().unwrap().len(), n - n % 8);
    assert_output_too_long(&got[4]);
    assert_eq!(got[5].replace("\"line\":6,", "\"line\":1,"), got[0]);
}

#[test]
fn loss_with_lines_near_the_maximum_stays_within_the_memory_bound() {
    let small = r#"{"logp":[-1,-2],"seq_offsets":[0,2],"advantages":[1]}"#.to_owned();
    let rest = r#","seq_offsets":[0,SEQ],"advantages":[1]"#;
    let (big, n) = big_array_line("logp", "0", MAX_LINE - 100, rest);
    let big = big.replace("SEQ", &n.to_string());
    let (fits, m) = big_array_line(
        "logp",
        "-1",
        MAX_LINE / 8,
        r#","seq_offsets":[0,SEQ],"advantages":[1]"#,
    );
    let fits = fits.replace("SEQ", &m.to_string());
    let got = run_limited("loss", &[small.clone(), big.clone(), fits, big, small]);
    assert!(got[0].contains(r#""grad":[-0.5,-0.5]"#), "{}", got[0]);
    assert_output_too_long(&got[1]);
    let v: serde_json::Value = serde_json::from_str(&got[2]).unwrap();
    assert_eq!(v["grad"].as_array().unwrap().len(), m);
    assert_output_too_long(&got[3]);
    assert!(got[4].contains(r#""grad":[-0.5,-0.5]"#));
}

#[test]
fn a_scored_group_with_lines_near_the_maximum_stays_within_the_memory_bound() {
    let rubric = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/score_valid.jsonl"
    ))
    .unwrap();
    let rubric: serde_json::Value = serde_json::from_str(rubric.lines().nth(7).unwrap()).unwrap();
    let rubric = rubric["rubric"].to_string();
    // Responses whose answers are longer than they are: failed judges get an error each.
    let group = |bytes: usize| {
        let mut s = format!(r#"{{"rubric":{rubric},"responses":["#);
        let mut k = 0usize;
        while s.len() < bytes {
            if k > 0 {
                s.push(',');
            }
            s.push_str(if k.is_multiple_of(2) {
                r#"{"judge":"x"}"#
            } else {
                r#"{"scores":[[1,2],[3,4],[5,0]]}"#
            });
            k += 1;
        }
        s.push_str("]}");
        (s, k)
    };
    let (big, _) = group(MAX_LINE - 200);
    let (fits, k) = group(MAX_LINE / 16);
    let single = format!(r#"{{"rubric":{rubric},"scores":[[1,2],[3,4],[5,0]]}}"#);
    let got = run_limited("score", &[single.clone(), big.clone(), fits, big, single]);
    assert!(got[0].contains(r#""reward":0.49"#), "{}", got[0]);
    assert_output_too_long(&got[1]);
    let v: serde_json::Value = serde_json::from_str(&got[2]).unwrap();
    assert_eq!(v["rewards"].as_array().unwrap().len(), k);
    assert_eq!(v["failed"], (k as u64).div_ceil(2));
    assert_output_too_long(&got[3]);
    assert!(got[4].contains(r#""reward":0.49"#));
}
