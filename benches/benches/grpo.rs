//! The GRPO step on the CPU reference: group advantages and the clipped-ratio loss with its
//! gradient (one core; elements/s).
use std::hint::black_box;

use care_benches::{loss_data, rewards};
use care_core::grpo::{
    AdvantageOptions, Advantages, GroupLayout, IsLevel, LossInputs, LossOptions, LossPreset,
    Preset, RejectBound, Rejection, group_advantages, policy_loss,
};
use criterion::{BenchmarkId, Criterion, Throughput};
use half::bf16;

pub fn register_benches(c: &mut Criterion) {
    advantages(c);
    loss(c);
}

fn advantages(c: &mut Criterion) {
    let mut g = c.benchmark_group("grpo/advantages");
    let opts = AdvantageOptions::preset(Preset::Verl);
    for (n, gs) in [(8192usize, 16usize), (1 << 20, 64)] {
        let r = rewards(n, 3);
        let mut out = vec![0.0f32; n];
        g.throughput(Throughput::Elements(n as u64));
        g.bench_with_input(
            BenchmarkId::new("verl/f32", format!("N={n},G={gs}")),
            &r,
            |b, r| {
                b.iter(|| {
                    group_advantages(
                        black_box(r),
                        None,
                        GroupLayout::Fixed { group_size: gs },
                        &opts,
                        &mut out,
                        None,
                    )
                })
            },
        );
    }
    g.finish();
}

fn loss(c: &mut Criterion) {
    let mut g = c.benchmark_group("grpo/loss_grad");
    g.sample_size(20);
    let tokens = 1usize << 20;
    let d = loss_data(tokens, 1024, 4);
    let opts = LossOptions::default();
    let mut grad = vec![0.0f32; d.logp.len()];
    g.throughput(Throughput::Elements(d.logp.len() as u64));
    let inputs = LossInputs {
        logp: &d.logp[..],
        logp_old: Some(&d.logp_old[..]),
        logp_ref: None,
        seq_offsets: &d.seq_offsets,
        mask: Some(&d.mask),
        advantages: Advantages::PerSequence(&d.advantages),
        logp_rollout: None,
    };
    g.bench_function(BenchmarkId::new("token_mean/f32", "T=1M"), |b| {
        b.iter(|| policy_loss(black_box(&inputs), &opts, &mut grad).map(|o| o.loss))
    });
    let lp: Vec<bf16> = d.logp.iter().map(|&x| bf16::from_f32(x)).collect();
    let lo: Vec<bf16> = d.logp_old.iter().map(|&x| bf16::from_f32(x)).collect();
    let inputs = LossInputs {
        logp: &lp[..],
        logp_old: Some(&lo[..]),
        logp_ref: None,
        seq_offsets: &d.seq_offsets,
        mask: Some(&d.mask),
        advantages: Advantages::PerSequence(&d.advantages),
        logp_rollout: None,
    };
    g.bench_function(BenchmarkId::new("token_mean/bf16", "T=1M"), |b| {
        b.iter(|| policy_loss(black_box(&inputs), &opts, &mut grad).map(|o| o.loss))
    });
    // The rollout correction on: token TIS (C = 2) with the token_k3 and seq_mean_k1
    // rejections, the weights on the policy term (the general loop: one more pass per
    // sequence for the verdicts and the diagnostics).
    let mut rc = LossOptions::default();
    rc.rollout.is_level = IsLevel::Token;
    rc.rollout.set_bound(Rejection::TokenK3, 0.0, 0.05);
    rc.rollout.reject[Rejection::SeqMeanK1 as usize] = RejectBound::ratio(1.05);
    let inputs = LossInputs {
        logp: &d.logp[..],
        logp_old: Some(&d.logp_old[..]),
        logp_ref: None,
        seq_offsets: &d.seq_offsets,
        mask: Some(&d.mask),
        advantages: Advantages::PerSequence(&d.advantages),
        logp_rollout: Some(&d.logp_rollout[..]),
    };
    g.bench_function(BenchmarkId::new("rollout_tis_rs/f32", "T=1M"), |b| {
        b.iter(|| policy_loss(black_box(&inputs), &rc, &mut grad).map(|o| o.loss))
    });
    // The same inputs through GSPO-token, CISPO and KL-Cov (the general loop's other terms;
    // KL-Cov adds the means and the covariance selection's passes).
    for preset in [
        LossPreset::VerlGspo,
        LossPreset::VerlCispo,
        LossPreset::VerlKlCov,
    ] {
        let o = LossOptions::preset(preset);
        g.bench_function(BenchmarkId::new(preset.name(), "T=1M"), |b| {
            b.iter(|| policy_loss(black_box(&inputs), &o, &mut grad).map(|o| o.loss))
        });
    }
    g.finish();
}
