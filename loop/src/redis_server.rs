//! A real `redis-server` on a free loopback port, for the tests and the load test (the shared
//! cache is tested against the real thing, not a double).
//!
//! The server runs in a fresh temporary directory with an append-only file (`appendfsync
//! everysec`: each write reaches the file before it is acknowledged and is synced to disk
//! within a second), so [`RedisServer::restart`] (a kill, then a start on the same port and
//! directory) brings back everything it had acknowledged, as a production store with
//! persistence would after a crash of its process.
//!
//! Where `redis-server` is not installed, [`RedisServer::start`] returns `Ok(None)` after a
//! line on stderr saying the caller is skipped, unless `CARE_REQUIRE_REDIS=1` (CI sets it),
//! where it is an error.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `redis-server`; killed and its directory removed when dropped.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    persist: bool,
}

impl RedisServer {
    /// Starts `redis-server` on a free port of 127.0.0.1; `who` names the caller in the skip
    /// message.
    ///
    /// # Errors
    /// The binary is absent while `CARE_REQUIRE_REDIS=1`, or the server does not come up.
    pub fn start(who: &str) -> Result<Option<RedisServer>, String> {
        Self::start_with(who, true)
    }

    /// [`RedisServer::start`], with or without the append-only file (`persist: false`: nothing
    /// touches the disk, as for a load test that measures the loop rather than the disk;
    /// [`RedisServer::restart`] then starts empty).
    ///
    /// # Errors
    /// As [`RedisServer::start`].
    pub fn start_with(who: &str, persist: bool) -> Result<Option<RedisServer>, String> {
        let found = Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            if std::env::var("CARE_REQUIRE_REDIS").as_deref() == Ok("1") {
                return Err(format!(
                    "{who}: redis-server is not installed and CARE_REQUIRE_REDIS=1 (apt-get install redis-server)"
                ));
            }
            eprintln!(
                "SKIPPED {who}: redis-server is not installed (apt-get install redis-server; CI sets CARE_REQUIRE_REDIS=1 and runs it)"
            );
            return Ok(None);
        }
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port: {e}"))?
            .port();
        let dir = std::env::temp_dir().join(format!(
            "care-redis-{}-{port}-{}",
            std::process::id(),
            who.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut s = RedisServer {
            child: None,
            port,
            dir,
            persist,
        };
        s.spawn()?;
        Ok(Some(s))
    }

    fn spawn(&mut self) -> Result<(), String> {
        let log = self.dir.join("redis.log");
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendfsync", "everysec", "--appendonly"])
            .arg(if self.persist { "yes" } else { "no" })
            .args(["--protected-mode", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start redis-server: {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if self.ping() {
                return Ok(());
            }
            if Instant::now() > deadline {
                let tail = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(format!(
                    "redis-server on port {} did not answer within 10 s; its log:\n{tail}",
                    self.port
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn ping(&self) -> bool {
        let Ok(client) = redis::Client::open(self.url()) else {
            return false;
        };
        let Ok(mut c) = client.get_connection_with_timeout(Duration::from_millis(200)) else {
            return false;
        };
        redis::cmd("PING")
            .query::<String>(&mut c)
            .is_ok_and(|p| p == "PONG")
    }

    /// `redis://127.0.0.1:<port>/0`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Kills the server (SIGKILL: a crash, not a shutdown).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port and directory (its append-only file restores the data).
    ///
    /// # Errors
    /// The server does not come up.
    pub fn restart(&mut self) -> Result<(), String> {
        self.kill();
        self.spawn()
    }

    /// A synchronous connection (tests look at the keys).
    ///
    /// # Errors
    /// The server does not answer.
    pub fn connection(&self) -> Result<redis::Connection, String> {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
            .map_err(|e| e.to_string())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
