//! From parsed arguments to a run: resolve options, open the input, drive the engine, map the
//! outcome to the exit status.

use std::fs::File;
use std::io::{self, IsTerminal, Write};
use std::process::ExitCode;

use care_core::grpo::{
    AdvantageOptions, Aggregation, Baseline, KlEstimator, LossOptions, LossPreset, Preset,
    RatioLevel, Scale, SingletonPolicy, StdKind,
};

use care_core::{
    FormatPolicy, GeneratorOptions, MissingPolicy, PrefOptions, RangePolicy, ScoreOptions,
    ScoreScale, UnknownLabelPolicy,
};

use crate::args::{
    AdvArgs, AdvPresetArg, AdvScaleArg, AggArg, BaselineArg, Cli, CliCommand, FormatArgs, IoArgs,
    KlArg, LossArgs, LossPresetArg, MissingArg, OutOfRangeArg, PrefArgs, RatioArg, ScaleArg,
    ScoreArgs, SingletonArg, StdArg, UnknownLabelArg,
};
use crate::cmd::Command;
use crate::engine::{self, EngineError, EngineOptions, os_error};

/// Exit status when every line was read.
pub const EXIT_OK: u8 = 0;
/// Exit status with `--strict` when a line gave an error line.
pub const EXIT_LINE_FAILED: u8 = 1;
/// Exit status for usage and I/O errors.
pub const EXIT_USAGE: u8 = 2;

/// Runs the parsed command line; the binary's `main` is this plus argument parsing.
pub fn run(cli: Cli) -> ExitCode {
    let result = match cli.command {
        CliCommand::Demo => crate::demo::run(&mut io::stdout().lock()).map(|()| EXIT_OK),
        CliCommand::Advantages { adv, io } => {
            advantage_options(&adv).and_then(|o| stream(&Command::Advantages(o), &io))
        }
        CliCommand::Loss { loss, io } => {
            loss_options(&loss).and_then(|o| stream(&Command::Loss(o), &io))
        }
        CliCommand::Validate { format, io } => {
            format_policy(&format).and_then(|p| stream(&Command::Validate(p), &io))
        }
        CliCommand::Score { score, format, io } => format_policy(&format).and_then(|format| {
            let opts = crate::cmd::score::Options {
                score: score_options(&score),
                format,
            };
            stream(&Command::Score(opts), &io)
        }),
        CliCommand::Pref {
            pref,
            score,
            format,
            io,
        } => format_policy(&format)
            .and_then(|format| generator_options(&pref, &score, format))
            .and_then(|o| stream(&Command::Pref(o), &io)),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(msg) => {
            let _ = writeln!(io::stderr(), "care: {msg}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

/// Streams the input of `io` through `cmd` to stdout; returns the exit status.
fn stream(cmd: &Command, io: &IoArgs) -> Result<u8, String> {
    let mut opts = EngineOptions {
        max_line_bytes: io.max_line_bytes,
        threads: io.threads,
        progress: !io.no_progress && io::stderr().is_terminal(),
        ..EngineOptions::default()
    };
    opts.validate()?;
    // Own handles on fd 1 and fd 0: std's Stdout and Stdin treat a closed descriptor (EBADF)
    // as a sink and as empty input, which would lose the output or the input without a word.
    // Stdout first: with fd 1 closed, opening the input would otherwise take its number.
    let stdout = engine::stdout_file().map_err(|e| unusable("stdout", &e))?;
    // The engine hands over whole batches; a BufWriter keeps that to few large writes.
    let out = io::BufWriter::with_capacity(1 << 16, stdout);
    let (input, name) = if io.input.as_os_str() == "-" {
        let stdin = engine::stdin_file().map_err(|e| unusable("stdin", &e))?;
        (stdin, "stdin".to_owned())
    } else {
        let file = File::open(&io.input)
            .map_err(|e| format!("cannot open {}: {}", io.input.display(), os_error(&e)))?;
        opts.total_bytes = file.metadata().ok().map(|m| m.len());
        (file, io.input.display().to_string())
    };
    let summary = match engine::run(cmd, engine::Input::new(input), out, &opts) {
        Ok(s) => s,
        // A closed pipe (`care ... | head`) is the reader's choice, not an error of ours.
        Err(EngineError::Write(e)) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(EXIT_OK),
        Err(EngineError::Write(e)) => {
            return Err(format!("cannot write to stdout: {}", os_error(&e)));
        }
        Err(EngineError::Read(e)) => return Err(format!("cannot read {name}: {}", os_error(&e))),
        Err(e) => return Err(e.to_string()),
    };
    Ok(if io.strict && summary.failed > 0 {
        EXIT_LINE_FAILED
    } else {
        EXIT_OK
    })
}

/// Why a standard stream cannot be used, in one line (`stdout is closed: Bad file descriptor
/// (EBADF)`).
fn unusable(stream: &str, e: &io::Error) -> String {
    if e.raw_os_error() == Some(libc::EBADF) {
        format!("{stream} is closed: {}", os_error(e))
    } else {
        format!("cannot use {stream}: {}", os_error(e))
    }
}

/// The advantage options of a preset (or the SPEC defaults), then the single-field overrides.
pub fn advantage_options(a: &AdvArgs) -> Result<AdvantageOptions, String> {
    let mut o = match a.preset {
        None => AdvantageOptions::default(),
        Some(p) => AdvantageOptions::preset(match p {
            AdvPresetArg::Verl => Preset::Verl,
            AdvPresetArg::Trl => Preset::Trl,
            AdvPresetArg::TrlBatch => Preset::TrlBatch,
            AdvPresetArg::Openrlhf => Preset::OpenRlhf,
            AdvPresetArg::DrGrpo => Preset::DrGrpo,
            AdvPresetArg::Rloo => Preset::Rloo,
        }),
    };
    if let Some(b) = a.baseline {
        o.baseline = match b {
            BaselineArg::Mean => Baseline::Mean,
            BaselineArg::LeaveOneOut => Baseline::LeaveOneOut,
            BaselineArg::None => Baseline::None,
        };
    }
    if let Some(s) = a.scale {
        o.scale = match s {
            AdvScaleArg::GroupStd => Scale::GroupStd,
            AdvScaleArg::BatchStd => Scale::BatchStd,
            AdvScaleArg::None => Scale::None,
        };
    }
    if let Some(s) = a.std {
        o.std_kind = match s {
            StdArg::Unbiased => StdKind::Unbiased,
            StdArg::Biased => StdKind::Biased,
        };
    }
    if let Some(s) = a.singleton {
        o.singleton = match s {
            SingletonArg::Zero => SingletonPolicy::Zero,
            SingletonArg::Raw => SingletonPolicy::Raw,
            SingletonArg::Error => SingletonPolicy::Error,
        };
    }
    if let Some(eps) = a.eps {
        o.eps = eps;
    }
    o.validate()
        .map_err(|e| format!("--eps must be finite and >= 0 ({})", e.code()))?;
    Ok(o)
}

/// The loss options of a preset (or the SPEC defaults), then the single-field overrides.
/// `--kl none` turns the KL term off (`beta = 0`) whatever `--beta` says.
pub fn loss_options(a: &LossArgs) -> Result<LossOptions, String> {
    let mut o = match a.preset {
        None => LossOptions::default(),
        Some(LossPresetArg::Verl) => LossOptions::preset(LossPreset::Verl),
        Some(LossPresetArg::Trl) => LossOptions::preset(LossPreset::Trl),
    };
    let set = |field: &mut f64, v: Option<f64>| {
        if let Some(v) = v {
            *field = v;
        }
    };
    set(&mut o.eps_low, a.clip_low);
    set(&mut o.eps_high, a.clip_high);
    set(&mut o.dual_clip, a.dual_clip);
    set(&mut o.beta, a.beta);
    set(&mut o.global_tokens, a.global_tokens);
    set(&mut o.global_sequences, a.global_seqs);
    set(&mut o.horizon, a.horizon);
    set(&mut o.log_ratio_clamp, a.log_ratio_clamp);
    if let Some(r) = a.ratio {
        o.ratio_level = match r {
            RatioArg::Token => RatioLevel::Token,
            RatioArg::Sequence => RatioLevel::Sequence,
        };
    }
    match a.kl {
        None => {}
        Some(KlArg::None) => o.beta = 0.0,
        Some(KlArg::K1) => o.kl_estimator = KlEstimator::K1,
        Some(KlArg::Abs) => o.kl_estimator = KlEstimator::Abs,
        Some(KlArg::K2) => o.kl_estimator = KlEstimator::K2,
        Some(KlArg::K3) => o.kl_estimator = KlEstimator::K3,
    }
    if let Some(g) = a.agg {
        o.aggregation = match g {
            AggArg::TokenMean => Aggregation::TokenMean,
            AggArg::SeqMeanTokenMean => Aggregation::SeqMeanTokenMean,
            AggArg::SeqMeanTokenSum => Aggregation::SeqMeanTokenSum,
            AggArg::SeqMeanTokenSumNorm => Aggregation::SeqMeanTokenSumNorm,
            AggArg::TokenSum => Aggregation::TokenSum,
        };
    }
    o.validate().map_err(|e| {
        format!(
            "loss options out of range ({}): clip widths, dual clip, beta, global counts and \
             horizon must be finite and >= 0, the log-ratio clamp > 0",
            e.code()
        )
    })?;
    Ok(o)
}

/// The paper's format policy with the flags applied.
pub fn format_policy(a: &FormatArgs) -> Result<FormatPolicy, String> {
    let mut p = FormatPolicy::PAPER;
    p.allow_think = a.allow_think;
    p.allow_code_fence = a.allow_code_fence;
    p.allow_envelope = a.allow_envelope;
    p.require_order = !a.no_order;
    p.require_key_order = !a.no_key_order;
    p.meta_words = a.meta_words;
    if let Some(t) = a.weight_tolerance {
        if !(t.is_finite() && t >= 0.0) {
            return Err("--weight-tolerance must be finite and >= 0".to_owned());
        }
        p.weight_tolerance = t;
    }
    let to_u8 =
        |n: usize, flag: &str| u8::try_from(n).map_err(|_| format!("{flag} must be at most 255"));
    if let Some(n) = a.min_criteria {
        p.min_criteria = to_u8(n, "--min-criteria")?;
    }
    if let Some(n) = a.max_criteria {
        p.max_criteria = to_u8(n, "--max-criteria")?;
    }
    if p.min_criteria > p.max_criteria {
        return Err(format!(
            "--min-criteria ({}) is larger than --max-criteria ({})",
            p.min_criteria, p.max_criteria
        ));
    }
    Ok(p)
}

/// The scoring policies of `--missing`, `--out-of-range` and `--uniform-weights`.
pub fn score_options(a: &ScoreArgs) -> ScoreOptions {
    ScoreOptions {
        missing: match a.missing {
            MissingArg::Error => MissingPolicy::Error,
            MissingArg::Zero => MissingPolicy::Zero,
            MissingArg::Skip => MissingPolicy::Skip,
        },
        out_of_range: match a.out_of_range {
            OutOfRangeArg::Error => RangePolicy::Error,
            OutOfRangeArg::Clamp => RangePolicy::Clamp,
        },
        uniform_weights: a.uniform_weights,
    }
}

/// The generator-reward options (Eq. 4) from the flags.
pub fn generator_options(
    p: &PrefArgs,
    s: &ScoreArgs,
    format: FormatPolicy,
) -> Result<GeneratorOptions, String> {
    if !(p.tau.is_finite() && p.tau > 0.0) {
        return Err("--tau must be finite and > 0".to_owned());
    }
    if !(p.lambda.is_finite() && p.gamma.is_finite()) {
        return Err("--lambda and --gamma must be finite".to_owned());
    }
    Ok(GeneratorOptions {
        lambda: p.lambda,
        gamma: p.gamma,
        pref: PrefOptions {
            tau: p.tau,
            scale: match p.scale {
                ScaleArg::Normalized => ScoreScale::Normalized,
                ScaleArg::Raw => ScoreScale::Raw,
            },
        },
        score: score_options(s),
        format,
        labels: match p.unknown_label {
            UnknownLabelArg::Error => UnknownLabelPolicy::Error,
            UnknownLabelArg::Ignore => UnknownLabelPolicy::Ignore,
        },
    })
}
