//! The C ABI returns what the Rust API returns: the same rubric, rewards, judge parse,
//! advantages and loss, bit for bit (both run the same core code; these tests catch a wrong
//! field, option or layout in the translation). Plus the reliability check: 1M responses scored
//! from 8 threads sharing one rubric handle equal the single-threaded results.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use std::ffi::c_char;
use std::ptr::{null, null_mut};

use care_core::grpo::{
    AdvantageOptions, Advantages, GroupLayout, IsLevel, LogProb, LossInputs, LossOptions,
    LossPreset, Preset, Rejection, RejectionMode, RolloutInputs, RolloutOptions,
};
use care_core::logsoftmax::{
    LogSoftmaxOptions, Logits, LogitsLossBuffers, logits_policy_loss, selective_log_softmax,
};
use care_core::{FormatPolicy, ScoreOptions};
use care_ffi::advantage::*;
use care_ffi::care_result::*;
use care_ffi::gae::*;
use care_ffi::logsoftmax::*;
use care_ffi::loss::care_advantages_kind::*;
use care_ffi::loss::care_dtype::{self, *};
use care_ffi::loss::care_loss_preset::*;
use care_ffi::loss::*;
use care_ffi::reward::*;
use care_ffi::rubric::*;
use half::{bf16, f16};

/// A small deterministic generator (xorshift64*), so the tests need no extra crate.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
}

struct Rubric(*const care_rubric);

// SAFETY: a `care_rubric` handle is immutable and may be used from any thread (documented).
unsafe impl Send for Rubric {}
// SAFETY: as above.
unsafe impl Sync for Rubric {}

impl Rubric {
    fn parse(text: &[u8]) -> Rubric {
        let mut r = null();
        // SAFETY: valid pointers.
        let code = unsafe { care_rubric_parse(text.as_ptr().cast(), text.len(), null(), &mut r) };
        assert_eq!(code, CARE_OK);
        Rubric(r)
    }
    fn total(&self) -> usize {
        let mut n = 0;
        // SAFETY: live handle, valid output.
        assert_eq!(
            unsafe { care_rubric_total_criteria(self.0, &mut n) },
            CARE_OK
        );
        n
    }
}

impl Drop for Rubric {
    fn drop(&mut self) {
        // SAFETY: a handle from this library (any value would be checked).
        assert_eq!(unsafe { care_rubric_free(self.0) }, CARE_OK);
    }
}

fn core_rubric(text: &[u8]) -> care_core::RubricBuf {
    let mut scratch = vec![0u8; text.len()];
    let v = care_core::validate(text, &FormatPolicy::PAPER, &mut scratch).unwrap();
    assert!(v.is_valid());
    care_core::RubricBuf::from(v.rubric.unwrap())
}

#[test]
fn rubric_accessors_match_the_core() {
    for name in ["rubric_sft_1.json", "rubric_sft_2.json"] {
        let text = common::fixture(name);
        let c = Rubric::parse(&text);
        let buf = core_rubric(&text);
        let want = buf.rubric();
        let mut w = [0.0; 3];
        let mut counts = [0usize; 3];
        // SAFETY: live handle, valid outputs.
        unsafe {
            assert_eq!(care_rubric_weights(c.0, w.as_mut_ptr(), 3), CARE_OK);
            assert_eq!(
                care_rubric_criteria_counts(c.0, counts.as_mut_ptr(), 3),
                CARE_OK
            );
        }
        assert_eq!(w, want.weights());
        assert_eq!(counts, want.counts());
        for d in care_core::Dimension::ALL {
            for (i, cr) in want.criteria(d).iter().enumerate() {
                let (mut t, mut tl, mut ds, mut dl) = (null::<c_char>(), 0, null::<c_char>(), 0);
                // SAFETY: live handle, valid outputs; the returned strings live with the handle.
                let (title, desc) = unsafe {
                    let code =
                        care_rubric_criterion(c.0, d as u32, i, &mut t, &mut tl, &mut ds, &mut dl);
                    assert_eq!(code, CARE_OK);
                    (
                        std::slice::from_raw_parts(t.cast::<u8>(), tl),
                        std::slice::from_raw_parts(ds.cast::<u8>(), dl),
                    )
                };
                assert_eq!(title, cr.title.as_bytes());
                assert_eq!(desc, cr.description.as_bytes());
            }
        }
    }
}

#[test]
fn validation_report_matches_the_core() {
    let text = br#"{"categories":[{"category":"Cognitive Empathy","weight_rationale":"r","category_weight":1.5,"criteria":[]}]} x"#;
    let mut scratch = vec![0u8; text.len()];
    let want = care_core::validate(text, &FormatPolicy::PAPER, &mut scratch).unwrap();
    let mut rep = null_mut();
    // SAFETY: valid pointers throughout; the report is freed once.
    unsafe {
        assert_eq!(
            care_rubric_validate(text.as_ptr().cast(), text.len(), null(), &mut rep),
            CARE_OK
        );
        let mut n = 0;
        assert_eq!(care_validation_report_count(rep, &mut n), CARE_OK);
        assert_eq!(n, want.report.violations().len());
        assert!(n > 0);
        for (i, v) in want.report.violations().iter().enumerate() {
            let mut c = std::mem::zeroed::<care_violation>();
            assert_eq!(care_validation_report_violation(rep, i, &mut c), CARE_OK);
            assert_eq!(c.code, u32::from(v.code.number()));
            assert_eq!(c.category, v.category.map_or(-1, i32::from));
            assert_eq!(c.criterion, v.criterion.map_or(-1, i32::from));
            let mut buf = vec![0 as c_char; 1024];
            let mut len = 0;
            assert_eq!(
                care_validation_report_message(rep, i, buf.as_mut_ptr(), buf.len(), &mut len),
                CARE_OK
            );
            let got = std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), len);
            assert_eq!(got, v.to_string().as_bytes());
        }
        let (mut rf, mut parsed, mut over) = (9.0, 9, 9);
        assert_eq!(
            care_validation_report_summary(rep, &mut rf, &mut parsed, &mut over),
            CARE_OK
        );
        assert_eq!(
            (rf, parsed == 1, over == 1),
            (
                want.r_fmt(),
                want.rubric.is_some(),
                want.report.overflowed()
            )
        );
        let mut r_fmt = 9.0;
        assert_eq!(
            care_format_reward(text.as_ptr().cast(), text.len(), null(), &mut r_fmt),
            CARE_OK
        );
        assert_eq!(r_fmt, 0.0);
        care_validation_report_free(rep);
    }
}

#[test]
fn paper_worked_example_through_the_c_abi() {
    // SPEC §7: weights (0.40, 0.35, 0.25), two criteria per dimension.
    let crit = |t: &str| {
        format!(
            r#"{{"title":"{t}","description":"[0] a [1] b [2] c [3] d [4] e [5] f value: 0, 1, 2, 3, 4, 5"}}"#
        )
    };
    let cat = |name: &str, w: f64, a: &str, b: &str| {
        format!(
            r#"{{"category":"{name}","weight_rationale":"why","category_weight":{w},"criteria":[{},{}]}}"#,
            crit(a),
            crit(b)
        )
    };
    let text = format!(
        r#"{{"categories":[{},{},{}]}}"#,
        cat("Cognitive Empathy", 0.40, "c1", "c2"),
        cat("Affective Empathy", 0.35, "a1", "a2"),
        cat("Proactive Empathy", 0.25, "p1", "p2")
    );
    let r = Rubric::parse(text.as_bytes());
    let chosen = [4.0, 5.0, 4.0, 5.0, 5.0, 5.0];
    let rejected = [3.0, 5.0, 4.0, 2.0, 5.0, 4.0];
    let (mut policy, mut pref) = (0.0, 0.0);
    // SAFETY: live handle, valid buffers.
    unsafe {
        assert_eq!(
            care_policy_reward(r.0, chosen.as_ptr(), 6, null(), &mut policy, null_mut()),
            CARE_OK
        );
        let pair = care_preference_pair {
            struct_size: size_of::<care_preference_pair>() as u32,
            chosen: chosen.as_ptr(),
            chosen_len: 6,
            rejected: rejected.as_ptr(),
            rejected_len: 6,
        };
        assert_eq!(
            care_preference_reward(r.0, &pair, null(), null(), &mut pref, null_mut()),
            CARE_OK
        );
    }
    assert!((policy - 0.925).abs() < 1e-12, "{policy}");
    assert!((pref - 0.211_997).abs() < 1e-6, "{pref}");
}

#[test]
fn rewards_judge_and_generator_match_the_core() {
    let text = common::fixture("rubric_sft_2.json");
    let r = Rubric::parse(&text);
    let buf = core_rubric(&text);
    let view = buf.rubric();
    let total = r.total();
    let mut rng = Rng(7);
    let opts = ScoreOptions {
        missing: care_core::MissingPolicy::Skip,
        out_of_range: care_core::RangePolicy::Clamp,
        uniform_weights: false,
    };
    let c_opts = care_score_options {
        struct_size: size_of::<care_score_options>() as u32,
        missing: 2,
        out_of_range: 1,
        uniform_weights: 0,
    };
    for _ in 0..200 {
        let scores: Vec<f64> = (0..total)
            .map(|_| match rng.below(10) {
                0 => f64::NAN,
                1 => 7.0,
                _ => rng.below(6) as f64,
            })
            .collect();
        let want = care_core::policy_reward(&view, &scores, &opts).unwrap();
        let (mut got, mut det) = (0.0, unsafe { std::mem::zeroed::<care_reward_detail>() });
        // SAFETY: live handle, valid buffers.
        assert_eq!(
            unsafe { care_policy_reward(r.0, scores.as_ptr(), total, &c_opts, &mut got, &mut det) },
            CARE_OK
        );
        assert_eq!(got.to_bits(), want.reward.to_bits());
        assert_eq!(det.dim_means, want.dim_means);
        assert_eq!(det.fired.clamped, want.fired.clamped);
        assert_eq!(det.fired.missing_skipped, want.fired.missing_skipped);
    }

    // Judge output: the prompt renders, and a judge answer parses to the core's scores.
    let mut answer = String::from("<think>hmm</think>```json\n{\"criterion_scores\":[");
    for (k, (d, c)) in view.iter_flat().enumerate() {
        if k > 0 {
            answer.push(',');
        }
        answer.push_str(&format!(
            r#"{{"category":"{}","criterion_title":"{}","score":{}}}"#,
            d.json_name(),
            c.title,
            k % 6
        ));
    }
    answer.push_str("]}\n```");
    let mut want = vec![0.0; total];
    let want_rep = care_core::parse_judge_output(answer.as_bytes(), &view, &mut want).unwrap();
    let mut got = vec![0.0; total];
    let mut rep = unsafe { std::mem::zeroed::<care_judge_report>() };
    // SAFETY: live handle, valid buffers.
    let code = unsafe {
        care_judge_output_parse(
            r.0,
            answer.as_ptr().cast(),
            answer.len(),
            got.as_mut_ptr(),
            total,
            &mut rep,
        )
    };
    assert_eq!(code, CARE_OK);
    assert_eq!(got, want);
    assert_eq!(rep.matched, want_rep.matched);
    assert_eq!(rep.matched as usize, total);

    let ctx = ["Seeker: I lost my job.", "Supporter: That sounds hard."];
    let ctx_p: Vec<*const c_char> = ctx.iter().map(|s| s.as_ptr().cast()).collect();
    let ctx_l: Vec<usize> = ctx.iter().map(|s| s.len()).collect();
    let (seeker, resp) = (
        "I don't know what to do.",
        "Let's look at options together.",
    );
    let mut want_prompt = String::new();
    care_core::render_judge_prompt(&mut want_prompt, &view, &ctx, seeker, resp).unwrap();
    let inputs = care_judge_prompt_inputs {
        struct_size: size_of::<care_judge_prompt_inputs>() as u32,
        context: ctx_p.as_ptr(),
        context_lens: ctx_l.as_ptr(),
        context_count: 2,
        seeker_turn: seeker.as_ptr().cast(),
        seeker_turn_len: seeker.len(),
        response: resp.as_ptr().cast(),
        response_len: resp.len(),
    };
    let mut need = 0;
    // SAFETY: live handle, valid buffers; first call asks for the size.
    unsafe {
        let code = care_judge_prompt_render(r.0, &inputs, null_mut(), 0, &mut need);
        assert_eq!(code, CARE_ERR_BUFFER_TOO_SMALL);
        assert_eq!(need, want_prompt.len());
        let mut buf = vec![0 as c_char; need];
        let mut len = 0;
        let code = care_judge_prompt_render(r.0, &inputs, buf.as_mut_ptr(), need, &mut len);
        assert_eq!(code, CARE_OK);
        assert_eq!(
            std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), len),
            want_prompt.as_bytes()
        );
    }

    // Strategy counts, alignment and the generator reward.
    let labels = [
        "Question",
        "[Question]",
        "Affirmation and Reassurance",
        "Providing Suggestions",
    ];
    let lp: Vec<*const c_char> = labels.iter().map(|s| s.as_ptr().cast()).collect();
    let ll: Vec<usize> = labels.iter().map(|s| s.len()).collect();
    let want_counts =
        care_core::strategy_counts(&labels, care_core::UnknownLabelPolicy::Error).unwrap();
    let mut sc = unsafe { std::mem::zeroed::<care_strategy_counts>() };
    // SAFETY: valid buffers.
    assert_eq!(
        unsafe { care_strategy_counts_from_labels(lp.as_ptr(), ll.as_ptr(), 4, 0, &mut sc) },
        CARE_OK
    );
    assert_eq!(
        (sc.counts, sc.duplicates),
        (want_counts.counts, want_counts.duplicates)
    );
    let w = view.weights();
    let mut align = 0.0;
    // SAFETY: valid buffers.
    assert_eq!(
        unsafe { care_alignment_reward(w.as_ptr(), 3, sc.counts.as_ptr(), 3, &mut align) },
        CARE_OK
    );
    assert_eq!(align, care_core::alignment_reward(w, want_counts.counts));

    let chosen: Vec<f64> = (0..total).map(|i| (i % 6) as f64).collect();
    let rejected: Vec<f64> = (0..total).map(|i| ((i + 2) % 6) as f64).collect();
    let mut scratch = vec![0u8; text.len()];
    let want = care_core::generator_reward(
        &text,
        &mut scratch,
        &chosen,
        &rejected,
        &labels,
        &care_core::GeneratorOptions::PAPER,
    )
    .unwrap();
    let mut got = unsafe { std::mem::zeroed::<care_generator_result>() };
    // SAFETY: valid buffers.
    let inputs = care_generator_inputs {
        struct_size: size_of::<care_generator_inputs>() as u32,
        text: text.as_ptr().cast(),
        text_len: text.len(),
        chosen: chosen.as_ptr(),
        chosen_len: total,
        rejected: rejected.as_ptr(),
        rejected_len: total,
        labels: lp.as_ptr(),
        label_lens: ll.as_ptr(),
        label_count: 4,
    };
    let code = unsafe { care_generator_reward(&inputs, null(), null(), null(), null(), &mut got) };
    assert_eq!(code, CARE_OK);
    assert_eq!(
        (got.reward, got.r_pref, got.r_align, got.r_fmt, got.parsed),
        (want.reward, want.r_pref, want.r_align, want.r_fmt, 1)
    );
}

#[test]
fn advantages_and_loss_match_the_core() {
    let mut rng = Rng(42);
    let n = 48;
    let rewards: Vec<f32> = (0..n)
        .map(|i| if i % 13 == 5 { f32::NAN } else { rng.unit() })
        .collect();
    let offsets = [0u32, 8, 9, 20, 20, 48];
    // The per-sample inputs of the OPO and ReMax baselines, given to every preset (the others
    // do not read them).
    let lengths: Vec<u32> = (0..n as u32).map(|i| 1 + (i * 7) % 11).collect();
    let baselines: Vec<f32> = (0..n).map(|_| rng.unit()).collect();
    for preset in Preset::ALL {
        let mut o = unsafe { std::mem::zeroed::<care_advantage_options>() };
        // SAFETY: valid output.
        assert_eq!(
            unsafe { care_advantage_options_preset(preset as u32, &mut o) },
            CARE_OK
        );
        for layout in [
            GroupLayout::Fixed { group_size: 8 },
            GroupLayout::Offsets(&offsets),
        ] {
            let opts = AdvantageOptions::preset(preset);
            let mut want = vec![0f32; n];
            let mut want_stats =
                vec![care_core::grpo::GroupStats::default(); layout.validate(n).unwrap()];
            let inputs = care_core::grpo::GroupInputs {
                lengths: Some(&lengths),
                baselines: Some(&baselines),
                ..care_core::grpo::GroupInputs::new(&rewards, None, layout)
            };
            let want_code = care_core::grpo::group_advantages_with(
                &inputs,
                &opts,
                &mut want,
                Some(&mut want_stats),
            );
            let mut got = vec![0f32; n];
            let mut got_stats =
                vec![unsafe { std::mem::zeroed::<care_group_stats>() }; want_stats.len()];
            let (gs, op, ol) = match layout {
                GroupLayout::Fixed { group_size } => (group_size as u32, null(), 0),
                GroupLayout::Offsets(o) => (0, o.as_ptr(), o.len()),
            };
            let c_rewards = care_rewards {
                struct_size: size_of::<care_rewards>() as u32,
                rewards: rewards.as_ptr(),
                rewards_len: n,
                valid: null(),
                valid_len: 0,
                lengths: lengths.as_ptr(),
                lengths_len: n,
                baselines: baselines.as_ptr(),
                baselines_len: n,
            };
            let c_layout = care_group_layout {
                struct_size: size_of::<care_group_layout>() as u32,
                group_size: gs,
                offsets: op,
                offsets_len: ol,
            };
            let out = care_advantage_outputs {
                struct_size: size_of::<care_advantage_outputs>() as u32,
                advantages: got.as_mut_ptr(),
                advantages_len: n,
                stats: got_stats.as_mut_ptr(),
                stats_len: got_stats.len(),
            };
            // SAFETY: valid buffers.
            let code = unsafe { care_group_advantages(&c_rewards, &c_layout, &o, &out) };
            match want_code {
                Ok(()) => {
                    assert_eq!(code, CARE_OK, "{preset:?}");
                    assert_eq!(
                        got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                        want.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
                    );
                    for (g, w) in got_stats.iter().zip(&want_stats) {
                        assert_eq!(
                            (g.count, g.mean, g.std, g.zero_variance),
                            (w.count, w.mean, w.std, w.zero_variance)
                        );
                    }
                }
                Err(e) => assert_eq!(code as u32, e.number(), "{preset:?}"),
            }
        }
    }

    // Loss for every dtype and both presets, per-sequence advantages, with KL (the f16 run
    // without the reference, so the optional input is absent once).
    let seq = [0u32, 5, 5, 12, 20];
    let t = 20;
    let logp: Vec<f32> = (0..t).map(|_| -3.0 * rng.unit()).collect();
    let old: Vec<f32> = logp.iter().map(|x| x + 0.4 * (rng.unit() - 0.5)).collect();
    let refp: Vec<f32> = logp.iter().map(|x| x + 0.2 * (rng.unit() - 0.5)).collect();
    let mask: Vec<u8> = (0..t).map(|i| u8::from(i % 7 != 3)).collect();
    let adv = [1.0f32, -0.5, 0.25, -2.0];
    let bf = |v: &[f32]| v.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>();
    let hf = |v: &[f32]| v.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>();
    for preset in LossPreset::ALL {
        let mut opts = LossOptions::preset(preset);
        if opts.bypass == care_core::grpo::Bypass::On {
            continue; // it needs the rollout log-probs: see the rollout test and verl_classes_*
        }
        opts.beta = 0.05;
        let mut o = unsafe { std::mem::zeroed::<care_loss_options>() };
        // SAFETY: valid output.
        assert_eq!(
            unsafe { care_loss_options_preset(preset as u32, &mut o) },
            CARE_OK
        );
        o.beta = 0.05;
        let inputs = LossInputs {
            logp: &logp[..],
            logp_old: Some(&old[..]),
            logp_ref: Some(&refp[..]),
            seq_offsets: &seq,
            mask: Some(&mask),
            advantages: Advantages::PerSequence(&adv),
            logp_rollout: None,
        };
        check_loss(&inputs, CARE_DTYPE_F32, &opts, &o);
        let (lb, ob, rb) = (bf(&logp), bf(&old), bf(&refp));
        let inputs = LossInputs {
            logp: &lb[..],
            logp_old: Some(&ob[..]),
            logp_ref: Some(&rb[..]),
            seq_offsets: &seq,
            mask: Some(&mask),
            advantages: Advantages::PerSequence(&adv),
            logp_rollout: None,
        };
        check_loss(&inputs, CARE_DTYPE_BF16, &opts, &o);
        let (lh, oh) = (hf(&logp), hf(&old));
        let inputs = LossInputs {
            logp: &lh[..],
            logp_old: Some(&oh[..]),
            logp_ref: None,
            seq_offsets: &seq,
            mask: Some(&mask),
            advantages: Advantages::PerToken(&old),
            logp_rollout: None,
        };
        check_loss(&inputs, CARE_DTYPE_F16, &opts, &o);
    }
}

/// `care_policy_loss` on `inputs` (log-probs of `dtype`) equals `care_core::grpo::policy_loss`:
/// loss, gradient and every statistic, bit for bit.
fn check_loss<T: LogProb>(
    inputs: &LossInputs<'_, T>,
    dtype: care_dtype,
    opts: &LossOptions,
    o: &care_loss_options,
) {
    let t = inputs.logp.len();
    let mut want_grad = vec![0f32; t];
    let want = care_core::grpo::policy_loss(inputs, opts, &mut want_grad).unwrap();
    let (adv, kind) = match inputs.advantages {
        Advantages::PerSequence(a) => (a, CARE_ADVANTAGES_PER_SEQUENCE),
        Advantages::PerToken(a) => (a, CARE_ADVANTAGES_PER_TOKEN),
    };
    let opt = |v: Option<&[T]>| v.map_or((null(), 0), |v| (v.as_ptr().cast(), v.len()));
    let ((po, no), (pr, nr)) = (opt(inputs.logp_old), opt(inputs.logp_ref));
    let (plr, nlr) = opt(inputs.logp_rollout);
    let c = care_loss_inputs {
        struct_size: size_of::<care_loss_inputs>() as u32,
        dtype: dtype as u32,
        logp: inputs.logp.as_ptr().cast(),
        logp_len: t,
        logp_old: po,
        logp_old_len: no,
        logp_ref: pr,
        logp_ref_len: nr,
        seq_offsets: inputs.seq_offsets.as_ptr(),
        seq_offsets_len: inputs.seq_offsets.len(),
        mask: inputs.mask.map_or(null(), <[u8]>::as_ptr),
        mask_len: inputs.mask.map_or(0, <[u8]>::len),
        advantages: adv.as_ptr(),
        advantages_len: adv.len(),
        advantages_kind: kind as u32,
        max_seq_len: 0,
        logp_rollout: plr,
        logp_rollout_len: nlr,
    };
    let mut grad = vec![0f32; t];
    let mut loss = 0.0;
    let mut st = unsafe { std::mem::zeroed::<care_loss_stats>() };
    // SAFETY: valid buffers of the stated lengths.
    let code = unsafe { care_policy_loss(&c, o, grad.as_mut_ptr(), t, &mut loss, &mut st) };
    assert_eq!(code, CARE_OK, "{dtype:?}");
    assert_eq!(loss.to_bits(), want.loss.to_bits(), "{dtype:?}");
    assert_eq!(bits32(&grad), bits32(&want_grad), "{dtype:?}");
    assert_eq!(stats_bits(&st), core_stats_bits(&want.stats), "{dtype:?}");
}

fn bits32(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn stats_bits(s: &care_loss_stats) -> [u64; 14] {
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

fn core_stats_bits(s: &care_core::grpo::LossStats) -> [u64; 14] {
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

/// The selective log-softmax and the fused logits-to-loss path through the C ABI equal the
/// core's, for every logits dtype and both target types: forward values rounded once to
/// `float`, loss and statistics bit for bit, `dL/dlogp` bit for bit, and the backward pass
/// from that `dlogp` equal to the core's fused `dlogits` rounded to `float`.
#[test]
fn selective_log_softmax_and_logits_loss_match_the_core() {
    let mut rng = Rng(11);
    let (rows, vocab, stride) = (9usize, 13usize, 16usize);
    let x: Vec<f32> = (0..(rows - 1) * stride + vocab)
        .map(|i| {
            if i % 29 == 3 {
                f32::NEG_INFINITY
            } else {
                6.0 * (rng.unit() - 0.5)
            }
        })
        .collect();
    let y: Vec<i64> = (0..rows).map(|_| rng.below(vocab as u64) as i64).collect();
    let y32: Vec<i32> = y.iter().map(|&v| v as i32).collect();
    let mask: Vec<u8> = (0..rows).map(|i| u8::from(i != 4)).collect();
    let seq = [0u32, 4, 4, 9];
    let old: Vec<f32> = (0..rows).map(|_| -2.0 * rng.unit()).collect();
    let adv = [0.5f32, 1.0, -1.5];
    let temperature = 0.7;
    let bfx: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
    let hfx: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
    for i64t in [false, true] {
        let (tp, tl): (*const std::ffi::c_void, usize) = if i64t {
            (y.as_ptr().cast(), y.len())
        } else {
            (y32.as_ptr().cast(), y32.len())
        };
        let c = |dtype: care_dtype, p: *const std::ffi::c_void| care_logits {
            struct_size: size_of::<care_logits>() as u32,
            dtype: dtype as u32,
            logits: p,
            logits_len: x.len(),
            rows,
            vocab,
            row_stride: stride,
            targets: tp,
            targets_len: tl,
            targets_i64: u32::from(i64t),
            mask: mask.as_ptr(),
            mask_len: rows,
            temperature,
        };
        let seq_adv = (&seq[..], &adv[..], &old[..]);
        check_lsm(
            &c(CARE_DTYPE_F32, x.as_ptr().cast()),
            &x,
            &y,
            &mask,
            seq_adv,
        );
        check_lsm(
            &c(CARE_DTYPE_BF16, bfx.as_ptr().cast()),
            &bfx,
            &y,
            &mask,
            seq_adv,
        );
        check_lsm(
            &c(CARE_DTYPE_F16, hfx.as_ptr().cast()),
            &hfx,
            &y,
            &mask,
            seq_adv,
        );
    }
}

fn check_lsm<T: LogProb>(
    c: &care_logits,
    x: &[T],
    y: &[i64],
    mask: &[u8],
    (seq, adv, old): (&[u32], &[f32], &[f32]),
) {
    let (rows, vocab) = (c.rows, c.vocab);
    let l = Logits::new(x, rows, vocab, c.row_stride).unwrap();
    let lsm = LogSoftmaxOptions {
        temperature: c.temperature,
    };
    let (mut lp, mut h, mut lse) = (vec![0.0; rows], vec![0.0; rows], vec![0.0; rows]);
    selective_log_softmax(
        &l,
        y,
        Some(mask),
        &lsm,
        &mut lp,
        Some(&mut h),
        Some(&mut lse),
    )
    .unwrap();
    let narrow = |v: &[f64]| v.iter().map(|&x| (x as f32).to_bits()).collect::<Vec<_>>();
    let (mut glp, mut gh, mut glse) = (vec![0f32; rows], vec![0f32; rows], vec![0f32; rows]);
    let out = care_log_softmax_outputs {
        struct_size: size_of::<care_log_softmax_outputs>() as u32,
        logp: glp.as_mut_ptr(),
        logp_len: rows,
        entropy: gh.as_mut_ptr(),
        entropy_len: rows,
        lse: glse.as_mut_ptr(),
        lse_len: rows,
    };
    // SAFETY: host buffers of the stated lengths.
    assert_eq!(unsafe { care_selective_log_softmax(c, &out) }, CARE_OK);
    assert_eq!(bits32(&glp), narrow(&lp));
    assert_eq!(bits32(&gh), narrow(&h));
    assert_eq!(bits32(&glse), narrow(&lse));

    // The fused path: the core's `logits_policy_loss` against the C forward half + backward.
    let old64: Vec<f64> = old.iter().map(|&v| f64::from(v)).collect();
    let inputs = LossInputs::<f64> {
        logp: &[],
        logp_old: Some(&old64),
        logp_ref: None,
        seq_offsets: seq,
        mask: Some(mask),
        advantages: Advantages::PerSequence(adv),
        logp_rollout: None,
    };
    let opts = LossOptions::preset(LossPreset::Verl);
    let (mut blp, mut bdlogp, mut bdx) =
        (vec![0.0; rows], vec![0f32; rows], vec![0.0; rows * vocab]);
    let buf = LogitsLossBuffers {
        logp: &mut blp,
        dlogp: &mut bdlogp,
        dlogits: &mut bdx,
    };
    let want = logits_policy_loss(&l, y, &lsm, &inputs, &opts, buf).unwrap();
    let c_in = care_loss_inputs {
        struct_size: size_of::<care_loss_inputs>() as u32,
        dtype: CARE_DTYPE_F32 as u32,
        logp: null(),
        logp_len: 0,
        logp_old: old.as_ptr().cast(),
        logp_old_len: old.len(),
        logp_ref: null(),
        logp_ref_len: 0,
        seq_offsets: seq.as_ptr(),
        seq_offsets_len: seq.len(),
        mask: null(),
        mask_len: 0,
        advantages: adv.as_ptr(),
        advantages_len: adv.len(),
        advantages_kind: CARE_ADVANTAGES_PER_SEQUENCE as u32,
        max_seq_len: 0,
        logp_rollout: null(),
        logp_rollout_len: 0,
    };
    let mut o = unsafe { std::mem::zeroed::<care_loss_options>() };
    let (mut llp, mut llse, mut ldlogp) = (vec![0f32; rows], vec![0f32; rows], vec![0f32; rows]);
    let lo = care_logits_loss_outputs {
        struct_size: size_of::<care_logits_loss_outputs>() as u32,
        logp: llp.as_mut_ptr(),
        logp_len: rows,
        lse: llse.as_mut_ptr(),
        lse_len: rows,
        dlogp: ldlogp.as_mut_ptr(),
        dlogp_len: rows,
    };
    let (mut loss, mut st) = (0.0, unsafe { std::mem::zeroed::<care_loss_stats>() });
    // SAFETY: host buffers of the stated lengths.
    unsafe {
        assert_eq!(
            care_loss_options_preset(CARE_LOSS_PRESET_VERL as u32, &mut o),
            CARE_OK
        );
        assert_eq!(
            care_logits_policy_loss(c, &c_in, &o, &lo, &mut loss, &mut st),
            CARE_OK
        );
    }
    assert_eq!(loss.to_bits(), want.loss.to_bits());
    assert_eq!(stats_bits(&st), core_stats_bits(&want.stats));
    assert_eq!(bits32(&ldlogp), bits32(&bdlogp));
    assert_eq!(bits32(&llp), narrow(&lp));
    assert_eq!(bits32(&llse), narrow(&lse));
    let grads = care_log_softmax_grads {
        struct_size: size_of::<care_log_softmax_grads>() as u32,
        dlogp: ldlogp.as_ptr(),
        dlogp_len: rows,
        dentropy: null(),
        dentropy_len: 0,
        lse: llse.as_ptr(),
        lse_len: rows,
        entropy: null(),
        entropy_len: 0,
    };
    let mut dx = vec![0f32; rows * vocab];
    // SAFETY: as above.
    assert_eq!(
        unsafe { care_selective_log_softmax_backward(c, &grads, dx.as_mut_ptr(), dx.len()) },
        CARE_OK
    );
    assert_eq!(bits32(&dx), narrow(&bdx));
}

/// Reliability: 1M responses scored through the C ABI from 8 threads, each holding its own
/// reference (`care_rubric_clone`) to one parsed rubric, equal the single-threaded results.
#[test]
fn one_million_responses_from_eight_threads_equal_single_threaded() {
    const RESPONSES: usize = 1_000_000;
    const THREADS: usize = 8;
    const CHUNK: usize = 1000; // responses per C call, like one rollout batch
    let text = common::fixture("rubric_sft_1.json");
    let rubric = Rubric::parse(&text);
    let total = rubric.total();
    let mut rng = Rng(2024);
    // Mostly valid scores, some missing (NaN) and some out of range: under the default `error`
    // policies those responses get NaN rewards, so the failure path runs concurrently too.
    let scores: Vec<f64> = (0..RESPONSES * total)
        .map(|_| match rng.below(1000) {
            0 => f64::NAN,
            1 => 6.0,
            _ => rng.below(6) as f64,
        })
        .collect();

    let score_range = |r: *const care_rubric, first: usize, last: usize, out: &mut [f64]| {
        for (c, out) in (first..last).step_by(CHUNK).zip(out.chunks_mut(CHUNK)) {
            let s = &scores[c * total..(c + out.len()) * total];
            // SAFETY: live handle; `s` and `out` are valid for their lengths.
            let code = unsafe {
                care_policy_reward_group(
                    r,
                    s.as_ptr(),
                    s.len(),
                    null(),
                    out.as_mut_ptr(),
                    out.len(),
                    null_mut(),
                )
            };
            assert_eq!(code, CARE_OK);
        }
    };

    let mut single = vec![0f64; RESPONSES];
    score_range(rubric.0, 0, RESPONSES, &mut single);

    let mut multi = vec![0f64; RESPONSES];
    let per = RESPONSES / THREADS;
    std::thread::scope(|s| {
        for (t, out) in multi.chunks_mut(per).enumerate() {
            let mut mine = null();
            // SAFETY: live handle; the clone is released by the thread.
            assert_eq!(unsafe { care_rubric_clone(rubric.0, &mut mine) }, CARE_OK);
            let mine = Rubric(mine);
            let score_range = &score_range;
            s.spawn(move || {
                let mine = mine;
                score_range(mine.0, t * per, (t + 1) * per, out);
            });
        }
    });
    let same = single
        .iter()
        .zip(&multi)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    assert!(
        same,
        "multi-threaded rewards differ from single-threaded ones"
    );
    let nan = single.iter().filter(|x| x.is_nan()).count();
    assert!(
        nan > 0 && nan < RESPONSES / 10,
        "both paths ran: {nan} failed responses"
    );
}

// ---- profiles ---------------------------------------------------------------------------------

use care_core::profile::{Profile, ProfileBuf};
use care_ffi::profile::*;

/// An owned profile handle, released on drop.
struct CProfile(*const care_profile);

impl CProfile {
    fn builtin(name: &str) -> CProfile {
        let mut p = null();
        // SAFETY: valid pointers.
        let code = unsafe { care_profile_builtin(name.as_ptr().cast(), name.len(), &mut p) };
        assert_eq!(code, CARE_OK);
        CProfile(p)
    }
    fn parse(text: &[u8]) -> CProfile {
        let mut p = null();
        // SAFETY: valid pointers.
        let code = unsafe { care_profile_parse(text.as_ptr().cast(), text.len(), &mut p) };
        assert_eq!(code, CARE_OK);
        CProfile(p)
    }
}

impl Drop for CProfile {
    fn drop(&mut self) {
        // SAFETY: a handle from this library (any value would be checked).
        assert_eq!(unsafe { care_profile_free(self.0) }, CARE_OK);
    }
}

fn checklist_text() -> Vec<u8> {
    std::fs::read(common::repo_root().join("cli/tests/data/profile_checklist.json")).unwrap()
}

/// `(ptr, len)` outputs as a byte slice.
///
/// # Safety
/// `p` points to `len` bytes that outlive the result.
unsafe fn bytes<'a>(p: *const c_char, len: usize) -> &'a [u8] {
    // SAFETY: forwarded contract.
    unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) }
}

/// The C view of a span of `base`, as the core's slice.
fn c_span<'a>(base: &'a [u8], s: &care_span) -> Option<&'a [u8]> {
    (s.located == 1).then(|| &base[s.offset..s.offset + s.len])
}

/// Policy outputs of kardia covering every output code, well-formed ones, and bytes that are
/// not UTF-8.
fn kardia_outputs() -> Vec<Vec<u8>> {
    let tag = |n: &str, t: &str| format!("<|{n}_begin|>{t}<|{n}_end|>");
    let ok = [
        tag("understanding", "A student fears exams."),
        tag("reasoning", "Reassure first."),
        tag("emotion", " Afraid. "),
        tag("response", "  That sounds frightening.  "),
    ];
    let mut v: Vec<Vec<u8>> = vec![ok.concat().into_bytes()];
    v.push(format!("\n {} \t", ok.join("\n")).into_bytes());
    v.push(ok[..3].concat().into_bytes()); // missing span
    v.push(
        [ok[0].as_str(), ok[0].as_str(), &ok[1], &ok[2], &ok[3]]
            .concat()
            .into_bytes(),
    ); // duplicate
    v.push(
        [ok[1].as_str(), &ok[0], &ok[2], &ok[3]]
            .concat()
            .into_bytes(),
    ); // order
    v.push(
        [ok[0].as_str(), &ok[1], &tag("emotion", "  "), &ok[3]]
            .concat()
            .into_bytes(),
    ); // empty
    v.push(format!("hi {} bye", ok.concat()).into_bytes()); // text outside
    v.push(b"\xff\xfe<|response_begin|>".to_vec()); // not UTF-8
    v.push(Vec::new());
    v.push("<|emotion_end|>".repeat(50).into_bytes()); // more violations than kept
    v
}

fn check_c(p: &CProfile, out: &[u8]) -> care_output_check {
    let mut c = std::mem::MaybeUninit::<care_output_check>::uninit();
    // SAFETY: live handle, valid buffers.
    let code =
        unsafe { care_profile_check_output(p.0, out.as_ptr().cast(), out.len(), c.as_mut_ptr()) };
    assert_eq!(code, CARE_OK);
    // SAFETY: written on success.
    unsafe { c.assume_init() }
}

#[test]
fn profile_accessors_match_the_core() {
    for (c, core) in [
        (
            CProfile::builtin("kardia"),
            ProfileBuf::builtin("kardia").unwrap(),
        ),
        (
            CProfile::builtin("care"),
            ProfileBuf::builtin("care").unwrap(),
        ),
        (
            CProfile::parse(&checklist_text()),
            ProfileBuf::parse(&checklist_text()).unwrap(),
        ),
    ] {
        let want = core.profile();
        let (mut name, mut len) = (null(), 0);
        let mut info = unsafe { std::mem::zeroed::<care_profile_info>() };
        // SAFETY: live handle, valid outputs; the strings live with the handle.
        unsafe {
            assert_eq!(care_profile_name(c.0, &mut name, &mut len), CARE_OK);
            assert_eq!(bytes(name, len), want.name().as_bytes());
            assert_eq!(care_profile_describe(c.0, &mut info), CARE_OK);
        }
        assert_eq!(info.dimensions as usize, want.dimension_count());
        assert_eq!(info.spans as usize, want.span_count());
        assert_eq!(info.judge_span, want.judge_span().map_or(-1, |j| j as i32));
        let generated = want.rubric_source() == care_core::profile::RubricSource::Generated;
        assert_eq!(info.rubric_source, u32::from(generated));
        assert_eq!((info.score_min, info.score_max), {
            let (lo, hi) = want.score_range();
            (u32::from(lo), u32::from(hi))
        });
        assert_eq!(info.has_emotion == 1, want.emotion().is_some());
        assert_eq!(
            info.emotion_weight,
            want.emotion().map_or(0.0, |e| e.weight())
        );
        assert_eq!(
            info.emotion_span,
            want.emotion().map_or(-1, |e| e.span() as i32)
        );
        assert_eq!(info.vetoes as usize, want.vetoes().len());
        for (i, d) in want.dimensions().enumerate() {
            let (mut n, mut l, mut w, mut k) = (null(), 0, 0.0, 0);
            // SAFETY: as above.
            unsafe {
                let code = care_profile_dimension(c.0, i, &mut n, &mut l, &mut w, &mut k);
                assert_eq!(code, CARE_OK);
                assert_eq!(bytes(n, l), d.name.as_bytes());
            }
            assert_eq!((w.to_bits(), k), (d.weight.to_bits(), d.criteria));
        }
        for k in 0..want.span_count() {
            let (mut n, mut l) = (null(), 0);
            // SAFETY: as above.
            unsafe {
                assert_eq!(care_profile_span_name(c.0, k, &mut n, &mut l), CARE_OK);
                assert_eq!(bytes(n, l), want.span_name(k).unwrap().as_bytes());
            }
        }
        if !generated {
            let mut total = 0;
            // SAFETY: as above.
            assert_eq!(
                unsafe { care_profile_total_criteria(c.0, null(), &mut total) },
                CARE_OK
            );
            assert_eq!(total, want.total_criteria(None).unwrap());
        }
    }
    // A generated profile counts the criteria of the prompt's rubric.
    let text = common::fixture("rubric_sft_1.json");
    let (r, rubric) = (Rubric::parse(&text), core_rubric(&text));
    let care = CProfile::builtin("care");
    let mut total = 0;
    // SAFETY: live handles.
    assert_eq!(
        unsafe { care_profile_total_criteria(care.0, r.0, &mut total) },
        CARE_OK
    );
    assert_eq!(total, rubric.rubric().total_criteria());
}

#[test]
fn output_check_spans_are_the_cores_slices_as_offsets() {
    let c = CProfile::builtin("kardia");
    let core = Profile::builtin("kardia").unwrap();
    let checklist = CProfile::parse(&checklist_text());
    let checklist_core = ProfileBuf::parse(&checklist_text()).unwrap();
    let none = CProfile::builtin("care"); // no output format: the judge sees the whole output
    let none_core = Profile::builtin("care").unwrap();
    let mut outputs = kardia_outputs();
    outputs.push(b"<think>t</think> <answer>a</answer>".to_vec());
    for out in &outputs {
        for (cp, want) in [
            (&c, &core),
            (&checklist, &checklist_core.profile()),
            (&none, &none_core),
        ] {
            let got = check_c(cp, out);
            let w = want.check_output(out);
            assert_eq!(got.format_reward.to_bits(), w.format_reward().to_bits());
            assert_eq!(got.judge_needed == 1, w.judge_needed());
            assert_eq!(c_span(out, &got.judge), w.judge_text().map(str::as_bytes));
            assert_eq!(got.span_count as usize, want.span_count());
            for k in 0..want.span_count() {
                assert_eq!(
                    c_span(out, &got.spans[k]),
                    w.span(k).map(str::as_bytes),
                    "span {k}"
                );
            }
            for s in &got.spans[want.span_count()..] {
                assert_eq!(*s, care_span::default());
            }
            let kept = w.report().violations();
            assert_eq!(got.violation_count as usize, kept.len());
            assert_eq!(got.overflowed == 1, w.report().overflowed());
            for (g, v) in got.violations.iter().zip(kept) {
                assert_eq!(g.code, u32::from(v.code.number()));
                assert_eq!(g.span, v.span.map_or(-1, i32::from));
                assert_eq!(g.offset, v.offset.map_or(-1, |o| o as i64));
            }
            // The feedback text is the core's, with the size protocol.
            let mut need = 0;
            // SAFETY: live handle, valid buffers.
            unsafe {
                let code = care_profile_output_feedback(
                    cp.0,
                    out.as_ptr().cast(),
                    out.len(),
                    null_mut(),
                    0,
                    &mut need,
                );
                let want_text = w.report().to_string();
                if want_text.is_empty() {
                    assert_eq!((code, need), (CARE_OK, 0));
                } else {
                    assert_eq!((code, need), (CARE_ERR_BUFFER_TOO_SMALL, want_text.len()));
                    let mut buf = vec![0 as c_char; need];
                    let mut len = 0;
                    let code = care_profile_output_feedback(
                        cp.0,
                        out.as_ptr().cast(),
                        out.len(),
                        buf.as_mut_ptr(),
                        need,
                        &mut len,
                    );
                    assert_eq!(code, CARE_OK);
                    assert_eq!(bytes(buf.as_ptr(), len), want_text.as_bytes());
                }
            }
        }
    }
    // Every output code occurs in the fixtures above (the table covers them all).
    let seen: std::collections::BTreeSet<u32> = outputs
        .iter()
        .flat_map(|o| {
            let g = check_c(&c, o);
            g.violations[..g.violation_count as usize]
                .iter()
                .map(|v| v.code)
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(
        seen.len(),
        care_core::profile::OutputCode::ALL.len(),
        "{seen:?}"
    );
}

fn c_score_options(o: &ScoreOptions) -> care_score_options {
    let index = |names: &[&str], n: &str| names.iter().position(|x| *x == n).unwrap() as u32;
    care_score_options {
        struct_size: size_of::<care_score_options>() as u32,
        missing: index(&care_core::MissingPolicy::NAMES, o.missing.name()),
        out_of_range: index(&care_core::RangePolicy::NAMES, o.out_of_range.name()),
        uniform_weights: u32::from(o.uniform_weights),
    }
}

fn assert_result_eq(got: &care_profile_reward_result, want: &care_core::profile::ProfileReward) {
    assert_eq!(got.reward.to_bits(), want.reward.to_bits());
    assert_eq!(got.format_reward.to_bits(), want.format_reward.to_bits());
    assert_eq!(got.judge_needed == 1, want.judge_needed);
    assert_eq!(got.code, CARE_OK as u32);
    assert_eq!(got.rubric_reward.to_bits(), want.rubric_reward.to_bits());
    assert_eq!(
        got.emotion_correct,
        want.emotion_correct.map_or(-1, i32::from)
    );
    assert_eq!(got.vetoed_by, want.vetoed_by.map_or(-1, i32::from));
    let n = got.dimensions as usize;
    assert_eq!(n, want.dim_values().len());
    let bits = |x: &[f64]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got.dim_values[..n]), bits(want.dim_values()));
    assert_eq!(bits(&got.weights[..n]), bits(want.weights()));
    assert_eq!(got.fired.clamped, want.fired.clamped);
    assert_eq!(got.fired.missing_zeroed, want.fired.missing_zeroed);
    assert_eq!(got.fired.missing_skipped, want.fired.missing_skipped);
    assert_eq!(got.fired.weights_adjusted == 1, want.fired.weights_adjusted);
    assert_eq!(got.fired.uniform_weights == 1, want.fired.uniform_weights);
}

/// Random raw scores in `lo..=hi`, with NaN and out-of-range ones now and then.
fn random_scores(rng: &mut Rng, n: usize, lo: u8, hi: u8) -> Vec<f64> {
    (0..n)
        .map(|_| match rng.below(12) {
            0 => f64::NAN,
            1 => f64::from(hi) + 1.0,
            2 => f64::from(lo) + 0.5,
            _ => f64::from(lo) + rng.below(u64::from(hi - lo) + 1) as f64,
        })
        .collect()
}

#[test]
fn profile_rewards_match_the_core_bit_for_bit() {
    let rubric_text = common::fixture("rubric_sft_2.json");
    let (r, rubric_buf) = (Rubric::parse(&rubric_text), core_rubric(&rubric_text));
    let rubric = rubric_buf.rubric();
    let checklist_core = ProfileBuf::parse(&checklist_text()).unwrap();
    let profiles = [
        (
            CProfile::builtin("kardia"),
            ProfileBuf::builtin("kardia").unwrap(),
            false,
        ),
        (CProfile::parse(&checklist_text()), checklist_core, false),
        (
            CProfile::builtin("care"),
            ProfileBuf::builtin("care").unwrap(),
            true,
        ),
    ];
    let options = [
        ScoreOptions::default(),
        ScoreOptions {
            missing: care_core::MissingPolicy::Skip,
            out_of_range: care_core::RangePolicy::Clamp,
            uniform_weights: false,
        },
        ScoreOptions {
            missing: care_core::MissingPolicy::Zero,
            out_of_range: care_core::RangePolicy::Clamp,
            uniform_weights: true,
        },
    ];
    let golds = ["sadness", "Fear.", "  Happy ", "love"];
    let mut rng = Rng(11);
    let mut outputs = kardia_outputs();
    outputs.push(b"<think>plan</think><answer>Try one small step.</answer>".to_vec());
    for (c, buf, generated) in &profiles {
        let p = buf.profile();
        let rb = generated.then_some(&rubric);
        let c_rb = if *generated { r.0 } else { null() };
        let total = p.total_criteria(rb).unwrap();
        let (lo, hi) = p.score_range();
        for opts in &options {
            let c_opts = c_score_options(opts);
            for round in 0..40 {
                let out = &outputs[round % outputs.len()];
                let gold = golds[round % golds.len()];
                let scores = random_scores(&mut rng, total, lo, hi);
                let check = p.check_output(out);
                let want =
                    care_core::profile::profile_reward(&p, rb, &check, &scores, Some(gold), opts);
                let resp = care_profile_response {
                    struct_size: size_of::<care_profile_response>() as u32,
                    rubric: c_rb,
                    output: out.as_ptr().cast(),
                    output_len: out.len(),
                    scores: scores.as_ptr(),
                    scores_len: scores.len(),
                    gold_emotion: gold.as_ptr().cast(),
                    gold_emotion_len: gold.len(),
                };
                let mut got = std::mem::MaybeUninit::<care_profile_reward_result>::uninit();
                // SAFETY: live handles, valid buffers.
                let code = unsafe { care_profile_reward(c.0, &resp, &c_opts, got.as_mut_ptr()) };
                match want {
                    Ok(w) => {
                        assert_eq!(code, CARE_OK);
                        // SAFETY: written on success.
                        let got = unsafe { got.assume_init() };
                        assert_result_eq(&got, &w);
                    }
                    Err(e) => assert_eq!(code as u32, e.number()),
                }
            }
            // A group of 6 in one call: rewards, report and details as the core gives them.
            let m = 6;
            let texts: Vec<&[u8]> = (0..m)
                .map(|j| outputs[(j * 5) % outputs.len()].as_slice())
                .collect();
            let scores = random_scores(&mut rng, m * total, lo, hi);
            let mut want = vec![0.0; m];
            let want_rep = care_core::profile::profile_reward_group(
                &p,
                rb,
                &texts,
                &scores,
                Some("sad"),
                opts,
                &mut want,
            )
            .unwrap();
            let ptrs: Vec<*const c_char> = texts.iter().map(|t| t.as_ptr().cast()).collect();
            let lens: Vec<usize> = texts.iter().map(|t| t.len()).collect();
            let g = care_profile_group {
                struct_size: size_of::<care_profile_group>() as u32,
                rubric: c_rb,
                outputs: ptrs.as_ptr(),
                output_lens: lens.as_ptr(),
                output_count: m,
                scores: scores.as_ptr(),
                scores_len: scores.len(),
                gold_emotion: c"sad".as_ptr(),
                gold_emotion_len: 3,
            };
            let mut rewards = vec![7.0; m];
            let mut details = vec![unsafe { std::mem::zeroed::<care_profile_reward_result>() }; m];
            let o = care_profile_group_outputs {
                struct_size: size_of::<care_profile_group_outputs>() as u32,
                rewards: rewards.as_mut_ptr(),
                rewards_len: m,
                details: details.as_mut_ptr(),
                details_len: m,
            };
            let mut rep = unsafe { std::mem::zeroed::<care_profile_group_report>() };
            // SAFETY: live handles, valid buffers.
            let code = unsafe { care_profile_reward_group(c.0, &g, &c_opts, &o, &mut rep) };
            assert_eq!(code, CARE_OK);
            assert_eq!(
                rewards.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            );
            assert_eq!(
                (
                    rep.scored,
                    rep.malformed,
                    rep.vetoed,
                    rep.emotion_correct,
                    rep.failed
                ),
                (
                    want_rep.scored,
                    want_rep.malformed,
                    want_rep.vetoed,
                    want_rep.emotion_correct,
                    want_rep.failed
                )
            );
            assert_eq!(
                (rep.first_error_index, rep.first_error_code),
                want_rep
                    .first_error
                    .map_or((-1, 0), |(i, e)| (i as i64, e.number()))
            );
            assert_eq!(rep.fired.clamped, want_rep.fired.clamped);
            for (j, d) in details.iter().enumerate() {
                let check = p.check_output(texts[j]);
                let row = &scores[j * total..(j + 1) * total];
                match care_core::profile::profile_reward(&p, rb, &check, row, Some("sad"), opts) {
                    Ok(w) => assert_result_eq(d, &w),
                    Err(e) => {
                        assert!(d.reward.is_nan() && rewards[j].is_nan());
                        assert_eq!(d.code, e.number());
                        assert_eq!(d.format_reward, 1.0);
                    }
                }
                assert_eq!(d.reward.to_bits(), rewards[j].to_bits());
            }
        }
    }
}

#[test]
fn profile_judge_io_matches_the_core() {
    let kardia = CProfile::builtin("kardia");
    let core = Profile::builtin("kardia").unwrap();
    let checklist = CProfile::parse(&checklist_text());
    let checklist_core = ProfileBuf::parse(&checklist_text()).unwrap();
    let care = CProfile::builtin("care");
    let care_core_p = Profile::builtin("care").unwrap();
    let rubric_text = common::fixture("rubric_sft_1.json");
    let (r, rubric_buf) = (Rubric::parse(&rubric_text), core_rubric(&rubric_text));
    let rubric = rubric_buf.rubric();
    let ctx = ["Seeker: I failed my exam.", "Supporter: I'm sorry."];
    let ctx_p: Vec<*const c_char> = ctx.iter().map(|s| s.as_ptr().cast()).collect();
    let ctx_l: Vec<usize> = ctx.iter().map(|s| s.len()).collect();
    let (seeker, resp) = ("What now?", "Let's plan the retake together.");
    let inputs = care_judge_prompt_inputs {
        struct_size: size_of::<care_judge_prompt_inputs>() as u32,
        context: ctx_p.as_ptr(),
        context_lens: ctx_l.as_ptr(),
        context_count: 2,
        seeker_turn: seeker.as_ptr().cast(),
        seeker_turn_len: seeker.len(),
        response: resp.as_ptr().cast(),
        response_len: resp.len(),
    };
    let checklist_view = checklist_core.profile();
    for (c, p, rb, c_rb) in [
        (&kardia, &core, None, null()),
        (&checklist, &checklist_view, None, null()),
        (&care, &care_core_p, Some(&rubric), r.0),
    ] {
        let mut want = String::new();
        care_core::profile::render_profile_judge_prompt(&mut want, p, rb, &ctx, seeker, resp)
            .unwrap();
        let mut need = 0;
        // SAFETY: live handles, valid buffers.
        unsafe {
            let code =
                care_profile_judge_prompt_render(c.0, c_rb, &inputs, null_mut(), 0, &mut need);
            assert_eq!((code, need), (CARE_ERR_BUFFER_TOO_SMALL, want.len()));
            let mut buf = vec![0 as c_char; need];
            let mut len = 0;
            let code = care_profile_judge_prompt_render(
                c.0,
                c_rb,
                &inputs,
                buf.as_mut_ptr(),
                need,
                &mut len,
            );
            assert_eq!(code, CARE_OK);
            assert_eq!(bytes(buf.as_ptr(), len), want.as_bytes());
        }
        // A judge answer naming every criterion (one case-insensitively), then parsed.
        let mut answer = String::from("Sure.\n```json\n{\"criterion_scores\":[");
        let mut k = 0;
        for (i, d) in p.dimensions().enumerate() {
            let titles: Vec<String> = if rb.is_some() {
                rubric
                    .iter_flat()
                    .filter(|(dd, _)| dd.json_name() == d.name)
                    .map(|(_, c)| c.title.to_string())
                    .collect()
            } else {
                p.criteria(i).map(|c| c.title.to_string()).collect()
            };
            for t in titles {
                if k > 0 {
                    answer.push(',');
                }
                let t = if k == 1 { t.to_uppercase() } else { t };
                answer.push_str(&format!(
                    r#"{{"category":"{}","criterion_title":"{t}","score":{}}}"#,
                    d.name,
                    1 + k % 4
                ));
                k += 1;
            }
        }
        answer.push_str("]}\n```");
        let total = p.total_criteria(rb).unwrap();
        let mut want_scores = vec![0.0; total];
        let want_rep = care_core::profile::parse_profile_judge_output(
            answer.as_bytes(),
            p,
            rb,
            &mut want_scores,
        )
        .unwrap();
        let mut got = vec![7.0; total];
        let mut rep = unsafe { std::mem::zeroed::<care_judge_report>() };
        // SAFETY: live handles, valid buffers.
        let code = unsafe {
            care_profile_judge_output_parse(
                c.0,
                c_rb,
                answer.as_ptr().cast(),
                answer.len(),
                got.as_mut_ptr(),
                total,
                &mut rep,
            )
        };
        assert_eq!(code, CARE_OK);
        assert_eq!(
            got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            want_scores.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
        assert_eq!(
            (rep.matched, rep.case_insensitive, rep.missing),
            (
                want_rep.matched,
                want_rep.case_insensitive,
                want_rep.missing
            )
        );
        assert_eq!(rep.matched as usize, total, "{answer}");
    }
}

#[test]
fn profile_report_matches_the_core() {
    let text = br#"{"name":" ","scores":{"min":3,"max":2},"dimensions":[
        {"name":"a","weight":0.7,"criteria":[{"title":"t","description":"d","weight":0}]},
        {"name":"A","weight":0.7,"criteria":[]}],
        "output":{"format":"spans","spans":["x y"],"open":"<x>","close":"</{name}>","judge":"z"},
        "vetoes":[{"dimension":"b","min_score":1}], "extra": 1}"#;
    let mut scratch = vec![0u8; text.len()];
    let want = care_core::profile::parse_profile(text, &mut scratch).report;
    assert!(want.violations().len() >= 8, "{want}");
    let mut rep = null_mut();
    // SAFETY: valid pointers throughout; the report is freed once.
    unsafe {
        assert_eq!(
            care_profile_validate(text.as_ptr().cast(), text.len(), &mut rep),
            CARE_OK
        );
        let (mut n, mut over) = (0, 7);
        assert_eq!(care_profile_report_count(rep, &mut n, &mut over), CARE_OK);
        assert_eq!((n, over == 1), (want.violations().len(), want.overflowed()));
        for (i, v) in want.violations().iter().enumerate() {
            let mut c = std::mem::zeroed::<care_profile_violation>();
            assert_eq!(care_profile_report_violation(rep, i, &mut c), CARE_OK);
            assert_eq!(c.code, u32::from(v.code.number()));
            assert_eq!(c.offset, v.offset.map_or(-1, |o| o as i64));
            let (path, index, sub) = match v.path {
                care_core::profile::ProfilePath::Root => (0, -1, -1),
                care_core::profile::ProfilePath::Member(_) => (1, -1, -1),
                care_core::profile::ProfilePath::Dimension(d) => (2, i32::from(d), -1),
                care_core::profile::ProfilePath::Criterion(d, k) => (3, i32::from(d), i32::from(k)),
                care_core::profile::ProfilePath::Span(k) => (4, i32::from(k), -1),
                care_core::profile::ProfilePath::Label(k) => (5, i32::from(k), -1),
                care_core::profile::ProfilePath::Veto(k) => (6, i32::from(k), -1),
            };
            assert_eq!((c.path, c.index, c.subindex), (path, index, sub), "{v}");
            let mut buf = vec![0 as c_char; 1024];
            let mut len = 0;
            assert_eq!(
                care_profile_report_message(rep, i, buf.as_mut_ptr(), buf.len(), &mut len),
                CARE_OK
            );
            assert_eq!(bytes(buf.as_ptr(), len), v.to_string().as_bytes());
        }
        let mut buf = vec![0 as c_char; 8192];
        let mut len = 0;
        assert_eq!(
            care_profile_report_feedback(rep, buf.as_mut_ptr(), buf.len(), &mut len),
            CARE_OK
        );
        assert_eq!(bytes(buf.as_ptr(), len), want.to_string().as_bytes());
        assert_eq!(care_profile_report_free(rep), CARE_OK);
        // The same text does not parse, with the code of its violations.
        let mut p = null();
        assert_eq!(
            care_profile_parse(text.as_ptr().cast(), text.len(), &mut p),
            CARE_ERR_INVALID_PROFILE
        );
        assert!(p.is_null());
    }
}

#[test]
fn kardia_worked_example_through_the_c_abi() {
    // docs/PROFILES.md: scores (4, 5, 3, 5, 5), a matching emotion:
    // r = 0.8 * 0.2 * (4 + 5 + 3 + 5 + 5) / 5 + 0.2 = 0.8 * 0.88 + 0.2.
    let kardia = CProfile::builtin("kardia");
    let out = b"<|understanding_begin|>u<|understanding_end|><|reasoning_begin|>r<|reasoning_end|>\
<|emotion_begin|>sad<|emotion_end|><|response_begin|>I hear you.<|response_end|>";
    let scores = [4.0, 5.0, 3.0, 5.0, 5.0];
    let resp = care_profile_response {
        struct_size: size_of::<care_profile_response>() as u32,
        rubric: null(),
        output: out.as_ptr().cast(),
        output_len: out.len(),
        scores: scores.as_ptr(),
        scores_len: 5,
        gold_emotion: c"sadness".as_ptr(),
        gold_emotion_len: 7,
    };
    let mut r = std::mem::MaybeUninit::<care_profile_reward_result>::uninit();
    // SAFETY: live handle, valid buffers.
    let r = unsafe {
        assert_eq!(
            care_profile_reward(kardia.0, &resp, null(), r.as_mut_ptr()),
            CARE_OK
        );
        r.assume_init()
    };
    assert!(
        (r.reward - (0.8 * 0.88 + 0.2)).abs() < 1e-12,
        "{}",
        r.reward
    );
    assert_eq!(
        (r.emotion_correct, r.vetoed_by, r.judge_needed, r.dimensions),
        (1, -1, 1, 5)
    );
    let check = check_c(&kardia, out);
    assert_eq!(c_span(out, &check.judge), Some(&b"I hear you."[..]));
    assert_eq!(c_span(out, &check.spans[2]), Some(&b"sad"[..]));
}

/// The rollout correction through the C ABI: `care_policy_loss` with `logp_rollout` under
/// every loss preset and a set of correction options (weights at both levels, chained criteria,
/// both modes) equals the core bit for bit, and `care_rollout_correction` equals
/// `care_core::grpo::rollout_correction` (weights, keep flags and every diagnostic).
#[test]
fn rollout_correction_and_the_family_match_the_core() {
    let mut rng = Rng(7);
    let seq = [0u32, 6, 6, 13, 24];
    let t = 24;
    let logp: Vec<f32> = (0..t).map(|_| -3.0 * rng.unit()).collect();
    let old: Vec<f32> = logp.iter().map(|x| x + 0.4 * (rng.unit() - 0.5)).collect();
    let rollout: Vec<f32> = old
        .iter()
        .enumerate()
        .map(|(i, x)| {
            x + if i % 7 == 2 {
                1.5
            } else {
                0.3 * (rng.unit() - 0.5)
            }
        })
        .collect();
    let mask: Vec<u8> = (0..t).map(|i| u8::from(i % 9 != 4)).collect();
    let adv = [1.0f32, -0.5, 0.25, -2.0];
    let mut rollouts = Vec::new();
    for (is_level, mode) in [
        (IsLevel::Token, RejectionMode::Drop),
        (IsLevel::Sequence, RejectionMode::ZeroWeight),
        (IsLevel::Off, RejectionMode::Drop),
    ] {
        let mut r = RolloutOptions {
            is_level,
            rejection_mode: mode,
            is_threshold: 1.5,
            ..RolloutOptions::default()
        };
        r.set_bound(Rejection::TokenK1, 0.5, 2.0);
        r.set_bound(Rejection::SeqMaxK3, 0.0, 2.0);
        rollouts.push(r);
    }
    for preset in LossPreset::ALL {
        for r in &rollouts {
            let mut opts = LossOptions::preset(preset);
            opts.rollout = *r;
            if opts.check().is_err() {
                continue; // VESPO refuses a sequence weight level
            }
            let mut o = unsafe { std::mem::zeroed::<care_loss_options>() };
            // SAFETY: valid output.
            assert_eq!(
                unsafe { care_loss_options_preset(preset as u32, &mut o) },
                CARE_OK
            );
            // The C struct's rollout block, set field by field as a C caller would.
            o.rollout.is_level = r.is_level as u32;
            o.rollout.rejection_mode = r.rejection_mode as u32;
            o.rollout.is_threshold = r.is_threshold;
            for (k, b) in r.reject.iter().enumerate() {
                o.rollout.reject[k] = care_reject_bound {
                    lower: b.lower,
                    upper: b.upper,
                };
            }
            let bypass = opts.bypass == care_core::grpo::Bypass::On;
            let inputs = LossInputs {
                logp: &logp[..],
                // Bypass mode takes the old log-probs from the rollout's.
                logp_old: (!bypass).then_some(&old[..]),
                logp_ref: None,
                seq_offsets: &seq,
                mask: Some(&mask),
                advantages: Advantages::PerSequence(&adv),
                logp_rollout: Some(&rollout[..]),
            };
            check_loss(&inputs, CARE_DTYPE_F32, &opts, &o);
        }
    }

    // The correction on its own.
    for r in &rollouts {
        let mut o = unsafe { std::mem::zeroed::<care_loss_options>() };
        // SAFETY: valid output.
        assert_eq!(unsafe { care_loss_options_default(&mut o) }, CARE_OK);
        o.rollout.is_level = r.is_level as u32;
        o.rollout.rejection_mode = r.rejection_mode as u32;
        o.rollout.is_threshold = r.is_threshold;
        for (k, b) in r.reject.iter().enumerate() {
            o.rollout.reject[k] = care_reject_bound {
                lower: b.lower,
                upper: b.upper,
            };
        }
        let (mut want_w, mut want_k) = (vec![0f32; t], vec![0u8; t]);
        let want = care_core::grpo::rollout_correction(
            &RolloutInputs {
                logp_old: &old,
                logp_rollout: &rollout,
                seq_offsets: &seq,
                mask: Some(&mask),
            },
            r,
            &mut want_w,
            &mut want_k,
        )
        .unwrap();
        assert!(want.rejected_tokens > 0.0, "the inputs reject something");
        let c = common::f32_loss_inputs(&logp, &old, &seq, &mask, &adv, Some(&rollout[..]));
        let (mut w, mut k) = (vec![9f32; t], vec![9u8; t]);
        let mut st = unsafe { std::mem::zeroed::<care_rollout_stats>() };
        // SAFETY: valid buffers of the stated lengths.
        let code = unsafe {
            care_rollout_correction(&c, &o, w.as_mut_ptr(), t, k.as_mut_ptr(), t, &mut st)
        };
        assert_eq!(code, CARE_OK);
        assert_eq!(bits32(&w), bits32(&want_w));
        assert_eq!(k, want_k);
        let got = [
            st.tokens,
            st.sequences,
            st.rejected_tokens,
            st.rejected_sequences,
            st.truncated,
            st.weight_sum,
            st.kl_sum,
            st.k3_sum,
            st.log_ppl_diff_sum,
            st.log_ppl_abs_diff_sum,
            st.chi2_token_sum,
            st.chi2_seq_sum,
            st.non_finite,
        ];
        let want = [
            want.tokens,
            want.sequences,
            want.rejected_tokens,
            want.rejected_sequences,
            want.truncated,
            want.weight_sum,
            want.kl_sum,
            want.k3_sum,
            want.log_ppl_diff_sum,
            want.log_ppl_abs_diff_sum,
            want.chi2_token_sum,
            want.chi2_seq_sum,
            want.non_finite,
        ];
        assert_eq!(got.map(f64::to_bits), want.map(f64::to_bits));
    }
}

/// The token-level estimators through the C ABI equal the core bit for bit: discounted returns
/// and GAE over ragged sequences (an empty one included) with and without a mask, for several
/// `gamma`/`lambda`, and whitening (both variance kinds, with and without a mask) including the
/// returned mean and std.
#[test]
fn token_estimators_match_the_core() {
    use care_core::grpo::{GaeOptions, StdKind, WhitenOptions};
    let mut rng = Rng(11);
    let seq = [0u32, 5, 5, 12, 20];
    let t = 20;
    let rewards: Vec<f32> = (0..t).map(|_| rng.unit() - 0.3).collect();
    let values: Vec<f32> = (0..t).map(|_| 2.0 * rng.unit()).collect();
    let mask: Vec<u8> = (0..t).map(|i| u8::from(i % 6 != 3)).collect();
    for (gamma, lambda) in [(1.0, 1.0), (0.99, 0.95), (0.5, 0.0), (0.0, 1.0)] {
        let g = GaeOptions {
            gamma,
            lambda,
            ..GaeOptions::default()
        };
        let mut c = MaybeOpts::gae();
        // SAFETY: a valid out pointer.
        assert_eq!(unsafe { care_gae_options_default(&mut c) }, CARE_OK);
        let d = GaeOptions::default();
        assert_eq!(
            (c.struct_size as usize, c.gamma, c.lambda),
            (size_of::<care_gae_options>(), d.gamma, d.lambda)
        );
        (c.gamma, c.lambda) = (gamma, lambda);
        for m in [None, Some(&mask[..])] {
            let (mp, ml) = m.map_or((null(), 0), |m| (m.as_ptr(), m.len()));
            let mut input = care_token_rewards {
                struct_size: size_of::<care_token_rewards>() as u32,
                token_rewards: rewards.as_ptr(),
                token_rewards_len: t,
                values: values.as_ptr(),
                values_len: t,
                seq_offsets: seq.as_ptr(),
                seq_offsets_len: seq.len(),
                mask: mp,
                mask_len: ml,
            };
            let (mut want_a, mut want_r) = (vec![0f32; t], vec![0f32; t]);
            care_core::grpo::gae(&rewards, &values, &seq, m, &g, &mut want_a, &mut want_r).unwrap();
            let (mut a, mut r) = (vec![7f32; t], vec![7f32; t]);
            // SAFETY: valid buffers of the stated lengths.
            let code = unsafe { care_gae(&input, &c, a.as_mut_ptr(), t, r.as_mut_ptr(), t) };
            assert_eq!(code, CARE_OK);
            assert_eq!(
                bits32(&a),
                bits32(&want_a),
                "gae advantages {gamma} {lambda}"
            );
            assert_eq!(bits32(&r), bits32(&want_r), "gae returns {gamma} {lambda}");

            input.values = null();
            input.values_len = 0;
            let mut want = vec![0f32; t];
            care_core::grpo::discounted_returns(&rewards, &seq, m, &g, &mut want).unwrap();
            let mut got = vec![7f32; t];
            // SAFETY: as above.
            let code = unsafe { care_discounted_returns(&input, &c, got.as_mut_ptr(), t) };
            assert_eq!(code, CARE_OK);
            assert_eq!(bits32(&got), bits32(&want), "returns {gamma}");
        }
    }
    for kind in [StdKind::Unbiased, StdKind::Biased] {
        let w = WhitenOptions {
            eps: 1e-6,
            std_kind: kind,
            ..WhitenOptions::default()
        };
        let mut c = MaybeOpts::whiten();
        // SAFETY: a valid out pointer.
        assert_eq!(unsafe { care_whiten_options_default(&mut c) }, CARE_OK);
        let d = WhitenOptions::default();
        assert_eq!(
            (c.struct_size as usize, c.eps, c.std_kind),
            (size_of::<care_whiten_options>(), d.eps, d.std_kind as u32)
        );
        (c.eps, c.std_kind) = (1e-6, kind as u32);
        for m in [None, Some(&mask[..])] {
            let (mp, ml) = m.map_or((null(), 0), |m| (m.as_ptr(), m.len()));
            let mut want = values.clone();
            let (wm, ws) = care_core::grpo::whiten(&mut want, m, &w).unwrap();
            let mut got = values.clone();
            let (mut gm, mut gs) = (7.0, 7.0);
            // SAFETY: valid buffers of the stated lengths.
            let code = unsafe { care_whiten(got.as_mut_ptr(), t, mp, ml, &c, &mut gm, &mut gs) };
            assert_eq!(code, CARE_OK);
            assert_eq!(bits32(&got), bits32(&want), "whiten {kind:?}");
            assert_eq!((gm.to_bits(), gs.to_bits()), (wm.to_bits(), ws.to_bits()));
        }
    }
    // NULL options are the core's defaults.
    let mut a = values.clone();
    let mut b = values.clone();
    care_core::grpo::whiten(&mut a, None, &WhitenOptions::default()).unwrap();
    // SAFETY: valid buffers; the optional outputs may be NULL.
    let code = unsafe { care_whiten(b.as_mut_ptr(), t, null(), 0, null(), null_mut(), null_mut()) };
    assert_eq!(code, CARE_OK);
    assert_eq!(bits32(&b), bits32(&a));
}

/// Junk-filled option structs, so that the `_default` functions are seen to write every field.
struct MaybeOpts;

impl MaybeOpts {
    fn gae() -> care_gae_options {
        care_gae_options {
            struct_size: 0,
            gamma: f64::NAN,
            lambda: f64::NAN,
            masked_token: 99,
        }
    }
    fn whiten() -> care_whiten_options {
        care_whiten_options {
            struct_size: 0,
            std_kind: 99,
            eps: f64::NAN,
            count_eps: f64::NAN,
        }
    }
}

/// The six classes of the peer suite (`tests/tests/peers.rs`: verl's bypass mode, REINFORCE++'s
/// masked tokens, KL-Cov's coefficient, GPG's singletons, GMPO's weight floor, whitening in
/// double) through the C ABI: the verl presets and switches give verl's numbers on the issue's
/// cases and equal the core bit for bit.
#[test]
fn verl_classes_through_the_c_abi() {
    use care_core::grpo::{GaeOptions, MaskedToken, WhitenOptions};
    let preset = |p: care_loss_preset| {
        let mut o = unsafe { std::mem::zeroed::<care_loss_options>() };
        // SAFETY: valid output.
        assert_eq!(
            unsafe { care_loss_options_preset(p as u32, &mut o) },
            CARE_OK
        );
        o
    };
    // Class 1: bypass ppo_clip gives -1.2 and no gradient on the issue's line.
    let o = preset(care_loss_preset::CARE_LOSS_PRESET_VERL_BYPASS);
    assert_eq!(o.bypass, care_bypass::CARE_BYPASS_ON as u32);
    let (logp, roll, adv, seq) = ([-1.0f32], [-1.5f32], [1.0f32], [0u32, 1]);
    let mut c = care_loss_inputs {
        struct_size: size_of::<care_loss_inputs>() as u32,
        dtype: CARE_DTYPE_F32 as u32,
        logp: logp.as_ptr().cast(),
        logp_len: 1,
        logp_old: null(),
        logp_old_len: 0,
        logp_ref: null(),
        logp_ref_len: 0,
        seq_offsets: seq.as_ptr(),
        seq_offsets_len: 2,
        mask: null(),
        mask_len: 0,
        advantages: adv.as_ptr(),
        advantages_len: 1,
        advantages_kind: CARE_ADVANTAGES_PER_SEQUENCE as u32,
        max_seq_len: 0,
        logp_rollout: roll.as_ptr().cast(),
        logp_rollout_len: 1,
    };
    let (mut grad, mut loss) = ([7f32], 0.0);
    let mut st = unsafe { std::mem::zeroed::<care_loss_stats>() };
    // SAFETY: valid buffers of the stated lengths.
    let code = unsafe { care_policy_loss(&c, &o, grad.as_mut_ptr(), 1, &mut loss, &mut st) };
    assert_eq!((code, grad), (CARE_OK, [0.0]));
    assert!((loss - -1.2).abs() < 1e-7, "{loss}");
    c.logp_old = logp.as_ptr().cast();
    c.logp_old_len = 1;
    // SAFETY: as above.
    let code = unsafe { care_policy_loss(&c, &o, grad.as_mut_ptr(), 1, &mut loss, &mut st) };
    assert_eq!(code, CARE_ERR_INVALID_ARGUMENT);
    // Classes 3 and 5: the presets carry verl's values.
    assert_eq!(
        preset(care_loss_preset::CARE_LOSS_PRESET_VERL_KL_COV).kl_cov_coef,
        0.1
    );
    assert_eq!(
        preset(care_loss_preset::CARE_LOSS_PRESET_VERL_GEO_MEAN).gmpo_weight_floor,
        1e-10
    );
    // Class 4: verl's gpg keeps a singleton's reward, alpha = 3 / 2.
    let mut ao = unsafe { std::mem::zeroed::<care_advantage_options>() };
    let p = care_advantage_preset::CARE_ADVANTAGE_PRESET_VERL_GPG as u32;
    // SAFETY: valid output.
    assert_eq!(
        unsafe { care_advantage_options_preset(p, &mut ao) },
        CARE_OK
    );
    assert_eq!(ao.reweight, care_reweight::CARE_REWEIGHT_NONZERO as u32);
    let (rewards, offs) = ([1.0f32, 0.0, 2.0], [0u32, 2, 3]);
    let c_rewards = care_rewards {
        struct_size: size_of::<care_rewards>() as u32,
        rewards: rewards.as_ptr(),
        rewards_len: 3,
        valid: null(),
        valid_len: 0,
        lengths: null(),
        lengths_len: 0,
        baselines: null(),
        baselines_len: 0,
    };
    let c_layout = care_group_layout {
        struct_size: size_of::<care_group_layout>() as u32,
        group_size: 0,
        offsets: offs.as_ptr(),
        offsets_len: 3,
    };
    let mut got = [0f32; 3];
    let out = care_advantage_outputs {
        struct_size: size_of::<care_advantage_outputs>() as u32,
        advantages: got.as_mut_ptr(),
        advantages_len: 3,
        stats: null_mut(),
        stats_len: 0,
    };
    // SAFETY: valid buffers.
    assert_eq!(
        unsafe { care_group_advantages(&c_rewards, &c_layout, &ao, &out) },
        CARE_OK
    );
    assert_eq!(got, [0.75, -0.75, 3.0]);
    // Class 2: the masked-token rules; class 6: the estimators' own whitening in double, equal
    // to the core bit for bit (returns near 500, where f32 storage would cost 1e-5).
    let (r, seq, mask) = ([0.0f32, 0.0, 1.0, 0.5], [0u32, 3, 4], [1u8, 0, 1, 1]);
    let input = care_token_rewards {
        struct_size: size_of::<care_token_rewards>() as u32,
        token_rewards: r.as_ptr(),
        token_rewards_len: 4,
        values: null(),
        values_len: 0,
        seq_offsets: seq.as_ptr(),
        seq_offsets_len: 3,
        mask: mask.as_ptr(),
        mask_len: 4,
    };
    let mut g = MaybeOpts::gae();
    // SAFETY: a valid out pointer.
    assert_eq!(unsafe { care_gae_options_default(&mut g) }, CARE_OK);
    let mut w = MaybeOpts::whiten();
    // SAFETY: a valid out pointer.
    assert_eq!(unsafe { care_whiten_options_default(&mut w) }, CARE_OK);
    w.count_eps = 1e-8;
    for (rule, want) in [
        (MaskedToken::Skip, [1.0f32, 0.0, 1.0, 0.5]),
        (MaskedToken::Reset, [0.0, 0.0, 1.0, 0.5]),
    ] {
        g.masked_token = rule as u32;
        let mut ret = [7f32; 4];
        // SAFETY: valid buffers of the stated lengths.
        let code = unsafe { care_discounted_returns(&input, &g, ret.as_mut_ptr(), 4) };
        assert_eq!((code, ret), (CARE_OK, want), "{rule}");
        let (mut a, mut r2, mut mean, mut std) = ([7f32; 4], [7f32; 4], 0.0, 0.0);
        // SAFETY: as above.
        let code = unsafe {
            care_discounted_returns_whitened(
                &input,
                &g,
                &w,
                a.as_mut_ptr(),
                4,
                r2.as_mut_ptr(),
                4,
                &mut mean,
                &mut std,
            )
        };
        assert_eq!(code, CARE_OK);
        let core_g = GaeOptions {
            masked_token: rule,
            ..GaeOptions::default()
        };
        let core_w = WhitenOptions {
            count_eps: 1e-8,
            ..WhitenOptions::default()
        };
        let (mut wa, mut wr) = ([0f32; 4], [0f32; 4]);
        let stats = care_core::grpo::discounted_returns_whitened(
            &r,
            &seq,
            Some(&mask),
            &core_g,
            &core_w,
            &mut wa,
            &mut wr,
        )
        .unwrap();
        assert_eq!((bits32(&a), bits32(&r2)), (bits32(&wa), bits32(&wr)));
        assert_eq!((mean, std), stats);
    }
    // GAE has no reset rule.
    let values = [0.5f32; 4];
    let gin = care_token_rewards {
        values: values.as_ptr(),
        values_len: 4,
        ..input
    };
    let (mut a, mut r2) = ([0f32; 4], [0f32; 4]);
    // SAFETY: valid buffers of the stated lengths.
    let code = unsafe { care_gae(&gin, &g, a.as_mut_ptr(), 4, r2.as_mut_ptr(), 4) };
    assert_eq!(code, CARE_ERR_INVALID_ARGUMENT);
    g.masked_token = MaskedToken::Skip as u32;
    let big: Vec<f32> = (0..40)
        .map(|j| if j == 39 { 500.123_46 } else { 0.010_37 })
        .collect();
    let vals: Vec<f32> = (0..40).map(|j| j as f32 * 0.025).collect();
    let seq = [0u32, 40];
    let gin = care_token_rewards {
        token_rewards: big.as_ptr(),
        token_rewards_len: 40,
        values: vals.as_ptr(),
        values_len: 40,
        seq_offsets: seq.as_ptr(),
        seq_offsets_len: 2,
        mask: null(),
        mask_len: 0,
        ..input
    };
    let (mut a, mut r2) = (vec![7f32; 40], vec![7f32; 40]);
    // SAFETY: valid buffers of the stated lengths; the statistics outputs may be NULL.
    let code = unsafe {
        care_gae_whitened(
            &gin,
            &g,
            &w,
            a.as_mut_ptr(),
            40,
            r2.as_mut_ptr(),
            40,
            null_mut(),
            null_mut(),
        )
    };
    assert_eq!(code, CARE_OK);
    let (mut wa, mut wr) = (vec![0f32; 40], vec![0f32; 40]);
    let core_w = WhitenOptions {
        count_eps: 1e-8,
        ..WhitenOptions::default()
    };
    care_core::grpo::gae_whitened(
        &big,
        &vals,
        &seq,
        None,
        &GaeOptions::default(),
        &core_w,
        &mut wa,
        &mut wr,
    )
    .unwrap();
    assert_eq!((bits32(&a), bits32(&r2)), (bits32(&wa), bits32(&wr)));
}
