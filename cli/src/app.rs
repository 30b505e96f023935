//! From parsed arguments to a run: resolve options, open the input, drive the engine, map the
//! outcome to the exit status.

use std::fs::File;
use std::io::{self, IsTerminal, Write};
use std::process::ExitCode;

use care_core::grpo::{
    AdvantageEstimator, AdvantageOptions, GaeOptions, LossOptions, MaskedToken, Rejection,
    WhitenOptions,
};
use care_core::{FormatPolicy, GeneratorOptions, InvalidOption, PreferenceOptions, ScoreOptions};

use crate::args::{
    AdvArgs, Cli, CliCommand, FormatArgs, GeneratorArgs, IoArgs, KlChoice, LossArgs, ScoreArgs,
    flag_of,
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
        CliCommand::Demo => demo(),
        CliCommand::Reward(a) => crate::reward_loop::run_reward(&a),
        CliCommand::Serve(a) => crate::reward_loop::run_serve(&a),
        CliCommand::Analyze {
            analyze,
            score,
            format,
            io,
        } => crate::analyze::cli::run(&analyze, &score, &format, &io),
        CliCommand::Advantages { adv, io } => {
            advantage_options(&adv).and_then(|o| stream(&Command::Advantages(o), &io))
        }
        CliCommand::Loss { loss, io } => {
            loss_options(&loss).and_then(|o| stream(&Command::Loss(Box::new(o)), &io))
        }
        CliCommand::Validate { format, io } => {
            format_policy(&format).and_then(|p| stream(&Command::Validate(p), &io))
        }
        CliCommand::Score {
            profile,
            score,
            format,
            io,
        } => format_policy(&format).and_then(|format| {
            let score = score_options(&score);
            let cmd = match profile {
                None => Command::Score(crate::cmd::score::Options { score, format }),
                Some(spec) => Command::ScoreProfile(crate::cmd::score_profile::Options {
                    profile: std::sync::Arc::new(crate::cmd::score_profile::load_profile(&spec)?),
                    score,
                    format,
                }),
            };
            stream(&cmd, &io)
        }),
        CliCommand::GeneratorReward {
            generator,
            score,
            format,
            io,
        } => format_policy(&format)
            .and_then(|format| generator_options(&generator, &score, format))
            .and_then(|o| stream(&Command::GeneratorReward(o), &io)),
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
        Err(EngineError::Write(e)) => return write_failed(&e),
        Err(EngineError::Read(e)) => return Err(format!("cannot read {name}: {}", os_error(&e))),
        Err(e) => return Err(e.to_string()),
    };
    Ok(if io.strict && summary.failed > 0 {
        EXIT_LINE_FAILED
    } else {
        EXIT_OK
    })
}

/// The exit status for a failed write to stdout, the rule of every subcommand: a closed pipe
/// (`care ... | head`) is the reader's choice, not an error of ours (status 0); any other
/// failure (`EBADF`, `ENOSPC`, `EIO`) is one stderr line naming the cause and status 2.
fn write_failed(e: &io::Error) -> Result<u8, String> {
    if e.kind() == io::ErrorKind::BrokenPipe {
        Ok(EXIT_OK)
    } else {
        Err(format!("cannot write to stdout: {}", os_error(e)))
    }
}

/// `care demo`: the rendered table, written through its own handle on fd 1 (see
/// [`engine::stdout_file`]) so that a closed or failing stdout is reported like the streaming
/// subcommands report it.
fn demo() -> Result<u8, String> {
    let text = crate::demo::render(crate::demo::device().as_ref())?;
    let mut out = engine::stdout_file().map_err(|e| unusable("stdout", &e))?;
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(EXIT_OK),
        Err(e) => write_failed(&e),
    }
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

/// The message for options a flag put outside their domain: the flag, then the core's check.
pub(crate) fn invalid(e: InvalidOption) -> String {
    format!("{}: {e}", flag_of(e.field))
}

/// The advantage options of a preset (or the SPEC defaults), then the single-field overrides.
pub fn advantage_options(a: &AdvArgs) -> Result<crate::cmd::advantages::Options, String> {
    let mut o = a
        .preset
        .map_or_else(AdvantageOptions::default, AdvantageOptions::preset);
    set(&mut o.baseline, a.baseline);
    set(&mut o.scale, a.scale);
    set(&mut o.std_kind, a.std);
    set(&mut o.singleton, a.singleton);
    set(&mut o.eps, a.eps);
    set(&mut o.std_floor, a.std_floor);
    set(&mut o.reweight, a.reweight);
    o.check().map_err(invalid)?;
    let mut gae = GaeOptions::default();
    set(&mut gae.gamma, a.gamma);
    set(&mut gae.lambda, a.lambda);
    set(&mut gae.masked_token, a.masked_token);
    if gae.masked_token == MaskedToken::Reset && a.estimator != AdvantageEstimator::ReinforcePp {
        return Err("--masked-token reset applies to --estimator reinforce_pp only".to_owned());
    }
    if gae.validate().is_err() {
        return Err("--gamma and --lambda must be in [0, 1]".to_owned());
    }
    let whiten = a.whiten.then(|| {
        let mut w = WhitenOptions {
            std_kind: o.std_kind,
            ..WhitenOptions::default()
        };
        set(&mut w.eps, a.whiten_eps);
        set(&mut w.count_eps, a.whiten_count_eps);
        w
    });
    if whiten.is_some_and(|w| w.validate().is_err()) {
        return Err("--whiten-eps and --whiten-count-eps must be finite and >= 0".to_owned());
    }
    Ok(crate::cmd::advantages::Options {
        estimator: a.estimator,
        group: o,
        gae,
        whiten,
    })
}

/// `*field = v` when the flag was given.
fn set<T>(field: &mut T, v: Option<T>) {
    if let Some(v) = v {
        *field = v;
    }
}

/// The loss options of a preset (or the SPEC defaults), then the single-field overrides.
/// `--kl none` turns the KL term off (`beta = 0`) whatever `--beta` says.
pub fn loss_options(a: &LossArgs) -> Result<LossOptions, String> {
    let mut o = a
        .preset
        .map_or_else(LossOptions::default, LossOptions::preset);
    set(&mut o.eps_low, a.clip_low);
    set(&mut o.eps_high, a.clip_high);
    set(&mut o.dual_clip, a.dual_clip);
    set(&mut o.beta, a.beta);
    set(&mut o.global_tokens, a.global_tokens);
    set(&mut o.global_sequences, a.global_seqs);
    set(&mut o.horizon, a.horizon);
    set(&mut o.log_ratio_clamp, a.log_ratio_clamp);
    set(&mut o.ratio_level, a.ratio);
    set(&mut o.aggregation, a.agg);
    set(&mut o.seq_log_ratio_max, a.seq_log_ratio_max);
    set(&mut o.kl_input_clamp, a.kl_input_clamp);
    set(&mut o.kl_output_clamp, a.kl_output_clamp);
    set(&mut o.policy_loss, a.policy_loss);
    set(&mut o.sequence_count, a.sequence_count);
    set(&mut o.sapo_tau_pos, a.sapo_tau_pos);
    set(&mut o.sapo_tau_neg, a.sapo_tau_neg);
    set(&mut o.cov_ratio, a.cov_ratio);
    set(&mut o.clip_cov_lb, a.clip_cov_lb);
    set(&mut o.clip_cov_ub, a.clip_cov_ub);
    set(&mut o.kl_cov_coef, a.kl_cov_coef);
    set(&mut o.gmpo_weight_floor, a.gmpo_weight_floor);
    set(&mut o.bypass, a.bypass);
    set(&mut o.vespo_k_pos, a.vespo_k_pos);
    set(&mut o.vespo_lambda_pos, a.vespo_lambda_pos);
    set(&mut o.vespo_k_neg, a.vespo_k_neg);
    set(&mut o.vespo_lambda_neg, a.vespo_lambda_neg);
    set(&mut o.rollout.is_level, a.rollout_is);
    set(&mut o.rollout.is_threshold, a.rollout_is_threshold);
    set(&mut o.rollout.is_threshold_low, a.rollout_is_threshold_low);
    set(&mut o.rollout.rejection_mode, a.rollout_rejection);
    set(&mut o.rollout.log_ratio_clamp, a.rollout_log_ratio_clamp);
    if let (Some(opts), Some(thr)) = (&a.rollout_rs, &a.rollout_rs_threshold) {
        o.rollout.set_rejections(opts, thr).map_err(|_| {
            format!(
                "--rollout-rs {opts:?} with --rollout-rs-threshold {thr:?}: expected names of {} \
                 and one threshold or one per name (k1: lower_upper or u; others: an upper \
                 bound > 0)",
                Rejection::NAMES.join(", ")
            )
        })?;
    }
    if a.no_clamps {
        o = o.without_clamps();
    }
    match a.kl {
        None => {}
        Some(KlChoice::Off) => o.beta = 0.0,
        Some(KlChoice::Estimator(k)) => o.kl_estimator = k,
    }
    o.check().map_err(invalid)?;
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
    set(&mut p.weight_tolerance, a.weight_tolerance);
    set(&mut p.min_criteria, a.min_criteria);
    set(&mut p.max_criteria, a.max_criteria);
    p.check().map_err(invalid)?;
    Ok(p)
}

/// The scoring policies of `--missing`, `--out-of-range` and `--uniform-weights`.
pub fn score_options(a: &ScoreArgs) -> ScoreOptions {
    ScoreOptions {
        missing: a.missing,
        out_of_range: a.out_of_range,
        uniform_weights: a.uniform_weights,
    }
}

/// The generator-reward options (Eq. 4) from the flags.
pub fn generator_options(
    g: &GeneratorArgs,
    s: &ScoreArgs,
    format: FormatPolicy,
) -> Result<GeneratorOptions, String> {
    let o = GeneratorOptions {
        lambda: g.lambda,
        gamma: g.gamma,
        preference: PreferenceOptions {
            tau: g.tau,
            scale: g.scale,
        },
        score: score_options(s),
        format,
        labels: g.unknown_label,
    };
    o.check().map_err(invalid)?;
    Ok(o)
}
