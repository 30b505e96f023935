//! Options that validate themselves: every options struct's `check()` names the first field
//! outside its documented domain, `validate()` is the same check as `Error::InvalidArgument`,
//! and every function that takes options refuses invalid ones before it writes anything.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use care_core::grpo::{
    AdvantageOptions, Advantages, GroupLayout, GroupStats, GroupSums, LossInputs, LossOptions,
    LossPreset, Preset, group_advantages, group_advantages_finalize, policy_loss,
};
use care_core::logsoftmax::{
    LogSoftmaxOptions, Logits, LogitsLossBuffers, logits_policy_loss, selective_log_softmax,
    selective_log_softmax_backward,
};
use care_core::reward::{generator_reward_validated, preference_reward_fixed};
use care_core::{
    Error, FormatPolicy, GeneratorOptions, InvalidOption, PreferenceOptions, ScoreOptions,
    format_reward, generator_reward, validate, validate_str,
};
use proptest::prelude::*;

const RUBRIC: &str = include_str!("../../cli/data/rubric_sft_1.json");

/// Values that probe every domain edge: NaN, both infinities, both zeros, tiny, negative.
const EDGES: [f64; 9] = [
    f64::NAN,
    f64::INFINITY,
    f64::NEG_INFINITY,
    0.0,
    -0.0,
    f64::MIN_POSITIVE,
    -1.0,
    0.7,
    1e300,
];

/// The field a failed check names.
fn field(r: Result<(), InvalidOption>) -> Option<&'static str> {
    r.err().map(|e| e.field)
}

#[test]
fn defaults_presets_and_paper_values_are_valid() {
    assert_eq!(FormatPolicy::PAPER.check(), Ok(()));
    assert_eq!(FormatPolicy::lenient().check(), Ok(()));
    assert_eq!(ScoreOptions::default().check(), Ok(()));
    assert_eq!(PreferenceOptions::PAPER.check(), Ok(()));
    assert_eq!(GeneratorOptions::PAPER.check(), Ok(()));
    assert_eq!(AdvantageOptions::default().check(), Ok(()));
    for p in Preset::ALL {
        assert_eq!(AdvantageOptions::preset(p).check(), Ok(()), "{p}");
    }
    assert_eq!(LossOptions::default().check(), Ok(()));
    for p in LossPreset::ALL {
        assert_eq!(LossOptions::preset(p).check(), Ok(()), "{p}");
    }
    assert_eq!(LogSoftmaxOptions::default().check(), Ok(()));
}

#[test]
fn the_message_names_the_field_and_its_domain() {
    let e = PreferenceOptions {
        tau: 0.0,
        ..PreferenceOptions::PAPER
    }
    .check()
    .unwrap_err();
    assert_eq!(e.to_string(), "tau must be finite and > 0");
    assert_eq!(Error::from(e), Error::InvalidArgument);
    let e = FormatPolicy {
        min_criteria: 5,
        max_criteria: 4,
        ..FormatPolicy::PAPER
    }
    .check()
    .unwrap_err();
    assert_eq!(e.to_string(), "min_criteria must be <= max_criteria");
}

proptest! {
    /// Relation: `check()` fails exactly when a field is outside the domain its documentation
    /// gives (an independent predicate per field here), names the first such field in
    /// declaration order, and `validate()` agrees.
    #[test]
    fn loss_options_check_is_the_documented_domain(
        v in prop::array::uniform11(prop::sample::select(EDGES.to_vec())),
    ) {
        let o = LossOptions {
            eps_low: v[0],
            eps_high: v[1],
            dual_clip: v[2],
            log_ratio_clamp: v[3],
            seq_log_ratio_max: v[4],
            beta: v[5],
            kl_input_clamp: v[6],
            kl_output_clamp: v[7],
            global_tokens: v[8],
            global_sequences: v[9],
            horizon: v[10],
            ..LossOptions::default()
        };
        let fin = |x: f64| x.is_finite() && x >= 0.0;
        let pos = |x: f64| x > 0.0;
        let rules: [(&str, bool); 11] = [
            ("eps_low", fin(v[0])),
            ("eps_high", fin(v[1])),
            ("dual_clip", fin(v[2])),
            ("log_ratio_clamp", pos(v[3])),
            ("seq_log_ratio_max", !v[4].is_nan()),
            ("beta", fin(v[5])),
            ("kl_input_clamp", pos(v[6])),
            ("kl_output_clamp", pos(v[7])),
            ("global_tokens", fin(v[8])),
            ("global_sequences", fin(v[9])),
            ("horizon", fin(v[10])),
        ];
        let want = rules.iter().find(|(_, ok)| !ok).map(|(f, _)| *f);
        prop_assert_eq!(field(o.check()), want);
        prop_assert_eq!(o.validate().is_err(), want.is_some());
    }

    /// Relation: the scalar options accept exactly their documented domains.
    #[test]
    fn scalar_options_check_is_the_documented_domain(
        x in prop::sample::select(EDGES.to_vec()),
        lo in 0u8..8,
        hi in 0u8..8,
    ) {
        let pos = x.is_finite() && x > 0.0;
        let nonneg = x.is_finite() && x >= 0.0;
        let p = PreferenceOptions { tau: x, ..PreferenceOptions::PAPER };
        prop_assert_eq!(p.check().is_ok(), pos);
        // The temperature also needs 1/T to be a finite f32 (the kernel's scale).
        let t = LogSoftmaxOptions { temperature: x };
        prop_assert_eq!(t.check().is_ok(), pos && 1.0 / x <= f64::from(f32::MAX));
        let a = AdvantageOptions { eps: x, ..AdvantageOptions::default() };
        prop_assert_eq!(a.check().is_ok(), nonneg);
        let f = FormatPolicy {
            weight_tolerance: x,
            min_criteria: lo,
            max_criteria: hi,
            ..FormatPolicy::PAPER
        };
        let want = if !nonneg {
            Some("weight_tolerance")
        } else if lo > hi {
            Some("min_criteria")
        } else {
            None
        };
        prop_assert_eq!(field(f.check()), want);
        for (lambda, gamma) in [(x, 0.3), (0.1, x)] {
            let g = GeneratorOptions { lambda, gamma, ..GeneratorOptions::PAPER };
            prop_assert_eq!(g.check().is_ok(), x.is_finite());
        }
    }
}

#[test]
fn generator_options_check_their_nested_options() {
    let bad_tau = GeneratorOptions {
        preference: PreferenceOptions {
            tau: -1.0,
            ..PreferenceOptions::PAPER
        },
        ..GeneratorOptions::PAPER
    };
    assert_eq!(field(bad_tau.check()), Some("tau"));
    let bad_format = GeneratorOptions {
        format: FormatPolicy {
            weight_tolerance: f64::INFINITY,
            ..FormatPolicy::PAPER
        },
        ..GeneratorOptions::PAPER
    };
    assert_eq!(field(bad_format.check()), Some("weight_tolerance"));
}

#[test]
fn the_format_functions_refuse_an_invalid_policy() {
    let bad = FormatPolicy {
        min_criteria: 3,
        max_criteria: 2,
        ..FormatPolicy::PAPER
    };
    let mut scratch = vec![0u8; RUBRIC.len()];
    assert_eq!(
        validate(RUBRIC.as_bytes(), &bad, &mut scratch).err(),
        Some(Error::InvalidArgument)
    );
    assert_eq!(
        validate_str(RUBRIC, &bad, &mut scratch).err(),
        Some(Error::InvalidArgument)
    );
    assert_eq!(
        format_reward(RUBRIC.as_bytes(), &bad, &mut scratch),
        Err(Error::InvalidArgument)
    );
    // Invalid UTF-8 is a report, an invalid policy still an error.
    assert_eq!(
        validate(b"\xff", &bad, &mut scratch).err(),
        Some(Error::InvalidArgument)
    );
    assert_eq!(
        format_reward(RUBRIC.as_bytes(), &FormatPolicy::PAPER, &mut scratch),
        Ok(1.0)
    );
}

#[test]
fn the_reward_functions_refuse_invalid_options() {
    let s = [3.0; 4];
    for tau in [0.0, -0.7, f64::NAN, f64::INFINITY] {
        let p = PreferenceOptions {
            tau,
            ..PreferenceOptions::PAPER
        };
        assert_eq!(
            preference_reward_fixed(
                [0.5, 0.5, 0.0],
                [2, 2, 0],
                &s,
                &s,
                &ScoreOptions::default(),
                &p
            ),
            Err(Error::InvalidArgument),
            "tau {tau}"
        );
    }
    let chosen = [5.0; 16];
    let rejected = [1.0; 16];
    let mut scratch = vec![0u8; RUBRIC.len()];
    for opts in [
        GeneratorOptions {
            lambda: f64::NAN,
            ..GeneratorOptions::PAPER
        },
        GeneratorOptions {
            gamma: f64::NEG_INFINITY,
            ..GeneratorOptions::PAPER
        },
        GeneratorOptions {
            preference: PreferenceOptions {
                tau: 0.0,
                ..PreferenceOptions::PAPER
            },
            ..GeneratorOptions::PAPER
        },
        GeneratorOptions {
            format: FormatPolicy {
                min_criteria: 9,
                ..FormatPolicy::PAPER
            },
            ..GeneratorOptions::PAPER
        },
    ] {
        assert_eq!(
            generator_reward(
                RUBRIC.as_bytes(),
                &mut scratch,
                &chosen,
                &rejected,
                &["advice"],
                &opts
            ),
            Err(Error::InvalidArgument),
            "{opts:?}"
        );
        let v = validate(RUBRIC.as_bytes(), &FormatPolicy::PAPER, &mut scratch).unwrap();
        assert_eq!(
            generator_reward_validated(&v, &chosen, &rejected, &["advice"], &opts),
            Err(Error::InvalidArgument),
            "{opts:?}"
        );
    }
}

#[test]
fn the_grpo_functions_refuse_invalid_options_before_writing() {
    let rewards = [0.1f32, 0.9, 0.4, 0.6];
    let bad = AdvantageOptions {
        eps: -1e-6,
        ..AdvantageOptions::default()
    };
    let layout = GroupLayout::Fixed { group_size: 2 };
    let mut out = [7.0f32; 4];
    let mut stats = [GroupStats::default(); 2];
    assert_eq!(
        group_advantages(&rewards, None, layout, &bad, &mut out, Some(&mut stats)),
        Err(Error::InvalidArgument)
    );
    let sums = [GroupSums {
        count: 2.0,
        sum: 1.0,
    }; 2];
    assert_eq!(
        group_advantages_finalize(
            &rewards,
            None,
            layout,
            &sums,
            &[0.1, 0.1],
            &bad,
            &mut out,
            None
        ),
        Err(Error::InvalidArgument)
    );
    assert_eq!(out, [7.0; 4], "nothing written");

    let logp = [-1.0f32, -2.0];
    let inputs = LossInputs {
        logp: &logp,
        logp_old: None,
        logp_ref: None,
        seq_offsets: &[0, 2],
        mask: None,
        advantages: Advantages::PerSequence(&[1.0]),
        logp_rollout: None,
    };
    let bad = LossOptions {
        kl_output_clamp: 0.0,
        ..LossOptions::default()
    };
    let mut grad = [7.0f32; 2];
    assert_eq!(
        policy_loss(&inputs, &bad, &mut grad),
        Err(Error::InvalidArgument)
    );
    assert_eq!(grad, [7.0; 2], "nothing written");
}

#[test]
fn the_log_softmax_functions_refuse_invalid_options_before_writing() {
    let data = [0.5f32, -0.5, 1.0, 0.0];
    let logits = Logits::new(&data, 2, 2, 2).unwrap();
    let targets = [0i32, 1];
    let bad = LogSoftmaxOptions { temperature: 0.0 };
    let mut logp = [7.0f64; 2];
    assert_eq!(
        selective_log_softmax(&logits, &targets, None, &bad, &mut logp, None, None),
        Err(Error::InvalidArgument)
    );
    let mut dlogits = [7.0f64; 4];
    assert_eq!(
        selective_log_softmax_backward(
            &logits,
            &targets,
            None,
            &bad,
            &[1.0, 1.0],
            None,
            &mut dlogits
        ),
        Err(Error::InvalidArgument)
    );
    // A bad loss option is found before the forward pass writes `logp`.
    let zeros = [0.0f64; 2];
    let inputs = LossInputs {
        logp: &zeros,
        logp_old: None,
        logp_ref: None,
        seq_offsets: &[0, 2],
        mask: None,
        advantages: Advantages::PerSequence(&[1.0]),
        logp_rollout: None,
    };
    let bad_loss = LossOptions {
        eps_low: f64::NAN,
        ..LossOptions::default()
    };
    let mut dlogp = [7.0f32; 2];
    let r = logits_policy_loss(
        &logits,
        &targets,
        &LogSoftmaxOptions::default(),
        &inputs,
        &bad_loss,
        LogitsLossBuffers {
            logp: &mut logp,
            dlogp: &mut dlogp,
            dlogits: &mut dlogits,
        },
    );
    assert_eq!(r, Err(Error::InvalidArgument));
    assert_eq!((logp, dlogp, dlogits), ([7.0; 2], [7.0; 2], [7.0; 4]));
}
