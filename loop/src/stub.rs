//! **A test double**: an OpenAI-compatible chat-completions stub server on the loopback
//! address, for the tests and the load test (an LLM cannot run here).
//!
//! It is a real HTTP server (axum on a real socket); only the answers are scripted: a closure
//! sees each request and returns a [`StubReply`] (an answer, optionally after a delay, an HTTP
//! error status, a stall that never answers, or a body that is not a chat completion). Every
//! request is recorded, so tests can count calls per role and per dialogue.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::llm::{ChatMessage, Role};

/// The paper's `rubric_sft_1` (a valid rubric: 3, 2 and 3 criteria).
pub const PAPER_RUBRIC: &str = include_str!("../../cli/data/rubric_sft_1.json");

/// One recorded request.
#[derive(Clone, Debug)]
pub struct StubRequest {
    /// Generator when the first message is a system message, else judge.
    pub role: Role,
    /// The `model` field.
    pub model: String,
    /// The messages.
    pub messages: Vec<ChatMessage>,
    /// The whole request body.
    pub body: Value,
}

impl StubRequest {
    /// The judged response (judge requests: the text under "Candidate supporter response",
    /// up to the rubric in the paper layout, to the end of the prompt in the shared-prefix one).
    pub fn judged_response(&self) -> Option<&str> {
        let p = &self.messages.first()?.content;
        let start = p.find("## Candidate supporter response\n")?
            + "## Candidate supporter response\n".len();
        let rest = p.get(start..)?;
        Some(match rest.find("\n\n## Rubric") {
            Some(end) => &rest[..end],
            None => rest.strip_suffix('\n').unwrap_or(rest),
        })
    }

    /// The seeker's latest turn as the generator sees it (generator requests: the last line
    /// of the transcript).
    pub fn transcript(&self) -> Option<&str> {
        self.messages.get(1).map(|m| m.content.as_str())
    }

    /// Whether this is a retry (repair or judge retry): the request carries an earlier answer.
    pub fn is_retry(&self) -> bool {
        // First requests: generator (system, user), judge (user).
        let first_len = if self.role == Role::Generator { 2 } else { 1 };
        self.messages.len() > first_len
    }
}

/// What the stub answers.
#[derive(Clone, Debug)]
pub enum StubReply {
    /// A chat completion with this content.
    Content(String),
    /// A chat completion with this content, after this delay.
    Delayed(String, Duration),
    /// An HTTP error status, with an optional `Retry-After` (seconds).
    Status(u16, Option<u64>),
    /// Never answers (the client's timeout must end it).
    Stall,
    /// A 200 answer whose body is this text (not a chat completion).
    Raw(String),
    /// An HTTP error status with this `Retry-After` text as sent (`1e20`, `inf`, a date).
    StatusRetryAfter(u16, String),
    /// A 200 JSON answer of `bytes` bytes, sent in pieces as the client reads them (never held
    /// whole by the stub); with `declared`, a `Content-Length` announces the size first.
    Huge {
        /// Body size.
        bytes: u64,
        /// Send a `Content-Length`.
        declared: bool,
    },
    /// A 200 `text/event-stream` of these `data:` events (chat completion chunks, or
    /// anything), then `data: [DONE]`.
    Sse(Vec<String>),
    /// A 200 `text/event-stream` of chunks that never ends.
    EndlessSse,
}

type Script = dyn Fn(&StubRequest, usize) -> StubReply + Send + Sync;

struct StubState {
    script: Box<Script>,
    calls: Mutex<Vec<StubRequest>>,
    /// Bytes of the made-on-the-fly bodies handed to the connection so far.
    streamed: std::sync::atomic::AtomicU64,
}

/// A running stub; stops when dropped.
pub struct Stub {
    addr: SocketAddr,
    state: Arc<StubState>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Stub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stub").field("addr", &self.addr).finish()
    }
}

impl Drop for Stub {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Stub {
    /// Starts a stub on `127.0.0.1` (a free port); `script(request, n)` answers the `n`-th
    /// request (0-based, all roles).
    ///
    /// # Errors
    /// The port cannot be bound.
    pub async fn start(
        script: impl Fn(&StubRequest, usize) -> StubReply + Send + Sync + 'static,
    ) -> std::io::Result<Stub> {
        Self::start_on("127.0.0.1:0", script).await
    }

    /// [`Stub::start`] on `addr` (a load test whose server runs in another process points it
    /// at a known port).
    ///
    /// # Errors
    /// The address cannot be bound.
    pub async fn start_on(
        addr: &str,
        script: impl Fn(&StubRequest, usize) -> StubReply + Send + Sync + 'static,
    ) -> std::io::Result<Stub> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(StubState {
            script: Box::new(script),
            calls: Mutex::new(Vec::new()),
            streamed: std::sync::atomic::AtomicU64::new(0),
        });
        let app = Router::new()
            .route("/v1/chat/completions", post(handle))
            .route("/stub/calls", get(calls))
            .with_state(Arc::clone(&state));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Stub { addr, state, task })
    }

    /// `http://127.0.0.1:<port>/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Every request so far.
    pub fn calls(&self) -> Vec<StubRequest> {
        self.state
            .calls
            .lock()
            .map(|c| c.clone())
            .unwrap_or_default()
    }

    /// Requests of `role` so far.
    pub fn count(&self, role: Role) -> usize {
        self.calls().iter().filter(|c| c.role == role).count()
    }

    /// Bytes of the [`StubReply::Huge`] and [`StubReply::EndlessSse`] bodies produced so far:
    /// each piece is produced only when the connection takes it, so this is what the client
    /// read plus what the sockets buffer.
    pub fn streamed_bytes(&self) -> u64 {
        self.state
            .streamed
            .load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// `GET /stub/calls`: every request so far, `[{"role": "generator" | "judge", "messages": [...]}]`
/// (for tests in another process, such as the Python trainer tests).
async fn calls(State(s): State<Arc<StubState>>) -> Response {
    let list: Vec<Value> = s
        .calls
        .lock()
        .map(|c| {
            c.iter()
                .map(|r| json!({"role": r.role.as_str(), "messages": r.messages}))
                .collect()
        })
        .unwrap_or_default();
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        Value::Array(list).to_string(),
    )
        .into_response()
}

async fn handle(State(s): State<Arc<StubState>>, body: Bytes) -> Response {
    let Ok(v) = serde_json::from_slice::<Value>(&body) else {
        return (StatusCode::BAD_REQUEST, "not json").into_response();
    };
    let messages: Vec<ChatMessage> = v
        .get("messages")
        .cloned()
        .and_then(|m| serde_json::from_value(m).ok())
        .unwrap_or_default();
    let role = if messages.first().is_some_and(|m| m.role == "system") {
        Role::Generator
    } else {
        Role::Judge
    };
    let req = StubRequest {
        role,
        model: v
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
        messages,
        body: v,
    };
    let n = {
        let Ok(mut calls) = s.calls.lock() else {
            return (StatusCode::INTERNAL_SERVER_ERROR, "lock").into_response();
        };
        calls.push(req.clone());
        calls.len() - 1
    };
    match (s.script)(&req, n) {
        StubReply::Content(c) => completion(&req, &c),
        StubReply::Delayed(c, d) => {
            tokio::time::sleep(d).await;
            completion(&req, &c)
        }
        StubReply::Status(code, retry_after) => {
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mut r = (
                status,
                json!({"error": {"message": "stub error"}}).to_string(),
            )
                .into_response();
            if let Some(secs) = retry_after
                && let Ok(h) = secs.to_string().parse()
            {
                r.headers_mut().insert(header::RETRY_AFTER, h);
            }
            r
        }
        StubReply::Stall => std::future::pending().await,
        StubReply::Raw(text) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            text,
        )
            .into_response(),
        StubReply::StatusRetryAfter(code, value) => {
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mut r = (status, "{\"error\":{\"message\":\"stub error\"}}").into_response();
            if let Ok(h) = value.parse() {
                r.headers_mut().insert(header::RETRY_AFTER, h);
            }
            r
        }
        StubReply::Huge { bytes, declared } => {
            // A JSON string that never ends within the body: only a cap stops a reader.
            let mut r = Response::new(axum::body::Body::new(Repeat {
                state: Arc::clone(&s),
                head: Some(Bytes::from_static(
                    b"{\"choices\":[{\"message\":{\"content\":\"",
                )),
                chunk: Bytes::from(vec![b'a'; 64 << 10]),
                left: Some(bytes),
            }));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("application/json"),
            );
            if declared {
                r.headers_mut()
                    .insert(header::CONTENT_LENGTH, header::HeaderValue::from(bytes));
            }
            r
        }
        StubReply::Sse(events) => {
            let mut body = String::new();
            for e in events.iter().map(String::as_str).chain(["[DONE]"]) {
                body.push_str("data: ");
                body.push_str(e);
                body.push_str("\n\n");
            }
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "text/event-stream")],
                body,
            )
                .into_response()
        }
        StubReply::EndlessSse => {
            let event = format!(
                "data: {}\n\n",
                json!({"choices": [{"index": 0, "delta": {"content": "a".repeat(8000)}}]})
            );
            let mut r = Response::new(axum::body::Body::new(Repeat {
                state: Arc::clone(&s),
                head: None,
                chunk: Bytes::from(event.repeat(8)),
                left: None,
            }));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("text/event-stream"),
            );
            r
        }
    }
}

/// A body made on the fly: `head`, then `chunk` over and over, `left` bytes in all (`None`:
/// without end). Each piece is produced when the connection can take it, so a huge or endless
/// answer costs the stub one chunk of memory.
struct Repeat {
    state: Arc<StubState>,
    head: Option<Bytes>,
    chunk: Bytes,
    left: Option<u64>,
}

impl axum::body::HttpBody for Repeat {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let next = self.head.take().unwrap_or_else(|| self.chunk.clone());
        let piece = match self.left {
            None => next,
            Some(0) => return std::task::Poll::Ready(None),
            Some(n) => {
                let k = usize::try_from(n).unwrap_or(usize::MAX).min(next.len());
                self.left = Some(n - k as u64);
                next.slice(..k)
            }
        };
        self.state
            .streamed
            .fetch_add(piece.len() as u64, std::sync::atomic::Ordering::SeqCst);
        std::task::Poll::Ready(Some(Ok(http_body::Frame::data(piece))))
    }
}

fn completion(req: &StubRequest, content: &str) -> Response {
    let prompt_chars: usize = req.messages.iter().map(|m| m.content.len()).sum();
    let body = json!({
        "id": "stub",
        "object": "chat.completion",
        "model": req.model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        // Roughly 4 characters a token, as the usage field of a real server would count.
        "usage": {"prompt_tokens": prompt_chars / 4, "completion_tokens": content.len() / 4},
    });
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// A judge answer giving every criterion of `rubric` the score `score` (bare JSON).
pub fn judge_answer(rubric: &str, score: u8) -> String {
    let v: Value = serde_json::from_str(rubric).unwrap_or(Value::Null);
    let mut items = Vec::new();
    if let Some(cats) = v.get("categories").and_then(Value::as_array) {
        for c in cats {
            let cat = c.get("category").and_then(Value::as_str).unwrap_or("");
            for k in c
                .get("criteria")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let title = k.get("title").and_then(Value::as_str).unwrap_or("");
                items.push(json!({"category": cat, "criterion_title": title, "score": score}));
            }
        }
    }
    json!({ "criterion_scores": items }).to_string()
}

/// The `(category, title)` of every criterion, in rubric order, of a rubric
/// (`{"categories": [...]}`) or of a fixed profile's JSON (`{"dimensions": [...]}`).
pub fn rubric_criteria(json: &str) -> Vec<(String, String)> {
    let v: Value = serde_json::from_str(json).unwrap_or(Value::Null);
    let (list, name) = match (v.get("categories"), v.get("dimensions")) {
        (Some(c), _) => (c, "category"),
        (None, Some(d)) => (d, "name"),
        (None, None) => return Vec::new(),
    };
    let mut out = Vec::new();
    for c in list.as_array().into_iter().flatten() {
        let cat = c.get(name).and_then(Value::as_str).unwrap_or("");
        for k in c
            .get("criteria")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let title = k.get("title").and_then(Value::as_str).unwrap_or("");
            out.push((cat.to_owned(), title.to_owned()));
        }
    }
    out
}

/// The indices of `criteria` (see [`rubric_criteria`]) in the order a judge prompt lists them:
/// by where each title first occurs in `prompt`, whatever the prompt's layout (criteria whose
/// title does not occur are left out).
pub fn criteria_in_prompt(prompt: &str, criteria: &[(String, String)]) -> Vec<usize> {
    let mut found: Vec<(usize, usize)> = criteria
        .iter()
        .enumerate()
        .filter_map(|(i, (_, title))| prompt.find(title.as_str()).map(|p| (p, i)))
        .collect();
    found.sort_unstable();
    found.into_iter().map(|(_, i)| i).collect()
}

/// How one stub judge of a panel answers: judges that disagree in known ways.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PanelJudge {
    /// Every criterion gets its base score plus this offset, clamped to `0..=5`.
    Offset(i8),
    /// A position bias: the criterion the prompt lists first gets this score, every other one
    /// its base score.
    FirstListed(u8),
    /// Answers this HTTP status every time.
    Failing(u16),
}

/// The answer of stub judge `judge` to the judge request `req`: the scores of `criteria` (see
/// [`rubric_criteria`]), `base(i)` being the base score of criterion `i` (rubric order), with
/// the items in the order the prompt lists the criteria, as a judge reading it would write them.
pub fn panel_reply(
    req: &StubRequest,
    criteria: &[(String, String)],
    judge: PanelJudge,
    base: impl Fn(usize) -> u8,
) -> StubReply {
    let prompt = req.messages.first().map_or("", |m| m.content.as_str());
    let shown = criteria_in_prompt(prompt, criteria);
    let items: Vec<Value> = shown
        .iter()
        .enumerate()
        .filter_map(|(place, &i)| {
            let (cat, title) = criteria.get(i)?;
            let b = i16::from(base(i));
            let score = match judge {
                PanelJudge::Offset(o) => (b + i16::from(o)).clamp(0, 5),
                PanelJudge::FirstListed(s) if place == 0 => i16::from(s),
                PanelJudge::FirstListed(_) => b,
                PanelJudge::Failing(_) => return None,
            };
            Some(json!({"category": cat, "criterion_title": title, "score": score}))
        })
        .collect();
    match judge {
        PanelJudge::Failing(status) => StubReply::Status(status, None),
        _ => StubReply::Content(json!({ "criterion_scores": items }).to_string()),
    }
}
