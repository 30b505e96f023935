//! The GRPO step of `examples/c/grpo_step.c` and `examples/cpp/grpo_step.cpp`, computed with
//! the Rust API of `care-core` and printed in the same format. CI compares the outputs
//! (`ffi/run-examples.sh`), which checks the C ABI and the RAII wrappers end to end.
//!
//! Usage: `cargo run -p care-ffi --example reference -- RUBRIC.json`

use std::fmt::Write as _;
use std::process::ExitCode;

use care_core::grpo::{
    AdvantageOptions, Advantages, GroupLayout, GroupStats, LossInputs, LossOptions, LossPreset,
    Preset, group_advantages, policy_loss,
};
use care_core::{Dimension, FormatPolicy, RubricBuf, ScoreOptions};

const G: usize = 4;
const B: usize = 2;
const N: usize = B * G;

fn main() -> ExitCode {
    match run() {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("reference: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<String, Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: reference RUBRIC.json")?;
    let text = std::fs::read(&path)?;
    let mut out = String::new();
    writeln!(out, "care abi {}", care_ffi::version::CARE_ABI_VERSION)?;

    let mut scratch = vec![0u8; text.len()];
    let v = care_core::validate(&text, &FormatPolicy::PAPER, &mut scratch)?;
    if !v.is_valid() {
        return Err(format!("invalid rubric:\n{}", v.report).into());
    }
    let buf = RubricBuf::from(v.rubric.ok_or("no rubric")?);
    let rubric = buf.rubric();
    let (w, c) = (rubric.weights(), rubric.counts());
    writeln!(
        out,
        "rubric: weights {:.6} {:.6} {:.6} criteria {} {} {}",
        w[0], w[1], w[2], c[0], c[1], c[2]
    )?;

    let ctx = ["Seeker: I reconnected with an old friend but it feels strange."];
    let seeker = "Should I just tell her how I feel?";
    let resp = "It makes sense that this feels awkward. What would you like her to know?";
    let mut prompt = String::new();
    care_core::render_judge_prompt(&mut prompt, &rubric, &ctx, seeker, resp)?;
    writeln!(out, "judge prompt: {} bytes", prompt.len())?;

    let total = rubric.total_criteria();
    let mut scores = vec![0.0; N * total];
    for (j, s) in scores.chunks_mut(total).enumerate() {
        let answer = judge_answer(&rubric, j);
        let rep = care_core::parse_judge_output(answer.as_bytes(), &rubric, s)?;
        if rep.matched as usize != total {
            return Err("judge answer did not match every criterion".into());
        }
    }
    let mut rewards = [0.0f64; N];
    let rep =
        care_core::policy_reward_group(&rubric, &ScoreOptions::default(), &scores, &mut rewards)?;
    write!(out, "rewards:")?;
    for r in rewards {
        write!(out, " {r:.6}")?;
    }
    writeln!(out, " (scored {})", rep.scored)?;

    let rf: Vec<f32> = rewards.iter().map(|&r| r as f32).collect();
    let mut adv = [0f32; N];
    let mut gs = [GroupStats::default(); B];
    let opts = AdvantageOptions::preset(Preset::Verl);
    group_advantages(
        &rf,
        None,
        GroupLayout::Fixed { group_size: G },
        &opts,
        &mut adv,
        Some(&mut gs),
    )?;
    write!(out, "advantages:")?;
    for a in adv {
        write!(out, " {a:.6}")?;
    }
    writeln!(out)?;
    for (b, g) in gs.iter().enumerate() {
        writeln!(out, "group {b}: mean {:.6} std {:.6}", g.mean, g.std)?;
    }

    let mut seq = vec![0u32; N + 1];
    for j in 0..N {
        seq[j + 1] = seq[j] + 3 + (j % 4) as u32;
    }
    let t_len = seq[N] as usize;
    let logp: Vec<f32> = (0..t_len)
        .map(|t| -0.5f32 - 0.1f32 * ((t * 7) % 5) as f32)
        .collect();
    let old: Vec<f32> = (0..t_len)
        .map(|t| logp[t] + 0.3f32 * ((t % 3) as i32 - 1) as f32)
        .collect();
    let mask: Vec<u8> = (0..t_len).map(|t| u8::from(t % 5 != 4)).collect();
    let inputs = LossInputs {
        logp: &logp[..],
        logp_old: Some(&old[..]),
        logp_ref: None,
        seq_offsets: &seq,
        mask: Some(&mask),
        advantages: Advantages::PerSequence(&adv),
        logp_rollout: None,
    };
    let mut grad = vec![0f32; t_len];
    let l = policy_loss(&inputs, &LossOptions::preset(LossPreset::Verl), &mut grad)?;
    writeln!(
        out,
        "loss: {:.6} tokens {:.0} clipped {:.0} ratio {:.6}..{:.6}",
        l.loss, l.stats.tokens, l.stats.clipped, l.stats.ratio_min, l.stats.ratio_max
    )?;
    write!(out, "grad:")?;
    for g in grad {
        write!(out, " {g:.6}")?;
    }
    writeln!(out)?;
    Ok(out)
}

/// The same judge answers as the C example: score of flat criterion `k` of response `j` is
/// `(5j + 2k + jk mod 3 + 1) mod 6`; odd responses come in a think block and a code fence.
fn judge_answer(rubric: &care_core::Rubric<'_>, j: usize) -> String {
    let mut s = String::new();
    if j % 2 == 1 {
        s.push_str("<think>weighing the criteria</think>\n```json\n");
    }
    s.push_str("{\"criterion_scores\":[");
    let mut k = 0;
    for d in Dimension::ALL {
        for c in rubric.criteria(d) {
            if k > 0 {
                s.push(',');
            }
            let score = (5 * j + 2 * k + (j * k) % 3 + 1) % 6;
            let _ = write!(
                s,
                "{{\"category\":\"{}\",\"criterion_title\":\"{}\",\"score\":{score}}}",
                d.json_name(),
                c.title
            );
            k += 1;
        }
    }
    s.push_str("]}");
    if j % 2 == 1 {
        s.push_str("\n```");
    }
    s
}
