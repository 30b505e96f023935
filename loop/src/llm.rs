//! LLM endpoints: the OpenAI-compatible chat-completions client with bounded retries, and the
//! [`Backend`] that the loop calls (that client, or the offline scripted replay).

use std::fmt;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::config::{
    DEFAULT_GENERATOR_ANSWER_BYTES, DEFAULT_JUDGE_ANSWER_BYTES, EndpointConfig, saturating_secs,
};
use crate::metrics::Metrics;
use crate::pool::{Pool, Verdict};
use crate::scripted::Scripted;

/// One chat message (`role` is `system`, `user` or `assistant`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl ChatMessage {
    /// A message with `role` and `content`.
    pub fn new(role: &str, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.to_owned(),
            content: content.into(),
        }
    }
}

/// Which of the two LLMs a call goes to (the `endpoint` label of the metrics).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// The rubric generator.
    Generator,
    /// The rubric-conditioned judge.
    Judge,
}

impl Role {
    /// `generator` or `judge`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Role::Generator => "generator",
            Role::Judge => "judge",
        }
    }
}

/// Token counts from an answer's `usage` field (0 when the server sent none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// `usage.prompt_tokens`.
    pub prompt_tokens: u64,
    /// `usage.completion_tokens`.
    pub completion_tokens: u64,
}

/// A completed call: the answer text and what it cost.
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    /// `choices[0].message.content`, or `reasoning_content` when `content` is empty (servers
    /// whose reasoning parser moved the whole answer there).
    pub content: String,
    /// Token usage.
    pub usage: Usage,
    /// HTTP attempts it took (1 = no retry).
    pub attempts: u32,
}

/// Why a call failed after its retries. `code` is stable (docs, metrics, output lines).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallError {
    /// `timeout`, `connect`, `transport`, `http_<status>`, `bad_response` or
    /// `answer_too_long`.
    pub code: String,
    /// What happened, with the last attempt's detail.
    pub message: String,
    /// HTTP attempts made.
    pub attempts: u32,
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} (after {} attempts)",
            self.code, self.message, self.attempts
        )
    }
}

impl std::error::Error for CallError {}

/// Where calls of one role go.
#[derive(Debug)]
pub enum Backend {
    /// An OpenAI-compatible HTTP endpoint.
    Http(Box<HttpEndpoint>),
    /// The offline replay of the bundled paper fixtures (a demo: no LLM is asked).
    Scripted(Scripted),
}

impl Backend {
    /// The model name (part of every cache key).
    pub fn model(&self) -> &str {
        match self {
            Backend::Http(h) => &h.cfg.model,
            Backend::Scripted(s) => s.model(),
        }
    }

    /// The sampling parameters as canonical JSON (part of every cache key: an answer sampled
    /// at another temperature is another answer).
    pub fn sampling_key(&self) -> String {
        match self {
            Backend::Http(h) => serde_json::json!({
                "temperature": h.cfg.temperature,
                "top_p": h.cfg.top_p,
                "max_tokens": h.cfg.max_tokens,
                "seed": h.cfg.seed,
            })
            .to_string(),
            Backend::Scripted(_) => "scripted".to_owned(),
        }
    }

    /// The longest one call can take: every attempt timing out after connecting, with the
    /// longest backoff between them (how long another replica waits for this call before
    /// making it itself).
    pub fn call_bound(&self) -> Duration {
        match self {
            Backend::Http(h) => {
                let c = &h.cfg;
                let one = c.connect_timeout_secs + c.timeout_secs + c.backoff_max_secs;
                Duration::from_secs_f64(one * f64::from(c.max_attempts))
            }
            Backend::Scripted(_) => Duration::from_secs(10),
        }
    }

    /// One chat completion (with the endpoint's retries).
    ///
    /// # Errors
    /// [`CallError`] once the retries are spent or on an error that a retry cannot fix.
    pub async fn complete(
        &self,
        messages: &[ChatMessage],
        metrics: &Metrics,
    ) -> Result<Completion, CallError> {
        match self {
            Backend::Http(h) => h.complete(messages, metrics).await,
            Backend::Scripted(s) => Ok(s.complete(messages)),
        }
    }
}

/// The chat-completions client of one endpoint: its own connection pool, concurrency limit,
/// timeouts and retry policy, and its replicas (one base URL or several: the pool chooses each
/// attempt's). Its `Debug` shows whether there is an API key, never the key.
pub struct HttpEndpoint {
    cfg: EndpointConfig,
    role: Role,
    pool: Pool,
    api_key: Option<String>,
    client: reqwest::Client,
    /// `max_answer_bytes`, or the role's default.
    answer_cap: usize,
}

impl fmt::Debug for HttpEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpEndpoint")
            .field("role", &self.role)
            .field("pool", &self.pool)
            .field("cfg", &self.cfg)
            .field("api_key", &self.api_key.as_ref().map(|_| "<set>"))
            .field("answer_cap", &self.answer_cap)
            .finish_non_exhaustive()
    }
}

#[derive(Serialize)]
struct RequestBody<'a> {
    model: &'a str,
    messages: &'a [ChatMessage],
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    seed: Option<u64>,
    stream: bool,
}

impl RequestBody<'_> {
    /// The JSON body: what `serde_json::to_vec` writes, byte for byte, with the message texts
    /// (kilobytes of prompt) escaped a word at a time.
    fn encode(&self) -> Result<Vec<u8>, serde_json::Error> {
        let text: usize = self.messages.iter().map(|m| m.content.len() + 32).sum();
        let mut out = Vec::with_capacity(text + 160);
        out.extend_from_slice(b"{\"model\":");
        crate::jsonw::write_str(&mut out, self.model);
        out.extend_from_slice(b",\"messages\":[");
        for (i, m) in self.messages.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"role\":");
            crate::jsonw::write_str(&mut out, &m.role);
            out.extend_from_slice(b",\"content\":");
            crate::jsonw::write_str(&mut out, &m.content);
            out.push(b'}');
        }
        out.push(b']');
        if let Some(t) = self.temperature {
            out.extend_from_slice(b",\"temperature\":");
            serde_json::to_writer(&mut out, &t)?;
        }
        if let Some(p) = self.top_p {
            out.extend_from_slice(b",\"top_p\":");
            serde_json::to_writer(&mut out, &p)?;
        }
        if let Some(n) = self.max_tokens {
            out.extend_from_slice(b",\"max_tokens\":");
            serde_json::to_writer(&mut out, &n)?;
        }
        if let Some(s) = self.seed {
            out.extend_from_slice(b",\"seed\":");
            serde_json::to_writer(&mut out, &s)?;
        }
        out.extend_from_slice(if self.stream {
            b",\"stream\":true}"
        } else {
            b",\"stream\":false}"
        });
        Ok(out)
    }
}

#[derive(Deserialize)]
struct ResponseBody {
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<UsageBody>,
}

#[derive(Deserialize)]
struct Choice {
    message: MessageBody,
}

#[derive(Deserialize)]
struct MessageBody {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
}

#[derive(Deserialize)]
struct UsageBody {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
}

/// One attempt's failure: the error and whether another attempt may help.
struct AttemptError {
    code: String,
    message: String,
    retryable: bool,
    /// The server's `Retry-After`, in seconds, unchecked (capped by [`HttpEndpoint::backoff`]).
    retry_after: Option<f64>,
}

impl HttpEndpoint {
    /// A client for `cfg` (checked here; the API key is read from its environment variable).
    ///
    /// # Errors
    /// A configuration message, or the missing environment variable.
    pub fn new(cfg: EndpointConfig, role: Role) -> Result<HttpEndpoint, String> {
        cfg.check(role.as_str())?;
        let api_key = match &cfg.api_key_env {
            None => None,
            Some(var) => Some(std::env::var(var).map_err(|_| {
                format!(
                    "{}.api_key_env names {var}, which is not set in the environment",
                    role.as_str()
                )
            })?),
        };
        let client = reqwest::Client::builder()
            .connect_timeout(cfg.connect_timeout())
            .pool_max_idle_per_host(cfg.max_concurrency)
            .build()
            .map_err(|e| format!("{}: cannot build the HTTP client: {e}", role.as_str()))?;
        let answer_cap = cfg.max_answer_bytes.unwrap_or(match role {
            Role::Generator => DEFAULT_GENERATOR_ANSWER_BYTES,
            Role::Judge => DEFAULT_JUDGE_ANSWER_BYTES,
        });
        Ok(HttpEndpoint {
            pool: Pool::new(&cfg),
            answer_cap,
            cfg,
            role,
            api_key,
            client,
        })
    }

    async fn complete(
        &self,
        messages: &[ChatMessage],
        metrics: &Metrics,
    ) -> Result<Completion, CallError> {
        let body = RequestBody {
            model: &self.cfg.model,
            messages,
            temperature: self.cfg.temperature,
            top_p: self.cfg.top_p,
            max_tokens: self.cfg.max_tokens,
            seed: self.cfg.seed,
            stream: false,
        }
        .encode()
        .map_err(|e| CallError {
            code: "bad_request".to_owned(),
            message: e.to_string(),
            attempts: 0,
        })?;
        let endpoint = self.role.as_str();
        let mut attempt = 0u32;
        let mut failed_on: Option<usize> = None;
        loop {
            attempt += 1;
            // The replica with the fewest in flight (a pool of one URL: that URL).
            let mut chosen = self.pool.choose(failed_on);
            let member = chosen.member;
            metrics.endpoint_in_flight(endpoint, &member.label, 1);
            let started = Instant::now();
            let result = {
                // The permit bounds requests in flight; it is released before any backoff.
                let permit = member.permits.acquire().await.map_err(|_| CallError {
                    code: "transport".to_owned(),
                    message: "the endpoint was shut down".to_owned(),
                    attempts: attempt - 1,
                });
                match permit {
                    Ok(_permit) => Ok(self.attempt(&member.url, body.clone()).await),
                    Err(e) => Err(e),
                }
            };
            metrics.endpoint_in_flight(endpoint, &member.label, -1);
            let result = result?;
            let elapsed = started.elapsed();
            let code = result.as_ref().map_or_else(|e| e.code.as_str(), |_| "ok");
            metrics.endpoint_attempt(endpoint, &member.label, code);
            let verdict = match &result {
                Ok(_) => Verdict::Healthy,
                Err(e) if e.retryable => Verdict::Failed(
                    e.retry_after
                        .map(|s| saturating_secs(s, self.cfg.eject_max_secs)),
                ),
                Err(_) => Verdict::Neutral,
            };
            if self.pool.record(&mut chosen, verdict) {
                metrics.endpoint_ejected(endpoint, &member.label);
            }
            metrics.endpoint_up(endpoint, &member.label, !self.pool.is_ejected(chosen.index));
            match result {
                Ok(mut c) => {
                    metrics.llm_attempt(endpoint, "ok", elapsed, attempt > 1);
                    metrics.tokens(endpoint, c.usage.prompt_tokens, c.usage.completion_tokens);
                    c.attempts = attempt;
                    return Ok(c);
                }
                Err(e) => {
                    metrics.llm_attempt(endpoint, &e.code, elapsed, attempt > 1);
                    if !e.retryable || attempt >= self.cfg.max_attempts {
                        return Err(CallError {
                            code: e.code,
                            message: e.message,
                            attempts: attempt,
                        });
                    }
                    // Another replica can take the retry now; the one that failed (or said
                    // Retry-After) waits out its ejection, and a lone replica its backoff.
                    failed_on = Some(chosen.index);
                    if !self.pool.other_available(chosen.index) {
                        drop(chosen);
                        tokio::time::sleep(self.backoff(attempt, e.retry_after)).await;
                    }
                }
            }
        }
    }

    /// The wait before attempt `attempt + 1`: the server's `Retry-After` or the exponential
    /// backoff, either capped at `backoff_max_secs` before it becomes a `Duration`.
    fn backoff(&self, attempt: u32, retry_after: Option<f64>) -> Duration {
        let cap = self.cfg.backoff_max_secs;
        let secs = match retry_after {
            Some(s) => s,
            None => {
                let exp =
                    self.cfg.backoff_initial_secs * 2f64.powi(attempt.saturating_sub(1) as i32);
                // Jitter in [0.5, 1]: clients retrying after one outage do not return in step.
                exp.min(cap) * (0.5 + 0.5 * jitter())
            }
        };
        saturating_secs(secs, cap)
    }

    async fn attempt(&self, url: &str, body: Vec<u8>) -> Result<Completion, AttemptError> {
        let mut req = self
            .client
            .post(url)
            .timeout(self.cfg.timeout())
            .header("content-type", "application/json")
            .body(body);
        if let Some(key) = &self.api_key {
            req = req.bearer_auth(key);
        }
        let mut resp = req.send().await.map_err(transport_error)?;
        let status = resp.status();
        if !status.is_success() {
            let retry_after = resp
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(parse_retry_after);
            // The body says why (bad model name, bad key): keep a short prefix of it, and read
            // no more than that prefix needs.
            let text = match read_capped(&mut resp, ERROR_BODY_BYTES).await {
                Ok(b) | Err(ReadError::TooLong(b)) => String::from_utf8_lossy(&b).into_owned(),
                Err(ReadError::Transport(_)) => String::new(),
            };
            let code = status.as_u16();
            return Err(AttemptError {
                code: format!("http_{code}"),
                message: format!("HTTP {status}: {}", truncate(&text, 300)),
                retryable: code == 429 || status.is_server_error(),
                retry_after,
            });
        }
        let cap = self.answer_cap;
        let content_type = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let bytes = match read_capped(&mut resp, cap).await {
            Ok(b) => b,
            Err(ReadError::Transport(e)) => return Err(transport_error(e)),
            Err(ReadError::TooLong(_)) => {
                return Err(AttemptError {
                    code: ANSWER_TOO_LONG.to_owned(),
                    message: format!(
                        "the answer is longer than max_answer_bytes ({cap} bytes); it was not read further"
                    ),
                    // The same prompt would be answered at that length again: no retry.
                    retryable: false,
                    retry_after: None,
                });
            }
        };
        let (content, usage) =
            decode_answer(content_type.as_deref(), &bytes).map_err(|message| AttemptError {
                code: "bad_response".to_owned(),
                message,
                retryable: true,
                retry_after: None,
            })?;
        Ok(Completion {
            content,
            usage,
            attempts: 1,
        })
    }
}

/// The error code of an answer longer than `max_answer_bytes`.
pub const ANSWER_TOO_LONG: &str = "answer_too_long";

/// Bytes of an error answer's body that are read (its message is cut to 300 characters).
const ERROR_BODY_BYTES: usize = 4096;

enum ReadError {
    /// The body is longer than the cap; the bytes read so far (at most the cap).
    TooLong(Vec<u8>),
    Transport(reqwest::Error),
}

/// Reads the body as it arrives, never holding more than `cap` bytes: a `Content-Length` above
/// the cap is refused before reading, and a body without one stops at the cap.
async fn read_capped(resp: &mut reqwest::Response, cap: usize) -> Result<Vec<u8>, ReadError> {
    let announced = resp.content_length().and_then(|n| usize::try_from(n).ok());
    if announced.is_some_and(|n| n > cap) {
        return Err(ReadError::TooLong(Vec::new()));
    }
    let mut out = Vec::with_capacity(announced.unwrap_or(0).min(cap).min(1 << 20));
    while let Some(chunk) = resp.chunk().await.map_err(ReadError::Transport)? {
        let room = cap - out.len();
        if chunk.len() > room {
            out.extend_from_slice(chunk.get(..room).unwrap_or(&[]));
            return Err(ReadError::TooLong(out));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// A `Retry-After` value in seconds, as sent: a non-negative number (`Retry-After: 1e20` is
/// 1e20, infinity included); `None` for anything else (an HTTP date, garbage, NaN, a negative
/// number), which leaves the exponential backoff in charge. The caller caps it before it
/// becomes a `Duration`.
pub fn parse_retry_after(value: &str) -> Option<f64> {
    value
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|s| !s.is_nan() && *s >= 0.0)
}

/// The answer text and usage of a 2xx body: a chat completion (JSON), or, when the server
/// streams (`Content-Type: text/event-stream`) although the request asked it not to, the
/// concatenated `delta`s of the stream's chunks.
///
/// # Errors
/// A message saying why the body is not a chat completion (it quotes the body's start).
pub fn decode_answer(content_type: Option<&str>, body: &[u8]) -> Result<(String, Usage), String> {
    let sse = content_type.is_some_and(|t| {
        t.trim_start()
            .to_ascii_lowercase()
            .starts_with("text/event-stream")
    });
    if sse {
        return decode_sse(body);
    }
    let parsed: ResponseBody = serde_json::from_slice(body).map_err(|e| {
        format!(
            "the answer is not a chat completion ({e}): {}",
            truncate(&String::from_utf8_lossy(body), 200)
        )
    })?;
    let Some(choice) = parsed.choices.into_iter().next() else {
        return Err("the answer has no choices".to_owned());
    };
    let content = match choice.message.content {
        Some(c) if !c.trim().is_empty() => c,
        _ => choice.message.reasoning_content.unwrap_or_default(),
    };
    Ok((content, usage_of(parsed.usage)))
}

fn usage_of(u: Option<UsageBody>) -> Usage {
    u.map_or(Usage::default(), |u| Usage {
        prompt_tokens: u.prompt_tokens.unwrap_or(0),
        completion_tokens: u.completion_tokens.unwrap_or(0),
    })
}

#[derive(Deserialize)]
struct StreamChunk {
    #[serde(default)]
    choices: Vec<StreamChoice>,
    #[serde(default)]
    usage: Option<UsageBody>,
}

#[derive(Deserialize)]
struct StreamChoice {
    #[serde(default)]
    index: u32,
    #[serde(default)]
    delta: Option<MessageBody>,
}

/// An OpenAI-style event stream: `data: {chunk}` lines (other fields and comments ignored),
/// ended by `data: [DONE]` or by the end of the body. Choice 0's `delta.content` pieces are
/// the answer (`delta.reasoning_content` when there is no content), the last `usage` counts.
fn decode_sse(body: &[u8]) -> Result<(String, Usage), String> {
    let text =
        std::str::from_utf8(body).map_err(|e| format!("the event stream is not UTF-8 ({e})"))?;
    let (mut content, mut reasoning) = (String::new(), String::new());
    let mut usage = None;
    let mut chunks = 0usize;
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data:") else {
            continue;
        };
        let data = data.trim();
        if data == "[DONE]" {
            break;
        }
        if data.is_empty() {
            continue;
        }
        let chunk: StreamChunk = serde_json::from_str(data).map_err(|e| {
            format!(
                "an event of the stream is not a chat completion chunk ({e}): {}",
                truncate(data, 200)
            )
        })?;
        chunks += 1;
        if chunk.usage.is_some() {
            usage = chunk.usage;
        }
        for c in chunk.choices.into_iter().filter(|c| c.index == 0) {
            if let Some(d) = c.delta {
                content.push_str(d.content.as_deref().unwrap_or(""));
                reasoning.push_str(d.reasoning_content.as_deref().unwrap_or(""));
            }
        }
    }
    if chunks == 0 {
        return Err("the event stream holds no chat completion chunk".to_owned());
    }
    let answer = if content.trim().is_empty() {
        reasoning
    } else {
        content
    };
    Ok((answer, usage_of(usage)))
}

fn transport_error(e: reqwest::Error) -> AttemptError {
    let code = if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connect"
    } else {
        "transport"
    };
    // reqwest's Display omits the cause ("error sending request"); the source chain says it.
    let mut message = e.to_string();
    let mut src = std::error::Error::source(&e);
    while let Some(s) = src {
        message.push_str(": ");
        message.push_str(&s.to_string());
        src = s.source();
    }
    AttemptError {
        code: code.to_owned(),
        message,
        retryable: true,
        retry_after: None,
    }
}

fn truncate(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_owned(),
    }
}

/// A number in `[0, 1)` that differs between calls (the backoff jitter; not for anything that
/// needs real randomness).
fn jitter() -> f64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static STATE: AtomicU64 = AtomicU64::new(0);
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut x = STATE.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed) ^ seed;
    // splitmix64 finalizer
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    (x >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_request_body_is_what_serde_json_writes() {
        let messages = vec![
            ChatMessage::new("system", "rules \"quoted\"\n"),
            ChatMessage::new("user", "## Rubric\n\tlevels: [0] none\u{1} é 🙂".repeat(30)),
        ];
        for (temperature, top_p, max_tokens, seed) in [
            (None, None, None, None),
            (Some(0.0), Some(0.95), Some(512), Some(7)),
            (Some(0.7), None, Some(1), None),
            (Some(1e-7), Some(1.0), None, Some(u64::MAX)),
        ] {
            let body = RequestBody {
                model: "judge \"m\"",
                messages: &messages,
                temperature,
                top_p,
                max_tokens,
                seed,
                stream: false,
            };
            assert_eq!(body.encode().unwrap(), serde_json::to_vec(&body).unwrap());
        }
    }
}
