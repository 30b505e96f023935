//! `care analyze`: the paper's rubric analyses and the preference-recovery evaluation (Table 4,
//! Figures 3, 4, 5, 9, 10 of the CARE paper) and a generator's format health, as a report
//! directory of tables (Markdown, CSV), SVG charts and one self-contained HTML page.
//!
//! The input is streamed through the same engine as the other subcommands (every core, bounded
//! memory, the progress bar): each line is read into a small [`record::Record`] on a worker
//! thread, and the records are folded into sufficient statistics ([`accum::Acc`]) in input
//! order, so the report is the same for any thread count. A line that cannot be read is
//! skipped with a stable code; every skipped line is listed in `errors.jsonl` and summarized in
//! the report.
//!
//! The input fields, each view's definition and the interval methods are documented in
//! `docs/ANALYZE.md`.

use std::io::{self, Read, Write};

use serde::Deserialize;

use crate::engine::{self, EngineOptions, LineProcessor};
use crate::json::{LineError, Obj, line_text, parse_strict, push_error_line};

pub mod accum;
pub mod charts;
pub mod cli;
pub mod compare;
pub mod health;
pub mod record;
pub mod report;
pub mod stats;
pub mod tables;
pub mod trend;
pub mod verdict;
pub mod views;
pub mod vocab;

pub use accum::{Acc, Settings};
pub use record::{Emotions, Options};

/// Reads each line into a [`record::Record`], written as `{"line":n,"rec":{..}}` (or an error
/// line) for the in-order fold.
struct Reader<'a> {
    opts: &'a Options,
}

impl LineProcessor for Reader<'_> {
    fn process(&self, line: u64, bytes: &[u8], out: &mut String) -> bool {
        let rec = line_text(bytes)
            .and_then(|text| parse_strict(text).map(|v| (text, v)))
            .and_then(|(text, value)| record::read(self.opts, text, &value));
        let json = rec.and_then(|r| {
            serde_json::to_string(&r)
                .map_err(|e| LineError::new("internal_error", format!("record: {e}")))
        });
        match json {
            Ok(json) => {
                out.push_str("{\"line\":");
                out.push_str(&line.to_string());
                out.push_str(",\"rec\":");
                out.push_str(&json);
                out.push('}');
                true
            }
            Err(e) => {
                push_error_line(out, line, &e);
                false
            }
        }
    }
}

#[derive(Deserialize)]
struct Wire {
    line: u64,
    #[serde(default)]
    rec: Option<record::Record>,
    #[serde(default)]
    error: Option<WireError>,
}

#[derive(Deserialize)]
struct WireError {
    code: String,
    message: String,
}

/// The engine's output side: folds each line into the accumulator in input order and copies
/// every skipped line, as an error line, to `errors`.
struct Fold<'a> {
    acc: &'a mut Acc,
    errors: &'a mut (dyn Write + Send),
    partial: Vec<u8>,
}

impl Fold<'_> {
    fn line(&mut self, bytes: &[u8]) -> io::Result<()> {
        let wire: Wire = serde_json::from_slice(bytes)
            .map_err(|e| io::Error::other(format!("analyze: unreadable record: {e}")))?;
        let err = match (wire.rec, wire.error) {
            (Some(rec), _) => match self.acc.add(&rec) {
                Ok(()) => None,
                Err((code, message)) => Some((code.to_owned(), message)),
            },
            (None, Some(e)) => Some((e.code, e.message)),
            (None, None) => Some(("internal_error".to_owned(), "empty record".to_owned())),
        };
        if let Some((code, message)) = err {
            self.acc.skip(wire.line, &code, &message);
            // The same shape as the other subcommands' error lines.
            let mut out = String::new();
            Obj::write(&mut out, |o| {
                o.u64("line", wire.line).obj("error", |e| {
                    e.str("code", &code).str("message", &message);
                });
            });
            self.errors.write_all(out.as_bytes())?;
            self.errors.write_all(b"\n")?;
        }
        Ok(())
    }
}

impl Write for Fold<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut rest = buf;
        while let Some(i) = memchr::memchr(b'\n', rest) {
            let (head, tail) = rest.split_at(i);
            if self.partial.is_empty() {
                self.line(head)?;
            } else {
                let mut whole = std::mem::take(&mut self.partial);
                whole.extend_from_slice(head);
                self.line(&whole)?;
            }
            rest = tail.get(1..).unwrap_or_default();
        }
        self.partial.extend_from_slice(rest);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.errors.flush()
    }
}

/// Streams `input` into the report's statistics; every skipped line goes to `errors` as an
/// error line (`{"line":n,"error":{"code","message"}}`).
///
/// # Errors
/// Only I/O errors of the input or of `errors`; bad lines are skipped, never fatal.
pub fn analyze<R: Read>(
    opts: &Options,
    input: R,
    engine_opts: &EngineOptions,
    errors: &mut (dyn Write + Send),
) -> io::Result<Acc> {
    analyze_with(opts, Settings::default(), input, engine_opts, errors)
}

/// [`analyze`] with the report's settings (comparisons, valence, health thresholds, ...).
///
/// # Errors
/// Only I/O errors of the input or of `errors`.
pub fn analyze_with<R: Read>(
    opts: &Options,
    settings: Settings,
    input: R,
    engine_opts: &EngineOptions,
    errors: &mut (dyn Write + Send),
) -> io::Result<Acc> {
    let mut opts = opts.clone();
    opts.keep_ids |= !settings.compare.is_empty();
    let opts = &opts;
    let mut acc = Acc::for_run(opts, settings);
    let mut fold = Fold {
        acc: &mut acc,
        errors,
        partial: Vec::new(),
    };
    engine::run(&Reader { opts }, input, &mut fold, engine_opts).map_err(io::Error::from)?;
    if !fold.partial.is_empty() {
        let last = std::mem::take(&mut fold.partial);
        fold.line(&last)?;
    }
    fold.flush()?;
    acc.finish();
    Ok(acc)
}
