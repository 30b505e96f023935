//! Judge panels against the stub on 127.0.0.1 (real HTTP; the stub is the test double for the
//! LLMs): stub judges that disagree in known ways (a fixed offset, a position bias, a failing
//! judge), the aggregates, the quorum, the shuffled criterion order mapped back, the spread,
//! the cost per judge, the agreement statistic against an independent computation, a single
//! judge's unchanged output and cache keys, and the Kardia-R1 profile judged by a panel.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeSet;
use std::sync::Arc;

use care_loop::cache::call_key;
use care_loop::config::{Aggregate, SpreadAction};
use care_loop::engine::{TurnInput, TurnResult, response_status};
use care_loop::llm::{Backend, ChatMessage, HttpEndpoint, Role};
use care_loop::panel::status;
use care_loop::profile::{CareProfile, Dialogue, RubricProfile};
use care_loop::stub::{
    PAPER_RUBRIC, PanelJudge, Stub, StubReply, StubRequest, criteria_in_prompt, panel_reply,
    rubric_criteria,
};
use care_loop::{
    BackendKind, Cache, EndpointConfig, Engine, JudgeConfig, JudgeSpec, LoopConfig, Metrics,
    PanelConfig,
};
use serde_json::{Value, json};

fn ep(url: &str, model: &str) -> EndpointConfig {
    EndpointConfig {
        timeout_secs: 5.0,
        backoff_initial_secs: 0.001,
        backoff_max_secs: 0.002,
        max_attempts: 1,
        ..EndpointConfig::new(url, model)
    }
}

fn judge(stub: &Stub, model: &str) -> JudgeSpec {
    JudgeSpec::new(ep(&stub.base_url(), model))
}

/// The persona of each judge model.
fn persona(model: &str) -> PanelJudge {
    match model {
        "plain" => PanelJudge::Offset(0),
        "up" => PanelJudge::Offset(1),
        "first" => PanelJudge::FirstListed(5),
        "fail" => PanelJudge::Failing(500),
        other => panic!("no stub judge {other}"),
    }
}

/// The base score of a response `score:N ...`: N for every criterion.
fn base(req: &StubRequest) -> u8 {
    let r = req.judged_response().unwrap();
    r.trim_start_matches("score:")
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// Generator: the paper's rubric. Judges: by model (see `persona`).
async fn stub() -> Stub {
    let criteria = rubric_criteria(PAPER_RUBRIC);
    Stub::start(move |req, _| match req.role {
        Role::Generator => StubReply::Content(PAPER_RUBRIC.into()),
        Role::Judge => {
            let n = base(req);
            panel_reply(req, &criteria, persona(&req.model), |_| n)
        }
    })
    .await
    .unwrap()
}

fn config(stub: &Stub, judges: &[&str], panel: PanelConfig) -> LoopConfig {
    LoopConfig {
        generator: ep(&stub.base_url(), "gen"),
        judge: JudgeConfig::panel(judges.iter().map(|m| judge(stub, m)).collect()),
        panel,
        ..LoopConfig::default()
    }
}

fn engine(cfg: &LoopConfig, cache: Option<Cache>) -> Arc<Engine> {
    Arc::new(Engine::new(cfg, BackendKind::Http, cache, Arc::new(Metrics::new())).unwrap())
}

fn context(tag: &str) -> Vec<ChatMessage> {
    vec![
        ChatMessage::new("user", format!("{tag}: I have been feeling lost lately.")),
        ChatMessage::new("assistant", "That sounds heavy. What happened?"),
        ChatMessage::new("user", "My best friend moved away."),
    ]
}

fn turn(tag: &str, responses: &[&str]) -> TurnInput {
    TurnInput {
        id: Some(tag.into()),
        context: context(tag),
        responses: responses.iter().map(|s| (*s).to_owned()).collect(),
        gold: None,
        ..TurnInput::default()
    }
}

/// The rubric's weights (normalized as the core normalizes them) and criteria per dimension.
fn rubric_shape() -> (Vec<f64>, Vec<usize>) {
    let v: Value = serde_json::from_str(PAPER_RUBRIC).unwrap();
    let cats = v["categories"].as_array().unwrap();
    let w: Vec<f64> = cats
        .iter()
        .map(|c| c["category_weight"].as_f64().unwrap())
        .collect();
    let sum: f64 = w.iter().sum();
    let counts = cats
        .iter()
        .map(|c| c["criteria"].as_array().unwrap().len())
        .collect();
    (w.iter().map(|x| x / sum).collect(), counts)
}

/// Eq. 5, computed here from its definition: sum_d w_d * mean_i (s_{d,i} / 5).
fn eq5(flat: &[f64]) -> f64 {
    let (w, counts) = rubric_shape();
    let mut r = 0.0;
    let mut rest = flat;
    for (wd, n) in w.iter().zip(counts) {
        let (dim, tail) = rest.split_at(n);
        rest = tail;
        r += wd * dim.iter().map(|s| s / 5.0).sum::<f64>() / n as f64;
    }
    r
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

/// Flat scores from the output's per-dimension lists.
fn flat(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .flat_map(|d| d.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()))
        .collect()
}

fn json(r: &TurnResult) -> Value {
    serde_json::to_value(r).unwrap()
}

/// Krippendorff's alpha (interval) by its definition, pair by pair (independent of the
/// engine's one-pass form): D_o over ordered pairs within units, D_e over ordered pairs of all
/// pairable values.
fn alpha_by_pairs(units: &[Vec<f64>]) -> f64 {
    let pairable: Vec<&Vec<f64>> = units.iter().filter(|u| u.len() >= 2).collect();
    let n = pairable.iter().map(|u| u.len()).sum::<usize>() as f64;
    let mut d_o = 0.0;
    for u in &pairable {
        let mut s = 0.0;
        for (i, a) in u.iter().enumerate() {
            for (j, b) in u.iter().enumerate() {
                if i != j {
                    s += (a - b) * (a - b);
                }
            }
        }
        d_o += s / (u.len() as f64 - 1.0);
    }
    d_o /= n;
    let all: Vec<f64> = pairable.iter().flat_map(|u| u.iter().copied()).collect();
    let mut d_e = 0.0;
    for (i, a) in all.iter().enumerate() {
        for (j, b) in all.iter().enumerate() {
            if i != j {
                d_e += (a - b) * (a - b);
            }
        }
    }
    d_e /= n * (n - 1.0);
    1.0 - d_o / d_e
}

fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

#[tokio::test]
async fn the_panel_aggregates_the_judges_mean_median_trimmed_and_weighted() {
    let stub = stub().await;
    let t = turn("agg", &["score:1", "score:2", "score:3"]);
    let mean = engine(
        &config(&stub, &["plain", "up", "first"], PanelConfig::default()),
        None,
    )
    .run_turn(t.clone())
    .await
    .unwrap();
    assert_eq!(stub.count(Role::Generator), 1, "one rubric for the turn");
    assert_eq!(
        stub.count(Role::Judge),
        9,
        "each judge judges each response"
    );
    assert_eq!((mean.calls.generator, mean.calls.judge), (1, 9));
    let out = json(&mean);
    let mut judge_rewards = Vec::new();
    for (j, n) in [1.0, 2.0, 3.0].into_iter().enumerate() {
        // The judges' scores as their personas give them (no shuffling: the first listed
        // criterion is the rubric's first).
        let plain = vec![n; 8];
        let up = vec![n + 1.0; 8];
        let mut first = vec![n; 8];
        first[0] = 5.0;
        let want = [eq5(&plain), eq5(&up), eq5(&first)];
        let p = &out["responses"][j]["panel"];
        assert_eq!(p["judges_ok"], 3);
        assert_eq!(p["quorum"], 3);
        assert_eq!(p["flagged"], false);
        for (k, name) in ["plain", "up", "first"].into_iter().enumerate() {
            let jr = &p["judges"][k];
            assert_eq!(jr["judge"], name);
            assert_eq!(jr["status"], "ok");
            assert!(close(jr["reward"].as_f64().unwrap(), want[k]), "{jr}");
            assert_eq!(
                (jr["samples"].clone(), jr["calls"].clone()),
                (json!(1), json!(1))
            );
            assert!(jr["prompt_tokens"].as_u64().unwrap() > 0);
        }
        let r = mean.rewards[j].unwrap();
        assert!(close(r, want.iter().sum::<f64>() / 3.0), "{r} {want:?}");
        // Per criterion the mean of the three; under `mean` Eq. 5 of it is the reward.
        let scores = flat(&out["responses"][j]["scores"]);
        for (c, s) in scores.iter().enumerate() {
            assert!(close(*s, (plain[c] + up[c] + first[c]) / 3.0));
        }
        assert!(close(eq5(&scores), r));
        let hi = want.iter().copied().fold(f64::MIN, f64::max);
        let lo = want.iter().copied().fold(f64::MAX, f64::min);
        assert!(close(p["reward_spread"].as_f64().unwrap(), hi - lo));
        assert_eq!(
            flat(&p["score_spread"])[0],
            5.0 - n,
            "criterion 0: first says 5, plain says n"
        );
        judge_rewards.push(want);
    }

    let median = engine(
        &config(
            &stub,
            &["plain", "up", "first"],
            PanelConfig {
                aggregate: Aggregate::Median,
                ..PanelConfig::default()
            },
        ),
        None,
    )
    .run_turn(t.clone())
    .await
    .unwrap();
    let trimmed = engine(
        &config(
            &stub,
            &["plain", "up", "first"],
            PanelConfig {
                aggregate: Aggregate::TrimmedMean,
                ..PanelConfig::default()
            },
        ),
        None,
    )
    .run_turn(t.clone())
    .await
    .unwrap();
    for (j, want) in judge_rewards.iter().enumerate() {
        // Per criterion, the three judges' scores as their personas give them; the panel's
        // score of each is their median (their interquartile mean), and the reward is Eq. 5 of
        // those scores: not the median (interquartile mean) of the judges' rewards.
        let n = j as f64 + 1.0;
        let per_criterion: Vec<[f64; 3]> = (0..8)
            .map(|c| {
                let mut v = [n, n + 1.0, if c == 0 { 5.0 } else { n }];
                v.sort_by(f64::total_cmp);
                v
            })
            .collect();
        // The interquartile mean of three: the middle whole, each end a quarter.
        let iqm = |s: &[f64; 3]| (0.25 * s[0] + s[1] + 0.25 * s[2]) / 1.5;
        let med_scores: Vec<f64> = per_criterion.iter().map(|s| s[1]).collect();
        let iqm_scores: Vec<f64> = per_criterion.iter().map(iqm).collect();
        let (want_median, want_trimmed) = (eq5(&med_scores), eq5(&iqm_scores));
        let got = median.rewards[j].unwrap();
        assert!(close(got, want_median), "median {got} vs {want_median}");
        let got = trimmed.rewards[j].unwrap();
        assert!(close(got, want_trimmed), "trimmed {got} vs {want_trimmed}");
        // ... which differ from the aggregates of the judges' rewards: the first-listed judge
        // is off on one criterion only, and the middle reward is its.
        let mut s = want.to_vec();
        s.sort_by(f64::total_cmp);
        let iqm_of_rewards = (0.25 * s[0] + s[1] + 0.25 * s[2]) / 1.5;
        assert!((want_median - s[1]).abs() > 1e-3, "{want_median} {s:?}");
        assert!((want_trimmed - iqm_of_rewards).abs() > 1e-3);
        let m = &json(&median)["responses"][j]["scores"];
        assert_eq!(flat(m), med_scores);
        assert_eq!(
            flat(m)[0],
            n + 1.0,
            "criterion 0: the median of n, n + 1 and 5"
        );
        assert_eq!(flat(m)[1], n, "criterion 1: the median of n, n + 1 and n");
        let t = flat(&json(&trimmed)["responses"][j]["scores"]);
        assert!(t.iter().zip(&iqm_scores).all(|(a, b)| close(*a, *b)));
        // The judges' own rewards, the spread and the flag are the same under any aggregate.
        let p = &json(&median)["responses"][j]["panel"];
        for (k, w) in want.iter().enumerate() {
            assert!(close(p["judges"][k]["reward"].as_f64().unwrap(), *w));
        }
    }

    let mut cfg = config(&stub, &["plain", "up"], PanelConfig::default());
    cfg.judge.judges[1].weight = 3.0;
    let weighted = engine(&cfg, None).run_turn(t).await.unwrap();
    for (j, want) in judge_rewards.iter().enumerate() {
        assert!(close(
            weighted.rewards[j].unwrap(),
            (want[0] + 3.0 * want[1]) / 4.0
        ));
    }
}

#[tokio::test]
async fn below_the_quorum_a_response_is_null_and_names_the_failed_judge() {
    let stub = stub().await;
    let t = turn("quorum", &["score:2", "score:4"]);
    let all = engine(
        &config(&stub, &["plain", "up", "fail"], PanelConfig::default()),
        None,
    );
    let r = all.run_turn(t.clone()).await.unwrap();
    assert_eq!(r.rewards, vec![None, None]);
    for resp in &r.responses {
        assert_eq!(resp.status, status::NO_QUORUM);
        let e = resp.error.as_ref().unwrap();
        assert_eq!(e.code, "no_quorum");
        assert!(
            e.message.starts_with("2 of 3 judges gave valid scores, the quorum is 3; failed: fail (judge_error: http_500"),
            "{}",
            e.message
        );
        let p = resp.panel.as_ref().unwrap();
        assert_eq!(p.judges_ok, 2);
        assert_eq!(p.judges[2].status, response_status::JUDGE_ERROR);
        assert_eq!(p.judges[2].error.as_ref().unwrap().code, "http_500");
        assert_eq!((p.judges[2].failed, p.judges[2].calls), (1, 0));
    }
    let m = all.metrics().render();
    assert_eq!(
        metric(
            &m,
            "care_panel_judge_results_total{judge=\"fail\",status=\"judge_error\"}"
        ),
        Some(2.0),
        "{m}"
    );
    assert_eq!(
        metric(&m, "care_responses_total{status=\"no_quorum\"}"),
        Some(2.0)
    );

    let two = engine(
        &config(
            &stub,
            &["plain", "up", "fail"],
            PanelConfig {
                quorum: Some(2),
                ..PanelConfig::default()
            },
        ),
        None,
    );
    let r = two.run_turn(t).await.unwrap();
    for (j, n) in [2.0, 4.0].into_iter().enumerate() {
        let want = (eq5(&[n; 8]) + eq5(&[n + 1.0; 8])) / 2.0;
        assert!(close(r.rewards[j].unwrap(), want));
        assert_eq!(r.responses[j].status, response_status::OK);
        assert_eq!(r.responses[j].panel.as_ref().unwrap().judges_ok, 2);
    }
}

#[tokio::test]
async fn shuffled_prompts_are_deterministic_and_the_scores_map_back_by_title() {
    let stub = stub().await;
    let dir = std::env::temp_dir().join(format!("care-panel-shuffle-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("c.sqlite");
    let _ = std::fs::remove_file(&path);
    let cfg = config(
        &stub,
        &["plain", "first"],
        PanelConfig {
            shuffle_criteria: true,
            ..PanelConfig::default()
        },
    );
    let responses: Vec<String> = (0..8).map(|k| format!("score:1 take {k}")).collect();
    let refs: Vec<&str> = responses.iter().map(String::as_str).collect();
    let t = turn("shuffle", &refs);
    let r = engine(&cfg, Some(Cache::open(&path).unwrap()))
        .run_turn(t.clone())
        .await
        .unwrap();
    let criteria = rubric_criteria(PAPER_RUBRIC);
    let dialogue = Dialogue::new(context("shuffle")).unwrap();
    let plain_prompt =
        |resp: &str| CareProfile::new(false).judge_messages(PAPER_RUBRIC, &dialogue, resp);
    let calls = stub.calls();
    let mut firsts = BTreeSet::new();
    let mut reordered = 0;
    for (j, resp) in responses.iter().enumerate() {
        let seen = |model: &str| {
            calls
                .iter()
                .find(|c| c.model == model && c.judged_response() == Some(resp.as_str()))
                .unwrap()
        };
        let first_req = seen("first");
        let order = criteria_in_prompt(&first_req.messages[0].content, &criteria);
        assert_eq!(order.len(), 8, "every criterion is in the prompt");
        // The care prompt keeps its three sections; the criteria move within them.
        let mut sorted = order.clone();
        sorted[..3].sort_unstable();
        sorted[3..5].sort_unstable();
        sorted[5..].sort_unstable();
        assert_eq!(sorted, (0..8).collect::<Vec<_>>());
        firsts.insert(order[0]);
        reordered += usize::from(first_req.messages != plain_prompt(resp));
        // The position-biased judge answered in prompt order and gave 5 to what it saw first:
        // mapped back by title, the 5 sits at that criterion's place in rubric order.
        let p = r.responses[j].panel.as_ref().unwrap();
        let biased: Vec<f64> = p.judges[1].scores.as_ref().unwrap().concat();
        let mut want = vec![1.0; 8];
        want[order[0]] = 5.0;
        assert_eq!(biased, want, "response {j}: order {order:?}");
        assert_eq!(p.judges[0].scores.as_ref().unwrap().concat(), vec![1.0; 8]);
        // Each judge call gets its own order (seeded by the judge too), the same on a rerun.
        let plain_req = seen("plain");
        assert_eq!(
            criteria_in_prompt(&plain_req.messages[0].content, &criteria).len(),
            8
        );
    }
    assert!(
        firsts.len() >= 2,
        "the first listed criterion varies over responses: {firsts:?}"
    );
    assert!(
        reordered >= 6,
        "most prompts are reordered: {reordered} of 8"
    );
    // Deterministic, so cacheable: a fresh engine on the same cache asks nothing.
    let again = engine(&cfg, Some(Cache::open(&path).unwrap()))
        .run_turn(t)
        .await
        .unwrap();
    assert_eq!((again.calls.judge, again.calls.cached), (0, 1 + 16));
    assert_eq!(again.rewards, r.rewards);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn the_agreement_statistic_matches_krippendorffs_definition() {
    let stub = stub().await;
    let eng = engine(
        &config(&stub, &["plain", "up", "first"], PanelConfig::default()),
        None,
    );
    let turns = [
        turn("a1", &["score:0", "score:2", "score:4"]),
        turn("a2", &["score:1", "score:3"]),
        turn("a3", &["score:4", "score:0", "score:2", "score:1"]),
    ];
    let (mut reward_units, mut score_units) = (Vec::new(), Vec::new());
    for t in turns {
        let r = eng.run_turn(t).await.unwrap();
        for resp in &r.responses {
            let p = resp.panel.as_ref().unwrap();
            reward_units.push(
                p.judges
                    .iter()
                    .map(|j| j.reward.unwrap())
                    .collect::<Vec<_>>(),
            );
            let per_judge: Vec<Vec<f64>> = p
                .judges
                .iter()
                .map(|j| j.scores.as_ref().unwrap().concat())
                .collect();
            for c in 0..8 {
                score_units.push(per_judge.iter().map(|s| s[c]).collect::<Vec<_>>());
            }
        }
    }
    let (reward, score) = eng.panel_agreement().unwrap();
    assert_eq!(reward.units(), 9);
    assert_eq!(score.units(), 72);
    let want_r = alpha_by_pairs(&reward_units);
    let want_s = alpha_by_pairs(&score_units);
    assert!(
        (reward.value().unwrap() - want_r).abs() < 1e-12,
        "{reward:?} vs {want_r}"
    );
    assert!(
        (score.value().unwrap() - want_s).abs() < 1e-12,
        "{score:?} vs {want_s}"
    );
    // A panel that mostly agrees: high, below 1 (the offset and the bias disagree a little).
    assert!(want_r > 0.8 && want_r < 1.0, "{want_r}");
    let m = eng.metrics().render();
    let shown = metric(&m, "care_panel_agreement{level=\"reward\"}").unwrap();
    assert!((shown - want_r).abs() < 1e-9, "{m}");
    assert_eq!(
        metric(&m, "care_panel_agreement_units{level=\"score\"}"),
        Some(72.0)
    );
}

#[tokio::test]
async fn a_spread_above_the_threshold_is_flagged_or_null() {
    let stub = stub().await;
    let t = turn("spread", &["score:2", "score:3"]);
    // "up" is one point above "plain" on every criterion: 0.2 apart in reward.
    let flag = engine(
        &config(
            &stub,
            &["plain", "up"],
            PanelConfig {
                max_spread: Some(0.1),
                ..PanelConfig::default()
            },
        ),
        None,
    );
    let r = flag.run_turn(t.clone()).await.unwrap();
    for resp in &r.responses {
        let p = resp.panel.as_ref().unwrap();
        assert!(close(p.reward_spread, 0.2));
        assert!(p.flagged);
        assert!(resp.reward.is_some());
    }
    assert_eq!(
        metric(&flag.metrics().render(), "care_panel_flagged_total"),
        Some(2.0)
    );
    let null = engine(
        &config(
            &stub,
            &["plain", "up"],
            PanelConfig {
                max_spread: Some(0.1),
                on_spread: SpreadAction::Null,
                ..PanelConfig::default()
            },
        ),
        None,
    );
    let r = null.run_turn(t.clone()).await.unwrap();
    assert_eq!(r.rewards, vec![None, None]);
    assert_eq!(r.responses[0].status, status::JUDGES_DISAGREE);
    let msg = &r.responses[0].error.as_ref().unwrap().message;
    assert!(
        msg.contains("spread by 0.2000") && msg.contains("plain 0.4000"),
        "{msg}"
    );
    // Under the threshold nothing happens.
    let calm = engine(
        &config(
            &stub,
            &["plain", "up"],
            PanelConfig {
                max_spread: Some(0.25),
                on_spread: SpreadAction::Null,
                ..PanelConfig::default()
            },
        ),
        None,
    );
    let r = calm.run_turn(t).await.unwrap();
    assert!(r.rewards.iter().all(Option::is_some));
    assert!(!r.responses[0].panel.as_ref().unwrap().flagged);
}

#[tokio::test]
async fn samples_are_separate_cached_calls_and_the_cost_is_counted_per_judge() {
    let stub = stub().await;
    let dir = std::env::temp_dir().join(format!("care-panel-samples-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("c.sqlite");
    let _ = std::fs::remove_file(&path);
    let mut cfg = config(&stub, &["plain"], PanelConfig::default());
    cfg.judge.judges[0].endpoint.temperature = Some(0.7);
    let t = turn("samples", &["score:3", "score:5"]);
    // A single judge at temperature 0.7 first: its calls are sample 0 of the panel below.
    let single = engine(&cfg, Some(Cache::open(&path).unwrap()))
        .run_turn(t.clone())
        .await
        .unwrap();
    assert!(single.responses[0].panel.is_none());
    assert_eq!(single.calls.judge, 2);
    cfg.judge.judges[0].samples = 3;
    cfg.judge.judges.push(judge(&stub, "up"));
    let eng = engine(&cfg, Some(Cache::open(&path).unwrap()));
    let r = eng.run_turn(t.clone()).await.unwrap();
    // Per response: samples 1 and 2 of "plain" and one "up" are new; sample 0 is cached.
    assert_eq!((r.calls.judge, r.calls.cached), (6, 1 + 2));
    for resp in &r.responses {
        let p = resp.panel.as_ref().unwrap();
        let (plain, up) = (&p.judges[0], &p.judges[1]);
        assert_eq!((plain.samples, plain.samples_ok), (3, 3));
        assert_eq!((plain.calls, plain.cached), (2, 1));
        assert_eq!((up.calls, up.cached), (1, 0));
        assert!(
            plain.prompt_tokens > up.prompt_tokens,
            "two calls against one"
        );
        assert!(up.completion_tokens > 0);
        assert_eq!(resp.judge_attempts, 4);
    }
    // One row per completed call: the rubric, then 3 + 1 judgments of each response.
    assert_eq!(Cache::open(&path).unwrap().len().await.unwrap(), 1 + 2 * 4);
    let m = eng.metrics().render();
    assert_eq!(
        metric(&m, "care_judge_calls_total{judge=\"plain\",source=\"llm\"}"),
        Some(4.0)
    );
    assert_eq!(
        metric(
            &m,
            "care_judge_calls_total{judge=\"plain\",source=\"cache\"}"
        ),
        Some(2.0)
    );
    let tokens = metric(&m, "care_judge_tokens_total{judge=\"up\",kind=\"prompt\"}").unwrap();
    assert_eq!(
        tokens as u64,
        r.responses
            .iter()
            .map(|x| x.panel.as_ref().unwrap().judges[1].prompt_tokens)
            .sum::<u64>()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_single_judge_keeps_its_output_and_its_cache_keys() {
    // The key function itself, pinned: a change of it would orphan every existing cache.
    assert_eq!(
        call_key(
            Role::Judge,
            "judge-model",
            r#"{"max_tokens":null,"seed":null,"temperature":null,"top_p":null}"#,
            &[ChatMessage::new("user", "prompt")],
            1
        ),
        PINNED_KEY
    );
    let stub = stub().await;
    let dir = std::env::temp_dir().join(format!("care-panel-single-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("c.sqlite");
    let _ = std::fs::remove_file(&path);
    let cfg = LoopConfig {
        generator: ep(&stub.base_url(), "gen"),
        judge: ep(&stub.base_url(), "plain").into(),
        ..LoopConfig::default()
    };
    let r = engine(&cfg, Some(Cache::open(&path).unwrap()))
        .run_turn(turn("single", &["score:1", "score:4"]))
        .await
        .unwrap();
    let out = json(&r);
    for resp in out["responses"].as_array().unwrap() {
        let keys: BTreeSet<&str> = resp
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys,
            BTreeSet::from(["reward", "status", "scores", "judge_attempts"]),
            "a single judge's response has no panel member"
        );
    }
    assert_eq!(r.rewards, vec![Some(0.2), Some(0.8)]);
    // Every stored key is call_key(role, model, sampling, messages sent, attempt 1).
    let sampling = |e: &EndpointConfig, role| {
        Backend::Http(Box::new(HttpEndpoint::new(e.clone(), role).unwrap())).sampling_key()
    };
    let want: BTreeSet<String> = stub
        .calls()
        .iter()
        .map(|c| {
            let e = if c.role == Role::Generator {
                &cfg.generator
            } else {
                &cfg.judge.judges[0].endpoint
            };
            call_key(c.role, &c.model, &sampling(e, c.role), &c.messages, 1)
        })
        .collect();
    let conn = rusqlite::Connection::open(&path).unwrap();
    let mut st = conn.prepare("SELECT key FROM llm_calls").unwrap();
    let got: BTreeSet<String> = st
        .query_map([], |row| row.get::<_, String>(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(got.len(), 3);
    assert_eq!(got, want);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `call_key` of the pinned input above, for the key layout `care-loop/call/v2` (computed once;
/// it changes only with that version string, which orphans every existing cache entry).
const PINNED_KEY: &str = "d2245e3ae5da14293f1657e2a3a187b6c26993759c9b50b8067ba68f05f5d099";

fn kardia_output(response: &str) -> String {
    format!(
        "<|understanding_begin|>u<|understanding_end|><|reasoning_begin|>r<|reasoning_end|>\
         <|emotion_begin|>fear<|emotion_end|><|response_begin|>{response}<|response_end|>"
    )
}

#[tokio::test]
async fn the_kardia_profile_is_judged_by_a_shuffled_panel() {
    let json_profile = care_core::profile::Profile::builtin_json("kardia").unwrap();
    let criteria = rubric_criteria(json_profile);
    assert_eq!(criteria.len(), 5);
    let c = criteria.clone();
    let stub = Stub::start(move |req, _| match req.role {
        Role::Generator => panic!("a fixed profile calls no generator"),
        Role::Judge => {
            let n = base(req);
            panel_reply(req, &c, persona(&req.model), |_| n)
        }
    })
    .await
    .unwrap();
    let cfg = LoopConfig {
        judge: JudgeConfig::panel(vec![judge(&stub, "plain"), judge(&stub, "first")]),
        panel: PanelConfig {
            shuffle_criteria: true,
            ..PanelConfig::default()
        },
        profile: "kardia".into(),
        ..LoopConfig::default()
    };
    let responses: Vec<String> = (0..6)
        .map(|k| kardia_output(&format!("score:3 take {k}")))
        .chain(["no tags at all".to_owned()])
        .collect();
    let r = engine(&cfg, None)
        .run_turn(TurnInput {
            id: None,
            context: vec![ChatMessage::new("user", "My exam is tomorrow.")],
            responses: responses.clone(),
            gold: Some(json!({"emotion": "fear"})),
            ..TurnInput::default()
        })
        .await
        .unwrap();
    assert_eq!(
        stub.count(Role::Judge),
        12,
        "the malformed output is not judged"
    );
    assert_eq!(r.responses[6].status, "malformed_output");
    assert_eq!(r.rewards[6], Some(0.0));
    assert!(r.responses[6].panel.is_none());
    // r = 0.8 * mean_d(s_d / 5) + 0.2 * (emotion matches): plain 3 everywhere; first gives 5
    // to the dimension its prompt lists first.
    let plain = 0.8 * 0.6 + 0.2;
    let first = 0.8 * (5.0 + 4.0 * 3.0) / 25.0 + 0.2;
    let calls = stub.calls();
    let mut firsts = BTreeSet::new();
    for j in 0..6 {
        assert!(
            close(r.rewards[j].unwrap(), (plain + first) / 2.0),
            "{:?}",
            r.rewards
        );
        let span = format!("score:3 take {j}");
        let req = calls
            .iter()
            .find(|c| c.model == "first" && c.judged_response() == Some(span.as_str()))
            .unwrap();
        let order = criteria_in_prompt(&req.messages[0].content, &criteria);
        firsts.insert(order[0]);
        let p = r.responses[j].panel.as_ref().unwrap();
        let mut want = vec![3.0; 5];
        want[order[0]] = 5.0;
        assert_eq!(p.judges[1].scores.as_ref().unwrap().concat(), want);
    }
    assert!(
        firsts.len() >= 2,
        "the dimensions move as blocks: {firsts:?}"
    );
}

#[test]
fn a_panel_is_refused_by_the_scripted_backend_and_checked_field_by_field() {
    let mut cfg = LoopConfig {
        judge: JudgeConfig::panel(vec![
            JudgeSpec::new(EndpointConfig::new("http://127.0.0.1:1/v1", "a")),
            JudgeSpec::new(EndpointConfig::new("http://127.0.0.1:1/v1", "b")),
        ]),
        ..LoopConfig::default()
    };
    let err = Engine::new(&cfg, BackendKind::Scripted, None, Arc::new(Metrics::new())).unwrap_err();
    assert!(err.contains("--scripted"), "{err}");
    cfg.judge.judges[1].endpoint.base_url = "nope".into();
    cfg.generator = EndpointConfig::new("http://127.0.0.1:1/v1", "g");
    let err = Engine::new(&cfg, BackendKind::Http, None, Arc::new(Metrics::new())).unwrap_err();
    assert!(err.starts_with("judge[1].base_url"), "{err}");
}

#[tokio::test]
async fn care_serve_takes_a_panel_configuration() {
    let stub = stub().await;
    // The configuration as a user writes it: a list of judges and a panel object.
    let cfg: LoopConfig = serde_json::from_value(json!({
        "generator": {"base_url": stub.base_url(), "model": "gen"},
        "judge": [
            {"base_url": stub.base_url(), "model": "plain", "backoff_initial_secs": 0.001},
            {"base_url": stub.base_url(), "model": "up", "name": "up-judge", "weight": 2}
        ],
        "panel": {"aggregate": "median", "max_spread": 0.1}
    }))
    .unwrap();
    let eng = engine(&cfg, None);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = care_loop::server::router(eng, care_loop::server::ServerOptions::default(), "http");
    let server = tokio::spawn(care_loop::server::serve(
        listener,
        app,
        std::future::pending(),
    ));
    let client = reqwest::Client::new();
    let turn = json!({"context": context("serve"), "responses": ["score:2", "score:3"]});
    let body: Value = client
        .post(format!("http://{addr}/v1/reward"))
        .json(&json!({"turns": [turn]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let resp = &body["results"][0]["responses"][0];
    assert_eq!(resp["status"], "ok");
    let judges = resp["panel"]["judges"].as_array().unwrap();
    assert_eq!(judges.len(), 2);
    assert_eq!(judges[1]["judge"], "up-judge");
    assert_eq!(resp["panel"]["flagged"], true);
    // The weighted median of two judges weighted 1 and 2 is the heavier one.
    assert!(close(
        body["results"][0]["rewards"][0].as_f64().unwrap(),
        eq5(&[3.0; 8])
    ));
    let prompt = "seeker: hello\n";
    let get: Value = client
        .post(format!("http://{addr}/get_reward"))
        .json(&json!({
            "query": [format!("{prompt}score:1"), format!("{prompt}score:4")],
            "prompts": [prompt, prompt],
        }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(get["extra_logs"]["care_panel_flagged"], json!([1.0, 1.0]));
    let spread = get["extra_logs"]["care_panel_spread"].as_array().unwrap();
    assert!(close(spread[0].as_f64().unwrap(), 0.2), "{get}");
    let m = client
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        metric(
            &m,
            "care_judge_calls_total{judge=\"up-judge\",source=\"llm\"}"
        ),
        Some(4.0),
        "{m}"
    );
    assert!(metric(&m, "care_panel_agreement{level=\"reward\"}").is_some());
    assert_eq!(
        metric(&m, "care_panel_agreement_units{level=\"reward\"}"),
        Some(4.0)
    );
    server.abort();
}

#[tokio::test]
async fn the_kardia_profile_rewards_the_per_criterion_median_and_trimmed_mean() {
    let json_profile = care_core::profile::Profile::builtin_json("kardia").unwrap();
    let criteria = rubric_criteria(json_profile);
    let c = criteria.clone();
    let stub = Stub::start(move |req, _| match req.role {
        Role::Generator => panic!("a fixed profile calls no generator"),
        Role::Judge => {
            let n = base(req);
            panel_reply(req, &c, persona(&req.model), |_| n)
        }
    })
    .await
    .unwrap();
    let run = |aggregate: Aggregate| {
        let cfg = LoopConfig {
            judge: JudgeConfig::panel(vec![
                judge(&stub, "plain"),
                judge(&stub, "up"),
                judge(&stub, "first"),
            ]),
            panel: PanelConfig {
                aggregate,
                ..PanelConfig::default()
            },
            profile: "kardia".into(),
            ..LoopConfig::default()
        };
        let e = engine(&cfg, None);
        async move {
            e.run_turn(TurnInput {
                id: None,
                context: vec![ChatMessage::new("user", "My exam is tomorrow.")],
                responses: vec![
                    kardia_output("score:3 a"),
                    kardia_output("score:1 b"),
                    "no tags at all".to_owned(),
                ],
                gold: Some(json!({"emotion": "fear"})),
                ..TurnInput::default()
            })
            .await
            .unwrap()
        }
    };
    // Kardia-R1: r = 0.8 * sum_d 0.2 * s_d / 5 + 0.2 * (emotion matches; it does), five
    // dimensions of one criterion. Unshuffled, the first-listed criterion is dimension 0.
    let kardia = |s: &[f64]| 0.8 * s.iter().map(|x| 0.2 * x / 5.0).sum::<f64>() + 0.2;
    let iqm = |mut v: [f64; 3]| {
        v.sort_by(f64::total_cmp);
        (0.25 * v[0] + v[1] + 0.25 * v[2]) / 1.5
    };
    let median = run(Aggregate::Median).await;
    let trimmed = run(Aggregate::TrimmedMean).await;
    for (j, n) in [(0usize, 3.0f64), (1, 1.0)] {
        // plain: n everywhere; up: n + 1; first: 5 on dimension 0, n elsewhere.
        let judges = [vec![n; 5], vec![n + 1.0; 5], {
            let mut f = vec![n; 5];
            f[0] = 5.0;
            f
        }];
        let rewards: Vec<f64> = judges.iter().map(|s| kardia(s)).collect();
        let per = |agg: &dyn Fn([f64; 3]) -> f64| -> Vec<f64> {
            (0..5)
                .map(|d| agg([judges[0][d], judges[1][d], judges[2][d]]))
                .collect()
        };
        let med = |mut v: [f64; 3]| {
            v.sort_by(f64::total_cmp);
            v[1]
        };
        let want_median = kardia(&per(&med));
        let want_trimmed = kardia(&per(&iqm));
        let got = median.rewards[j].unwrap();
        assert!(close(got, want_median), "{j}: {got} vs {want_median}");
        let got = trimmed.rewards[j].unwrap();
        assert!(close(got, want_trimmed), "{j}: {got} vs {want_trimmed}");
        let mut sorted = rewards.clone();
        sorted.sort_by(f64::total_cmp);
        assert!(
            (want_median - sorted[1]).abs() > 1e-3,
            "the median of the rewards differs"
        );
        let jr = &median.responses[j].panel.as_ref().unwrap().judges;
        for (k, r) in rewards.iter().enumerate() {
            assert!(close(jr[k].reward.unwrap(), *r), "judge {k}'s own reward");
        }
    }
    assert_eq!(median.responses[2].status, "malformed_output");
    assert_eq!(median.rewards[2], Some(0.0));
}

proptest::proptest! {
    /// Relation (linearity of Eq. 5): under `mean`, when every judge scores every criterion,
    /// Eq. 5 of the weighted mean scores is the weighted mean of the judges' Eq. 5 rewards.
    #[test]
    fn under_mean_the_reward_of_the_mean_scores_is_the_mean_of_the_rewards(
        counts in proptest::array::uniform3(1usize..=4),
        weights in proptest::array::uniform3(0.01f64..1.0),
        judges in proptest::collection::vec(
            (proptest::collection::vec(0u8..=5, 12), 0.1f64..4.0),
            2..=6,
        ),
    ) {
        use care_core::{Dimension, Rubric, ScoreOptions, policy_reward, reward_from_real_scores};
        use care_loop::panel::aggregate;
        const TITLES: [&str; 4] = ["t1", "t2", "t3", "t4"];
        let mut r = Rubric::new();
        for (d, (w, n)) in Dimension::ALL.into_iter().zip(weights.iter().zip(counts)) {
            r.set_category(d, *w, "why");
            for t in TITLES.iter().take(n) {
                r.push_criterion(d, t, "[0] a [5] f").unwrap();
            }
        }
        let total: usize = counts.iter().sum();
        let opts = ScoreOptions::default();
        let scores: Vec<(Vec<f64>, f64)> = judges
            .iter()
            .map(|(s, w)| (s.iter().take(total).map(|&x| f64::from(x)).collect(), *w))
            .collect();
        let rewards: Vec<(f64, f64)> = scores
            .iter()
            .map(|(s, w)| (policy_reward(&r, s, &opts).unwrap().reward, *w))
            .collect();
        let mean_of_rewards = aggregate(&rewards, Aggregate::Mean, 0.0).unwrap();
        let mean_scores: Vec<f64> = (0..total)
            .map(|c| {
                let v: Vec<(f64, f64)> = scores.iter().map(|(s, w)| (s[c], *w)).collect();
                aggregate(&v, Aggregate::Mean, 0.0).unwrap()
            })
            .collect();
        let of_means = reward_from_real_scores(&r, &mean_scores, &opts).unwrap().reward;
        proptest::prop_assert!(
            (of_means - mean_of_rewards).abs() < 1e-12,
            "{} vs {}", of_means, mean_of_rewards
        );
    }
}
