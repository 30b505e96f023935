//! The replicas behind one endpoint: which base URL an HTTP attempt goes to.
//!
//! An endpoint's `base_url` may list several replicas serving one model (vLLM or SGLang
//! servers behind no router). Each attempt goes to the replica with the fewest requests in
//! flight, ties taken in turn. A replica whose attempt fails (timeout, connection error, HTTP
//! 429 or 5xx, an answer that is not a chat completion) is ejected: no request goes to it for
//! `eject_secs`, doubled per consecutive failure up to `eject_max_secs`, or for the
//! `Retry-After` it sent; then one request at a time probes it, and a success takes it back.
//! When every replica is ejected, the one whose ejection ends first is tried anyway (the
//! retry loop's backoff spaces those attempts), so a pool of one URL behaves as that URL.
//!
//! The pool only chooses; the attempt itself, its timeouts and the retry policy stay in
//! [`crate::llm::HttpEndpoint`].

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use crate::config::EndpointConfig;

/// One replica.
#[derive(Debug)]
pub(crate) struct Member {
    /// `{base_url}/chat/completions`.
    pub(crate) url: String,
    /// The base URL without credentials: the `base_url` label of the metrics.
    pub(crate) label: String,
    /// Requests chosen for this replica and not finished (waiting for a permit included).
    in_flight: AtomicUsize,
    /// Bounds the requests in flight to this replica (`max_concurrency`).
    pub(crate) permits: Semaphore,
    health: Mutex<Health>,
}

#[derive(Debug, Default)]
struct Health {
    /// Consecutive failed attempts.
    failures: u32,
    /// No request before this instant (unless every replica is ejected).
    ejected_until: Option<Instant>,
    /// A probe is in flight (after an ejection, one request at a time until one succeeds).
    probing: bool,
}

/// The replicas of one endpoint.
#[derive(Debug)]
pub(crate) struct Pool {
    members: Vec<Member>,
    /// Where the scan for the least loaded replica starts (ties in turn).
    next: AtomicUsize,
    eject: Duration,
    eject_max: Duration,
}

/// A replica chosen for one attempt; its in-flight count drops when this is dropped.
#[derive(Debug)]
pub(crate) struct Chosen<'a> {
    pub(crate) index: usize,
    pub(crate) member: &'a Member,
    probe: bool,
    pool: &'a Pool,
}

impl Drop for Chosen<'_> {
    fn drop(&mut self) {
        self.member.in_flight.fetch_sub(1, Ordering::Relaxed);
        if self.probe {
            // A probe that ended without a verdict (cancelled) lets the next one go.
            let mut h = self.pool.health(self.index);
            h.probing = false;
        }
    }
}

/// What an attempt's outcome says about the replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// It answered: healthy.
    Healthy,
    /// It failed in a way that is the replica's (ejected; `Some` is its `Retry-After`).
    Failed(Option<Duration>),
    /// The failure says nothing about the replica (a 4xx other than 429: the request's fault).
    Neutral,
}

impl Pool {
    /// The pool of `cfg.base_url` (checked by [`EndpointConfig::check`]).
    pub(crate) fn new(cfg: &EndpointConfig) -> Pool {
        let members = cfg
            .base_url
            .urls()
            .iter()
            .map(|u| {
                let base = u.trim().trim_end_matches('/');
                Member {
                    url: format!("{base}/chat/completions"),
                    label: without_credentials(base),
                    in_flight: AtomicUsize::new(0),
                    permits: Semaphore::new(cfg.max_concurrency),
                    health: Mutex::new(Health::default()),
                }
            })
            .collect();
        Pool {
            members,
            next: AtomicUsize::new(0),
            eject: Duration::from_secs_f64(cfg.eject_secs),
            eject_max: Duration::from_secs_f64(cfg.eject_max_secs),
        }
    }

    fn health(&self, i: usize) -> std::sync::MutexGuard<'_, Health> {
        self.members[i]
            .health
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The replicas.
    #[cfg(test)]
    pub(crate) fn members(&self) -> &[Member] {
        &self.members
    }

    /// Chooses the replica of the next attempt: the available one with the fewest in flight,
    /// ties in turn, `avoid` (the replica that just failed) only when nothing else is
    /// available; when every replica is ejected, the one whose ejection ends first.
    pub(crate) fn choose(&self, avoid: Option<usize>) -> Chosen<'_> {
        let n = self.members.len();
        let now = Instant::now();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let mut best: Option<(usize, usize, bool)> = None; // (index, in flight, probe)
        let mut best_avoided: Option<(usize, usize, bool)> = None;
        for k in 0..n {
            let i = (start + k) % n;
            let (available, probe) = {
                let h = self.health(i);
                match h.ejected_until {
                    Some(t) if t > now => (false, false),
                    // Ejected earlier, the period is over: one probe at a time.
                    Some(_) => (!h.probing, true),
                    None => (true, false),
                }
            };
            if !available {
                continue;
            }
            let load = self.members[i].in_flight.load(Ordering::Relaxed);
            let slot = if Some(i) == avoid && n > 1 {
                &mut best_avoided
            } else {
                &mut best
            };
            if slot.is_none_or(|(_, l, _)| load < l) {
                *slot = Some((i, load, probe));
            }
        }
        let (index, probe) = match best.or(best_avoided) {
            Some((i, _, probe)) => (i, probe),
            None => {
                // Everything ejected (or being probed): the earliest end of an ejection.
                let i = (0..n)
                    .min_by_key(|&i| self.health(i).ejected_until)
                    .unwrap_or(0);
                (i, false)
            }
        };
        if probe {
            self.health(index).probing = true;
        }
        let member = &self.members[index];
        member.in_flight.fetch_add(1, Ordering::Relaxed);
        Chosen {
            index,
            member,
            probe,
            pool: self,
        }
    }

    /// Records an attempt's verdict on its replica; returns `true` when it was just ejected.
    pub(crate) fn record(&self, chosen: &mut Chosen<'_>, verdict: Verdict) -> bool {
        let mut h = self.health(chosen.index);
        if chosen.probe {
            h.probing = false;
            chosen.probe = false;
        }
        match verdict {
            Verdict::Healthy => {
                *h = Health::default();
                false
            }
            Verdict::Neutral => false,
            Verdict::Failed(retry_after) => {
                h.failures = h.failures.saturating_add(1);
                let doubling = 2f64.powi(h.failures.saturating_sub(1).min(30) as i32);
                let period = match retry_after {
                    Some(d) => d,
                    None => self.eject.mul_f64(doubling),
                }
                .min(self.eject_max);
                h.ejected_until = Some(Instant::now() + period);
                true
            }
        }
    }

    /// Whether a replica other than `index` can take an attempt now (then a retry goes there
    /// at once instead of after a backoff).
    pub(crate) fn other_available(&self, index: usize) -> bool {
        let now = Instant::now();
        (0..self.members.len()).any(|i| {
            i != index && {
                let h = self.health(i);
                match h.ejected_until {
                    Some(t) if t > now => false,
                    Some(_) => !h.probing,
                    None => true,
                }
            }
        })
    }

    /// Whether replica `index` is ejected or waiting for its probe (the metrics' gauge).
    pub(crate) fn is_ejected(&self, index: usize) -> bool {
        self.health(index).failures > 0
    }
}

/// `scheme://host[:port]/path` without `user:password@` (metrics labels never carry a secret).
fn without_credentials(base: &str) -> String {
    match reqwest::Url::parse(base) {
        Ok(mut u) => {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.as_str().trim_end_matches('/').to_owned()
        }
        Err(_) => base.to_owned(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn pool(urls: &[&str]) -> Pool {
        let cfg = EndpointConfig {
            eject_secs: 60.0,
            eject_max_secs: 120.0,
            ..EndpointConfig::new(
                urls.iter().map(|u| (*u).to_owned()).collect::<Vec<_>>(),
                "m",
            )
        };
        Pool::new(&cfg)
    }

    #[test]
    fn fewest_in_flight_first_and_ties_in_turn() {
        let p = pool(&["http://a/v1", "http://b/v1", "http://c/v1"]);
        // Idle pool: in turn.
        let seq: Vec<usize> = (0..6).map(|_| p.choose(None).index).collect();
        assert_eq!(seq, [0, 1, 2, 0, 1, 2]);
        // Two held on a, one on b: c, then b and c tie (in turn), never a.
        let a1 = p.choose(None);
        let b1 = p.choose(None);
        let _c1 = p.choose(None);
        let a2 = p.choose(None);
        assert_eq!((a1.index, b1.index, a2.index), (0, 1, 0));
        drop(b1);
        let next = p.choose(None);
        assert_eq!(next.index, 1, "b has the fewest in flight");
    }

    #[test]
    fn a_failing_replica_is_ejected_then_probed_back_once_at_a_time() {
        let p = pool(&["http://a/v1", "http://b/v1"]);
        let mut a = p.choose(None);
        assert_eq!(a.index, 0);
        assert!(p.record(&mut a, Verdict::Failed(None)));
        drop(a);
        assert!(p.is_ejected(0));
        assert!(!p.other_available(1), "a is ejected");
        for _ in 0..4 {
            assert_eq!(p.choose(None).index, 1);
        }
        // The period ends: one probe goes to a, the others to b until it succeeds.
        p.health(0).ejected_until = Some(Instant::now());
        let mut probe = p.choose(Some(1));
        assert_eq!(probe.index, 0);
        assert_eq!(p.choose(Some(1)).index, 1, "one probe at a time");
        assert!(!p.record(&mut probe, Verdict::Healthy));
        drop(probe);
        assert!(!p.is_ejected(0));
        let seq: Vec<usize> = (0..4).map(|_| p.choose(None).index).collect();
        assert!(seq.contains(&0) && seq.contains(&1));
    }

    #[test]
    fn retry_after_sets_the_period_of_the_replica_that_sent_it_and_failures_double() {
        let p = pool(&["http://a/v1", "http://b/v1"]);
        let mut a = p.choose(None);
        p.record(&mut a, Verdict::Failed(Some(Duration::from_secs(5))));
        let until = p.health(0).ejected_until.unwrap();
        let left = until - Instant::now();
        assert!(left <= Duration::from_secs(5) && left > Duration::from_secs(4));
        assert!(p.health(1).ejected_until.is_none(), "b is untouched");
        // Doubling without Retry-After, capped at eject_max_secs.
        for _ in 0..5 {
            p.record(&mut a, Verdict::Failed(None));
        }
        let left = p.health(0).ejected_until.unwrap() - Instant::now();
        assert!(left <= Duration::from_secs(120) && left > Duration::from_secs(119));
        // A 4xx is the request's fault: no verdict on the replica.
        let mut b = p.choose(None);
        assert_eq!(b.index, 1);
        assert!(!p.record(&mut b, Verdict::Neutral));
        assert!(!p.is_ejected(1));
    }

    #[test]
    fn a_pool_of_one_or_all_ejected_still_answers() {
        let p = pool(&["http://a/v1"]);
        let mut a = p.choose(None);
        p.record(&mut a, Verdict::Failed(None));
        drop(a);
        assert_eq!(p.choose(Some(0)).index, 0);
        let p = pool(&["http://a/v1", "http://b/v1"]);
        let mut a = p.choose(None);
        p.record(&mut a, Verdict::Failed(Some(Duration::from_secs(50))));
        let mut b = p.choose(None);
        p.record(&mut b, Verdict::Failed(Some(Duration::from_secs(10))));
        assert_eq!(p.choose(None).index, 1, "b's ejection ends first");
    }

    #[test]
    fn labels_carry_no_credentials() {
        let p = pool(&["https://user:secret@judge.example:8443/v1/"]);
        assert_eq!(p.members()[0].label, "https://judge.example:8443/v1");
        assert_eq!(
            p.members()[0].url,
            "https://user:secret@judge.example:8443/v1/chat/completions"
        );
    }
}
