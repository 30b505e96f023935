//! The JSON Lines engine: stream lines with bounded memory, process chunks on every core, write
//! exactly one output line per input line in input order.
//!
//! Memory is bounded by two chunks (the one being processed and the one being read meanwhile),
//! each at most [`EngineOptions::chunk_bytes`] plus one line of at most
//! [`EngineOptions::max_line_bytes`]; a longer line is skipped while reading (never buffered)
//! and reported as `line_too_long`.

use std::io::{self, BufRead, Write};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::json::{LineError, push_error_line};

/// Default maximum line length: 16 MiB.
pub const DEFAULT_MAX_LINE_BYTES: usize = 16 << 20;

/// Inputs with more lines than this show a progress bar (when stderr is a terminal).
pub const PROGRESS_MIN_LINES: u64 = 100_000;

/// Processes one input line. Implemented by the CLI's subcommands and by test processors.
pub trait LineProcessor: Sync {
    /// Appends exactly one JSON object (no newline) for input line `line` (1-based) to `out`;
    /// returns `false` when that object is an error line.
    fn process(&self, line: u64, bytes: &[u8], out: &mut String) -> bool;
}

/// How the engine reads, splits and reports.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Longest accepted line in bytes, not counting the `\n` (a `\r` before it counts).
    pub max_line_bytes: usize,
    /// Worker threads; 0 means all available cores.
    pub threads: usize,
    /// A chunk holds at most this many lines ...
    pub chunk_lines: usize,
    /// ... or stops growing once it holds this many bytes.
    pub chunk_bytes: usize,
    /// Draw a progress bar on stderr once more than [`PROGRESS_MIN_LINES`] lines were read.
    pub progress: bool,
    /// Input size in bytes when known (a file), for the progress percentage.
    pub total_bytes: Option<u64>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            max_line_bytes: DEFAULT_MAX_LINE_BYTES,
            threads: 0,
            chunk_lines: 4096,
            chunk_bytes: 8 << 20,
            progress: false,
            total_bytes: None,
        }
    }
}

/// What a run saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Input lines read (= output lines written).
    pub lines: u64,
    /// Output lines that are error lines.
    pub failed: u64,
}

/// One line of a chunk: a byte range of the chunk's buffer, or a line that was too long.
#[derive(Clone, Copy, Debug)]
enum Item {
    Line { start: usize, end: usize },
    TooLong { len: u64 },
}

#[derive(Debug, Default)]
struct Chunk {
    data: Vec<u8>,
    items: Vec<Item>,
    bytes_read: u64,
}

/// Reads lines from a `BufRead` without ever holding more than `max` bytes of one line.
struct LineReader<R> {
    inner: R,
    max: usize,
}

impl<R: BufRead> LineReader<R> {
    /// Appends the next line (without `\n`, and without a final `\r`) to `buf`.
    /// Returns the item, the bytes consumed, or `None` at end of input.
    fn next_into(&mut self, buf: &mut Vec<u8>) -> io::Result<Option<(Item, u64)>> {
        let start = buf.len();
        let mut len: u64 = 0;
        let mut consumed: u64 = 0;
        let mut too_long = false;
        let mut any = false;
        loop {
            let avail = match self.inner.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if avail.is_empty() {
                if !any {
                    return Ok(None);
                }
                break;
            }
            any = true;
            let newline = memchr::memchr(b'\n', avail);
            let content = match newline {
                Some(i) => &avail[..i],
                None => avail,
            };
            len += content.len() as u64;
            if !too_long {
                if len > self.max as u64 {
                    // Drop what we kept; from here on we only count.
                    too_long = true;
                    buf.truncate(start);
                } else {
                    buf.extend_from_slice(content);
                }
            }
            let n = newline.map_or(avail.len(), |i| i + 1);
            self.inner.consume(n);
            consumed += n as u64;
            if newline.is_some() {
                break;
            }
        }
        if too_long {
            return Ok(Some((Item::TooLong { len }, consumed)));
        }
        if buf.len() > start && buf.last() == Some(&b'\r') {
            buf.pop();
        }
        Ok(Some((
            Item::Line {
                start,
                end: buf.len(),
            },
            consumed,
        )))
    }

    /// Refills `chunk` (emptied first, its buffers reused) with the next lines.
    fn read_chunk(&mut self, opts: &EngineOptions, chunk: &mut Chunk) -> io::Result<()> {
        chunk.data.clear();
        chunk.items.clear();
        chunk.bytes_read = 0;
        while chunk.items.len() < opts.chunk_lines.max(1) && chunk.data.len() < opts.chunk_bytes {
            match self.next_into(&mut chunk.data)? {
                Some((item, n)) => {
                    chunk.items.push(item);
                    chunk.bytes_read += n;
                }
                None => break,
            }
        }
        Ok(())
    }
}

/// Output of one block of consecutive lines.
struct Block {
    text: String,
    failed: u64,
}

fn process_item(
    proc_: &dyn LineProcessor,
    chunk: &Chunk,
    item: Item,
    line: u64,
    max: usize,
    out: &mut String,
) -> bool {
    match item {
        Item::TooLong { len } => {
            let err = LineError::new(
                "line_too_long",
                format!("line has {len} bytes, more than the maximum of {max} (--max-line-bytes)"),
            );
            push_error_line(out, line, &err);
            false
        }
        Item::Line { start, end } => {
            let bytes = chunk.data.get(start..end).unwrap_or_default();
            let mark = out.len();
            // A panic in one line's processing is a bug, but it must not take the other lines
            // of the stream down with it; the line gets an error line instead.
            match catch_unwind(AssertUnwindSafe(|| proc_.process(line, bytes, out))) {
                Ok(ok) => ok,
                Err(_) => {
                    out.truncate(mark);
                    let err = LineError::new("internal_error", "internal error (a bug in care)");
                    push_error_line(out, line, &err);
                    false
                }
            }
        }
    }
}

fn process_block(
    proc_: &dyn LineProcessor,
    chunk: &Chunk,
    range: core::ops::Range<usize>,
    first_line: u64,
    max: usize,
) -> Block {
    let mut text = String::new();
    let mut failed = 0;
    for i in range {
        if let Some(&item) = chunk.items.get(i) {
            if !process_item(proc_, chunk, item, first_line + i as u64, max, &mut text) {
                failed += 1;
            }
            text.push('\n');
        }
    }
    Block { text, failed }
}

/// Processes a chunk on `threads` threads; the blocks come back in input order.
fn process_chunk(
    proc_: &dyn LineProcessor,
    chunk: &Chunk,
    first_line: u64,
    threads: usize,
    max: usize,
) -> Vec<Block> {
    let n = chunk.items.len();
    if threads <= 1 || n < 2 {
        return vec![process_block(proc_, chunk, 0..n, first_line, max)];
    }
    // Several blocks per thread so that a few slow lines do not leave the other threads idle.
    let block_len = n.div_ceil(threads * 8).max(1);
    let blocks = n.div_ceil(block_len);
    let next = AtomicUsize::new(0);
    let mut slots: Vec<Option<Block>> = (0..blocks).map(|_| None).collect();
    let done: Vec<Vec<(usize, Block)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads.min(blocks))
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let b = next.fetch_add(1, Ordering::Relaxed);
                        if b >= blocks {
                            break;
                        }
                        let range = b * block_len..((b + 1) * block_len).min(n);
                        mine.push((b, process_block(proc_, chunk, range, first_line, max)));
                    }
                    mine
                })
            })
            .collect();
        // process_item catches panics, so a worker can only die from an abort.
        handles.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    for (b, block) in done.into_iter().flatten() {
        if let Some(slot) = slots.get_mut(b) {
            *slot = Some(block);
        }
    }
    slots.into_iter().flatten().collect()
}

/// Streams `input` through `proc_`, writing one line per input line to `out` in input order.
///
/// Per-line failures are data (error lines); the only `Err` is an I/O error on input or output.
pub fn run<R: BufRead, W: Write>(
    proc_: &dyn LineProcessor,
    input: R,
    mut out: W,
    opts: &EngineOptions,
) -> io::Result<Summary> {
    let threads = if opts.threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        opts.threads
    };
    let max = opts.max_line_bytes;
    let mut reader = LineReader { inner: input, max };
    let mut summary = Summary::default();
    let mut progress = Progress::new(opts);
    // Two chunks take turns: the workers process one while this thread refills the other.
    // Reusing their buffers (instead of a fresh 8 MiB chunk each time) saves the page faults
    // and page clearing that were a visible share of `care validate`'s time.
    let mut cur = Chunk::default();
    let mut spare = Chunk::default();
    reader.read_chunk(opts, &mut cur)?;
    while !cur.items.is_empty() {
        let first_line = summary.lines + 1;
        let (blocks, next) = std::thread::scope(|s| {
            let worker = s.spawn(|| process_chunk(proc_, &cur, first_line, threads, max));
            let next = reader.read_chunk(opts, &mut spare);
            (worker.join(), next)
        });
        let blocks = blocks.map_err(|_| io::Error::other("a worker thread died"))?;
        for b in &blocks {
            out.write_all(b.text.as_bytes())?;
            summary.failed += b.failed;
        }
        summary.lines += cur.items.len() as u64;
        progress.update(summary.lines, cur.bytes_read);
        next?;
        std::mem::swap(&mut cur, &mut spare);
    }
    out.flush()?;
    progress.finish();
    Ok(summary)
}

/// A one-line progress bar on stderr, drawn once more than [`PROGRESS_MIN_LINES`] lines were
/// read, then every [`PROGRESS_EVERY`] lines and once at the end.
struct Progress {
    enabled: bool,
    shown: bool,
    lines: u64,
    drawn_at: u64,
    bytes: u64,
    total: Option<u64>,
}

/// Lines between two redraws of the progress bar (counting lines, not time, keeps it
/// deterministic and cheap).
const PROGRESS_EVERY: u64 = 50_000;

impl Progress {
    fn new(opts: &EngineOptions) -> Self {
        Progress {
            enabled: opts.progress,
            shown: false,
            lines: 0,
            drawn_at: 0,
            bytes: 0,
            total: opts.total_bytes,
        }
    }

    fn update(&mut self, lines: u64, bytes: u64) {
        self.bytes += bytes;
        self.lines = lines;
        if self.enabled && lines > PROGRESS_MIN_LINES && lines - self.drawn_at >= PROGRESS_EVERY {
            self.draw();
        }
    }

    fn draw(&mut self) {
        self.shown = true;
        self.drawn_at = self.lines;
        let lines = self.lines;
        let mib = self.bytes as f64 / (1u64 << 20) as f64;
        let mut err = io::stderr().lock();
        let _ = match self.total.filter(|&t| t > 0) {
            Some(t) => {
                let frac = (self.bytes as f64 / t as f64).min(1.0);
                let filled = ((frac * 30.0) as usize).min(30);
                write!(
                    err,
                    "\rcare [{}{}] {:5.1}%  {lines} lines  {mib:.1} MiB",
                    "#".repeat(filled),
                    "-".repeat(30 - filled),
                    frac * 100.0
                )
            }
            None => write!(err, "\rcare: {lines} lines  {mib:.1} MiB"),
        };
        let _ = err.flush();
    }

    fn finish(&mut self) {
        if self.shown {
            if self.drawn_at != self.lines {
                self.draw();
            }
            let _ = writeln!(io::stderr());
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    /// Echoes the line's length and first byte; fails on lines starting with `!`.
    struct Echo;
    impl LineProcessor for Echo {
        fn process(&self, line: u64, bytes: &[u8], out: &mut String) -> bool {
            if bytes.first() == Some(&b'!') {
                push_error_line(out, line, &LineError::new("bang", "bang"));
                return false;
            }
            if bytes.first() == Some(&b'P') {
                panic!("test panic");
            }
            out.push_str(&format!("{{\"line\":{line},\"len\":{}}}", bytes.len()));
            true
        }
    }

    fn run_str(input: &[u8], opts: &EngineOptions) -> (String, Summary) {
        let mut out = Vec::new();
        let s = run(&Echo, input, &mut out, opts).unwrap();
        (String::from_utf8(out).unwrap(), s)
    }

    #[test]
    fn one_output_line_per_input_line_in_order_for_any_thread_count() {
        let mut input = Vec::new();
        for i in 0..1000 {
            if i % 10 == 3 {
                input.push(b'!');
            }
            input.extend(std::iter::repeat_n(b'x', i % 37));
            input.extend_from_slice(if i % 7 == 0 { b"\r\n" } else { b"\n" });
        }
        let single = EngineOptions {
            threads: 1,
            chunk_lines: 1000,
            ..Default::default()
        };
        let (expect, s1) = run_str(&input, &single);
        assert_eq!(s1.lines, 1000);
        assert_eq!(s1.failed, 100, "every tenth line starts with '!'");
        assert_eq!(expect.lines().count(), 1000);
        for (i, l) in expect.lines().enumerate() {
            assert!(l.starts_with(&format!("{{\"line\":{},", i + 1)), "{l}");
        }
        for threads in [2, 3, 8] {
            for chunk_lines in [1, 7, 64] {
                let opts = EngineOptions {
                    threads,
                    chunk_lines,
                    ..Default::default()
                };
                assert_eq!(run_str(&input, &opts), (expect.clone(), s1));
            }
        }
    }

    #[test]
    fn too_long_lines_are_reported_and_skipped_without_buffering() {
        let opts = EngineOptions {
            max_line_bytes: 4,
            threads: 2,
            ..Default::default()
        };
        // A tiny BufReader capacity forces the long line across many fill_buf calls.
        let input: &[u8] = b"abcd\nabcdefghij\n!x\nab";
        let reader = std::io::BufReader::with_capacity(3, input);
        let mut out = Vec::new();
        let s = run(&Echo, reader, &mut out, &opts).unwrap();
        let out = String::from_utf8(out).unwrap();
        let lines: Vec<_> = out.lines().collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[0], r#"{"line":1,"len":4}"#);
        assert!(
            lines[1].contains(r#""code":"line_too_long""#),
            "{}",
            lines[1]
        );
        assert!(lines[1].contains("line has 10 bytes"), "{}", lines[1]);
        assert!(lines[2].contains(r#""code":"bang""#));
        assert_eq!(
            lines[3], r#"{"line":4,"len":2}"#,
            "last line without newline counts"
        );
        assert_eq!(
            s,
            Summary {
                lines: 4,
                failed: 2
            }
        );
    }

    #[test]
    fn empty_input_gives_no_output_and_blank_lines_are_lines() {
        let (out, s) = run_str(b"", &EngineOptions::default());
        assert_eq!((out.as_str(), s), ("", Summary::default()));
        let (out, s) = run_str(b"\n\n", &EngineOptions::default());
        assert_eq!(out, "{\"line\":1,\"len\":0}\n{\"line\":2,\"len\":0}\n");
        assert_eq!(s.lines, 2);
    }

    #[test]
    fn a_panicking_line_becomes_an_error_line() {
        let (out, s) = run_str(b"ok\nPanic\nok\n", &EngineOptions::default());
        let lines: Vec<_> = out.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[1].starts_with(r#"{"line":2,"error":{"code":"internal_error""#));
        assert_eq!(s.failed, 1);
    }
}
