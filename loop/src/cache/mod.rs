//! The durable cache of completed LLM calls: one interface ([`Cache`]), two stores behind it.
//!
//! * **SQLite** (`--cache FILE`, the default): one file on the replica's disk.
//! * **Redis** (`--cache redis://host:port/db`): one store shared by every replica of a fleet.
//!   Besides the answers it holds **leases**, so that a call is made once across processes:
//!   the first replica to need it takes the lease (`SET NX PX` with a random token, renewed
//!   while the call runs); the others wait for its answer, or take the call over when the lease
//!   ends without one (the holder failed or died). If the store is unreachable, the replica
//!   keeps serving without it (answers it computes are kept in memory and written to the store
//!   when it returns), says so (`/healthz`, `care_cache_degraded`, one line on stderr) and
//!   probes it until it answers. With `cache.when_down: refuse` it refuses instead the calls
//!   it cannot share ([`CACHE_UNAVAILABLE`]; the server answers 503 with `Retry-After`), so
//!   that no two replicas answer one call differently even with a sampling LLM.
//!
//! A call is keyed by the SHA-256 of exactly what determines its answer: the role, the model,
//! the sampling parameters, the messages sent (for the generator: the system prompt, which is
//! the prompt version, and the dialogue; for the judge: the prompt rendered from the rubric,
//! the dialogue and the response) and the attempt number (a retry after an unusable answer
//! is another call). So the rubric of a turn is keyed by context, generator model and prompt
//! version, a judgment by rubric, context, response, judge model and prompt layout, and a
//! changed prompt or parameter is a new key: nothing stale is ever served. Both stores keep
//! the same keys and the same fields per call.
//!
//! **Written once.** An answer is stored only if its key has none yet, and whoever finds one
//! already there uses the stored one: two replicas that both called (a lease that ran out, an
//! outage) still answer alike from then on. Only completed calls are stored (a call that
//! failed after its retries is asked again on the next run). Each is stored as soon as it
//! completes, before its answer is used (SQLite: WAL journal, `synchronous=NORMAL`: a killed
//! process loses nothing committed; a power cut may lose the last few calls, which are then
//! asked again).

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::config::CacheConfig;
use crate::llm::{CallError, ChatMessage, Completion, Role, Usage};
use crate::metrics::Metrics;

mod redis;
mod sqlite;

use self::redis::{LeaseGuard, RedisStore};
use self::sqlite::SqliteStore;

/// The schema version: SQLite's `PRAGMA user_version`, the shared store's `{prefix}schema`
/// key. Another number is refused, never migrated silently.
pub const SCHEMA_VERSION: i64 = 1;

/// Most calls a replica keeps in memory while the shared store is down (they are written to
/// the store when it returns); past it, repeated calls go to the LLM again.
pub const DEGRADED_MAX_ENTRIES: usize = 65_536;

/// Most answer bytes a replica keeps in memory while the shared store is down.
pub const DEGRADED_MAX_BYTES: usize = 256 << 20;

/// The code of a call refused because the shared store is down and `cache.when_down` is
/// `refuse` (the server answers such a request with 503 and `Retry-After`).
pub const CACHE_UNAVAILABLE: &str = "cache_unavailable";

/// First and longest pause between two looks at a call another replica holds.
const POLL_MIN: Duration = Duration::from_millis(2);
const POLL_MAX: Duration = Duration::from_millis(50);

/// The key of one call (hex SHA-256).
///
/// Every field is followed by its length (a stream that decodes from its end, so no two
/// different inputs give the same bytes), which lets [`group_keys`] hash the prefix that the
/// calls of a group share once.
pub fn call_key(
    role: Role,
    model: &str,
    sampling: &str,
    messages: &[ChatMessage],
    attempt: u32,
) -> String {
    let mut h = key_head(role, model, sampling, attempt);
    for m in messages {
        field(&mut h, m.role.as_bytes());
        field(&mut h, m.content.as_bytes());
    }
    hex(h)
}

/// The keys of first calls that differ only in the text of their last message (the judge
/// prompts of one group): equal to [`call_key`] of each, with the shared part hashed once.
pub fn group_keys(
    role: Role,
    model: &str,
    sampling: &str,
    calls: &[Vec<ChatMessage>],
    attempt: u32,
) -> Vec<String> {
    let Some((first, rest)) = calls.split_first() else {
        return Vec::new();
    };
    let Some((last, head)) = first.split_last() else {
        return calls
            .iter()
            .map(|m| call_key(role, model, sampling, m, attempt))
            .collect();
    };
    let same_shape = rest.iter().all(|m| {
        m.len() == first.len()
            && m.split_last()
                .is_some_and(|(l, h)| h == head && l.role == last.role)
    });
    if !same_shape {
        return calls
            .iter()
            .map(|m| call_key(role, model, sampling, m, attempt))
            .collect();
    }
    let text = last.content.as_bytes();
    let shared = rest.iter().fold(text.len(), |n, m| {
        let other = m.last().map_or(&b""[..], |l| l.content.as_bytes());
        n.min(common_prefix(text, other))
    });
    let mut h = key_head(role, model, sampling, attempt);
    for m in head {
        field(&mut h, m.role.as_bytes());
        field(&mut h, m.content.as_bytes());
    }
    field(&mut h, last.role.as_bytes());
    h.update(&text[..shared]);
    calls
        .iter()
        .map(|m| {
            let content = m.last().map_or(&b""[..], |l| l.content.as_bytes());
            let mut h = h.clone();
            h.update(&content[shared..]);
            h.update((content.len() as u64).to_le_bytes());
            hex(h)
        })
        .collect()
}

fn key_head(role: Role, model: &str, sampling: &str, attempt: u32) -> Sha256 {
    let mut h = Sha256::new();
    field(&mut h, b"care-loop/call/v2");
    field(&mut h, role.as_str().as_bytes());
    field(&mut h, model.as_bytes());
    field(&mut h, sampling.as_bytes());
    field(&mut h, &attempt.to_le_bytes());
    h
}

/// A field, then its length.
fn field(h: &mut Sha256, b: &[u8]) {
    h.update(b);
    h.update((b.len() as u64).to_le_bytes());
}

fn hex(h: Sha256) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let digest = h.finalize();
    let mut s = String::with_capacity(64);
    for b in digest {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    s
}

/// Length of the common prefix of `a` and `b` (64-byte blocks compared at once).
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + 64 <= n && a[i..i + 64] == b[i..i + 64] {
        i += 64;
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i
}

/// What a stored call records besides its answer.
#[derive(Clone, Copy, Debug)]
pub struct CallMeta<'a> {
    /// Generator or judge.
    pub role: Role,
    /// The model asked.
    pub model: &'a str,
    /// Which answer of its loop (1 = the first request).
    pub attempt: u32,
}

/// Where the cache lives (`--cache`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheSpec {
    /// A SQLite file.
    Sqlite(PathBuf),
    /// A Redis (or Valkey) server shared by the replicas: `redis://[:password@]host:port/db`.
    Redis(String),
}

impl CacheSpec {
    /// `redis://...` or `rediss://...` is the shared store; anything else a file path.
    pub fn parse(s: &str) -> CacheSpec {
        if s.starts_with("redis://") || s.starts_with("rediss://") {
            CacheSpec::Redis(s.to_owned())
        } else {
            CacheSpec::Sqlite(PathBuf::from(s))
        }
    }

    /// The store for messages: the file's path, or the server's URL without its password.
    pub fn describe(&self) -> String {
        match self {
            CacheSpec::Sqlite(p) => p.display().to_string(),
            CacheSpec::Redis(url) => redis::redact(url),
        }
    }
}

/// The cache's state, for `/healthz`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct CacheStatus {
    /// `sqlite` or `redis`.
    pub backend: &'static str,
    /// `ok`, or `degraded` while the shared store is unreachable.
    pub state: &'static str,
}

/// The cache: one interface over the SQLite file and the shared Redis store.
#[derive(Debug)]
pub struct Cache {
    store: Store,
    metrics: Arc<OnceLock<Arc<Metrics>>>,
}

#[derive(Debug)]
enum Store {
    Sqlite(Arc<SqliteStore>),
    Redis(Arc<RedisStore>),
}

/// One look at a call's key.
pub(super) enum Lookup {
    /// Its answer.
    Hit(Completion),
    /// No answer; this replica makes the call (holding the lease, when the store has leases).
    Make(Option<Lease>),
    /// No answer; another replica holds the call's lease.
    Busy,
    /// The store cannot say (an unreadable value, a SQLite error): make the call without a
    /// lease.
    Unknown,
    /// The shared store is down (and this replica has no answer in memory).
    Down,
}

/// A held lease: its key and this holder's token.
#[derive(Debug)]
pub(super) struct Lease {
    pub(super) key: String,
    pub(super) token: String,
}

/// How a replica's wait for another's call ended (`care_cache_waits_total{outcome}`).
pub(super) mod wait_outcome {
    pub const RESULT: &str = "result";
    pub const LEASE: &str = "lease";
    pub const TIMEOUT: &str = "timeout";
    pub const STORE_DOWN: &str = "store_down";
}

impl Cache {
    /// Opens (or creates) a SQLite cache file.
    ///
    /// # Errors
    /// The file cannot be opened or created, is not a SQLite database, or has another schema.
    pub fn open(path: &Path) -> Result<Cache, String> {
        Ok(Cache::with_store(Store::Sqlite(Arc::new(
            SqliteStore::open(path)?,
        ))))
    }

    /// A SQLite cache in memory (tests; nothing survives the process).
    ///
    /// # Errors
    /// SQLite cannot start.
    pub fn in_memory() -> Result<Cache, String> {
        Ok(Cache::with_store(Store::Sqlite(Arc::new(
            SqliteStore::in_memory()?,
        ))))
    }

    /// Connects to the shared store at `url` (`redis://host:port/db`). An unreachable store is
    /// not an error: the cache starts degraded (one line on stderr) and probes it. Must run
    /// inside a tokio runtime.
    ///
    /// # Errors
    /// A bad URL or setting, a missing password variable, or a store that answers with another
    /// schema version or a server older than Redis 7.
    pub async fn connect_redis(url: &str, cfg: &CacheConfig) -> Result<Cache, String> {
        cfg.check()?;
        let metrics = Arc::new(OnceLock::new());
        let store = RedisStore::connect(url, cfg, Arc::clone(&metrics)).await?;
        Ok(Cache {
            store: Store::Redis(store),
            metrics,
        })
    }

    /// Opens the cache `spec` names.
    ///
    /// # Errors
    /// As [`Cache::open`] or [`Cache::connect_redis`].
    pub async fn open_spec(spec: &CacheSpec, cfg: &CacheConfig) -> Result<Cache, String> {
        match spec {
            CacheSpec::Sqlite(p) => Cache::open(p),
            CacheSpec::Redis(url) => Cache::connect_redis(url, cfg).await,
        }
    }

    fn with_store(store: Store) -> Cache {
        Cache {
            store,
            metrics: Arc::new(OnceLock::new()),
        }
    }

    /// Records into `metrics` from now on (the engine binds its own; a second call is ignored).
    pub fn bind_metrics(&self, metrics: Arc<Metrics>) {
        // A store found down before the metrics were bound shows as down from now on.
        if self.status().state != "ok" {
            metrics.cache_degraded(true);
        }
        let _ = self.metrics.set(metrics);
    }

    fn metrics(&self) -> Option<&Metrics> {
        self.metrics.get().map(Arc::as_ref)
    }

    /// The backend and its state.
    pub fn status(&self) -> CacheStatus {
        match &self.store {
            Store::Sqlite(_) => CacheStatus {
                backend: "sqlite",
                state: "ok",
            },
            Store::Redis(r) => CacheStatus {
                backend: "redis",
                state: if r.is_up() { "ok" } else { "degraded" },
            },
        }
    }

    /// The stored answer of `key`.
    ///
    /// # Errors
    /// A store error (for the shared store: it is down; its cache in memory is not read here).
    pub async fn get(&self, key: &str) -> Result<Option<Completion>, String> {
        match &self.store {
            Store::Sqlite(s) => {
                let (s, k) = (Arc::clone(s), key.to_owned());
                blocking(move || s.get(&k)).await
            }
            Store::Redis(r) => r.get(key).await,
        }
    }

    /// Stores `c` under `key` unless the key already has an answer; returns the answer the
    /// store keeps (the earlier one, if any).
    ///
    /// # Errors
    /// A store error.
    pub async fn put_once(
        &self,
        key: &str,
        meta: CallMeta<'_>,
        c: &Completion,
    ) -> Result<Completion, String> {
        let value = StoredCall::new(meta, c);
        match &self.store {
            Store::Sqlite(s) => {
                let (s, k) = (Arc::clone(s), key.to_owned());
                blocking(move || s.put_once(&k, &value)).await
            }
            Store::Redis(r) => r.put_once(key, &value, None).await,
        }
    }

    /// Number of stored calls.
    ///
    /// # Errors
    /// A store error.
    pub async fn len(&self) -> Result<u64, String> {
        match &self.store {
            Store::Sqlite(s) => {
                let s = Arc::clone(s);
                blocking(move || s.len()).await
            }
            Store::Redis(r) => r.len().await,
        }
    }

    /// Whether no call is stored.
    ///
    /// # Errors
    /// A store error.
    pub async fn is_empty(&self) -> Result<bool, String> {
        self.len().await.map(|n| n == 0)
    }

    /// One LLM call through the cache: the stored answer of `key` if there is one; else, when
    /// another replica is making the call, its answer once stored (waiting at most
    /// `max_wait`); else `make()`'s answer, stored once. Returns the answer and whether it came
    /// from the store; an answer this replica paid for keeps its own `usage` and `attempts`
    /// even when the store kept another replica's text.
    ///
    /// # Errors
    /// `make()`'s error (nothing is stored; the lease, if any, is released).
    pub async fn call<F, Fut>(
        &self,
        key: &str,
        meta: CallMeta<'_>,
        max_wait: Duration,
        make: F,
    ) -> Result<(Completion, bool), CallError>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<Completion, CallError>>,
    {
        let role = meta.role.as_str();
        // A holder that dies just before it stores its answer leaves its lease to expire.
        let lease = match &self.store {
            Store::Redis(r) => r.lease_duration(),
            Store::Sqlite(_) => Duration::ZERO,
        };
        let deadline = Instant::now() + max_wait + lease;
        let mut pause = POLL_MIN;
        let mut waited = false;
        let lease = loop {
            match self.lookup(key).await {
                Lookup::Hit(c) => {
                    if let Some(m) = self.metrics() {
                        m.cache_lookup(role, true);
                        if waited {
                            m.cache_wait(role, wait_outcome::RESULT);
                        }
                    }
                    return Ok((c, true));
                }
                Lookup::Make(lease) => {
                    if waited && let Some(m) = self.metrics() {
                        m.cache_wait(role, wait_outcome::LEASE);
                    }
                    break lease;
                }
                Lookup::Unknown => break None,
                Lookup::Down => {
                    if waited && let Some(m) = self.metrics() {
                        m.cache_wait(role, wait_outcome::STORE_DOWN);
                    }
                    if self.refuses_when_down() {
                        return Err(self.unavailable());
                    }
                    break None;
                }
                Lookup::Busy => {
                    let now = Instant::now();
                    if now >= deadline {
                        // The holder renews its lease but outlived every bound of a call:
                        // make the call here rather than wait forever.
                        if let Some(m) = self.metrics() {
                            m.cache_wait(role, wait_outcome::TIMEOUT);
                        }
                        break None;
                    }
                    waited = true;
                    tokio::time::sleep(pause.min(deadline - now)).await;
                    pause = (pause * 2).min(POLL_MAX);
                }
            }
        };
        if let Some(m) = self.metrics() {
            m.cache_lookup(role, false);
        }
        let guard = lease.and_then(|l| self.hold(l));
        let made = make().await;
        match made {
            Ok(c) => {
                let Some(stored) = self.finish(key, meta, &c, guard).await else {
                    // The store went down during the call and answers may not diverge.
                    return Err(self.unavailable());
                };
                if stored.content != c.content
                    && let Some(m) = self.metrics()
                {
                    m.cache_write_conflict(role);
                }
                Ok((
                    Completion {
                        content: stored.content,
                        usage: c.usage,
                        attempts: c.attempts,
                    },
                    false,
                ))
            }
            Err(e) => {
                if let Some(g) = guard {
                    g.release().await;
                }
                Err(e)
            }
        }
    }

    fn refuses_when_down(&self) -> bool {
        matches!(&self.store, Store::Redis(r) if r.refuses())
    }

    fn unavailable(&self) -> CallError {
        let label = match &self.store {
            Store::Redis(r) => r.label(),
            Store::Sqlite(_) => "",
        };
        CallError {
            code: CACHE_UNAVAILABLE.to_owned(),
            message: format!(
                "the shared cache {label} is unreachable and cache.when_down is refuse: retry later"
            ),
            attempts: 0,
        }
    }

    /// Looks up `key` and, on a miss, takes its lease (one round trip on the shared store).
    async fn lookup(&self, key: &str) -> Lookup {
        match &self.store {
            Store::Sqlite(s) => {
                // A read: in WAL mode it never waits for a writer or a sync (checkpoints run on
                // their own thread) and is answered from pages the process touched recently, so
                // it runs here rather than pay two thread hand-offs on every call's path.
                match s.get(key) {
                    Ok(Some(c)) => Lookup::Hit(c),
                    // One process: the engine's own flights already make each call once.
                    Ok(None) => Lookup::Make(None),
                    Err(e) => {
                        self.sqlite_error(&e);
                        Lookup::Unknown
                    }
                }
            }
            Store::Redis(r) => r.lookup(key).await,
        }
    }

    /// Keeps a lease alive while its call runs (released, or left to expire, when dropped).
    fn hold(&self, lease: Lease) -> Option<LeaseGuard> {
        match &self.store {
            Store::Redis(r) => Some(LeaseGuard::new(Arc::clone(r), lease)),
            // SQLite hands out no leases.
            Store::Sqlite(_) => None,
        }
    }

    /// Stores a made call once and releases its lease; the answer to use (the stored one), or
    /// `None` when the store is down and refuses to answer without it.
    async fn finish(
        &self,
        key: &str,
        meta: CallMeta<'_>,
        c: &Completion,
        guard: Option<LeaseGuard>,
    ) -> Option<Completion> {
        let value = StoredCall::new(meta, c);
        match &self.store {
            Store::Sqlite(s) => {
                // A commit appends to the write-ahead log (checkpoints, the only syncs, run on
                // their own thread), so it runs here; one that would wait for a lock runs on a
                // blocking thread instead.
                let stored = match s.put_once_now(key, &value) {
                    Some(r) => r,
                    None => {
                        let (s, k) = (Arc::clone(s), key.to_owned());
                        blocking(move || s.put_once(&k, &value)).await
                    }
                };
                Some(match stored {
                    Ok(stored) => stored,
                    Err(e) => {
                        self.sqlite_error(&e);
                        c.clone()
                    }
                })
            }
            Store::Redis(r) => {
                let lease = guard.and_then(LeaseGuard::into_lease);
                let stored = r.put_once(key, &value, lease.as_ref()).await;
                match stored {
                    Ok(s) => Some(s),
                    Err(_) if r.refuses() => None,
                    Err(_) => {
                        // Down: the answer is kept in memory for when the store returns.
                        r.keep_local(key, value);
                        Some(c.clone())
                    }
                }
            }
        }
    }

    fn sqlite_error(&self, e: &str) {
        // A broken cache costs repeated calls, not rewards: go on, but say so.
        if let Some(m) = self.metrics() {
            m.cache_error();
        }
        eprintln!("care: cache error (the call goes to the LLM): {e}");
    }
}

/// Runs a SQLite operation off the async threads.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(e.to_string()))
}

/// One stored call: the same fields in both stores (SQLite columns, the shared store's JSON
/// with its version `v`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct StoredCall {
    pub(super) v: u32,
    pub(super) role: String,
    pub(super) model: String,
    pub(super) attempt: u32,
    pub(super) content: String,
    pub(super) prompt_tokens: u64,
    pub(super) completion_tokens: u64,
    pub(super) created_unix: i64,
}

impl StoredCall {
    pub(super) fn new(meta: CallMeta<'_>, c: &Completion) -> StoredCall {
        StoredCall {
            v: SCHEMA_VERSION as u32,
            role: meta.role.as_str().to_owned(),
            model: meta.model.to_owned(),
            attempt: meta.attempt,
            content: c.content.clone(),
            prompt_tokens: c.usage.prompt_tokens,
            completion_tokens: c.usage.completion_tokens,
            created_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64),
        }
    }

    pub(super) fn completion(&self) -> Completion {
        Completion {
            content: self.content.clone(),
            usage: Usage {
                prompt_tokens: self.prompt_tokens,
                completion_tokens: self.completion_tokens,
            },
            attempts: 0,
        }
    }

    /// The shared store's value of a call.
    pub(super) fn decode(text: &str) -> Result<StoredCall, String> {
        let v: StoredCall =
            serde_json::from_str(text).map_err(|e| format!("a stored call is not JSON: {e}"))?;
        if i64::from(v.v) != SCHEMA_VERSION {
            return Err(format!(
                "a stored call has version {}, this care reads version {SCHEMA_VERSION}",
                v.v
            ));
        }
        Ok(v)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::redis::redact;
    use super::*;
    use rusqlite::Connection;

    #[test]
    fn keys_separate_every_input() {
        let m = vec![ChatMessage::new("user", "hi")];
        let k = call_key(Role::Judge, "m", "s", &m, 1);
        assert_eq!(k.len(), 64);
        assert_ne!(k, call_key(Role::Generator, "m", "s", &m, 1));
        assert_ne!(k, call_key(Role::Judge, "m2", "s", &m, 1));
        assert_ne!(k, call_key(Role::Judge, "m", "s2", &m, 1));
        assert_ne!(k, call_key(Role::Judge, "m", "s", &m, 2));
        // Field boundaries matter: ("ab","c") is not ("a","bc").
        let a = vec![
            ChatMessage::new("user", "ab"),
            ChatMessage::new("user", "c"),
        ];
        let b = vec![
            ChatMessage::new("user", "a"),
            ChatMessage::new("user", "bc"),
        ];
        assert_ne!(
            call_key(Role::Judge, "m", "s", &a, 1),
            call_key(Role::Judge, "m", "s", &b, 1)
        );
        // A message's text is not the next field's: ("a", "") is not ("", "a").
        assert_ne!(
            call_key(Role::Judge, "m", "a", &[], 1),
            call_key(Role::Judge, "ma", "", &[], 1)
        );
    }

    #[test]
    fn group_keys_are_the_keys_of_each_call() {
        let prompt = |r: &str| {
            vec![
                ChatMessage::new("system", "rules"),
                ChatMessage::new("user", format!("{}{r}", "shared rubric text ".repeat(20))),
            ]
        };
        // Responses that share more than the prompt (a common start), one that is a prefix of
        // another, an empty one, and a long one.
        let calls: Vec<Vec<ChatMessage>> = ["I hear you", "I hear", "", "I see", &"x".repeat(300)]
            .iter()
            .map(|r| prompt(r))
            .collect();
        let want: Vec<String> = calls
            .iter()
            .map(|m| call_key(Role::Judge, "m", "s", m, 1))
            .collect();
        assert_eq!(group_keys(Role::Judge, "m", "s", &calls, 1), want);
        // Calls of another shape fall back to one key each.
        let mut odd = calls.clone();
        odd[1][0].content = "other rules".into();
        let want: Vec<String> = odd
            .iter()
            .map(|m| call_key(Role::Judge, "m", "s", m, 1))
            .collect();
        assert_eq!(group_keys(Role::Judge, "m", "s", &odd, 1), want);
        assert_eq!(common_prefix(&[1; 200], &[1; 130]), 130);
        let mut b = [1u8; 200];
        b[150] = 2;
        assert_eq!(common_prefix(&[1; 200], &b), 150);
    }

    fn completion(text: &str) -> Completion {
        Completion {
            content: text.into(),
            usage: Usage {
                prompt_tokens: 3,
                completion_tokens: 4,
            },
            attempts: 2,
        }
    }

    const META: CallMeta<'static> = CallMeta {
        role: Role::Judge,
        model: "m",
        attempt: 1,
    };

    #[tokio::test]
    async fn sqlite_survives_reopen_writes_once_and_refuses_another_schema() {
        let dir = std::env::temp_dir().join(format!("care-cache-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.sqlite");
        let _ = std::fs::remove_file(&path);
        let c = completion("answer");
        {
            let cache = Cache::open(&path).unwrap();
            assert!(cache.is_empty().await.unwrap());
            let kept = cache.put_once("k", META, &c).await.unwrap();
            assert_eq!(kept.content, "answer");
            // Written once: a second answer for the key gets the first back.
            let kept = cache
                .put_once("k", META, &completion("other"))
                .await
                .unwrap();
            assert_eq!(kept.content, "answer");
        }
        let cache = Cache::open(&path).unwrap();
        let got = cache.get("k").await.unwrap().unwrap();
        assert_eq!(got.content, "answer");
        assert_eq!(got.usage, c.usage);
        assert_eq!(cache.get("other").await.unwrap(), None);
        assert_eq!(cache.len().await.unwrap(), 1);
        assert_eq!(
            cache.status(),
            CacheStatus {
                backend: "sqlite",
                state: "ok"
            }
        );
        drop(cache);
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch("PRAGMA user_version=99;").unwrap();
        drop(conn);
        let err = Cache::open(&path).unwrap_err();
        assert!(err.contains("schema version 99"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_commit_that_would_wait_for_another_process_waits_off_the_async_threads() {
        let dir = std::env::temp_dir().join(format!("care-cache-busy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.sqlite");
        let _ = std::fs::remove_file(&path);
        let cache = Cache::open(&path).unwrap();
        let Store::Sqlite(store) = &cache.store else {
            panic!("a file cache is SQLite")
        };
        // Another process (here: another connection) holds the write lock for 300 ms.
        let other = Connection::open(&path).unwrap();
        other.execute_batch("BEGIN IMMEDIATE;").unwrap();
        let v = StoredCall::new(META, &completion("mine"));
        assert!(
            store.put_once_now("k", &v).is_none(),
            "busy: no waiting here"
        );
        // Lookups go on meanwhile (their own connection; WAL readers do not wait).
        assert_eq!(cache.get("k").await.unwrap(), None);
        let held = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            other.execute_batch("COMMIT;").unwrap();
        });
        let started = Instant::now();
        let (c, cached) = cache
            .call("k", META, Duration::from_secs(5), || async {
                Ok(completion("mine"))
            })
            .await
            .unwrap();
        assert!(!cached);
        assert_eq!(c.content, "mine");
        assert!(started.elapsed() >= Duration::from_millis(200));
        held.join().unwrap();
        assert_eq!(cache.get("k").await.unwrap().unwrap().content, "mine");
        // Free: committed at once.
        let w = StoredCall::new(META, &completion("next"));
        assert_eq!(
            store.put_once_now("k2", &w).unwrap().unwrap().content,
            "next"
        );
        drop(cache);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn specs_and_secrets() {
        assert_eq!(
            CacheSpec::parse("redis://127.0.0.1:6379/0"),
            CacheSpec::Redis("redis://127.0.0.1:6379/0".into())
        );
        assert_eq!(
            CacheSpec::parse("care-cache.sqlite"),
            CacheSpec::Sqlite("care-cache.sqlite".into())
        );
        assert_eq!(
            redact("redis://:hunter2@db.example:6379/1"),
            "redis://:***@db.example:6379/1"
        );
        assert!(!redact("redis://user:hunter2@h/0").contains("hunter2"));
    }

    #[test]
    fn stored_values_are_versioned() {
        let v = StoredCall::new(META, &completion("x"));
        let text = serde_json::to_string(&v).unwrap();
        assert!(text.starts_with("{\"v\":1,"), "{text}");
        assert_eq!(StoredCall::decode(&text).unwrap(), v);
        let other = text.replacen("\"v\":1", "\"v\":2", 1);
        assert!(
            StoredCall::decode(&other)
                .unwrap_err()
                .contains("version 2")
        );
    }
}
