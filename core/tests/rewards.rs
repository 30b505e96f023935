//! CARE rewards (SPEC §6, §7) and the group batch API: worked examples and policies.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use care_core::batch::{policy_reward_group, policy_reward_group_fixed};
use care_core::format::{FormatPolicy, validate};
use care_core::reward::{
    GeneratorOptions, MissingPolicy, PreferenceOptions, RangePolicy, ScoreOptions, ScoreScale,
    generator_reward, generator_reward_validated, policy_reward, policy_reward_fixed,
    preference_reward, preference_reward_fixed, reward_from_real_scores,
};
use care_core::rubric::{Dimension, Rubric};
use care_core::{Error, UnknownLabelPolicy};

const D: &str = "[0] a [1] b [2] c [3] d [4] e [5] f value: 0, 1, 2, 3, 4, 5";

/// The rubric of the SPEC §7 worked example: weights (0.40, 0.35, 0.25), two criteria each.
fn worked() -> Rubric<'static> {
    let mut r = Rubric::new();
    for (d, w) in Dimension::ALL.into_iter().zip([0.40, 0.35, 0.25]) {
        r.set_category(d, w, "why");
        r.push_criterion(d, ["c1", "a1", "p1"][d.index()], D)
            .unwrap();
        r.push_criterion(d, ["c2", "a2", "p2"][d.index()], D)
            .unwrap();
    }
    r
}

const CHOSEN: [f64; 6] = [4.0, 5.0, 4.0, 5.0, 5.0, 5.0];
const REJECTED: [f64; 6] = [3.0, 5.0, 4.0, 2.0, 5.0, 4.0];

fn fixture(name: &str) -> Vec<u8> {
    let p = format!("{}/../cli/data/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&p).unwrap_or_else(|e| panic!("read {p}: {e}"))
}

#[test]
fn worked_example_policy_reward() {
    let r = policy_reward(&worked(), &CHOSEN, &ScoreOptions::default()).unwrap();
    assert!((r.reward - 0.925).abs() < 1e-12, "{}", r.reward);
    assert_eq!(r.dim_means, [0.9, 0.9, 1.0]);
    assert!(!r.fired.any());
}

#[test]
fn worked_example_pref_reward() {
    let p = preference_reward(
        &worked(),
        &CHOSEN,
        &REJECTED,
        &ScoreOptions::default(),
        &PreferenceOptions::default(),
    )
    .unwrap();
    // 0.4*tanh(0.2/0.7)/2 + 0.35*tanh(0.6/0.7)/2 + 0.25*tanh(0.2/0.7)/2
    let t = |x: f64| (x / 0.7).tanh();
    let want = 0.4 * t(0.2) / 2.0 + 0.35 * t(0.6) / 2.0 + 0.25 * t(0.2) / 2.0;
    assert!((p.reward - want).abs() < 1e-12);
    assert_eq!(format!("{:.6}", p.reward), "0.211997");
    // Antisymmetric.
    let q = preference_reward(
        &worked(),
        &REJECTED,
        &CHOSEN,
        &ScoreOptions::default(),
        &PreferenceOptions::default(),
    )
    .unwrap();
    assert_eq!(q.reward, -p.reward);
    // Raw scale saturates: one point is tanh(1/0.7).
    let raw = PreferenceOptions {
        scale: ScoreScale::Raw,
        ..PreferenceOptions::default()
    };
    let p = preference_reward(
        &worked(),
        &CHOSEN,
        &REJECTED,
        &ScoreOptions::default(),
        &raw,
    )
    .unwrap();
    let want = 0.4 * t(1.0) / 2.0 + 0.35 * t(3.0) / 2.0 + 0.25 * t(1.0) / 2.0;
    assert!((p.reward - want).abs() < 1e-12);
}

#[test]
fn bad_tau_and_shapes() {
    let r = worked();
    let o = ScoreOptions::default();
    for tau in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let p = PreferenceOptions {
            tau,
            ..PreferenceOptions::default()
        };
        assert_eq!(
            preference_reward(&r, &CHOSEN, &REJECTED, &o, &p),
            Err(Error::InvalidArgument)
        );
    }
    assert_eq!(policy_reward(&r, &CHOSEN[..5], &o), Err(Error::ScoreShape));
    assert_eq!(
        preference_reward(
            &r,
            &CHOSEN,
            &REJECTED[..5],
            &o,
            &PreferenceOptions::default()
        ),
        Err(Error::ScoreShape)
    );
}

#[test]
fn missing_score_policies() {
    let r = worked();
    let mut s = CHOSEN;
    s[1] = f64::NAN; // Cog criterion 2
    let err = ScoreOptions::default();
    assert_eq!(policy_reward(&r, &s, &err), Err(Error::MissingScore));
    let zero = ScoreOptions {
        missing: MissingPolicy::Zero,
        ..err
    };
    let z = policy_reward(&r, &s, &zero).unwrap();
    assert_eq!(z.dim_means[0], 0.4);
    assert_eq!(z.fired.missing_zeroed, 1);
    let skip = ScoreOptions {
        missing: MissingPolicy::Skip,
        ..err
    };
    let k = policy_reward(&r, &s, &skip).unwrap();
    assert_eq!(k.dim_means[0], 0.8);
    assert_eq!(k.fired.missing_skipped, 1);
    // A dimension left empty contributes 0.
    let all_cog_missing = [f64::NAN, f64::NAN, 5.0, 5.0, 5.0, 5.0];
    let k = policy_reward(&r, &all_cog_missing, &skip).unwrap();
    assert!((k.reward - 0.6).abs() < 1e-12);
    // Under skip, Eq. 3 drops a criterion if either side lacks it (stays antisymmetric).
    let mut rej = REJECTED;
    rej[3] = f64::NAN;
    let a = preference_reward(&r, &CHOSEN, &rej, &skip, &PreferenceOptions::default()).unwrap();
    let b = preference_reward(&r, &rej, &CHOSEN, &skip, &PreferenceOptions::default()).unwrap();
    assert_eq!(a.reward, -b.reward);
    assert_eq!(a.dim_means[1], 0.0); // only Aff criterion 1 left, with equal scores
}

#[test]
fn out_of_range_policies() {
    let r = worked();
    let err = ScoreOptions::default();
    let clamp = ScoreOptions {
        out_of_range: RangePolicy::Clamp,
        ..err
    };
    for bad in [6.0, -1.0, 4.5, f64::INFINITY, f64::NEG_INFINITY] {
        let mut s = CHOSEN;
        s[0] = bad;
        assert_eq!(
            policy_reward(&r, &s, &err),
            Err(Error::ScoreOutOfRange),
            "{bad}"
        );
        let c = policy_reward(&r, &s, &clamp).unwrap();
        assert_eq!(c.fired.clamped, 1);
        let want = (libm::round(bad)).clamp(0.0, 5.0);
        assert!(
            (c.dim_means[0] - (want + 5.0) / 10.0).abs() < 1e-12,
            "{bad}"
        );
    }
}

#[test]
fn uniform_and_fixed_variants() {
    let r = worked();
    let u = ScoreOptions {
        uniform_weights: true,
        ..ScoreOptions::default()
    };
    let p = policy_reward(&r, &CHOSEN, &u).unwrap();
    assert!((p.reward - (0.9 + 0.9 + 1.0) / 3.0).abs() < 1e-12);
    assert!(p.fired.uniform_weights);
    // Fixed weights, same layout.
    let f = policy_reward_fixed(
        [1.0, 0.0, 0.0],
        [2, 2, 2],
        &CHOSEN,
        &ScoreOptions::default(),
    )
    .unwrap();
    assert_eq!(f.reward, 0.9);
    // Off-simplex weights are normalized, and that is reported.
    let f = policy_reward_fixed(
        [2.0, 2.0, 0.0],
        [2, 2, 2],
        &CHOSEN,
        &ScoreOptions::default(),
    )
    .unwrap();
    assert!((f.reward - 0.9).abs() < 1e-12);
    assert!(f.fired.weights_adjusted);
    let p = preference_reward_fixed(
        [0.0, 0.0, 0.0],
        [2, 2, 2],
        &CHOSEN,
        &CHOSEN,
        &ScoreOptions::default(),
        &PreferenceOptions::default(),
    )
    .unwrap();
    assert_eq!(p.reward, 0.0);
    assert_eq!(p.weights, [1.0 / 3.0; 3]);
}

#[test]
fn group_batch_scores_each_response_and_marks_failures() {
    let r = worked();
    let mut scores = Vec::new();
    scores.extend_from_slice(&CHOSEN);
    scores.extend_from_slice(&REJECTED);
    let mut bad = CHOSEN;
    bad[2] = f64::NAN;
    scores.extend_from_slice(&bad);
    let mut out = [0.0; 3];
    let rep = policy_reward_group(&r, &ScoreOptions::default(), &scores, &mut out).unwrap();
    assert!((out[0] - 0.925).abs() < 1e-12);
    let single = policy_reward(&r, &REJECTED, &ScoreOptions::default()).unwrap();
    assert_eq!(out[1], single.reward);
    assert!(out[2].is_nan());
    assert_eq!((rep.scored, rep.failed), (2, 1));
    assert_eq!(rep.first_error, Some((2, Error::MissingScore)));
    let mut out2 = [0.0; 2];
    assert_eq!(
        policy_reward_group(&r, &ScoreOptions::default(), &scores, &mut out2),
        Err(Error::LengthMismatch)
    );
    // A rubric with no criteria: every response scores 0.
    let mut out3 = [1.0; 4];
    let rep = policy_reward_group_fixed(
        [0.4, 0.3, 0.3],
        [0, 0, 0],
        &ScoreOptions::default(),
        &[],
        &mut out3,
    )
    .unwrap();
    assert_eq!(out3, [0.0; 4]);
    assert_eq!(rep.scored, 4);
}

#[derive(serde::Deserialize)]
struct Pref {
    chosen_tactics: Vec<String>,
}

#[test]
fn generator_reward_on_paper_fixtures() {
    let text = fixture("rubric_sft_1.json"); // weights (0.4, 0.25, 0.35), counts [3, 2, 3]
    let pref: Pref = serde_json::from_slice(&fixture("preference_1.json")).unwrap();
    assert_eq!(pref.chosen_tactics, ["questioning", "information"]);
    let chosen = [4.0, 4.0, 5.0, 4.0, 5.0, 3.0, 4.0, 5.0];
    let rejected = [4.0, 3.0, 5.0, 3.0, 4.0, 4.0, 3.0, 5.0];
    let mut scratch = [0u8; 1024];
    let g = generator_reward(
        &text,
        &mut scratch,
        &chosen,
        &rejected,
        &pref.chosen_tactics,
        &GeneratorOptions::default(),
    )
    .unwrap();
    assert!(g.parsed);
    assert_eq!((g.r_fmt, g.r_align, g.violations), (1.0, 1.0, 0));
    assert_eq!(g.counts.counts, [1, 0, 1]);
    let mut s2 = [0u8; 1024];
    let v = validate(&text, &FormatPolicy::PAPER, &mut s2).unwrap();
    let p = preference_reward(
        v.rubric.as_ref().unwrap(),
        &chosen,
        &rejected,
        &ScoreOptions::default(),
        &PreferenceOptions::default(),
    )
    .unwrap();
    assert_eq!(g.r_pref, p.reward);
    assert!((g.reward - (p.reward + 0.1 + 0.3)).abs() < 1e-12);
}

#[test]
fn generator_reward_broken_and_unparseable_rubrics() {
    let opts = GeneratorOptions::default();
    let none: [&str; 0] = [];
    // Not JSON at all: everything 0, scores ignored.
    let g = generator_reward(b"nope", &mut [], &[1.0], &[2.0], &none, &opts).unwrap();
    assert!(!g.parsed);
    assert_eq!(
        (g.reward, g.r_pref, g.r_align, g.r_fmt),
        (0.0, 0.0, 0.0, 0.0)
    );
    // Parses but weights sum to 0.9: r_fmt 0, the rest computed on normalized weights.
    let text = fixture("rubric_sft_1.json");
    let text = String::from_utf8(text).unwrap().replacen("0.35", "0.25", 1);
    let chosen = [5.0; 8];
    let rejected = [0.0; 8];
    let g = generator_reward(
        text.as_bytes(),
        &mut [],
        &chosen,
        &rejected,
        &["advice"],
        &opts,
    )
    .unwrap();
    assert!(g.parsed);
    assert_eq!(g.r_fmt, 0.0);
    assert_eq!(g.violations, 1);
    let full = (1.0f64 / 0.7).tanh();
    assert!((g.r_pref - full).abs() < 1e-12, "{}", g.r_pref);
    // Pro is used but Cog (unused) outweighs it: top + one zero violation = 0.
    assert_eq!(g.r_align, 0.0);
    // Unknown tactic label: error by default, ignored on request.
    assert_eq!(
        generator_reward(
            text.as_bytes(),
            &mut [],
            &chosen,
            &rejected,
            &["hug"],
            &opts
        ),
        Err(Error::UnknownLabel)
    );
    let lenient = GeneratorOptions {
        labels: UnknownLabelPolicy::Ignore,
        ..opts
    };
    let g = generator_reward(
        text.as_bytes(),
        &mut [],
        &chosen,
        &rejected,
        &["hug"],
        &lenient,
    )
    .unwrap();
    assert_eq!((g.counts.unknown, g.r_align), (1, 1.0));
    // Scores that do not fit the parsed rubric are a caller error, not a zero reward.
    assert_eq!(
        generator_reward(
            text.as_bytes(),
            &mut [],
            &chosen[..7],
            &rejected[..7],
            &["advice"],
            &opts
        ),
        Err(Error::ScoreShape)
    );
    // The validated variant gives the same numbers.
    let mut s = [0u8; 16];
    let v = validate(text.as_bytes(), &FormatPolicy::PAPER, &mut s).unwrap();
    let h = generator_reward_validated(&v, &chosen, &rejected, &["hug"], &lenient).unwrap();
    assert_eq!(g, h);
}

#[test]
fn real_valued_scores_give_eq5_and_refuse_what_cannot_be_scored() {
    let opts = ScoreOptions::default();
    // Integer scores: the integer path's reward, bit for bit.
    for s in [CHOSEN, REJECTED, [0.0; 6], [5.0; 6]] {
        let a = policy_reward(&worked(), &s, &opts).unwrap();
        let b = reward_from_real_scores(&worked(), &s, &opts).unwrap();
        assert_eq!(a.reward.to_bits(), b.reward.to_bits(), "{s:?}");
        assert_eq!(a.dim_means, b.dim_means);
    }
    // Between the integers: Eq. 5 by hand. Cog (4.5 + 3) / 10 = 0.75, Aff (2.25 + 5) / 10 =
    // 0.725, Pro (0.5 + 1) / 10 = 0.15.
    let real = [4.5, 3.0, 2.25, 5.0, 0.5, 1.0];
    let r = reward_from_real_scores(&worked(), &real, &opts).unwrap();
    let want = 0.40 * 0.75 + 0.35 * 0.725 + 0.25 * 0.15;
    assert!((r.reward - want).abs() < 1e-12, "{} vs {want}", r.reward);
    assert!(!r.fired.any());
    // The integer path refuses (or rounds) what the real path takes as it is.
    assert_eq!(
        policy_reward(&worked(), &real, &opts).unwrap_err(),
        Error::ScoreOutOfRange
    );
    // Uniform weights (the ablation) apply.
    let u = ScoreOptions {
        uniform_weights: true,
        ..ScoreOptions::default()
    };
    let ru = reward_from_real_scores(&worked(), &real, &u).unwrap();
    assert!((ru.reward - (0.75 + 0.725 + 0.15) / 3.0).abs() < 1e-12);
    assert!(ru.fired.uniform_weights);
    // Refused: no score, infinities, outside 0..=5, the wrong length; the policies that repair
    // integer scores do not apply.
    let lenient = ScoreOptions {
        missing: MissingPolicy::Zero,
        out_of_range: RangePolicy::Clamp,
        uniform_weights: false,
    };
    for o in [opts, lenient] {
        for (k, bad, err) in [
            (0, f64::NAN, Error::NonFinite),
            (1, f64::INFINITY, Error::NonFinite),
            (2, f64::NEG_INFINITY, Error::NonFinite),
            (3, 5.000_001, Error::ScoreOutOfRange),
            (4, -0.01, Error::ScoreOutOfRange),
        ] {
            let mut s = real;
            s[k] = bad;
            assert_eq!(
                reward_from_real_scores(&worked(), &s, &o).unwrap_err(),
                err,
                "{bad}"
            );
        }
        assert_eq!(
            reward_from_real_scores(&worked(), &real[..5], &o).unwrap_err(),
            Error::ScoreShape
        );
    }
    assert_eq!(Error::NonFinite.code(), "non_finite");
}
