//! The reward functions on structure-aware arbitrary rubrics (weights, criteria counts) and
//! scores: `r_theta` in `[0, 1]`, `r_pref` finite in `[-1, 1]` and antisymmetric (swapping
//! chosen and rejected negates it exactly, and errors are symmetric), `r_align` in
//! `{0, 0.5, 1}`, the group batch equal to the one-response function, never a panic.
#![no_main]

use arbitrary::Arbitrary;
use care_core::reward::{policy_reward_fixed, preference_reward_fixed};
use care_core::{
    MissingPolicy, PreferenceOptions, RangePolicy, ScoreOptions, ScoreScale, alignment,
    alignment_reward, policy_reward_group_fixed,
};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Score {
    Level(u8),
    Any(f64),
    Missing,
}

impl Score {
    fn value(self) -> f64 {
        match self {
            Score::Level(k) => f64::from(k % 6),
            Score::Any(x) => x,
            Score::Missing => f64::NAN,
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Input {
    weights: [f64; 3],
    counts: [u8; 3],
    chosen: Vec<Score>,
    rejected: Vec<Score>,
    missing: u8,
    clamp: bool,
    uniform: bool,
    tau: Option<f64>,
    raw: bool,
    label_counts: [u32; 3],
    wrong_length: bool,
    group: u8,
}

fn fill(s: &[Score], n: usize) -> Vec<f64> {
    (0..n)
        .map(|i| s.get(i).map_or(3.0, |x| x.value()))
        .collect()
}

fuzz_target!(|inp: Input| {
    let counts = inp.counts.map(|c| usize::from(c % 7));
    let total: usize = counts.iter().sum();
    let n = if inp.wrong_length { total + 1 } else { total };
    let chosen = fill(&inp.chosen, n);
    let rejected = fill(&inp.rejected, n);
    let opts = ScoreOptions {
        missing: match inp.missing % 3 {
            0 => MissingPolicy::Error,
            1 => MissingPolicy::Zero,
            _ => MissingPolicy::Skip,
        },
        out_of_range: if inp.clamp {
            RangePolicy::Clamp
        } else {
            RangePolicy::Error
        },
        uniform_weights: inp.uniform,
    };
    let pref = PreferenceOptions {
        tau: inp.tau.unwrap_or(0.7),
        scale: if inp.raw {
            ScoreScale::Raw
        } else {
            ScoreScale::Normalized
        },
    };

    let on_simplex = |w: [f64; 3]| {
        w.iter().all(|x| *x >= 0.0 && x.is_finite()) && (w.iter().sum::<f64>() - 1.0).abs() < 1e-9
    };

    let p = policy_reward_fixed(inp.weights, counts, &chosen, &opts);
    if let Ok(p) = &p {
        assert!((0.0..=1.0).contains(&p.reward), "r_theta {p:?}");
        assert!(p.dim_means.iter().all(|m| (0.0..=1.0).contains(m)), "{p:?}");
        assert!(on_simplex(p.weights), "{p:?}");
    }
    if inp.wrong_length {
        assert!(p.is_err());
    }

    let a = preference_reward_fixed(inp.weights, counts, &chosen, &rejected, &opts, &pref);
    let b = preference_reward_fixed(inp.weights, counts, &rejected, &chosen, &opts, &pref);
    match (&a, &b) {
        (Ok(a), Ok(b)) => {
            assert!(
                a.reward.is_finite() && a.reward.abs() <= 1.0,
                "r_pref {a:?}"
            );
            assert_eq!(a.reward, -b.reward, "antisymmetry: {a:?} vs {b:?}");
            assert!(on_simplex(a.weights), "{a:?}");
        }
        // Both fail; which error is named first may depend on the side checked first.
        (Err(_), Err(_)) => {}
        _ => panic!("asymmetric errors: {a:?} vs {b:?}"),
    }

    let al = alignment(inp.weights, inp.label_counts);
    assert!([0.0, 0.5, 1.0].contains(&al.reward), "{al:?}");
    assert_eq!(al.reward, alignment_reward(inp.weights, inp.label_counts));
    if inp.label_counts == [0; 3] {
        assert_eq!(al.reward, 1.0);
    }

    // The group batch: response j's reward equals the one-response function on its slice.
    let m = usize::from(inp.group % 9);
    let scores: Vec<f64> = (0..m)
        .flat_map(|j| {
            fill(
                if j % 2 == 0 {
                    &inp.chosen
                } else {
                    &inp.rejected
                },
                total,
            )
        })
        .collect();
    let mut out = vec![0.0; m];
    let rep = policy_reward_group_fixed(inp.weights, counts, &opts, &scores, &mut out).unwrap();
    assert_eq!(rep.scored as usize + rep.failed as usize, m);
    for (j, o) in out.iter().enumerate() {
        let one = policy_reward_fixed(
            inp.weights,
            counts,
            &scores[j * total..(j + 1) * total],
            &opts,
        );
        match one {
            Ok(r) => assert_eq!(r.reward, *o),
            Err(_) => assert!(o.is_nan()),
        }
    }
    let mut wrong = vec![0.0; m + 1];
    if total > 0 {
        assert!(
            policy_reward_group_fixed(inp.weights, counts, &opts, &scores, &mut wrong).is_err()
        );
    }
});
