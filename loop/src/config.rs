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
    /// Largest answer read (bytes of the HTTP body, an SSE stream included); a longer one is
    /// the call's error `answer_too_long`, never read further. `null`: the role's default
    /// ([`DEFAULT_GENERATOR_ANSWER_BYTES`], [`DEFAULT_JUDGE_ANSWER_BYTES`]).
    pub max_answer_bytes: Option<usize>,
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
            max_answer_bytes: None,
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
                "{role}.base_url is empty: give the OpenAI-compatible base URL, e.g. http://127.0.0.1:8001/v1"
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
    /// The rubric-conditioned judge: one endpoint (`"judge": {...}`) or a panel of judges
    /// (`"judge": [{...}, ...]`), each with a weight and a number of samples.
    pub judge: JudgeConfig,
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
    /// How a panel of judges is aggregated (quorum, criterion shuffling, the spread threshold).
    pub panel: PanelConfig,
    /// Chat templates ([`crate::template`]): `auto` (the family whose turn marker a turn's
    /// prompt shows), `none` (a prompt is one user message and responses keep their tokens), or
    /// one family (`chatml`, `llama3`, `mistral`, `gemma`, `deepseek`, `phi3`).
    pub chat_template: String,
    /// More texts removed from the end of every response like end-of-turn tokens (at most 16,
    /// of 1 to 64 bytes).
    pub end_suffixes: Vec<String>,
    /// A fixed profile with an emotion term, for a turn without a gold emotion: `refuse` (every
    /// response `missing_gold`, no judge call) or `without_emotion` (scored without the term).
    pub missing_gold: crate::fixed::MissingGold,
}

impl Default for LoopConfig {
    fn default() -> Self {
        LoopConfig {
            generator: EndpointConfig::default(),
            judge: JudgeConfig::default(),
            rubric_attempts: 3,
            judge_attempts: 3,
            lenient_rubric: false,
            turn_concurrency: 16,
            profile: "care".to_owned(),
            judge_prompt_layout: "shared_prefix".to_owned(),
            cache: CacheConfig::default(),
            panel: PanelConfig::default(),
            chat_template: "auto".to_owned(),
            end_suffixes: Vec::new(),
            missing_gold: crate::fixed::MissingGold::Refuse,
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
        self.cache.check()?;
        self.panel.check(&self.judge)
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

/// Most judges in a panel.
pub const MAX_PANEL_JUDGES: usize = 8;
/// Most samples one judge takes of each response.
pub const MAX_JUDGE_SAMPLES: u32 = 16;
/// Most judge calls per response over the whole panel (the sum of the samples; the retries of
/// an unusable answer come on top, each bounded by `judge_attempts`).
pub const MAX_PANEL_CALLS: u32 = 32;
/// Longest judge name (it is a label value of the metrics).
pub const MAX_JUDGE_NAME: usize = 64;
/// The trimmed fraction of `trimmed_mean` when `panel.trim` is not given: the interquartile mean.
pub const DEFAULT_TRIM: f64 = 0.25;

/// The members of a judge object that are not endpoint fields.
const JUDGE_KEYS: [&str; 3] = ["name", "weight", "samples"];

/// One judge: an endpoint, its weight in the panel and the answers it gives per response.
///
/// In JSON one object: every field of [`EndpointConfig`] plus `name`, `weight` and `samples`
/// (unknown members are errors, as everywhere in the configuration).
#[derive(Clone, Debug, PartialEq)]
pub struct JudgeSpec {
    /// The endpoint.
    pub endpoint: EndpointConfig,
    /// The name in the output lines and the metrics; `None`: the model name.
    pub name: Option<String>,
    /// Weight in the panel's aggregate: finite and above 0 (default 1).
    pub weight: f64,
    /// Answers asked of this judge per response (self-consistency, default 1); more than one
    /// needs a temperature above 0 and no `seed`, or every sample would be the same answer.
    pub samples: u32,
}

impl JudgeSpec {
    /// A judge at `endpoint` with weight 1 and one sample.
    pub fn new(endpoint: EndpointConfig) -> Self {
        JudgeSpec {
            endpoint,
            name: None,
            weight: 1.0,
            samples: 1,
        }
    }

    /// The name in the output and the metrics.
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.endpoint.model)
    }

    fn from_value(v: serde_json::Value) -> Result<JudgeSpec, String> {
        use serde_json::Value;
        let Value::Object(mut m) = v else {
            return Err(
                "a judge is a JSON object: the endpoint fields (base_url, model, ...) and optionally name, weight, samples"
                    .to_owned(),
            );
        };
        let name = match m.remove("name") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s),
            Some(_) => return Err("name must be a string".to_owned()),
        };
        let weight = match m.remove("weight") {
            None => 1.0,
            Some(v) => v
                .as_f64()
                .ok_or_else(|| format!("weight {v} must be a number"))?,
        };
        let samples = match m.remove("samples") {
            None => 1,
            Some(v) => v
                .as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .ok_or_else(|| format!("samples {v} must be a whole number"))?,
        };
        let endpoint: EndpointConfig = serde_json::from_value(Value::Object(m)).map_err(|e| {
            let s = e.to_string();
            if s.starts_with("unknown field") {
                format!("{s}, or one of {}", JUDGE_KEYS.join(", "))
            } else {
                s
            }
        })?;
        Ok(JudgeSpec {
            endpoint,
            name,
            weight,
            samples,
        })
    }

    fn to_value(&self) -> Result<serde_json::Value, serde_json::Error> {
        let mut v = serde_json::to_value(&self.endpoint)?;
        if let serde_json::Value::Object(m) = &mut v {
            if let Some(n) = &self.name {
                m.insert("name".to_owned(), n.clone().into());
            }
            m.insert("weight".to_owned(), self.weight.into());
            m.insert("samples".to_owned(), self.samples.into());
        }
        Ok(v)
    }
}

impl Serialize for JudgeSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_value()
            .map_err(serde::ser::Error::custom)?
            .serialize(s)
    }
}

impl<'de> Deserialize<'de> for JudgeSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        JudgeSpec::from_value(v).map_err(serde::de::Error::custom)
    }
}

/// The judge of the loop: one endpoint (`"judge": {...}`, as always) or a panel
/// (`"judge": [{...}, {...}]`).
#[derive(Clone, Debug, PartialEq)]
pub struct JudgeConfig {
    /// The judges in configuration order (checked to be 1..=[`MAX_PANEL_JUDGES`]).
    pub judges: Vec<JudgeSpec>,
}

impl Default for JudgeConfig {
    fn default() -> Self {
        JudgeConfig::from(EndpointConfig::default())
    }
}

impl From<EndpointConfig> for JudgeConfig {
    fn from(endpoint: EndpointConfig) -> Self {
        JudgeConfig {
            judges: vec![JudgeSpec::new(endpoint)],
        }
    }
}

impl JudgeConfig {
    /// A panel of `judges`.
    pub fn panel(judges: Vec<JudgeSpec>) -> Self {
        JudgeConfig { judges }
    }

    /// The endpoint of the only judge (`None` for a panel of several: a command-line flag that
    /// sets "the judge" would be ambiguous there).
    pub fn single_mut(&mut self) -> Option<&mut EndpointConfig> {
        match self.judges.as_mut_slice() {
            [one] => Some(&mut one.endpoint),
            _ => None,
        }
    }

    /// How judge `k` is named in error messages: `judge` alone, `judge[k]` in a panel.
    pub fn field(&self, k: usize) -> String {
        if self.judges.len() == 1 {
            "judge".to_owned()
        } else {
            format!("judge[{k}]")
        }
    }
}

impl Serialize for JudgeConfig {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.judges.as_slice() {
            [one] => one.serialize(s),
            many => many.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for JudgeConfig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::Array(items) => {
                if items.is_empty() {
                    return Err(D::Error::custom(
                        "judge is an empty list: give one judge object, or a list of them for a panel",
                    ));
                }
                let judges = items
                    .into_iter()
                    .enumerate()
                    .map(|(k, v)| JudgeSpec::from_value(v).map_err(|e| format!("judge[{k}]: {e}")))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(D::Error::custom)?;
                Ok(JudgeConfig { judges })
            }
            v @ serde_json::Value::Object(_) => JudgeSpec::from_value(v)
                .map(|j| JudgeConfig { judges: vec![j] })
                .map_err(|e| D::Error::custom(format!("judge: {e}"))),
            _ => Err(D::Error::custom(
                "judge must be an object (one endpoint) or a list of objects (a panel)",
            )),
        }
    }
}

/// How each criterion's scores are combined over the judges (the panel's reward is the
/// profile's reward of the combined scores).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Aggregate {
    /// The weighted mean.
    #[default]
    Mean,
    /// The weighted median (the mean of the two middle values when the weights split evenly).
    Median,
    /// The weighted mean of what is left after trimming `panel.trim` of the total weight from
    /// each end (fractionally: a value straddling the cut counts with the part inside).
    TrimmedMean,
}

/// What happens to a response whose judges disagree by more than `panel.max_spread`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpreadAction {
    /// Rewarded as usual, and flagged (`panel.flagged`, a metric).
    #[default]
    Flag,
    /// Flagged, and no reward: `null` with status `judges_disagree`.
    Null,
}

/// How a panel of judges becomes one reward per response.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PanelConfig {
    /// `mean` (default), `median` or `trimmed_mean`, over the judges, with their weights.
    pub aggregate: Aggregate,
    /// The fraction of the total weight trimmed from each end by `trimmed_mean`, in `[0, 0.5)`
    /// (`null`: [`DEFAULT_TRIM`]); only with `trimmed_mean`.
    pub trim: Option<f64>,
    /// Judges that must give valid scores for a response to be rewarded (`null`: every judge).
    pub quorum: Option<usize>,
    /// Shuffle the criteria within each dimension of every judge prompt, in an order seeded by
    /// the prompt, the judge and the sample (the same call always gets the same order).
    pub shuffle_criteria: bool,
    /// Flag a response whose judges' rewards spread (max - min) by more than this, in `[0, 1]`
    /// (`null`: never flagged); needs two judges.
    pub max_spread: Option<f64>,
    /// What a flagged response gets: `flag` (its reward) or `null`.
    pub on_spread: SpreadAction,
}

impl PanelConfig {
    /// Whether the judging goes through the panel (several judges, several samples, or
    /// shuffling); otherwise the single judge works exactly as it always has.
    pub fn is_active(&self, judge: &JudgeConfig) -> bool {
        judge.judges.len() > 1
            || judge.judges.iter().any(|j| j.samples > 1)
            || self.shuffle_criteria
    }

    /// The quorum for `n` judges.
    pub fn quorum_of(&self, n: usize) -> usize {
        self.quorum.unwrap_or(n)
    }

    /// The trimmed fraction of [`Aggregate::TrimmedMean`].
    pub fn trim_fraction(&self) -> f64 {
        self.trim.unwrap_or(DEFAULT_TRIM)
    }

    /// Checks the panel and its judges' own fields (the endpoints are checked where they are
    /// built).
    ///
    /// # Errors
    /// A message that names the field.
    pub fn check(&self, judge: &JudgeConfig) -> Result<(), String> {
        let n = judge.judges.len();
        if n == 0 {
            return Err("judge is an empty list: give at least one judge".to_owned());
        }
        if n > MAX_PANEL_JUDGES {
            return Err(format!(
                "judge lists {n} judges; a panel has at most {MAX_PANEL_JUDGES}"
            ));
        }
        let mut calls = 0u32;
        for (k, j) in judge.judges.iter().enumerate() {
            let f = judge.field(k);
            if !(j.weight.is_finite() && j.weight > 0.0) {
                return Err(format!(
                    "{f}.weight {} must be a finite number above 0",
                    j.weight
                ));
            }
            if j.samples == 0 || j.samples > MAX_JUDGE_SAMPLES {
                return Err(format!(
                    "{f}.samples {} must be in 1..={MAX_JUDGE_SAMPLES}",
                    j.samples
                ));
            }
            if j.samples > 1 {
                if !j.endpoint.temperature.is_some_and(|t| t > 0.0) {
                    return Err(format!(
                        "{f}.samples {} needs a temperature above 0: at temperature 0 (or the server's default) the samples may all be the same answer",
                        j.samples
                    ));
                }
                if j.endpoint.seed.is_some() {
                    return Err(format!(
                        "{f}.samples {} needs seed null: with a fixed seed every sample is the same answer",
                        j.samples
                    ));
                }
            }
            calls += j.samples;
            if let Some(name) = &j.name
                && (name.trim().is_empty()
                    || name.chars().count() > MAX_JUDGE_NAME
                    || name.chars().any(char::is_control))
            {
                return Err(format!(
                    "{f}.name {name:?} must be 1 to {MAX_JUDGE_NAME} printable characters"
                ));
            }
            let name = j.name();
            for (i, other) in judge.judges.iter().enumerate().take(k) {
                if other.name() == name {
                    return Err(format!(
                        "{f} and {} are both named {name:?}: give each judge its own name",
                        judge.field(i)
                    ));
                }
                let e = (&j.endpoint, &other.endpoint);
                if e.0.model == e.1.model
                    && e.0.temperature == e.1.temperature
                    && e.0.top_p == e.1.top_p
                    && e.0.max_tokens == e.1.max_tokens
                    && e.0.seed == e.1.seed
                {
                    return Err(format!(
                        "{f} asks the same model with the same sampling parameters as {}: it would get the same cached answers; use samples on one judge instead",
                        judge.field(i)
                    ));
                }
            }
        }
        if calls > MAX_PANEL_CALLS {
            return Err(format!(
                "the judges take {calls} samples per response; at most {MAX_PANEL_CALLS}"
            ));
        }
        if let Some(q) = self.quorum
            && (q == 0 || q > n)
        {
            return Err(format!(
                "panel.quorum {q} must be in 1..={n} (the number of judges)"
            ));
        }
        if let Some(t) = self.trim {
            if self.aggregate != Aggregate::TrimmedMean {
                return Err("panel.trim applies to aggregate trimmed_mean only".to_owned());
            }
            if !(t.is_finite() && (0.0..0.5).contains(&t)) {
                return Err(format!("panel.trim {t} must be in [0, 0.5)"));
            }
        }
        if let Some(x) = self.max_spread {
            if !(x.is_finite() && (0.0..=1.0).contains(&x)) {
                return Err(format!("panel.max_spread {x} must be in [0, 1]"));
            }
            if n < 2 {
                return Err(
                    "panel.max_spread needs at least two judges (one judge has no spread)"
                        .to_owned(),
                );
            }
        } else if self.on_spread == SpreadAction::Null {
            return Err("panel.on_spread null needs panel.max_spread".to_owned());
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
        row(
            "eject_secs`, `eject_max_secs",
            format!("{}, {}", e.eject_secs, e.eject_max_secs),
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
        let k = CacheConfig::default();
        row("ttl_secs", format!("{}", k.ttl_secs.unwrap_or(0)));
        row("lease_secs", format!("{}", k.lease_secs));
        row("pool_size", format!("{}", k.pool_size));
        row("op_timeout_secs", format!("{}", k.op_timeout_secs));
        row("probe_secs", format!("{}", k.probe_secs));
        row("key_prefix", format!("`{:?}`", k.key_prefix));
        row("when_down", format!("`{}`", k.when_down));
        let j = JudgeSpec::new(EndpointConfig::default());
        row("weight", format!("{}", j.weight));
        row("samples", format!("{}", j.samples));
        let p = PanelConfig::default();
        assert_eq!(
            (p.aggregate, p.on_spread, p.quorum, p.max_spread),
            (Aggregate::Mean, SpreadAction::Flag, None, None)
        );
        row("aggregate", "`mean`".to_owned());
        row("trim", format!("{DEFAULT_TRIM}"));
        row("quorum", "every judge".to_owned());
        row("shuffle_criteria", format!("{}", p.shuffle_criteria));
        row("max_spread", "`null`".to_owned());
        row("on_spread", "`flag`".to_owned());
        for bound in [
            format!(
                "at most {MAX_PANEL_JUDGES} judges and at most {MAX_PANEL_CALLS} samples per response"
            ),
            format!("1..={MAX_JUDGE_SAMPLES}"),
            format!("at most {MAX_JUDGE_NAME} printable characters"),
        ] {
            assert!(doc.contains(&bound), "docs/REWARD_LOOP.md lacks {bound:?}");
        }
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
        assert_eq!(
            c.judge.judges[0].endpoint.base_url.urls(),
            ["http://a/v1", "http://b/v1"]
        );
        assert_eq!(c.judge.judges[0].endpoint.check("judge"), Ok(()));
        let c: LoopConfig =
            serde_json::from_str(r#"{"judge":{"base_url":["http://a/v1","ftp://b"],"model":"m"}}"#)
                .unwrap();
        assert!(
            c.judge.judges[0]
                .endpoint
                .check("judge")
                .unwrap_err()
                .contains("\"ftp://b\"")
        );
        let c: LoopConfig = serde_json::from_str(
            r#"{"judge":{"base_url":["http://a/v1","http://a/v1/"],"model":"m"}}"#,
        )
        .unwrap();
        assert!(
            c.judge.judges[0]
                .endpoint
                .check("judge")
                .unwrap_err()
                .contains("twice")
        );
        let c: LoopConfig =
            serde_json::from_str(r#"{"judge":{"base_url":[],"model":"m"}}"#).unwrap();
        assert!(
            c.judge.judges[0]
                .endpoint
                .check("judge")
                .unwrap_err()
                .contains("is empty")
        );
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

    fn panel_err(json: &str) -> String {
        match serde_json::from_str::<LoopConfig>(json) {
            Err(e) => e.to_string(),
            Ok(c) => c.check_bounds().unwrap_err(),
        }
    }

    #[test]
    fn judge_is_one_object_or_a_list_with_weights_and_samples() {
        let one: LoopConfig =
            serde_json::from_str(r#"{"judge":{"base_url":"http://h/v1","model":"m"}}"#).unwrap();
        assert_eq!(one.judge.judges.len(), 1);
        assert_eq!(one.judge.judges[0].weight, 1.0);
        assert_eq!(one.judge.judges[0].samples, 1);
        assert_eq!(one.judge.judges[0].name(), "m");
        assert!(
            !one.panel.is_active(&one.judge),
            "one judge: the single-judge path"
        );
        assert_eq!(one.check_bounds(), Ok(()));
        let text = r#"{"judge":[
            {"base_url":"http://a/v1","model":"a","weight":2,"name":"judge-a"},
            {"base_url":"http://b/v1","model":"b","temperature":0.7,"samples":3}],
            "panel":{"aggregate":"trimmed_mean","trim":0.2,"quorum":1,"shuffle_criteria":true,
                     "max_spread":0.3,"on_spread":"null"}}"#;
        let c: LoopConfig = serde_json::from_str(text).unwrap();
        assert_eq!(c.check_bounds(), Ok(()));
        assert!(c.panel.is_active(&c.judge));
        let j = &c.judge.judges;
        assert_eq!(
            (j[0].name(), j[0].weight, j[0].samples),
            ("judge-a", 2.0, 1)
        );
        assert_eq!((j[1].name(), j[1].weight, j[1].samples), ("b", 1.0, 3));
        assert_eq!(c.panel.aggregate, Aggregate::TrimmedMean);
        assert_eq!(c.panel.on_spread, SpreadAction::Null);
        // Serialized and read back: the same configuration (a panel stays a list).
        let back: LoopConfig = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
        let back: LoopConfig = serde_json::from_str(&serde_json::to_string(&one).unwrap()).unwrap();
        assert_eq!(back, one);
        // The command line's judge flags have one judge to set, or none.
        let mut one = one;
        assert!(one.judge.single_mut().is_some());
        let mut c = c;
        assert!(c.judge.single_mut().is_none());
    }

    #[test]
    fn every_panel_field_is_checked_and_named() {
        let ab = |extra_a: &str, extra_b: &str, panel: &str| {
            format!(
                r#"{{"judge":[{{"base_url":"http://a/v1","model":"a"{extra_a}}},{{"base_url":"http://b/v1","model":"b"{extra_b}}}],"panel":{{{panel}}}}}"#
            )
        };
        for (json, want) in [
            (
                ab(r#","modle":"x""#, "", ""),
                "judge[0]: unknown field `modle`",
            ),
            (
                ab(r#","modle":"x""#, "", ""),
                "or one of name, weight, samples",
            ),
            (ab("", "", r#""quorom":2"#), "unknown field `quorom`"),
            (ab("", "", r#""aggregate":"avg""#), "unknown variant `avg`"),
            (
                ab(r#","weight":0"#, "", ""),
                "judge[0].weight 0 must be a finite number above 0",
            ),
            (ab("", r#","weight":-1.5"#, ""), "judge[1].weight -1.5"),
            (
                ab(r#","weight":"2""#, "", ""),
                "weight \"2\" must be a number",
            ),
            (
                ab(r#","samples":0"#, "", ""),
                "judge[0].samples 0 must be in 1..=16",
            ),
            (
                ab(r#","samples":17,"temperature":1"#, "", ""),
                "judge[0].samples 17",
            ),
            (
                ab(r#","samples":2.5"#, "", ""),
                "samples 2.5 must be a whole number",
            ),
            (ab(r#","samples":2"#, "", ""), "needs a temperature above 0"),
            (
                ab(r#","samples":2,"temperature":0"#, "", ""),
                "needs a temperature above 0",
            ),
            (
                ab(r#","samples":2,"temperature":1,"seed":7"#, "", ""),
                "needs seed null",
            ),
            (
                ab(r#","name":"x""#, r#","name":"x""#, ""),
                "both named \"x\"",
            ),
            (ab(r#","name":"  ""#, "", ""), "judge[0].name"),
            (ab(r#","name":7"#, "", ""), "name must be a string"),
            (
                ab("", "", r#""quorum":0"#),
                "panel.quorum 0 must be in 1..=2",
            ),
            (
                ab("", "", r#""quorum":3"#),
                "panel.quorum 3 must be in 1..=2",
            ),
            (
                ab("", "", r#""trim":0.2"#),
                "panel.trim applies to aggregate trimmed_mean only",
            ),
            (
                ab("", "", r#""aggregate":"trimmed_mean","trim":0.5"#),
                "panel.trim 0.5 must be in [0, 0.5)",
            ),
            (
                ab("", "", r#""max_spread":1.5"#),
                "panel.max_spread 1.5 must be in [0, 1]",
            ),
            (
                ab("", "", r#""on_spread":"null""#),
                "panel.on_spread null needs panel.max_spread",
            ),
            (
                r#"{"judge":{"base_url":"http://a/v1","model":"a"},"panel":{"max_spread":0.2}}"#
                    .to_owned(),
                "panel.max_spread needs at least two judges",
            ),
            (r#"{"judge":[]}"#.to_owned(), "judge is an empty list"),
            (
                r#"{"judge":"http://a/v1"}"#.to_owned(),
                "judge must be an object",
            ),
            (
                r#"{"judge":{"base_url":"http://a/v1","model":"a","weigth":2}}"#.to_owned(),
                "judge: unknown field `weigth`",
            ),
        ] {
            let err = panel_err(&json);
            assert!(err.contains(want), "{json}\n  gave: {err}\n  want: {want}");
        }
        // The same model at the same sampling parameters twice would share its cache keys.
        let twice = r#"{"judge":[{"base_url":"http://a/v1","model":"m","name":"x"},{"base_url":"http://b/v1","model":"m","name":"y"}]}"#;
        assert!(panel_err(twice).contains("same model with the same sampling parameters"));
        let nine: Vec<String> = (0..9)
            .map(|k| format!(r#"{{"base_url":"http://a/v1","model":"m{k}"}}"#))
            .collect();
        let err = panel_err(&format!(r#"{{"judge":[{}]}}"#, nine.join(",")));
        assert!(
            err.contains("judge lists 9 judges; a panel has at most 8"),
            "{err}"
        );
        let many: Vec<String> = (0..3)
            .map(|k| {
                format!(
                    r#"{{"base_url":"http://a/v1","model":"m{k}","temperature":1,"samples":11}}"#
                )
            })
            .collect();
        let err = panel_err(&format!(r#"{{"judge":[{}]}}"#, many.join(",")));
        assert!(err.contains("33 samples per response; at most 32"), "{err}");
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
