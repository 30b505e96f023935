//! The loop of one turn (paper section 3.4): one rubric for the turn, shared by every response
//! of the group, then one judgment per response, then Eq. 5 for the group.
//!
//! Bounded everywhere: HTTP attempts per call ([`crate::config::EndpointConfig::max_attempts`]),
//! generator answers per turn ([`crate::config::LoopConfig::rubric_attempts`]), judge answers per
//! response ([`crate::config::LoopConfig::judge_attempts`]). Every way out has a status; a
//! response without a usable judgment has a `null` reward, never a 0.
//!
//! Concurrent requests for the same turn (or the same response under the same rubric) share
//! one computation: the second waits for the first instead of calling the LLM again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;
use tokio::sync::OnceCell;

use crate::cache::{CACHE_UNAVAILABLE, Cache, CallMeta, call_key, group_keys};
use crate::config::LoopConfig;
use crate::llm::{Backend, CallError, ChatMessage, Completion, HttpEndpoint, Role};
use crate::metrics::Metrics;
use crate::profile::{
    CareProfile, Dialogue, JudgeProblem, Prepared, RubricCheck, RubricJson, RubricProfile,
};
use crate::scripted::Scripted;
use crate::template::{TemplateOut, Templates};

mod judges;

/// Most responses in one turn (a GRPO group is far smaller; this bounds one request's work).
pub const MAX_RESPONSES: usize = 4096;

/// Largest `meta` object of a turn, serialized, in bytes (it is copied into the output).
pub const MAX_META_BYTES: usize = 16 << 10;

/// One turn to reward: a `care reward` input line, an element of the server's `turns`.
///
/// A member other than these is an error (`bad_input`, naming it and the accepted ones): a
/// misspelled `responses` or `context` must not be read as absent. The caller's own data goes
/// in `gold` or `meta`, which are copied to the output.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TurnInput {
    /// Copied to the output.
    #[serde(default)]
    pub id: Option<Value>,
    /// The dialogue up to the seeker's latest turn, as chat messages (may be left out when
    /// `prompt` is given).
    #[serde(default)]
    pub context: Vec<ChatMessage>,
    /// The dialogue as a chat-templated prompt ([`crate::template`]): read into the dialogue
    /// when `context` is empty; its template family names the end tokens the responses lose.
    #[serde(default)]
    pub prompt: Option<String>,
    /// The candidate responses of the group.
    pub responses: Vec<String>,
    /// Gold metadata, copied to the output; a fixed profile reads `gold.emotion`.
    #[serde(default)]
    pub gold: Option<Value>,
    /// The caller's metadata, a JSON object of at most [`MAX_META_BYTES`], copied to the output
    /// as written (`care analyze` groups by `meta.turn`, `meta.emotion`, `meta.variant`).
    #[serde(default)]
    pub meta: Option<Meta>,
}

/// A turn's `meta` as the caller wrote it: the JSON text, members in the caller's order.
#[derive(Clone, Debug)]
pub struct Meta(Box<RawValue>);

impl Meta {
    /// `text` when it is one JSON value (checked when the turn runs: an object, not too large).
    pub fn from_json(text: &str) -> Option<Meta> {
        RawValue::from_string(text.to_owned()).ok().map(Meta)
    }

    /// The JSON text.
    pub fn get(&self) -> &str {
        self.0.get()
    }
}

impl PartialEq for Meta {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl Serialize for Meta {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Meta {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Box::<RawValue>::deserialize(d).map(Meta)
    }
}

/// A stable code and a message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ErrorOut {
    /// Stable code.
    pub code: String,
    /// What happened.
    pub message: String,
}

/// Longest message an [`ErrorOut`] built from an LLM's answer keeps, in bytes. A message can
/// quote the answer or the rubric (the missing criteria by title), both written by an LLM;
/// every response of a request keeps its error until the request is answered, so each is cut
/// to this length (at a character boundary, ending in `...`).
pub const MAX_ERROR_MESSAGE_BYTES: usize = 1024;

fn bounded(mut message: String) -> String {
    if message.len() > MAX_ERROR_MESSAGE_BYTES {
        let mut end = MAX_ERROR_MESSAGE_BYTES - 3;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push_str("...");
    }
    message
}

impl From<&CallError> for ErrorOut {
    fn from(e: &CallError) -> Self {
        ErrorOut {
            code: e.code.clone(),
            message: bounded(format!(
                "{} (after {} HTTP attempts)",
                e.message, e.attempts
            )),
        }
    }
}

impl From<&JudgeProblem> for ErrorOut {
    fn from(p: &JudgeProblem) -> Self {
        ErrorOut {
            code: p.code.to_owned(),
            message: bounded(p.message.clone()),
        }
    }
}

/// Rubric statuses.
pub mod rubric_status {
    /// A valid rubric (possibly after repairs: see `rubric_attempts`).
    pub const OK: &str = "ok";
    /// Still invalid after the last repair; no response of the turn is judged.
    pub const INVALID: &str = "invalid_rubric";
    /// The generator endpoint failed after its retries.
    pub const GENERATOR_ERROR: &str = "generator_error";
}

/// Response statuses.
pub mod response_status {
    /// Judged and scored.
    pub const OK: &str = "ok";
    /// The judge answered, but no answer could be scored after the last retry.
    pub const JUDGE_INVALID: &str = "judge_invalid";
    /// The judge endpoint failed after its retries.
    pub const JUDGE_ERROR: &str = "judge_error";
    /// The turn has no rubric; not judged.
    pub const NO_RUBRIC: &str = "no_rubric";
    /// The turn's `gold` lacks what the profile's reward needs (a gold emotion); not judged.
    pub const MISSING_GOLD: &str = "missing_gold";
}

/// LLM calls of a turn.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallCounts {
    /// Generator calls answered by the LLM in this run.
    pub generator: u64,
    /// Judge calls answered by the LLM in this run.
    pub judge: u64,
    /// Calls answered from the cache.
    pub cached: u64,
    /// Calls that failed after their retries.
    pub failed: u64,
    /// HTTP attempts (retries included).
    pub http_attempts: u64,
    /// Prompt tokens reported by the LLM.
    pub prompt_tokens: u64,
    /// Completion tokens reported by the LLM.
    pub completion_tokens: u64,
}

#[derive(Debug, Default)]
struct Counter {
    generator: AtomicU64,
    judge: AtomicU64,
    cached: AtomicU64,
    failed: AtomicU64,
    http_attempts: AtomicU64,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
}

impl Counter {
    fn add(a: &AtomicU64, n: u64) {
        a.fetch_add(n, Ordering::Relaxed);
    }
    fn snapshot(&self) -> CallCounts {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        CallCounts {
            generator: g(&self.generator),
            judge: g(&self.judge),
            cached: g(&self.cached),
            failed: g(&self.failed),
            http_attempts: g(&self.http_attempts),
            prompt_tokens: g(&self.prompt_tokens),
            completion_tokens: g(&self.completion_tokens),
        }
    }
}

/// One response's result.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ResponseResult {
    /// Eq. 5 in `[0, 1]`, `null` unless `status` is `ok` (or a profile's settled status).
    pub reward: Option<f64>,
    /// `ok`, `judge_invalid`, `judge_error`, `no_rubric`, or a profile's settled status
    /// (`malformed_output`).
    pub status: &'static str,
    /// Raw judge scores per dimension (criteria in rubric order), when judged.
    pub scores: Option<Vec<Vec<f64>>>,
    /// Judge answers asked for this response.
    pub judge_attempts: u32,
    /// Why there is no reward.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorOut>,
    /// The judges of a panel: each one's reward, scores and cost, the spread, the flag (absent
    /// for a single judge, whose output is what it always was).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub panel: Option<crate::panel::PanelResult>,
    /// The end tokens removed from the end of the response before it was checked and judged,
    /// verbatim ([`crate::template`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stripped: Option<String>,
}

/// One turn's result (a `care reward` output line without `line`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TurnResult {
    /// The input's `id`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<Value>,
    /// `ok`, `invalid_rubric` or `generator_error`.
    pub rubric_status: &'static str,
    /// The rubric (the valid one as the generator wrote it, or the last invalid answer as text).
    pub rubric: Option<RubricJson>,
    /// Generator answers asked for this turn (1 + repairs).
    pub rubric_attempts: u32,
    /// The validation of the last generator answer (`format_reward`, `violations`).
    pub validation: Option<RubricCheck>,
    /// The answers before it that broke the contract, with their violation codes.
    pub repairs: Vec<Repair>,
    /// Why there is no rubric.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rubric_error: Option<ErrorOut>,
    /// One reward per response, in input order; `null` where there is none.
    pub rewards: Vec<Option<f64>>,
    /// One result per response, in input order.
    pub responses: Vec<ResponseResult>,
    /// Each response's length in characters (Unicode scalar values), in input order: what
    /// `care analyze` sets the rewards against to catch length hacking.
    pub response_chars: Vec<u64>,
    /// LLM calls this turn made or found in the cache.
    pub calls: CallCounts,
    /// The input's `gold`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gold: Option<Value>,
    /// The input's `meta`, as written (only the whitespace between its JSON tokens removed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub meta: Option<Meta>,
    /// How the input's `prompt` was read (absent without a prompt).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template: Option<TemplateOut>,
}

/// What a trainer without a validity mask gets for a response without a reward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnFailure {
    /// `null` (TRL turns it into NaN and leaves it out; the JSON API's default).
    Null,
    /// The mean of the group's valid rewards: under a group-mean baseline its advantage is 0.
    /// A group with no valid reward gets 0 for every response: constant, so every GRPO
    /// advantage of the group is 0 and it contributes no gradient.
    GroupMean,
    /// Refuse: the request fails and names the failed responses.
    Error,
}

impl OnFailure {
    /// Every name, for help texts.
    pub const NAMES: [&'static str; 3] = ["null", "group_mean", "error"];

    /// The stable name.
    pub const fn as_str(self) -> &'static str {
        match self {
            OnFailure::Null => "null",
            OnFailure::GroupMean => "group_mean",
            OnFailure::Error => "error",
        }
    }
}

impl std::str::FromStr for OnFailure {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "null" => Ok(OnFailure::Null),
            "group_mean" => Ok(OnFailure::GroupMean),
            "error" => Ok(OnFailure::Error),
            _ => Err(format!(
                "unknown on_failure {s:?}: use one of {}",
                OnFailure::NAMES.join(", ")
            )),
        }
    }
}

impl TurnResult {
    /// The rewards under `policy`.
    ///
    /// # Errors
    /// Under [`OnFailure::Error`], a message naming the responses without a reward.
    pub fn trainer_rewards(&self, policy: OnFailure) -> Result<Vec<Option<f64>>, String> {
        let valid: Vec<f64> = self.rewards.iter().flatten().copied().collect();
        match policy {
            OnFailure::Null => Ok(self.rewards.clone()),
            OnFailure::GroupMean => {
                let fill = if valid.is_empty() {
                    0.0
                } else {
                    valid.iter().sum::<f64>() / valid.len() as f64
                };
                Ok(self
                    .rewards
                    .iter()
                    .map(|r| Some(r.unwrap_or(fill)))
                    .collect())
            }
            OnFailure::Error => {
                let failed: Vec<String> = self
                    .responses
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| r.reward.is_none())
                    .map(|(j, r)| format!("responses[{j}]: {}", r.status))
                    .collect();
                if failed.is_empty() {
                    Ok(self.rewards.clone())
                } else {
                    Err(format!(
                        "rubric {}; no reward for {}",
                        self.rubric_status,
                        failed.join(", ")
                    ))
                }
            }
        }
    }
}

/// One generator answer that broke the format contract.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Repair {
    /// Which answer (1-based).
    pub attempt: u32,
    /// The violation codes the validator reported (the repair request quoted their messages).
    pub codes: Vec<String>,
}

#[derive(Clone, Debug)]
struct RubricOutcome {
    text: Option<String>,
    repairs: Vec<Repair>,
    status: &'static str,
    attempts: u32,
    last_answer: Option<String>,
    check: Option<RubricCheck>,
    error: Option<ErrorOut>,
}

#[derive(Clone, Debug)]
struct JudgeOutcome {
    scores: Result<Vec<f64>, (&'static str, ErrorOut)>,
    attempts: u32,
}

type Flights<T> = Mutex<HashMap<String, Arc<OnceCell<T>>>>;

/// The loop: the profile, both backends, the cache and the metrics.
#[derive(Debug)]
pub struct Engine {
    profile: Arc<dyn RubricProfile>,
    templates: Templates,
    /// `None` for a profile with a fixed rubric: no generator is configured or called.
    generator: Option<Backend>,
    judge: Backend,
    cache: Option<Arc<Cache>>,
    metrics: Arc<Metrics>,
    rubric_attempts: u32,
    judge_attempts: u32,
    turn_concurrency: usize,
    rubric_flights: Flights<RubricOutcome>,
    judge_flights: Flights<JudgeOutcome>,
    /// A panel of judges (`None`: the single judge, exactly as it always worked).
    panel: Option<judges::Panel>,
    /// `care serve --log`: one record per response.
    log: Option<Arc<crate::log::ResponseLog>>,
    /// Generator and judge loops holding their prompts at once (each endpoint's
    /// `max_concurrency`): a request of many turns or responses builds its prompts as slots
    /// free up, so the prompts in memory are bounded whatever the request holds.
    generator_slots: tokio::sync::Semaphore,
    judge_slots: tokio::sync::Semaphore,
}

/// How the engine reaches its LLMs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// The endpoints of the configuration.
    Http,
    /// The offline replay of the bundled fixtures (no LLM; see [`crate::scripted`]).
    Scripted,
}

impl Engine {
    /// An engine for `cfg` with the profile it names (`care`, the paper's, by default).
    ///
    /// # Errors
    /// A configuration message.
    pub fn new(
        cfg: &LoopConfig,
        kind: BackendKind,
        cache: Option<Cache>,
        metrics: Arc<Metrics>,
    ) -> Result<Engine, String> {
        let layout = cfg.layout()?;
        let profile: Arc<dyn RubricProfile> = match cfg.profile.as_str() {
            "care" => Arc::new(CareProfile::new(cfg.lenient_rubric).with_layout(layout)),
            other => Arc::new(
                crate::fixed::FixedProfile::builtin(other)?
                    .with_layout(layout)
                    .with_missing_gold(cfg.missing_gold),
            ),
        };
        Self::with_profile(cfg, kind, cache, metrics, profile)
    }

    /// An engine with another rubric profile (the seam where the Kardia-R1 profile plugs in).
    ///
    /// # Errors
    /// A configuration message.
    pub fn with_profile(
        cfg: &LoopConfig,
        kind: BackendKind,
        cache: Option<Cache>,
        metrics: Arc<Metrics>,
        profile: Arc<dyn RubricProfile>,
    ) -> Result<Engine, String> {
        cfg.check_bounds()?;
        let panel = judges::Panel::build(cfg, kind, profile.as_ref())?;
        let templates = Templates::new(&cfg.chat_template, &cfg.end_suffixes)?;
        let needs_generator = profile.fixed_rubric().is_none();
        let (generator, judge) = match kind {
            BackendKind::Http => (
                if needs_generator {
                    let g = HttpEndpoint::new(cfg.generator.clone(), Role::Generator)?;
                    Some(Backend::Http(Box::new(g)))
                } else {
                    None
                },
                Backend::Http(Box::new(HttpEndpoint::new(
                    judges::first_endpoint(cfg),
                    Role::Judge,
                )?)),
            ),
            BackendKind::Scripted => (
                needs_generator.then(|| Backend::Scripted(Scripted::generator())),
                Backend::Scripted(Scripted::judge()),
            ),
        };
        if let Some(c) = &cache {
            c.bind_metrics(Arc::clone(&metrics));
        }
        Ok(Engine {
            profile,
            templates,
            generator,
            judge,
            cache: cache.map(Arc::new),
            metrics,
            rubric_attempts: cfg.rubric_attempts,
            judge_attempts: cfg.judge_attempts,
            turn_concurrency: cfg.turn_concurrency,
            generator_slots: tokio::sync::Semaphore::new(cfg.generator.max_concurrency.max(1)),
            // A panel's judges each have their own limit: their judge loops hold at most the sum.
            judge_slots: tokio::sync::Semaphore::new(
                cfg.judge
                    .judges
                    .iter()
                    .map(|j| j.endpoint.max_concurrency)
                    .sum::<usize>()
                    .max(1),
            ),
            rubric_flights: Mutex::new(HashMap::new()),
            judge_flights: Mutex::new(HashMap::new()),
            panel,
            log: None,
        })
    }

    /// Writes one record per rewarded response to `log` (`care serve --log`).
    pub fn set_response_log(&mut self, log: Arc<crate::log::ResponseLog>) {
        self.log = Some(log);
    }

    /// The response log, when there is one.
    pub fn response_log(&self) -> Option<&Arc<crate::log::ResponseLog>> {
        self.log.as_ref()
    }

    /// The metrics this engine records into.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Turns `care reward` runs at once.
    pub fn turn_concurrency(&self) -> usize {
        self.turn_concurrency
    }

    /// The cache, when there is one.
    pub fn cache(&self) -> Option<&Cache> {
        self.cache.as_deref()
    }

    /// Rewards one turn.
    ///
    /// # Errors
    /// A bad input (`bad_input`: the message says what to fix), or a call refused because the
    /// shared cache is down under `cache.when_down: refuse` (`cache_unavailable`: ask again
    /// later); LLM failures are statuses.
    pub async fn run_turn(self: &Arc<Self>, input: TurnInput) -> Result<TurnResult, ErrorOut> {
        let bad = |message: String| ErrorOut {
            code: "bad_input".to_owned(),
            message,
        };
        let meta = check_meta(input.meta).map_err(bad)?;
        let text = self
            .templates
            .read(input.context, input.prompt.as_deref(), &self.metrics)
            .map_err(bad)?;
        let seeker_turns = text.messages.iter().filter(|m| m.role == "user").count();
        let dialogue = Dialogue::new(text.messages).map_err(bad)?;
        if input.responses.is_empty() {
            return Err(bad(
                "responses is empty: give the group's candidate responses".to_owned(),
            ));
        }
        if input.responses.len() > MAX_RESPONSES {
            return Err(bad(format!(
                "{} responses in one turn; at most {MAX_RESPONSES}",
                input.responses.len()
            )));
        }
        // Each response without its template's end tokens, before the format check and the judge.
        let (responses, stripped): (Vec<String>, Vec<Option<String>>) = input
            .responses
            .iter()
            .map(|r| {
                let (kept, removed) = self.templates.strip(r, text.tokens, &self.metrics);
                (kept.to_owned(), removed.map(str::to_owned))
            })
            .unzip();
        let counter = Arc::new(Counter::default());
        let rubric = self.rubric_for(&dialogue, &counter).await;
        self.metrics.rubric(rubric.status);
        let n = responses.len();
        let mut results: Vec<ResponseResult> = Vec::with_capacity(n);
        let mut rewards = vec![None; n];
        let gold_problem = rubric
            .text
            .as_ref()
            .and_then(|_| self.profile.check_gold(input.gold.as_ref()).err());
        match (&rubric.text, gold_problem) {
            (Some(_), Some(message)) => {
                for _ in 0..n {
                    results.push(ResponseResult {
                        reward: None,
                        status: response_status::MISSING_GOLD,
                        scores: None,
                        judge_attempts: 0,
                        error: Some(ErrorOut {
                            code: response_status::MISSING_GOLD.to_owned(),
                            message: message.clone(),
                        }),
                        stripped: None,
                        panel: None,
                    });
                }
            }
            (None, _) => {
                for _ in 0..n {
                    results.push(ResponseResult {
                        reward: None,
                        status: response_status::NO_RUBRIC,
                        scores: None,
                        judge_attempts: 0,
                        error: Some(ErrorOut {
                            code: rubric.status.to_owned(),
                            message: "the turn has no valid rubric, so no response was judged"
                                .to_owned(),
                        }),
                        panel: None,
                        stripped: None,
                    });
                }
            }
            (Some(text), None) if self.panel.is_some() => {
                let (r, w) = self
                    .panel_turn(text, dialogue, &responses, input.gold.as_ref(), &counter)
                    .await;
                results = r;
                rewards = w;
            }
            (Some(text), None) => {
                let text: Arc<str> = Arc::from(text.as_str());
                let dialogue = Arc::new(dialogue);
                let mut set = tokio::task::JoinSet::new();
                let mut settled: Vec<Option<(f64, &'static str)>> = vec![None; n];
                // The judge's first request for each response to judge; their keys together
                // (the prompts of a group share all but their end: hashed once).
                let mut judged: Vec<(usize, Vec<ChatMessage>)> = Vec::with_capacity(n);
                for (j, resp) in responses.iter().enumerate() {
                    match self.profile.prepare_response(resp) {
                        Prepared::Settled { reward, status } => {
                            settled[j] = Some((reward, status));
                        }
                        Prepared::Judge(span) => {
                            judged.push((j, self.profile.judge_messages(&text, &dialogue, &span)));
                        }
                    }
                }
                let (at, firsts): (Vec<usize>, Vec<Vec<ChatMessage>>) = judged.into_iter().unzip();
                let keys = group_keys(
                    Role::Judge,
                    self.judge.model(),
                    &self.judge.sampling_key(),
                    &firsts,
                    1,
                );
                for ((j, first), key) in at.into_iter().zip(firsts).zip(keys) {
                    let me = Arc::clone(self);
                    let (t, c) = (Arc::clone(&text), Arc::clone(&counter));
                    set.spawn(async move { (j, me.judgment(&t, first, key, &c).await) });
                }
                let mut outcomes: Vec<Option<JudgeOutcome>> = vec![None; n];
                while let Some(done) = set.join_next().await {
                    // A judge task only panics on a bug; its response then has no outcome and
                    // is reported as judge_error below, never as a reward.
                    if let Ok((j, o)) = done
                        && let Some(slot) = outcomes.get_mut(j)
                    {
                        *slot = Some(o);
                    }
                }
                let scores: Vec<Option<Vec<f64>>> = outcomes
                    .iter()
                    .map(|o| o.as_ref().and_then(|o| o.scores.as_ref().ok().cloned()))
                    .collect();
                let group =
                    self.profile
                        .score_group(&text, &responses, &scores, input.gold.as_ref());
                let layout = self.profile.layout(&text);
                for j in 0..n {
                    let r = match (&settled[j], &outcomes[j]) {
                        (Some((reward, status)), _) => ResponseResult {
                            reward: Some(*reward),
                            status,
                            scores: None,
                            judge_attempts: 0,
                            error: None,
                            panel: None,
                            stripped: None,
                        },
                        (None, Some(o)) => match &o.scores {
                            Ok(s) => match group.get(j).copied().flatten() {
                                Some(reward) => ResponseResult {
                                    reward: Some(reward),
                                    status: response_status::OK,
                                    scores: Some(split(s, &layout)),
                                    judge_attempts: o.attempts,
                                    error: None,
                                    panel: None,
                                    stripped: None,
                                },
                                None => ResponseResult {
                                    reward: None,
                                    status: response_status::JUDGE_INVALID,
                                    scores: Some(split(s, &layout)),
                                    judge_attempts: o.attempts,
                                    error: Some(ErrorOut {
                                        code: "score_error".to_owned(),
                                        message:
                                            "the scores do not give a reward under the score policy"
                                                .to_owned(),
                                    }),
                                    panel: None,
                                    stripped: None,
                                },
                            },
                            Err((status, e)) => ResponseResult {
                                reward: None,
                                status,
                                scores: None,
                                judge_attempts: o.attempts,
                                error: Some(e.clone()),
                                panel: None,
                                stripped: None,
                            },
                        },
                        (None, None) => ResponseResult {
                            reward: None,
                            status: response_status::JUDGE_ERROR,
                            scores: None,
                            judge_attempts: 0,
                            error: Some(ErrorOut {
                                code: "internal".to_owned(),
                                message: "the judge task ended without a result".to_owned(),
                            }),
                            panel: None,
                            stripped: None,
                        },
                    };
                    rewards[j] = r.reward;
                    results.push(r);
                }
            }
        }
        // A call refused because the shared cache is down (`cache.when_down: refuse`): the
        // turn is refused whole, to be asked again, rather than answered without its rubric
        // or with a judgment another replica may have made differently.
        let refused = rubric
            .error
            .iter()
            .chain(results.iter().filter_map(|r| r.error.as_ref()))
            .find(|e| e.code == CACHE_UNAVAILABLE);
        if let Some(e) = refused {
            return Err(e.clone());
        }
        for (r, s) in results.iter_mut().zip(stripped) {
            self.metrics.response(r.status);
            r.stripped = s;
        }
        let rubric_json = match (&rubric.text, &rubric.last_answer) {
            (Some(t), _) => Some(self.profile.rubric_json(t)),
            (None, Some(a)) => Some(RubricJson::string(a)),
            (None, None) => None,
        };
        let result = TurnResult {
            id: input.id,
            rubric_status: rubric.status,
            rubric: rubric_json,
            rubric_attempts: rubric.attempts,
            validation: rubric.check.clone(),
            repairs: rubric.repairs.clone(),
            rubric_error: rubric.error.clone(),
            rewards,
            responses: results,
            response_chars: input
                .responses
                .iter()
                .map(|r| r.chars().count() as u64)
                .collect(),
            calls: counter.snapshot(),
            gold: input.gold,
            meta,
            template: text.template,
        };
        if let Some(log) = &self.log {
            log.record_turn(seeker_turns, &result);
        }
        Ok(result)
    }

    /// The turn's rubric, shared with concurrent requests for the same turn.
    async fn rubric_for(
        self: &Arc<Self>,
        dialogue: &Dialogue,
        counter: &Arc<Counter>,
    ) -> RubricOutcome {
        if let Some(fixed) = self.profile.fixed_rubric() {
            return RubricOutcome {
                text: Some(fixed.to_owned()),
                repairs: Vec::new(),
                status: rubric_status::OK,
                attempts: 0,
                last_answer: None,
                check: Some(self.profile.check_rubric(fixed)),
                error: None,
            };
        }
        // Closed only if the engine is dropped, which cannot happen while `self` is borrowed.
        let _slot = self.generator_slots.acquire().await.ok();
        let first = self.profile.generator_messages(dialogue);
        let (model, sampling) = self
            .generator
            .as_ref()
            .map_or((String::new(), String::new()), |g| {
                (g.model().to_owned(), g.sampling_key())
            });
        // The first call's key: the flight's, and the first call's own (hashed once).
        let key = call_key(Role::Generator, &model, &sampling, &first, 1);
        let me = Arc::clone(self);
        let c = Arc::clone(counter);
        let first_key = key.clone();
        flight(&self.rubric_flights, key, || async move {
            me.generate(first, first_key, &c).await
        })
        .await
    }

    /// The repair loop.
    async fn generate(
        &self,
        first: Vec<ChatMessage>,
        first_key: String,
        counter: &Counter,
    ) -> RubricOutcome {
        let mut first_key = Some(first_key);
        let mut messages = first.clone();
        let mut last: Option<(String, RubricCheck)> = None;
        let mut repairs = Vec::new();
        for attempt in 1..=self.rubric_attempts {
            let answer = match self
                .call(
                    Role::Generator,
                    &messages,
                    attempt,
                    first_key.take(),
                    counter,
                )
                .await
            {
                Ok(c) => c.content,
                Err(e) => {
                    // The last invalid answer (if any) is `validation`; `repairs` the ones before.
                    repairs.pop();
                    return RubricOutcome {
                        text: None,
                        repairs,
                        status: rubric_status::GENERATOR_ERROR,
                        attempts: attempt,
                        last_answer: last.as_ref().map(|(a, _)| a.clone()),
                        check: last.map(|(_, c)| c),
                        error: Some(ErrorOut::from(&e)),
                    };
                }
            };
            let check = self.profile.check_rubric(&answer);
            if check.is_valid() {
                return RubricOutcome {
                    text: Some(answer),
                    repairs,
                    status: rubric_status::OK,
                    attempts: attempt,
                    last_answer: None,
                    check: Some(check),
                    error: None,
                };
            }
            // The repair request: the first request, the invalid answer, the validator's
            // messages. Only the latest answer is kept, so the prompt does not grow.
            for v in &check.violations {
                self.metrics.rubric_violation(&v.code);
            }
            repairs.push(Repair {
                attempt,
                codes: check.violations.iter().map(|v| v.code.clone()).collect(),
            });
            messages = first.clone();
            messages.push(ChatMessage::new("assistant", answer.clone()));
            messages.push(ChatMessage::new(
                "user",
                self.profile.repair_message(&check),
            ));
            last = Some((answer, check));
        }
        let (answer, check) = match last {
            Some((a, c)) => (Some(a), Some(c)),
            None => (None, None),
        };
        // The last answer is `validation`; `repairs` lists the ones before it.
        repairs.pop();
        RubricOutcome {
            text: None,
            repairs,
            status: rubric_status::INVALID,
            attempts: self.rubric_attempts,
            error: Some(ErrorOut {
                code: "invalid_rubric".to_owned(),
                message: format!(
                    "the generator's rubric broke the format contract in all {} answers (see validation)",
                    self.rubric_attempts
                ),
            }),
            last_answer: answer,
            check,
        }
    }

    /// One response's judgment (its first request and that request's key), shared with
    /// concurrent requests for the same one.
    async fn judgment(
        self: &Arc<Self>,
        rubric: &str,
        first: Vec<ChatMessage>,
        key: String,
        counter: &Arc<Counter>,
    ) -> JudgeOutcome {
        let _slot = self.judge_slots.acquire().await.ok();
        let me = Arc::clone(self);
        let c = Arc::clone(counter);
        let rubric = rubric.to_owned();
        let first_key = key.clone();
        flight(&self.judge_flights, key, || async move {
            me.judge_loop(&me.judge, 0, &rubric, first, Some(first_key), &c)
                .await
        })
        .await
    }

    /// The judge loop of one judgment by `backend` (sample `sample`: part of every cache key
    /// but sample 0's).
    async fn judge_loop(
        &self,
        backend: &Backend,
        sample: u32,
        rubric: &str,
        first: Vec<ChatMessage>,
        mut first_key: Option<String>,
        counter: &Counter,
    ) -> JudgeOutcome {
        let mut messages = first.clone();
        let mut problem: Option<JudgeProblem> = None;
        for attempt in 1..=self.judge_attempts {
            let answer = match self
                .call_on(
                    Role::Judge,
                    backend,
                    sample,
                    &messages,
                    attempt,
                    first_key.take(),
                    counter,
                )
                .await
            {
                Ok(c) => c.content,
                Err(e) => {
                    return JudgeOutcome {
                        scores: Err((response_status::JUDGE_ERROR, ErrorOut::from(&e))),
                        attempts: attempt,
                    };
                }
            };
            match self.profile.parse_answer(rubric, &answer) {
                Ok(scores) => {
                    return JudgeOutcome {
                        scores: Ok(scores),
                        attempts: attempt,
                    };
                }
                Err(p) => {
                    messages = first.clone();
                    messages.push(ChatMessage::new("assistant", answer));
                    messages.push(ChatMessage::new(
                        "user",
                        self.profile.judge_retry_message(&p),
                    ));
                    problem = Some(p);
                }
            }
        }
        let e = problem.map_or(
            ErrorOut {
                code: "judge_invalid".to_owned(),
                message: "no usable judge answer".to_owned(),
            },
            |p| ErrorOut {
                code: p.code.to_owned(),
                message: bounded(format!(
                    "after {} judge answers: {}",
                    self.judge_attempts, p.message
                )),
            },
        );
        JudgeOutcome {
            scores: Err((response_status::JUDGE_INVALID, e)),
            attempts: self.judge_attempts,
        }
    }

    /// One LLM call through the cache (`key`: the call's key when the caller has it already).
    async fn call(
        &self,
        role: Role,
        messages: &[ChatMessage],
        attempt: u32,
        key: Option<String>,
        counter: &Counter,
    ) -> Result<Completion, CallError> {
        let backend = match role {
            Role::Generator => match &self.generator {
                Some(g) => g,
                None => {
                    return Err(CallError {
                        code: "no_generator".to_owned(),
                        message: "the profile has a fixed rubric and no generator".to_owned(),
                        attempts: 0,
                    });
                }
            },
            Role::Judge => &self.judge,
        };
        self.call_on(role, backend, 0, messages, attempt, key, counter)
            .await
    }

    /// One LLM call of `backend` through the cache; `sample` (0 for every call but a panel
    /// judge's later samples) goes into the key's sampling part; `key`: the call's key when
    /// the caller has it already.
    #[allow(clippy::too_many_arguments)]
    async fn call_on(
        &self,
        role: Role,
        backend: &Backend,
        sample: u32,
        messages: &[ChatMessage],
        attempt: u32,
        key: Option<String>,
        counter: &Counter,
    ) -> Result<Completion, CallError> {
        let key = key.unwrap_or_else(|| {
            call_key(
                role,
                backend.model(),
                &crate::panel::sample_sampling_key(&backend.sampling_key(), sample),
                messages,
                attempt,
            )
        });
        let model = backend.model();
        let made = match &self.cache {
            // Through the cache: the stored answer, another replica's once it stores it, or
            // this call's, stored once before it is used (a run stopped after that point never
            // asks this call again).
            Some(cache) => {
                let meta = CallMeta {
                    role,
                    model,
                    attempt,
                };
                cache
                    .call(&key, meta, backend.call_bound(), || {
                        backend.complete(messages, &self.metrics)
                    })
                    .await
            }
            None => backend
                .complete(messages, &self.metrics)
                .await
                .map(|c| (c, false)),
        };
        match made {
            Ok((c, true)) => {
                Counter::add(&counter.cached, 1);
                Ok(c)
            }
            Ok((c, false)) => {
                let slot = match role {
                    Role::Generator => &counter.generator,
                    Role::Judge => &counter.judge,
                };
                Counter::add(slot, 1);
                Counter::add(&counter.http_attempts, u64::from(c.attempts));
                Counter::add(&counter.prompt_tokens, c.usage.prompt_tokens);
                Counter::add(&counter.completion_tokens, c.usage.completion_tokens);
                Ok(c)
            }
            Err(e) => {
                Counter::add(&counter.failed, 1);
                Counter::add(&counter.http_attempts, u64::from(e.attempts));
                Err(e)
            }
        }
    }
}

/// Runs `make()` once per key among concurrent callers; later callers get a clone.
async fn flight<T, F, Fut>(flights: &Flights<T>, key: String, make: F) -> T
where
    T: Clone,
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let cell = {
        let mut map = flights
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(map.entry(key.clone()).or_default())
    };
    // Removes the entry when this caller is done, also when it is dropped unfinished (its
    // client went away): the map never keeps entries nobody waits on.
    let _leave = Leave {
        flights,
        key: &key,
        cell: &cell,
    };
    cell.get_or_init(make).await.clone()
}

struct Leave<'a, T> {
    flights: &'a Flights<T>,
    key: &'a str,
    cell: &'a Arc<OnceCell<T>>,
}

impl<T> Drop for Leave<'_, T> {
    fn drop(&mut self) {
        let mut map = self
            .flights
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Done (later requests find the answers in the cache, or compute afresh without
        // one), or abandoned with nobody else waiting (the map and this caller hold the only
        // references; the count is read under the lock that every new waiter takes).
        let done = self.cell.initialized();
        let alone = Arc::strong_count(self.cell) <= 2;
        if (done || alone) && map.get(self.key).is_some_and(|c| Arc::ptr_eq(c, self.cell)) {
            map.remove(self.key);
        }
    }
}

impl Engine {
    /// Computations shared between concurrent requests now (rubrics, judgments): 0 when no
    /// request is running, also after clients went away mid-request.
    pub fn flights_in_progress(&self) -> usize {
        fn n<T>(m: &Flights<T>) -> usize {
            m.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .len()
        }
        n(&self.rubric_flights) + n(&self.judge_flights)
    }
}

/// A turn's `meta`: a JSON object of at most [`MAX_META_BYTES`], on one line.
fn check_meta(meta: Option<Meta>) -> Result<Option<Meta>, String> {
    let Some(meta) = meta else {
        return Ok(None);
    };
    let text = meta.get();
    if text == "null" {
        return Ok(None);
    }
    if text.len() > MAX_META_BYTES {
        return Err(format!(
            "meta has {} bytes; at most {MAX_META_BYTES}: keep labels there, not data",
            text.len()
        ));
    }
    if !text.starts_with('{') {
        return Err(
            "meta must be a JSON object, e.g. {\"turn\": 3, \"emotion\": \"sadness\"}".to_owned(),
        );
    }
    Ok(crate::profile::minify(text)
        .and_then(|m| Meta::from_json(&m))
        .or(Some(meta)))
}

/// Flat scores as one list per dimension.
fn split(flat: &[f64], layout: &[usize]) -> Vec<Vec<f64>> {
    let mut out = Vec::with_capacity(layout.len());
    let mut rest = flat;
    for &n in layout {
        let (a, b) = rest.split_at(n.min(rest.len()));
        out.push(a.to_vec());
        rest = b;
    }
    out
}
