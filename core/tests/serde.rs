//! The `serde` feature: every public data type round-trips through `serde_json` exactly
//! (infinities and NaN included where a type can hold them), enums are written by their stable
//! names, a serialized rubric is rubric JSON that passes the format contract again, and a
//! validation report serializes into a fixed buffer with `serde-json-core` (no allocation).
#![cfg(feature = "serde")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use care_core::batch::GroupReport;
use care_core::grpo::{
    AdvantageOptions, Advantages, Aggregation, GroupStats, GroupSums, KlEstimator, LossInputs,
    LossOptions, LossOutput, LossPreset, LossStats, Preset, RatioLevel, policy_loss,
};
use care_core::logsoftmax::LogSoftmaxOptions;
use care_core::reward::Fired;
use care_core::{
    Dimension, Error, FormatPolicy, GeneratorOptions, JudgeReport, MissingPolicy, Named,
    PreferenceOptions, RangePolicy, Report, RubricBuf, ScoreOptions, ScoreScale, ViolationCode,
    generator_reward, parse_judge_output, policy_reward, validate,
};
use proptest::prelude::*;
use serde::Serialize;
use serde::de::DeserializeOwned;

const FIXTURES: [&str; 2] = [
    include_str!("../../cli/data/rubric_sft_1.json"),
    include_str!("../../cli/data/rubric_sft_2.json"),
];

/// Through JSON and back.
fn json_round_trip<T: Serialize + DeserializeOwned>(v: &T) -> T {
    let s = serde_json::to_string(v).unwrap();
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("{e}: {s}"))
}

/// The bits of every float field, so that NaN compares equal to itself.
fn stats_bits(s: &LossStats) -> [u64; 14] {
    [
        s.tokens,
        s.sequences,
        s.loss,
        s.clipped,
        s.clipped_low,
        s.clipped_high,
        s.dual_clipped,
        s.ppo_kl_sum,
        s.kl_sum,
        s.ratio_sum,
        s.log_ratio_clamped,
        s.non_finite,
        s.ratio_min,
        s.ratio_max,
    ]
    .map(f64::to_bits)
}

#[test]
fn enums_are_written_by_their_stable_names() {
    fn each<T: Named + Serialize + DeserializeOwned + std::fmt::Debug>() {
        for (&v, &n) in T::ALL.iter().zip(T::NAMES) {
            assert_eq!(serde_json::to_string(&v).unwrap(), format!("\"{n}\""));
            assert_eq!(json_round_trip(&v), v);
        }
        let e = serde_json::from_str::<T>("\"not_a_name\"").unwrap_err();
        assert!(e.to_string().contains(T::NAMES[0]), "{e}");
    }
    each::<MissingPolicy>();
    each::<care_core::JudgePromptLayout>();
    each::<RangePolicy>();
    each::<ScoreScale>();
    each::<Dimension>();
    each::<ViolationCode>();
    each::<Error>();
    each::<Preset>();
    each::<LossPreset>();
    each::<Aggregation>();
    each::<KlEstimator>();
    each::<RatioLevel>();
    each::<care_core::grpo::Baseline>();
    each::<care_core::grpo::Scale>();
    each::<care_core::grpo::StdKind>();
    each::<care_core::grpo::SingletonPolicy>();
    each::<care_core::UnknownLabelPolicy>();
    each::<care_core::strategy::Taxonomy>();
    each::<care_core::Dtype>();
}

#[test]
fn options_round_trip_and_refuse_unknown_fields() {
    assert_eq!(json_round_trip(&FormatPolicy::PAPER), FormatPolicy::PAPER);
    assert_eq!(
        json_round_trip(&FormatPolicy::lenient()),
        FormatPolicy::lenient()
    );
    let score = ScoreOptions {
        missing: MissingPolicy::Skip,
        out_of_range: RangePolicy::Clamp,
        uniform_weights: true,
    };
    assert_eq!(json_round_trip(&score), score);
    let gen_opts = GeneratorOptions {
        preference: PreferenceOptions {
            tau: 1.5,
            scale: ScoreScale::Raw,
        },
        score,
        format: FormatPolicy::lenient(),
        ..GeneratorOptions::PAPER
    };
    assert_eq!(json_round_trip(&gen_opts), gen_opts);
    for p in Preset::ALL {
        let o = AdvantageOptions::preset(p);
        assert_eq!(json_round_trip(&o), o);
    }
    assert_eq!(
        json_round_trip(&LogSoftmaxOptions { temperature: 0.6 }),
        LogSoftmaxOptions { temperature: 0.6 }
    );
    // The clamps of the loss may be infinite (off): that survives JSON.
    let loss = LossOptions {
        log_ratio_clamp: f64::INFINITY,
        seq_log_ratio_max: f64::NEG_INFINITY,
        ..LossOptions::preset(LossPreset::Verl)
    };
    let text = serde_json::to_string(&loss).unwrap();
    assert!(text.contains(r#""log_ratio_clamp":"inf""#), "{text}");
    assert!(text.contains(r#""aggregation":"token_mean""#), "{text}");
    assert_eq!(serde_json::from_str::<LossOptions>(&text).unwrap(), loss);
    // A misspelt field is an error, not a silently ignored key.
    let typo = text.replace("eps_low", "eps_lo");
    assert!(serde_json::from_str::<LossOptions>(&typo).is_err());
}

#[test]
fn loaded_options_are_checked_where_they_are_used() {
    // Deserialization builds the struct as a literal would; `check()` (and every function
    // that takes options) refuses it, naming the field.
    let o: PreferenceOptions =
        serde_json::from_str(r#"{"tau":-1.0,"scale":"normalized"}"#).unwrap();
    assert_eq!(o.check().map_err(|e| e.field), Err("tau"));
}

proptest! {
    /// Relation: LossStats -> JSON -> LossStats is the identity on the bits of every field,
    /// including the empty value's infinities and NaN sums from non-finite inputs.
    #[test]
    fn loss_stats_round_trip_bit_for_bit(
        v in prop::array::uniform14(prop_oneof![
            4 => any::<f64>(),
            1 => Just(f64::INFINITY),
            1 => Just(f64::NEG_INFINITY),
            1 => Just(f64::NAN),
            1 => Just(-0.0),
        ]),
    ) {
        let s = LossStats {
            tokens: v[0], sequences: v[1], loss: v[2], clipped: v[3], clipped_low: v[4],
            clipped_high: v[5], dual_clipped: v[6], ppo_kl_sum: v[7], kl_sum: v[8],
            ratio_sum: v[9], log_ratio_clamped: v[10], non_finite: v[11], ratio_min: v[12],
            ratio_max: v[13],
        };
        prop_assert_eq!(stats_bits(&json_round_trip(&s)), stats_bits(&s));
    }
}

#[test]
fn results_of_the_grpo_step_round_trip() {
    assert_eq!(
        stats_bits(&json_round_trip(&LossStats::EMPTY)),
        stats_bits(&LossStats::EMPTY)
    );
    let logp = [-1.0f32, -2.0, -0.5];
    let inputs = LossInputs {
        logp: &logp,
        logp_old: Some(&[-1.1, -2.0, -0.4]),
        logp_ref: None,
        seq_offsets: &[0, 2, 3],
        mask: None,
        advantages: Advantages::PerSequence(&[1.0, -0.5]),
        logp_rollout: None,
    };
    let mut grad = [0.0f32; 3];
    let out = policy_loss(&inputs, &LossOptions::default(), &mut grad).unwrap();
    let back: LossOutput = json_round_trip(&out);
    assert_eq!(back.loss.to_bits(), out.loss.to_bits());
    assert_eq!(stats_bits(&back.stats), stats_bits(&out.stats));
    let g = GroupStats {
        count: 3,
        mean: 0.25,
        std: 0.125,
        zero_variance: 0,
    };
    assert_eq!(json_round_trip(&g), g);
    let s = GroupSums {
        count: 2.0,
        sum: 0.75,
    };
    assert_eq!(json_round_trip(&s), s);
}

#[test]
fn rewards_and_reports_round_trip() {
    let text = FIXTURES[0];
    let mut scratch = vec![0u8; text.len()];
    let v = validate(text.as_bytes(), &FormatPolicy::PAPER, &mut scratch).unwrap();
    let rubric = v.rubric.as_ref().unwrap();
    let chosen = vec![4.0; rubric.total_criteria()];
    let mut rejected = vec![2.0; rubric.total_criteria()];
    rejected[0] = f64::NAN;
    let lenient = ScoreOptions {
        missing: MissingPolicy::Zero,
        ..ScoreOptions::default()
    };
    let p = policy_reward(rubric, &rejected, &lenient).unwrap();
    assert!(p.fired.any());
    assert_eq!(json_round_trip(&p), p);
    let g = generator_reward(
        text.as_bytes(),
        &mut vec![0u8; text.len()],
        &chosen,
        &chosen,
        &["questioning", "hug"],
        &GeneratorOptions {
            labels: care_core::UnknownLabelPolicy::Ignore,
            ..GeneratorOptions::PAPER
        },
    )
    .unwrap();
    assert_eq!(json_round_trip(&g), g);
    let rep = GroupReport {
        scored: 5,
        failed: 1,
        first_error: Some((3, Error::ScoreOutOfRange)),
        fired: Fired::default(),
    };
    let s = serde_json::to_string(&rep).unwrap();
    assert!(
        s.contains(r#""first_error":[3,"score_out_of_range"]"#),
        "{s}"
    );
    assert_eq!(json_round_trip(&rep), rep);
    let mut out = vec![0.0; rubric.total_criteria()];
    let j = parse_judge_output(b"{\"criterion_scores\":[]}", rubric, &mut out).unwrap();
    assert_eq!(json_round_trip::<JudgeReport>(&j), j);
}

/// A rubric that breaks the contract in many ways: every kind of message argument.
fn broken_report() -> Report {
    let t = FIXTURES[0]
        .replacen("0.4", "1.5", 1) // weight_range (a number) and weight_sum
        .replacen("[3]", "[9]", 1) // level_format (a text)
        .replacen("\"title\"", "\"titel\"", 1); // schema: unknown key (a text) and missing key
    let mut scratch = vec![0u8; t.len()];
    validate(t.as_bytes(), &FormatPolicy::PAPER, &mut scratch)
        .unwrap()
        .report
}

#[test]
fn a_validation_report_round_trips_with_its_messages() {
    let report = broken_report();
    assert!(report.violations().len() >= 4, "{report}");
    let back: Report = json_round_trip(&report);
    assert_eq!(back, report);
    assert_eq!(back.to_string(), report.to_string(), "same retry messages");
    let s = serde_json::to_string(&report).unwrap();
    assert!(
        s.contains(r#""code":"weight_range""#) && s.contains(r#""overflowed":false"#),
        "{s}"
    );
    // A note the validator never writes, or a text too long for a violation, is an error.
    let forged = s.replacen("category_weight outside [0, 1]:", "made up", 1);
    assert!(serde_json::from_str::<Report>(&forged).is_err());
    let long = r#"{"text":"0123456789012345678901234567890123","truncated":false}"#;
    assert!(serde_json::from_str::<care_core::format::ShortText>(long).is_err());
    let short: care_core::format::ShortText =
        serde_json::from_str(r#"{"text":"caf\u00e9","truncated":true}"#).unwrap();
    assert_eq!((short.as_str(), short.is_truncated()), ("café", true));
}

#[test]
fn a_report_serializes_into_a_fixed_buffer_without_allocating() {
    // The `no_std` path: serde-json-core writes into the caller's buffer.
    let report = broken_report();
    let mut buf = [0u8; 8192];
    let n = serde_json_core::to_slice(&report, &mut buf).unwrap();
    let from_core: serde_json::Value = serde_json::from_slice(&buf[..n]).unwrap();
    assert_eq!(from_core, serde_json::to_value(&report).unwrap());
    let mut small = [0u8; 64];
    assert!(serde_json_core::to_slice(&report, &mut small).is_err());
}

#[test]
fn a_serialized_rubric_is_rubric_json_that_passes_the_contract() {
    for text in FIXTURES {
        let mut scratch = vec![0u8; text.len()];
        let v = validate(text.as_bytes(), &FormatPolicy::PAPER, &mut scratch).unwrap();
        let rubric = v.rubric.as_ref().unwrap();
        let owned = RubricBuf::from(rubric);
        let json = serde_json::to_string(&owned).unwrap();
        assert_eq!(json, serde_json::to_string(rubric).unwrap());
        // Rubric JSON: it validates with no violation and gives the same rubric back.
        let mut scratch2 = vec![0u8; json.len()];
        let again = validate(json.as_bytes(), &FormatPolicy::PAPER, &mut scratch2).unwrap();
        assert!(again.is_valid(), "{}", again.report);
        assert_eq!(again.rubric.as_ref(), Some(rubric));
        // And it reads back as the same owned rubric.
        let back: RubricBuf = serde_json::from_str(&json).unwrap();
        assert_eq!(back, owned);
        // The validation (borrowed rubric and report) serializes too.
        let vj = serde_json::to_value(&v).unwrap();
        assert_eq!(
            vj["rubric"],
            serde_json::from_str::<serde_json::Value>(&json).unwrap()
        );
    }
}

#[test]
fn a_partial_rubric_round_trips_and_a_malformed_one_is_refused() {
    let partial = r#"{"categories":[{"category":"Proactive Empathy","weight_rationale":"r","category_weight":1.0,"criteria":[]}]}"#;
    let r: RubricBuf = serde_json::from_str(partial).unwrap();
    assert!(r.rubric().category(Dimension::Proactive).present);
    assert!(!r.rubric().category(Dimension::Cognitive).present);
    assert_eq!(serde_json::to_string(&r).unwrap(), partial);
    let twice = partial.replace("[{", "[{\"category\":\"Proactive Empathy\",\"weight_rationale\":\"r\",\"category_weight\":1.0,\"criteria\":[]},{");
    assert!(serde_json::from_str::<RubricBuf>(&twice).is_err());
    let unknown = partial.replace("Proactive Empathy", "Proactive");
    assert!(serde_json::from_str::<RubricBuf>(&unknown).is_err());
    let crit = r#"{"title":"t","description":"d"}"#;
    let many = partial.replace("[]", &format!("[{}]", vec![crit; 17].join(",")));
    assert!(serde_json::from_str::<RubricBuf>(&many).is_err());
    let sixteen = partial.replace("[]", &format!("[{}]", vec![crit; 16].join(",")));
    assert!(serde_json::from_str::<RubricBuf>(&sixteen).is_ok());
}
