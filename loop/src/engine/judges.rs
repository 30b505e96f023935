//! The panel layer of the engine: a response judged by several judges (and samples), each
//! judgment exactly the single judge's loop ([`Engine::judge_loop`]) with its own backend and
//! cache key. Each judgment is rewarded by the profile (the judges' own rewards: spread, flag,
//! agreement); the panel's reward is the profile's reward of the per-criterion aggregate of the
//! judges' scores ([`crate::panel`], [`RubricProfile::score_real`]).

use std::sync::{Arc, Mutex};

use tokio::task::JoinSet;

use super::{
    BackendKind, CallCounts, Counter, Engine, ErrorOut, Flights, JudgeOutcome, ResponseResult,
    flight, response_status, split,
};
use crate::cache::call_key;
use crate::config::{Aggregate, EndpointConfig, LoopConfig, SpreadAction};
use crate::llm::{Backend, HttpEndpoint, Role};
use crate::panel::{
    Alpha, JudgeResult, PanelResult, aggregate, criterion_order, no_quorum_message, order_seed,
    sample_sampling_key, spread, status,
};
use crate::profile::{Dialogue, Prepared, RubricProfile};

/// The engine's panel: the judges, how they are combined, and the run's agreement.
#[derive(Debug)]
pub(super) struct Panel {
    judges: Vec<PanelJudge>,
    aggregate: Aggregate,
    trim: f64,
    quorum: usize,
    shuffle: bool,
    max_spread: Option<f64>,
    on_spread: SpreadAction,
    flights: Flights<PanelCall>,
    /// Krippendorff's alpha since the start: `[reward level, score level]`.
    agreement: Mutex<[Alpha; 2]>,
}

#[derive(Debug)]
struct PanelJudge {
    name: String,
    weight: f64,
    samples: u32,
    /// `None` for the first judge, whose backend is the engine's own `judge`.
    backend: Option<Backend>,
}

/// One (judge, sample) judgment and the calls it took.
#[derive(Clone, Debug)]
struct PanelCall {
    outcome: JudgeOutcome,
    cost: CallCounts,
}

/// The first judge's endpoint (the engine's `judge`; the configuration is checked to have one).
pub(super) fn first_endpoint(cfg: &LoopConfig) -> EndpointConfig {
    cfg.judge
        .judges
        .first()
        .map(|j| j.endpoint.clone())
        .unwrap_or_default()
}

impl Panel {
    /// The panel of `cfg`, or `None` when the configuration is a single judge without samples
    /// or shuffling.
    pub(super) fn build(
        cfg: &LoopConfig,
        kind: BackendKind,
        profile: &dyn RubricProfile,
    ) -> Result<Option<Panel>, String> {
        if !cfg.panel.is_active(&cfg.judge) {
            return Ok(None);
        }
        if kind == BackendKind::Scripted {
            return Err(
                "--scripted replays one recorded judge: a panel (several judges, samples or shuffle_criteria) needs endpoints"
                    .to_owned(),
            );
        }
        if cfg.panel.shuffle_criteria && !profile.can_reorder() {
            return Err(format!(
                "panel.shuffle_criteria: profile {} cannot reorder its criteria",
                profile.name()
            ));
        }
        let mut judges = Vec::with_capacity(cfg.judge.judges.len());
        for (k, j) in cfg.judge.judges.iter().enumerate() {
            // Checked here with the judge's own field name (`judge[1].model ...`).
            let field = cfg.judge.field(k);
            j.endpoint.check(&field)?;
            if let Some(var) = &j.endpoint.api_key_env
                && std::env::var(var).is_err()
            {
                return Err(format!(
                    "{field}.api_key_env names {var}, which is not set in the environment"
                ));
            }
            let backend = if k == 0 {
                None
            } else {
                Some(Backend::Http(Box::new(HttpEndpoint::new(
                    j.endpoint.clone(),
                    Role::Judge,
                )?)))
            };
            judges.push(PanelJudge {
                name: j.name().to_owned(),
                weight: j.weight,
                samples: j.samples,
                backend,
            });
        }
        Ok(Some(Panel {
            quorum: cfg.panel.quorum_of(judges.len()),
            judges,
            aggregate: cfg.panel.aggregate,
            trim: match cfg.panel.aggregate {
                Aggregate::TrimmedMean => cfg.panel.trim_fraction(),
                _ => 0.0,
            },
            shuffle: cfg.panel.shuffle_criteria,
            max_spread: cfg.panel.max_spread,
            on_spread: cfg.panel.on_spread,
            flights: Mutex::new(std::collections::HashMap::new()),
            agreement: Mutex::new([Alpha::default(); 2]),
        }))
    }
}

impl Counter {
    /// Adds a snapshot (a judgment's own calls, into its turn's counts).
    fn absorb(&self, c: &CallCounts) {
        Counter::add(&self.generator, c.generator);
        Counter::add(&self.judge, c.judge);
        Counter::add(&self.cached, c.cached);
        Counter::add(&self.failed, c.failed);
        Counter::add(&self.http_attempts, c.http_attempts);
        Counter::add(&self.prompt_tokens, c.prompt_tokens);
        Counter::add(&self.completion_tokens, c.completion_tokens);
    }
}

/// A judge's valid samples summed: reward and flat scores.
struct Sums {
    reward: f64,
    scores: Vec<f64>,
}

impl Engine {
    /// The judges' agreement since the start, `(reward level, score level)` (`None` without a
    /// panel).
    pub fn panel_agreement(&self) -> Option<(Alpha, Alpha)> {
        let p = self.panel.as_ref()?;
        let a = p
            .agreement
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Some((a[0], a[1]))
    }

    fn panel_backend(&self, k: usize) -> &Backend {
        self.panel
            .as_ref()
            .and_then(|p| p.judges.get(k))
            .and_then(|j| j.backend.as_ref())
            .unwrap_or(&self.judge)
    }

    /// One (judge, sample) judgment, shared with concurrent requests for the same one.
    async fn panel_call(
        self: &Arc<Self>,
        k: usize,
        sample: u32,
        rubric: &str,
        dialogue: &Dialogue,
        span: &str,
        counter: &Arc<Counter>,
    ) -> PanelCall {
        let Some(panel) = self.panel.as_ref() else {
            return internal("no panel");
        };
        let backend = self.panel_backend(k);
        let sampling = sample_sampling_key(&backend.sampling_key(), sample);
        let plain = self.profile.judge_messages(rubric, dialogue, span);
        let first = if panel.shuffle {
            let seed = order_seed(backend.model(), &sampling, sample, &plain);
            let order = criterion_order(&self.profile.layout(rubric), seed);
            match self
                .profile
                .judge_messages_ordered(rubric, dialogue, span, &order)
            {
                Ok(m) => m,
                Err(e) => return internal(&format!("cannot reorder the criteria: {e}")),
            }
        } else {
            plain
        };
        // The first call's key, hashed once: the judgment's flight key and that call's cache key.
        let key = call_key(Role::Judge, backend.model(), &sampling, &first, 1);
        let me = Arc::clone(self);
        let c = Arc::clone(counter);
        let rubric = rubric.to_owned();
        let first_key = key.clone();
        flight(&panel.flights, key, || async move {
            let own = Counter::default();
            let outcome = me
                .judge_loop(
                    me.panel_backend(k),
                    sample,
                    &rubric,
                    first,
                    Some(first_key),
                    &own,
                )
                .await;
            let cost = own.snapshot();
            // Counted once, in the turn that made the calls.
            c.absorb(&cost);
            if let Some(j) = me.panel.as_ref().and_then(|p| p.judges.get(k)) {
                me.metrics.panel().judge_cost(&j.name, &cost);
            }
            PanelCall { outcome, cost }
        })
        .await
    }

    /// Judges every response of a turn with the panel and aggregates: the results and rewards
    /// of the responses, in input order.
    pub(super) async fn panel_turn(
        self: &Arc<Self>,
        text: &str,
        dialogue: Dialogue,
        responses: &[String],
        gold: Option<&serde_json::Value>,
        counter: &Arc<Counter>,
    ) -> (Vec<ResponseResult>, Vec<Option<f64>>) {
        let n = responses.len();
        let Some(panel) = self.panel.as_ref() else {
            return (Vec::new(), vec![None; n]);
        };
        let text: Arc<str> = Arc::from(text);
        let dialogue = Arc::new(dialogue);
        let mut settled: Vec<Option<(f64, &'static str)>> = vec![None; n];
        let mut set = JoinSet::new();
        for (j, resp) in responses.iter().enumerate() {
            match self.profile.prepare_response(resp) {
                Prepared::Settled { reward, status } => settled[j] = Some((reward, status)),
                Prepared::Judge(span) => {
                    let span: Arc<str> = Arc::from(span);
                    for (k, judge) in panel.judges.iter().enumerate() {
                        for s in 0..judge.samples {
                            let me = Arc::clone(self);
                            let (t, d, sp, c) = (
                                Arc::clone(&text),
                                Arc::clone(&dialogue),
                                Arc::clone(&span),
                                Arc::clone(counter),
                            );
                            set.spawn(async move {
                                (j, k, s, me.panel_call(k, s, &t, &d, &sp, &c).await)
                            });
                        }
                    }
                }
            }
        }
        // grid[k][s][j]: judge k's sample s of response j.
        let mut grid: Vec<Vec<Vec<Option<PanelCall>>>> = panel
            .judges
            .iter()
            .map(|jg| vec![vec![None; n]; jg.samples as usize])
            .collect();
        while let Some(done) = set.join_next().await {
            // A task only panics on a bug; its sample then counts as failed, never as scores.
            if let Ok((j, k, s, call)) = done
                && let Some(slot) = grid
                    .get_mut(k)
                    .and_then(|g| g.get_mut(s as usize))
                    .and_then(|g| g.get_mut(j))
            {
                *slot = Some(call);
            }
        }
        // Each (judge, sample) column is rewarded by the profile exactly as a single judge's.
        let rewards: Vec<Vec<Vec<Option<f64>>>> = grid
            .iter()
            .map(|samples| {
                samples
                    .iter()
                    .map(|col| {
                        let scores: Vec<Option<Vec<f64>>> = col
                            .iter()
                            .map(|c| {
                                c.as_ref()
                                    .and_then(|c| c.outcome.scores.as_ref().ok().cloned())
                            })
                            .collect();
                        self.profile.score_group(&text, responses, &scores, gold)
                    })
                    .collect()
            })
            .collect();
        let layout = self.profile.layout(&text);
        let mut results = Vec::with_capacity(n);
        let mut out = vec![None; n];
        let mut units: Vec<(Vec<f64>, Vec<Vec<f64>>)> = Vec::new();
        for j in 0..n {
            if let Some((reward, status)) = settled[j] {
                results.push(ResponseResult {
                    reward: Some(reward),
                    status,
                    scores: None,
                    judge_attempts: 0,
                    error: None,
                    panel: None,
                    stripped: None,
                });
                out[j] = Some(reward);
                continue;
            }
            let response = responses.get(j).map_or("", String::as_str);
            let (r, unit) =
                self.panel_response(panel, &grid, &rewards, j, (&text, response, gold), &layout);
            out[j] = r.reward;
            if let Some(p) = &r.panel {
                self.metrics.panel().response(p, panel.aggregate);
            }
            units.extend(unit);
            results.push(r);
        }
        if !units.is_empty() {
            let now = {
                let mut a = panel
                    .agreement
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                for (rewards, criteria) in &units {
                    a[0].add_unit(rewards);
                    for c in criteria {
                        a[1].add_unit(c);
                    }
                }
                *a
            };
            self.metrics.panel().agreement("reward", &now[0]);
            self.metrics.panel().agreement("score", &now[1]);
        }
        (results, out)
    }

    /// One judged response: each judge's result, the quorum, the aggregate, the spread; and
    /// its agreement units (the valid judges' rewards, and their scores of each criterion)
    /// when two judges or more gave scores. `(rubric, response, gold)` are the turn's rubric
    /// text, the response as given and the turn's gold, for the profile's reward of the
    /// aggregated scores.
    #[allow(clippy::type_complexity)]
    fn panel_response(
        &self,
        panel: &Panel,
        grid: &[Vec<Vec<Option<PanelCall>>>],
        rewards: &[Vec<Vec<Option<f64>>>],
        j: usize,
        (rubric, response, gold): (&str, &str, Option<&serde_json::Value>),
        layout: &[usize],
    ) -> (ResponseResult, Option<(Vec<f64>, Vec<Vec<f64>>)>) {
        let mut judges = Vec::with_capacity(panel.judges.len());
        let mut flat: Vec<Option<Vec<f64>>> = Vec::with_capacity(panel.judges.len());
        let mut attempts = 0u32;
        for (k, judge) in panel.judges.iter().enumerate() {
            let mut res = JudgeResult::new(&judge.name, judge.samples);
            let mut first_failure: Option<(&'static str, ErrorOut)> = None;
            let mut sums: Option<Sums> = None;
            for s in 0..judge.samples as usize {
                let call = grid.get(k).and_then(|g| g.get(s)).and_then(|g| g.get(j));
                let reward = rewards
                    .get(k)
                    .and_then(|g| g.get(s))
                    .and_then(|g| g.get(j))
                    .copied()
                    .flatten();
                let Some(Some(call)) = call else {
                    first_failure.get_or_insert((
                        response_status::JUDGE_ERROR,
                        ErrorOut {
                            code: "internal".to_owned(),
                            message: "the judge task ended without a result".to_owned(),
                        },
                    ));
                    continue;
                };
                res.add_cost(&call.cost);
                res.judge_attempts += call.outcome.attempts;
                match (&call.outcome.scores, reward) {
                    (Ok(scores), Some(r)) => {
                        res.samples_ok += 1;
                        match &mut sums {
                            None => {
                                sums = Some(Sums {
                                    reward: r,
                                    scores: scores.clone(),
                                });
                            }
                            Some(acc) => {
                                acc.reward += r;
                                for (a, x) in acc.scores.iter_mut().zip(scores) {
                                    *a += x;
                                }
                            }
                        }
                    }
                    (Ok(_), None) => {
                        first_failure.get_or_insert((
                            response_status::JUDGE_INVALID,
                            ErrorOut {
                                code: "score_error".to_owned(),
                                message: "the scores do not give a reward under the score policy"
                                    .to_owned(),
                            },
                        ));
                    }
                    (Err((st, e)), _) => {
                        first_failure.get_or_insert((st, e.clone()));
                    }
                }
            }
            attempts += res.judge_attempts;
            match sums {
                Some(acc) if res.samples_ok > 0 => {
                    let m = f64::from(res.samples_ok);
                    let mean: Vec<f64> = acc.scores.iter().map(|x| x / m).collect();
                    res.reward = Some(acc.reward / m);
                    res.scores = Some(split(&mean, layout));
                    flat.push(Some(mean));
                }
                _ => {
                    if let Some((st, e)) = first_failure {
                        res.status = st;
                        res.error = Some(e);
                    }
                    flat.push(None);
                }
            }
            judges.push(res);
        }
        let ok: Vec<usize> = (0..judges.len())
            .filter(|&k| judges[k].reward.is_some())
            .collect();
        let weight = |k: usize| panel.judges.get(k).map_or(1.0, |jg| jg.weight);
        let judge_reward = |k: usize| judges[k].reward.unwrap_or(f64::NAN);
        let criteria = flat.iter().flatten().next().map_or(0, std::vec::Vec::len);
        let criterion = |c: usize| -> Vec<(f64, f64)> {
            ok.iter()
                .filter_map(|&k| {
                    flat.get(k)
                        .and_then(Option::as_ref)
                        .and_then(|f| f.get(c))
                        .map(|&x| (x, weight(k)))
                })
                .collect()
        };
        let unit = (ok.len() >= 2).then(|| {
            (
                ok.iter().map(|&k| judge_reward(k)).collect::<Vec<f64>>(),
                (0..criteria)
                    .map(|c| criterion(c).into_iter().map(|v| v.0).collect())
                    .collect::<Vec<Vec<f64>>>(),
            )
        });
        let reward_spread = spread(ok.iter().map(|&k| judge_reward(k)));
        let quorum_met = !ok.is_empty() && ok.len() >= panel.quorum;
        let (mut reward, mut status, mut error, mut scores, mut score_spread) =
            (None, response_status::OK, None, None, None);
        if quorum_met {
            // Per criterion the aggregate over the valid judges; the reward is the profile's
            // reward of those real-valued scores (Eq. 5 for `care`), not an aggregate of the
            // judges' rewards.
            let agg: Vec<f64> = (0..criteria)
                .map(|c| aggregate(&criterion(c), panel.aggregate, panel.trim).unwrap_or(f64::NAN))
                .collect();
            match self.profile.score_real(rubric, response, &agg, gold) {
                Ok(r) => reward = Some(r),
                Err(e) => {
                    status = response_status::JUDGE_INVALID;
                    error = Some(ErrorOut {
                        code: "score_error".to_owned(),
                        message: format!("the panel's aggregated scores give no reward: {e}"),
                    });
                }
            }
            let sp: Vec<f64> = (0..criteria)
                .map(|c| spread(criterion(c).into_iter().map(|v| v.0)))
                .collect();
            scores = Some(split(&agg, layout));
            score_spread = Some(split(&sp, layout));
        } else if let [only] = judges.as_slice() {
            // One judge: its own status and error, as a single judge reports them.
            status = only.status;
            error = only.error.clone();
        } else {
            status = status::NO_QUORUM;
            error = Some(ErrorOut {
                code: status::NO_QUORUM.to_owned(),
                message: no_quorum_message(&judges, panel.quorum),
            });
        }
        let flagged = quorum_met && panel.max_spread.is_some_and(|m| reward_spread > m);
        if flagged && panel.on_spread == SpreadAction::Null {
            let each: Vec<String> = ok
                .iter()
                .map(|&k| format!("{} {:.4}", judges[k].judge, judge_reward(k)))
                .collect();
            reward = None;
            status = status::JUDGES_DISAGREE;
            error = Some(ErrorOut {
                code: status::JUDGES_DISAGREE.to_owned(),
                message: format!(
                    "the judges' rewards spread by {reward_spread:.4} ({}), more than panel.max_spread {}",
                    each.join(", "),
                    panel.max_spread.unwrap_or(0.0)
                ),
            });
        }
        let result = ResponseResult {
            reward,
            status,
            scores,
            judge_attempts: attempts,
            error,
            stripped: None,
            panel: Some(PanelResult {
                judges_ok: ok.len(),
                quorum: panel.quorum,
                reward_spread,
                score_spread,
                flagged,
                judges,
            }),
        };
        (result, unit)
    }
}

fn internal(message: &str) -> PanelCall {
    PanelCall {
        outcome: JudgeOutcome {
            scores: Err((
                response_status::JUDGE_ERROR,
                ErrorOut {
                    code: "internal".to_owned(),
                    message: message.to_owned(),
                },
            )),
            attempts: 0,
        },
        cost: CallCounts::default(),
    }
}
