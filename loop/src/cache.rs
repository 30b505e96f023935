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

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use redis::{IntoConnectionInfo, Script};
use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::config::CacheConfig;
use crate::llm::{CallError, ChatMessage, Completion, Role, Usage};
use crate::metrics::Metrics;

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
enum Lookup {
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
struct Lease {
    key: String,
    token: String,
}

/// How a replica's wait for another's call ended (`care_cache_waits_total{outcome}`).
mod wait_outcome {
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
                state: if r.up.load(Ordering::Acquire) {
                    "ok"
                } else {
                    "degraded"
                },
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
            Store::Redis(r) => r.lease,
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
        let guard = lease.map(|l| self.hold(l));
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
        matches!(&self.store, Store::Redis(r) if r.refuse)
    }

    fn unavailable(&self) -> CallError {
        let label = match &self.store {
            Store::Redis(r) => r.label.as_str(),
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
    fn hold(&self, lease: Lease) -> LeaseGuard {
        match &self.store {
            Store::Redis(r) => LeaseGuard::new(Arc::clone(r), lease),
            // SQLite hands out no leases.
            Store::Sqlite(_) => LeaseGuard {
                store: None,
                lease: None,
                renew: None,
            },
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
                    Err(_) if r.refuse => None,
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
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(e.to_string()))
}

/// One stored call: the same fields in both stores (SQLite columns, the shared store's JSON
/// with its version `v`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct StoredCall {
    v: u32,
    role: String,
    model: String,
    attempt: u32,
    content: String,
    prompt_tokens: u64,
    completion_tokens: u64,
    created_unix: i64,
}

impl StoredCall {
    fn new(meta: CallMeta<'_>, c: &Completion) -> StoredCall {
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

    fn completion(&self) -> Completion {
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
    fn decode(text: &str) -> Result<StoredCall, String> {
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

// ---------------------------------------------------------------------------------------------
// SQLite

#[derive(Debug)]
struct SqliteStore {
    /// Commits (and everything of a memory store).
    conn: Mutex<Connection>,
    /// Lookups of a file store, on their own connection: in WAL mode a reader never waits for
    /// a writer, so a lookup never waits behind a commit that waits for another process.
    reader: Option<Mutex<Connection>>,
    /// Dropping it stops the checkpointer thread (a file store has one; memory has none).
    _checkpointer: Option<std::sync::mpsc::Sender<()>>,
}

/// How long a commit waits for another process's write lock (on a blocking thread).
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// How often the checkpointer copies the write-ahead log into the database file.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);

impl SqliteStore {
    fn open(path: &Path) -> Result<SqliteStore, String> {
        let conn = Connection::open(path)
            .map_err(|e| format!("cannot open cache {}: {e}", path.display()))?;
        let mut store = Self::init(conn).map_err(|e| format!("cache {}: {e}", path.display()))?;
        // Checkpoints (the only step that syncs to disk under synchronous=NORMAL) run on their
        // own connection and thread, so a commit on a call's path never waits for one.
        let checkpointer = Connection::open(path)
            .and_then(|c| {
                c.busy_timeout(BUSY_TIMEOUT)?;
                Ok(c)
            })
            .map_err(|e| format!("cache {}: {e}", path.display()))?;
        let writer = store
            .conn
            .get_mut()
            .map_err(|_| "cache lock poisoned".to_owned())?;
        // A commit tried on an async thread must not wait: busy is answered at once and the
        // commit retried on a blocking thread with the full timeout (`put_once_now`).
        writer
            .execute_batch("PRAGMA wal_autocheckpoint=0;")
            .and_then(|()| writer.busy_timeout(Duration::ZERO))
            .map_err(|e| format!("cache {}: {e}", path.display()))?;
        let reader = Connection::open(path)
            .and_then(|c| {
                c.busy_timeout(BUSY_TIMEOUT)?;
                Ok(c)
            })
            .map_err(|e| format!("cache {}: {e}", path.display()))?;
        store.reader = Some(Mutex::new(reader));
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        std::thread::Builder::new()
            .name("care-cache-checkpoint".to_owned())
            .spawn(move || {
                // Until the store is dropped (the channel disconnects); then one last one.
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(CHECKPOINT_EVERY)
                {
                    let _ = checkpointer.execute_batch("PRAGMA wal_checkpoint(PASSIVE);");
                }
                let _ = checkpointer.execute_batch("PRAGMA wal_checkpoint(PASSIVE);");
            })
            .map_err(|e| format!("cannot start the cache checkpointer: {e}"))?;
        store._checkpointer = Some(stop);
        Ok(store)
    }

    fn in_memory() -> Result<SqliteStore, String> {
        let conn = Connection::open_in_memory().map_err(|e| e.to_string())?;
        Self::init(conn)
    }

    fn init(conn: Connection) -> Result<SqliteStore, String> {
        let e = |e: rusqlite::Error| e.to_string();
        conn.busy_timeout(BUSY_TIMEOUT).map_err(e)?;
        // `journal_mode` answers with a row; read it rather than execute it.
        let _mode: String = conn
            .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
            .map_err(e)?;
        conn.execute_batch("PRAGMA synchronous=NORMAL;")
            .map_err(e)?;
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(e)?;
        let tables: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type='table'",
                [],
                |r| r.get(0),
            )
            .map_err(e)?;
        if tables > 0 && version != SCHEMA_VERSION {
            return Err(format!(
                "schema version {version}, this care reads version {SCHEMA_VERSION}: use another cache file"
            ));
        }
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS llm_calls (
                key TEXT PRIMARY KEY,
                role TEXT NOT NULL,
                model TEXT NOT NULL,
                attempt INTEGER NOT NULL,
                content TEXT NOT NULL,
                prompt_tokens INTEGER NOT NULL,
                completion_tokens INTEGER NOT NULL,
                created_unix INTEGER NOT NULL
            );",
        )
        .map_err(e)?;
        conn.execute_batch(&format!("PRAGMA user_version={SCHEMA_VERSION};"))
            .map_err(e)?;
        Ok(SqliteStore {
            conn: Mutex::new(conn),
            reader: None,
            _checkpointer: None,
        })
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Connection>, String> {
        self.conn
            .lock()
            .map_err(|_| "cache lock poisoned".to_owned())
    }

    fn get(&self, key: &str) -> Result<Option<Completion>, String> {
        match &self.reader {
            Some(r) => {
                let conn = r.lock().map_err(|_| "cache lock poisoned".to_owned())?;
                Self::get_in(&conn, key)
            }
            None => Self::get_in(&*self.lock()?, key),
        }
    }

    fn get_in(conn: &Connection, key: &str) -> Result<Option<Completion>, String> {
        conn.prepare_cached(
            "SELECT content, prompt_tokens, completion_tokens FROM llm_calls WHERE key = ?1",
        )
        .and_then(|mut st| {
            st.query_row(params![key], |r| {
                Ok(Completion {
                    content: r.get(0)?,
                    usage: Usage {
                        prompt_tokens: r.get::<_, i64>(1)?.max(0) as u64,
                        completion_tokens: r.get::<_, i64>(2)?.max(0) as u64,
                    },
                    attempts: 0,
                })
            })
            .optional()
        })
        .map_err(|e| e.to_string())
    }

    /// [`SqliteStore::put_once`] without waiting: `None` when the commit would wait (another
    /// commit of this process holds the connection, or another process the write lock); then
    /// the caller commits with `put_once` on a blocking thread.
    fn put_once_now(&self, key: &str, v: &StoredCall) -> Option<Result<Completion, String>> {
        if self.reader.is_none() {
            // A memory store: nothing to wait for but the connection.
            return Some(self.put_once(key, v));
        }
        let conn = self.conn.try_lock().ok()?;
        match Self::insert_in(&conn, key, v) {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if matches!(
                    e.code,
                    rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
                ) =>
            {
                None
            }
            r => Some(r.map_err(|e| e.to_string())),
        }
    }

    /// Inserts unless the key has a row (committed before it returns); the row's answer.
    fn put_once(&self, key: &str, v: &StoredCall) -> Result<Completion, String> {
        let conn = self.lock()?;
        if self.reader.is_none() {
            return Self::insert_in(&conn, key, v).map_err(|e| e.to_string());
        }
        // The connection answers busy at once (for `put_once_now`); here the commit may wait.
        conn.busy_timeout(BUSY_TIMEOUT).map_err(|e| e.to_string())?;
        let r = Self::insert_in(&conn, key, v).map_err(|e| e.to_string());
        conn.busy_timeout(Duration::ZERO)
            .map_err(|e| e.to_string())?;
        r
    }

    fn insert_in(
        conn: &Connection,
        key: &str,
        v: &StoredCall,
    ) -> Result<Completion, rusqlite::Error> {
        let inserted = conn
            .prepare_cached(
                "INSERT OR IGNORE INTO llm_calls
                 (key, role, model, attempt, content, prompt_tokens, completion_tokens, created_unix)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )
            .and_then(|mut st| {
                st.execute(params![
                    key,
                    v.role,
                    v.model,
                    v.attempt,
                    v.content,
                    v.prompt_tokens.min(i64::MAX as u64) as i64,
                    v.completion_tokens.min(i64::MAX as u64) as i64,
                    v.created_unix
                ])
            })?;
        if inserted == 1 {
            return Ok(v.completion());
        }
        let stored = conn
            .prepare_cached(
                "SELECT content, prompt_tokens, completion_tokens FROM llm_calls WHERE key = ?1",
            )?
            .query_row(params![key], |r| {
                Ok(Completion {
                    content: r.get(0)?,
                    usage: Usage {
                        prompt_tokens: r.get::<_, i64>(1)?.max(0) as u64,
                        completion_tokens: r.get::<_, i64>(2)?.max(0) as u64,
                    },
                    attempts: 0,
                })
            })
            .optional()?;
        Ok(stored.unwrap_or_else(|| v.completion()))
    }

    fn len(&self) -> Result<u64, String> {
        let reader = match &self.reader {
            Some(r) => r.lock().map_err(|_| "cache lock poisoned".to_owned())?,
            None => self.lock()?,
        };
        reader
            .query_row("SELECT count(*) FROM llm_calls", [], |r| r.get::<_, i64>(0))
            .map(|n| n.max(0) as u64)
            .map_err(|e| e.to_string())
    }
}

// ---------------------------------------------------------------------------------------------
// Redis

/// The answer if there is one, else the lease if free: `{1, value}`, `{2, nil}` (leased) or
/// `{3, nil}` (another holder). KEYS: call, lease. ARGV: token, lease ms.
const LOOKUP_LUA: &str = r"
local v = redis.call('GET', KEYS[1])
if v then return {1, v} end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return {2, false} end
return {3, false}
";

/// Writes the answer unless one exists, and drops the caller's lease: the stored answer if
/// there was one, else nil. KEYS: call, lease. ARGV: value, ttl seconds (0: none), token.
const FINISH_LUA: &str = r"
local old = redis.call('GET', KEYS[1])
if not old then
  if tonumber(ARGV[2]) > 0 then
    redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
  else
    redis.call('SET', KEYS[1], ARGV[1])
  end
end
if ARGV[3] ~= '' and redis.call('GET', KEYS[2]) == ARGV[3] then redis.call('DEL', KEYS[2]) end
return old
";

/// Extends the caller's lease (1) or says it is no longer the holder (0). KEYS: lease.
/// ARGV: token, lease ms.
const RENEW_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
";

/// Drops the caller's lease. KEYS: lease. ARGV: token.
const RELEASE_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
";

struct RedisStore {
    /// The URL without its password (messages).
    label: String,
    conns: Vec<ConnectionManager>,
    next: AtomicUsize,
    ttl_secs: u64,
    lease: Duration,
    op_timeout: Duration,
    probe_every: Duration,
    /// `cache.when_down` is `refuse`.
    refuse: bool,
    prefix: String,
    up: AtomicBool,
    probing: AtomicBool,
    tokens: AtomicU64,
    token_seed: RandomState,
    local: Mutex<Local>,
    lookup_lua: Script,
    finish_lua: Script,
    renew_lua: Script,
    release_lua: Script,
    metrics: Arc<OnceLock<Arc<Metrics>>>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("url", &self.label)
            .field("up", &self.up.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Calls made while the store was down, for lookups until it returns and then written to it.
#[derive(Debug, Default)]
struct Local {
    calls: HashMap<String, StoredCall>,
    bytes: usize,
}

/// Why the store did not answer.
enum StoreError {
    /// Unreachable, timed out, or answered an error: the store is marked down.
    Down(String),
    /// It answered, but with another schema or an unreadable value.
    Bad(String),
}

impl RedisStore {
    async fn connect(
        url: &str,
        cfg: &CacheConfig,
        metrics: Arc<OnceLock<Arc<Metrics>>>,
    ) -> Result<Arc<RedisStore>, String> {
        let mut info = url
            .into_connection_info()
            .map_err(|e| format!("--cache {}: {e}", redact(url)))?;
        if let Some(var) = &cfg.password_env {
            let pw = std::env::var(var).map_err(|_| {
                format!("cache.password_env names {var}, which is not set in the environment")
            })?;
            let settings = info.redis_settings().clone().set_password(pw);
            info = info.set_redis_settings(settings);
        }
        // Small request, small answer, one at a time per key: Nagle's algorithm against the
        // server's delayed ACKs would add up to 40 ms to a command.
        let tcp = info.tcp_settings().clone().set_nodelay(true);
        info = info.set_tcp_settings(tcp);
        let client = redis::Client::open(info).map_err(|e| format!("--cache: {e}"))?;
        let op_timeout = Duration::from_secs_f64(cfg.op_timeout_secs);
        let mut conns = Vec::with_capacity(cfg.pool_size);
        for _ in 0..cfg.pool_size {
            // Lazy: a store that is down at start is reached when it comes up. One reconnect
            // try per command: an outage is handled here (degraded mode), not by waiting.
            let mc = redis::aio::ConnectionManagerConfig::new()
                .set_connection_timeout(Some(op_timeout))
                .set_response_timeout(Some(op_timeout))
                .set_number_of_retries(1)
                .set_max_delay(op_timeout);
            conns.push(
                ConnectionManager::new_lazy_with_config(client.clone(), mc)
                    .map_err(|e| format!("--cache: {e}"))?,
            );
        }
        let store = Arc::new(RedisStore {
            label: redact(url),
            conns,
            next: AtomicUsize::new(0),
            ttl_secs: cfg.ttl_secs.unwrap_or(0),
            lease: Duration::from_secs_f64(cfg.lease_secs),
            op_timeout,
            probe_every: Duration::from_secs_f64(cfg.probe_secs),
            refuse: cfg.when_down == "refuse",
            prefix: cfg.key_prefix.clone(),
            up: AtomicBool::new(false),
            probing: AtomicBool::new(false),
            tokens: AtomicU64::new(0),
            token_seed: RandomState::new(),
            local: Mutex::new(Local::default()),
            lookup_lua: Script::new(LOOKUP_LUA),
            finish_lua: Script::new(FINISH_LUA),
            renew_lua: Script::new(RENEW_LUA),
            release_lua: Script::new(RELEASE_LUA),
            metrics,
        });
        match store.check().await {
            Ok(()) => {
                store.up.store(true, Ordering::Release);
                Ok(store)
            }
            Err(StoreError::Bad(e)) => Err(format!("--cache {}: {e}", store.label)),
            Err(StoreError::Down(e)) => {
                store.down(&e);
                Ok(store)
            }
        }
    }

    fn conn(&self) -> ConnectionManager {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.conns.len();
        self.conns[i].clone()
    }

    fn key(&self, kind: &str, key: &str) -> String {
        format!("{}{kind}:{key}", self.prefix)
    }

    /// One command (or script) under the op timeout; any failure marks the store down.
    async fn run<T, Fut>(&self, fut: Fut) -> Result<T, StoreError>
    where
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        match tokio::time::timeout(self.op_timeout, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(StoreError::Down(e.to_string())),
            Err(_) => Err(StoreError::Down(format!(
                "no answer within {:?}",
                self.op_timeout
            ))),
        }
    }

    /// Whether the store answers, with our schema, on a server that has `SET ... NX GET`
    /// semantics we rely on (Redis 7 or later, or Valkey).
    async fn check(&self) -> Result<(), StoreError> {
        let mut c = self.conn();
        let schema_key = format!("{}schema", self.prefix);
        let mut set = redis::cmd("SET");
        set.arg(&schema_key).arg(SCHEMA_VERSION).arg("NX");
        let _: Option<String> = self.run(set.query_async(&mut c)).await?;
        let mut get = redis::cmd("GET");
        get.arg(&schema_key);
        let v: Option<String> = self.run(get.query_async(&mut c)).await?;
        if v.as_deref() != Some(&SCHEMA_VERSION.to_string()) {
            return Err(StoreError::Bad(format!(
                "{schema_key} is {v:?}, this care reads schema version {SCHEMA_VERSION}: use another key_prefix or database"
            )));
        }
        let mut info = redis::cmd("INFO");
        info.arg("server");
        let text: String = self.run(info.query_async(&mut c)).await?;
        let major = text
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .and_then(|v| v.trim().split('.').next()?.parse::<u32>().ok());
        match major {
            Some(m) if m >= 7 => Ok(()),
            _ => Err(StoreError::Bad(format!(
                "the server reports redis_version {:?}; care needs Redis 7 or later (or Valkey)",
                text.lines()
                    .find_map(|l| l.strip_prefix("redis_version:"))
                    .unwrap_or("?")
                    .trim()
            ))),
        }
    }

    fn gauge(&self, degraded: bool) {
        if let Some(m) = self.metrics.get() {
            m.cache_degraded(degraded);
        }
    }

    /// Marks the store down (once per outage: one line on stderr) and starts the probe.
    fn down(self: &Arc<Self>, why: &str) {
        if let Some(m) = self.metrics.get() {
            m.cache_error();
        }
        if self.up.swap(false, Ordering::AcqRel) || !self.probing.load(Ordering::Acquire) {
            eprintln!(
                "care: the shared cache {} is unreachable ({why}): serving without it (calls are not shared with other replicas) until it answers again",
                self.label
            );
            self.gauge(true);
        }
        if !self.probing.swap(true, Ordering::AcqRel) {
            let me = Arc::clone(self);
            tokio::spawn(async move { me.probe().await });
        }
    }

    /// Until the store answers: then the calls made meanwhile are written to it and it is used
    /// again.
    async fn probe(self: Arc<Self>) {
        loop {
            tokio::time::sleep(self.probe_every).await;
            match self.check().await {
                Ok(()) => {}
                Err(StoreError::Down(_)) => continue,
                Err(StoreError::Bad(e)) => {
                    eprintln!("care: the shared cache {}: {e}", self.label);
                    continue;
                }
            }
            if self.write_back().await.is_err() {
                continue;
            }
            self.up.store(true, Ordering::Release);
            self.probing.store(false, Ordering::Release);
            // Calls kept between the first write-back and `up`.
            let _ = self.write_back().await;
            self.gauge(false);
            eprintln!(
                "care: the shared cache {} answers again: calls are shared from now on",
                self.label
            );
            return;
        }
    }

    /// Writes the calls kept in memory during the outage (once each: a key another replica
    /// filled meanwhile keeps that replica's answer).
    async fn write_back(&self) -> Result<(), StoreError> {
        let kept: Vec<(String, StoredCall)> = {
            let l = self
                .local
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            l.calls
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        };
        for (key, value) in kept {
            self.finish_raw(&key, &value, None).await?;
            let mut l = self
                .local
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(v) = l.calls.remove(&key) {
                l.bytes = l.bytes.saturating_sub(v.content.len());
            }
        }
        Ok(())
    }

    fn local_get(&self, key: &str) -> Option<Completion> {
        let l = self
            .local
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        l.calls.get(key).map(StoredCall::completion)
    }

    fn keep_local(&self, key: &str, value: StoredCall) {
        let mut l = self
            .local
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if l.calls.contains_key(key)
            || l.calls.len() >= DEGRADED_MAX_ENTRIES
            || l.bytes + value.content.len() > DEGRADED_MAX_BYTES
        {
            return;
        }
        l.bytes += value.content.len();
        l.calls.insert(key.to_owned(), value);
    }

    fn token(&self) -> String {
        // Two 64-bit values from this process's random hasher seed: unique across replicas.
        let n = self.tokens.fetch_add(1, Ordering::Relaxed);
        let mut a = self.token_seed.build_hasher();
        a.write_u64(n);
        let mut b = self.token_seed.build_hasher();
        b.write_u64(!n);
        format!("{:016x}{:016x}", a.finish(), b.finish())
    }

    async fn get(self: &Arc<Self>, key: &str) -> Result<Option<Completion>, String> {
        if !self.up.load(Ordering::Acquire) {
            return Err(format!("the shared cache {} is down", self.label));
        }
        let mut c = self.conn();
        let mut get = redis::cmd("GET");
        get.arg(self.key("call", key));
        match self.run(get.query_async::<Option<String>>(&mut c)).await {
            Ok(None) => Ok(None),
            Ok(Some(text)) => StoredCall::decode(&text).map(|v| Some(v.completion())),
            Err(StoreError::Down(e)) => {
                self.down(&e);
                Err(e)
            }
            Err(StoreError::Bad(e)) => Err(e),
        }
    }

    async fn lookup(self: &Arc<Self>, key: &str) -> Lookup {
        if !self.up.load(Ordering::Acquire) {
            return self.local_get(key).map_or(Lookup::Down, Lookup::Hit);
        }
        let token = self.token();
        let mut c = self.conn();
        let ms = self.lease.as_millis().max(1) as u64;
        let call = self.key("call", key);
        let lease_key = self.key("lease", key);
        let mut inv = self.lookup_lua.prepare_invoke();
        inv.key(&call).key(&lease_key).arg(&token).arg(ms);
        let r: Result<(u8, Option<String>), _> = self.run(inv.invoke_async(&mut c)).await;
        match r {
            Ok((1, Some(text))) => match StoredCall::decode(&text) {
                Ok(v) => Lookup::Hit(v.completion()),
                Err(e) => {
                    // Unreadable (another version): call the LLM; the value stays as it is.
                    if let Some(m) = self.metrics.get() {
                        m.cache_error();
                    }
                    eprintln!("care: shared cache {}: {call}: {e}", self.label);
                    Lookup::Unknown
                }
            },
            Ok((2, _)) => Lookup::Make(Some(Lease {
                key: lease_key,
                token,
            })),
            Ok(_) => Lookup::Busy,
            Err(StoreError::Down(e)) => {
                self.down(&e);
                self.local_get(key).map_or(Lookup::Down, Lookup::Hit)
            }
            Err(StoreError::Bad(_)) => Lookup::Unknown,
        }
    }

    /// The finish script: stores `value` unless the key has an answer; the earlier answer.
    async fn finish_raw(
        &self,
        key: &str,
        value: &StoredCall,
        lease: Option<&Lease>,
    ) -> Result<Option<String>, StoreError> {
        let text = serde_json::to_string(value)
            .map_err(|e| StoreError::Bad(format!("cannot encode a call: {e}")))?;
        let mut c = self.conn();
        let mut inv = self.finish_lua.prepare_invoke();
        inv.key(self.key("call", key))
            .key(lease.map_or_else(|| self.key("lease", key), |l| l.key.clone()))
            .arg(text)
            .arg(self.ttl_secs)
            .arg(lease.map_or("", |l| l.token.as_str()));
        self.run(inv.invoke_async(&mut c)).await
    }

    async fn put_once(
        self: &Arc<Self>,
        key: &str,
        value: &StoredCall,
        lease: Option<&Lease>,
    ) -> Result<Completion, String> {
        if !self.up.load(Ordering::Acquire) {
            return Err(format!("the shared cache {} is down", self.label));
        }
        match self.finish_raw(key, value, lease).await {
            Ok(None) => Ok(value.completion()),
            Ok(Some(old)) => Ok(
                StoredCall::decode(&old).map_or_else(|_| value.completion(), |v| v.completion())
            ),
            Err(StoreError::Down(e)) => {
                self.down(&e);
                Err(e)
            }
            Err(StoreError::Bad(e)) => Err(e),
        }
    }

    async fn renew(&self, lease: &Lease) -> bool {
        let mut c = self.conn();
        let mut inv = self.renew_lua.prepare_invoke();
        inv.key(&lease.key)
            .arg(&lease.token)
            .arg(self.lease.as_millis().max(1) as u64);
        matches!(self.run(inv.invoke_async::<i64>(&mut c)).await, Ok(1))
    }

    async fn release(&self, lease: &Lease) {
        let mut c = self.conn();
        let mut inv = self.release_lua.prepare_invoke();
        inv.key(&lease.key).arg(&lease.token);
        // A failed release only delays a takeover until the lease expires.
        let _ = self.run(inv.invoke_async::<i64>(&mut c)).await;
    }

    async fn len(self: &Arc<Self>) -> Result<u64, String> {
        let mut c = self.conn();
        let pattern = format!("{}call:*", self.prefix);
        let mut cursor: u64 = 0;
        let mut n = 0u64;
        loop {
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000);
            let (next, keys): (u64, Vec<String>) = match self.run(scan.query_async(&mut c)).await {
                Ok(v) => v,
                Err(StoreError::Down(e) | StoreError::Bad(e)) => return Err(e),
            };
            n += keys.len() as u64;
            if next == 0 {
                return Ok(n);
            }
            cursor = next;
        }
    }
}

/// A held lease: renewed every third of its duration while the call runs; released (or left
/// to expire, if the process dies) when dropped.
struct LeaseGuard {
    store: Option<Arc<RedisStore>>,
    lease: Option<Lease>,
    renew: Option<tokio::task::JoinHandle<()>>,
}

impl LeaseGuard {
    fn new(store: Arc<RedisStore>, lease: Lease) -> LeaseGuard {
        let (s, key, token) = (Arc::clone(&store), lease.key.clone(), lease.token.clone());
        let renew = tokio::spawn(async move {
            let l = Lease { key, token };
            loop {
                tokio::time::sleep(s.lease / 3).await;
                if !s.renew(&l).await {
                    // Lost (expired while the store was unreachable): the call goes on; the
                    // answer is still written once.
                    return;
                }
            }
        });
        LeaseGuard {
            store: Some(store),
            lease: Some(lease),
            renew: Some(renew),
        }
    }

    /// Stops renewing and hands the lease over (the finish script drops it).
    fn into_lease(mut self) -> Option<Lease> {
        if let Some(r) = self.renew.take() {
            r.abort();
        }
        self.lease.take()
    }

    async fn release(mut self) {
        if let Some(r) = self.renew.take() {
            r.abort();
        }
        if let (Some(s), Some(l)) = (self.store.take(), self.lease.take()) {
            s.release(&l).await;
        }
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if let Some(r) = self.renew.take() {
            r.abort();
        }
        // Dropped with the lease (the request was cancelled): let the others take over now.
        if let (Some(s), Some(l)) = (self.store.take(), self.lease.take())
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            rt.spawn(async move { s.release(&l).await });
        }
    }
}

/// `redis://:secret@host` without the secret (messages never carry it).
fn redact(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            }
            u.to_string()
        }
        Err(_) => "(an unparsable URL)".to_owned(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

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
