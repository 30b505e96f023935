//! The Redis store shared by the replicas of a fleet: answers, leases, degraded mode.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{IntoConnectionInfo, Script};

use super::{DEGRADED_MAX_BYTES, DEGRADED_MAX_ENTRIES, Lease, Lookup, SCHEMA_VERSION, StoredCall};
use crate::config::CacheConfig;
use crate::llm::Completion;
use crate::metrics::Metrics;

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

pub(super) struct RedisStore {
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
    /// Whether the store answers (else the replica runs degraded).
    pub(super) fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// How long a lease lasts without renewal.
    pub(super) fn lease_duration(&self) -> Duration {
        self.lease
    }

    /// Whether calls are refused while the store is down (`cache.when_down: refuse`).
    pub(super) fn refuses(&self) -> bool {
        self.refuse
    }

    /// The URL without its password.
    pub(super) fn label(&self) -> &str {
        &self.label
    }

    pub(super) async fn connect(
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

    pub(super) fn keep_local(&self, key: &str, value: StoredCall) {
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

    pub(super) async fn get(self: &Arc<Self>, key: &str) -> Result<Option<Completion>, String> {
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

    pub(super) async fn lookup(self: &Arc<Self>, key: &str) -> Lookup {
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

    pub(super) async fn put_once(
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

    pub(super) async fn release(&self, lease: &Lease) {
        let mut c = self.conn();
        let mut inv = self.release_lua.prepare_invoke();
        inv.key(&lease.key).arg(&lease.token);
        // A failed release only delays a takeover until the lease expires.
        let _ = self.run(inv.invoke_async::<i64>(&mut c)).await;
    }

    pub(super) async fn len(self: &Arc<Self>) -> Result<u64, String> {
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
pub(super) struct LeaseGuard {
    store: Option<Arc<RedisStore>>,
    lease: Option<Lease>,
    renew: Option<tokio::task::JoinHandle<()>>,
}

impl LeaseGuard {
    pub(super) fn new(store: Arc<RedisStore>, lease: Lease) -> LeaseGuard {
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
    pub(super) fn into_lease(mut self) -> Option<Lease> {
        if let Some(r) = self.renew.take() {
            r.abort();
        }
        self.lease.take()
    }

    pub(super) async fn release(mut self) {
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
pub(super) fn redact(url: &str) -> String {
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
