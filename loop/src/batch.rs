//! `care reward`: JSON Lines in, one output line per input line, in input order.
//!
//! Turns run concurrently (at most [`Engine::turn_concurrency`] at once) and are written in
//! input order as soon as every earlier line is written. Resuming is rerunning: every call
//! that completed before a stop is in the cache, so the rerun asks the LLM only for the rest
//! and writes the same lines.

use std::collections::{BTreeMap, VecDeque};
use std::io::{self, Write};
use std::sync::Arc;

use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

use crate::engine::{Engine, ErrorOut, TurnInput, TurnResult};

/// Longest input line by default (the other `care` subcommands use the same).
pub const DEFAULT_MAX_LINE_BYTES: usize = 16 << 20;

/// What a run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunSummary {
    /// Input lines read (= output lines written).
    pub lines: u64,
    /// Lines that gave an error line (bad input).
    pub failed_lines: u64,
    /// Responses without a reward (a status other than `ok`), over all turns.
    pub responses_without_reward: u64,
    /// Responses with a reward (a settled status such as `malformed_output` has one: 0).
    pub responses_rewarded: u64,
    /// Responses by status (`ok`, `malformed_output`, `judge_invalid`, ...), over all turns:
    /// a run whose rewards are all settled zeros says so instead of "rewarded".
    pub by_status: BTreeMap<&'static str, u64>,
}

#[derive(Serialize)]
struct Line<'a> {
    line: u64,
    #[serde(flatten)]
    result: &'a TurnResult,
}

#[derive(Serialize)]
struct ErrLine<'a> {
    line: u64,
    error: &'a ErrorOut,
}

enum Read {
    Line(Vec<u8>),
    TooLong(usize),
}

/// Reads one line of at most `max` bytes (without its `\n` or `\r\n`); a longer line is
/// skipped to its end without being held in memory.
async fn read_line<R: AsyncRead + Unpin>(
    r: &mut BufReader<R>,
    max: usize,
) -> io::Result<Option<Read>> {
    let mut buf = Vec::new();
    let mut len = 0usize;
    let mut any = false;
    loop {
        let avail = r.fill_buf().await?;
        if avail.is_empty() {
            break;
        }
        any = true;
        let (part, done) = match memchr_nl(avail) {
            Some(i) => (&avail[..i], true),
            None => (avail, false),
        };
        len += part.len();
        if len <= max {
            buf.extend_from_slice(part);
        }
        let used = part.len() + usize::from(done);
        r.consume(used);
        if done {
            break;
        }
    }
    if !any {
        return Ok(None);
    }
    if len > max {
        return Ok(Some(Read::TooLong(len)));
    }
    if buf.last() == Some(&b'\r') {
        buf.pop();
    }
    Ok(Some(Read::Line(buf)))
}

fn memchr_nl(b: &[u8]) -> Option<usize> {
    b.iter().position(|&c| c == b'\n')
}

/// Processes every line of `input`, writing one line per input line to `out`.
///
/// # Errors
/// Only I/O errors of `input` or `out`.
pub async fn run_jsonl<R, W>(
    engine: Arc<Engine>,
    input: R,
    out: &mut W,
    max_line_bytes: usize,
) -> io::Result<RunSummary>
where
    R: AsyncRead + Unpin,
    W: Write,
{
    let mut reader = BufReader::with_capacity(1 << 16, input);
    let mut pending = Pending(VecDeque::new());
    let mut summary = RunSummary::default();
    let width = engine.turn_concurrency().max(1);
    let mut line_no = 0u64;
    loop {
        let Some(read) = read_line(&mut reader, max_line_bytes).await? else {
            break;
        };
        line_no += 1;
        let n = line_no;
        let eng = Arc::clone(&engine);
        pending.0.push_back((
            n,
            tokio::spawn(async move { process(&eng, n, read, max_line_bytes).await }),
        ));
        while pending.0.len() >= width {
            if let Some((n, h)) = pending.0.pop_front() {
                write_one(n, h, out, &mut summary).await?;
            }
        }
    }
    while let Some((n, h)) = pending.0.pop_front() {
        write_one(n, h, out, &mut summary).await?;
    }
    out.flush()?;
    Ok(summary)
}

/// The turns in flight, with their line numbers; dropped (the run stopped), they stop too.
struct Pending(VecDeque<(u64, tokio::task::JoinHandle<(String, Outcome)>)>);

impl Drop for Pending {
    fn drop(&mut self) {
        for (_, h) in &self.0 {
            h.abort();
        }
    }
}

enum Outcome {
    Turn {
        rewarded: u64,
        without: u64,
        statuses: Vec<&'static str>,
    },
    Failed,
}

async fn write_one<W: Write>(
    line: u64,
    h: tokio::task::JoinHandle<(String, Outcome)>,
    out: &mut W,
    summary: &mut RunSummary,
) -> io::Result<()> {
    // A turn whose task ended without a result (a bug: a panic) is that line's error line; the
    // run goes on, so no later line is lost.
    let (text, outcome) = h.await.unwrap_or_else(|e| {
        let e = ErrorOut {
            code: "internal".to_owned(),
            message: format!("the turn's task stopped without a result: {e}"),
        };
        (to_json(&ErrLine { line, error: &e }), Outcome::Failed)
    });
    summary.lines += 1;
    match outcome {
        Outcome::Turn {
            rewarded,
            without,
            statuses,
        } => {
            summary.responses_rewarded += rewarded;
            summary.responses_without_reward += without;
            for st in statuses {
                *summary.by_status.entry(st).or_default() += 1;
            }
        }
        Outcome::Failed => summary.failed_lines += 1,
    }
    out.write_all(text.as_bytes())?;
    out.write_all(b"\n")?;
    // Each line as soon as it is final: a reader (or a stop) sees whole lines in order.
    out.flush()
}

async fn process(engine: &Arc<Engine>, line: u64, read: Read, max: usize) -> (String, Outcome) {
    let err = |code: &str, message: String| {
        let e = ErrorOut {
            code: code.to_owned(),
            message,
        };
        (to_json(&ErrLine { line, error: &e }), Outcome::Failed)
    };
    let bytes = match read {
        Read::TooLong(len) => {
            return err(
                "line_too_long",
                format!("line has {len} bytes, more than the maximum of {max} (--max-line-bytes)"),
            );
        }
        Read::Line(b) => b,
    };
    let input: TurnInput = match serde_json::from_slice(&bytes) {
        Ok(t) => t,
        Err(e) => {
            let code = match e.classify() {
                serde_json::error::Category::Data => "bad_input",
                _ => "not_json",
            };
            return err(code, e.to_string());
        }
    };
    match engine.run_turn(input).await {
        Ok(r) => {
            let rewarded = r.rewards.iter().flatten().count() as u64;
            let without = r.rewards.len() as u64 - rewarded;
            let statuses = r.responses.iter().map(|x| x.status).collect();
            (
                to_json(&Line { line, result: &r }),
                Outcome::Turn {
                    rewarded,
                    without,
                    statuses,
                },
            )
        }
        Err(e) => (to_json(&ErrLine { line, error: &e }), Outcome::Failed),
    }
}

fn to_json<T: Serialize>(v: &T) -> String {
    // Our own types always serialize (no maps with non-string keys, no failing impls);
    // non-finite floats serialize as null.
    serde_json::to_string(v).unwrap_or_else(|e| {
        format!(
            "{{\"error\":{{\"code\":\"internal\",\"message\":{:?}}}}}",
            e.to_string()
        )
    })
}
