//! The connections of `care serve`: a small accept loop around hyper's HTTP/1 connection
//! builder, because `axum::serve` installs no timer (so hyper's header-read timeout never
//! fires), has no connection cap, and waits for every connection without a deadline.
//!
//! * **Header-read and idle timeout.** hyper's `header_read_timeout` with a Tokio timer: from
//!   the accept, and again from the end of each response on a kept-alive connection, the
//!   next request's headers must be complete within `header_timeout`, or the connection is
//!   closed (a client that sends half a request, or nothing, holds a slot that long at most).
//! * **Connection cap.** At most `max_connections` connections are served; one more is
//!   answered `503` with a JSON error and closed (a few at a time; beyond that it is closed
//!   at once), so a flood of connections costs a bounded amount of memory and the server
//!   keeps answering the ones it holds.
//! * **Shutdown deadline.** On the shutdown signal nothing more is accepted, connections
//!   without a request in progress are closed at once, a request whose body is still arriving
//!   is answered 503 `shutting_down`, and requests in progress get `shutdown_timeout` to
//!   finish; then they are cut, and [`Stopped`] says what was cut.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use super::limits::Budget;
use crate::metrics::Metrics;

/// What a stop left undone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stopped {
    /// Requests whose handler still ran at the shutdown deadline, by route (cut).
    pub requests_cut: Vec<(&'static str, usize)>,
    /// Connections closed at the deadline.
    pub connections_cut: usize,
}

impl Stopped {
    /// One line for the log: what was cut, or that nothing was.
    pub fn summary(&self, deadline: Duration) -> String {
        if self.connections_cut == 0 && self.requests_cut.is_empty() {
            return "stopped after finishing the requests in flight".to_owned();
        }
        let n: usize = self.requests_cut.iter().map(|(_, n)| n).sum();
        let by_route: Vec<String> = self
            .requests_cut
            .iter()
            .map(|(r, n)| format!("{r}: {n}"))
            .collect();
        format!(
            "stopped at the shutdown deadline of {} s: cut {n} request(s) in flight ({}) on {} connection(s); their clients got no answer",
            deadline.as_secs_f64(),
            if by_route.is_empty() {
                "none had started".to_owned()
            } else {
                by_route.join(", ")
            },
            self.connections_cut
        )
    }
}

/// Connection-level limits (from [`super::ServerOptions`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnLimits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub shutdown_timeout: Duration,
}

/// A connection's read buffer (hyper's `max_buf_size`): the longest request head.
pub(crate) const MAX_BUF_BYTES: usize = 64 << 10;

/// Connections over the cap being answered 503 at once (beyond these they are just closed).
const REFUSERS: usize = 32;

/// Serves `router` on `listener` until `shutdown` completes, then stops as the module says.
pub(crate) async fn run(
    listener: TcpListener,
    router: Router,
    limits: ConnLimits,
    budget: Arc<Budget>,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<Stopped> {
    let slots = Arc::new(Semaphore::new(
        limits.max_connections.min(Semaphore::MAX_PERMITS),
    ));
    let refusers = Arc::new(Semaphore::new(REFUSERS));
    let (close_tx, close_rx) = watch::channel(false);
    let mut conns: JoinSet<()> = JoinSet::new();
    let mut aside: JoinSet<()> = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            Some(_) = aside.join_next(), if !aside.is_empty() => {}
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((s, _)) => s,
                    Err(e) => {
                        if !is_connection_error(&e) {
                            // Out of descriptors or memory: wait a moment instead of spinning.
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                match Arc::clone(&slots).try_acquire_owned() {
                    Ok(permit) => {
                        let (router, close_rx, metrics) =
                            (router.clone(), close_rx.clone(), Arc::clone(&metrics));
                        conns.spawn(async move {
                            metrics.connection(1);
                            serve_one(stream, router, limits.header_timeout, close_rx).await;
                            metrics.connection(-1);
                            drop(permit);
                        });
                    }
                    Err(_) => {
                        metrics.connection_refused();
                        if let Ok(p) = Arc::clone(&refusers).try_acquire_owned() {
                            aside.spawn(async move {
                                refuse(stream).await;
                                drop(p);
                            });
                        }
                    }
                }
            }
        }
    }
    drop(listener);
    aside.abort_all();
    budget.stopping.send_replace(true);
    let _ = close_tx.send(true);
    let drained = tokio::time::timeout(limits.shutdown_timeout, async {
        while conns.join_next().await.is_some() {}
    })
    .await;
    if drained.is_ok() {
        return Ok(Stopped::default());
    }
    let stopped = Stopped {
        requests_cut: budget.requests_in_flight(),
        connections_cut: conns.len(),
    };
    conns.abort_all();
    while conns.join_next().await.is_some() {}
    Ok(stopped)
}

/// One connection, until it closes or, after the shutdown signal, until its request in
/// progress (if any) is answered.
async fn serve_one(
    stream: TcpStream,
    router: Router,
    header_timeout: Duration,
    mut close_rx: watch::Receiver<bool>,
) {
    let active = Arc::new(AtomicUsize::new(0));
    let inner = TowerToHyperService::new(router);
    let counted = Arc::clone(&active);
    let svc = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let guard = Active::new(Arc::clone(&counted));
        let fut = hyper::service::Service::call(&inner, req);
        async move {
            let _guard = guard;
            fut.await
        }
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        // Headers (and what is read at once) up to 64 KiB a connection instead of hyper's
        // 400 KiB: a connection flood holds at most that much each (431 beyond it).
        .max_buf_size(MAX_BUF_BYTES)
        .keep_alive(true);
    let conn = builder.serve_connection(TokioIo::new(stream), svc);
    tokio::pin!(conn);
    let mut closing = *close_rx.borrow();
    if closing {
        return;
    }
    loop {
        tokio::select! {
            _ = conn.as_mut() => break,
            changed = close_rx.changed(), if !closing => {
                closing = true;
                if changed.is_err() || active.load(Ordering::SeqCst) == 0 {
                    // No request in progress: nothing to finish (a half-sent request is cut).
                    break;
                }
                // Answer the request in progress, then close (no keep-alive).
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// A request in progress on its connection (counted down when its handler ends or is
/// dropped).
struct Active(Arc<AtomicUsize>);

impl Active {
    fn new(n: Arc<AtomicUsize>) -> Active {
        n.fetch_add(1, Ordering::SeqCst);
        Active(n)
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Answers a connection over the cap with 503 and closes it (reading what the client sent
/// for a moment, so that the close does not reset the answer away).
async fn refuse(mut stream: TcpStream) {
    const BODY: &str = "{\"error\":{\"code\":\"too_many_connections\",\"message\":\"the server holds as many connections as --max-connections allows; retry later\"}}";
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n",
        BODY.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(BODY.as_bytes()).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        let mut left = 64usize << 10;
        while left > 0 {
            let n = stream.read(&mut sink).await?;
            if n == 0 {
                break;
            }
            left = left.saturating_sub(n);
        }
        io::Result::Ok(())
    })
    .await;
}

fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}
