//! Configuration of the loop: one [`EndpointConfig`] per LLM role and the loop's bounds.
//!
//! Every field has a default (the tables of `docs/REWARD_LOOP.md` list them; a test checks them
//! against [`LoopConfig::default`]); a configuration file is JSON with the same field names,
//! and unknown fields are errors (a typo never silently falls back to a default).

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Most attempts any bound accepts (a larger number is a configuration mistake, not a policy).
pub const MAX_BOUND: u32 = 20;

/// Longest duration any setting accepts, in seconds (a day). Every duration from outside (a
/// configuration field, a command-line flag, an LLM's `Retry-After`) is checked or capped
/// against a bound like this one before it becomes a [`Duration`], which panics on a number
/// of seconds that is negative, NaN or 2^64 and more.
pub const MAX_SECS: f64 = 86_400.0;

/// Largest judge answer read by default (bytes of the HTTP body, an SSE stream included):
/// far beyond what a judge writes (scores for at most 48 criteria, perhaps after a think
/// block: 1 MiB is about 250k tokens), small enough that the answers in flight stay a bounded
/// amount of memory.
pub const DEFAULT_JUDGE_ANSWER_BYTES: usize = 1 << 20;

/// Largest generator answer read by default. Smaller than the judge's: a turn keeps its
/// rubric until its request is answered, so this times the turns in flight is memory (a
/// rubric is a few KB; 64 KiB, about 16k tokens, leaves room for a think block).
pub const DEFAULT_GENERATOR_ANSWER_BYTES: usize = 64 << 10;

/// Largest `max_answer_bytes` accepted.
pub const MAX_ANSWER_BYTES: usize = 1 << 30;

/// `v` seconds as a [`Duration`] when `v` is finite and within `[min, max]`; otherwise a
/// message naming `name` with the accepted range.
///
/// # Errors
/// The message, when `v` is outside the range (NaN and infinities included).
pub fn checked_secs(name: &str, v: f64, min: f64, max: f64) -> Result<Duration, String> {
    if v.is_finite() && v >= min && v <= max {
        Ok(saturating_secs(v, max))
    } else {
        Err(format!(
            "{name} {v} must be a number of seconds in [{min}, {max}]"
        ))
    }
}

/// `v` seconds as a [`Duration`], never panicking: NaN and negative numbers are 0, anything
/// above `cap` (infinity included) is `cap` (itself at most [`MAX_SECS`]).
pub fn saturating_secs(v: f64, cap: f64) -> Duration {
    let cap = if cap.is_finite() {
        cap.clamp(0.0, MAX_SECS)
    } else {
        MAX_SECS
    };
    let v = if v.is_nan() { 0.0 } else { v.clamp(0.0, cap) };
    Duration::try_from_secs_f64(v).unwrap_or(Duration::ZERO)
}

/// One OpenAI-compatible chat-completions endpoint (vLLM, SGLang, a hosted API).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EndpointConfig {
    /// Base URL up to the API version, e.g. `http://127.0.0.1:8000/v1`; requests go to
    /// `{base_url}/chat/completions`.
    pub base_url: String,
    /// The `model` field of every request.
    pub model: String,
    /// Name of the environment variable that holds the API key (sent as a bearer token);
    /// `null`: no `Authorization` header. The key itself never appears in a file.
    pub api_key_env: Option<String>,
    /// Sampling temperature; `null` leaves it to the server.
    pub temperature: Option<f64>,
    /// Nucleus sampling; `null` leaves it to the server.
    pub top_p: Option<f64>,
    /// Most completion tokens; `null` leaves it to the server.
    pub max_tokens: Option<u32>,
    /// Sampling seed; `null` leaves it to the server.
    pub seed: Option<u64>,
    /// Limit for one HTTP attempt, from sending the request to the last byte of the answer
    /// (a stalled connection ends here).
    pub timeout_secs: f64,
    /// Limit for establishing the TCP (and TLS) connection.
    pub connect_timeout_secs: f64,
    /// Most requests in flight to this endpoint at once.
    pub max_concurrency: usize,
    /// HTTP attempts per call (1 = no retry). Retried: timeouts, connection errors, HTTP 429
    /// and 5xx, and a 2xx answer that is not a chat completion.
    pub max_attempts: u32,
    /// First backoff between attempts; doubled each time, up to `backoff_max_secs`, times a
    /// random factor in `[0.5, 1]`. A `Retry-After` header (seconds) replaces it, capped the same.
    pub backoff_initial_secs: f64,
    /// Longest backoff.
    pub backoff_max_secs: f64,
    /// Largest answer read (bytes of the HTTP body, an SSE stream included); a longer one is
    /// the call's error `answer_too_long`, never read further. `null`: the role's default
    /// ([`DEFAULT_GENERATOR_ANSWER_BYTES`], [`DEFAULT_JUDGE_ANSWER_BYTES`]).
    pub max_answer_bytes: Option<usize>,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        EndpointConfig {
            base_url: String::new(),
            model: String::new(),
            api_key_env: None,
            temperature: None,
            top_p: None,
            max_tokens: None,
            seed: None,
            timeout_secs: 120.0,
            connect_timeout_secs: 10.0,
            max_concurrency: 32,
            max_attempts: 4,
            backoff_initial_secs: 0.5,
            backoff_max_secs: 16.0,
            max_answer_bytes: None,
        }
    }
}

impl EndpointConfig {
    /// An endpoint at `base_url` serving `model`, every other field at its default.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        EndpointConfig {
            base_url: base_url.into(),
            model: model.into(),
            ..EndpointConfig::default()
        }
    }

    /// Checks every field; `role` names the endpoint in the message.
    ///
    /// # Errors
    /// A message that names the field and says what to write instead.
    pub fn check(&self, role: &str) -> Result<(), String> {
        let url = self.base_url.trim();
        if url.is_empty() {
            return Err(format!(
                "{role}.base_url is empty: give the OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1"
            ));
        }
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(format!(
                "{role}.base_url {url:?} must start with http:// or https://"
            ));
        }
        if self.model.trim().is_empty() {
            return Err(format!("{role}.model is empty: give the served model name"));
        }
        if let Some(t) = self.temperature
            && !(t.is_finite() && (0.0..=2.0).contains(&t))
        {
            return Err(format!("{role}.temperature {t} must be in [0, 2]"));
        }
        if let Some(p) = self.top_p
            && !(p.is_finite() && p > 0.0 && p <= 1.0)
        {
            return Err(format!("{role}.top_p {p} must be in (0, 1]"));
        }
        if self.max_tokens == Some(0) {
            return Err(format!("{role}.max_tokens must be at least 1"));
        }
        for (name, v) in [
            ("timeout_secs", self.timeout_secs),
            ("connect_timeout_secs", self.connect_timeout_secs),
        ] {
            if !(v.is_finite() && v > 0.0 && v <= MAX_SECS) {
                return Err(format!(
                    "{role}.{name} {v} must be a number of seconds in (0, 86400]"
                ));
            }
        }
        for (name, v) in [
            ("backoff_initial_secs", self.backoff_initial_secs),
            ("backoff_max_secs", self.backoff_max_secs),
        ] {
            if !(v.is_finite() && (0.0..=3_600.0).contains(&v)) {
                return Err(format!(
                    "{role}.{name} {v} must be a number of seconds in [0, 3600]"
                ));
            }
        }
        if self.backoff_max_secs < self.backoff_initial_secs {
            return Err(format!(
                "{role}.backoff_max_secs must be at least backoff_initial_secs"
            ));
        }
        if let Some(n) = self.max_answer_bytes
            && !(1024..=MAX_ANSWER_BYTES).contains(&n)
        {
            return Err(format!(
                "{role}.max_answer_bytes {n} must be in 1024..={MAX_ANSWER_BYTES}"
            ));
        }
        if self.max_concurrency == 0 || self.max_concurrency > 4096 {
            return Err(format!("{role}.max_concurrency must be in 1..=4096"));
        }
        check_bound(&format!("{role}.max_attempts"), self.max_attempts)?;
        if let Some(var) = &self.api_key_env
            && var.trim().is_empty()
        {
            return Err(format!(
                "{role}.api_key_env is empty: name an environment variable or use null"
            ));
        }
        Ok(())
    }

    /// The per-attempt timeout (capped at [`MAX_SECS`] even on a configuration that was
    /// never checked).
    pub fn timeout(&self) -> Duration {
        saturating_secs(self.timeout_secs, MAX_SECS)
    }

    /// The connect timeout (capped as [`EndpointConfig::timeout`]).
    pub fn connect_timeout(&self) -> Duration {
        saturating_secs(self.connect_timeout_secs, MAX_SECS)
    }
}

fn check_bound(name: &str, v: u32) -> Result<(), String> {
    if v == 0 || v > MAX_BOUND {
        return Err(format!("{name} {v} must be in 1..={MAX_BOUND}"));
    }
    Ok(())
}

/// The whole loop: both endpoints and the bounds of the two retry loops.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoopConfig {
    /// The rubric generator.
    pub generator: EndpointConfig,
    /// The rubric-conditioned judge.
    pub judge: EndpointConfig,
    /// Generator answers per turn: the first, then repairs with the validator's messages
    /// (3 = one answer and at most two repairs). After the last, the turn is `invalid_rubric`.
    pub rubric_attempts: u32,
    /// Judge answers per response: the first, then retries that quote the parse problem.
    /// After the last, the response is `judge_invalid` with a `null` reward.
    pub judge_attempts: u32,
    /// Read the generator's output leniently (a `<think>` block, a code fence, the
    /// `{"analysis", "rubric"}` envelope). Off: the paper's format contract, exactly.
    pub lenient_rubric: bool,
    /// Turns processed at once by `care reward` (the server takes what its clients send).
    pub turn_concurrency: usize,
    /// The rubric profile: `care` (a rubric generated per turn, the paper's loop) or a fixed
    /// built-in profile of `care-core` (`kardia`: no generator call; malformed outputs get 0
    /// without a judge call; the judge sees the response span).
    pub profile: String,
}

impl Default for LoopConfig {
    fn default() -> Self {
        LoopConfig {
            generator: EndpointConfig::default(),
            judge: EndpointConfig::default(),
            rubric_attempts: 3,
            judge_attempts: 3,
            lenient_rubric: false,
            turn_concurrency: 16,
            profile: "care".to_owned(),
        }
    }
}

impl LoopConfig {
    /// Reads a JSON configuration file (missing fields take their defaults).
    ///
    /// # Errors
    /// The file cannot be read, is not JSON, or has an unknown field or a wrong type.
    pub fn from_file(path: &Path) -> Result<LoopConfig, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read config {}: {e}", path.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("config {}: {e}", path.display()))
    }

    /// Checks the bounds (the endpoints are checked where they are built: the scripted
    /// backend needs none of their fields).
    ///
    /// # Errors
    /// A message that names the field.
    pub fn check_bounds(&self) -> Result<(), String> {
        check_bound("rubric_attempts", self.rubric_attempts)?;
        check_bound("judge_attempts", self.judge_attempts)?;
        if self.turn_concurrency == 0 || self.turn_concurrency > 4096 {
            return Err("turn_concurrency must be in 1..=4096".to_owned());
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_defaults_are_the_defaults() {
        let doc = include_str!("../../docs/REWARD_LOOP.md");
        let e = EndpointConfig::default();
        let row = |field: &str, value: String| {
            let want = format!("| `{field}` | {value} |");
            assert!(
                doc.contains(&want),
                "docs/REWARD_LOOP.md lacks the row {want}"
            );
        };
        row("timeout_secs", format!("{}", e.timeout_secs));
        row(
            "connect_timeout_secs",
            format!("{}", e.connect_timeout_secs),
        );
        row("max_concurrency", format!("{}", e.max_concurrency));
        row("max_attempts", format!("{}", e.max_attempts));
        row(
            "backoff_initial_secs`, `backoff_max_secs",
            format!("{}, {}", e.backoff_initial_secs, e.backoff_max_secs),
        );
        assert_eq!(e.max_answer_bytes, None);
        row(
            "max_answer_bytes",
            format!(
                "`null`: {DEFAULT_GENERATOR_ANSWER_BYTES} (64 KiB) for the generator, {DEFAULT_JUDGE_ANSWER_BYTES} (1 MiB) for the judge"
            ),
        );
        let c = LoopConfig::default();
        for (text, v) in [
            ("`rubric_attempts` (", c.rubric_attempts),
            ("`judge_attempts` (", c.judge_attempts),
        ] {
            assert!(doc.contains(&format!("{text}{v}")), "docs: {text}{v}");
        }
        assert!(doc.contains(&format!("`turn_concurrency` ({} ", c.turn_concurrency)));
    }

    #[test]
    fn defaults_check_and_unknown_fields_fail() {
        let mut e = EndpointConfig::new("http://127.0.0.1:1/v1", "m");
        assert_eq!(e.check("judge"), Ok(()));
        e.base_url = "127.0.0.1:1".into();
        assert!(e.check("judge").unwrap_err().contains("judge.base_url"));
        let e = EndpointConfig {
            max_attempts: 0,
            ..EndpointConfig::new("http://h/v1", "m")
        };
        assert!(e.check("generator").unwrap_err().contains("max_attempts"));
        let e = EndpointConfig {
            timeout_secs: f64::NAN,
            ..EndpointConfig::new("http://h/v1", "m")
        };
        assert!(e.check("generator").unwrap_err().contains("timeout_secs"));
        let err = serde_json::from_str::<LoopConfig>(r#"{"judge":{"modle":"x"}}"#).unwrap_err();
        assert!(err.to_string().contains("modle"), "{err}");
        let c: LoopConfig = serde_json::from_str(r#"{"judge_attempts":2}"#).unwrap();
        assert_eq!(c.judge_attempts, 2);
        assert_eq!(c.rubric_attempts, 3);
        assert_eq!(c.check_bounds(), Ok(()));
        let c = LoopConfig {
            rubric_attempts: 21,
            ..LoopConfig::default()
        };
        assert!(c.check_bounds().unwrap_err().contains("rubric_attempts"));
    }

    /// Durations from a file are checked before they become a `Duration` (which panics on
    /// 2^64 s and more, on NaN and on negatives), and the accessors never panic even on a
    /// configuration that skipped the check.
    #[test]
    fn durations_are_checked_and_capped_before_becoming_a_duration() {
        for (field, v) in [
            ("timeout_secs", 1e20),
            ("timeout_secs", -1.0),
            ("connect_timeout_secs", 0.0),
            ("connect_timeout_secs", 86_401.0),
            ("backoff_initial_secs", 1e300),
            ("backoff_max_secs", -0.5),
        ] {
            let text = format!(r#"{{"base_url":"http://h/v1","model":"m","{field}":{v}}}"#);
            let e: EndpointConfig = serde_json::from_str(&text).unwrap();
            let err = e.check("judge").unwrap_err();
            assert!(err.contains(&format!("judge.{field}")), "{err}");
        }
        let e = EndpointConfig {
            timeout_secs: 1e20,
            connect_timeout_secs: f64::NAN,
            ..EndpointConfig::new("http://h/v1", "m")
        };
        assert_eq!(e.timeout(), Duration::from_secs(86_400));
        assert_eq!(e.connect_timeout(), Duration::ZERO);
        assert_eq!(
            saturating_secs(f64::INFINITY, 16.0),
            Duration::from_secs(16)
        );
        assert_eq!(saturating_secs(-3.0, 16.0), Duration::ZERO);
        assert_eq!(saturating_secs(2.5, f64::NAN), Duration::from_millis(2500));
        assert_eq!(
            checked_secs("--x", 1e20, 0.0, 60.0).unwrap_err(),
            "--x 100000000000000000000 must be a number of seconds in [0, 60]"
        );
        assert_eq!(
            checked_secs("--x", 1.5, 0.0, 60.0),
            Ok(Duration::from_millis(1500))
        );
        let e = EndpointConfig {
            max_answer_bytes: Some(10),
            ..EndpointConfig::new("http://h/v1", "m")
        };
        assert!(
            e.check("judge")
                .unwrap_err()
                .contains("judge.max_answer_bytes")
        );
    }
}
