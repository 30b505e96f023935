//! The `care analyze` subcommand: its options, the report directory, and the run.

use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};

use care_core::{PreferenceOptions, ScoreScale, UnknownLabelPolicy};
use clap::Args;

use super::record::{DEFAULT_EMOTIONS, Emotions, Options};
use super::report::{self, Meta};
use crate::app::{EXIT_LINE_FAILED, EXIT_OK};
use crate::args::{FormatArgs, IoArgs, ScoreArgs, named};
use crate::engine::EngineOptions;

/// Help text after the options.
pub const AFTER_HELP: &str = "\
Input lines (any mix; extra members are ignored; docs/ANALYZE.md has every field):
  {\"text\": \"<generator output>\"} or {\"rubric\": <object, text or null>}   a rubric, validated here
  {\"format_reward\": 1, \"violations\": [..], \"weights\": [..], \"criteria\": [..]}  care validate output
  {\"rubric\": .., \"chosen_scores\": [[..],[..],[..]], \"rejected_scores\": ..}   a preference pair
  {\"chosen_reward\": 0.8, \"rejected_reward\": 0.6, \"r_pref\": 0.1}             a pair scored elsewhere
  {\"tactics\": [\"questioning\", \"validation\"]}                               a response's strategies
Optional grouping members on any line: \"variant\" (or \"model\"), \"turn\", \"emotion\".

Writes DIR/report.md, DIR/index.html (one self-contained page), a CSV per table, SVG charts,
and DIR/errors.jsonl (every skipped line, as the other subcommands write error lines).

Example:
  care analyze cli/data/analyze_demo.jsonl --out report && open report/index.html";

/// Options of `care analyze`.
#[derive(Debug, Args, Clone)]
pub struct AnalyzeArgs {
    /// Report directory (created if missing; an existing one must be empty or hold an earlier
    /// report, whose files are replaced).
    #[arg(short, long, value_name = "DIR")]
    pub out: PathBuf,
    /// Emotion labels in report order, comma-separated (`happiness` is read as `joy`).
    #[arg(long, value_name = "LIST", default_value = DEFAULT_EMOTIONS)]
    pub emotions: String,
    /// Temperature of r_pref (Eq. 3) for pairs given as scores.
    #[arg(long, default_value_t = PreferenceOptions::PAPER.tau)]
    pub tau: f64,
    /// Score scale of r_pref.
    #[arg(long, value_parser = named::<ScoreScale>(), default_value_t = PreferenceOptions::PAPER.scale)]
    pub scale: ScoreScale,
    /// Unknown tactic label policy.
    #[arg(long, value_parser = named::<UnknownLabelPolicy>(), default_value_t = UnknownLabelPolicy::Error)]
    pub unknown_label: UnknownLabelPolicy,
    /// Title of the report.
    #[arg(long, default_value = "care analyze report")]
    pub title: String,
}

/// Resolves the options of one run.
pub fn options(a: &AnalyzeArgs, score: &ScoreArgs, format: &FormatArgs) -> Result<Options, String> {
    let pref = PreferenceOptions {
        tau: a.tau,
        scale: a.scale,
    };
    pref.check().map_err(crate::app::invalid)?;
    Ok(Options {
        format: crate::app::format_policy(format)?,
        score: crate::app::score_options(score),
        pref,
        labels: a.unknown_label,
        emotions: Emotions::parse_list(&a.emotions)?,
    })
}

/// Is `name` a file that `care analyze` writes?
fn is_report_file(name: &str) -> bool {
    const FIXED: [&str; 3] = ["report.md", "index.html", "errors.jsonl"];
    FIXED.contains(&name)
        || (name.ends_with(".csv") || name.ends_with(".svg"))
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_-.".contains(&b))
}

/// Creates `dir`, or clears an earlier report in it. A non-empty directory that is not a
/// report is refused, so that a typo never scatters files among someone else's.
pub fn prepare_dir(dir: &Path) -> Result<(), String> {
    let shown = dir.display();
    if !dir.exists() {
        return fs::create_dir_all(dir).map_err(|e| format!("cannot create {shown}: {e}"));
    }
    if !dir.is_dir() {
        return Err(format!("--out {shown} exists and is not a directory"));
    }
    let entries = fs::read_dir(dir).map_err(|e| format!("cannot read {shown}: {e}"))?;
    let mut names = Vec::new();
    for e in entries {
        let e = e.map_err(|e| format!("cannot read {shown}: {e}"))?;
        names.push(e.file_name().to_string_lossy().into_owned());
    }
    if names.is_empty() {
        return Ok(());
    }
    let is_report = names.iter().any(|n| n == "report.md");
    if let Some(other) = names.iter().find(|n| !is_report || !is_report_file(n)) {
        return Err(format!(
            "refusing to write the report into {shown}: it holds {other:?}, which is not from an \
             earlier care analyze report; give a new or empty directory"
        ));
    }
    for n in names {
        let p = dir.join(&n);
        fs::remove_file(&p).map_err(|e| format!("cannot replace {}: {e}", p.display()))?;
    }
    Ok(())
}

fn settings(opts: &Options) -> Vec<String> {
    let f = &opts.format;
    let yes = |b: bool| if b { "on" } else { "off" };
    vec![
        format!(
            "Format contract: weight tolerance {}, {}..={} criteria per dimension, category order \
             {}, key order {}, think blocks {}, code fences {}, envelope {}, meta words {}.",
            f.weight_tolerance,
            f.min_criteria,
            f.max_criteria,
            yes(f.require_order),
            yes(f.require_key_order),
            yes(f.allow_think),
            yes(f.allow_code_fence),
            yes(f.allow_envelope),
            yes(f.meta_words)
        ),
        format!(
            "Pair scores: missing {:?}, out of range {:?}, uniform weights {}; r_pref with tau {} \
             on {:?} scores.",
            opts.score.missing,
            opts.score.out_of_range,
            yes(opts.score.uniform_weights),
            opts.pref.tau,
            opts.pref.scale
        ),
        format!("Emotions: {}.", opts.emotions.names().join(", ")),
    ]
}

/// Runs `care analyze`; returns the exit status or a usage/I/O message.
pub fn run(
    a: &AnalyzeArgs,
    score: &ScoreArgs,
    format: &FormatArgs,
    io_args: &IoArgs,
) -> Result<u8, String> {
    let opts = options(a, score, format)?;
    if io_args.max_line_bytes == 0 {
        return Err("--max-line-bytes must be at least 1".to_owned());
    }
    let mut eopts = EngineOptions {
        max_line_bytes: io_args.max_line_bytes,
        threads: io_args.threads,
        progress: !io_args.no_progress && io::stderr().is_terminal(),
        ..EngineOptions::default()
    };
    eopts.validate()?;
    let stdin = io_args.input.as_os_str() == "-";
    let file = if stdin {
        None
    } else {
        let f = File::open(&io_args.input)
            .map_err(|e| format!("cannot open {}: {e}", io_args.input.display()))?;
        eopts.total_bytes = f.metadata().ok().map(|m| m.len());
        Some(f)
    };
    prepare_dir(&a.out)?;
    let errors_path = a.out.join("errors.jsonl");
    let errors_file = File::create(&errors_path)
        .map_err(|e| format!("cannot create {}: {e}", errors_path.display()))?;
    let mut errors = BufWriter::new(errors_file);
    let acc = match file {
        None => {
            // Not std's Stdin, which reads a closed stdin as empty input.
            let stdin = crate::engine::stdin_file()
                .map_err(|e| format!("cannot read stdin: {}", crate::engine::os_error(&e)))?;
            super::analyze(&opts, crate::engine::Input::new(stdin), &eopts, &mut errors)
        }
        Some(f) => super::analyze(
            &opts,
            BufReader::with_capacity(1 << 16, f),
            &eopts,
            &mut errors,
        ),
    }
    .map_err(|e| format!("I/O error: {e}"))?;
    errors
        .flush()
        .map_err(|e| format!("cannot write {}: {e}", errors_path.display()))?;
    let meta = Meta {
        title: a.title.clone(),
        input: io_args.input.display().to_string(),
        settings: settings(&opts),
    };
    let written = report::write(&a.out, &acc, &meta)?;
    let skipped = acc.skipped_lines();
    let mut err = io::stderr().lock();
    const SHOWN: usize = 10;
    for e in acc.examples.iter().take(SHOWN) {
        let _ = writeln!(err, "care: line {}: {}: {}", e.line, e.code, e.message);
    }
    if skipped > SHOWN as u64 {
        let _ = writeln!(
            err,
            "care: {} more skipped lines are listed in {}",
            skipped - SHOWN as u64,
            errors_path.display()
        );
    }
    let _ = writeln!(
        io::stdout().lock(),
        "care analyze: {} lines read, {} analyzed, {} skipped; {} files in {} (open {})",
        acc.lines,
        acc.lines - skipped,
        skipped,
        written.len() + 1,
        a.out.display(),
        a.out.join("index.html").display()
    );
    Ok(if io_args.strict && skipped > 0 {
        EXIT_LINE_FAILED
    } else {
        EXIT_OK
    })
}
