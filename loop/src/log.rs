//! `care serve --log FILE`: one JSON line per rewarded response, for `care analyze`'s
//! reward-health views (docs/REWARD_LOOP.md, "The response log", defines the record).
//!
//! The server never waits for the disk: each turn's records go as one message into a bounded
//! queue ([`ResponseLog::open`]'s `queue`, in turns) read by a writer thread; when the queue is
//! full the turn's records are dropped and counted (`care_log_records_total{result="dropped"}`).
//! The writer flushes whenever the queue is empty, and rotates the file when it would pass
//! `max_bytes`: `FILE` becomes `FILE.1` (replacing an older one) and a new `FILE` starts, so
//! the log takes at most about twice `max_bytes` on disk.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use serde_json::Value;

use crate::engine::TurnResult;
use crate::metrics::Metrics;

/// The record version (`care_log`); `care analyze` refuses other versions.
pub const LOG_VERSION: u32 = 1;
/// Turns queued for the writer by default.
pub const DEFAULT_QUEUE: usize = 1024;
/// Size at which the log rotates by default (1 GiB).
pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;

enum Msg {
    Lines(String, u64),
    Stop,
}

/// The response log of a server.
#[derive(Debug)]
pub struct ResponseLog {
    tx: SyncSender<Msg>,
    groups: AtomicU64,
    metrics: Arc<Metrics>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

/// One record: a response with its turn's facts (docs/REWARD_LOOP.md).
#[derive(Serialize)]
struct Record<'a> {
    care_log: u32,
    unix_ms: u64,
    group: u64,
    index: usize,
    group_size: usize,
    /// The number of seeker turns, unless the caller's `meta` names the turn itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    turn: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a Value>,
    /// The turn's `meta` as the caller wrote it (`care analyze` groups by its `variant`,
    /// `emotion` and `turn`).
    #[serde(skip_serializing_if = "Option::is_none")]
    meta: Option<&'a crate::engine::Meta>,
    rubric_status: &'a str,
    rubric_attempts: u32,
    repairs: usize,
    rubric_weights: Option<[f64; 3]>,
    status: &'a str,
    reward: Option<f64>,
    judge_attempts: u32,
    scores: Option<&'a Vec<Vec<f64>>>,
    response_chars: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    /// The panel's part of the response (each judge's reward and scores, the spread, the
    /// flag), as `care reward` writes it under `responses[].panel`; absent for a single judge.
    #[serde(skip_serializing_if = "Option::is_none")]
    panel: Option<&'a crate::panel::PanelResult>,
}

/// The weights of a rubric as the output carries it (`categories[].category_weight`, by
/// category name), when it has all three.
fn weights(rubric: Option<&Value>) -> Option<[f64; 3]> {
    let cats = rubric?.get("categories")?.as_array()?;
    let mut w = [None; 3];
    for c in cats {
        let d = care_core::Dimension::from_json_name(c.get("category")?.as_str()?)?;
        w[d.index()] = c.get("category_weight")?.as_f64();
    }
    Some([w[0]?, w[1]?, w[2]?])
}

impl ResponseLog {
    /// Opens `path` for appending and starts the writer thread.
    ///
    /// # Errors
    /// The file cannot be opened, or `queue` or `max_bytes` is 0.
    pub fn open(
        path: &Path,
        max_bytes: u64,
        queue: usize,
        metrics: Arc<Metrics>,
    ) -> Result<ResponseLog, String> {
        if queue == 0 || max_bytes == 0 {
            return Err("--log-queue and --log-max-bytes must be at least 1".to_owned());
        }
        let file = open_append(path)?;
        let written = file.metadata().map(|m| m.len()).unwrap_or(0);
        let (tx, rx) = sync_channel(queue);
        let m = Arc::clone(&metrics);
        let path = path.to_owned();
        let worker = std::thread::Builder::new()
            .name("care-log".to_owned())
            .spawn(move || write_loop(rx, path, file, written, max_bytes, &m))
            .map_err(|e| format!("cannot start the log writer: {e}"))?;
        Ok(ResponseLog {
            tx,
            groups: AtomicU64::new(0),
            metrics,
            worker: Mutex::new(Some(worker)),
        })
    }

    /// Queues the records of one turn: `seeker_turns` is the dialogue's turn (the number of
    /// user messages in its context). Never blocks: with the queue full the records are
    /// dropped and counted.
    pub fn record_turn(&self, seeker_turns: usize, r: &TurnResult) {
        let group = self.groups.fetch_add(1, Ordering::Relaxed);
        let unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let rubric = r.rubric.as_ref().map(crate::profile::RubricJson::to_value);
        let w = weights(rubric.as_ref()).filter(|_| r.rubric_status == "ok");
        // A turn the caller labelled in `meta` keeps that label: `care analyze` refuses a
        // grouping member given twice.
        let meta_turn = r.meta.as_ref().is_some_and(|m| {
            serde_json::from_str::<serde_json::Map<String, Value>>(m.get())
                .is_ok_and(|o| o.contains_key("turn"))
        });
        let mut lines = String::new();
        let n = r.responses.len();
        for (j, resp) in r.responses.iter().enumerate() {
            let rec = Record {
                care_log: LOG_VERSION,
                unix_ms,
                group,
                index: j,
                group_size: n,
                turn: (!meta_turn).then_some(seeker_turns),
                id: r.id.as_ref(),
                meta: r.meta.as_ref(),
                rubric_status: r.rubric_status,
                rubric_attempts: r.rubric_attempts,
                repairs: r.repairs.len(),
                rubric_weights: w,
                status: resp.status,
                reward: resp.reward,
                judge_attempts: resp.judge_attempts,
                scores: resp.scores.as_ref(),
                response_chars: r.response_chars.get(j).copied().unwrap_or(0),
                error: resp.error.as_ref().map(|e| e.code.as_str()),
                panel: resp.panel.as_ref(),
            };
            match serde_json::to_string(&rec) {
                Ok(s) => {
                    lines.push_str(&s);
                    lines.push('\n');
                }
                Err(_) => self.metrics.log_records("failed", 1),
            }
        }
        let k = n as u64;
        match self.tx.try_send(Msg::Lines(lines, k)) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.metrics.log_records("dropped", k);
            }
        }
    }

    /// Writes what is queued, flushes and stops the writer (at shutdown, after the last
    /// request). Later records are dropped.
    pub fn close(&self) {
        // Blocking is fine here: no request is in flight any more.
        let _ = self.tx.send(Msg::Stop);
        let handle = self
            .worker
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

fn open_append(path: &Path) -> Result<File, String> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| format!("cannot open the log {}: {e}", path.display()))
}

fn rotated(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".1");
    PathBuf::from(name)
}

struct Writer<'m> {
    path: PathBuf,
    out: Option<BufWriter<File>>,
    written: u64,
    max_bytes: u64,
    metrics: &'m Metrics,
    warned: bool,
}

impl Writer<'_> {
    fn fail(&mut self, k: u64, e: &str) {
        self.metrics.log_records("failed", k);
        if !self.warned {
            eprintln!(
                "care serve: the response log is failing (records are counted as failed): {e}"
            );
            self.warned = true;
        }
    }

    fn rotate(&mut self) {
        if let Some(mut w) = self.out.take() {
            let _ = w.flush();
        }
        let _ = std::fs::rename(&self.path, rotated(&self.path));
        self.written = 0;
        match open_append(&self.path) {
            Ok(f) => self.out = Some(BufWriter::new(f)),
            Err(e) => self.fail(0, &e),
        }
    }

    /// Writes one turn's lines; `false` on the stop message.
    fn handle(&mut self, msg: Msg) -> bool {
        let (lines, k) = match msg {
            Msg::Stop => return false,
            Msg::Lines(l, k) => (l, k),
        };
        if self.written > 0 && self.written + lines.len() as u64 > self.max_bytes {
            self.rotate();
        }
        match self.out.as_mut().map(|w| w.write_all(lines.as_bytes())) {
            Some(Ok(())) => {
                self.written += lines.len() as u64;
                self.metrics.log_records("written", k);
            }
            Some(Err(e)) => self.fail(k, &e.to_string()),
            None => self.fail(k, "the log file is not open"),
        }
        true
    }

    fn flush(&mut self) {
        if let Some(w) = self.out.as_mut()
            && let Err(e) = w.flush()
        {
            self.fail(0, &e.to_string());
        }
    }
}

fn write_loop(
    rx: Receiver<Msg>,
    path: PathBuf,
    file: File,
    written: u64,
    max_bytes: u64,
    metrics: &Metrics,
) {
    let mut w = Writer {
        path,
        out: Some(BufWriter::new(file)),
        written,
        max_bytes,
        metrics,
        warned: false,
    };
    'outer: while let Ok(msg) = rx.recv() {
        if !w.handle(msg) {
            break;
        }
        // Drain what is queued before flushing: one flush per burst.
        while let Ok(msg) = rx.try_recv() {
            if !w.handle(msg) {
                break 'outer;
            }
        }
        w.flush();
    }
    w.flush();
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::LoopConfig;
    use crate::engine::{BackendKind, Engine, TurnInput};

    /// A real turn of the scripted loop (one repair, two recorded responses and one that the
    /// scripted judge never scores), so the records come from the engine's own result.
    async fn turn() -> TurnResult {
        let engine = Arc::new(
            Engine::new(
                &LoopConfig::default(),
                BackendKind::Scripted,
                None,
                Arc::new(Metrics::new()),
            )
            .unwrap(),
        );
        let demo: Value =
            serde_json::from_str(include_str!("../../cli/data/reward_demo.jsonl").trim()).unwrap();
        // Through serde, as a request arrives: a member added to the input keeps this working.
        let input: TurnInput = serde_json::from_value(serde_json::json!({
            "id": "t",
            "context": demo["context"],
            "responses": [demo["responses"][0], demo["responses"][1], demo["responses"][6]],
        }))
        .unwrap();
        engine.run_turn(input).await.unwrap()
    }

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("care-log-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[tokio::test]
    async fn records_are_one_line_per_response_and_the_file_rotates() {
        let t = turn().await;
        let d = dir("rotate");
        let path = d.join("serve.jsonl");
        let metrics = Arc::new(Metrics::new());
        // A limit below two turns' records: the file rotates.
        let one_turn = {
            let probe = d.join("probe.jsonl");
            let log = ResponseLog::open(&probe, 1 << 20, 16, Arc::new(Metrics::new())).unwrap();
            log.record_turn(2, &t);
            log.close();
            std::fs::metadata(&probe).unwrap().len()
        };
        let log = ResponseLog::open(&path, one_turn * 3 / 2, 16, Arc::clone(&metrics)).unwrap();
        for _ in 0..5 {
            log.record_turn(2, &t);
        }
        log.close();
        let now = std::fs::read_to_string(&path).unwrap();
        let old = std::fs::read_to_string(rotated(&path)).unwrap();
        assert_eq!(now.lines().count(), 3, "the last turn");
        assert_eq!(old.lines().count(), 3, "the turn before");
        let recs: Vec<Value> = old
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(recs[0]["care_log"], 1);
        assert_eq!(
            (recs[0]["turn"].clone(), recs[0]["group_size"].clone()),
            (2.into(), 3.into())
        );
        assert_eq!(recs[0]["rubric_attempts"], 2);
        assert_eq!(recs[0]["repairs"], 1);
        assert_eq!(
            recs[0]["rubric_weights"],
            serde_json::json!([0.4, 0.25, 0.35])
        );
        assert_eq!(recs[0]["reward"], 0.925);
        assert_eq!(recs[2]["status"], "judge_invalid");
        assert_eq!(recs[2]["reward"], Value::Null);
        assert_eq!(recs[2]["error"], "no_judge_json");
        assert_eq!(recs[1]["index"], 1);
        for (r, j) in recs.iter().zip([0, 1, 6]) {
            let demo: Value =
                serde_json::from_str(include_str!("../../cli/data/reward_demo.jsonl").trim())
                    .unwrap();
            let len = demo["responses"][j].as_str().unwrap().chars().count() as u64;
            assert_eq!(r["response_chars"], len);
        }
        let text = metrics.render();
        assert!(
            text.contains("care_log_records_total{result=\"written\"} 15"),
            "{text}"
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[tokio::test]
    async fn a_record_that_cannot_be_queued_is_dropped_and_counted() {
        let t = turn().await;
        let d = dir("drop");
        let metrics = Arc::new(Metrics::new());
        let log =
            ResponseLog::open(&d.join("serve.jsonl"), 1 << 20, 4, Arc::clone(&metrics)).unwrap();
        log.close();
        // The writer is gone: the records are dropped at once, the call does not wait.
        log.record_turn(1, &t);
        let text = metrics.render();
        assert!(
            text.contains("care_log_records_total{result=\"dropped\"} 3"),
            "{text}"
        );
        assert!(ResponseLog::open(&d.join("no/such/dir/x"), 1, 1, metrics).is_err());
        let _ = std::fs::remove_dir_all(&d);
    }
}
