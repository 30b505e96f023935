//! Reward health: what a trainer watches to catch reward hacking and dead signal, read from
//! `care reward` output lines and `care serve --log` records (one per response, the format of
//! `care_loop::log`).
//!
//! Per variant: reward against response length (Spearman's rho and the least-squares slope,
//! with intervals, per turn bucket), the share of criterion scores at the ceiling and the floor
//! of the scale, the share of groups whose valid rewards are all equal (no GRPO signal), the
//! judge's statuses, retries and missing rewards, the rubric's repair and failure rates, and
//! the entropy of the dimension weights by turn, and for a judge panel the judges' agreement
//! (Krippendorff's alpha, computed by [`care_loop::panel::Alpha`], the engine's own
//! implementation) and the share of flagged responses. Thresholds turn these into flags.

use std::collections::BTreeMap;

use care_loop::panel::Alpha;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::accum::Acc;
use super::record::{MAX_CRITERIA, RubricObs, RubricStatus};
use super::stats::{Regression, SplitMix, Welford, spearman, spearman_ci95, wilson95};
use super::tables::{Cell, Column, Kind, Table, rate_cell, variant_name};
use crate::json::LineError;

/// Most responses in one health line (`care_loop::engine::MAX_RESPONSES`).
pub const MAX_RESPONSES: usize = 4096;
/// Reward-length pairs kept per (variant, bucket) for Spearman's rho: a uniform sample
/// (reservoir) beyond that many, exact below.
pub const RHO_SAMPLE: usize = 4096;
/// Distinct response statuses counted by name per variant; more are counted as `other`.
pub const MAX_STATUSES: usize = 16;
/// The `care_log` version this reader knows.
pub const LOG_VERSION: u64 = 1;

/// One response as a health line reports it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RespObs {
    /// Eq. 5, or `None` when the response has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward: Option<f64>,
    /// `ok`, `judge_invalid`, ... (at most 40 characters kept).
    pub status: String,
    /// Judge answers asked.
    pub judge_attempts: u32,
    /// Length of the response in characters (Unicode scalar values), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chars: Option<u64>,
    /// Raw judge scores per dimension (`None`: not an integer in `0..=255`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scores: Vec<Vec<Option<u8>>>,
    /// The panel's judgment, when a panel judged the response (its `panel` member).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub panel: Option<PanelObs>,
}

/// A panel's judgment of one response, read from its `panel` member (the shape of
/// `care_loop::panel::PanelResult`): the agreement units and the flag.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PanelObs {
    /// Judges in the panel (valid or not).
    pub judges: u32,
    /// The valid judges' rewards (the judges with a `reward`), in panel order: one agreement
    /// unit at the reward level.
    pub rewards: Vec<f64>,
    /// Per criterion (rubric order, dimensions concatenated), the valid judges' scores of it:
    /// one agreement unit each at the score level.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub criteria: Vec<Vec<f64>>,
    /// The judges' rewards spread by more than the panel's `max_spread`.
    pub flagged: bool,
    /// Judge answers the panel asked for without retries: the judges' `samples`, summed (the
    /// response's `judge_attempts` sums every judge's answers).
    pub asked: u32,
}

/// A health line: a whole group (`care reward`) or one response of a group (`--log`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HealthObs {
    /// The group id of a log record (its responses are consecutive records); `None` for a
    /// `care reward` line, which is the whole group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<u64>,
    /// Whether this line carries the group's rubric facts (a `care reward` line; the log
    /// record with `index` 0).
    pub first: bool,
    /// `ok`, `invalid_rubric`, `generator_error` (or another status).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rubric_status: Option<String>,
    /// Generator answers asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rubric_attempts: Option<u32>,
    /// Invalid answers repaired before the last one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repairs: Option<u32>,
    /// The rubric's weights as written, when it is valid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<[f64; 3]>,
    /// The responses on this line.
    pub responses: Vec<RespObs>,
}

fn bad(msg: impl Into<String>) -> LineError {
    LineError::schema(msg)
}

fn u32_of(v: Option<&Value>, key: &str) -> Result<Option<u32>, LineError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| bad(format!("\"{key}\" must be a non-negative integer"))),
    }
}

fn status_of(v: Option<&Value>, key: &str) -> Result<String, LineError> {
    match v {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.chars().take(40).collect()),
        _ => Err(bad(format!("\"{key}\" must be a non-empty string"))),
    }
}

fn reward_of(v: Option<&Value>, key: &str) -> Result<Option<f64>, LineError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x
            .as_f64()
            .filter(|r| r.is_finite())
            .map(Some)
            .ok_or_else(|| bad(format!("\"{key}\" must be a finite number or null"))),
    }
}

fn scores_of(v: Option<&Value>, key: &str) -> Result<Vec<Vec<Option<u8>>>, LineError> {
    let dims = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(d)) if d.len() <= 3 => d,
        Some(_) => {
            return Err(bad(format!(
                "\"{key}\" must be null or an array of up to 3 arrays of scores"
            )));
        }
    };
    let mut out = Vec::with_capacity(dims.len());
    for d in dims {
        let list = d
            .as_array()
            .filter(|a| a.len() <= MAX_CRITERIA)
            .ok_or_else(|| {
                bad(format!(
                    "\"{key}\" must hold one array of at most {MAX_CRITERIA} scores per dimension"
                ))
            })?;
        out.push(
            list.iter()
                .map(|x| {
                    x.as_f64()
                        .filter(|f| f.fract() == 0.0 && (0.0..=255.0).contains(f))
                        .map(|f| f as u8)
                })
                .collect(),
        );
    }
    Ok(out)
}

/// A judge's scores as a panel reports them (real numbers: the mean over its samples),
/// flattened in rubric order; `None` for `null`.
fn real_scores_of(v: Option<&Value>, key: &str) -> Result<Option<Vec<f64>>, LineError> {
    let dims = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(d)) if d.len() <= 3 => d,
        Some(_) => {
            return Err(bad(format!(
                "\"{key}\" must be null or an array of up to 3 arrays of scores"
            )));
        }
    };
    let mut flat = Vec::new();
    for d in dims {
        let list = d
            .as_array()
            .filter(|a| a.len() <= MAX_CRITERIA)
            .ok_or_else(|| {
                bad(format!(
                    "\"{key}\" must hold one array of at most {MAX_CRITERIA} scores per dimension"
                ))
            })?;
        for x in list {
            flat.push(
                x.as_f64()
                    .filter(|f| f.is_finite())
                    .ok_or_else(|| bad(format!("\"{key}\" scores must be finite numbers")))?,
            );
        }
    }
    Ok(Some(flat))
}

/// Reads a response's `panel` member (`null` or absent: no panel): each judge's `reward` and
/// `scores`, and `flagged`. The agreement units are the valid judges' values, as the engine
/// forms them: a judge is valid when it has a `reward`.
fn panel_of(v: Option<&Value>, key: &str) -> Result<Option<PanelObs>, LineError> {
    let o = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(o)) => o,
        Some(_) => return Err(bad(format!("\"{key}\" must be an object or null"))),
    };
    let list = o
        .get("judges")
        .and_then(Value::as_array)
        .filter(|a| !a.is_empty() && a.len() <= care_loop::config::MAX_PANEL_JUDGES)
        .ok_or_else(|| {
            bad(format!(
                "\"{key}.judges\" must be an array of 1 to {} judge results",
                care_loop::config::MAX_PANEL_JUDGES
            ))
        })?;
    let flagged = match o.get("flagged") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad(format!("\"{key}.flagged\" must be a boolean"))),
    };
    let mut rewards = Vec::with_capacity(list.len());
    let mut scores: Vec<Vec<f64>> = Vec::with_capacity(list.len());
    let mut asked = 0u32;
    for j in list {
        let j = j
            .as_object()
            .ok_or_else(|| bad(format!("\"{key}.judges\" must hold objects")))?;
        let reward = reward_of(j.get("reward"), &format!("{key}.judges[].reward"))?;
        let s = real_scores_of(j.get("scores"), &format!("{key}.judges[].scores"))?;
        asked = asked.saturating_add(
            u32_of(j.get("samples"), &format!("{key}.judges[].samples"))?.unwrap_or(1),
        );
        if let Some(r) = reward {
            rewards.push(r);
            if let Some(s) = s {
                scores.push(s);
            }
        }
    }
    // The criteria of the first valid judge with scores; each unit takes every valid judge's
    // score of that criterion.
    let n = scores.first().map_or(0, Vec::len);
    let criteria = (0..n)
        .map(|c| scores.iter().filter_map(|s| s.get(c).copied()).collect())
        .collect();
    Ok(Some(PanelObs {
        judges: u32::try_from(list.len()).unwrap_or(u32::MAX),
        rewards,
        criteria,
        flagged,
        asked,
    }))
}

fn weights_of(v: Option<&Value>) -> Result<Option<[f64; 3]>, LineError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(a)) if a.len() == 3 => {
            let mut w = [0.0; 3];
            for (slot, x) in w.iter_mut().zip(a) {
                *slot = x
                    .as_f64()
                    .filter(|f| f.is_finite())
                    .ok_or_else(|| bad("\"rubric_weights\" must be 3 finite numbers or null"))?;
            }
            Ok(Some(w))
        }
        Some(_) => Err(bad("\"rubric_weights\" must be 3 finite numbers or null")),
    }
}

/// Reads the health facts of a line: a `care serve --log` record (member `care_log`) or a
/// `care reward` output line (members `rubric_status` and `responses`). `rubric` is the line's
/// rubric as read for the format views (its weights are the valid rubric's).
pub fn read(
    m: &Map<String, Value>,
    rubric: Option<&RubricObs>,
) -> Result<Option<HealthObs>, LineError> {
    if let Some(v) = m.get("care_log") {
        if v.as_u64() != Some(LOG_VERSION) {
            return Err(bad(format!(
                "\"care_log\" is {v}; this care analyze reads version {LOG_VERSION} records"
            )));
        }
        let group = m
            .get("group")
            .and_then(Value::as_u64)
            .ok_or_else(|| bad("\"group\" must be a non-negative integer"))?;
        let index = u32_of(m.get("index"), "index")?.ok_or_else(|| bad("missing key \"index\""))?;
        let size = u32_of(m.get("group_size"), "group_size")?
            .ok_or_else(|| bad("missing key \"group_size\""))?;
        if index >= size || size as usize > MAX_RESPONSES {
            return Err(bad(format!(
                "\"index\" {index} is not below \"group_size\" {size} (at most {MAX_RESPONSES})"
            )));
        }
        let chars = match m.get("response_chars") {
            None | Some(Value::Null) => None,
            Some(x) => Some(
                x.as_u64()
                    .ok_or_else(|| bad("\"response_chars\" must be a non-negative integer"))?,
            ),
        };
        let resp = RespObs {
            reward: reward_of(m.get("reward"), "reward")?,
            status: status_of(m.get("status"), "status")?,
            judge_attempts: u32_of(m.get("judge_attempts"), "judge_attempts")?.unwrap_or(0),
            chars,
            scores: scores_of(m.get("scores"), "scores")?,
            panel: panel_of(m.get("panel"), "panel")?,
        };
        let status = status_of(m.get("rubric_status"), "rubric_status")?;
        let weights = weights_of(m.get("rubric_weights"))?.filter(|_| status == "ok");
        return Ok(Some(HealthObs {
            group: Some(group),
            first: index == 0,
            rubric_status: Some(status),
            rubric_attempts: u32_of(m.get("rubric_attempts"), "rubric_attempts")?,
            repairs: u32_of(m.get("repairs"), "repairs")?,
            weights,
            responses: vec![resp],
        }));
    }
    let (Some(status), Some(responses)) = (m.get("rubric_status"), m.get("responses")) else {
        return Ok(None);
    };
    let status = status_of(Some(status), "rubric_status")?;
    let list = responses
        .as_array()
        .filter(|a| a.len() <= MAX_RESPONSES)
        .ok_or_else(|| {
            bad(format!(
                "\"responses\" must be an array of at most {MAX_RESPONSES} response results"
            ))
        })?;
    let chars: Option<Vec<Option<u64>>> = match m.get("response_chars") {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) if a.len() == list.len() => {
            Some(a.iter().map(Value::as_u64).collect())
        }
        Some(_) => {
            return Err(bad(
                "\"response_chars\" must be one length per response (an array as long as \
                 \"responses\")",
            ));
        }
    };
    let mut out = Vec::with_capacity(list.len());
    for (j, r) in list.iter().enumerate() {
        let o = r
            .as_object()
            .ok_or_else(|| bad(format!("\"responses\"[{j}] must be an object")))?;
        out.push(RespObs {
            reward: reward_of(o.get("reward"), "responses[].reward")?,
            status: status_of(o.get("status"), "responses[].status")?,
            judge_attempts: u32_of(o.get("judge_attempts"), "responses[].judge_attempts")?
                .unwrap_or(0),
            chars: chars.as_ref().and_then(|c| c.get(j).copied().flatten()),
            scores: scores_of(o.get("scores"), "responses[].scores")?,
            panel: panel_of(o.get("panel"), "responses[].panel")?,
        });
    }
    let repairs = match m.get("repairs") {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) => u32::try_from(a.len()).ok(),
        Some(_) => return Err(bad("\"repairs\" must be an array")),
    };
    let weights = rubric
        .filter(|r| r.valid && r.status == RubricStatus::Parsed && status == "ok")
        .and_then(|r| r.weights);
    Ok(Some(HealthObs {
        group: None,
        first: true,
        rubric_status: Some(status),
        rubric_attempts: u32_of(m.get("rubric_attempts"), "rubric_attempts")?,
        repairs,
        weights,
        responses: out,
    }))
}

/// Turn buckets of the length view: `lo-hi` ranges, the last may be open (`lo-`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Buckets(pub Vec<(u32, Option<u32>)>);

/// The default turn buckets.
pub const DEFAULT_BUCKETS: &str = "0-3,4-7,8-11,12-";

impl Buckets {
    /// Parses `0-3,4-7,12-` (ascending, not overlapping, at most 16).
    pub fn parse(list: &str) -> Result<Buckets, String> {
        let mut out: Vec<(u32, Option<u32>)> = Vec::new();
        for item in list.split(',') {
            let item = item.trim();
            let (lo, hi) = item.split_once('-').unwrap_or((item, item));
            let lo: u32 = lo
                .trim()
                .parse()
                .map_err(|_| format!("--turn-buckets: {item:?} is not lo-hi or lo-"))?;
            let hi: Option<u32> = match hi.trim() {
                "" => None,
                h => Some(
                    h.parse()
                        .map_err(|_| format!("--turn-buckets: {item:?} is not lo-hi or lo-"))?,
                ),
            };
            if hi.is_some_and(|h| h < lo) {
                return Err(format!("--turn-buckets: {item:?} ends before it starts"));
            }
            if let Some(&(plo, phi)) = out.last()
                && phi.is_none_or(|p| p >= lo || plo >= lo)
            {
                return Err(format!(
                    "--turn-buckets: {item:?} overlaps or precedes the bucket before it"
                ));
            }
            out.push((lo, hi));
        }
        if out.len() > 16 {
            return Err("--turn-buckets: at most 16 buckets".to_owned());
        }
        Ok(Buckets(out))
    }

    /// The bucket of `turn`.
    pub fn of(&self, turn: u32) -> Option<usize> {
        self.0
            .iter()
            .position(|&(lo, hi)| turn >= lo && hi.is_none_or(|h| turn <= h))
    }

    /// A bucket's label (`0-3`, `12-`).
    pub fn label(&self, i: usize) -> String {
        match self.0.get(i) {
            Some((lo, Some(hi))) if lo == hi => lo.to_string(),
            Some((lo, Some(hi))) => format!("{lo}-{hi}"),
            Some((lo, None)) => format!("{lo}-"),
            None => "all".to_owned(),
        }
    }
}

/// A uniform sample of at most `cap` items of a stream (Vitter's algorithm R), deterministic
/// for a seed and an input order.
#[derive(Clone, Debug)]
pub struct Reservoir<T> {
    /// Items seen.
    pub seen: u64,
    /// The sample.
    pub items: Vec<T>,
    cap: usize,
    rng: SplitMix,
}

impl<T> Reservoir<T> {
    /// An empty sample of at most `cap` items.
    pub fn new(cap: usize, seed: u64) -> Self {
        Reservoir {
            seen: 0,
            items: Vec::new(),
            cap,
            rng: SplitMix(seed),
        }
    }

    /// Offers one item.
    pub fn push(&mut self, x: T) {
        self.seen += 1;
        if self.items.len() < self.cap {
            self.items.push(x);
        } else {
            let j = self.rng.below(self.seen) as usize;
            if let Some(slot) = self.items.get_mut(j) {
                *slot = x;
            }
        }
    }
}

/// Reward against length in one bucket.
#[derive(Clone, Debug)]
pub struct LengthAcc {
    /// Least squares of reward on characters (every response with both).
    pub fit: Regression,
    /// `(chars, reward)` for Spearman's rho.
    pub sample: Reservoir<(f64, f64)>,
}

/// Ceiling and floor counts of one criterion position (or a whole dimension).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScoreCounts {
    /// Scores seen.
    pub n: u64,
    /// Scores at the top of the scale.
    pub ceiling: u64,
    /// Scores at the bottom of the scale.
    pub floor: u64,
}

/// A judge panel's agreement over a run, and its flagged responses.
#[derive(Clone, Debug, Default)]
pub struct PanelAcc {
    /// Responses judged by a panel (with a `panel` member).
    pub responses: u64,
    /// Of those, the flagged ones (`flagged`: the judges' rewards spread by more than
    /// `max_spread`).
    pub flagged: u64,
    /// The most judges a panel had.
    pub judges: u32,
    /// Krippendorff's alpha (interval) on the judges' rewards: a unit per response.
    pub reward: Alpha,
    /// The same on the judges' criterion scores: a unit per criterion of a response.
    pub score: Alpha,
}

impl PanelAcc {
    /// Whether a panel of two judges or more judged the responses (a single judge, with or
    /// without samples, has no agreement to measure).
    pub fn is_panel(&self) -> bool {
        self.judges >= 2
    }

    fn add(&mut self, p: &PanelObs) {
        self.responses += 1;
        self.flagged += u64::from(p.flagged);
        self.judges = self.judges.max(p.judges);
        self.reward.add_unit(&p.rewards);
        for c in &p.criteria {
            self.score.add_unit(c);
        }
    }
}

/// Reward health of one variant.
#[derive(Clone, Debug)]
pub struct HealthAcc {
    /// Groups (turns): their rubric statuses `ok`, `invalid_rubric`, `generator_error`, other.
    pub rubric_status: [u64; 4],
    /// Groups whose rubric needed at least one repair.
    pub repaired: u64,
    /// Groups that report their repairs.
    pub repair_known: u64,
    /// Generator answers per group.
    pub rubric_attempts: Welford,
    /// Responses.
    pub responses: u64,
    /// Responses by status (at most [`MAX_STATUSES`] names, then `other`).
    pub statuses: BTreeMap<String, u64>,
    /// Responses without a reward.
    pub null_reward: u64,
    /// Responses whose judge was asked more than once.
    pub retried: u64,
    /// Judge answers per judged response.
    pub judge_attempts: Welford,
    /// Per bucket, then all: `[groups with two or more rewards, of which all equal]`.
    pub spread: Vec<[u64; 2]>,
    /// Per bucket, then all.
    pub length: Vec<LengthAcc>,
    /// Per dimension: per criterion position, then the whole dimension.
    pub scores: [[ScoreCounts; MAX_CRITERIA + 1]; 3],
    /// Weight entropy (nats) of valid rubrics, by turn.
    pub entropy_by_turn: BTreeMap<u32, Welford>,
    /// All of them.
    pub entropy: Welford,
    /// The judge panel's agreement and flags.
    pub panel: PanelAcc,
    /// The log group being read: id, bucket, its valid rewards.
    open: Option<(u64, Option<usize>, Vec<f64>)>,
}

impl HealthAcc {
    /// An empty accumulator for `buckets` buckets (plus `all`), sampling with `seed`.
    pub fn new(buckets: usize, seed: u64) -> Self {
        HealthAcc {
            rubric_status: [0; 4],
            repaired: 0,
            repair_known: 0,
            rubric_attempts: Welford::default(),
            responses: 0,
            statuses: BTreeMap::new(),
            null_reward: 0,
            retried: 0,
            judge_attempts: Welford::default(),
            spread: vec![[0; 2]; buckets + 1],
            length: (0..=buckets)
                .map(|b| LengthAcc {
                    fit: Regression::default(),
                    sample: Reservoir::new(RHO_SAMPLE, seed ^ ((b as u64 + 1) * 0x9E37_79B9)),
                })
                .collect(),
            scores: [[ScoreCounts::default(); MAX_CRITERIA + 1]; 3],
            entropy_by_turn: BTreeMap::new(),
            entropy: Welford::default(),
            panel: PanelAcc::default(),
            open: None,
        }
    }

    /// Groups seen.
    pub fn groups(&self) -> u64 {
        self.rubric_status.iter().sum()
    }

    /// Folds one health line in (`bucket`: the turn's bucket; `scale`: `(min, max)` scores).
    pub fn add(
        &mut self,
        h: &HealthObs,
        turn: Option<u32>,
        bucket: Option<usize>,
        scale: (u8, u8),
    ) {
        if h.first {
            let i = match h.rubric_status.as_deref() {
                Some("ok") => 0,
                Some("invalid_rubric") => 1,
                Some("generator_error") => 2,
                _ => 3,
            };
            self.rubric_status[i] += 1;
            if let Some(r) = h.repairs {
                self.repair_known += 1;
                self.repaired += u64::from(r > 0);
            } else if let Some(a) = h.rubric_attempts {
                self.repair_known += 1;
                self.repaired += u64::from(a > 1 && i == 0);
            }
            if let Some(a) = h.rubric_attempts {
                self.rubric_attempts.push(f64::from(a));
            }
            if let Some(w) = h.weights
                && let Some(e) = entropy(w)
            {
                self.entropy.push(e);
                if let Some(t) = turn {
                    self.entropy_by_turn.entry(t).or_default().push(e);
                }
            }
        }
        let all = self.length.len() - 1;
        for r in &h.responses {
            self.responses += 1;
            let named = self.statuses.contains_key(&r.status) || self.statuses.len() < MAX_STATUSES;
            let key = if named {
                r.status.clone()
            } else {
                "other".to_owned()
            };
            *self.statuses.entry(key).or_default() += 1;
            if r.reward.is_none() {
                self.null_reward += 1;
            }
            if let Some(p) = &r.panel {
                self.panel.add(p);
            }
            if r.judge_attempts > 0 {
                self.judge_attempts.push(f64::from(r.judge_attempts));
                // A panel asks each judge (and sample) once: only answers beyond that are retries.
                let asked = r.panel.as_ref().map_or(1, |p| p.asked.max(1));
                self.retried += u64::from(r.judge_attempts > asked);
            }
            if let (Some(c), Some(y)) = (r.chars, r.reward) {
                for b in bucket.into_iter().chain([all]) {
                    if let Some(l) = self.length.get_mut(b) {
                        l.fit.push(c as f64, y);
                        l.sample.push((c as f64, y));
                    }
                }
            }
            for (d, dim) in r.scores.iter().enumerate().take(3) {
                for (i, s) in dim.iter().enumerate() {
                    let Some(s) = *s else { continue };
                    for slot in [i, MAX_CRITERIA] {
                        if let Some(c) = self.scores[d].get_mut(slot) {
                            c.n += 1;
                            c.ceiling += u64::from(s >= scale.1);
                            c.floor += u64::from(s <= scale.0);
                        }
                    }
                }
            }
        }
        match h.group {
            None => {
                let valid: Vec<f64> = h.responses.iter().filter_map(|r| r.reward).collect();
                self.close_group(bucket, &valid);
            }
            Some(g) => {
                if self.open.as_ref().is_some_and(|(id, _, _)| *id != g) {
                    self.finish();
                }
                let (_, _, rewards) = self.open.get_or_insert((g, bucket, Vec::new()));
                rewards.extend(h.responses.iter().filter_map(|r| r.reward));
            }
        }
    }

    fn close_group(&mut self, bucket: Option<usize>, valid: &[f64]) {
        if valid.len() < 2 {
            return;
        }
        let flat = valid.iter().all(|&r| r == valid[0]);
        let all = self.spread.len() - 1;
        for b in bucket.into_iter().chain([all]) {
            if let Some(s) = self.spread.get_mut(b) {
                s[0] += 1;
                s[1] += u64::from(flat);
            }
        }
    }

    /// Closes the log group being read (at a new group id and at the end of the input).
    pub fn finish(&mut self) {
        if let Some((_, bucket, rewards)) = self.open.take() {
            self.close_group(bucket, &rewards);
        }
    }

    /// Spearman's rho of bucket `b` with its interval and the pairs it used.
    pub fn rho(&self, b: usize) -> Option<(f64, Option<super::stats::Interval>, u64)> {
        let l = self.length.get(b)?;
        let rho = spearman(&l.sample.items)?;
        let n = l.sample.items.len() as u64;
        Some((rho, spearman_ci95(rho, n), n))
    }
}

/// The entropy `-sum w ln w` (nats) of the weights on the simplex (SPEC §4's scoring weights);
/// `ln 3 = 1.0986` for equal weights, 0 for one dimension holding everything.
pub fn entropy(w: [f64; 3]) -> Option<f64> {
    let p = care_core::simplex::scoring_weights(w);
    let h: f64 = p.iter().filter(|&&x| x > 0.0).map(|&x| -x * x.ln()).sum();
    h.is_finite().then_some(h.max(0.0))
}

/// Thresholds that flag a run (`--health name=value,...`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Thresholds {
    /// Flag when the lower 95% limit of Spearman's rho of reward and length exceeds this in any
    /// bucket (length hacking: longer answers are paid more).
    pub length_rho: f64,
    /// Flag when more than this share of groups has all its valid rewards equal.
    pub zero_spread: f64,
    /// Flag when more than this share of a dimension's scores is at the top of the scale.
    pub ceiling: f64,
    /// Flag when more than this share of a dimension's scores is at the bottom.
    pub floor: f64,
    /// Flag when more than this share of responses has no reward.
    pub null_reward: f64,
    /// Flag when more than this share of judged responses needed a judge retry.
    pub judge_retry: f64,
    /// Flag when more than this share of groups has no valid rubric.
    pub rubric_failure: f64,
    /// Flag when more than this share of groups needed a rubric repair.
    pub rubric_repair: f64,
    /// Flag when the mean weight entropy (nats) is below this (weights collapsed on one
    /// dimension).
    pub entropy: f64,
    /// Flag when the judge panel's Krippendorff's alpha on the rewards is below this
    /// (Krippendorff's lowest value for tentative conclusions, 0.667).
    pub panel_alpha: f64,
    /// The lowest score of the judge's scale (the floor).
    pub score_min: f64,
    /// The highest score of the judge's scale (the ceiling).
    pub score_max: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            length_rho: 0.3,
            zero_spread: 0.25,
            ceiling: 0.5,
            floor: 0.5,
            null_reward: 0.05,
            judge_retry: 0.2,
            rubric_failure: 0.05,
            rubric_repair: 0.5,
            entropy: 0.5,
            panel_alpha: PANEL_ALPHA,
            score_min: 0.0,
            score_max: 5.0,
        }
    }
}

/// The default `panel_alpha`: Krippendorff's lowest alpha from which tentative conclusions
/// may be drawn (Krippendorff 2004, *Content Analysis*, §11.4.4).
pub const PANEL_ALPHA: f64 = 0.667;

/// The checks of [`flags`], in their order: the names of [`THRESHOLD_NAMES`] before the scale.
pub const CHECKS: usize = 10;

/// The names `--health` takes, in the order of [`Thresholds`].
pub const THRESHOLD_NAMES: [&str; 12] = [
    "length_rho",
    "zero_spread",
    "ceiling",
    "floor",
    "null_reward",
    "judge_retry",
    "rubric_failure",
    "rubric_repair",
    "entropy",
    "panel_alpha",
    "score_min",
    "score_max",
];

impl Thresholds {
    fn slot(&mut self, name: &str) -> Option<&mut f64> {
        Some(match name {
            "length_rho" => &mut self.length_rho,
            "zero_spread" => &mut self.zero_spread,
            "ceiling" => &mut self.ceiling,
            "floor" => &mut self.floor,
            "null_reward" => &mut self.null_reward,
            "judge_retry" => &mut self.judge_retry,
            "rubric_failure" => &mut self.rubric_failure,
            "rubric_repair" => &mut self.rubric_repair,
            "entropy" => &mut self.entropy,
            "panel_alpha" => &mut self.panel_alpha,
            "score_min" => &mut self.score_min,
            "score_max" => &mut self.score_max,
            _ => return None,
        })
    }

    /// Sets one threshold by name.
    pub fn set(&mut self, name: &str, value: f64) -> Result<(), String> {
        if !value.is_finite() {
            return Err(format!("--health: {name} must be a finite number"));
        }
        let slot = self.slot(name).ok_or_else(|| {
            format!(
                "--health: unknown threshold {name:?}; use {}",
                THRESHOLD_NAMES.join(", ")
            )
        })?;
        *slot = value;
        Ok(())
    }

    /// Applies `name=value,...` on top of these values.
    pub fn apply(&mut self, list: &str) -> Result<(), String> {
        for item in list.split(',').filter(|i| !i.trim().is_empty()) {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| format!("--health: {item:?} is not name=value"))?;
            let v: f64 = v
                .trim()
                .parse()
                .map_err(|_| format!("--health: {item:?}: the value is not a number"))?;
            self.set(k.trim(), v)?;
        }
        self.check()
    }

    /// Checks the scale: integers `0 <= min < max <= 255`.
    pub fn check(&self) -> Result<(), String> {
        let ok = |x: f64| x.fract() == 0.0 && (0.0..=255.0).contains(&x);
        if ok(self.score_min) && ok(self.score_max) && self.score_min < self.score_max {
            Ok(())
        } else {
            Err(
                "--health: score_min and score_max must be integers with 0 <= min < max <= 255"
                    .to_owned(),
            )
        }
    }

    /// The scale as `(min, max)`.
    pub fn scale(&self) -> (u8, u8) {
        (self.score_min as u8, self.score_max as u8)
    }
}

/// One check of the flags table.
#[derive(Clone, Debug, PartialEq)]
pub struct Flag {
    /// The check's name (a threshold name).
    pub check: &'static str,
    /// Where it was measured (a bucket, a dimension, or `all`).
    pub scope: String,
    /// The measured value (`None`: no data).
    pub value: Option<f64>,
    /// The threshold.
    pub threshold: f64,
    /// `>` or `<`: the value flags the run when it is beyond the threshold this way.
    pub rule: &'static str,
    /// Whether it flags the run.
    pub flagged: bool,
    /// The status without a value (`no data`).
    pub missing: &'static str,
}

fn over(check: &'static str, scope: String, value: Option<f64>, t: f64) -> Flag {
    Flag {
        check,
        scope,
        value,
        threshold: t,
        rule: ">",
        flagged: value.is_some_and(|v| v > t),
        missing: "no data",
    }
}

fn share(k: u64, n: u64) -> Option<f64> {
    (n > 0).then(|| k as f64 / n as f64)
}

/// Every check of one variant: for the length check, the worst bucket decides (the lower
/// limit of rho); for ceiling and floor, the worst dimension; `panel_alpha` only with a judge
/// panel.
pub fn flags(h: &HealthAcc, t: &Thresholds, buckets: &Buckets) -> Vec<Flag> {
    let mut out = Vec::new();
    let all = h.length.len() - 1;
    let mut worst: Option<(f64, String)> = None;
    for b in 0..=all {
        if let Some((_, Some(ci), _)) = h.rho(b)
            && worst.as_ref().is_none_or(|(w, _)| ci.lo > *w)
        {
            worst = Some((ci.lo, buckets.label(if b == all { usize::MAX } else { b })));
        }
    }
    let (v, scope) = worst.map_or((None, "all".to_owned()), |(v, s)| (Some(v), s));
    out.push(over(
        "length_rho",
        format!("turns {scope}"),
        v,
        t.length_rho,
    ));
    let s = h.spread[all];
    out.push(over(
        "zero_spread",
        "all".to_owned(),
        share(s[1], s[0]),
        t.zero_spread,
    ));
    for (check, pick, thr) in [("ceiling", 0usize, t.ceiling), ("floor", 1, t.floor)] {
        let mut best: Option<(f64, usize)> = None;
        for d in 0..3 {
            let c = h.scores[d][MAX_CRITERIA];
            let k = if pick == 0 { c.ceiling } else { c.floor };
            if let Some(v) = share(k, c.n)
                && best.is_none_or(|(b, _)| v > b)
            {
                best = Some((v, d));
            }
        }
        let (v, scope) = best.map_or((None, "all".to_owned()), |(v, d)| {
            (Some(v), super::tables::DIM_NAMES[d].to_owned())
        });
        out.push(over(check, scope, v, thr));
    }
    out.push(over(
        "null_reward",
        "all".to_owned(),
        share(h.null_reward, h.responses),
        t.null_reward,
    ));
    out.push(over(
        "judge_retry",
        "all".to_owned(),
        share(h.retried, h.judge_attempts.n),
        t.judge_retry,
    ));
    let groups = h.groups();
    out.push(over(
        "rubric_failure",
        "all".to_owned(),
        share(groups - h.rubric_status[0], groups),
        t.rubric_failure,
    ));
    out.push(over(
        "rubric_repair",
        "all".to_owned(),
        share(h.repaired, h.repair_known),
        t.rubric_repair,
    ));
    let e = h.entropy.mean();
    out.push(Flag {
        check: "entropy",
        scope: "all".to_owned(),
        value: e,
        threshold: t.entropy,
        rule: "<",
        flagged: e.is_some_and(|v| v < t.entropy),
        missing: "no data",
    });
    // A single judge has no agreement to check: the check is left out (the panel view says
    // "no panel").
    let p = &h.panel;
    if p.is_panel() {
        let a = p.reward.value();
        out.push(Flag {
            check: "panel_alpha",
            scope: format!("reward, {} responses", p.reward.units()),
            value: a,
            threshold: t.panel_alpha,
            rule: "<",
            flagged: a.is_some_and(|v| v < t.panel_alpha),
            missing: "no data",
        });
    }
    out
}

/// One line per variant with health data: the checks it fails, or that it passes.
pub fn summary(acc: &Acc) -> Vec<String> {
    let t = &acc.settings.thresholds;
    variants(acc)
        .into_iter()
        .map(|(name, h)| {
            let fl = flags(h, t, &acc.settings.buckets);
            let with_data = fl.iter().filter(|f| f.value.is_some()).count();
            let bad: Vec<String> = fl
                .iter()
                .filter(|f| f.flagged)
                .map(|f| {
                    format!(
                        "{} ({}: {:.3} {} {})",
                        f.check,
                        f.scope,
                        f.value.unwrap_or(f64::NAN),
                        f.rule,
                        f.threshold
                    )
                })
                .collect();
            let verdict = if bad.is_empty() {
                format!(
                    "{name}: passed ({with_data} of {} checks had data; none crossed its \
                     threshold).",
                    fl.len()
                )
            } else {
                format!("{name}: FLAGGED by {}.", bad.join("; "))
            };
            format!("{verdict} {}", panel_line(&h.panel))
        })
        .collect()
}

/// One sentence on the judges: `Judges: no panel.` for a single judge, else the panel's
/// agreement at both levels and its flagged share.
pub fn panel_line(p: &PanelAcc) -> String {
    if !p.is_panel() {
        return "Judges: no panel.".to_owned();
    }
    let alpha = |a: &Alpha, what: &str| match a.value() {
        Some(v) => format!("{v:.3} over {} {what}", a.units()),
        None => format!("undefined over {} {what}", a.units()),
    };
    format!(
        "Judges: a panel of {}; Krippendorff's alpha {} ({}); {} of {} responses flagged.",
        p.judges,
        alpha(&p.reward, "responses"),
        alpha(&p.score, "criterion scores"),
        p.flagged,
        p.responses
    )
}

/// A judge panel's agreement and flags per variant (`no panel` for a single judge).
pub fn panel_table(acc: &Acc) -> Table {
    let mut rows = Vec::new();
    for (name, h) in variants(acc) {
        let p = &h.panel;
        if !p.is_panel() {
            rows.push(vec![
                Cell::Text(name),
                Cell::Text("no panel".to_owned()),
                Cell::Int(u64::from(p.judges.max(1))),
                Cell::Int(p.responses),
                Cell::Empty,
                Cell::Empty,
                Cell::Empty,
                Cell::Empty,
                Cell::Empty,
                Cell::Empty,
            ]);
            continue;
        }
        let alpha = |a: &Alpha| a.value().map_or(Cell::Empty, Cell::Num);
        rows.push(vec![
            Cell::Text(name),
            Cell::Text("panel".to_owned()),
            Cell::Int(u64::from(p.judges)),
            Cell::Int(p.responses),
            Cell::Int(p.flagged),
            opt_rate(p.flagged, p.responses),
            alpha(&p.reward),
            Cell::Int(p.reward.units()),
            alpha(&p.score),
            Cell::Int(p.score.units()),
        ]);
    }
    Table {
        name: "health_panel",
        title: "Reward health: judge panel agreement".to_owned(),
        caption: "Per variant, over the responses a judge panel judged: the judges in the panel \
                  (no panel: a single judge, nothing to agree on), the share of responses \
                  flagged because the judges' rewards spread by more than max_spread (95% \
                  Wilson interval), and Krippendorff's alpha for interval data between the \
                  judges, on their rewards (a unit per response) and on their criterion scores \
                  (a unit per criterion of a response), each over the units two judges or more \
                  rated. 1 is perfect agreement, 0 agreement at chance level; below 0.667 \
                  Krippendorff advises against drawing even tentative conclusions."
            .to_owned(),
        columns: vec![
            col("variant", Kind::Plain),
            col("panel", Kind::Plain),
            col("judges", Kind::Plain),
            col("responses", Kind::Plain),
            col("flagged", Kind::Plain),
            col("flagged_share", Kind::Interval),
            col("reward_alpha", Kind::Plain),
            col("reward_units", Kind::Plain),
            col("score_alpha", Kind::Plain),
            col("score_units", Kind::Plain),
        ],
        rows,
    }
}

/// The Wilson interval of `k` of `n` as an optional pair, for tables.
pub fn rate(k: u64, n: u64) -> Option<(f64, Option<super::stats::Interval>)> {
    share(k, n).map(|p| (p, wilson95(k, n)))
}

fn col(name: &str, kind: Kind) -> Column {
    Column {
        name: name.to_owned(),
        kind,
    }
}

/// The variants with health data, with their accumulators.
pub fn variants(acc: &Acc) -> Vec<(String, &HealthAcc)> {
    acc.variants
        .iter()
        .filter_map(|(n, v)| v.health.as_ref().map(|h| (variant_name(n), h)))
        .collect()
}

fn opt_rate(k: u64, n: u64) -> Cell {
    if n == 0 { Cell::Empty } else { rate_cell(k, n) }
}

/// The flags: every check of every variant with health data.
pub fn flags_table(acc: &Acc) -> Table {
    let t = &acc.settings.thresholds;
    let mut rows = Vec::new();
    for (name, h) in variants(acc) {
        for f in flags(h, t, &acc.settings.buckets) {
            rows.push(vec![
                Cell::Text(name.clone()),
                Cell::Text(f.check.to_owned()),
                Cell::Text(f.scope),
                f.value.map_or(Cell::Empty, Cell::Num),
                Cell::Text(f.rule.to_owned()),
                Cell::Num(f.threshold),
                Cell::Text(
                    match (f.value, f.flagged) {
                        (None, _) => f.missing,
                        (Some(_), true) => "FLAGGED",
                        (Some(_), false) => "ok",
                    }
                    .to_owned(),
                ),
            ]);
        }
    }
    Table {
        name: "health_flags",
        title: "Reward health: checks".to_owned(),
        caption: "Each check's measured value against its threshold (--health name=value sets \
                  them): length_rho is the largest lower 95% limit of Spearman's rho of reward \
                  and length over the turn buckets; zero_spread the share of groups whose valid \
                  rewards are all equal; ceiling and floor the largest share of a dimension's \
                  scores at the top or bottom of the scale; null_reward the share of responses \
                  without a reward; judge_retry the share of judged responses asked more than \
                  once; rubric_failure the share of groups without a valid rubric; rubric_repair \
                  the share of groups that needed a repair; entropy the mean weight entropy \
                  (nats); panel_alpha Krippendorff's alpha (interval) of a judge panel's rewards \
                  (below 0.667 by default: Krippendorff's bound for tentative conclusions; no \
                  panel for a single judge). A check with no data neither flags nor passes."
            .to_owned(),
        columns: vec![
            col("variant", Kind::Plain),
            col("check", Kind::Plain),
            col("scope", Kind::Plain),
            col("value", Kind::Plain),
            col("rule", Kind::Plain),
            col("threshold", Kind::Plain),
            col("status", Kind::Plain),
        ],
        rows,
    }
}

/// Reward against response length per turn bucket.
pub fn length_table(acc: &Acc) -> Table {
    let b = &acc.settings.buckets;
    let mut rows = Vec::new();
    for (name, h) in variants(acc) {
        let all = h.length.len() - 1;
        for (i, l) in h.length.iter().enumerate() {
            if l.fit.n == 0 {
                continue;
            }
            let label = if i == all {
                "all".to_owned()
            } else {
                b.label(i)
            };
            let rho = h.rho(i);
            let slope = l.fit.slope().map(|s| s * 1000.0);
            rows.push(vec![
                Cell::Text(name.clone()),
                Cell::Text(label),
                Cell::Int(l.fit.n),
                rho.map_or(Cell::Empty, |(r, ci, _)| Cell::Mean(r, ci)),
                Cell::Int(rho.map_or(0, |(_, _, n)| n)),
                slope.map_or(Cell::Empty, |s| {
                    Cell::Mean(
                        s,
                        l.fit.slope_ci95().map(|c| super::stats::Interval {
                            lo: c.lo * 1000.0,
                            hi: c.hi * 1000.0,
                        }),
                    )
                }),
                l.fit.mean_x().map_or(Cell::Empty, Cell::Num),
            ]);
        }
    }
    Table {
        name: "health_length",
        title: "Reward health: reward against response length".to_owned(),
        caption: format!(
            "Per turn bucket, over the responses with a reward and a known length (characters): \
             Spearman's rank correlation of reward and length with its 95% interval by Fisher's \
             z, tanh(atanh(rho) +- 1.96 sqrt(1.06 / (n - 3))) (computed on a uniform sample of \
             at most {RHO_SAMPLE} responses per bucket, rho_n), and the least-squares slope of \
             the reward per 1,000 characters with its t interval. A positive correlation means \
             longer answers are paid more: the judge may be rewarding length."
        ),
        columns: vec![
            col("variant", Kind::Plain),
            col("turns", Kind::Plain),
            col("responses", Kind::Plain),
            col("spearman_rho", Kind::Interval),
            col("rho_n", Kind::Plain),
            col("slope_per_1000_chars", Kind::Interval),
            col("mean_chars", Kind::Plain),
        ],
        rows,
    }
}

/// Groups whose valid rewards are all equal, per turn bucket.
pub fn groups_table(acc: &Acc) -> Table {
    let b = &acc.settings.buckets;
    let mut rows = Vec::new();
    for (name, h) in variants(acc) {
        let all = h.spread.len() - 1;
        for (i, s) in h.spread.iter().enumerate() {
            if s[0] == 0 && i != all {
                continue;
            }
            let label = if i == all {
                "all".to_owned()
            } else {
                b.label(i)
            };
            rows.push(vec![
                Cell::Text(name.clone()),
                Cell::Text(label),
                Cell::Int(s[0]),
                Cell::Int(s[1]),
                opt_rate(s[1], s[0]),
            ]);
        }
    }
    Table {
        name: "health_groups",
        title: "Reward health: groups without signal".to_owned(),
        caption: "Per turn bucket, the groups (one turn's responses) with at least two valid \
                  rewards, and those whose valid rewards are all exactly equal: every GRPO \
                  advantage of such a group is 0, so it teaches nothing. Share with a 95% Wilson \
                  interval."
            .to_owned(),
        columns: vec![
            col("variant", Kind::Plain),
            col("turns", Kind::Plain),
            col("groups", Kind::Plain),
            col("zero_spread", Kind::Plain),
            col("zero_spread_share", Kind::Interval),
        ],
        rows,
    }
}

/// Scores at the ceiling and the floor of the scale, per dimension and criterion position.
pub fn scores_table(acc: &Acc) -> Table {
    let (lo, hi) = acc.settings.thresholds.scale();
    let mut rows = Vec::new();
    for (name, h) in variants(acc) {
        for d in 0..3 {
            for (i, c) in h.scores[d].iter().enumerate() {
                if c.n == 0 {
                    continue;
                }
                let pos = if i == MAX_CRITERIA {
                    "all".to_owned()
                } else {
                    (i + 1).to_string()
                };
                rows.push(vec![
                    Cell::Text(name.clone()),
                    Cell::Text(super::tables::DIM_NAMES[d].to_owned()),
                    Cell::Text(pos),
                    Cell::Int(c.n),
                    rate_cell(c.ceiling, c.n),
                    rate_cell(c.floor, c.n),
                ]);
            }
        }
    }
    Table {
        name: "health_scores",
        title: "Reward health: scores at the ceiling and the floor".to_owned(),
        caption: format!(
            "Per dimension and criterion position (1 = the dimension's first criterion; all = \
             every criterion of the dimension), the share of judge scores at the top ({hi}) and \
             the bottom ({lo}) of the scale, with 95% Wilson intervals. A criterion always at \
             the ceiling no longer tells responses apart."
        ),
        columns: vec![
            col("variant", Kind::Plain),
            col("dimension", Kind::Plain),
            col("criterion", Kind::Plain),
            col("scores", Kind::Plain),
            col("ceiling", Kind::Interval),
            col("floor", Kind::Interval),
        ],
        rows,
    }
}

/// The judge's statuses, retries and missing rewards; the rubric's failures and repairs.
pub fn loop_table(acc: &Acc) -> Table {
    let mut rows = Vec::new();
    for (name, h) in variants(acc) {
        let statuses: Vec<String> = h
            .statuses
            .iter()
            .map(|(s, k)| format!("{s}: {k}"))
            .collect();
        let groups = h.groups();
        rows.push(vec![
            Cell::Text(name),
            Cell::Int(h.responses),
            Cell::Text(statuses.join(", ")),
            opt_rate(h.null_reward, h.responses),
            opt_rate(h.retried, h.judge_attempts.n),
            super::tables::mean_cell(&h.judge_attempts),
            Cell::Int(groups),
            Cell::Int(h.rubric_status[1]),
            Cell::Int(h.rubric_status[2]),
            opt_rate(groups - h.rubric_status[0], groups),
            opt_rate(h.repaired, h.repair_known),
            super::tables::mean_cell(&h.rubric_attempts),
        ]);
    }
    Table {
        name: "health_loop",
        title: "Reward health: judge and rubric generator".to_owned(),
        caption: "Responses by status; the share without a reward and the share of judged \
                  responses whose judge was asked more than once, with the mean judge answers \
                  per judged response; groups (turns) by rubric outcome, the share without a \
                  valid rubric (invalid_rubric, generator_error or another status) and the share \
                  that needed a repair, with the mean generator answers per group. Rates with 95% \
                  Wilson intervals, means with 95% t intervals."
            .to_owned(),
        columns: vec![
            col("variant", Kind::Plain),
            col("responses", Kind::Plain),
            col("statuses", Kind::Plain),
            col("null_reward", Kind::Interval),
            col("judge_retried", Kind::Interval),
            col("judge_attempts", Kind::Interval),
            col("groups", Kind::Plain),
            col("invalid_rubric", Kind::Plain),
            col("generator_error", Kind::Plain),
            col("rubric_failure", Kind::Interval),
            col("rubric_repaired", Kind::Interval),
            col("rubric_attempts", Kind::Interval),
        ],
        rows,
    }
}

/// The entropy of the weights of valid rubrics by turn.
pub fn entropy_table(acc: &Acc) -> Table {
    let mut rows = Vec::new();
    for (name, h) in variants(acc) {
        if h.entropy.n == 0 {
            continue;
        }
        for (t, w) in &h.entropy_by_turn {
            rows.push(vec![
                Cell::Text(name.clone()),
                Cell::Text(t.to_string()),
                Cell::Int(w.n),
                super::tables::mean_cell(w),
            ]);
        }
        rows.push(vec![
            Cell::Text(name.clone()),
            Cell::Text("all".to_owned()),
            Cell::Int(h.entropy.n),
            super::tables::mean_cell(&h.entropy),
        ]);
    }
    Table {
        name: "health_entropy",
        title: "Reward health: weight entropy by turn".to_owned(),
        caption: "Mean entropy -sum w ln w (nats) of the scoring weights of the valid rubrics of \
                  each turn, with 95% t intervals: ln 3 = 1.099 for equal weights, 0 when one \
                  dimension holds all the weight (the rubric no longer adapts its priorities)."
            .to_owned(),
        columns: vec![
            col("variant", Kind::Plain),
            col("turn", Kind::Plain),
            col("rubrics", Kind::Plain),
            col("entropy", Kind::Interval),
        ],
        rows,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn rd(s: &str) -> Result<Option<HealthObs>, LineError> {
        let v: Value = serde_json::from_str(s).unwrap();
        read(v.as_object().unwrap(), None)
    }

    #[test]
    fn reading_log_records_and_reward_lines() {
        let h = rd(r#"{"care_log":1,"group":7,"index":0,"group_size":2,"turn":3,"rubric_status":"ok","rubric_attempts":2,"repairs":1,"rubric_weights":[0.4,0.25,0.35],"status":"ok","reward":0.925,"judge_attempts":1,"scores":[[5,4,5],[5,4],[4,5,5]],"response_chars":312}"#)
            .unwrap()
            .unwrap();
        assert_eq!((h.group, h.first, h.repairs), (Some(7), true, Some(1)));
        assert_eq!(h.responses[0].chars, Some(312));
        assert_eq!(h.responses[0].scores[1], [Some(5), Some(4)]);
        assert!(rd(r#"{"care_log":2}"#).is_err());
        assert!(rd(r#"{"care_log":1,"group":1,"index":2,"group_size":2,"status":"ok","rubric_status":"ok"}"#).is_err());
        let r = rd(r#"{"rubric_status":"invalid_rubric","rubric_attempts":3,"repairs":[{"attempt":1},{"attempt":2}],"responses":[{"reward":null,"status":"no_rubric","scores":null,"judge_attempts":0}],"response_chars":[40]}"#)
            .unwrap()
            .unwrap();
        assert_eq!((r.group, r.repairs, r.weights), (None, Some(2), None));
        assert_eq!(r.responses[0].chars, Some(40));
        assert!(
            rd(r#"{"rubric_status":"ok","responses":[{"status":"ok"}],"response_chars":[1,2]}"#)
                .is_err()
        );
        assert_eq!(rd(r#"{"rubric":null}"#).unwrap(), None);
    }

    #[test]
    fn buckets_parse_and_place() {
        let b = Buckets::parse(DEFAULT_BUCKETS).unwrap();
        assert_eq!(b.of(0), Some(0));
        assert_eq!(b.of(8), Some(2));
        assert_eq!(b.of(1000), Some(3));
        assert_eq!(b.label(3), "12-");
        let one = Buckets::parse("1-1,2-").unwrap();
        assert_eq!(one.label(0), "1");
        assert_eq!(one.of(0), None);
        for bad in ["3-1", "0-3,2-5", "0-,4-7", "a-b", "0-3,x"] {
            assert!(Buckets::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn zero_spread_groups_from_log_records() {
        let mut h = HealthAcc::new(1, 0);
        let rec = |g: u64, reward: Option<f64>| HealthObs {
            group: Some(g),
            first: false,
            rubric_status: Some("ok".to_owned()),
            rubric_attempts: Some(1),
            repairs: Some(0),
            weights: None,
            responses: vec![RespObs {
                reward,
                status: "ok".to_owned(),
                judge_attempts: 1,
                chars: None,
                scores: Vec::new(),
                panel: None,
            }],
        };
        // Group 1: 0.5, 0.5 (flat); group 2: 0.5, 0.7; group 3: one reward only.
        for (g, r) in [
            (1, Some(0.5)),
            (1, Some(0.5)),
            (2, Some(0.5)),
            (2, Some(0.7)),
            (3, Some(0.1)),
            (3, None),
        ] {
            h.add(&rec(g, r), Some(1), Some(0), (0, 5));
        }
        h.finish();
        assert_eq!(h.spread[1], [2, 1]);
        assert_eq!(h.spread[0], [2, 1]);
        assert_eq!(h.null_reward, 1);
    }

    #[test]
    fn entropy_and_thresholds() {
        assert!((entropy([1.0 / 3.0; 3]).unwrap() - 3f64.ln()).abs() < 1e-12);
        assert_eq!(entropy([1.0, 0.0, 0.0]), Some(0.0));
        let mut t = Thresholds::default();
        t.apply("length_rho=0.2, entropy=0.1").unwrap();
        assert_eq!((t.length_rho, t.entropy), (0.2, 0.1));
        assert!(t.apply("lenght_rho=1").is_err());
        assert!(t.apply("score_max=0").is_err());
    }
}
