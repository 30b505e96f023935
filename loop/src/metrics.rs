//! Prometheus metrics of the loop and the server (OpenMetrics text on `GET /metrics`).
//!
//! Every name is registered here once, under the prefix `care_`; `docs/REWARD_LOOP.md` lists
//! them. Labels take values from small closed sets (routes, endpoint roles, status and error
//! codes), so the series count stays bounded whatever the traffic.

use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// A label set: `(name, value)` pairs.
pub type Labels = Vec<(&'static str, String)>;
type Hist = Family<Labels, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 1 ms .. ~33 s in 16 doubling buckets: loopback overhead to slow judges.
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// The metrics of one process (one registry; cloned handles share the series).
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    http_requests: Family<Labels, Counter>,
    http_latency: Hist,
    llm_calls: Family<Labels, Counter>,
    llm_latency: Hist,
    llm_retries: Family<Labels, Counter>,
    llm_tokens: Family<Labels, Counter>,
    cache_lookups: Family<Labels, Counter>,
    cache_errors: Counter,
    rubrics: Family<Labels, Counter>,
    violations: Family<Labels, Counter>,
    responses: Family<Labels, Counter>,
    in_flight: Gauge<i64, std::sync::atomic::AtomicI64>,
    endpoint_attempts: Family<Labels, Counter>,
    endpoint_in_flight: Family<Labels, Gauge<i64, std::sync::atomic::AtomicI64>>,
    endpoint_ejections: Family<Labels, Counter>,
    endpoint_up: Family<Labels, Gauge<i64, std::sync::atomic::AtomicI64>>,
    cache_degraded: Gauge<i64, std::sync::atomic::AtomicI64>,
    cache_waits: Family<Labels, Counter>,
    cache_conflicts: Family<Labels, Counter>,
    panel: crate::panel::PanelMetrics,
    prompt_templates: Family<Labels, Counter>,
    responses_stripped: Family<Labels, Counter>,
    log_records: Family<Labels, Counter>,
    connections: Gauge<i64, std::sync::atomic::AtomicI64>,
    connections_refused: Counter,
    budget: Family<Labels, Gauge<i64, std::sync::atomic::AtomicI64>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every series of the loop.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("care");
        let m = Metrics {
            http_requests: Family::default(),
            http_latency: Hist::new_with_constructor(latency_histogram),
            llm_calls: Family::default(),
            llm_latency: Hist::new_with_constructor(latency_histogram),
            llm_retries: Family::default(),
            llm_tokens: Family::default(),
            cache_lookups: Family::default(),
            cache_errors: Counter::default(),
            rubrics: Family::default(),
            violations: Family::default(),
            responses: Family::default(),
            in_flight: Gauge::default(),
            endpoint_attempts: Family::default(),
            endpoint_in_flight: Family::default(),
            endpoint_ejections: Family::default(),
            endpoint_up: Family::default(),
            cache_degraded: Gauge::default(),
            cache_waits: Family::default(),
            cache_conflicts: Family::default(),
            panel: crate::panel::PanelMetrics::default(),
            prompt_templates: Family::default(),
            responses_stripped: Family::default(),
            log_records: Family::default(),
            connections: Gauge::default(),
            connections_refused: Counter::default(),
            budget: Family::default(),
            registry: Registry::default(),
        };
        m.panel.register(&mut registry);
        registry.register(
            "http_requests",
            "HTTP requests answered, by route and status code",
            m.http_requests.clone(),
        );
        registry.register(
            "http_request_duration_seconds",
            "HTTP request latency, by route",
            m.http_latency.clone(),
        );
        registry.register(
            "http_requests_in_flight",
            "HTTP requests being processed",
            m.in_flight.clone(),
        );
        registry.register(
            "http_connections",
            "Open HTTP connections",
            m.connections.clone(),
        );
        registry.register(
            "http_connections_refused",
            "Connections answered 503 and closed because --max-connections were open",
            m.connections_refused.clone(),
        );
        registry.register(
            "http_budget_in_use",
            "The server-wide budget in use, by kind: bytes (request bodies with their decoded form), turns, responses",
            m.budget.clone(),
        );
        registry.register(
            "llm_calls",
            "LLM HTTP attempts, by endpoint (generator, judge) and code (ok or the error code)",
            m.llm_calls.clone(),
        );
        registry.register(
            "llm_call_duration_seconds",
            "LLM HTTP attempt latency, by endpoint",
            m.llm_latency.clone(),
        );
        registry.register(
            "llm_retries",
            "LLM HTTP attempts that were retries of a failed attempt, by endpoint",
            m.llm_retries.clone(),
        );
        registry.register(
            "llm_tokens",
            "Tokens from the usage field of LLM answers, by endpoint and kind (prompt, completion)",
            m.llm_tokens.clone(),
        );
        registry.register(
            "cache_lookups",
            "Cache lookups of LLM calls, by endpoint and result (hit, miss)",
            m.cache_lookups.clone(),
        );
        registry.register(
            "cache_errors",
            "Cache reads or writes that failed (the call then went to the LLM)",
            m.cache_errors.clone(),
        );
        registry.register(
            "rubrics",
            "Turns by rubric status (ok, invalid_rubric, generator_error)",
            m.rubrics.clone(),
        );
        registry.register(
            "rubric_violations",
            "Format violations in generator answers, by code (the repair loop's reasons)",
            m.violations.clone(),
        );
        registry.register(
            "responses",
            "Responses by status (ok, judge_invalid, judge_error, no_rubric, or a profile's settled status such as malformed_output)",
            m.responses.clone(),
        );
        registry.register(
            "llm_endpoint_attempts",
            "LLM HTTP attempts by endpoint role, base URL of the replica, and code (ok or the error code)",
            m.endpoint_attempts.clone(),
        );
        registry.register(
            "llm_endpoint_in_flight",
            "LLM HTTP attempts in flight, by endpoint role and base URL of the replica",
            m.endpoint_in_flight.clone(),
        );
        registry.register(
            "llm_endpoint_ejections",
            "Times a replica was ejected from its pool after a failed attempt, by endpoint role and base URL",
            m.endpoint_ejections.clone(),
        );
        registry.register(
            "llm_endpoint_up",
            "1 when a replica takes requests, 0 while it is ejected or waiting for its probe, by endpoint role and base URL",
            m.endpoint_up.clone(),
        );
        registry.register(
            "cache_degraded",
            "1 while the shared cache is unreachable and this replica serves without it, else 0",
            m.cache_degraded.clone(),
        );
        registry.register(
            "cache_waits",
            "Calls another replica was making, waited for, by endpoint and outcome (result: its answer arrived; lease: its lease ended without one and this replica made the call; timeout; store_down)",
            m.cache_waits.clone(),
        );
        registry.register(
            "cache_write_conflicts",
            "Calls made twice (a lease that ran out, an outage) where the store kept the other answer and this replica used it, by endpoint",
            m.cache_conflicts.clone(),
        );
        registry.register(
            "prompt_templates",
            "Turn prompts by chat-template family (or none) and status (parsed, plain, unrecognised, off)",
            m.prompt_templates.clone(),
        );
        registry.register(
            "responses_stripped",
            "Responses whose trailing end-of-turn tokens were removed, by family (a family's name, any, or none for the extra suffixes only)",
            m.responses_stripped.clone(),
        );
        registry.register(
            "log_records",
            "Records of the response log (care serve --log), by result (written, dropped when the writer's queue was full, failed)",
            m.log_records.clone(),
        );
        Metrics { registry, ..m }
    }

    /// The series of judge panels.
    pub fn panel(&self) -> &crate::panel::PanelMetrics {
        &self.panel
    }

    /// The OpenMetrics text of every series.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }

    /// One HTTP request answered.
    pub fn http_request(&self, route: &'static str, status: u16, elapsed: Duration) {
        self.http_requests
            .get_or_create(&vec![
                ("route", route.to_owned()),
                ("status", status.to_string()),
            ])
            .inc();
        self.http_latency
            .get_or_create(&vec![("route", route.to_owned())])
            .observe(elapsed.as_secs_f64());
    }

    /// A request started (`+1`) or ended (`-1`).
    pub fn in_flight(&self, delta: i64) {
        self.in_flight.inc_by(delta);
    }

    /// A connection opened (`+1`) or closed (`-1`).
    pub fn connection(&self, delta: i64) {
        self.connections.inc_by(delta);
    }

    /// A connection over the cap was refused.
    pub fn connection_refused(&self) {
        self.connections_refused.inc();
    }

    /// The server-wide budget in use now (set when the metrics are rendered).
    pub fn budget_in_use(&self, bytes: usize, turns: usize, responses: usize) {
        for (kind, v) in [("bytes", bytes), ("turns", turns), ("responses", responses)] {
            self.budget
                .get_or_create(&vec![("kind", kind.to_owned())])
                .set(i64::try_from(v).unwrap_or(i64::MAX));
        }
    }

    /// One LLM HTTP attempt ended with `code` (`ok` or an error code).
    pub fn llm_attempt(&self, endpoint: &'static str, code: &str, elapsed: Duration, retry: bool) {
        self.llm_calls
            .get_or_create(&vec![
                ("endpoint", endpoint.to_owned()),
                ("code", code.to_owned()),
            ])
            .inc();
        self.llm_latency
            .get_or_create(&vec![("endpoint", endpoint.to_owned())])
            .observe(elapsed.as_secs_f64());
        if retry {
            self.llm_retries
                .get_or_create(&vec![("endpoint", endpoint.to_owned())])
                .inc();
        }
    }

    /// An attempt to one replica of an endpoint's pool ended with `code`.
    pub fn endpoint_attempt(&self, endpoint: &'static str, base_url: &str, code: &str) {
        self.endpoint_attempts
            .get_or_create(&vec![
                ("endpoint", endpoint.to_owned()),
                ("base_url", base_url.to_owned()),
                ("code", code.to_owned()),
            ])
            .inc();
    }

    /// An attempt to one replica started (`+1`) or ended (`-1`).
    pub fn endpoint_in_flight(&self, endpoint: &'static str, base_url: &str, delta: i64) {
        self.endpoint_in_flight
            .get_or_create(&vec![
                ("endpoint", endpoint.to_owned()),
                ("base_url", base_url.to_owned()),
            ])
            .inc_by(delta);
    }

    /// A replica was ejected from its pool.
    pub fn endpoint_ejected(&self, endpoint: &'static str, base_url: &str) {
        self.endpoint_ejections
            .get_or_create(&vec![
                ("endpoint", endpoint.to_owned()),
                ("base_url", base_url.to_owned()),
            ])
            .inc();
    }

    /// Whether a replica takes requests (after each of its attempts).
    pub fn endpoint_up(&self, endpoint: &'static str, base_url: &str, up: bool) {
        self.endpoint_up
            .get_or_create(&vec![
                ("endpoint", endpoint.to_owned()),
                ("base_url", base_url.to_owned()),
            ])
            .set(i64::from(up));
    }

    /// Tokens reported by an answer's `usage`.
    pub fn tokens(&self, endpoint: &'static str, prompt: u64, completion: u64) {
        for (kind, n) in [("prompt", prompt), ("completion", completion)] {
            if n > 0 {
                self.llm_tokens
                    .get_or_create(&vec![
                        ("endpoint", endpoint.to_owned()),
                        ("kind", kind.to_owned()),
                    ])
                    .inc_by(n);
            }
        }
    }

    /// A cache lookup for an LLM call.
    pub fn cache_lookup(&self, endpoint: &'static str, hit: bool) {
        let result = if hit { "hit" } else { "miss" };
        self.cache_lookups
            .get_or_create(&vec![
                ("endpoint", endpoint.to_owned()),
                ("result", result.to_owned()),
            ])
            .inc();
    }

    /// The shared cache became unreachable (`true`) or answers again (`false`).
    pub fn cache_degraded(&self, degraded: bool) {
        self.cache_degraded.set(i64::from(degraded));
    }

    /// A wait for a call another replica was making ended with `outcome`.
    pub fn cache_wait(&self, endpoint: &'static str, outcome: &'static str) {
        self.cache_waits
            .get_or_create(&vec![
                ("endpoint", endpoint.to_owned()),
                ("outcome", outcome.to_owned()),
            ])
            .inc();
    }

    /// A call made here found another answer already stored (and used that one).
    pub fn cache_write_conflict(&self, endpoint: &'static str) {
        self.cache_conflicts
            .get_or_create(&vec![("endpoint", endpoint.to_owned())])
            .inc();
    }

    /// A cache read or write failed.
    pub fn cache_error(&self) {
        self.cache_errors.inc();
    }

    /// A turn's rubric outcome.
    pub fn rubric(&self, status: &'static str) {
        self.rubrics
            .get_or_create(&vec![("status", status.to_owned())])
            .inc();
    }

    /// A format violation in a generator answer.
    pub fn rubric_violation(&self, code: &str) {
        self.violations
            .get_or_create(&vec![("code", code.to_owned())])
            .inc();
    }

    /// A response's outcome.
    pub fn response(&self, status: &'static str) {
        self.responses
            .get_or_create(&vec![("status", status.to_owned())])
            .inc();
    }

    /// A turn's prompt read with a chat template (`family` a name or `none`).
    pub fn prompt_template(&self, family: &str, status: &'static str) {
        self.prompt_templates
            .get_or_create(&vec![
                ("family", family.to_owned()),
                ("status", status.to_owned()),
            ])
            .inc();
    }

    /// A response lost its trailing end tokens.
    pub fn response_stripped(&self, family: &'static str) {
        self.responses_stripped
            .get_or_create(&vec![("family", family.to_owned())])
            .inc();
    }

    /// `n` records of the response log `written`, `dropped` or `failed`.
    pub fn log_records(&self, result: &'static str, n: u64) {
        self.log_records
            .get_or_create(&vec![("result", result.to_owned())])
            .inc_by(n);
    }
}
