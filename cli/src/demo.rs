//! `care demo`: the CARE loop on bundled data, printed as a readable table.
//!
//! One seeker turn, the paper's `rubric_sft_1` as the generated rubric, a GRPO group of six
//! responses with judge output text, and synthetic log-probs (`cli/data/demo_group.json`). The
//! steps are the ones a trainer runs: validate the rubric (`r_fmt`), parse each judge answer,
//! score (Eq. 5), the generator's reward from a preference pair (Eq. 4), group advantages, and
//! one clipped-ratio loss step. A last step scores a Kardia-style group
//! (`cli/data/demo_kardia.json`) under the built-in `kardia` profile.
//!
//! The GRPO step goes through a [`GrpoDevice`]: [`device`] returns the CUDA kernels of
//! `care-kernels` when a driver and a device are present, else the CPU reference; the table
//! names the one that ran.

use std::fmt::Write as _;

use care_core::grpo::{
    AdvantageOptions, Advantages, GroupLayout, GroupStats, KlEstimator, LossInputs, LossOptions,
    LossPreset, Preset,
};
use care_core::profile::{Profile, parse_profile_judge_output, profile_reward};
use care_core::reward::generator_reward_validated;
use care_core::{
    Dimension, FormatPolicy, GeneratorOptions, ScoreOptions, parse_judge_output, policy_reward,
    validate,
};
use serde::Deserialize;

use crate::device::{Cpu, GrpoDevice};

/// The rubric the demo's generator "produced": the paper's Appendix rubric.
pub const RUBRIC: &str = include_str!("../data/rubric_sft_1.json");
/// The demo's group: context, six responses with judge output text and log-probs.
pub const GROUP: &str = include_str!("../data/demo_group.json");
/// The Kardia-style group: a persona, five four-stage outputs, judge answers, the gold emotion.
pub const KARDIA_GROUP: &str = include_str!("../data/demo_kardia.json");

/// The device the demo uses: the CUDA kernels when a driver and a device are present, else
/// the CPU reference (the table names the one that ran).
pub fn device() -> Box<dyn GrpoDevice> {
    match crate::gpu::Gpu::open() {
        Some(gpu) => Box::new(gpu),
        None => Box::new(Cpu),
    }
}

#[derive(Deserialize)]
struct Group {
    context: Vec<String>,
    preference: Preference,
    responses: Vec<Response>,
}

#[derive(Deserialize)]
struct Preference {
    chosen: usize,
    rejected: usize,
    chosen_tactics: Vec<String>,
}

#[derive(Deserialize)]
struct Response {
    text: String,
    judge_style: String,
    judge: String,
    logp: Vec<f32>,
    logp_old: Vec<f32>,
    logp_ref: Vec<f32>,
}

#[derive(Deserialize)]
struct KardiaGroup {
    persona: String,
    seeker: String,
    gold_emotion: String,
    responses: Vec<KardiaResponse>,
}

#[derive(Deserialize)]
struct KardiaResponse {
    output: String,
    /// The judge's answer; `None` for a malformed output, where the judge is not called.
    judge: Option<String>,
}

/// The advantage options of the demo: verl's GRPO.
pub fn demo_advantage_options() -> AdvantageOptions {
    AdvantageOptions::preset(Preset::Verl)
}

/// The loss options of the demo: verl's, with a small `k3` KL term to the reference.
pub fn demo_loss_options() -> LossOptions {
    LossOptions {
        beta: 0.04,
        kl_estimator: KlEstimator::K3,
        ..LossOptions::preset(LossPreset::Verl)
    }
}

fn err<E: std::fmt::Display>(context: &str) -> impl Fn(E) -> String + '_ {
    move |e| format!("demo: {context}: {e}")
}

/// Renders the whole demo with `be` (pure: no I/O, so tests can compare it whole).
pub fn render(be: &dyn GrpoDevice) -> Result<String, String> {
    let group: Group =
        serde_json::from_str(GROUP).map_err(|e| format!("demo: bundled data: {e}"))?;
    let mut s = String::new();
    // `write!` to a String cannot fail; the results are ignored below for that reason.
    let _ = writeln!(
        s,
        "care demo: the CARE loop on one seeker turn (bundled data)\n"
    );
    let _ = writeln!(s, "Dialogue");
    for turn in &group.context {
        let _ = writeln!(s, "  {turn}");
    }

    // 1. The generated rubric and its format reward.
    let mut scratch = vec![0u8; RUBRIC.len()];
    let v = validate(RUBRIC.as_bytes(), &FormatPolicy::PAPER, &mut scratch)
        .map_err(err("validating the bundled rubric"))?;
    let rubric = v
        .rubric
        .as_ref()
        .ok_or_else(|| format!("demo: bundled rubric does not parse: {}", v.report))?;
    let _ = writeln!(
        s,
        "\n1. Rubric (paper Appendix, rubric_sft_1.json): r_fmt = {}, {} violations",
        v.r_fmt(),
        v.report.violations().len()
    );
    let _ = writeln!(s, "   {:<18} {:>6}  criteria", "dimension", "weight");
    for d in Dimension::ALL {
        let cat = rubric.category(d);
        let titles: Vec<&str> = cat.criteria().iter().map(|c| c.title).collect();
        let _ = writeln!(
            s,
            "   {:<18} {:>6.2}  {}",
            d.json_name(),
            cat.weight,
            titles.join("; ")
        );
    }

    // 2. Judge outputs -> scores -> policy reward (Eq. 5).
    let total = rubric.total_criteria();
    let mut rewards = Vec::with_capacity(group.responses.len());
    let mut flat_scores: Vec<Vec<f64>> = Vec::with_capacity(group.responses.len());
    let mut rows = Vec::with_capacity(group.responses.len());
    for (j, r) in group.responses.iter().enumerate() {
        let mut scores = vec![f64::NAN; total];
        let rep = parse_judge_output(r.judge.as_bytes(), rubric, &mut scores)
            .map_err(err(&format!("judge output {}", j + 1)))?;
        let p = policy_reward(rubric, &scores, &ScoreOptions::default())
            .map_err(err(&format!("scoring response {}", j + 1)))?;
        rewards.push(p.reward as f32);
        flat_scores.push(scores);
        rows.push((rep, p));
    }

    // 3. Group advantages of the rewards (one group of six).
    let adv_opts = demo_advantage_options();
    let mut adv = vec![0.0f32; rewards.len()];
    let mut stats = [GroupStats::default()];
    be.advantages(
        &rewards,
        GroupLayout::Fixed {
            group_size: rewards.len(),
        },
        &adv_opts,
        &mut adv,
        &mut stats,
    )
    .map_err(err("advantages"))?;

    let _ = writeln!(
        s,
        "\n2. Six policy responses, judged against the rubric; reward r_theta (Eq. 5), GRPO advantage (verl)"
    );
    let _ = writeln!(
        s,
        "   {:>2}  {:<9} {:>7} {:>6} {:>6} {:>6} {:>9} {:>9}  response",
        "#", "judge", "matched", "Cog", "Aff", "Pro", "r_theta", "advantage"
    );
    for (j, ((rep, p), r)) in rows.iter().zip(&group.responses).enumerate() {
        let mut preview: String = r.text.chars().take(38).collect();
        if r.text.chars().count() > 38 {
            preview.push_str("...");
        }
        let _ = writeln!(
            s,
            "   {:>2}  {:<9} {:>5}/{} {:>6.3} {:>6.3} {:>6.3} {:>9.4} {:>+9.4}  {}",
            j + 1,
            r.judge_style,
            rep.matched,
            total,
            p.dim_means[0],
            p.dim_means[1],
            p.dim_means[2],
            p.reward,
            adv.get(j).copied().unwrap_or(f32::NAN),
            preview
        );
    }
    let st = stats[0];
    let _ = writeln!(
        s,
        "   group: mean {:.4}, std {:.4} (unbiased), eps {:e}",
        st.mean, st.std, adv_opts.eps
    );
    let _ = writeln!(
        s,
        "   judge = how the judge answered: bare JSON, a <think> block first, a ```json fence, JSON\n   \
         inside prose, numeric-string scores with lower-cased titles, compact JSON"
    );

    // 4. The generator's reward from a preference pair (Eq. 3, 4).
    let pref = &group.preference;
    let pick = |i: usize| {
        i.checked_sub(1)
            .and_then(|k| flat_scores.get(k))
            .ok_or_else(|| format!("demo: preference names response {i}"))
    };
    let (chosen, rejected) = (pick(pref.chosen)?, pick(pref.rejected)?);
    let g = generator_reward_validated(
        &v,
        chosen,
        rejected,
        &pref.chosen_tactics,
        &GeneratorOptions::PAPER,
    )
    .map_err(err("generator reward"))?;
    let _ = writeln!(
        s,
        "\n3. Generator reward of the rubric (Eq. 4): chosen = response {}, rejected = response {}",
        pref.chosen, pref.rejected
    );
    let _ = writeln!(
        s,
        "   chosen tactics {:?} -> counts Cog {}, Aff {}, Pro {}",
        pref.chosen_tactics, g.counts.counts[0], g.counts.counts[1], g.counts.counts[2]
    );
    let _ = writeln!(
        s,
        "   {:>8} {:>8} {:>6} {:>8}",
        "r_pref", "r_align", "r_fmt", "r_phi"
    );
    let _ = writeln!(
        s,
        "   {:>8.4} {:>8.2} {:>6} {:>8.4}   (r_phi = r_pref + 0.1 r_align + 0.3 r_fmt)",
        g.r_pref, g.r_align, g.r_fmt, g.reward
    );
    if g.alignment.top_violation || g.alignment.zero_violations > 0 {
        let _ = writeln!(
            s,
            "   r_align < 1: the most-used dimension does not carry the highest weight{}",
            if g.alignment.zero_violations > 0 {
                " / an unused dimension outweighs a used one"
            } else {
                ""
            }
        );
    }

    // 5. One clipped-ratio loss step on the synthetic log-probs.
    let mut logp = Vec::new();
    let mut logp_old = Vec::new();
    let mut logp_ref = Vec::new();
    let mut seq = vec![0u32];
    for r in &group.responses {
        if r.logp.len() != r.logp_old.len() || r.logp.len() != r.logp_ref.len() {
            return Err("demo: bundled log-probs have different lengths".to_owned());
        }
        logp.extend_from_slice(&r.logp);
        logp_old.extend_from_slice(&r.logp_old);
        logp_ref.extend_from_slice(&r.logp_ref);
        seq.push(u32::try_from(logp.len()).map_err(|_| "demo: too many tokens".to_owned())?);
    }
    let loss_opts = demo_loss_options();
    let inputs = LossInputs {
        logp: &logp,
        logp_old: Some(&logp_old),
        logp_ref: Some(&logp_ref),
        seq_offsets: &seq,
        mask: None,
        advantages: Advantages::PerSequence(&adv),
        logp_rollout: None,
    };
    let mut grad = vec![0.0f32; logp.len()];
    let out = be
        .loss(&inputs, &loss_opts, &mut grad)
        .map_err(err("loss"))?;
    let st = out.stats;
    let tokens = st.tokens.max(1.0);
    let grad_norm = grad
        .iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt();
    let _ = writeln!(
        s,
        "\n4. One policy-loss step (verl: clip 0.2/0.2, dual clip 3, token mean; k3 KL, beta 0.04)"
    );
    let _ = writeln!(
        s,
        "   {:>10} {:>7} {:>9} {:>10} {:>10} {:>8} {:>8} {:>10}",
        "loss", "tokens", "clipfrac", "ppo_kl", "kl", "rho_min", "rho_max", "|grad|"
    );
    let _ = writeln!(
        s,
        "   {:>10.6} {:>7} {:>9.4} {:>10.6} {:>10.6} {:>8.4} {:>8.4} {:>10.6}",
        out.loss,
        st.tokens,
        st.clipped / tokens,
        st.ppo_kl_sum / tokens,
        st.kl_sum / tokens,
        st.ratio_min,
        st.ratio_max,
        grad_norm
    );
    kardia_step(&mut s, be)?;
    let _ = writeln!(s, "\nDevice: {}", be.name());
    Ok(s)
}

/// Step 5: the same GRPO step under the built-in `kardia` profile (Kardia-R1's rubric-as-judge
/// reward as we read it): the format gate, the judge on the response stage, the emotion term.
fn kardia_step(s: &mut String, be: &dyn GrpoDevice) -> Result<(), String> {
    let group: KardiaGroup = serde_json::from_str(KARDIA_GROUP)
        .map_err(|e| format!("demo: bundled Kardia data: {e}"))?;
    let k = Profile::builtin("kardia").map_err(err("kardia profile"))?;
    let opts = ScoreOptions::default();
    let mut rows = Vec::with_capacity(group.responses.len());
    let mut rewards = Vec::with_capacity(group.responses.len());
    for (j, r) in group.responses.iter().enumerate() {
        let check = k.check_output(r.output.as_bytes());
        let mut scores = vec![f64::NAN; k.dimension_count()];
        match (&r.judge, check.judge_needed()) {
            (Some(judge), true) => {
                parse_profile_judge_output(judge.as_bytes(), &k, None, &mut scores)
                    .map_err(err(&format!("Kardia judge output {}", j + 1)))?;
            }
            (None, false) => {}
            _ => {
                return Err(format!(
                    "demo: bundled Kardia response {} has a judge answer exactly when its output is malformed",
                    j + 1
                ));
            }
        }
        let p = profile_reward(&k, None, &check, &scores, Some(&group.gold_emotion), &opts)
            .map_err(err(&format!("scoring Kardia response {}", j + 1)))?;
        rewards.push(p.reward as f32);
        let first = check.report().violations().first().map(|v| v.code.as_str());
        let format = match (first, check.report().violations().len()) {
            (None, _) => "ok".to_owned(),
            (Some(code), 1) => code.to_owned(),
            (Some(code), n) => format!("{code} +{}", n - 1),
        };
        let emotion = check.span(2).unwrap_or("-").to_owned();
        rows.push((format, emotion, p, check.judge_text().map(str::to_owned)));
    }
    let adv_opts = demo_advantage_options();
    let mut adv = vec![0.0f32; rewards.len()];
    let mut stats = [GroupStats::default()];
    be.advantages(
        &rewards,
        GroupLayout::Fixed {
            group_size: rewards.len(),
        },
        &adv_opts,
        &mut adv,
        &mut stats,
    )
    .map_err(err("Kardia advantages"))?;
    let _ = writeln!(
        s,
        "\n5. The same step under the built-in profile kardia (Kardia-R1's rubric-as-judge reward, our reading)"
    );
    let _ = writeln!(s, "   persona: {}", group.persona);
    let _ = writeln!(s, "   user: {}", group.seeker);
    let _ = writeln!(
        s,
        "   The policy writes four stages in special tokens; the judge scores the response stage on five\n   \
         dimensions (0..5); the emotion stage is checked against the gold label \"{}\".",
        group.gold_emotion
    );
    let _ = writeln!(
        s,
        "   {:>2}  {:<16} {:<9} {:>3} {:>5} {:>5} {:>5} {:>5} {:>5} {:>7} {:>7} {:>9}  response stage",
        "#",
        "format",
        "emotion",
        "ok",
        "Rel",
        "Emp",
        "Per",
        "Saf",
        "Flu",
        "rubric",
        "reward",
        "advantage"
    );
    for (j, (format, emotion, p, judge_text)) in rows.iter().enumerate() {
        let ok = match p.emotion_correct {
            Some(true) => "yes",
            Some(false) => "no",
            None => "-",
        };
        let dims = if p.judge_needed {
            p.dim_values()
                .iter()
                .map(|v| format!("{v:>5.2}"))
                .collect::<Vec<_>>()
                .join(" ")
        } else {
            format!("{:<29}", "(judge not called)")
        };
        let preview = judge_text.as_deref().map_or_else(
            || "-".to_owned(),
            |t| {
                let mut p: String = t.chars().take(30).collect();
                if t.chars().count() > 30 {
                    p.push_str("...");
                }
                p
            },
        );
        let _ = writeln!(
            s,
            "   {:>2}  {:<16} {:<9} {:>3} {} {:>7.4} {:>7.4} {:>+9.4}  {}",
            j + 1,
            format,
            emotion,
            ok,
            dims,
            p.rubric_reward,
            p.reward,
            adv.get(j).copied().unwrap_or(f32::NAN),
            preview
        );
    }
    let _ = writeln!(
        s,
        "   r = r_fmt * ((1 - 0.2) * sum_d 0.2 * v_d + 0.2 * r_emo); a malformed output scores 0 and\n   \
         is never judged. Advantages as in step 2 (verl)."
    );
    Ok(())
}
