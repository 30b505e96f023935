//! `care serve`: the reward server.
//!
//! * `POST /get_reward`: OpenRLHF's remote reward-model protocol (`--remote_rm_url`): a batch
//!   `{"query": [...], "prompts": [...], "labels": [...]}`, answered with
//!   `{"rewards": [...], "scores": [...], "extra_logs": {...}}`, one number per query.
//! * `POST /v1/reward`: whole groups, `{"turns": [<care reward input line>, ...]}`, answered
//!   with `{"results": [<care reward output line without "line">, ...]}`.
//! * `GET /healthz`, `GET /metrics` (OpenMetrics text).
//!
//! A graceful shutdown (SIGINT, SIGTERM) stops accepting connections and finishes the
//! requests in flight within a deadline. Every size, count and duration a client controls is
//! capped ([`ServerOptions`]); the connection handling is in `server/net.rs`, the limits,
//! the memory budget and the bearer-token check in `server/limits.rs`.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::engine::{Engine, ErrorOut, OnFailure, TurnInput, TurnResult};
use crate::llm::ChatMessage;

mod limits;
mod net;

pub use limits::{
    Admission, BYTES_PER_JSON_VALUE, BudgetedBody, CLIENT_CLOSED, DEFAULT_MAX_BODY_BYTES,
    MAX_BYTES_LIMIT, MAX_COUNT_LIMIT, ServerOptions, exposure_warning, json_values_bound,
};
pub use net::Stopped;

use limits::{Budget, RequestGuard, admit, error_response};

#[derive(Debug)]
struct AppState {
    engine: Arc<Engine>,
    opts: ServerOptions,
    backend: &'static str,
    budget: Arc<Budget>,
}

/// The reward server: its routes with their shared state, and the connection limits of
/// [`Server::serve`].
#[derive(Debug, Clone)]
pub struct Server {
    state: Arc<AppState>,
    router: Router,
}

impl Server {
    /// The server of `engine` under `opts` (used as given: [`ServerOptions::check`] them
    /// first). `backend` is what `/healthz` reports (`http` or `scripted`).
    pub fn new(engine: Arc<Engine>, opts: ServerOptions, backend: &'static str) -> Server {
        let budget = Arc::new(Budget::new(&opts));
        let state = Arc::new(AppState {
            engine,
            opts,
            backend,
            budget,
        });
        let router = Router::new()
            .route("/get_reward", post(get_reward))
            .route("/v1/reward", post(reward_groups))
            .route("/metrics", get(metrics))
            // Every route above needs the key (when one is set); /healthz never does.
            .route_layer(middleware::from_fn_with_state(
                Arc::clone(&state),
                limits::require_key,
            ))
            .route("/healthz", get(healthz))
            .layer(DefaultBodyLimit::max(state.opts.max_body_bytes))
            .with_state(Arc::clone(&state));
        Server { state, router }
    }

    /// The routes (for a test, or another way to serve them).
    pub fn router(&self) -> Router {
        self.router.clone()
    }

    /// The server-wide budget in use now: (bytes, turns, responses). All 0 when no request
    /// is being read or rewarded, however the earlier ones ended.
    pub fn budget_in_use(&self) -> (usize, usize, usize) {
        self.state.budget.in_use()
    }

    /// Serves on `listener` until `shutdown` completes, then stops within the shutdown
    /// deadline: connections without a request in progress close at once, requests in
    /// progress get `shutdown_timeout` and are then cut. Header-read and idle timeout and the
    /// connection cap as in [`ServerOptions`].
    ///
    /// # Errors
    /// An I/O error of the listener.
    pub async fn serve(
        &self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<Stopped> {
        let o = &self.state.opts;
        net::run(
            listener,
            self.router(),
            net::ConnLimits {
                max_connections: o.max_connections,
                header_timeout: o.header_timeout,
                shutdown_timeout: o.shutdown_timeout,
            },
            Arc::clone(&self.state.budget),
            Arc::clone(self.state.engine.metrics()),
            shutdown,
        )
        .await
    }
}

/// The router (routes, limits, shared state) of [`Server::new`].
pub fn router(engine: Arc<Engine>, opts: ServerOptions, backend: &'static str) -> Router {
    Server::new(engine, opts, backend).router()
}

/// Serves `router` on `listener` until `shutdown` completes, then finishes the requests in
/// flight, with the connection limits of [`ServerOptions::default`]. [`Server::serve`] is the
/// whole of it: with a bare `Router` the stop cannot reach the routes' state, so a body still
/// arriving is not cut at once and the cut requests are not named.
///
/// # Errors
/// An I/O error of the listener.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let o = ServerOptions::default();
    let metrics = Arc::new(crate::metrics::Metrics::new());
    net::run(
        listener,
        router,
        net::ConnLimits {
            max_connections: o.max_connections,
            header_timeout: o.header_timeout,
            shutdown_timeout: o.shutdown_timeout,
        },
        Arc::new(Budget::new(&o)),
        metrics,
        shutdown,
    )
    .await
    .map(|_| ())
}

/// Completes on SIGINT (Ctrl-C) or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}

/// Runs `f` where it cannot stall the server: CPU work on a large request (decoding a body,
/// writing an answer) would otherwise hold a runtime worker, and with it the tasks queued
/// there (`/healthz` among them). On a multi-threaded runtime the worker hands its queue to
/// another thread first; on a current-thread runtime (tests) it just runs.
fn cpu<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// The status of a turn that the engine refused: the client's input (`bad_input`: 400), or a
/// fault of the server (`internal`, anything else: 500).
fn turn_error_status(e: &ErrorOut) -> StatusCode {
    if e.code == "bad_input" {
        StatusCode::BAD_REQUEST
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    }
}

/// A turn that could not be rewarded: 400 for a bad input, 503 with `Retry-After` when the
/// shared cache is down and refuses (the trainer asks again), 500 for a fault of the server's.
fn turn_error(e: &ErrorOut, message: String) -> Response {
    if e.code == crate::cache::CACHE_UNAVAILABLE {
        let mut r = error_response(StatusCode::SERVICE_UNAVAILABLE, &e.code, message);
        r.headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        return r;
    }
    error_response(turn_error_status(e), &e.code, message)
}

fn json_response(v: &impl Serialize) -> Response {
    match cpu(|| serde_json::to_string(v)) {
        Ok(s) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            s,
        )
            .into_response(),
        Err(e) => error_response(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()),
    }
}

/// Counts the request in the metrics whatever the handler answers, and also when it is
/// dropped unanswered (its client went away): see [`limits::RequestGuard`].
async fn timed<F: Future<Output = Response>>(
    state: &AppState,
    route: &'static str,
    f: F,
) -> Response {
    let mut guard = RequestGuard::new(state.engine.metrics(), &state.budget, route);
    let resp = f.await;
    guard.status = Some(resp.status().as_u16());
    resp
}

async fn healthz(State(s): State<Arc<AppState>>) -> Response {
    let st = Arc::clone(&s);
    timed(&s, "/healthz", async move {
        // A replica whose shared cache is down still answers (200), and says so.
        let cache = st.engine.cache().map(crate::cache::Cache::status);
        let degraded = cache.is_some_and(|c| c.state != "ok");
        let mut v = json!({
            "status": if degraded { "degraded" } else { "ok" },
            "backend": st.backend,
            "cache": cache.is_some(),
            "cache_backend": cache.map(|c| c.backend),
            "cache_state": cache.map(|c| c.state),
            "auth": st.opts.api_key.is_some(),
        });
        if let (Some(w), Some(o)) = (&st.opts.warning, v.as_object_mut()) {
            o.insert("warning".to_owned(), Value::String(w.clone()));
        }
        json_response(&v)
    })
    .await
}

async fn metrics(State(s): State<Arc<AppState>>) -> Response {
    // Rendered before this request is counted: a scrape does not see itself.
    let (b, t, r) = s.budget.in_use();
    s.engine.metrics().budget_in_use(b, t, r);
    let text = s.engine.metrics().render();
    timed(&s, "/metrics", async move {
        (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response()
    })
    .await
}

/// Runs turns concurrently; results in input order.
async fn run_turns(
    engine: &Arc<Engine>,
    turns: Vec<TurnInput>,
) -> Vec<Result<TurnResult, ErrorOut>> {
    let n = turns.len();
    let mut set = tokio::task::JoinSet::new();
    for (i, t) in turns.into_iter().enumerate() {
        let e = Arc::clone(engine);
        set.spawn(async move { (i, e.run_turn(t).await) });
    }
    let mut out: Vec<Option<Result<TurnResult, ErrorOut>>> = vec![None; n];
    while let Some(done) = set.join_next().await {
        if let Ok((i, r)) = done
            && let Some(slot) = out.get_mut(i)
        {
            *slot = Some(r);
        }
    }
    out.into_iter()
        .map(|r| {
            r.unwrap_or_else(|| {
                Err(ErrorOut {
                    code: "internal".to_owned(),
                    message: "a turn task ended without a result".to_owned(),
                })
            })
        })
        .collect()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GroupsRequest {
    turns: Vec<TurnInput>,
    #[serde(default)]
    on_failure: Option<String>,
}

async fn reward_groups(State(s): State<Arc<AppState>>, body: BudgetedBody) -> Response {
    let st = Arc::clone(&s);
    timed(&s, "/v1/reward", async move {
        let req: GroupsRequest = match cpu(|| serde_json::from_slice(&body)) {
            Ok(r) => r,
            Err(e) => return error_response(StatusCode::BAD_REQUEST, "bad_request", e.to_string()),
        };
        let _admitted = match admit(&st.opts, &st.budget, &req.turns, |t| format!("turns[{t}]")) {
            Ok(a) => a,
            Err(r) => return r,
        };
        let policy = match req
            .on_failure
            .as_deref()
            .map_or(Ok(OnFailure::Null), str::parse)
        {
            Ok(p) => p,
            Err(e) => return error_response(StatusCode::BAD_REQUEST, "bad_request", e),
        };
        let results = run_turns(&st.engine, req.turns).await;
        let mut out = Vec::with_capacity(results.len());
        // Under `error`, every turn's failures are named, not only the first turn's.
        let mut no_reward = Vec::new();
        for (i, r) in results.into_iter().enumerate() {
            let mut r = match r {
                Ok(r) => r,
                Err(e) => {
                    return turn_error(&e, format!("turns[{i}]: {}", e.message));
                }
            };
            match r.trainer_rewards(policy) {
                Ok(rw) => r.rewards = rw,
                Err(msg) => no_reward.push(format!("turns[{i}]: {msg}")),
            }
            out.push(r);
        }
        if !no_reward.is_empty() {
            return error_response(StatusCode::BAD_GATEWAY, "no_reward", no_reward.join("; "));
        }
        // A struct, not `json!`: the results keep the field order of `care reward`'s lines.
        #[derive(Serialize)]
        struct Results<'a> {
            results: &'a [TurnResult],
        }
        json_response(&Results { results: &out })
    })
    .await
}

#[derive(Deserialize)]
struct OpenRlhfRequest {
    query: Vec<String>,
    #[serde(default)]
    prompts: Option<Vec<String>>,
    #[serde(default)]
    labels: Option<Vec<Value>>,
}

/// What an OpenRLHF label (`--label_key`) gives a sample: its dialogue and its gold.
#[derive(Debug, Default, PartialEq)]
struct Label {
    context: Vec<ChatMessage>,
    gold: Option<Value>,
}

/// Reads one label: absent, `null` or `""` (OpenRLHF's label without `--label_key`) give
/// nothing; chat messages (a JSON array) the dialogue; an object `{"context": [...], "gold":
/// {...}}` (either member may be left out) the dialogue and the gold; a string holding any of
/// these reads as it. Anything else is refused: a label is never silently ignored.
fn label_of(label: Option<&Value>) -> Result<Label, String> {
    const FORMS: &str = "a label is chat messages [{\"role\",\"content\"}, ...], an object \
         {\"context\": [...], \"gold\": {\"emotion\": ...}}, or a JSON string of either";
    let parsed: Value = match label {
        None | Some(Value::Null) => return Ok(Label::default()),
        Some(Value::String(s)) if s.trim().is_empty() => return Ok(Label::default()),
        Some(Value::String(s)) => serde_json::from_str(s)
            .map_err(|e| format!("the label is a string that is not JSON ({e}): {FORMS}"))?,
        Some(v) => v.clone(),
    };
    let messages = |v: Value| {
        serde_json::from_value::<Vec<ChatMessage>>(v)
            .map_err(|e| format!("the label's dialogue is not chat messages ({e}): {FORMS}"))
    };
    match parsed {
        Value::Null => Ok(Label::default()),
        Value::Array(_) => Ok(Label {
            context: messages(parsed)?,
            gold: None,
        }),
        Value::Object(mut o) => {
            if let Some(k) = o.keys().find(|k| !matches!(k.as_str(), "context" | "gold")) {
                return Err(format!("the label has a member {k:?}: {FORMS}"));
            }
            let context = match o.remove("context") {
                None | Some(Value::Null) => Vec::new(),
                Some(v) => messages(v)?,
            };
            Ok(Label {
                context,
                gold: o.remove("gold").filter(|g| !g.is_null()),
            })
        }
        _ => Err(FORMS.to_owned()),
    }
}

/// The response of a query: the query without its prompt. A query whose start differs from the
/// prompt only in whitespace (a tokenizer's decode round trip can move spaces around special
/// tokens) is cut after the last character of the prompt.
fn response_of<'q>(query: &'q str, prompt: &str) -> Option<&'q str> {
    if let Some(r) = query.strip_prefix(prompt) {
        return Some(r);
    }
    let mut q = query.char_indices().peekable();
    for p in prompt.chars().filter(|c| !c.is_whitespace()) {
        loop {
            let (_, c) = q.next()?;
            if c == p {
                break;
            }
            if !c.is_whitespace() {
                return None;
            }
        }
    }
    Some(q.peek().map_or("", |&(i, _)| query.get(i..).unwrap_or("")))
}

/// Under `--on-failure error`: every query of the batch without a reward, across all groups,
/// by its index in the request (`query[i]`), with its group (one per distinct dialogue, in
/// order of first appearance), its place in the group, the group's rubric status and its own
/// status.
fn openrlhf_failures(results: &[Result<TurnResult, ErrorOut>], place: &[(usize, usize)]) -> String {
    let mut failed = Vec::new();
    let mut groups = std::collections::BTreeSet::new();
    for (i, &(t, j)) in place.iter().enumerate() {
        let Some(Ok(r)) = results.get(t) else {
            continue;
        };
        if let Some(resp) = r.responses.get(j).filter(|x| x.reward.is_none()) {
            groups.insert(t);
            failed.push(format!(
                "query[{i}] (group {t}, responses[{j}], rubric {}): {}",
                r.rubric_status, resp.status
            ));
        }
    }
    format!(
        "no reward for {} of {} queries in {} of {} groups (--on-failure error): {}",
        failed.len(),
        place.len(),
        groups.len(),
        results.len(),
        failed.join("; ")
    )
}

async fn get_reward(State(s): State<Arc<AppState>>, body: BudgetedBody) -> Response {
    let st = Arc::clone(&s);
    timed(&s, "/get_reward", async move {
        let req: OpenRlhfRequest = match cpu(|| serde_json::from_slice(&body)) {
            Ok(r) => r,
            Err(e) => return error_response(StatusCode::BAD_REQUEST, "bad_request", e.to_string()),
        };
        let n = req.query.len();
        if let Err(r) = limits::check_responses(&st.opts, n) {
            return r;
        }
        let Some(prompts) = req.prompts else {
            return error_response(
                StatusCode::BAD_REQUEST,
                "bad_request",
                "prompts is required: the response is the query without its prompt",
            );
        };
        if prompts.len() != n {
            return error_response(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("{n} queries but {} prompts", prompts.len()),
            );
        }
        if let Some(l) = &req.labels
            && l.len() != n
        {
            return error_response(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("{n} queries but {} labels", l.len()),
            );
        }
        // Group the samples by dialogue: one turn (one rubric) per distinct context (the label's,
        // else the templated prompt) and gold.
        let mut turns: Vec<TurnInput> = Vec::new();
        let mut index: HashMap<String, usize> = HashMap::new();
        let mut place: Vec<(usize, usize)> = Vec::with_capacity(n);
        for (i, (q, p)) in req.query.iter().zip(&prompts).enumerate() {
            let Some(resp) = response_of(q, p) else {
                return error_response(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    format!("query[{i}] does not start with prompts[{i}]"),
                );
            };
            let label = match label_of(req.labels.as_ref().and_then(|l| l.get(i))) {
                Ok(l) => l,
                Err(e) => {
                    return error_response(
                        StatusCode::BAD_REQUEST,
                        "bad_label",
                        format!("labels[{i}]: {e}"),
                    );
                }
            };
            let key = serde_json::to_string(&(&label.context, &label.gold, p)).unwrap_or_default();
            let t = *index.entry(key).or_insert_with(|| {
                turns.push(TurnInput {
                    context: label.context,
                    prompt: Some(p.clone()),
                    gold: label.gold,
                    ..TurnInput::default()
                });
                turns.len() - 1
            });
            let Some(turn) = turns.get_mut(t) else {
                return error_response(StatusCode::INTERNAL_SERVER_ERROR, "internal", "turn index");
            };
            place.push((t, turn.responses.len()));
            turn.responses.push(resp.trim().to_owned());
        }
        let first_query = |t: usize| {
            let q = place.iter().position(|&(tt, _)| tt == t).unwrap_or(0);
            format!("the dialogue of query[{q}]")
        };
        let _admitted = match admit(&st.opts, &st.budget, &turns, first_query) {
            Ok(a) => a,
            Err(r) => return r,
        };
        let results = run_turns(&st.engine, turns).await;
        let mut per_turn: Vec<(Vec<Option<f64>>, &TurnResult)> = Vec::with_capacity(results.len());
        let mut any_failed = false;
        for (t, r) in results.iter().enumerate() {
            let r = match r {
                Ok(r) => r,
                Err(e) => {
                    let first = place.iter().position(|&(tt, _)| tt == t).unwrap_or(0);
                    return turn_error(e, format!("query[{first}]: {}", e.message));
                }
            };
            match r.trainer_rewards(st.opts.openrlhf_on_failure) {
                Ok(rw) => per_turn.push((rw, r)),
                Err(_) => {
                    any_failed = true;
                    per_turn.push((Vec::new(), r));
                }
            }
        }
        if any_failed {
            let msg = openrlhf_failures(&results, &place);
            return error_response(StatusCode::BAD_GATEWAY, "no_reward", msg);
        }
        let mut rewards = Vec::with_capacity(n);
        let mut valid = Vec::with_capacity(n);
        let mut rubric_ok = Vec::with_capacity(n);
        let mut judge_attempts = Vec::with_capacity(n);
        let mut panel_logs = Vec::with_capacity(n);
        let mut template_parsed = Vec::with_capacity(n);
        let mut stripped = Vec::with_capacity(n);
        for &(t, j) in &place {
            let Some((rw, r)) = per_turn.get(t) else {
                return error_response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "turn result",
                );
            };
            let resp = r.responses.get(j);
            // `null` only under the `null` policy: honest, and loud in a trainer that needs numbers.
            rewards.push(rw.get(j).copied().flatten());
            valid.push(if resp.is_some_and(|x| x.reward.is_some()) {
                1.0
            } else {
                0.0
            });
            rubric_ok.push(if r.rubric_status == crate::engine::rubric_status::OK {
                1.0
            } else {
                0.0
            });
            judge_attempts.push(f64::from(resp.map_or(0, |x| x.judge_attempts)));
            panel_logs.push(resp.and_then(|x| x.panel.as_ref()));
            let parsed = r
                .template
                .as_ref()
                .is_some_and(|x| x.status == crate::template::template_status::PARSED);
            template_parsed.push(if parsed { 1.0 } else { 0.0 });
            stripped.push(if resp.is_some_and(|x| x.stripped.is_some()) {
                1.0
            } else {
                0.0
            });
        }
        let mut body = json!({
            "rewards": rewards,
            "scores": rewards,
            "extra_logs": {
                "care_valid": valid,
                "care_rubric_ok": rubric_ok,
                "care_judge_attempts": judge_attempts,
                "care_template_parsed": template_parsed,
                "care_stripped": stripped,
            }
        });
        if st.engine.panel_agreement().is_some()
            && let Some(logs) = body.get_mut("extra_logs").and_then(Value::as_object_mut)
        {
            logs.extend(crate::panel::extra_logs(&panel_logs));
        }
        json_response(&body)
    })
    .await
}
