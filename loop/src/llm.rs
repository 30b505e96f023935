//! LLM endpoints: the OpenAI-compatible chat-completions client with bounded retries, and the
//! [`Backend`] that the loop calls (that client, or the offline scripted replay).

use std::fmt;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::config::EndpointConfig;
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
    /// `timeout`, `connect`, `transport`, `http_<status>` or `bad_response`.
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
/// timeouts and retry policy, and its replicas (one base URL or several: the pool chooses each attempt's).
#[derive(Debug)]
pub struct HttpEndpoint {
    cfg: EndpointConfig,
    role: Role,
    pool: Pool,
    api_key: Option<String>,
    client: reqwest::Client,
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
    retry_after: Option<Duration>,
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
        Ok(HttpEndpoint {
            pool: Pool::new(&cfg),
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
                Err(e) if e.retryable => Verdict::Failed(e.retry_after),
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

    /// The wait before attempt `attempt + 1`.
    fn backoff(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        let cap = self.cfg.backoff_max_secs;
        let secs = match retry_after {
            Some(d) => d.as_secs_f64().min(cap),
            None => {
                let exp =
                    self.cfg.backoff_initial_secs * 2f64.powi(attempt.saturating_sub(1) as i32);
                // Jitter in [0.5, 1]: clients retrying after one outage do not return in step.
                exp.min(cap) * (0.5 + 0.5 * jitter())
            }
        };
        Duration::from_secs_f64(secs.max(0.0))
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
        let resp = req.send().await.map_err(transport_error)?;
        let status = resp.status();
        if !status.is_success() {
            let retry_after = resp
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|s| s.trim().parse::<f64>().ok())
                .filter(|s| s.is_finite() && *s >= 0.0)
                .map(Duration::from_secs_f64);
            // The body says why (bad model name, bad key): keep a short prefix of it.
            let text = resp.text().await.unwrap_or_default();
            let code = status.as_u16();
            return Err(AttemptError {
                code: format!("http_{code}"),
                message: format!("HTTP {status}: {}", truncate(&text, 300)),
                retryable: code == 429 || status.is_server_error(),
                retry_after,
            });
        }
        let bytes = resp.bytes().await.map_err(transport_error)?;
        let parsed: ResponseBody = serde_json::from_slice(&bytes).map_err(|e| AttemptError {
            code: "bad_response".to_owned(),
            message: format!(
                "the answer is not a chat completion ({e}): {}",
                truncate(&String::from_utf8_lossy(&bytes), 200)
            ),
            retryable: true,
            retry_after: None,
        })?;
        let Some(choice) = parsed.choices.into_iter().next() else {
            return Err(AttemptError {
                code: "bad_response".to_owned(),
                message: "the answer has no choices".to_owned(),
                retryable: true,
                retry_after: None,
            });
        };
        let content = match choice.message.content {
            Some(c) if !c.trim().is_empty() => c,
            _ => choice.message.reasoning_content.unwrap_or_default(),
        };
        let usage = parsed.usage.map_or(Usage::default(), |u| Usage {
            prompt_tokens: u.prompt_tokens.unwrap_or(0),
            completion_tokens: u.completion_tokens.unwrap_or(0),
        });
        Ok(Completion {
            content,
            usage,
            attempts: 1,
        })
    }
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
