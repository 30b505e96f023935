//! The preference outcome (SPEC §7) against an exact rational reference: random rubrics with 2
//! to 4 criteria per dimension, weights spelled in several ways, and planted ties that `f64`
//! arithmetic splits.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use care_core::outcome::preference_outcome_fixed;
use care_core::{FormatPolicy, PreferenceOutcome, ScoreOptions, policy_reward, validate};
use proptest::prelude::*;

/// Weights are multiples of 10^-4, written out as text.
const SCALE: i64 = 10_000;

/// `w / 10^4` written one of several ways (all the same number).
fn spell(w: i64, how: u8) -> String {
    let plain = format!("{}.{:04}", w / SCALE, w % SCALE);
    match how % 5 {
        0 => plain,
        1 => format!("{plain}00"),
        2 => format!("{w}e-4"),
        3 => format!("{}E-3", w as f64 / 10.0),
        _ => {
            let t = plain.trim_end_matches('0');
            if t.ends_with('.') {
                format!("{t}0")
            } else {
                t.to_owned()
            }
        }
    }
}

fn rubric_json(w: [&str; 3], n: [usize; 3]) -> String {
    let names = [
        "Cognitive Empathy",
        "Affective Empathy",
        "Proactive Empathy",
    ];
    let cats: Vec<String> = (0..3)
        .map(|d| {
            let crit: Vec<String> = (0..n[d])
                .map(|i| {
                    format!(
                        "{{\"title\":\"d{d} c{i}\",\"description\":\"[0] no [1] a [2] b [3] c [4] d [5] e\"}}"
                    )
                })
                .collect();
            format!(
                "{{\"category\":\"{}\",\"weight_rationale\":\"r\",\"category_weight\":{},\"criteria\":[{}]}}",
                names[d],
                w[d],
                crit.join(",")
            )
        })
        .collect();
    format!("{{\"categories\":[{}]}}", cats.join(","))
}

/// The sign of `sum_d w_d (S+_d - S-_d) / k_d` in exact integer arithmetic: the reference.
fn reference(
    w: [i64; 3],
    k: [usize; 3],
    chosen: [i64; 3],
    rejected: [i64; 3],
) -> PreferenceOutcome {
    let w = if w.iter().all(|&x| x == 0) { [1; 3] } else { w };
    let k = k.map(|x| x as i128);
    let total: i128 = (0..3)
        .map(|d| {
            let others: i128 = (0..3).filter(|&e| e != d).map(|e| k[e]).product();
            i128::from(w[d]) * i128::from(chosen[d] - rejected[d]) * others
        })
        .sum();
    match total.signum() {
        1 => PreferenceOutcome::Win,
        0 => PreferenceOutcome::Tie,
        _ => PreferenceOutcome::Loss,
    }
}

/// Scores in `0..=5` for `k` criteria summing to `s` (`0 <= s <= 5k`), spread by `seed`.
fn realize(s: i64, k: usize, seed: u64) -> Vec<f64> {
    let mut v = vec![0i64; k];
    let mut left = s;
    let mut i = (seed as usize) % k;
    while left > 0 {
        if v[i] < 5 {
            v[i] += 1;
            left -= 1;
        }
        i = (i + 1) % k;
    }
    v.into_iter().map(|x| x as f64).collect()
}

fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 { a.abs() } else { gcd(b, a % b) }
}

#[derive(Clone, Debug)]
struct Case {
    w: [i64; 3],
    spelling: [u8; 3],
    k: [usize; 3],
    chosen: [i64; 3],
    rejected: [i64; 3],
    seed: u64,
}

/// A pair whose exact difference is 0 through two dimensions that cancel (when the weights and
/// counts allow one in range), the third equal.
fn plant_tie(
    w: [i64; 3],
    k: [usize; 3],
    i: usize,
    j: usize,
    base: [i64; 3],
    step: i64,
) -> Option<([i64; 3], [i64; 3])> {
    if i == j || w[i] == 0 || w[j] == 0 {
        return None;
    }
    let (ki, kj) = (k[i] as i64, k[j] as i64);
    let g = gcd(w[j] * ki, w[i] * kj);
    let xi = step * w[j] * ki / g;
    let xj = -step * w[i] * kj / g;
    let mut c = base;
    let mut r = base;
    for (d, x) in [(i, xi), (j, xj)] {
        let kd = k[d] as i64;
        // chosen - rejected = x, both in 0..=5k.
        let lo = x.max(0);
        let hi = 5 * kd + x.min(0);
        if lo > hi {
            return None;
        }
        c[d] = lo + base[d].rem_euclid(hi - lo + 1);
        r[d] = c[d] - x;
    }
    Some((c, r))
}

fn case() -> impl Strategy<Value = Case> {
    let weight = prop_oneof![
        // A coarse grid: cancellations are common.
        (0i64..=20).prop_map(|x| x * 500),
        0i64..=SCALE,
    ];
    (
        [weight.clone(), weight.clone(), weight],
        any::<[u8; 3]>(),
        [2usize..=4, 2usize..=4, 2usize..=4],
        [0i64..=20, 0i64..=20, 0i64..=20],
        [0i64..=20, 0i64..=20, 0i64..=20],
        any::<u64>(),
        (0usize..3, 0usize..3, 1i64..=3, any::<bool>()),
    )
        .prop_map(|(w, spelling, k, c, r, seed, (i, j, step, tie))| {
            let clamp = |s: [i64; 3]| [0, 1, 2].map(|d| s[d].min(5 * k[d] as i64));
            let (mut chosen, mut rejected) = (clamp(c), clamp(r));
            if tie && let Some((a, b)) = plant_tie(w, k, i, j, chosen, step) {
                chosen = a;
                rejected = b;
                let other = 3 - i - j;
                if i != j && other < 3 {
                    rejected[other] = chosen[other];
                }
            }
            Case {
                w,
                spelling,
                k,
                chosen,
                rejected,
                seed,
            }
        })
}

fn run(c: &Case, opts: &ScoreOptions) -> (PreferenceOutcome, f64, f64) {
    let texts: Vec<String> = (0..3).map(|d| spell(c.w[d], c.spelling[d])).collect();
    let json = rubric_json([&texts[0], &texts[1], &texts[2]], c.k);
    let mut scratch = vec![0u8; json.len()];
    let v = validate(json.as_bytes(), &FormatPolicy::PAPER, &mut scratch).unwrap();
    let rubric = v.rubric.as_ref().unwrap();
    let flat = |s: [i64; 3], salt: u64| -> Vec<f64> {
        (0..3)
            .flat_map(|d| realize(s[d], c.k[d], c.seed.wrapping_add(salt + d as u64)))
            .collect()
    };
    let (chosen, rejected) = (flat(c.chosen, 0), flat(c.rejected, 7));
    let o = care_core::preference_outcome(rubric, &chosen, &rejected, opts).unwrap();
    let rc = policy_reward(rubric, &chosen, opts).unwrap().reward;
    let rr = policy_reward(rubric, &rejected, opts).unwrap().reward;
    (o, rc, rr)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// Relation: the outcome of a pair under a rubric parsed from JSON is the sign of the exact
    /// rational difference of the two rewards, whatever the spelling of the weights.
    #[test]
    fn the_outcome_is_the_sign_of_the_exact_difference(c in case()) {
        let (o, _, _) = run(&c, &ScoreOptions::default());
        prop_assert_eq!(o, reference(c.w, c.k, c.chosen, c.rejected), "{:?}", c);
        // Under the uniform-weights ablation every weight is the same.
        let uniform = ScoreOptions { uniform_weights: true, ..ScoreOptions::default() };
        let (u, _, _) = run(&c, &uniform);
        prop_assert_eq!(u, reference([1, 1, 1], c.k, c.chosen, c.rejected));
    }

    /// Relation: swapping the two responses mirrors the outcome.
    #[test]
    fn swapping_the_pair_mirrors_the_outcome(c in case()) {
        let (o, _, _) = run(&c, &ScoreOptions::default());
        let swapped = Case { chosen: c.rejected, rejected: c.chosen, ..c.clone() };
        let (s, _, _) = run(&swapped, &ScoreOptions::default());
        let mirror = match o {
            PreferenceOutcome::Win => PreferenceOutcome::Loss,
            PreferenceOutcome::Loss => PreferenceOutcome::Win,
            PreferenceOutcome::Tie => PreferenceOutcome::Tie,
        };
        prop_assert_eq!(s, mirror);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    /// Relation: any weight text, JSON number or not, gives an outcome or an error, never a
    /// panic; a JSON number gives the same outcome as its shortest `f64` spelling whenever
    /// that spelling is the same number (at most 17 significant digits, no exponent overflow).
    #[test]
    fn any_weight_text_is_read_or_refused(
        text in prop_oneof![
            "-?(0|[1-9][0-9]{0,30})(\\.[0-9]{1,40})?([eE][-+]?[0-9]{1,4})?",
            ".{0,12}",
        ],
        c in [0u64..=10, 0u64..=10, 0u64..=10],
        r in [0u64..=10, 0u64..=10, 0u64..=10],
    ) {
        use care_core::outcome::{DimensionSums, compare_sums};
        let sums = |s: [u64; 3]| DimensionSums { sums: s, counts: [2, 2, 2] };
        let w: f64 = text.parse().unwrap_or(f64::NAN);
        let weights = [w, 0.25, 0.5];
        let got = compare_sums(weights, [&text, "0.25", "0.5"], &sums(c), &sums(r), false);
        let shortest = format!("{w:e}");
        let digits = shortest.split('e').next().unwrap_or("").replace(['.', '-'], "");
        if let Ok(o) = got
            && w.is_finite()
            && w > 0.0
            && digits.len() <= 15
            && text.parse::<f64>().ok().map(|x| format!("{x:e}")) == Some(shortest.clone())
            && exact_is_shortest(&text, &shortest)
        {
            let via_f64 = compare_sums(weights, ["", "0.25", "0.5"], &sums(c), &sums(r), false).unwrap();
            prop_assert_eq!(o, via_f64);
        }
    }
}

/// Whether the decimal `text` is the same number as the decimal `shortest` (both written
/// exactly): compared as digit strings and exponents, without floating point.
fn exact_is_shortest(text: &str, shortest: &str) -> bool {
    /// The significant digits and the power of ten of the first one.
    fn norm(t: &str) -> Option<(String, i64)> {
        let t = t.strip_prefix('-').unwrap_or(t);
        let (m, e) = match t.find(['e', 'E']) {
            Some(i) => (&t[..i], t[i + 1..].parse::<i64>().ok()?),
            None => (t, 0),
        };
        let (int, frac) = m.split_once('.').unwrap_or((m, ""));
        let digits = format!("{int}{frac}");
        let lead = digits.len() - digits.trim_start_matches('0').len();
        let d = digits.trim_matches('0').to_owned();
        if d.is_empty() {
            return Some((String::new(), 0));
        }
        Some((d, e + int.len() as i64 - lead as i64))
    }
    norm(text).is_some() && norm(text) == norm(shortest)
}

/// Planted ties are never split, and they are cases `f64` does split: comparing the two `f64`
/// rewards gets some of them wrong, so the exact rule is not vacuous.
#[test]
fn planted_ties_are_ties_where_f64_rewards_differ() {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = |m: u64| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) % m
    };
    let (mut planted, mut split) = (0, 0);
    for _ in 0..20_000 {
        let w = [0, 1, 2].map(|_| next(21) as i64 * 500);
        let k = [0, 1, 2].map(|_| 2 + next(3) as usize);
        let (i, j) = (next(3) as usize, next(3) as usize);
        let base = [0, 1, 2].map(|d| next(5 * k[d] as u64 + 1) as i64);
        let Some((chosen, mut rejected)) = plant_tie(w, k, i, j, base, 1 + next(3) as i64) else {
            continue;
        };
        let other = 3 - i - j;
        rejected[other] = chosen[other];
        let c = Case {
            w,
            spelling: [next(5) as u8, next(5) as u8, next(5) as u8],
            k,
            chosen,
            rejected,
            seed: next(1 << 30),
        };
        assert_eq!(reference(w, k, chosen, rejected), PreferenceOutcome::Tie);
        let (o, rc, rr) = run(&c, &ScoreOptions::default());
        assert_eq!(o, PreferenceOutcome::Tie, "{c:?}");
        planted += 1;
        split += usize::from(rc != rr);
    }
    assert!(planted > 3_000, "{planted} ties planted");
    eprintln!("{split} of {planted} planted ties have different f64 rewards");
    assert!(split > 0, "f64 split none of {planted} planted ties");
}

/// The example of the issue that showed the split, through the fixed-weights entry point.
#[test]
fn the_reported_case_is_a_tie() {
    let chosen = [2.0, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 3.0, 2.0, 2.0];
    let rejected = [3.0, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 3.0, 1.0, 2.0];
    let o = preference_outcome_fixed(
        [0.35, 0.3, 0.35],
        [4, 2, 4],
        &chosen,
        &rejected,
        &ScoreOptions::default(),
    )
    .unwrap();
    assert_eq!(o, PreferenceOutcome::Tie);
}
