//! The SQLite store: one file on the replica's disk (or memory, for tests).

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};

use super::{SCHEMA_VERSION, StoredCall};
use crate::llm::{Completion, Usage};

#[derive(Debug)]
pub(super) struct SqliteStore {
    /// Commits (and everything of a memory store).
    conn: Mutex<Connection>,
    /// Lookups of a file store, on their own connection: in WAL mode a reader never waits for
    /// a writer, so a lookup never waits behind a commit that waits for another process.
    reader: Option<Mutex<Connection>>,
    /// The checkpointer thread of a file store (memory has none) and the sender whose drop
    /// stops it; joined on drop.
    checkpointer: Option<(std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>)>,
}

impl Drop for SqliteStore {
    fn drop(&mut self) {
        // Joined, so its connection closes before this store's: the last connection to close
        // removes the write-ahead log and its index (a process that ends right after a run
        // leaves the one database file, not a -wal and -shm beside it).
        if let Some((stop, thread)) = self.checkpointer.take() {
            drop(stop);
            let _ = thread.join();
        }
    }
}

/// How long a commit waits for another process's write lock (on a blocking thread).
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// How often the checkpointer copies the write-ahead log into the database file.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);

impl SqliteStore {
    pub(super) fn open(path: &Path) -> Result<SqliteStore, String> {
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
        let thread = std::thread::Builder::new()
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
        store.checkpointer = Some((stop, thread));
        Ok(store)
    }

    pub(super) fn in_memory() -> Result<SqliteStore, String> {
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
            checkpointer: None,
        })
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Connection>, String> {
        self.conn
            .lock()
            .map_err(|_| "cache lock poisoned".to_owned())
    }

    pub(super) fn get(&self, key: &str) -> Result<Option<Completion>, String> {
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
    pub(super) fn put_once_now(
        &self,
        key: &str,
        v: &StoredCall,
    ) -> Option<Result<Completion, String>> {
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
    pub(super) fn put_once(&self, key: &str, v: &StoredCall) -> Result<Completion, String> {
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

    pub(super) fn len(&self) -> Result<u64, String> {
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
