//! The command line parses with the core's names: every name of every `care-core` enum a flag
//! takes is accepted and gives that variant, nothing else is, and the resolved options are the
//! core's own (presets, overrides, and the core's checks with the flag named in the message).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use care_cli::app::{advantage_options, format_policy, generator_options, loss_options};
use care_cli::args::{Cli, CliCommand, KlChoice};
use care_core::grpo::{
    AdvantageOptions, Aggregation, Baseline, KlEstimator, LossOptions, LossPreset, Preset,
    RatioLevel, Scale, SingletonPolicy, StdKind,
};
use care_core::{
    FormatPolicy, GeneratorOptions, MissingPolicy, Named, RangePolicy, ScoreScale,
    UnknownLabelPolicy,
};
use clap::Parser;

fn parse(args: &[&str]) -> Result<CliCommand, clap::Error> {
    Cli::try_parse_from(std::iter::once("care").chain(args.iter().copied())).map(|c| c.command)
}

/// Every name of `T` parses through `flag` of `cmd` to the variant `get` reads back; an
/// upper-cased name and a non-name are refused.
fn accepts_exactly_the_core_names<T: Named + std::fmt::Debug>(
    cmd: &str,
    flag: &str,
    get: impl Fn(CliCommand) -> Option<T>,
) {
    for &v in T::ALL {
        let c = parse(&[cmd, flag, v.name()]).unwrap_or_else(|e| panic!("{flag} {v:?}: {e}"));
        assert_eq!(get(c), Some(v), "{cmd} {flag} {}", v.name());
        let upper = v.name().to_ascii_uppercase();
        assert!(parse(&[cmd, flag, &upper]).is_err(), "{flag} {upper}");
    }
    assert!(parse(&[cmd, flag, "no_such_value"]).is_err(), "{flag}");
}

#[test]
fn every_enum_flag_takes_the_core_names() {
    use CliCommand as C;
    accepts_exactly_the_core_names::<Preset>("advantages", "--preset", |c| match c {
        C::Advantages { adv, .. } => adv.preset,
        _ => None,
    });
    accepts_exactly_the_core_names::<Baseline>("advantages", "--baseline", |c| match c {
        C::Advantages { adv, .. } => adv.baseline,
        _ => None,
    });
    accepts_exactly_the_core_names::<Scale>("advantages", "--scale", |c| match c {
        C::Advantages { adv, .. } => adv.scale,
        _ => None,
    });
    accepts_exactly_the_core_names::<StdKind>("advantages", "--std", |c| match c {
        C::Advantages { adv, .. } => adv.std,
        _ => None,
    });
    accepts_exactly_the_core_names::<SingletonPolicy>("advantages", "--singleton", |c| match c {
        C::Advantages { adv, .. } => adv.singleton,
        _ => None,
    });
    accepts_exactly_the_core_names::<LossPreset>("loss", "--preset", |c| match c {
        C::Loss { loss, .. } => loss.preset,
        _ => None,
    });
    accepts_exactly_the_core_names::<RatioLevel>("loss", "--ratio", |c| match c {
        C::Loss { loss, .. } => loss.ratio,
        _ => None,
    });
    accepts_exactly_the_core_names::<Aggregation>("loss", "--agg", |c| match c {
        C::Loss { loss, .. } => loss.agg,
        _ => None,
    });
    accepts_exactly_the_core_names::<KlEstimator>("loss", "--kl", |c| match c {
        C::Loss { loss, .. } => match loss.kl {
            Some(KlChoice::Estimator(k)) => Some(k),
            _ => None,
        },
        _ => None,
    });
    for cmd in ["score", "generator-reward", "pref"] {
        let score = |c| match c {
            C::Score { score, .. } | C::GeneratorReward { score, .. } => Some(score),
            _ => None,
        };
        accepts_exactly_the_core_names::<MissingPolicy>(cmd, "--missing", |c| {
            score(c).map(|s| s.missing)
        });
        accepts_exactly_the_core_names::<RangePolicy>(cmd, "--out-of-range", |c| {
            score(c).map(|s| s.out_of_range)
        });
    }
    for cmd in ["generator-reward", "pref"] {
        accepts_exactly_the_core_names::<ScoreScale>(cmd, "--scale", |c| match c {
            C::GeneratorReward { generator, .. } => Some(generator.scale),
            _ => None,
        });
        accepts_exactly_the_core_names::<UnknownLabelPolicy>(cmd, "--unknown-label", |c| match c {
            C::GeneratorReward { generator, .. } => Some(generator.unknown_label),
            _ => None,
        });
    }
}

#[test]
fn kl_none_turns_the_kl_term_off() {
    let CliCommand::Loss { loss, .. } = parse(&["loss", "--beta", "0.1", "--kl", "none"]).unwrap()
    else {
        panic!("not loss")
    };
    assert_eq!(loss.kl, Some(KlChoice::Off));
    assert_eq!(loss_options(&loss).unwrap().beta, 0.0);
}

#[test]
fn options_are_the_core_presets_and_defaults_with_the_overrides() {
    let CliCommand::Advantages { adv, .. } =
        parse(&["advantages", "--preset", "openrlhf", "--eps", "0.5"]).unwrap()
    else {
        panic!("not advantages")
    };
    assert_eq!(
        advantage_options(&adv).unwrap().group,
        AdvantageOptions {
            eps: 0.5,
            ..AdvantageOptions::preset(Preset::OpenRlhf)
        }
    );
    let CliCommand::Loss { loss, .. } = parse(&[
        "loss",
        "--preset",
        "verl",
        "--agg",
        "token_sum",
        "--clip-high",
        "0.28",
    ])
    .unwrap() else {
        panic!("not loss")
    };
    assert_eq!(
        loss_options(&loss).unwrap(),
        LossOptions {
            aggregation: Aggregation::TokenSum,
            eps_high: 0.28,
            ..LossOptions::preset(LossPreset::Verl)
        }
    );
    let CliCommand::GeneratorReward {
        generator,
        score,
        format,
        ..
    } = parse(&["generator-reward"]).unwrap()
    else {
        panic!("not generator-reward")
    };
    let format = format_policy(&format).unwrap();
    assert_eq!(format, FormatPolicy::PAPER);
    assert_eq!(
        generator_options(&generator, &score, format).unwrap(),
        GeneratorOptions::PAPER,
        "no flags: the paper's options"
    );
}

#[test]
fn invalid_options_are_refused_by_the_core_check_naming_the_flag() {
    let msg = |args: &[&str]| -> String {
        match parse(args).unwrap() {
            CliCommand::Advantages { adv, .. } => advantage_options(&adv).unwrap_err(),
            CliCommand::Loss { loss, .. } => loss_options(&loss).unwrap_err(),
            CliCommand::Validate { format, .. } => format_policy(&format).unwrap_err(),
            CliCommand::GeneratorReward {
                generator,
                score,
                format,
                ..
            } => {
                generator_options(&generator, &score, format_policy(&format).unwrap()).unwrap_err()
            }
            c => panic!("{c:?}"),
        }
    };
    assert_eq!(
        msg(&["advantages", "--eps", "-1"]),
        "--eps: eps must be finite and >= 0"
    );
    assert_eq!(
        msg(&["loss", "--clip-low", "inf"]),
        "--clip-low: eps_low must be finite and >= 0"
    );
    assert_eq!(
        msg(&["loss", "--global-seqs", "NaN"]),
        "--global-seqs: global_sequences must be finite and >= 0"
    );
    assert_eq!(
        msg(&["loss", "--log-ratio-clamp", "0"]),
        "--log-ratio-clamp: log_ratio_clamp must be > 0 (inf turns it off)"
    );
    assert_eq!(
        msg(&["validate", "--min-criteria", "5"]),
        "--min-criteria: min_criteria must be <= max_criteria"
    );
    assert_eq!(
        msg(&["validate", "--weight-tolerance", "nan"]),
        "--weight-tolerance: weight_tolerance must be finite and >= 0"
    );
    assert_eq!(
        msg(&["pref", "--tau", "0"]),
        "--tau: tau must be finite and > 0"
    );
    assert_eq!(
        msg(&["generator-reward", "--gamma", "inf"]),
        "--gamma: gamma must be finite"
    );
    // The criteria bounds are u8 in the core: clap refuses what does not fit.
    assert!(parse(&["validate", "--max-criteria", "256"]).is_err());
}
