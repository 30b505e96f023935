//! What `care serve` takes from its clients, and how much: the options with their caps, the
//! server-wide budget of bytes, turns and responses in flight, the body reader that charges
//! that budget as the bytes arrive, the admission of decoded requests, and the optional
//! bearer-token check.
//!
//! Every limit has a stated default and cap (`docs/REWARD_LOOP.md`), and
//! `docs/RELIABILITY.md` gives the memory bound they add up to. A request over a per-request
//! limit is answered 413, one that the server cannot take now (the budget is in use by
//! others) 429 with `Retry-After`, both with the JSON error of every other refusal.

// The refusals are the answers themselves (axum's `Response`, as its extractors reject).
#![allow(clippy::result_large_err)]

use std::net::SocketAddr;
use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use serde_json::json;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::{MAX_SECS, checked_secs};
use crate::engine::{OnFailure, TurnInput};
use crate::metrics::Metrics;

use super::AppState;

/// Largest request body by default (a rollout batch of a few thousand responses).
pub const DEFAULT_MAX_BODY_BYTES: usize = 64 << 20;

/// Largest `max_body_bytes` and `max_inflight_bytes` accepted (the budget counts bytes in
/// `u32` steps).
pub const MAX_BYTES_LIMIT: usize = 1 << 30;

/// Most turns or responses any count limit accepts.
pub const MAX_COUNT_LIMIT: usize = 1 << 24;

/// Bytes charged per JSON value of a body on top of its length, for its decoded form (a
/// `serde_json::Value` is 32 bytes, a `String` 24, a map entry about 100 with its node, and
/// a vector may hold up to twice its length while it grows). Charged before decoding, so a
/// body of many tiny values (`[0,0,0,...]`: 2 bytes each) cannot decode into 16 times its
/// size unnoticed. `loop/tests/budget.rs` counts the bytes a decode really allocates against
/// this charge.
pub const BYTES_PER_JSON_VALUE: usize = 160;

/// Everything `care serve` needs besides the engine. [`ServerOptions::check`] checks every
/// field (the command line calls it; [`super::router`] uses the fields as given). Its `Debug`
/// shows whether there is an API key, never the key.
#[derive(Clone)]
pub struct ServerOptions {
    /// What `/get_reward` answers for a response without a reward (OpenRLHF has no validity
    /// mask and cannot read `null`): [`OnFailure::GroupMean`] or [`OnFailure::Error`].
    pub openrlhf_on_failure: OnFailure,
    /// Largest request body (413 above it).
    pub max_body_bytes: usize,
    /// Most turns (distinct dialogues) in one request (413 above it).
    pub max_turns: usize,
    /// Most responses in one request (413 above it).
    pub max_responses: usize,
    /// Largest dialogue of one turn (the bytes of its messages' contents) and largest single
    /// response (413 above it): what one LLM prompt carries from the request.
    pub max_text_bytes: usize,
    /// Bytes of request bodies held at once, server-wide, each body with
    /// [`BYTES_PER_JSON_VALUE`] per JSON value for its decoded form (429 when in use).
    pub max_inflight_bytes: usize,
    /// Turns being rewarded at once, server-wide (429 when in use).
    pub max_inflight_turns: usize,
    /// Responses being rewarded at once, server-wide (429 when in use).
    pub max_inflight_responses: usize,
    /// Open connections at once; one more is answered 503 and closed.
    pub max_connections: usize,
    /// From accepting a connection, or from the end of the last response on a kept-alive
    /// one, to the end of the next request's headers: the header-read timeout and the idle
    /// keep-alive timeout in one (hyper's timer runs from the moment it waits for a head).
    pub header_timeout: Duration,
    /// From the end of the headers to the last byte of the body (408 after it).
    pub body_timeout: Duration,
    /// After SIGINT or SIGTERM: how long the requests in flight may still run; then they are
    /// cut and the server stops, saying what it cut.
    pub shutdown_timeout: Duration,
    /// The bearer token every route except `/healthz` requires (`None`: no authentication).
    pub api_key: Option<String>,
    /// A warning `/healthz` repeats (set by [`exposure_warning`] when the server listens beyond
    /// loopback without a key).
    pub warning: Option<String>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            openrlhf_on_failure: OnFailure::GroupMean,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_turns: 2048,
            max_responses: 16384,
            max_text_bytes: 1 << 20,
            max_inflight_bytes: 256 << 20,
            max_inflight_turns: 2048,
            max_inflight_responses: 65536,
            max_connections: 1024,
            header_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(120),
            shutdown_timeout: Duration::from_secs(30),
            api_key: None,
            warning: None,
        }
    }
}

impl std::fmt::Debug for ServerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerOptions")
            .field("openrlhf_on_failure", &self.openrlhf_on_failure)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("max_turns", &self.max_turns)
            .field("max_responses", &self.max_responses)
            .field("max_text_bytes", &self.max_text_bytes)
            .field("max_inflight_bytes", &self.max_inflight_bytes)
            .field("max_inflight_turns", &self.max_inflight_turns)
            .field("max_inflight_responses", &self.max_inflight_responses)
            .field("max_connections", &self.max_connections)
            .field("header_timeout", &self.header_timeout)
            .field("body_timeout", &self.body_timeout)
            .field("shutdown_timeout", &self.shutdown_timeout)
            .field("api_key", &self.api_key.as_ref().map(|_| "<set>"))
            .field("warning", &self.warning)
            .finish()
    }
}

impl ServerOptions {
    /// Checks every limit against its range and the per-request limits against the
    /// server-wide ones (a request the server could never take is a configuration error).
    ///
    /// # Errors
    /// A message naming the flag and its accepted range.
    pub fn check(&self) -> Result<(), String> {
        let count = |flag: &str, v: usize, max: usize| {
            if v == 0 || v > max {
                Err(format!("{flag} {v} must be in 1..={max}"))
            } else {
                Ok(())
            }
        };
        count("--max-body-bytes", self.max_body_bytes, MAX_BYTES_LIMIT)?;
        count(
            "--max-inflight-bytes",
            self.max_inflight_bytes,
            MAX_BYTES_LIMIT,
        )?;
        count("--max-text-bytes", self.max_text_bytes, MAX_BYTES_LIMIT)?;
        count("--max-turns", self.max_turns, MAX_COUNT_LIMIT)?;
        count("--max-responses", self.max_responses, MAX_COUNT_LIMIT)?;
        count(
            "--max-inflight-turns",
            self.max_inflight_turns,
            MAX_COUNT_LIMIT,
        )?;
        count(
            "--max-inflight-responses",
            self.max_inflight_responses,
            MAX_COUNT_LIMIT,
        )?;
        count("--max-connections", self.max_connections, 1 << 20)?;
        for (flag, small, large) in [
            (
                "--max-body-bytes",
                self.max_body_bytes,
                self.max_inflight_bytes,
            ),
            ("--max-turns", self.max_turns, self.max_inflight_turns),
            (
                "--max-responses",
                self.max_responses,
                self.max_inflight_responses,
            ),
        ] {
            if small > large {
                return Err(format!(
                    "{flag} {small} is more than the server-wide limit {large} (--max-inflight-*): such a request could never be taken"
                ));
            }
        }
        for (flag, d, min) in [
            ("--header-timeout-secs", self.header_timeout, 0.1),
            ("--body-timeout-secs", self.body_timeout, 0.1),
            ("--shutdown-timeout-secs", self.shutdown_timeout, 0.0),
        ] {
            checked_secs(flag, d.as_secs_f64(), min, MAX_SECS)?;
        }
        if self.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
            return Err("the API key is empty: set a non-empty token".to_owned());
        }
        Ok(())
    }
}

/// The warning for a server that listens beyond loopback without a key (`None` otherwise):
/// anyone who reaches the port spends the LLM endpoints' keys and capacity.
pub fn exposure_warning(addr: &SocketAddr, authenticated: bool) -> Option<String> {
    if authenticated || addr.ip().is_loopback() {
        return None;
    }
    Some(format!(
        "listening on {addr} without authentication: anyone who can reach this port can call the judge and generator endpoints (and spend their API keys) through POST /get_reward and /v1/reward, and read /metrics; pass --api-key-env NAME, or listen on 127.0.0.1"
    ))
}

/// The server-wide budget and the requests in flight by route (for the shutdown report).
#[derive(Debug)]
pub(crate) struct Budget {
    bytes: Arc<Semaphore>,
    turns: Arc<Semaphore>,
    responses: Arc<Semaphore>,
    limits: (usize, usize, usize),
    in_flight: [AtomicUsize; ROUTES.len()],
    /// Set when the server stops: a body still arriving is then cut (its request has done
    /// nothing yet, so there is nothing to finish).
    pub(crate) stopping: tokio::sync::watch::Sender<bool>,
}

/// The routes with their own metrics label; anything else is `other`.
pub(crate) const ROUTES: [&str; 5] = ["/get_reward", "/v1/reward", "/healthz", "/metrics", "other"];

/// The metrics label of a request path.
pub(crate) fn route_label(path: &str) -> &'static str {
    ROUTES
        .iter()
        .find(|r| **r == path)
        .copied()
        .unwrap_or("other")
}

impl Budget {
    pub(crate) fn new(o: &ServerOptions) -> Budget {
        let (b, t, r) = (
            o.max_inflight_bytes.min(Semaphore::MAX_PERMITS),
            o.max_inflight_turns.min(Semaphore::MAX_PERMITS),
            o.max_inflight_responses.min(Semaphore::MAX_PERMITS),
        );
        Budget {
            bytes: Arc::new(Semaphore::new(b)),
            turns: Arc::new(Semaphore::new(t)),
            responses: Arc::new(Semaphore::new(r)),
            limits: (b, t, r),
            in_flight: Default::default(),
            stopping: tokio::sync::watch::Sender::new(false),
        }
    }

    /// (bytes, turns, responses) in use now.
    pub(crate) fn in_use(&self) -> (usize, usize, usize) {
        (
            self.limits.0 - self.bytes.available_permits(),
            self.limits.1 - self.turns.available_permits(),
            self.limits.2 - self.responses.available_permits(),
        )
    }

    /// Requests whose handler runs now, by route (label, count), the empty ones left out.
    pub(crate) fn requests_in_flight(&self) -> Vec<(&'static str, usize)> {
        ROUTES
            .iter()
            .zip(&self.in_flight)
            .map(|(r, n)| (*r, n.load(Ordering::SeqCst)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    fn slot(&self, route: &'static str) -> &AtomicUsize {
        let i = ROUTES
            .iter()
            .position(|r| *r == route)
            .unwrap_or(ROUTES.len() - 1);
        &self.in_flight[i]
    }
}

/// One request while its handler runs: in flight in the metrics and the budget's count, and
/// counted in `care_http_requests_total` when it ends, however it ends. A handler dropped
/// because its client went away still decrements the gauge and is counted, with the status
/// 499 (nginx's "client closed request").
pub(crate) struct RequestGuard<'a> {
    metrics: &'a Metrics,
    budget: &'a Budget,
    route: &'static str,
    started: Instant,
    /// The status answered; `None` until the handler returned.
    pub(crate) status: Option<u16>,
}

/// The status counted for a request whose handler was dropped before it answered.
pub const CLIENT_CLOSED: u16 = 499;

impl<'a> RequestGuard<'a> {
    pub(crate) fn new(metrics: &'a Metrics, budget: &'a Budget, route: &'static str) -> Self {
        metrics.in_flight(1);
        budget.slot(route).fetch_add(1, Ordering::SeqCst);
        RequestGuard {
            metrics,
            budget,
            route,
            started: Instant::now(),
            status: None,
        }
    }
}

impl Drop for RequestGuard<'_> {
    fn drop(&mut self) {
        self.metrics.in_flight(-1);
        self.budget.slot(self.route).fetch_sub(1, Ordering::SeqCst);
        self.metrics.http_request(
            self.route,
            self.status.unwrap_or(CLIENT_CLOSED),
            self.started.elapsed(),
        );
    }
}

/// A JSON error answer (the shape of every error of the server).
pub(crate) fn error_response(
    status: StatusCode,
    code: &str,
    message: impl Into<String>,
) -> Response {
    let body = json!({"error": {"code": code, "message": message.into()}});
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// 429 with `Retry-After: 1`: the server is busy with other requests; the same request may
/// be taken in a moment.
fn busy(what: &str) -> Response {
    let mut r = error_response(
        StatusCode::TOO_MANY_REQUESTS,
        "busy",
        format!("{what}; retry later"),
    );
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

/// A request body, read under the limits and charged to the server's byte budget for as
/// long as it lives (its bytes, and [`BYTES_PER_JSON_VALUE`] per JSON value for what it
/// decodes into).
#[derive(Debug)]
pub struct BudgetedBody {
    bytes: Bytes,
    _charge: OwnedSemaphorePermit,
}

impl Deref for BudgetedBody {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl FromRequest<Arc<AppState>> for BudgetedBody {
    type Rejection = Response;

    async fn from_request(req: Request, state: &Arc<AppState>) -> Result<Self, Response> {
        let started = Instant::now();
        let route = route_label(req.uri().path());
        let metrics = state.engine.metrics();
        let refuse = |r: Response| {
            // Refused before its handler ran: counted here.
            metrics.http_request(route, r.status().as_u16(), started.elapsed());
            r
        };
        read_body(req.into_body(), &state.opts, &state.budget)
            .await
            .map_err(refuse)
    }
}

/// Reads `body` under the limits: a `Content-Length` above the cap is refused before a byte
/// is read; bytes are charged to the budget as they arrive (with the JSON values they decode
/// into once all are in); the whole body must arrive within `body_timeout`.
async fn read_body(
    mut body: Body,
    opts: &ServerOptions,
    budget: &Budget,
) -> Result<BudgetedBody, Response> {
    let cap = opts.max_body_bytes;
    let too_large = |n: usize| {
        error_response(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!(
                "the body has more than {cap} bytes ({n} read or announced); the limit is --max-body-bytes"
            ),
        )
    };
    let declared = http_body::Body::size_hint(&body).exact();
    let declared = declared.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    if let Some(n) = declared.filter(|&n| n > cap) {
        return Err(too_large(n));
    }
    let charge = |n: usize| {
        u32::try_from(n)
            .ok()
            .and_then(|n| Arc::clone(&budget.bytes).try_acquire_many_owned(n).ok())
            .ok_or_else(|| {
                busy("the server holds as many request bytes as --max-inflight-bytes allows")
            })
    };
    let mut permit = charge(declared.unwrap_or(0))?;
    let mut charged = declared.unwrap_or(0);
    let mut buf: Vec<u8> = Vec::with_capacity(declared.unwrap_or(0));
    let deadline = tokio::time::Instant::now() + opts.body_timeout;
    let mut stopping = budget.stopping.subscribe();
    loop {
        if *stopping.borrow_and_update() {
            return Err(error_response(
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting_down",
                "the server is stopping; the body had not arrived: send the request to another server or later",
            ));
        }
        let next = tokio::select! {
            f = tokio::time::timeout_at(deadline, body.frame()) => f,
            _ = stopping.changed() => continue,
        };
        let frame = match next {
            Err(_) => {
                return Err(error_response(
                    StatusCode::REQUEST_TIMEOUT,
                    "body_timeout",
                    format!(
                        "the body did not arrive within {} s (--body-timeout-secs); {} bytes came",
                        opts.body_timeout.as_secs_f64(),
                        buf.len()
                    ),
                ));
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                return Err(error_response(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    format!("the body could not be read: {e}"),
                ));
            }
            Ok(Some(Ok(f))) => f,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let len = buf.len().saturating_add(data.len());
        if len > cap {
            return Err(too_large(len));
        }
        if len > charged {
            permit.merge(charge(len - charged)?);
            charged = len;
        }
        buf.extend_from_slice(&data);
    }
    // The decoded form, charged before it exists.
    let extra = json_values_bound(&buf).saturating_mul(BYTES_PER_JSON_VALUE);
    let total = buf.len().saturating_add(extra);
    if total > opts.max_inflight_bytes {
        return Err(error_response(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!(
                "the body of {} bytes holds up to {} JSON values, which decode into up to {total} bytes; at most {} (--max-inflight-bytes) are taken",
                buf.len(),
                extra / BYTES_PER_JSON_VALUE,
                opts.max_inflight_bytes
            ),
        ));
    }
    if total > charged {
        permit.merge(charge(total - charged)?);
    }
    Ok(BudgetedBody {
        bytes: Bytes::from(buf),
        _charge: permit,
    })
}

/// An upper bound on the number of JSON values in `b` (each container, and one more per
/// `,` and `:` outside strings): what decoding it can allocate, counted in one pass.
pub fn json_values_bound(b: &[u8]) -> usize {
    let (mut n, mut in_str, mut esc) = (1usize, false, false);
    for &c in b {
        if in_str {
            if esc {
                esc = false;
            } else if c == b'\\' {
                esc = true;
            } else if c == b'"' {
                in_str = false;
            }
        } else {
            match c {
                b'"' => in_str = true,
                b'{' | b'[' | b',' | b':' => n += 1,
                _ => {}
            }
        }
    }
    n
}

/// 413 when one request holds more than `max_responses` responses (checked as soon as the
/// count is known, before any work per response).
pub(crate) fn check_responses(opts: &ServerOptions, responses: usize) -> Result<(), Response> {
    if responses > opts.max_responses {
        return Err(error_response(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_many_responses",
            format!(
                "{responses} responses in one request; at most {} (--max-responses): send smaller batches",
                opts.max_responses
            ),
        ));
    }
    Ok(())
}

/// A decoded request taken into the budget of turns and responses; released when dropped.
#[derive(Debug)]
pub struct Admission {
    _turns: OwnedSemaphorePermit,
    _responses: OwnedSemaphorePermit,
}

/// Checks a decoded request against the per-request limits (413) and takes its turns and
/// responses from the server-wide budget (429 when others hold it). `name(t)` names turn `t`
/// for the client (`turns[3]`, or the first query of its group).
pub(crate) fn admit(
    opts: &ServerOptions,
    budget: &Budget,
    turns: &[TurnInput],
    name: impl Fn(usize) -> String,
) -> Result<Admission, Response> {
    let too_large = |code: &str, m: String| error_response(StatusCode::PAYLOAD_TOO_LARGE, code, m);
    if turns.len() > opts.max_turns {
        return Err(too_large(
            "too_many_turns",
            format!(
                "{} turns (distinct dialogues) in one request; at most {} (--max-turns): send smaller batches",
                turns.len(),
                opts.max_turns
            ),
        ));
    }
    let responses: usize = turns.iter().map(|t| t.responses.len()).sum();
    check_responses(opts, responses)?;
    let x = opts.max_text_bytes;
    for (t, turn) in turns.iter().enumerate() {
        let dialogue: usize = turn.context.iter().map(|m| m.content.len()).sum();
        if dialogue > x {
            return Err(too_large(
                "text_too_long",
                format!(
                    "{}: the dialogue holds {dialogue} bytes; at most {x} (--max-text-bytes)",
                    name(t)
                ),
            ));
        }
        if let Some((j, r)) = turn.responses.iter().enumerate().find(|(_, r)| r.len() > x) {
            return Err(too_large(
                "text_too_long",
                format!(
                    "{}: response {j} holds {} bytes; at most {x} (--max-text-bytes)",
                    name(t),
                    r.len()
                ),
            ));
        }
    }
    let take = |s: &Arc<Semaphore>, n: usize, what: &str| {
        u32::try_from(n)
            .ok()
            .and_then(|n| Arc::clone(s).try_acquire_many_owned(n).ok())
            .ok_or_else(|| {
                busy(&format!(
                    "the server is rewarding as many {what} as it takes at once"
                ))
            })
    };
    Ok(Admission {
        _turns: take(&budget.turns, turns.len(), "turns (--max-inflight-turns)")?,
        _responses: take(
            &budget.responses,
            responses,
            "responses (--max-inflight-responses)",
        )?,
    })
}

/// Every route but `/healthz` requires `Authorization: Bearer <key>` when a key is set. The
/// two tokens are compared by their SHA-256 digests in constant time, so neither the
/// position of the first differing byte nor the key's length shows in the time taken.
pub(crate) async fn require_key(
    State(st): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    let Some(key) = st.opts.api_key.as_deref() else {
        return next.run(req).await;
    };
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    let ok: bool = Sha256::digest(given.as_bytes())
        .ct_eq(&Sha256::digest(key.as_bytes()))
        .into();
    if ok {
        return next.run(req).await;
    }
    let route = route_label(req.uri().path());
    st.engine
        .metrics()
        .http_request(route, StatusCode::UNAUTHORIZED.as_u16(), Duration::ZERO);
    let mut r = error_response(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "this server requires Authorization: Bearer <key> (the key of care serve --api-key-env)",
    );
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    r
}
