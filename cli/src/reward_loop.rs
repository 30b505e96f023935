//! `care reward` and `care serve`: the reward loop of `care-loop` on the command line.
//!
//! Everything here is option plumbing; the loop, the runner and the server live in
//! `care-loop`.

use std::io::{self, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use care_loop::cache::CacheSpec;
use care_loop::config::{BaseUrls, MAX_SECS, checked_secs};
use care_loop::engine::OnFailure;
use care_loop::server::{DEFAULT_MAX_BODY_BYTES, Server, ServerOptions, exposure_warning};
use care_loop::{BackendKind, Cache, Engine, LoopConfig, Metrics};
use clap::Args;

const SCRIPTED_BANNER: &str = "care: --scripted: replaying the bundled paper fixtures; no LLM is called and the rewards are a demo";

/// Where the loop's LLMs and cache are (shared by `reward` and `serve`).
#[derive(Debug, Args, Clone)]
pub struct LoopArgs {
    /// JSON configuration: endpoints, sampling, timeouts, retry bounds (docs/REWARD_LOOP.md).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Offline demo: replay the bundled paper fixtures instead of calling LLMs.
    #[arg(long)]
    pub scripted: bool,
    /// Generator base URL (overrides the config), e.g. http://127.0.0.1:8001/v1 (care serve
    /// listens on 8000); several, separated by commas, make a pool of replicas.
    #[arg(long, value_name = "URL")]
    pub generator_url: Option<String>,
    /// Generator model name (overrides the config).
    #[arg(long, value_name = "NAME")]
    pub generator_model: Option<String>,
    /// Judge base URL (overrides the config); several, separated by commas, make a pool.
    #[arg(long, value_name = "URL")]
    pub judge_url: Option<String>,
    /// Judge model name (overrides the config).
    #[arg(long, value_name = "NAME")]
    pub judge_model: Option<String>,
    /// Rubric profile (overrides the config): care (a rubric generated per turn) or kardia
    /// (fixed rubric, no generator; malformed outputs get 0 without a judge call).
    #[arg(long, value_name = "NAME")]
    pub profile: Option<String>,
    /// Cache of completed LLM calls (a rerun repeats none of them): a SQLite file, or
    /// redis://host:port/db, a store shared by the replicas of a fleet. Default:
    /// $XDG_CACHE_HOME/care/care-cache.sqlite, else ~/.cache/care/care-cache.sqlite; with
    /// --scripted, none unless this is given.
    #[arg(long, value_name = "FILE|URL", conflicts_with = "no_cache")]
    pub cache: Option<String>,
    /// Keep no cache.
    #[arg(long)]
    pub no_cache: bool,
    /// Chat template of prompts and responses (overrides the config): auto (the family a
    /// prompt's markers show), none, or chatml, llama3, mistral, gemma, deepseek, phi3.
    #[arg(long, value_name = "NAME")]
    pub chat_template: Option<String>,
    /// More text to strip from the end of every response, like an end-of-turn token
    /// (repeatable; added to the config's end_suffixes).
    #[arg(long, value_name = "TEXT")]
    pub end_suffix: Vec<String>,
}

/// `care reward` options.
#[derive(Debug, Args, Clone)]
pub struct RewardArgs {
    /// LLMs and cache.
    #[command(flatten)]
    pub loop_args: LoopArgs,
    /// JSON Lines input file; `-` reads stdin.
    #[arg(default_value = "-")]
    pub input: PathBuf,
    /// Exit with status 1 when any line gave an error line.
    #[arg(long)]
    pub strict: bool,
    /// Longest accepted input line in bytes.
    #[arg(long, default_value_t = care_loop::batch::DEFAULT_MAX_LINE_BYTES, value_name = "N")]
    pub max_line_bytes: usize,
}

/// `--on-failure`: parsed with `care_loop`'s one list of names; `null` is refused, since
/// OpenRLHF turns the rewards into a tensor and cannot take it.
fn parse_on_failure(s: &str) -> Result<OnFailure, String> {
    match s.parse::<OnFailure>()? {
        OnFailure::Null => Err(
            "null: OpenRLHF needs a number for every sample; use group_mean or error".to_owned(),
        ),
        p => Ok(p),
    }
}

/// `care serve` options.
#[derive(Debug, Args, Clone)]
pub struct ServeArgs {
    /// LLMs and cache.
    #[command(flatten)]
    pub loop_args: LoopArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8000", value_name = "ADDR")]
    pub listen: SocketAddr,
    /// What OpenRLHF's /get_reward gets for a response without a reward: group_mean (the
    /// mean of its group's valid rewards, flagged in extra_logs.care_valid) or error (HTTP 502).
    #[arg(long, default_value = "group_mean", value_parser = parse_on_failure, value_name = "POLICY")]
    pub on_failure: OnFailure,
    /// Largest request body in bytes.
    #[arg(long, default_value_t = DEFAULT_MAX_BODY_BYTES, value_name = "N")]
    pub max_body_bytes: usize,
    /// Append one JSON line per rewarded response to FILE (the reward-health input of
    /// care analyze; docs/REWARD_LOOP.md defines the record). Never blocks a request: when the
    /// writer falls behind, records are dropped and counted in care_log_records_total.
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,
    /// Rotate the log when it would pass N bytes (FILE becomes FILE.1).
    #[arg(long, default_value_t = care_loop::log::DEFAULT_MAX_BYTES, value_name = "N")]
    pub log_max_bytes: u64,
    /// Turns the log's writer queue holds before records are dropped.
    #[arg(long, default_value_t = care_loop::log::DEFAULT_QUEUE, value_name = "N")]
    pub log_queue: usize,
    /// Server limits and authentication (docs/REWARD_LOOP.md, "Limits").
    #[command(flatten)]
    pub limits: ServeLimits,
}

/// `care serve`'s limits: every size, count and duration a client controls is capped.
#[derive(Debug, Args, Clone)]
pub struct ServeLimits {
    /// Name of the environment variable holding the bearer token that every route except
    /// /healthz then requires (Authorization: Bearer <token>).
    #[arg(long, value_name = "NAME")]
    pub api_key_env: Option<String>,
    /// Most turns (distinct dialogues) in one request (413 above).
    #[arg(long, default_value_t = ServerOptions::default().max_turns, value_name = "N")]
    pub max_turns: usize,
    /// Most responses in one request (413 above).
    #[arg(long, default_value_t = ServerOptions::default().max_responses, value_name = "N")]
    pub max_responses: usize,
    /// Largest dialogue of a turn, and largest response, in bytes (413 above).
    #[arg(long, default_value_t = ServerOptions::default().max_text_bytes, value_name = "N")]
    pub max_text_bytes: usize,
    /// Bytes of request bodies held at once with their decoded form (429 when in use).
    #[arg(long, default_value_t = ServerOptions::default().max_inflight_bytes, value_name = "N")]
    pub max_inflight_bytes: usize,
    /// Turns being rewarded at once, server-wide (429 when in use).
    #[arg(long, default_value_t = ServerOptions::default().max_inflight_turns, value_name = "N")]
    pub max_inflight_turns: usize,
    /// Responses being rewarded at once, server-wide (429 when in use).
    #[arg(long, default_value_t = ServerOptions::default().max_inflight_responses, value_name = "N")]
    pub max_inflight_responses: usize,
    /// Open connections at once; one more is answered 503 and closed.
    #[arg(long, default_value_t = ServerOptions::default().max_connections, value_name = "N")]
    pub max_connections: usize,
    /// Seconds a connection may take to send a request's headers, counted from the accept or
    /// from the last response (so also the idle keep-alive timeout).
    #[arg(long, default_value_t = ServerOptions::default().header_timeout.as_secs_f64(), value_name = "SECS")]
    pub header_timeout_secs: f64,
    /// Seconds a request may take to send its body (408 after).
    #[arg(long, default_value_t = ServerOptions::default().body_timeout.as_secs_f64(), value_name = "SECS")]
    pub body_timeout_secs: f64,
    /// Seconds the requests in flight get after SIGINT/SIGTERM; then they are cut and the
    /// server exits 0, saying what it cut.
    #[arg(long, default_value_t = ServerOptions::default().shutdown_timeout.as_secs_f64(), value_name = "SECS")]
    pub shutdown_timeout_secs: f64,
}

impl ServeLimits {
    /// The server options these flags give (checked), with the policy and body cap.
    ///
    /// # Errors
    /// A flag outside its range, or an API key variable that is unset or empty.
    pub fn options(
        &self,
        on_failure: OnFailure,
        max_body_bytes: usize,
    ) -> Result<ServerOptions, String> {
        let secs = |flag: &str, v: f64| checked_secs(flag, v, 0.0, MAX_SECS);
        let api_key = match &self.api_key_env {
            None => None,
            Some(var) => match std::env::var(var) {
                Ok(k) if !k.trim().is_empty() => Some(k),
                Ok(_) => return Err(format!("--api-key-env {var}: the variable is empty")),
                Err(_) => {
                    return Err(format!(
                        "--api-key-env {var}: the variable is not set in the environment"
                    ));
                }
            },
        };
        let o = ServerOptions {
            openrlhf_on_failure: on_failure,
            max_body_bytes,
            max_turns: self.max_turns,
            max_responses: self.max_responses,
            max_text_bytes: self.max_text_bytes,
            max_inflight_bytes: self.max_inflight_bytes,
            max_inflight_turns: self.max_inflight_turns,
            max_inflight_responses: self.max_inflight_responses,
            max_connections: self.max_connections,
            header_timeout: secs("--header-timeout-secs", self.header_timeout_secs)?,
            body_timeout: secs("--body-timeout-secs", self.body_timeout_secs)?,
            shutdown_timeout: secs("--shutdown-timeout-secs", self.shutdown_timeout_secs)?,
            api_key,
            warning: None,
        };
        o.check()?;
        Ok(o)
    }
}

/// Help text of `care reward`.
pub const REWARD_AFTER: &str = "\
Input line: {\"context\": [{\"role\":\"user\",\"content\":..}, ..], \"responses\": [\"..\", ..],
  \"id\": any (copied), \"gold\": any (copied), \"meta\": {..} (copied)}; the context ends with
  the seeker's turn. \"prompt\": a chat-templated prompt may replace the context.
Output line: rubric_status (ok | invalid_rubric | generator_error), rubric, rubric_attempts,
  validation, rewards (null where a response has none), responses [{reward, status, scores,
  judge_attempts, error, stripped, panel (with a judge panel: each judge's reward, scores and
  cost, the spread)}], response_chars, calls {generator, judge, cached, failed, http_attempts,
  tokens}, template (with a prompt). Pipe it into `care analyze -`.
Resumable: a rerun with the same cache asks the LLMs only for what did not complete.

Examples:
  care reward --scripted cli/data/reward_demo.jsonl
  care reward --scripted --profile kardia cli/data/reward_demo_kardia.jsonl
  care reward --generator-url http://127.0.0.1:8001/v1 --generator-model care-gen \\
              --judge-url http://127.0.0.1:8002/v1 --judge-model judge turns.jsonl > rewards.jsonl";

/// Help text of `care serve`.
pub const SERVE_AFTER: &str = "\
Routes: POST /get_reward (OpenRLHF --remote_rm_url), POST /v1/reward ({\"turns\": [..]}),
GET /healthz, GET /metrics (Prometheus). SIGINT/SIGTERM finish the requests in flight (at most
--shutdown-timeout-secs), then exit 0. Without --api-key-env anyone who reaches the port can
spend the LLM endpoints: listen beyond 127.0.0.1 only with a key.

--log FILE writes one JSON line per rewarded response (the reward-health input of care analyze).

Examples:
  care serve --scripted
  care serve --config loop.json --log serve.jsonl
  CARE_SERVE_KEY=... care serve --config loop.json --listen 0.0.0.0:8000 --api-key-env CARE_SERVE_KEY
  care serve --config fleet.json --cache redis://redis.internal:6379/0   # one of a fleet";

/// The cache file name inside the cache directory.
const CACHE_FILE: &str = "care-cache.sqlite";

/// The default cache file: `$XDG_CACHE_HOME/care/care-cache.sqlite`, else
/// `$HOME/.cache/care/care-cache.sqlite` (the XDG base directory rule: a relative
/// `XDG_CACHE_HOME` is ignored).
///
/// # Errors
/// Neither variable gives an absolute directory.
pub fn default_cache_path(
    xdg_cache_home: Option<&str>,
    home: Option<&str>,
) -> Result<PathBuf, String> {
    let abs = |v: Option<&str>| v.map(PathBuf::from).filter(|p| p.is_absolute());
    let dir = match (abs(xdg_cache_home), abs(home)) {
        (Some(x), _) => x,
        (None, Some(h)) => h.join(".cache"),
        (None, None) => {
            return Err(
                "no cache directory: neither XDG_CACHE_HOME nor HOME is an absolute path; give --cache FILE or --no-cache"
                    .to_owned(),
            );
        }
    };
    Ok(dir.join("care").join(CACHE_FILE))
}

/// Where this run keeps its cache (`None`: no cache), and the line that says so on stderr.
fn cache_choice(a: &LoopArgs) -> Result<(Option<CacheSpec>, String), String> {
    if a.no_cache {
        return Ok((None, "care: cache: none (--no-cache)".to_owned()));
    }
    if let Some(p) = &a.cache {
        let spec = CacheSpec::parse(p);
        let line = format!("care: cache: {}", spec.describe());
        return Ok((Some(spec), line));
    }
    if a.scripted {
        return Ok((
            None,
            "care: cache: none (--scripted keeps none unless --cache FILE is given)".to_owned(),
        ));
    }
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let path = default_cache_path(var("XDG_CACHE_HOME").as_deref(), var("HOME").as_deref())?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| {
            format!(
                "cannot create the cache directory {}: {e}; give --cache FILE or --no-cache",
                dir.display()
            )
        })?;
    }
    let line = format!(
        "care: cache: {} (--cache FILE for another, --no-cache for none)",
        path.display()
    );
    Ok((Some(CacheSpec::Sqlite(path)), line))
}

/// The command-line flag that sets a configuration field, for errors about that field.
const FIELD_FLAGS: [(&str, &str); 4] = [
    ("generator.base_url", "--generator-url"),
    ("generator.model", "--generator-model"),
    ("judge.base_url", "--judge-url"),
    ("judge.model", "--judge-model"),
];

/// A configuration error in the words of the command line: a field set by a flag is named by
/// that flag; a field left empty by both the flags and the file says which flags (or
/// `--config`, or `--scripted`) give it; a field from the file keeps its name and gets the
/// file's path.
fn cli_error(msg: String, a: &LoopArgs) -> String {
    let field = msg.split([' ', ':']).next().unwrap_or_default();
    let from_flag = |f: &str| match f {
        "generator.base_url" => a.generator_url.is_some(),
        "generator.model" => a.generator_model.is_some(),
        "judge.base_url" => a.judge_url.is_some(),
        "judge.model" => a.judge_model.is_some(),
        _ => false,
    };
    if let Some(&(f, flag)) = FIELD_FLAGS.iter().find(|(f, _)| *f == field) {
        if from_flag(f) {
            return format!("{flag}{}", &msg[f.len()..]);
        }
        if msg.contains(" is empty") {
            let role = f.split('.').next().unwrap_or_default();
            let from = a
                .config
                .as_ref()
                .map_or(String::new(), |p| format!(" ({} sets no {f})", p.display()));
            let why = if role == "generator" {
                " (the care profile writes a rubric per turn; --profile kardia needs no generator)"
            } else {
                ""
            };
            return if f.ends_with(".model") {
                format!(
                    "no {role} model{from}: give --{role}-model NAME (the model name the server \
                     serves), or set {f} in a --config FILE"
                )
            } else {
                format!(
                    "no {role} endpoint{from}: give --{role}-url URL and --{role}-model NAME{why}, \
                     or a --config FILE that sets {role}.base_url and {role}.model, \
                     or --scripted for the offline demo"
                )
            };
        }
    }
    if field == "unknown" && a.profile.is_some() {
        return format!("--profile: {msg}");
    }
    match &a.config {
        Some(p) => format!("config {}: {msg}", p.display()),
        None => msg,
    }
}

fn build(a: &LoopArgs, rt: &tokio::runtime::Runtime) -> Result<(Arc<Engine>, BackendKind), String> {
    let (engine, kind) = build_engine(a, rt)?;
    Ok((Arc::new(engine), kind))
}

/// The engine of `a` (`rt`: the runtime a shared cache connects on; connecting starts the
/// probe of a store that is down).
fn build_engine(
    a: &LoopArgs,
    rt: &tokio::runtime::Runtime,
) -> Result<(Engine, BackendKind), String> {
    let mut cfg = match &a.config {
        Some(p) => LoopConfig::from_file(p)?,
        None => LoopConfig::default(),
    };
    let judges = cfg.judge.judges.len();
    if judges > 1 && (a.judge_url.is_some() || a.judge_model.is_some()) {
        return Err(format!(
            "--judge-url and --judge-model set the one judge, but the config has a panel of {judges} judges: set each judge's base_url and model in the config"
        ));
    }
    // A URL flag may list a pool's replicas, separated by commas.
    let pool = |v: &str| -> BaseUrls {
        v.split(',')
            .map(|u| u.trim().to_owned())
            .collect::<Vec<_>>()
            .into()
    };
    let mut urls = vec![(&a.generator_url, &mut cfg.generator.base_url)];
    let mut models = vec![(&a.generator_model, &mut cfg.generator.model)];
    if let Some(judge) = cfg.judge.single_mut() {
        urls.push((&a.judge_url, &mut judge.base_url));
        models.push((&a.judge_model, &mut judge.model));
    }
    let mut any = false;
    for (flag, field) in urls {
        if let Some(v) = flag {
            *field = pool(v);
            any = true;
        }
    }
    for (flag, field) in models {
        if let Some(v) = flag {
            field.clone_from(v);
            any = true;
        }
    }
    if let Some(p) = &a.profile {
        cfg.profile = p.clone();
    }
    if let Some(t) = &a.chat_template {
        cfg.chat_template = t.clone();
    }
    cfg.end_suffixes.extend(a.end_suffix.iter().cloned());
    let kind = if a.scripted {
        if any {
            return Err(
                "--scripted replays the bundled fixtures: it takes no --generator-*/--judge-* endpoint"
                    .to_owned(),
            );
        }
        let _ = writeln!(io::stderr(), "{SCRIPTED_BANNER}");
        BackendKind::Scripted
    } else {
        BackendKind::Http
    };
    // The configuration is checked before the cache is created: a mistyped flag leaves no
    // cache file behind.
    Engine::new(&cfg, kind, None, Arc::new(Metrics::new())).map_err(|e| cli_error(e, a))?;
    let (spec, line) = cache_choice(a)?;
    let cache = match &spec {
        Some(CacheSpec::Sqlite(p)) => Some(Cache::open(p)?),
        Some(spec @ CacheSpec::Redis(_)) => Some(rt.block_on(Cache::open_spec(spec, &cfg.cache))?),
        None => None,
    };
    let _ = writeln!(io::stderr(), "{line}");
    let engine =
        Engine::new(&cfg, kind, cache, Arc::new(Metrics::new())).map_err(|e| cli_error(e, a))?;
    Ok((engine, kind))
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))
}

/// Runs `care reward`; returns the exit status (0, or 1 with `--strict` and an error line).
///
/// # Errors
/// Usage, configuration and I/O errors (one line for stderr).
pub fn run_reward(a: &RewardArgs) -> Result<u8, String> {
    if a.max_line_bytes == 0 {
        return Err("--max-line-bytes must be at least 1".to_owned());
    }
    let rt = runtime()?;
    let (engine, _) = build(&a.loop_args, &rt)?;
    let panel = Arc::clone(&engine);
    let summary = rt.block_on(async {
        let stdout = io::stdout();
        let mut out = io::BufWriter::new(stdout.lock());
        if a.input.as_os_str() == "-" {
            care_loop::batch::run_jsonl(engine, tokio::io::stdin(), &mut out, a.max_line_bytes)
                .await
        } else {
            let f = tokio::fs::File::open(&a.input).await.map_err(|e| {
                io::Error::new(e.kind(), format!("cannot open {}: {e}", a.input.display()))
            })?;
            care_loop::batch::run_jsonl(engine, f, &mut out, a.max_line_bytes).await
        }
    });
    let s = match summary {
        Ok(s) => s,
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(0),
        Err(e) => return Err(format!("I/O error: {e}")),
    };
    let _ = writeln!(io::stderr(), "{}", summary_line(&s));
    if let Some((reward, score)) = panel.panel_agreement() {
        let show = |a: &care_loop::panel::Alpha| {
            a.value()
                .map_or_else(|| "undefined".to_owned(), |v| format!("{v:.4}"))
        };
        let _ = writeln!(
            io::stderr(),
            "care reward: judge agreement (Krippendorff's alpha, interval): {} over {} responses, {} over {} criterion scores",
            show(&reward),
            reward.units(),
            show(&score),
            score.units()
        );
    }
    Ok(u8::from(a.strict && s.failed_lines > 0))
}

/// The closing line of `care reward` on stderr: the responses counted by status, so that a
/// run whose rewards are all settled zeros (`malformed_output`) or nulls says so:
/// `care reward: 1 line (0 error lines), 7 responses: 2 ok, 5 malformed_output (reward 0)`.
pub fn summary_line(s: &care_loop::batch::RunSummary) -> String {
    let total = s.responses_rewarded + s.responses_without_reward;
    let mut parts: Vec<String> = Vec::with_capacity(s.by_status.len());
    // `ok` first, then the others by name.
    let ok = s.by_status.get(care_loop::engine::response_status::OK);
    parts.extend(ok.map(|n| format!("{n} ok")));
    for (st, n) in &s.by_status {
        if *st == care_loop::engine::response_status::OK {
            continue;
        }
        let what = if *st == care_loop::fixed::MALFORMED_OUTPUT {
            " (reward 0: the output breaks the profile's format)"
        } else {
            " (no reward)"
        };
        parts.push(format!("{n} {st}{what}"));
    }
    let plural = |n: u64, one: &str, many: &str| {
        if n == 1 {
            format!("{n} {one}")
        } else {
            format!("{n} {many}")
        }
    };
    let mut line = format!(
        "care reward: {} ({}), {}",
        plural(s.lines, "line", "lines"),
        plural(s.failed_lines, "error line", "error lines"),
        plural(total, "response", "responses"),
    );
    if !parts.is_empty() {
        line.push_str(": ");
        line.push_str(&parts.join(", "));
    }
    if total > 0 && ok.is_none() {
        line.push_str("; no response was judged, see each line's status");
    }
    line
}

/// Runs `care serve` until SIGINT or SIGTERM.
///
/// # Errors
/// Usage, configuration and I/O errors (one line for stderr).
pub fn run_serve(a: &ServeArgs) -> Result<u8, String> {
    if a.max_body_bytes == 0 {
        return Err("--max-body-bytes must be at least 1".to_owned());
    }
    let mut opts = a.limits.options(a.on_failure, a.max_body_bytes)?;
    let rt = runtime()?;
    let (mut engine, kind) = build_engine(&a.loop_args, &rt)?;
    let log = match &a.log {
        Some(path) => {
            let log = Arc::new(care_loop::log::ResponseLog::open(
                path,
                a.log_max_bytes,
                a.log_queue,
                Arc::clone(engine.metrics()),
            )?);
            engine.set_response_log(Arc::clone(&log));
            Some(log)
        }
        None => None,
    };
    let engine = Arc::new(engine);
    let backend = match kind {
        BackendKind::Http => "http",
        BackendKind::Scripted => "scripted",
    };
    let deadline = opts.shutdown_timeout;
    let result = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(a.listen)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", a.listen))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let _ = writeln!(
            io::stderr(),
            "care serve: listening on http://{addr} (POST /get_reward, POST /v1/reward, GET /healthz, GET /metrics){}",
            if opts.api_key.is_some() { "; bearer token required except on /healthz" } else { "" }
        );
        opts.warning = exposure_warning(&addr, opts.api_key.is_some());
        if let Some(w) = &opts.warning {
            let _ = writeln!(io::stderr(), "care serve: WARNING: {w}");
        }
        let server = Server::new(engine, opts, backend);
        let stopped = server
            .serve(listener, care_loop::server::shutdown_signal())
            .await
            .map_err(|e| format!("server error: {e}"))?;
        if let Some(log) = &log {
            // Everything answered is queued: write it out before exiting.
            log.close();
        }
        let _ = writeln!(io::stderr(), "care serve: {}", stopped.summary(deadline));
        Ok(0)
    });
    // Whatever still runs (a cache write on a blocking thread) gets a moment, not forever.
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    result
}
