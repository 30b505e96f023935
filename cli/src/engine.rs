//! The JSON Lines engine: stream lines with bounded memory, process them on every core, write
//! exactly one output line per input line in input order, and answer as soon as the input
//! pauses.
//!
//! Threads: the calling thread reads lines into chunks; `threads` workers process a chunk in
//! batches of consecutive lines, taken in order; one writer thread writes the batches in input
//! order as soon as each is complete (nothing waits for the rest of its chunk). All threads
//! start before anything is read, so a thread that cannot start is an error before any output.
//!
//! Memory (`L` = [`EngineOptions::max_line_bytes`], `C` = [`EngineOptions::chunk_bytes`], `T`
//! workers, `O` = [`EngineOptions::max_output_bytes`] = max(L, 1 MiB)):
//!
//! * Input: two chunks (one processed, the next being read), each at most `C + L` bytes plus
//!   one read (256 KiB), since lines are read straight into the buffer of the chunk they end up
//!   in, and what waits between two chunks (the start of a line that spans the cut, at most
//!   `L`, and the rest of that read). A line longer than `L` is counted, never buffered, and
//!   answered with `line_too_long`.
//! * Work: the lines being processed belong to one chunk and are at most `T`, so their working
//!   memory is at most `K min(C + L, T L)`, with `K` the bytes a subcommand needs per input
//!   byte (typed vectors, never a tree of JSON values; 13 for `advantages` with singleton
//!   groups, the largest measured).
//! * Output: an output line longer than `O` is stopped while it is written and replaced by an
//!   `output_too_long` error line. Only the batch the writer needs next (the head) may grow
//!   past a soft limit `S` (`C / 8T`, 16 KiB to 1 MiB); a worker whose batch is not the head
//!   waits at `S` until it is, and workers start at most `2T` batches ahead of the head. So
//!   pending output stays within about `6 T S + 3 O` (about `0.75 C + 3 O`), whatever the
//!   subcommand and however slow the reader of stdout is.
//!
//! Latency: a chunk is cut as soon as the input has nothing more to read at the moment (a read
//! that returned less than asked for; [`Input`] keeps reading while `poll` says more is ready,
//! so a fast pipe still fills chunks), and everything handed over is flushed before the reader
//! blocks. A file, or a pipe that keeps up, fills whole chunks.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, Read, Write};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;

use crate::json::{LineError, push_error_line, set_output_watch};

/// Default maximum line length: 16 MiB.
pub const DEFAULT_MAX_LINE_BYTES: usize = 16 << 20;

/// The output limit never goes below this ([`EngineOptions::max_output_bytes`]).
pub const MIN_OUTPUT_LIMIT: usize = 1 << 20;

/// Most worker threads `--threads` accepts (`0`, one per core, is capped at this too).
pub const MAX_THREADS: usize = 1024;

/// Inputs with more lines than this show a progress bar (when stderr is a terminal).
pub const PROGRESS_MIN_LINES: u64 = 100_000;

/// Size of the engine's read buffer: one `read` call asks for this much.
const READ_BUFFER: usize = 256 << 10;

/// Address space a new thread needs: std's default stack (2 MiB) and room for what the thread
/// maps as it starts (its signal stack and guard pages) with a wide margin.
const THREAD_ROOM: usize = 3 << 20;

/// Whether the address space has room for one more thread: maps [`THREAD_ROOM`] bytes (no
/// access, no reserve, nothing touched) and unmaps them. Under an address-space limit a thread
/// whose stack fits but whose signal stack does not fails inside the new thread, where std
/// aborts the process; this check turns that into a clean spawn error before the spawn.
#[cfg(unix)]
fn room_for_thread() -> io::Result<()> {
    // SAFETY: an anonymous private mapping without an address hint, unmapped at once; the
    // pointer is never dereferenced.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            THREAD_ROOM,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        libc::munmap(p, THREAD_ROOM);
    }
    Ok(())
}

#[cfg(not(unix))]
fn room_for_thread() -> io::Result<()> {
    Ok(())
}

/// Processes one input line. Implemented by the CLI's subcommands and by test processors.
pub trait LineProcessor: Sync {
    /// Appends exactly one JSON object (no newline) for input line `line` (1-based) to `out`;
    /// returns `false` when that object is an error line.
    fn process(&self, line: u64, bytes: &[u8], out: &mut String) -> bool;
}

/// How the engine reads, splits and reports.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Longest accepted line in bytes, not counting the `\n` (a `\r` before it counts); also
    /// the longest output line, at least 1 MiB ([`EngineOptions::max_output_bytes`]).
    pub max_line_bytes: usize,
    /// Worker threads; 0 means all available cores (at most [`MAX_THREADS`]).
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

impl EngineOptions {
    /// Checks the options a user sets; the message names the flag and what it accepts.
    ///
    /// # Errors
    /// `--max-line-bytes 0`, or `--threads` above [`MAX_THREADS`].
    pub fn validate(&self) -> Result<(), String> {
        if self.max_line_bytes == 0 {
            return Err("--max-line-bytes must be at least 1".to_owned());
        }
        if self.threads > MAX_THREADS {
            return Err(format!(
                "--threads {} is more than the maximum of {MAX_THREADS} (0 uses one per core: {} here)",
                self.threads,
                available_cores()
            ));
        }
        Ok(())
    }

    /// Longest output line: the longest input line, but at least [`MIN_OUTPUT_LIMIT`] (an
    /// answer carries line numbers and statistics that a tiny input limit would not fit). With
    /// `--max-line-bytes` of 1 MiB or more, `care`'s output is valid input to another `care`
    /// with the same limit.
    pub fn max_output_bytes(&self) -> usize {
        self.max_line_bytes.max(MIN_OUTPUT_LIMIT)
    }

    /// The worker count `threads` stands for.
    pub fn worker_threads(&self) -> usize {
        match self.threads {
            0 => available_cores().min(MAX_THREADS),
            n => n.min(MAX_THREADS),
        }
    }
}

fn available_cores() -> usize {
    thread::available_parallelism().map_or(1, |n| n.get())
}

/// What a run saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Input lines read (= output lines written).
    pub lines: u64,
    /// Output lines that are error lines.
    pub failed: u64,
}

/// Why a run stopped early. Per-line failures are never errors (they are error lines).
#[derive(Debug)]
pub enum EngineError {
    /// Reading the input failed (the lines read before were answered).
    Read(io::Error),
    /// Writing the output failed (`BrokenPipe` when the reader of stdout went away).
    Write(io::Error),
    /// A thread could not be started; nothing was read or written.
    Spawn {
        /// The worker threads asked for.
        threads: usize,
        /// The operating system's reason.
        error: io::Error,
    },
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EngineError::Read(e) => write!(f, "cannot read the input: {}", os_error(e)),
            EngineError::Write(e) => write!(f, "cannot write the output: {}", os_error(e)),
            EngineError::Spawn { threads, error } => write!(
                f,
                "cannot start {threads} worker threads (--threads): {}; use fewer",
                os_error(error)
            ),
        }
    }
}

impl std::error::Error for EngineError {}

impl From<EngineError> for io::Error {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Read(e) | EngineError::Write(e) => e,
            spawn @ EngineError::Spawn { .. } => io::Error::other(spawn.to_string()),
        }
    }
}

/// Standard descriptors found closed when the process started (bit 0: stdin, bit 1: stdout),
/// as recorded by [`note_closed_at_start`]. The Rust runtime reopens a closed fd 0, 1 or 2 on
/// `/dev/null` before `main` (so that no file gets their numbers by accident), which would
/// make a closed stdout a sink and a closed stdin empty input; the binary looks before that.
static CLOSED_AT_START: AtomicU8 = AtomicU8::new(0);

/// Records which standard descriptors were closed at start (`care`'s `main.rs` calls this
/// from a constructor that runs before the Rust runtime's own start-up).
pub fn note_closed_at_start(stdin: bool, stdout: bool) {
    CLOSED_AT_START.store(u8::from(stdin) | (u8::from(stdout) << 1), Ordering::Relaxed);
}

fn closed_at_start(bit: u8) -> io::Result<()> {
    if CLOSED_AT_START.load(Ordering::Relaxed) & bit != 0 {
        Err(io::Error::from_raw_os_error(libc::EBADF))
    } else {
        Ok(())
    }
}

/// A file descriptor read so that a short read means "nothing more to read right now": after a
/// read that did not fill the buffer, it reads again as long as `poll` says more is ready. A
/// pipe hands out at most its 64 KiB buffer per read, so without this every read from a fast
/// pipe would look like a pause and cut a chunk. The engine cuts chunks (and answers) on short
/// reads ([`run`]).
#[derive(Debug)]
pub struct Input {
    file: std::fs::File,
}

impl Input {
    /// Reads from `file` (stdin, a file, a pipe).
    pub fn new(file: std::fs::File) -> Self {
        Input { file }
    }

    #[cfg(unix)]
    fn ready_now(&self) -> bool {
        use std::os::fd::AsRawFd;
        let mut p = libc::pollfd {
            fd: self.file.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n > 0 && p.revents & (libc::POLLIN | libc::POLLHUP) != 0
    }

    #[cfg(not(unix))]
    fn ready_now(&self) -> bool {
        false
    }
}

impl Read for Input {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut n = self.file.read(buf)?;
        while n > 0 && n < buf.len() && self.ready_now() {
            match self.file.read(buf.get_mut(n..).unwrap_or_default()) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // The bytes read so far are returned; the error comes back on the next read.
                Err(_) => break,
            }
        }
        Ok(n)
    }
}

/// The process's stdout as a handle of its own (a duplicate of fd 1). `std::io::Stdout`
/// silently discards what is written to a stdout closed later (EBADF); care reports it.
///
/// # Errors
/// `EBADF` when stdout is or was closed.
#[cfg(unix)]
pub fn stdout_file() -> io::Result<std::fs::File> {
    use std::os::fd::AsFd;
    closed_at_start(2)?;
    io::stdout()
        .as_fd()
        .try_clone_to_owned()
        .map(std::fs::File::from)
}

/// The process's stdin as a handle of its own (a duplicate of fd 0). `std::io::Stdin` reads a
/// closed stdin (EBADF) as empty input; care reports it.
///
/// # Errors
/// `EBADF` when stdin is or was closed.
#[cfg(unix)]
pub fn stdin_file() -> io::Result<std::fs::File> {
    use std::os::fd::AsFd;
    closed_at_start(1)?;
    io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .map(std::fs::File::from)
}

/// An I/O error as one line that names the cause: the system's description and the `errno`
/// name (`No space left on device (ENOSPC)`), without Rust's `(os error N)`.
pub fn os_error(e: &io::Error) -> String {
    let text = e.to_string();
    let Some(code) = e.raw_os_error() else {
        return text;
    };
    let desc = text
        .strip_suffix(&format!(" (os error {code})"))
        .unwrap_or(&text);
    match errno_name(code) {
        Some(name) => format!("{desc} ({name})"),
        None => format!("{desc} (errno {code})"),
    }
}

#[cfg(not(unix))]
fn errno_name(_code: i32) -> Option<&'static str> {
    None
}

#[cfg(unix)]
fn errno_name(code: i32) -> Option<&'static str> {
    Some(match code {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EINTR => "EINTR",
        libc::EIO => "EIO",
        libc::ENXIO => "ENXIO",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::EMFILE => "EMFILE",
        libc::EFBIG => "EFBIG",
        libc::ENOSPC => "ENOSPC",
        libc::ESPIPE => "ESPIPE",
        libc::EROFS => "EROFS",
        libc::EPIPE => "EPIPE",
        libc::EDQUOT => "EDQUOT",
        libc::ECONNRESET => "ECONNRESET",
        libc::ENOTCONN => "ENOTCONN",
        libc::ETIMEDOUT => "ETIMEDOUT",
        _ => return None,
    })
}

/// One line of a chunk: a byte range of the chunk's buffer, or a line that was too long.
#[derive(Clone, Copy, Debug)]
enum Item {
    Line { start: usize, end: usize },
    TooLong { len: u64 },
}

/// A chunk of lines: `data` is the buffer they were read into (bytes past the last line are
/// left over from earlier use and never read), `items` the lines in order.
#[derive(Debug, Default)]
struct Chunk {
    data: Vec<u8>,
    items: Vec<Item>,
    bytes_read: u64,
}

impl Chunk {
    /// Forgets the lines; `data` keeps its length and bytes, so that the reader can read into it
    /// without zeroing it again.
    fn clear(&mut self) {
        self.items.clear();
        self.bytes_read = 0;
    }
}

/// Why [`LineReader::read_chunk`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cut {
    /// The chunk reached its line or byte limit.
    Full,
    /// The input had nothing more to read for now; the chunk holds every complete line so far.
    Paused,
    /// End of input (the chunk may hold the last lines).
    Eof,
}

/// Splits a byte stream into lines without ever holding more than `max` bytes of one line.
///
/// Reads go straight into the buffer of the chunk being filled, and lines are ranges of it: a
/// line is never copied, except what is left unfinished at a chunk's end (a line that spans the
/// cut, and any lines of the last read past it), which waits in `carry` for the next chunk.
struct LineReader<R> {
    inner: R,
    /// While a chunk is filled, its buffer: bytes read are `buf[..end]` (longer than `end`:
    /// room for the next read, already initialized).
    buf: Vec<u8>,
    end: usize,
    /// Start of the current (unfinished) line in `buf`, and how far it was searched for `\n`.
    line_start: usize,
    scanned: usize,
    /// Bytes read but not yet in a chunk, between two chunks.
    carry: Vec<u8>,
    max: usize,
    /// The current line passed `max`: its bytes are counted (this many so far) and dropped.
    too_long: Option<u64>,
    /// The last `read` returned less than it was asked for: the input had nothing more then.
    drained: bool,
    eof: bool,
}

impl<R: Read> LineReader<R> {
    fn new(inner: R, max: usize) -> Self {
        LineReader {
            inner,
            buf: Vec::new(),
            end: 0,
            line_start: 0,
            scanned: 0,
            carry: Vec::new(),
            max,
            too_long: None,
            drained: false,
            eof: false,
        }
    }

    /// Refills `chunk` (emptied first) with the next lines. Before a `read` that may block with
    /// nothing to hand over, calls `on_pause` (the caller flushes what it handed over before).
    /// On a read error the chunk holds the lines read before it.
    fn read_chunk(
        &mut self,
        opts: &EngineOptions,
        chunk: &mut Chunk,
        on_pause: &mut dyn FnMut(),
    ) -> io::Result<Cut> {
        chunk.clear();
        // The chunk's buffer (its old lines are done) takes what was carried, then the reads.
        self.buf = std::mem::take(&mut chunk.data);
        if self.buf.len() < self.carry.len() {
            self.buf.resize(self.carry.len(), 0);
        }
        if let Some(head) = self.buf.get_mut(..self.carry.len()) {
            head.copy_from_slice(&self.carry);
        }
        (self.end, self.line_start, self.scanned) = (self.carry.len(), 0, 0);
        let cut = self.fill(opts, chunk, on_pause);
        self.carry.clear();
        self.carry
            .extend_from_slice(self.buf.get(self.line_start..self.end).unwrap_or_default());
        if self.carry.capacity() > READ_BUFFER && self.carry.len() <= READ_BUFFER {
            // A long line that spanned a cut does not pin its memory.
            self.carry.shrink_to(READ_BUFFER);
        }
        chunk.data = std::mem::take(&mut self.buf);
        cut
    }

    /// Adds the current line, ending just before `nl` (`None`: at the end of input), to `chunk`.
    fn end_line(&mut self, chunk: &mut Chunk, nl: Option<usize>) {
        let stop = nl.unwrap_or(self.end);
        let newline = u64::from(nl.is_some());
        let len = (stop - self.line_start) as u64;
        let item = match self.too_long.take() {
            Some(before) => {
                chunk.bytes_read += before + len + newline;
                Item::TooLong { len: before + len }
            }
            None if stop - self.line_start > self.max => {
                chunk.bytes_read += len + newline;
                Item::TooLong { len }
            }
            None => {
                chunk.bytes_read += len + newline;
                let mut end = stop;
                if end > self.line_start && self.buf.get(end - 1) == Some(&b'\r') {
                    end -= 1;
                }
                Item::Line {
                    start: self.line_start,
                    end,
                }
            }
        };
        chunk.items.push(item);
        self.line_start = nl.map_or(self.end, |p| p + 1);
        self.scanned = self.line_start;
    }

    fn fill(
        &mut self,
        opts: &EngineOptions,
        chunk: &mut Chunk,
        on_pause: &mut dyn FnMut(),
    ) -> io::Result<Cut> {
        loop {
            // Every complete line read so far.
            loop {
                let full = chunk.items.len() >= opts.chunk_lines.max(1)
                    || (!chunk.items.is_empty() && self.line_start >= opts.chunk_bytes);
                if full {
                    return Ok(Cut::Full);
                }
                let avail = self.buf.get(self.scanned..self.end).unwrap_or_default();
                match memchr::memchr(b'\n', avail) {
                    Some(i) => {
                        let nl = self.scanned + i;
                        self.end_line(chunk, Some(nl));
                    }
                    None => {
                        self.scanned = self.end;
                        break;
                    }
                }
            }
            // The unfinished line: once past `max` it is only counted, never kept.
            let open = self.end - self.line_start;
            if self.too_long.is_some() || open > self.max {
                *self.too_long.get_or_insert(0) += open as u64;
                self.end = self.line_start;
                self.scanned = self.line_start;
            }
            if self.eof {
                if self.too_long.is_some() || self.end > self.line_start {
                    self.end_line(chunk, None);
                }
                return Ok(Cut::Eof);
            }
            if self.drained {
                if !chunk.items.is_empty() {
                    return Ok(Cut::Paused);
                }
                on_pause();
            }
            if self.buf.len() < self.end + READ_BUFFER {
                // Doubling, but never past what a chunk can need (`C + L` plus this read), so
                // the buffer's capacity stays within the memory bound.
                let want = self.end + READ_BUFFER;
                let cap = self
                    .buf
                    .capacity()
                    .saturating_mul(2)
                    .min(
                        opts.chunk_bytes
                            .saturating_add(self.max)
                            .saturating_add(READ_BUFFER),
                    )
                    .max(want);
                self.buf.reserve_exact(cap - self.buf.len());
                self.buf.resize(want, 0);
            }
            let room = self
                .buf
                .get_mut(self.end..self.end + READ_BUFFER)
                .unwrap_or_default();
            let n = loop {
                match self.inner.read(room) {
                    Ok(n) => break n.min(READ_BUFFER),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            };
            self.end += n;
            self.eof = n == 0;
            self.drained = n < READ_BUFFER;
        }
    }
}

/// One piece of a batch's output, in order: complete lines only.
#[derive(Debug)]
struct Part {
    text: String,
    lines: u64,
    /// The batch's last part.
    last: bool,
}

/// What the writer and the workers agree on: which batch is written next (the head), the
/// parts waiting, and when to flush. `'static` (in an `Arc`) because the output watch of
/// [`crate::json`] is thread-local state that refers to it.
#[derive(Debug, Default)]
struct Order {
    state: Mutex<OrderState>,
    cv: Condvar,
    /// Mirror of `OrderState::head` for the dispatch window (read without this lock).
    head: AtomicU64,
    /// The writer failed: workers stop waiting and stop working.
    abort: AtomicBool,
}

#[derive(Debug, Default)]
struct OrderState {
    head: u64,
    pending: BTreeMap<u64, Vec<Part>>,
    /// Output lines written so far, and flushed so far.
    written: u64,
    flushed: u64,
    /// Flush once this many lines are written (the reader paused after handing them over).
    flush_through: u64,
    /// No more batches will come.
    closing: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding these locks is a bug in this file; the data stays consistent
    // enough to finish or fail the run, so a poisoned lock is used as is.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn wait<'a, T>(cv: &Condvar, g: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    cv.wait(g).unwrap_or_else(PoisonError::into_inner)
}

impl Order {
    /// Blocks until batch `seq` is the head (or the run aborted).
    fn wait_head(&self, seq: u64) {
        let mut st = lock(&self.state);
        while st.head != seq && !self.abort.load(Ordering::Relaxed) {
            st = wait(&self.cv, st);
        }
    }

    fn is_head(&self, seq: u64) -> bool {
        self.head.load(Ordering::Acquire) == seq
    }

    /// Hands a part of batch `seq` to the writer. A head's part that is not the last waits
    /// until the writer took the previous one, so a slow stdout holds back the head too.
    fn send(&self, seq: u64, part: Part) {
        let last = part.last;
        let mut st = lock(&self.state);
        st.pending.entry(seq).or_default().push(part);
        self.cv.notify_all();
        if !last {
            while st.pending.get(&seq).is_some_and(|p| p.len() > 1)
                && !self.abort.load(Ordering::Relaxed)
            {
                st = wait(&self.cv, st);
            }
        }
    }

    /// Asks for a flush once `lines` output lines are written.
    fn flush_through(&self, lines: u64) {
        let mut st = lock(&self.state);
        if lines > st.flush_through {
            st.flush_through = lines;
            self.cv.notify_all();
        }
    }
}

/// The output watch of one worker thread (see [`crate::json::set_output_watch`]).
struct Gate {
    order: Arc<Order>,
    seq: u64,
    head: bool,
    line_start: usize,
    cap: usize,
    soft: usize,
    over: bool,
}

thread_local! {
    static GATE: std::cell::RefCell<Option<Gate>> = const { std::cell::RefCell::new(None) };
}

impl Gate {
    /// The buffer length at which the watch must look again.
    fn next_watch(&self) -> usize {
        let cap_at = self.line_start.saturating_add(self.cap);
        if self.head {
            cap_at
        } else {
            cap_at.min(self.soft)
        }
    }
}

/// The payload that stops a line's processing once its output passed the limit: raised with
/// `resume_unwind` (which runs no panic hook, so nothing is printed) and caught by
/// `process_item`, which gives the line an `output_too_long` error line. Stopping at once
/// saves formatting the rest of an answer that could be hundreds of megabytes.
struct OutputLimit;

/// The watch hook: stops a line at its output limit (its partial output is dropped), and makes
/// a batch that is not the head wait at the soft limit.
fn watch_hook(buf: &mut String) -> usize {
    let next = GATE.with_borrow_mut(|g| {
        let g = g.as_mut()?;
        if buf.len().saturating_sub(g.line_start) > g.cap {
            g.over = true;
            buf.truncate(g.line_start);
            return None;
        }
        if !g.head && buf.len() > g.soft {
            g.order.wait_head(g.seq);
            g.head = true;
        }
        Some(g.next_watch())
    });
    match next {
        Some(at) => at,
        None if GATE.with_borrow(|g| g.as_ref().is_some_and(|g| g.over)) => {
            std::panic::resume_unwind(Box::new(OutputLimit))
        }
        None => usize::MAX,
    }
}

/// Work handed to the workers: the current chunk and the next batch to take.
#[derive(Debug, Default)]
struct Dispatch {
    chunk: Option<Arc<Chunk>>,
    first_line: u64,
    next: usize,
    /// Batches of this chunk taken and not finished.
    active: usize,
    batch: usize,
    next_seq: u64,
    /// No more chunks.
    done: bool,
}

struct Shared<'p> {
    proc_: &'p dyn LineProcessor,
    max_line: usize,
    max_output: usize,
    soft: usize,
    window: u64,
    threads: usize,
    disp: Mutex<Dispatch>,
    disp_cv: Condvar,
    order: Arc<Order>,
    failed: AtomicU64,
}

impl Shared<'_> {
    /// Stops the run: workers stop taking batches and stop waiting, the reader stops reading.
    fn abort(&self) {
        self.order.abort.store(true, Ordering::Relaxed);
        {
            let _st = lock(&self.order.state);
            self.order.cv.notify_all();
        }
        let _d = lock(&self.disp);
        self.disp_cv.notify_all();
    }

    fn chunk_done(d: &Dispatch) -> bool {
        d.chunk
            .as_ref()
            .is_none_or(|c| d.next >= c.items.len() && d.active == 0)
    }

    /// A worker's loop: take a batch, process it, hand it to the writer.
    fn work(&self) {
        loop {
            let (chunk, range, first_line, seq) = {
                let mut d = lock(&self.disp);
                loop {
                    if self.order.abort.load(Ordering::Relaxed) {
                        return;
                    }
                    let head = self.order.head.load(Ordering::Acquire);
                    let avail = d.chunk.as_ref().map_or(0, |c| c.items.len());
                    if d.next < avail && d.next_seq < head + self.window {
                        break;
                    }
                    if d.done && d.next >= avail {
                        return;
                    }
                    d = wait(&self.disp_cv, d);
                }
                let Some(chunk) = d.chunk.clone() else {
                    continue;
                };
                let start = d.next;
                let end = (start + d.batch.max(1)).min(chunk.items.len());
                d.next = end;
                d.active += 1;
                let seq = d.next_seq;
                d.next_seq += 1;
                (chunk, start..end, d.first_line, seq)
            };
            let failed = self.run_batch(&chunk, range, first_line, seq);
            self.failed.fetch_add(failed, Ordering::Relaxed);
            drop(chunk);
            let mut d = lock(&self.disp);
            d.active -= 1;
            if Self::chunk_done(&d) {
                self.disp_cv.notify_all();
            }
        }
    }

    /// Processes items `range` of `chunk` as batch `seq`; returns the error lines written.
    fn run_batch(
        &self,
        chunk: &Chunk,
        range: std::ops::Range<usize>,
        first_line: u64,
        seq: u64,
    ) -> u64 {
        let order = &self.order;
        let mut buf = String::new();
        let mut lines = 0u64;
        let mut failed = 0u64;
        GATE.set(Some(Gate {
            order: Arc::clone(order),
            seq,
            head: order.is_head(seq),
            line_start: 0,
            cap: self.max_output,
            soft: self.soft,
            over: false,
        }));
        for i in range {
            let Some(&item) = chunk.items.get(i) else {
                break;
            };
            if buf.len() >= self.soft {
                // Only the head hands over part of a batch: the writer can write it at once.
                order.wait_head(seq);
                GATE.with_borrow_mut(|g| g.iter_mut().for_each(|g| g.head = true));
                let text = std::mem::take(&mut buf);
                order.send(
                    seq,
                    Part {
                        text,
                        lines,
                        last: false,
                    },
                );
                lines = 0;
            }
            let line = first_line + i as u64;
            let start = buf.len();
            let watch_at = GATE.with_borrow_mut(|g| {
                g.as_mut().map_or(usize::MAX, |g| {
                    g.line_start = start;
                    g.over = false;
                    g.next_watch()
                })
            });
            set_output_watch(Some(watch_hook), watch_at);
            let mut ok = process_item(self.proc_, chunk, item, line, self.max_line, &mut buf);
            set_output_watch(None, usize::MAX);
            let over = GATE.with_borrow(|g| g.as_ref().is_some_and(|g| g.over))
                || buf.len() - start > self.max_output;
            if over {
                buf.truncate(start);
                let err = LineError::new(
                    "output_too_long",
                    format!(
                        "the output line would be longer than {} bytes (the output limit: \
                         --max-line-bytes, at least 1 MiB); split this input line or raise \
                         --max-line-bytes",
                        self.max_output
                    ),
                );
                push_error_line(&mut buf, line, &err);
                ok = false;
            }
            buf.push('\n');
            lines += 1;
            failed += u64::from(!ok);
        }
        GATE.set(None);
        order.send(
            seq,
            Part {
                text: buf,
                lines,
                last: true,
            },
        );
        failed
    }

    /// The writer's loop: writes the head's parts in order, advances the head, flushes when
    /// the reader paused. Returns the first write error.
    fn write_all<W: Write>(&self, out: &mut W) -> io::Result<()> {
        let order = &*self.order;
        loop {
            let mut st = lock(&order.state);
            let parts = loop {
                let head = st.head;
                if let Some(parts) = st.pending.get_mut(&head)
                    && !parts.is_empty()
                {
                    break std::mem::take(parts);
                }
                if st.flush_through > st.flushed && st.written >= st.flush_through {
                    break Vec::new();
                }
                if st.closing && st.pending.values().all(Vec::is_empty) {
                    drop(st);
                    return out.flush();
                }
                st = wait(&order.cv, st);
            };
            // The head's worker may be waiting for these parts to be taken.
            order.cv.notify_all();
            drop(st);
            let mut lines = 0;
            let mut last = false;
            for p in &parts {
                out.write_all(p.text.as_bytes())?;
                lines += p.lines;
                last |= p.last;
            }
            drop(parts);
            let mut st = lock(&order.state);
            st.written += lines;
            if last {
                let head = st.head;
                st.pending.remove(&head);
                st.head += 1;
                order.head.store(st.head, Ordering::Release);
                order.cv.notify_all();
                drop(st);
                // Workers waiting for the dispatch window.
                let _d = lock(&self.disp);
                self.disp_cv.notify_all();
                st = lock(&order.state);
            }
            if st.flush_through > st.flushed && st.written >= st.flush_through {
                st.flushed = st.written;
                drop(st);
                out.flush()?;
            }
        }
    }
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
                // The caller writes the `output_too_long` line (the gate says `over`).
                Err(payload) if payload.is::<OutputLimit>() => {
                    out.truncate(mark);
                    false
                }
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

/// Streams `input` through `proc_`, writing one line per input line to `out` in input order.
///
/// Per-line failures are data (error lines). Lines read before a read error are answered
/// before the error is returned; after a write error nothing more is written.
///
/// # Errors
/// [`EngineError`]: reading, writing, or starting a thread failed.
pub fn run<R: Read, W: Write + Send>(
    proc_: &dyn LineProcessor,
    input: R,
    mut out: W,
    opts: &EngineOptions,
) -> Result<Summary, EngineError> {
    let threads = opts.worker_threads();
    let chunk_bytes = opts.chunk_bytes.max(1);
    let shared = Shared {
        proc_,
        max_line: opts.max_line_bytes,
        max_output: opts.max_output_bytes(),
        soft: (chunk_bytes / (8 * threads)).clamp(16 << 10, 1 << 20),
        window: 2 * threads as u64,
        threads,
        disp: Mutex::new(Dispatch::default()),
        disp_cv: Condvar::new(),
        order: Arc::new(Order::default()),
        failed: AtomicU64::new(0),
    };
    let mut reader = LineReader::new(input, opts.max_line_bytes);
    let mut progress = Progress::new(opts);
    // Started threads, for the start-up handshake below.
    let up = (Mutex::new(0usize), Condvar::new());
    thread::scope(|s| {
        // Threads start one at a time: each says it is up before the next is started, so the
        // memory its start-up takes (std maps a signal stack in the new thread) is taken before
        // the next thread's stack. Under a memory limit, starting then fails cleanly in
        // `spawn`, never in a thread that already runs (which would abort the process). The
        // handshake allocates nothing (a channel would, in the new thread).
        let up = &up;
        let say_up = move || {
            *lock(&up.0) += 1;
            up.1.notify_all();
        };
        let wait_up = |n: usize| {
            let mut g = lock(&up.0);
            while *g < n {
                g = wait(&up.1, g);
            }
        };
        let shared_ref = &shared;
        let writer = thread::Builder::new()
            .name("care-writer".to_owned())
            .spawn_scoped(s, move || {
                say_up();
                let written = shared_ref.write_all(&mut out);
                if written.is_err() {
                    shared_ref.abort();
                }
                written
            })
            .map_err(|error| EngineError::Spawn { threads, error })?;
        wait_up(1);
        let mut spawned = Vec::new();
        let mut spawn_error = None;
        for k in 0..threads {
            if let Err(e) = room_for_thread() {
                spawn_error = Some(e);
                break;
            }
            match thread::Builder::new()
                .name(format!("care-worker-{k}"))
                .spawn_scoped(s, move || {
                    say_up();
                    shared_ref.work();
                }) {
                Ok(h) => {
                    spawned.push(h);
                    wait_up(k + 2);
                }
                Err(e) => {
                    spawn_error = Some(e);
                    break;
                }
            }
        }
        if let Some(error) = spawn_error {
            shared.abort();
            finish(&shared);
            for h in spawned {
                let _ = h.join();
            }
            let _ = writer.join();
            return Err(EngineError::Spawn { threads, error });
        }
        let mut lines = 0u64;
        let mut read_error = None;
        let mut cur = Chunk::default();
        loop {
            if shared.order.abort.load(Ordering::Relaxed) {
                break;
            }
            let dispatched = lines;
            let cut = reader.read_chunk(opts, &mut cur, &mut || {
                shared.order.flush_through(dispatched);
            });
            let cut = match cut {
                Ok(c) => c,
                Err(e) => {
                    read_error = Some(e);
                    Cut::Eof
                }
            };
            if !cur.items.is_empty() {
                let n = cur.items.len() as u64;
                let bytes = cur.bytes_read;
                cur = hand_over(&shared, cur, lines + 1);
                lines += n;
                progress.update(lines, bytes);
                if cut == Cut::Paused {
                    shared.order.flush_through(lines);
                }
            }
            if cut == Cut::Eof {
                break;
            }
        }
        // Everything read is handed over: let it be processed, written and flushed.
        shared.order.flush_through(lines);
        finish(&shared);
        for h in spawned {
            let _ = h.join();
        }
        let written = writer
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the writer thread died")));
        progress.finish();
        written.map_err(EngineError::Write)?;
        if let Some(e) = read_error {
            return Err(EngineError::Read(e));
        }
        Ok(Summary {
            lines,
            failed: shared.failed.load(Ordering::Relaxed),
        })
    })
}

/// Waits until the workers are done with the current chunk, hands them `next`, and returns
/// the previous chunk's buffers for the next read.
fn hand_over(shared: &Shared<'_>, next: Chunk, first_line: u64) -> Chunk {
    let mut d = lock(&shared.disp);
    while !Shared::chunk_done(&d) && !shared.order.abort.load(Ordering::Relaxed) {
        d = wait(&shared.disp_cv, d);
    }
    let batch = next.items.len().div_ceil(shared.threads * 8).clamp(1, 512);
    let old = d.chunk.replace(Arc::new(next));
    d.first_line = first_line;
    d.next = 0;
    d.batch = batch;
    shared.disp_cv.notify_all();
    drop(d);
    // Every batch of the old chunk finished, so its last clone is ours.
    old.and_then(|c| Arc::try_unwrap(c).ok())
        .unwrap_or_default()
}

/// Tells the workers that no chunk will come and the writer that no batch will come (once the
/// workers are done).
fn finish(shared: &Shared<'_>) {
    {
        let mut d = lock(&shared.disp);
        d.done = true;
        shared.disp_cv.notify_all();
        while !Shared::chunk_done(&d) && !shared.order.abort.load(Ordering::Relaxed) {
            d = wait(&shared.disp_cv, d);
        }
    }
    let mut st = lock(&shared.order.state);
    st.closing = true;
    shared.order.cv.notify_all();
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
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Returns its bytes in pieces of the given sizes, in turn (0 stands for 1).
    struct Pieces {
        data: Vec<u8>,
        pos: usize,
        sizes: Vec<usize>,
        k: usize,
    }
    impl Read for Pieces {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let want = self.sizes[self.k % self.sizes.len()].max(1);
            self.k += 1;
            let n = want.min(buf.len()).min(self.data.len() - self.pos);
            buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
            self.pos += n;
            Ok(n)
        }
    }

    /// What a line of the input must become: `Ok(bytes without one trailing CR)`, or
    /// `Err(length)` for a line longer than `max`.
    fn expected_lines(input: &[u8], max: usize) -> Vec<Result<Vec<u8>, u64>> {
        let mut parts: Vec<&[u8]> = input.split(|&c| c == b'\n').collect();
        // A final newline ends the last line; it does not start an empty one.
        if parts.last().is_some_and(|p| p.is_empty()) {
            parts.pop();
        }
        parts
            .into_iter()
            .map(|l| {
                if l.len() > max {
                    Err(l.len() as u64)
                } else {
                    Ok(l.strip_suffix(b"\r").unwrap_or(l).to_vec())
                }
            })
            .collect()
    }

    proptest! {
        /// Relation: the lines the reader hands over, over all its chunks, are the input split
        /// at `\n` (one trailing CR dropped, a line over `max` reported by its length), and
        /// the chunks' `bytes_read` add up to the input's length, whatever the sizes of the
        /// reads, the chunk limits and the line limit.
        #[test]
        fn chunks_hold_the_input_split_into_lines(
            lines in prop::collection::vec(
                prop::collection::vec(prop_oneof![Just(b'a'), Just(b'\r'), Just(b'{')], 0..40),
                0..30,
            ),
            last_newline in any::<bool>(),
            sizes in prop::collection::vec(0usize..70, 1..5),
            max in 0usize..50,
            chunk_lines in 1usize..9,
            chunk_bytes in 0usize..120,
        ) {
            let mut input = Vec::new();
            for (k, l) in lines.iter().enumerate() {
                input.extend_from_slice(l);
                if k + 1 < lines.len() || last_newline {
                    input.push(b'\n');
                }
            }
            let opts = EngineOptions { chunk_lines, chunk_bytes, ..EngineOptions::default() };
            let mut reader = LineReader::new(
                Pieces { data: input.clone(), pos: 0, sizes, k: 0 },
                max,
            );
            let mut chunk = Chunk::default();
            let (mut got, mut bytes) = (Vec::new(), 0u64);
            loop {
                let cut = reader.read_chunk(&opts, &mut chunk, &mut || {}).unwrap();
                bytes += chunk.bytes_read;
                for item in &chunk.items {
                    got.push(match *item {
                        Item::Line { start, end } => Ok(chunk.data[start..end].to_vec()),
                        Item::TooLong { len } => Err(len),
                    });
                }
                if cut == Cut::Eof {
                    break;
                }
            }
            prop_assert_eq!(got, expected_lines(&input, max));
            prop_assert_eq!(bytes, input.len() as u64);
        }
    }

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
            // Chunks cut by bytes, down to one line per chunk (and no endless empty chunks).
            for chunk_bytes in [0, 1, 100] {
                let opts = EngineOptions {
                    threads,
                    chunk_bytes,
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

    /// Writes `{"line":n,"x":[1,1,...]}` with as many elements as the line's number after `n=`,
    /// through `Obj`/`Arr` (so the output watch sees it).
    struct Sized;
    impl LineProcessor for Sized {
        fn process(&self, line: u64, bytes: &[u8], out: &mut String) -> bool {
            let n: usize = std::str::from_utf8(bytes)
                .ok()
                .and_then(|t| t.strip_prefix("n="))
                .and_then(|t| t.parse().ok())
                .unwrap_or(0);
            crate::json::Obj::write(out, |o| {
                o.u64("line", line).arr("x", |a| {
                    for _ in 0..n {
                        a.u64(1);
                    }
                });
            });
            true
        }
    }

    fn run_sized(input: &str, opts: &EngineOptions) -> (Vec<String>, Summary) {
        let mut out = Vec::new();
        let s = run(&Sized, input.as_bytes(), &mut out, opts).unwrap();
        let text = String::from_utf8(out).unwrap();
        (text.lines().map(str::to_owned).collect(), s)
    }

    #[test]
    fn an_output_over_the_limit_becomes_an_error_line_and_the_rest_goes_on() {
        // 1 MiB is the smallest output limit; 600k elements are 1.2 MB.
        let input = "n=3\nn=600000\nn=5\nn=600000\nn=400000\n";
        for threads in [1, 2, 4] {
            let opts = EngineOptions {
                max_line_bytes: 64,
                threads,
                ..Default::default()
            };
            assert_eq!(opts.max_output_bytes(), MIN_OUTPUT_LIMIT);
            let (lines, s) = run_sized(input, &opts);
            assert_eq!(lines.len(), 5);
            assert_eq!(lines[0], r#"{"line":1,"x":[1,1,1]}"#);
            for k in [1, 3] {
                assert!(
                    lines[k].starts_with(&format!(
                        r#"{{"line":{},"error":{{"code":"output_too_long""#,
                        k + 1
                    )),
                    "{}",
                    &lines[k][..80]
                );
            }
            assert_eq!(lines[2], r#"{"line":3,"x":[1,1,1,1,1]}"#);
            assert_eq!(
                lines[4].len(),
                r#"{"line":5,"x":[]}"#.len() + 2 * 400_000 - 1
            );
            assert_eq!(
                s,
                Summary {
                    lines: 5,
                    failed: 2
                }
            );
        }
    }

    #[test]
    fn large_outputs_from_many_workers_keep_input_order() {
        // Outputs of 0 to 120 kB per line, far over the soft limit of small chunks (16 KiB),
        // so batches wait to become the head and the head hands over parts.
        let mut input = String::new();
        for k in 0..300usize {
            input.push_str(&format!("n={}\n", (k * 7919) % 60_000));
        }
        let one = EngineOptions {
            threads: 1,
            ..Default::default()
        };
        let (want, _) = run_sized(&input, &one);
        assert_eq!(want.len(), 300);
        for threads in [2, 3, 8] {
            for chunk_bytes in [64, 1 << 20] {
                let opts = EngineOptions {
                    threads,
                    chunk_bytes,
                    chunk_lines: 37,
                    ..Default::default()
                };
                let (got, s) = run_sized(&input, &opts);
                assert_eq!(s.lines, 300);
                assert!(got == want, "threads {threads}, chunk_bytes {chunk_bytes}");
            }
        }
    }

    /// A writer that fails after `left` bytes.
    struct FailAfter {
        left: usize,
        kind: std::io::ErrorKind,
    }
    impl Write for FailAfter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if self.left == 0 {
                return Err(std::io::Error::from(self.kind));
            }
            let n = buf.len().min(self.left);
            self.left -= n;
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_failing_writer_stops_the_run_with_its_error() {
        let mut input = String::new();
        for k in 0..20_000usize {
            input.push_str(&format!("n={}\n", k % 50));
        }
        for threads in [1, 2, 8] {
            for left in [0, 10, 100_000] {
                let opts = EngineOptions {
                    threads,
                    chunk_lines: 100,
                    ..Default::default()
                };
                let out = FailAfter {
                    left,
                    kind: std::io::ErrorKind::StorageFull,
                };
                match run(&Sized, input.as_bytes(), out, &opts) {
                    Err(EngineError::Write(e)) => {
                        assert_eq!(e.kind(), std::io::ErrorKind::StorageFull);
                    }
                    other => panic!("{other:?}"),
                }
            }
        }
    }

    /// A reader that gives `data`, then fails.
    struct FailingReader<'a> {
        data: &'a [u8],
    }
    impl Read for FailingReader<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.data.is_empty() {
                return Err(std::io::Error::from(std::io::ErrorKind::InvalidData));
            }
            let n = buf.len().min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    #[test]
    fn a_read_error_comes_after_the_lines_read_before_it() {
        let mut out = Vec::new();
        let input = FailingReader {
            data: b"n=1\nn=2\nn=3",
        };
        let opts = EngineOptions {
            threads: 2,
            ..Default::default()
        };
        match run(&Sized, input, &mut out, &opts) {
            Err(EngineError::Read(e)) => assert_eq!(e.kind(), std::io::ErrorKind::InvalidData),
            other => panic!("{other:?}"),
        }
        // The two complete lines are answered; the unterminated third one is not a line yet.
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "{\"line\":1,\"x\":[1]}\n{\"line\":2,\"x\":[1,1]}\n"
        );
    }

    /// A reader fed from a channel: `recv` blocks like a pipe whose writer is quiet.
    struct ChannelReader(std::sync::mpsc::Receiver<Vec<u8>>);
    impl Read for ChannelReader {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            match self.0.recv() {
                Ok(v) => {
                    assert!(v.len() <= buf.len());
                    buf[..v.len()].copy_from_slice(&v);
                    Ok(v.len())
                }
                Err(_) => Ok(0),
            }
        }
    }

    /// A writer that reports each flush's content on a channel.
    struct FlushReporter {
        buf: Vec<u8>,
        tx: std::sync::mpsc::Sender<String>,
    }
    impl Write for FlushReporter {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.buf.extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            if !self.buf.is_empty() {
                let text = String::from_utf8(std::mem::take(&mut self.buf)).unwrap();
                let _ = self.tx.send(text);
            }
            Ok(())
        }
    }

    #[test]
    fn each_line_is_answered_and_flushed_while_the_input_waits() {
        let (in_tx, in_rx) = std::sync::mpsc::channel();
        let (out_tx, out_rx) = std::sync::mpsc::channel();
        let engine = std::thread::spawn(move || {
            let out = FlushReporter {
                buf: Vec::new(),
                tx: out_tx,
            };
            let opts = EngineOptions {
                threads: 2,
                ..Default::default()
            };
            run(&Sized, ChannelReader(in_rx), out, &opts).unwrap()
        });
        let hang = std::time::Duration::from_secs(60);
        for k in 1..=20u64 {
            // Line k arrives in two pieces; its answer must come before line k + 1 is sent.
            in_tx.send(b"n=".to_vec()).unwrap();
            in_tx.send(format!("{k}\n").into_bytes()).unwrap();
            let got = out_rx
                .recv_timeout(hang)
                .expect("an answer while the input waits");
            assert!(got.starts_with(&format!("{{\"line\":{k},")), "{got}");
            assert_eq!(got.lines().count(), 1);
        }
        drop(in_tx);
        assert_eq!(engine.join().unwrap().lines, 20);
    }
}
