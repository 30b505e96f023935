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

/// Most base URLs in one endpoint pool.
pub const MAX_POOL_URLS: usize = 64;

/// The base URL of an endpoint: one URL, or a list of replicas serving the same model (a pool:
/// each request goes to the replica with the fewest requests in flight). In JSON, a string or
/// an array of strings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BaseUrls(Vec<String>);

impl BaseUrls {
    /// The URLs, in configuration order.
    pub fn urls(&self) -> &[String] {
        &self.0
    }

    /// Whether no URL is set.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|u| u.trim().is_empty())
    }
}

impl From<String> for BaseUrls {
    fn from(s: String) -> Self {
        BaseUrls(vec![s])
    }
}

impl From<&str> for BaseUrls {
    fn from(s: &str) -> Self {
        BaseUrls(vec![s.to_owned()])
    }
}

impl From<Vec<String>> for BaseUrls {
    fn from(v: Vec<String>) -> Self {
        BaseUrls(v)
    }
}

impl std::fmt::Display for BaseUrls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.join(","))
    }
}

impl Serialize for BaseUrls {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0.as_slice() {
            [one] => s.serialize_str(one),
            many => many.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for BaseUrls {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged, expecting = "a base URL or a list of base URLs")]
        enum OneOrMany {
            One(String),
            Many(Vec<String>),
        }
        Ok(match OneOrMany::deserialize(d)? {
            OneOrMany::One(s) => BaseUrls(vec![s]),
            OneOrMany::Many(v) => BaseUrls(v),
        })
    }
}

/// One OpenAI-compatible chat-completions endpoint (vLLM, SGLang, a hosted API).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EndpointConfig {
    /// Base URL up to the API version, e.g. `http://127.0.0.1:8000/v1`; requests go to
    /// `{base_url}/chat/completions`. A list makes a pool of replicas of one model: each
    /// attempt goes to the replica with the fewest requests in flight (ties in turn), a
    /// failing replica is ejected for a while and probed back.
    pub base_url: BaseUrls,
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
    /// Most requests in flight at once to each base URL of this endpoint.
    pub max_concurrency: usize,
    /// HTTP attempts per call (1 = no retry). Retried: timeouts, connection errors, HTTP 429
    /// and 5xx, and a 2xx answer that is not a chat completion.
    pub max_attempts: u32,
    /// First backoff between attempts; doubled each time, up to `backoff_max_secs`, times a
    /// random factor in `[0.5, 1]`. A `Retry-After` header (seconds) replaces it, capped the same.
    pub backoff_initial_secs: f64,
    /// Longest backoff.
    pub backoff_max_secs: f64,
    /// A pool's replica that fails an attempt (timeout, connection error, HTTP 429 or 5xx, an
    /// answer that is not a chat completion) gets no request for this long, doubled per
    /// consecutive failure up to `eject_max_secs`; then one request probes it back. A
    /// `Retry-After` header sets the period of the replica that sent it (capped the same). A
    /// pool of one URL is never skipped.
    pub eject_secs: f64,
    /// Longest ejection.
    pub eject_max_secs: f64,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        EndpointConfig {
            base_url: BaseUrls::default(),
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
            eject_secs: 1.0,
            eject_max_secs: 30.0,
        }
    }
}

impl EndpointConfig {
    /// An endpoint at `base_url` (one URL, or a `Vec` of them) serving `model`, every other
    /// field at its default.
    pub fn new(base_url: impl Into<BaseUrls>, model: impl Into<String>) -> Self {
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
        if self.base_url.is_empty() {
            return Err(format!(
                "{role}.base_url is empty: give the OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1"
            ));
        }
        let urls = self.base_url.urls();
        if urls.len() > MAX_POOL_URLS {
            return Err(format!(
                "{role}.base_url lists {} URLs; at most {MAX_POOL_URLS}",
                urls.len()
            ));
        }
        for (i, u) in urls.iter().enumerate() {
            let url = u.trim();
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(format!(
                    "{role}.base_url {url:?} must start with http:// or https://"
                ));
            }
            let canon = url.trim_end_matches('/');
            if urls[..i]
                .iter()
                .any(|o| o.trim().trim_end_matches('/') == canon)
            {
                return Err(format!(
                    "{role}.base_url lists {url:?} twice: give each replica once"
                ));
            }
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
            if !(v.is_finite() && v > 0.0 && v <= 86_400.0) {
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
        for (name, v) in [
            ("eject_secs", self.eject_secs),
            ("eject_max_secs", self.eject_max_secs),
        ] {
            if !(v.is_finite() && (0.0..=3_600.0).contains(&v)) {
                return Err(format!(
                    "{role}.{name} {v} must be a number of seconds in [0, 3600]"
                ));
            }
        }
        if self.eject_max_secs < self.eject_secs {
            return Err(format!("{role}.eject_max_secs must be at least eject_secs"));
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

    /// The per-attempt timeout.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.timeout_secs)
    }

    /// The connect timeout.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.connect_timeout_secs)
    }
}

fn check_bound(name: &str, v: u32) -> Result<(), String> {
    if v == 0 || v > MAX_BOUND {
        return Err(format!("{name} {v} must be in 1..={MAX_BOUND}"));
    }
    Ok(())
}

/// The cache's settings that matter for a shared store (`--cache redis://host:port/db`); the
/// SQLite file reads none of them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CacheConfig {
    /// A completed call expires from the shared store this many seconds after it was written;
    /// `null`: never (the store's own eviction policy then decides).
    pub ttl_secs: Option<u64>,
    /// The replica that starts a call holds its lease this long, renewed every third of it while
    /// the call runs; the others wait for its answer. A replica that dies stops renewing, and
    /// after at most this long another one takes the call over.
    pub lease_secs: f64,
    /// Connections to the store per replica (each multiplexes many requests).
    pub pool_size: usize,
    /// Limit of one store command, connecting included; past it the store counts as down.
    pub op_timeout_secs: f64,
    /// While the store is down, it is probed this often; the replica uses it again as soon as
    /// a probe succeeds.
    pub probe_secs: f64,
    /// Every key of the store starts with this.
    pub key_prefix: String,
    /// Name of the environment variable that holds the store's password (instead of writing it
    /// into the URL, where the process list shows it); `null`: the URL's, if any.
    pub password_env: Option<String>,
    /// While the store is down: `serve` (answer without it: calls are made per replica and kept
    /// in memory until it returns; with a sampling LLM two replicas may answer one call
    /// differently) or `refuse` (a call that is not already answered fails as
    /// `cache_unavailable`, and the server answers its request 503 with `Retry-After`).
    pub when_down: String,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            ttl_secs: Some(7 * 24 * 3600),
            lease_secs: 10.0,
            pool_size: 4,
            op_timeout_secs: 1.0,
            probe_secs: 1.0,
            key_prefix: "care:".to_owned(),
            password_env: None,
            when_down: "serve".to_owned(),
        }
    }
}

impl CacheConfig {
    /// Checks every field.
    ///
    /// # Errors
    /// A message that names the field.
    pub fn check(&self) -> Result<(), String> {
        if self.ttl_secs == Some(0) {
            return Err("cache.ttl_secs must be at least 1 (null: never expire)".to_owned());
        }
        for (name, v, lo, hi) in [
            ("lease_secs", self.lease_secs, 0.05, 3_600.0),
            ("op_timeout_secs", self.op_timeout_secs, 0.001, 60.0),
            ("probe_secs", self.probe_secs, 0.01, 3_600.0),
        ] {
            if !(v.is_finite() && (lo..=hi).contains(&v)) {
                return Err(format!(
                    "cache.{name} {v} must be a number of seconds in [{lo}, {hi}]"
                ));
            }
        }
        if self.pool_size == 0 || self.pool_size > 64 {
            return Err("cache.pool_size must be in 1..=64".to_owned());
        }
        if !matches!(self.when_down.as_str(), "serve" | "refuse") {
            return Err(format!(
                "cache.when_down {:?}: use serve or refuse",
                self.when_down
            ));
        }
        if self.key_prefix.len() > 128 {
            return Err("cache.key_prefix is longer than 128 bytes".to_owned());
        }
        if let Some(var) = &self.password_env
            && var.trim().is_empty()
        {
            return Err(
                "cache.password_env is empty: name an environment variable or use null".to_owned(),
            );
        }
        Ok(())
    }
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
    /// Where the response stands in the judge prompt: `shared_prefix` (instructions, rubric
    /// and dialogue first, the response last: the judge calls of a group share everything
    /// before the response, which servers with prefix caching prefill once) or `paper` (the
    /// paper's order, the response before the rubric). Part of every judge call's key.
    pub judge_prompt_layout: String,
    /// The shared cache's settings (leases, TTL, connections); see [`CacheConfig`].
    pub cache: CacheConfig,
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
            judge_prompt_layout: "shared_prefix".to_owned(),
            cache: CacheConfig::default(),
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
        self.layout()?;
        self.cache.check()
    }

    /// The judge prompt layout named by `judge_prompt_layout`.
    ///
    /// # Errors
    /// An unknown name (the message lists the names).
    pub fn layout(&self) -> Result<care_core::JudgePromptLayout, String> {
        self.judge_prompt_layout.parse().map_err(|_| {
            format!(
                "judge_prompt_layout {:?}: use one of {}",
                self.judge_prompt_layout,
                care_core::JudgePromptLayout::NAMES.join(", ")
            )
        })
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
        row(
            "eject_secs`, `eject_max_secs",
            format!("{}, {}", e.eject_secs, e.eject_max_secs),
        );
        let c = LoopConfig::default();
        for (text, v) in [
            ("`rubric_attempts` (", c.rubric_attempts),
            ("`judge_attempts` (", c.judge_attempts),
        ] {
            assert!(doc.contains(&format!("{text}{v}")), "docs: {text}{v}");
        }
        assert!(doc.contains(&format!("`turn_concurrency` ({} ", c.turn_concurrency)));
        let k = CacheConfig::default();
        row("ttl_secs", format!("{}", k.ttl_secs.unwrap_or(0)));
        row("lease_secs", format!("{}", k.lease_secs));
        row("pool_size", format!("{}", k.pool_size));
        row("op_timeout_secs", format!("{}", k.op_timeout_secs));
        row("probe_secs", format!("{}", k.probe_secs));
        row("key_prefix", format!("`{:?}`", k.key_prefix));
        row("when_down", format!("`{}`", k.when_down));
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
        // A pool: a list of base URLs; each checked, none twice.
        let c: LoopConfig = serde_json::from_str(
            r#"{"judge":{"base_url":["http://a/v1","http://b/v1"],"model":"m"}}"#,
        )
        .unwrap();
        assert_eq!(c.judge.base_url.urls(), ["http://a/v1", "http://b/v1"]);
        assert_eq!(c.judge.check("judge"), Ok(()));
        let c: LoopConfig =
            serde_json::from_str(r#"{"judge":{"base_url":["http://a/v1","ftp://b"],"model":"m"}}"#)
                .unwrap();
        assert!(c.judge.check("judge").unwrap_err().contains("\"ftp://b\""));
        let c: LoopConfig = serde_json::from_str(
            r#"{"judge":{"base_url":["http://a/v1","http://a/v1/"],"model":"m"}}"#,
        )
        .unwrap();
        assert!(c.judge.check("judge").unwrap_err().contains("twice"));
        let c: LoopConfig =
            serde_json::from_str(r#"{"judge":{"base_url":[],"model":"m"}}"#).unwrap();
        assert!(c.judge.check("judge").unwrap_err().contains("is empty"));
        assert!(serde_json::from_str::<LoopConfig>(r#"{"judge":{"base_url":3}}"#).is_err());
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
}
