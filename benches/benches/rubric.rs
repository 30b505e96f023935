//! The rubric path on one core: parse + validate (bytes/s), judge-output parsing, scoring a
//! GRPO group under one rubric (responses/s), and the preference and generator rewards.
use std::hint::black_box;

use care_benches::{FIXTURE_1, FIXTURE_2, Rng, compact, group_scores, judge_output, rubric_mix};
use care_core::{
    FormatPolicy, GeneratorOptions, PreferenceOptions, ScoreOptions, generator_reward,
    parse_judge_output, policy_reward_group, preference_reward, validate,
};
use criterion::{BenchmarkId, Criterion, Throughput};

pub fn register_benches(c: &mut Criterion) {
    parse_validate(c);
    judge(c);
    scoring(c);
}

fn parse_validate(c: &mut Criterion) {
    let mut g = c.benchmark_group("rubric/parse_validate");
    let policy = FormatPolicy::PAPER;
    // The fixtures as the files hold them (pretty-printed), as a generator would write them.
    for (name, text) in [("fixture_1", FIXTURE_1), ("fixture_2", FIXTURE_2)] {
        let mut scratch = vec![0u8; text.len()];
        g.throughput(Throughput::Bytes(text.len() as u64));
        g.bench_with_input(BenchmarkId::new("paper", name), text, |b, t| {
            b.iter(|| validate(black_box(t.as_bytes()), &policy, &mut scratch).map(|v| v.r_fmt()))
        });
    }
    // 100 compact rubrics, one in four breaking the contract (every violation kind).
    let mix = rubric_mix(100, 1);
    let bytes: usize = mix.iter().map(String::len).sum();
    let mut scratch = vec![0u8; mix.iter().map(String::len).max().unwrap_or(0)];
    g.throughput(Throughput::Bytes(bytes as u64));
    g.bench_function(BenchmarkId::new("paper", "mix100"), |b| {
        b.iter(|| {
            let mut ok = 0.0;
            for t in &mix {
                // The policy is valid: `map_or` never takes its default.
                ok += validate(black_box(t.as_bytes()), &policy, &mut scratch)
                    .map_or(0.0, |v| v.r_fmt());
            }
            ok
        })
    });
    g.finish();
}

fn judge(c: &mut Criterion) {
    let mut g = c.benchmark_group("rubric/judge_parse");
    for (name, text) in [("fixture_1", FIXTURE_1), ("fixture_2", FIXTURE_2)] {
        let text = compact(text);
        let mut scratch = vec![0u8; text.len()];
        let v = validate(text.as_bytes(), &FormatPolicy::PAPER, &mut scratch)
            .expect("the paper policy is valid");
        let rubric = v.rubric.expect("fixtures are valid");
        let total = rubric.total_criteria();
        let scores = group_scores(&mut Rng::new(2), total, 1);
        let answer = judge_output(&text, &scores);
        let mut out = vec![0.0; total];
        g.throughput(Throughput::Bytes(answer.len() as u64));
        g.bench_with_input(BenchmarkId::new("think_fenced", name), &answer, |b, a| {
            b.iter(|| {
                parse_judge_output(black_box(a.as_bytes()), &rubric, &mut out).map(|r| r.matched)
            })
        });
    }
    g.finish();
}

fn scoring(c: &mut Criterion) {
    let text = compact(FIXTURE_1);
    let mut scratch = vec![0u8; text.len()];
    let v = validate(text.as_bytes(), &FormatPolicy::PAPER, &mut scratch)
        .expect("the paper policy is valid");
    let rubric = v.rubric.expect("fixture is valid");
    let total = rubric.total_criteria();
    let opts = ScoreOptions::default();

    // Benchmark ids keep their names from before the renames so that saved baselines compare.
    let mut g = c.benchmark_group("rubric/score_group");
    for m in [6usize, 64] {
        let scores = group_scores(&mut Rng::new(m as u64), total, m);
        let mut out = vec![0.0; m];
        g.throughput(Throughput::Elements(m as u64));
        g.bench_with_input(BenchmarkId::new("policy_reward", m), &scores, |b, s| {
            b.iter(|| policy_reward_group(&rubric, &opts, black_box(s), &mut out).map(|r| r.scored))
        });
    }
    g.finish();

    let mut g = c.benchmark_group("rubric/preference");
    let mut rng = Rng::new(11);
    let chosen = group_scores(&mut rng, total, 1);
    let rejected = group_scores(&mut rng, total, 1);
    let pref = PreferenceOptions::default();
    g.throughput(Throughput::Elements(1));
    g.bench_function(BenchmarkId::new("pref_reward", "fixture_1"), |b| {
        b.iter(|| {
            preference_reward(&rubric, black_box(&chosen), &rejected, &opts, &pref)
                .map(|r| r.reward)
        })
    });
    // Eq. 4 from the raw generator text: validation + r_pref + r_align.
    let gen_opts = GeneratorOptions::default();
    let tactics = ["questioning", "validation", "advice"];
    let mut gscratch = vec![0u8; text.len()];
    g.throughput(Throughput::Bytes(text.len() as u64));
    g.bench_function(BenchmarkId::new("generator_reward", "fixture_1"), |b| {
        b.iter(|| {
            generator_reward(
                black_box(text.as_bytes()),
                &mut gscratch,
                &chosen,
                &rejected,
                &tactics,
                &gen_opts,
            )
            .map(|r| r.reward)
        })
    });
    g.finish();
}
