//! The durable cache: every completed LLM call, in one SQLite file.
//!
//! A call is keyed by the SHA-256 of exactly what determines its answer: the role, the model,
//! the sampling parameters, the messages sent (for the generator: the system prompt, which is
//! the prompt version, and the dialogue; for the judge: the prompt rendered from the rubric,
//! the dialogue and the response) and the attempt number (a retry after an unusable answer
//! is another call). So the rubric of a turn is keyed by context, generator model and prompt
//! version, a judgment by rubric, context, response and judge model, and a changed prompt or
//! parameter is a new key: nothing stale is ever served.
//!
//! Only completed calls are stored (a call that failed after its retries is asked again on
//! the next run). Each is committed on its own as soon as it completes (WAL journal,
//! `synchronous=NORMAL`: a killed process loses nothing committed; a power cut may lose the
//! last few calls, which are then asked again).

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{Connection, OptionalExtension, params};
use sha2::{Digest, Sha256};

use crate::llm::{ChatMessage, Completion, Role, Usage};

/// The schema version in `PRAGMA user_version`; another number is refused, never migrated
/// silently.
pub const SCHEMA_VERSION: i64 = 1;

/// The cache file.
#[derive(Debug)]
pub struct Cache {
    conn: Mutex<Connection>,
}

/// The key of one call (hex SHA-256).
pub fn call_key(
    role: Role,
    model: &str,
    sampling: &str,
    messages: &[ChatMessage],
    attempt: u32,
) -> String {
    let mut h = Sha256::new();
    // Length-prefixed fields: no two different inputs give the same byte stream.
    let mut field = |b: &[u8]| {
        h.update((b.len() as u64).to_le_bytes());
        h.update(b);
    };
    field(b"care-loop/call/v1");
    field(role.as_str().as_bytes());
    field(model.as_bytes());
    field(sampling.as_bytes());
    field(&attempt.to_le_bytes());
    for m in messages {
        field(m.role.as_bytes());
        field(m.content.as_bytes());
    }
    let digest = h.finalize();
    let mut s = String::with_capacity(64);
    for b in digest {
        use std::fmt::Write;
        let _ = write!(s, "{b:02x}");
    }
    s
}

impl Cache {
    /// Opens (or creates) the cache file.
    ///
    /// # Errors
    /// The file cannot be opened or created, is not a SQLite database, or has another schema.
    pub fn open(path: &Path) -> Result<Cache, String> {
        let conn = Connection::open(path)
            .map_err(|e| format!("cannot open cache {}: {e}", path.display()))?;
        Self::init(conn).map_err(|e| format!("cache {}: {e}", path.display()))
    }

    /// A cache in memory (tests; nothing survives the process).
    ///
    /// # Errors
    /// SQLite cannot start.
    pub fn in_memory() -> Result<Cache, String> {
        let conn = Connection::open_in_memory().map_err(|e| e.to_string())?;
        Self::init(conn)
    }

    fn init(conn: Connection) -> Result<Cache, String> {
        let e = |e: rusqlite::Error| e.to_string();
        conn.busy_timeout(std::time::Duration::from_secs(10))
            .map_err(e)?;
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
        Ok(Cache {
            conn: Mutex::new(conn),
        })
    }

    /// The stored answer of `key`.
    ///
    /// # Errors
    /// A database error.
    pub fn get(&self, key: &str) -> Result<Option<Completion>, String> {
        let conn = self
            .conn
            .lock()
            .map_err(|_| "cache lock poisoned".to_owned())?;
        conn.query_row(
            "SELECT content, prompt_tokens, completion_tokens FROM llm_calls WHERE key = ?1",
            params![key],
            |r| {
                Ok(Completion {
                    content: r.get(0)?,
                    usage: Usage {
                        prompt_tokens: r.get::<_, i64>(1)?.max(0) as u64,
                        completion_tokens: r.get::<_, i64>(2)?.max(0) as u64,
                    },
                    attempts: 0,
                })
            },
        )
        .optional()
        .map_err(|e| e.to_string())
    }

    /// Stores a completed call (committed before it returns).
    ///
    /// # Errors
    /// A database error (disk full, read-only file).
    pub fn put(
        &self,
        key: &str,
        role: Role,
        model: &str,
        attempt: u32,
        c: &Completion,
    ) -> Result<(), String> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let conn = self
            .conn
            .lock()
            .map_err(|_| "cache lock poisoned".to_owned())?;
        conn.execute(
            "INSERT OR REPLACE INTO llm_calls
             (key, role, model, attempt, content, prompt_tokens, completion_tokens, created_unix)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![
                key,
                role.as_str(),
                model,
                attempt,
                c.content,
                c.usage.prompt_tokens.min(i64::MAX as u64) as i64,
                c.usage.completion_tokens.min(i64::MAX as u64) as i64,
                now
            ],
        )
        .map(|_| ())
        .map_err(|e| e.to_string())
    }

    /// Number of stored calls.
    ///
    /// # Errors
    /// A database error.
    pub fn len(&self) -> Result<u64, String> {
        let conn = self
            .conn
            .lock()
            .map_err(|_| "cache lock poisoned".to_owned())?;
        conn.query_row("SELECT count(*) FROM llm_calls", [], |r| r.get::<_, i64>(0))
            .map(|n| n.max(0) as u64)
            .map_err(|e| e.to_string())
    }

    /// Whether no call is stored.
    ///
    /// # Errors
    /// A database error.
    pub fn is_empty(&self) -> Result<bool, String> {
        self.len().map(|n| n == 0)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
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
    }

    #[test]
    fn survives_reopen_and_refuses_another_schema() {
        let dir = std::env::temp_dir().join(format!("care-cache-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.sqlite");
        let _ = std::fs::remove_file(&path);
        let c = Completion {
            content: "answer".into(),
            usage: Usage {
                prompt_tokens: 3,
                completion_tokens: 4,
            },
            attempts: 2,
        };
        {
            let cache = Cache::open(&path).unwrap();
            assert!(cache.is_empty().unwrap());
            cache.put("k", Role::Judge, "m", 1, &c).unwrap();
        }
        let cache = Cache::open(&path).unwrap();
        let got = cache.get("k").unwrap().unwrap();
        assert_eq!(got.content, "answer");
        assert_eq!(got.usage, c.usage);
        assert_eq!(cache.get("other").unwrap(), None);
        drop(cache);
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch("PRAGMA user_version=99;").unwrap();
        drop(conn);
        let err = Cache::open(&path).unwrap_err();
        assert!(err.contains("schema version 99"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
