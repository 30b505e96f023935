//! The `care analyze` subcommand: its options, the report directory, and the run.

use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};

use care_core::{PreferenceOptions, ScoreScale, UnknownLabelPolicy};
use clap::Args;
use serde::Deserialize;

use super::accum::{DEFAULT_BOOTSTRAP, Settings};
use super::health::{Buckets, DEFAULT_BUCKETS, THRESHOLD_NAMES, Thresholds};
use super::record::{DEFAULT_EMOTIONS, Emotions, Options};
use super::report::{self, Meta};
use super::vocab::{LabelSet, Valence};
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
  {\"verdict\": {\"judge\": \"h1\", \"systems\": [\"A\", \"B\", \"C\"], \"choice\": \"A\"}}      a judge's verdict
  care reward output lines and care serve --log records                       reward health
Optional grouping members on any line: \"variant\" (or \"model\"), \"turn\", \"emotion\"; \"id\"
pairs observations across variants for --compare.

Writes DIR/report.md, DIR/index.html (one self-contained page), a CSV per table, SVG charts,
and DIR/errors.jsonl (every skipped line, as the other subcommands write error lines).

Examples:
  care analyze cli/data/analyze_demo.jsonl --out report && open report/index.html
  care analyze runs.jsonl --out report --compare SFT+RL,SFT --valence surprise=positive
  care serve --log serve.jsonl ... ; care analyze serve.jsonl --out health --health length_rho=0.2";

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
    /// Strategy label set of `tactics`: care (ESConv and MINT, as care-core reads them), esconv,
    /// mint, or appendix-e (the paper's ten annotator strategies, with appraisal and other).
    /// Default care.
    #[arg(long, value_name = "SET")]
    pub labels: Option<String>,
    /// Emotion-to-valence entries `emotion=valence,...` on top of the default map (joy
    /// positive, surprise neutral, fear, sadness, disgust and anger negative).
    #[arg(long, value_name = "LIST")]
    pub valence: Option<String>,
    /// Compare two variants: `A,B` gives A - B with 95% intervals in every view (repeatable,
    /// at most 8 pairs).
    #[arg(long, value_name = "A,B")]
    pub compare: Vec<String>,
    /// Reward-health thresholds `name=value,...` (docs/ANALYZE.md lists the names and
    /// defaults).
    #[arg(long, value_name = "LIST")]
    pub health: Option<String>,
    /// Turn buckets of the reward-health views, `lo-hi,...,lo-`. Default 0-3,4-7,8-11,12-.
    #[arg(long, value_name = "LIST")]
    pub turn_buckets: Option<String>,
    /// Seed of the samples and the bootstrap. Default 0.
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// Bootstrap replicates of the crossing turn, 1..=100000. Default 1000.
    #[arg(long, value_name = "N")]
    pub bootstrap: Option<u32>,
    /// JSON settings: {"compare": [["A","B"]], "valence": {"joy": "positive"}, "labels": "mint",
    /// "health": {"length_rho": 0.2}, "turn_buckets": "0-3,4-", "seed": 1, "bootstrap": 2000};
    /// a flag given on the command line replaces the file's value.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// Most `--compare` pairs.
pub const MAX_COMPARE: usize = 8;
/// Most bootstrap replicates.
pub const MAX_BOOTSTRAP: u32 = 100_000;
/// Largest `--config` file.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The `--config` file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default)]
    compare: Vec<[String; 2]>,
    #[serde(default)]
    valence: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    labels: Option<String>,
    #[serde(default)]
    health: std::collections::BTreeMap<String, f64>,
    #[serde(default)]
    turn_buckets: Option<String>,
    #[serde(default)]
    seed: Option<u64>,
    #[serde(default)]
    bootstrap: Option<u32>,
}

fn read_config(path: &Path) -> Result<Config, String> {
    let shown = path.display();
    let f = File::open(path).map_err(|e| format!("--config: cannot open {shown}: {e}"))?;
    let mut text = String::new();
    io::Read::read_to_string(&mut io::Read::take(f, MAX_CONFIG_BYTES + 1), &mut text)
        .map_err(|e| format!("--config: cannot read {shown}: {e}"))?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(format!(
            "--config: {shown} is larger than {MAX_CONFIG_BYTES} bytes"
        ));
    }
    serde_json::from_str(&text).map_err(|e| format!("--config: {shown}: {e}"))
}

fn compare_pair(text: &str) -> Result<(String, String), String> {
    let (a, b) = text
        .split_once(',')
        .map(|(a, b)| (a.trim(), b.trim()))
        .filter(|(a, b)| !a.is_empty() && !b.is_empty() && !b.contains(','))
        .ok_or_else(|| format!("--compare: {text:?} is not A,B (two variant names)"))?;
    if a == b {
        return Err(format!(
            "--compare: {text:?} compares a variant with itself"
        ));
    }
    Ok((a.to_owned(), b.to_owned()))
}

/// The report settings of one run: the config file, then the flags.
pub fn settings_of(a: &AnalyzeArgs, emotions: &Emotions) -> Result<(Settings, LabelSet), String> {
    let cfg = match &a.config {
        Some(p) => read_config(p)?,
        None => Config::default(),
    };
    let mut compare: Vec<(String, String)> = Vec::new();
    if a.compare.is_empty() {
        for [x, y] in &cfg.compare {
            compare.push(compare_pair(&format!("{x},{y}"))?);
        }
    } else {
        for c in &a.compare {
            compare.push(compare_pair(c)?);
        }
    }
    if compare.len() > MAX_COMPARE {
        return Err(format!(
            "--compare: {} pairs, at most {MAX_COMPARE}",
            compare.len()
        ));
    }
    let valence_list = match &a.valence {
        Some(v) => v.clone(),
        None => cfg
            .valence
            .iter()
            .map(|(e, v)| format!("{e}={v}"))
            .collect::<Vec<_>>()
            .join(","),
    };
    let valence = Valence::new(emotions, &valence_list)?;
    let labels = LabelSet::named(
        a.labels
            .as_deref()
            .or(cfg.labels.as_deref())
            .unwrap_or("care"),
    )?;
    let mut thresholds = Thresholds::default();
    for (k, v) in &cfg.health {
        thresholds.set(k, *v)?;
    }
    thresholds.apply(a.health.as_deref().unwrap_or(""))?;
    let buckets = Buckets::parse(
        a.turn_buckets
            .as_deref()
            .or(cfg.turn_buckets.as_deref())
            .unwrap_or(DEFAULT_BUCKETS),
    )?;
    let bootstrap = a.bootstrap.or(cfg.bootstrap).unwrap_or(DEFAULT_BOOTSTRAP);
    if !(1..=MAX_BOOTSTRAP).contains(&bootstrap) {
        return Err(format!("--bootstrap must be in 1..={MAX_BOOTSTRAP}"));
    }
    Ok((
        Settings {
            compare,
            valence: Some(valence),
            thresholds,
            buckets,
            seed: a.seed.or(cfg.seed).unwrap_or(0),
            bootstrap,
        },
        labels,
    ))
}

/// Resolves the options of one run.
pub fn options(a: &AnalyzeArgs, score: &ScoreArgs, format: &FormatArgs) -> Result<Options, String> {
    let pref = PreferenceOptions {
        tau: a.tau,
        scale: a.scale,
    };
    pref.check().map_err(crate::app::invalid)?;
    let emotions = Emotions::parse_list(&a.emotions)?;
    let (_, label_set) = settings_of(a, &emotions)?;
    Ok(Options {
        format: crate::app::format_policy(format)?,
        score: crate::app::score_options(score),
        pref,
        labels: a.unknown_label,
        label_set,
        emotions,
        keep_ids: !a.compare.is_empty(),
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
        format!("Strategy labels: the {} set.", opts.label_set.name),
    ]
}

fn report_settings(acc: &super::Acc) -> Vec<String> {
    let s = &acc.settings;
    let t = &s.thresholds;
    let mut out = vec![format!("Valence: {}.", super::tables::valence_map(acc))];
    if !s.compare.is_empty() {
        let pairs: Vec<String> = s
            .compare
            .iter()
            .map(|(a, b)| format!("{a} - {b}"))
            .collect();
        out.push(format!("Comparisons: {}.", pairs.join("; ")));
    }
    let buckets: Vec<String> = (0..s.buckets.0.len()).map(|i| s.buckets.label(i)).collect();
    out.push(format!(
        "Health: turn buckets {}; thresholds {}; scores {}..={}.",
        buckets.join(", "),
        THRESHOLD_NAMES[..super::health::CHECKS]
            .iter()
            .zip([
                t.length_rho,
                t.zero_spread,
                t.ceiling,
                t.floor,
                t.null_reward,
                t.judge_retry,
                t.rubric_failure,
                t.rubric_repair,
                t.entropy,
                t.panel_alpha
            ])
            .map(|(n, v)| format!("{n} {v}"))
            .collect::<Vec<_>>()
            .join(", "),
        t.score_min,
        t.score_max
    ));
    out.push(format!(
        "Bootstrap: {} replicates, seed {}.",
        s.bootstrap, s.seed
    ));
    out
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
    let (run_settings, _) = settings_of(a, &opts.emotions)?;
    let acc = match file {
        None => {
            // Not std's Stdin, which reads a closed stdin as empty input.
            let stdin = crate::engine::stdin_file()
                .map_err(|e| format!("cannot read stdin: {}", crate::engine::os_error(&e)))?;
            super::analyze_with(
                &opts,
                run_settings,
                crate::engine::Input::new(stdin),
                &eopts,
                &mut errors,
            )
        }
        Some(f) => super::analyze_with(
            &opts,
            run_settings,
            BufReader::with_capacity(1 << 16, f),
            &eopts,
            &mut errors,
        ),
    }
    .map_err(|e| format!("I/O error: {e}"))?;
    errors
        .flush()
        .map_err(|e| format!("cannot write {}: {e}", errors_path.display()))?;
    let mut lines = settings(&opts);
    lines.extend(report_settings(&acc));
    let meta = Meta {
        title: a.title.clone(),
        input: io_args.input.display().to_string(),
        settings: lines,
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
