//! One input line of `care analyze` read into a [`Record`]: the grouping fields and what the
//! line says about a rubric, a preference pair and a response's tactics.
//!
//! Reading a line is the part that runs on every core (it validates rubric text and scores
//! pairs with `care-core`); the record it gives is small and is folded into the report's
//! sufficient statistics in input order by [`super::accum`].

use care_core::{
    FormatPolicy, PreferenceOptions, PreferenceOutcome, ScoreOptions, UnknownLabelPolicy,
    Validation, ViolationCode, preference_reward, validate_str,
};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::vocab::LabelSet;
use crate::cmd::rubric::{Scratch, explain_score_error, flatten_scores, member_text};
use crate::input::{Line, score_matrix, str_array};
use crate::json::LineError;

/// Highest accepted `turn`.
pub const MAX_TURN: u64 = 1000;
/// Longest accepted `variant` (characters).
pub const MAX_VARIANT_CHARS: usize = 200;
/// Most emotion labels in a vocabulary.
pub const MAX_EMOTIONS: usize = 32;
/// Strategy label ids (positions in the label set) are below this.
pub const LABEL_IDS: usize = 32;
/// Unknown label names a line keeps for the report (the rest are only counted).
pub const UNKNOWN_NAMES_PER_LINE: usize = 8;
/// Characters of an unknown label name kept for the report.
pub const UNKNOWN_NAME_CHARS: usize = 64;
/// Violation codes are numbered `1..VIOLATION_SLOTS` (`ViolationCode::number`).
pub const VIOLATION_SLOTS: usize = 17;
/// Criteria per dimension are at most this (`care_core::rubric::MAX_CRITERIA`).
pub const MAX_CRITERIA: usize = care_core::rubric::MAX_CRITERIA;

/// The emotion labels a line's `emotion` may take, in the order the report shows them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Emotions {
    names: Vec<String>,
    /// Extra spellings accepted for a label: `(alias, index)`.
    aliases: Vec<(String, usize)>,
}

/// The default vocabulary: Ekman's six basic emotions (the labels the paper assigns to user
/// turns), from positive to negative valence as the paper reads Figure 4.
pub const DEFAULT_EMOTIONS: &str = "joy,surprise,fear,sadness,disgust,anger";

impl Default for Emotions {
    fn default() -> Self {
        // DEFAULT_EMOTIONS is a valid list (tested); an empty vocabulary is the fallback that
        // can never happen.
        Emotions::parse_list(DEFAULT_EMOTIONS).unwrap_or(Emotions {
            names: Vec::new(),
            aliases: Vec::new(),
        })
    }
}

impl Emotions {
    /// A vocabulary from a comma-separated list (trimmed, case-insensitive, no duplicates,
    /// at most [`MAX_EMOTIONS`]). `happiness` is accepted for `joy` when the list has `joy`
    /// and not `happiness`.
    pub fn parse_list(list: &str) -> Result<Self, String> {
        let mut names: Vec<String> = Vec::new();
        for raw in list.split(',') {
            let name = raw.trim();
            if name.is_empty() {
                return Err(format!("--emotions: empty label in {list:?}"));
            }
            if names.iter().any(|n| n.eq_ignore_ascii_case(name)) {
                return Err(format!("--emotions: {name:?} is listed twice"));
            }
            names.push(name.to_owned());
        }
        if names.len() > MAX_EMOTIONS {
            return Err(format!(
                "--emotions: {} labels, at most {MAX_EMOTIONS}",
                names.len()
            ));
        }
        let joy = names.iter().position(|n| n.eq_ignore_ascii_case("joy"));
        let has_happiness = names.iter().any(|n| n.eq_ignore_ascii_case("happiness"));
        let aliases = match joy {
            Some(i) if !has_happiness => vec![("happiness".to_owned(), i)],
            _ => Vec::new(),
        };
        Ok(Emotions { names, aliases })
    }

    /// The labels in report order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The index of `label` (trimmed, ASCII-case-insensitive, aliases accepted).
    pub fn lookup(&self, label: &str) -> Option<usize> {
        let s = label.trim();
        self.names
            .iter()
            .position(|n| n.eq_ignore_ascii_case(s))
            .or_else(|| {
                self.aliases
                    .iter()
                    .find(|(a, _)| a.eq_ignore_ascii_case(s))
                    .map(|&(_, i)| i)
            })
    }
}

/// Everything a line is read with.
#[derive(Clone, Debug)]
pub struct Options {
    /// Format contract for rubric text (`r_fmt`, violations).
    pub format: FormatPolicy,
    /// Scoring policies for pair scores (`r_theta`).
    pub score: ScoreOptions,
    /// `tau` and scale of `r_pref`.
    pub pref: PreferenceOptions,
    /// What an unknown tactic label does.
    pub labels: UnknownLabelPolicy,
    /// The strategy labels `tactics` may name.
    pub label_set: LabelSet,
    /// The emotion vocabulary.
    pub emotions: Emotions,
    /// Keep each line's `id` (the pairing key of comparisons).
    pub keep_ids: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            format: FormatPolicy::PAPER,
            score: ScoreOptions::default(),
            pref: PreferenceOptions::PAPER,
            labels: UnknownLabelPolicy::Error,
            label_set: LabelSet::default(),
            emotions: Emotions::default(),
            keep_ids: false,
        }
    }
}

/// What one line contributes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// `variant` (or `model`); `None` when the line names none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// Dialogue turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<u32>,
    /// Index into the emotion vocabulary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub emotion: Option<u8>,
    /// The rubric the line carries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rubric: Option<RubricObs>,
    /// The preference pair the line carries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pair: Option<PairObs>,
    /// The response's tactic set: distinct label ids, ascending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tactics: Option<Vec<u8>>,
    /// Tactic labels left out as unknown (`--unknown-label ignore`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unknown_tactics: u32,
    /// The first [`UNKNOWN_NAMES_PER_LINE`] of them, for the report.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unknown_names: Vec<String>,
    /// The line's `id` as JSON text, when comparisons pair observations by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// A judge's or annotator's verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<super::verdict::VerdictObs>,
    /// Reward-health data: a `care reward` output line or a `care serve --log` record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<super::health::HealthObs>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// How far a rubric got.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RubricStatus {
    /// `"rubric": null`: the generator gave nothing (a failed generation).
    Missing,
    /// Text that did not parse into a rubric.
    Unparsed,
    /// Parsed (it may still break the contract).
    Parsed,
}

/// A rubric's validation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RubricObs {
    /// How far it got.
    pub status: RubricStatus,
    /// `r_fmt == 1`.
    pub valid: bool,
    /// Occurrences per violation code: `(ViolationCode::number, count)`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub codes: Vec<(u8, u32)>,
    /// Weights as parsed, canonical order (when parsed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<[f64; 3]>,
    /// Criteria per dimension (when parsed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub criteria: Option<[u8; 3]>,
}

/// Outcome of a pair under its rubric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// `r_theta(chosen) > r_theta(rejected)`.
    Win,
    /// Equal rewards.
    Tie,
    /// `r_theta(chosen) < r_theta(rejected)`.
    Loss,
    /// The rubric is missing or did not parse: nothing to score the pair with.
    Unscored,
}

/// A preference pair.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PairObs {
    /// Win, tie, loss or unscored.
    pub outcome: Outcome,
    /// `r_pref` (Eq. 3) when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r_pref: Option<f64>,
}

/// Reads one line (already strictly parsed JSON) into a [`Record`].
pub fn read(opts: &Options, line: &str, value: &Value) -> Result<Record, LineError> {
    let m = value
        .as_object()
        .ok_or_else(|| LineError::schema("the line must be a JSON object"))?;
    let g = grouping(m)?;
    let mut rec = Record {
        variant: variant(&g)?,
        turn: turn(&g)?,
        emotion: emotion(&g, &opts.emotions)?,
        ..Record::default()
    };
    match rubric_source(m)? {
        Source::Text(key) => {
            let parsed = Line::parse(line)?;
            let text = member_text(&parsed, key)?;
            let mut scratch = Scratch::take(text.len());
            let v = validate_str(text, &opts.format, scratch.buf())?;
            rec.rubric = Some(observe(&v));
            rec.pair = pair(opts, m, Some(&v))?;
        }
        Source::Null => {
            rec.rubric = Some(RubricObs::missing());
            rec.pair = pair(opts, m, None)?;
        }
        Source::Validation(v, prefix) => {
            rec.rubric = Some(precomputed(v, prefix)?);
            rec.pair = pair(opts, m, None)?;
        }
        Source::None => rec.pair = pair(opts, m, None)?,
    }
    if let Some(t) = m.get("tactics") {
        let (ids, unknown, names) = tactics(t, &opts.label_set, opts.labels)?;
        rec.tactics = Some(ids);
        rec.unknown_tactics = unknown;
        rec.unknown_names = names;
    }
    rec.verdict = super::verdict::read(m)?;
    rec.health = super::health::read(m, rec.rubric.as_ref())?;
    if opts.keep_ids {
        rec.key = key(m)?;
    }
    if rec.rubric.is_none()
        && rec.pair.is_none()
        && rec.tactics.is_none()
        && rec.verdict.is_none()
        && rec.health.is_none()
    {
        return Err(LineError::new(
            "nothing_to_analyze",
            "the line has nothing to analyze: give a rubric (\"text\", \"rubric\", or \
             \"format_reward\" as care validate writes it), a pair (\"chosen_scores\" and \
             \"rejected_scores\" with a \"rubric\", or \"chosen_reward\" and \"rejected_reward\"), \
             \"tactics\", a \"verdict\", or a care reward output line or care serve --log record",
        ));
    }
    Ok(rec)
}

/// The members a line is grouped by (`variant` or `model`, `turn`, `emotion`): the line's own,
/// or those of its `meta` object (how `care reward` and `care serve` carry a turn's labels). A
/// member given in both places is an error.
fn grouping(m: &Map<String, Value>) -> Result<std::borrow::Cow<'_, Map<String, Value>>, LineError> {
    let meta = match m.get("meta") {
        None | Some(Value::Null) => return Ok(std::borrow::Cow::Borrowed(m)),
        Some(Value::Object(meta)) => meta,
        Some(_) => return Err(LineError::schema("\"meta\" must be an object")),
    };
    let mut g = Map::new();
    for key in ["variant", "model", "turn", "emotion"] {
        let present = |v: Option<&Value>| v.filter(|v| !v.is_null()).cloned();
        match (present(m.get(key)), present(meta.get(key))) {
            (Some(_), Some(_)) => {
                return Err(LineError::schema(format!(
                    "\"{key}\" is given twice, at the top level and in \"meta\"; give it once"
                )));
            }
            (Some(v), None) | (None, Some(v)) => {
                g.insert(key.to_owned(), v);
            }
            (None, None) => {}
        }
    }
    Ok(std::borrow::Cow::Owned(g))
}

/// Longest pairing key kept (bytes of the `id`'s JSON text).
pub const MAX_KEY_BYTES: usize = 256;

/// The line's `id` as a pairing key: a string or an integer, as its JSON text.
fn key(m: &Map<String, Value>) -> Result<Option<String>, LineError> {
    let text = match m.get("id") {
        None | Some(Value::Null) => return Ok(None),
        Some(v @ Value::String(_)) => v.to_string(),
        Some(v @ Value::Number(n)) if n.is_u64() || n.is_i64() => v.to_string(),
        Some(_) => {
            return Err(LineError::schema(
                "\"id\" must be a string or an integer (it pairs observations across variants)",
            ));
        }
    };
    if text.len() > MAX_KEY_BYTES {
        return Err(LineError::schema(format!(
            "\"id\" is longer than {MAX_KEY_BYTES} bytes"
        )));
    }
    Ok(Some(text))
}

fn group_string<'v>(m: &'v Map<String, Value>, key: &str) -> Result<Option<&'v str>, LineError> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.trim().is_empty() => Err(LineError::new(
            "empty_group",
            format!("\"{key}\" is empty; name the group or leave the member out"),
        )),
        Some(Value::String(s)) => Ok(Some(s.trim())),
        Some(_) => Err(LineError::schema(format!("\"{key}\" must be a string"))),
    }
}

fn variant(m: &Map<String, Value>) -> Result<Option<String>, LineError> {
    let v = group_string(m, "variant")?;
    let model = group_string(m, "model")?;
    let name = match (v, model) {
        (Some(a), Some(b)) if a != b => {
            return Err(LineError::schema(format!(
                "\"variant\" ({a:?}) and \"model\" ({b:?}) differ; give one of them"
            )));
        }
        (a, b) => a.or(b),
    };
    if name.is_some_and(|n| n.chars().count() > MAX_VARIANT_CHARS) {
        return Err(LineError::schema(format!(
            "\"variant\" is longer than {MAX_VARIANT_CHARS} characters"
        )));
    }
    Ok(name.map(str::to_owned))
}

fn turn(m: &Map<String, Value>) -> Result<Option<u32>, LineError> {
    match m.get("turn") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .filter(|&t| t <= MAX_TURN)
            .map(|t| Some(t as u32))
            .ok_or_else(|| {
                LineError::new(
                    "turn_out_of_range",
                    format!("\"turn\" must be an integer in 0..={MAX_TURN}, found {v}"),
                )
            }),
    }
}

fn emotion(m: &Map<String, Value>, vocab: &Emotions) -> Result<Option<u8>, LineError> {
    let Some(label) = group_string(m, "emotion")? else {
        return Ok(None);
    };
    vocab.lookup(label).map(|i| Some(i as u8)).ok_or_else(|| {
        LineError::new(
            "unknown_emotion",
            format!(
                "unknown emotion {label:?}; expected one of {} (--emotions sets the list)",
                vocab.names().join(", ")
            ),
        )
    })
}

/// Where the line's rubric comes from.
enum Source<'v> {
    /// Text to validate here: member `rubric` (a string, or an object validated as written) or
    /// `text`.
    Text(&'static str),
    /// `"rubric": null`.
    Null,
    /// A validation as `care validate` writes it, at the top level or under `validation`.
    Validation(&'v Map<String, Value>, &'static str),
    /// No rubric.
    None,
}

fn rubric_source(m: &Map<String, Value>) -> Result<Source<'_>, LineError> {
    Ok(match (m.get("rubric"), m.get("text")) {
        (Some(_), Some(_)) => {
            return Err(LineError::schema(
                "the line has both \"rubric\" and \"text\"; give the rubric once",
            ));
        }
        (Some(Value::Null), None) => Source::Null,
        (Some(_), None) => Source::Text("rubric"),
        (None, Some(Value::String(_))) => Source::Text("text"),
        (None, Some(_)) => return Err(LineError::schema("\"text\" must be a string")),
        (None, None) => match m.get("validation") {
            Some(Value::Object(v)) => Source::Validation(v, "validation."),
            Some(_) => return Err(LineError::schema("\"validation\" must be an object")),
            None if m.contains_key("format_reward") => Source::Validation(m, ""),
            None => Source::None,
        },
    })
}

impl RubricObs {
    fn missing() -> Self {
        RubricObs {
            status: RubricStatus::Missing,
            valid: false,
            codes: Vec::new(),
            weights: None,
            criteria: None,
        }
    }
}

/// What the report keeps of a validation done here.
fn observe(v: &Validation<'_>) -> RubricObs {
    let mut codes: Vec<(u8, u32)> = Vec::new();
    for violation in v.report.violations() {
        let n = violation.code.number();
        match codes.iter_mut().find(|(c, _)| *c == n) {
            Some((_, k)) => *k += 1,
            None => codes.push((n, 1)),
        }
    }
    codes.sort_unstable();
    match &v.rubric {
        Some(r) => RubricObs {
            status: RubricStatus::Parsed,
            valid: v.is_valid(),
            codes,
            weights: Some(r.weights()),
            // At most MAX_CRITERIA per dimension: the validator's capacity.
            criteria: Some(r.counts().map(|x| x.min(MAX_CRITERIA) as u8)),
        },
        None => RubricObs {
            status: RubricStatus::Unparsed,
            valid: false,
            codes,
            weights: None,
            criteria: None,
        },
    }
}

/// A validation as `care validate` writes it: `format_reward`, `violations`, and `weights` and
/// `criteria` when the text parsed.
fn precomputed(m: &Map<String, Value>, prefix: &str) -> Result<RubricObs, LineError> {
    let fr = m
        .get("format_reward")
        .ok_or_else(|| LineError::schema(format!("missing key \"{prefix}format_reward\"")))?;
    let valid = match fr.as_f64() {
        Some(1.0) => true,
        Some(0.0) => false,
        _ => {
            return Err(LineError::schema(format!(
                "\"{prefix}format_reward\" must be 0 or 1"
            )));
        }
    };
    let mut codes: Vec<(u8, u32)> = Vec::new();
    match m.get("violations") {
        None | Some(Value::Null) => {}
        Some(Value::Array(list)) => {
            for (i, item) in list.iter().enumerate() {
                let code = match item {
                    Value::String(s) => Some(s.as_str()),
                    Value::Object(o) => o.get("code").and_then(Value::as_str),
                    _ => None,
                }
                .ok_or_else(|| {
                    LineError::schema(format!(
                        "\"{prefix}violations\"[{i}] must be a code string or an object with \"code\""
                    ))
                })?;
                let n = ViolationCode::from_str_code(code)
                    .ok_or_else(|| {
                        LineError::new(
                            "unknown_violation_code",
                            format!(
                                "\"{prefix}violations\"[{i}]: unknown violation code {code:?} \
                                 (the codes of care validate)"
                            ),
                        )
                    })?
                    .number();
                match codes.iter_mut().find(|(c, _)| *c == n) {
                    Some((_, k)) => *k += 1,
                    None => codes.push((n, 1)),
                }
            }
        }
        Some(_) => {
            return Err(LineError::schema(format!(
                "\"{prefix}violations\" must be an array"
            )));
        }
    }
    codes.sort_unstable();
    if valid && !codes.is_empty() {
        return Err(LineError::schema(format!(
            "\"{prefix}format_reward\" is 1 but \"{prefix}violations\" is not empty"
        )));
    }
    let weights = match m.get("weights") {
        None | Some(Value::Null) => None,
        Some(w) => Some(three(w, &format!("{prefix}weights"), |x| {
            x.as_f64().filter(|f| f.is_finite())
        })?),
    };
    let criteria = match m.get("criteria") {
        None | Some(Value::Null) => None,
        Some(c) => Some(three(c, &format!("{prefix}criteria"), |x| {
            x.as_u64()
                .filter(|&n| n <= MAX_CRITERIA as u64)
                .map(|n| n as u8)
        })?),
    };
    if weights.is_some() != criteria.is_some() {
        return Err(LineError::schema(format!(
            "give both \"{prefix}weights\" and \"{prefix}criteria\" (a parsed rubric) or neither"
        )));
    }
    if valid && weights.is_none() {
        return Err(LineError::schema(format!(
            "\"{prefix}format_reward\" is 1 but \"{prefix}weights\" is missing"
        )));
    }
    if valid && weights.is_some_and(|w| w.iter().any(|x| !(0.0..=1.0).contains(x))) {
        return Err(LineError::schema(format!(
            "\"{prefix}format_reward\" is 1 but a weight is outside [0, 1]"
        )));
    }
    Ok(RubricObs {
        status: if weights.is_some() {
            RubricStatus::Parsed
        } else {
            RubricStatus::Unparsed
        },
        valid,
        codes,
        weights,
        criteria,
    })
}

/// Three values, one per dimension.
fn three<T: Copy + Default>(
    v: &Value,
    key: &str,
    each: impl Fn(&Value) -> Option<T>,
) -> Result<[T; 3], LineError> {
    let what = if key.ends_with("weights") {
        "finite numbers"
    } else {
        "integers in 0..=16"
    };
    let bad = || LineError::schema(format!("\"{key}\" must be 3 {what} (Cog, Aff, Pro)"));
    let arr = v.as_array().filter(|a| a.len() == 3).ok_or_else(bad)?;
    let mut out = [T::default(); 3];
    for (slot, x) in out.iter_mut().zip(arr) {
        *slot = each(x).ok_or_else(bad)?;
    }
    Ok(out)
}

/// The pair of the line, scored under the line's rubric `v` when it was validated here.
fn pair(
    opts: &Options,
    m: &Map<String, Value>,
    v: Option<&Validation<'_>>,
) -> Result<Option<PairObs>, LineError> {
    let has = |k: &str| m.contains_key(k);
    let scores = has("chosen_scores") || has("rejected_scores");
    let rewards = has("chosen_reward") || has("rejected_reward");
    match (scores, rewards) {
        (false, false) => Ok(None),
        (true, true) => Err(LineError::schema(
            "give a pair either as scores (\"chosen_scores\", \"rejected_scores\") or as \
             rewards (\"chosen_reward\", \"rejected_reward\"), not both",
        )),
        (true, false) => scored_pair(opts, m, v).map(Some),
        (false, true) => reward_pair(m).map(Some),
    }
}

/// A value of the parsed record as JSON text, for the readers of `crate::input` (which read
/// typed values from a line's text; the numbers print back exactly).
fn raw(v: &Value) -> Result<Box<serde_json::value::RawValue>, LineError> {
    serde_json::value::to_raw_value(v).map_err(|e| LineError::new("internal_error", e.to_string()))
}

fn need<'v>(m: &'v Map<String, Value>, key: &str, other: &str) -> Result<&'v Value, LineError> {
    m.get(key)
        .ok_or_else(|| LineError::schema(format!("\"{other}\" needs \"{key}\" (missing key)")))
}

/// A pair given as judge scores under the line's rubric, scored here with `care-core`.
fn scored_pair(
    opts: &Options,
    m: &Map<String, Value>,
    v: Option<&Validation<'_>>,
) -> Result<PairObs, LineError> {
    let chosen_m = score_matrix(
        &raw(need(m, "chosen_scores", "rejected_scores")?)?,
        "chosen_scores",
    )?;
    let rejected_m = score_matrix(
        &raw(need(m, "rejected_scores", "chosen_scores")?)?,
        "rejected_scores",
    )?;
    let unscored = PairObs {
        outcome: Outcome::Unscored,
        r_pref: None,
    };
    let v = match (v, m.get("rubric")) {
        (Some(v), _) => v,
        (None, Some(Value::Null)) => return Ok(unscored),
        (None, _) => {
            return Err(LineError::schema(
                "a pair given as scores needs the rubric they were given under (\"rubric\")",
            ));
        }
    };
    let Some(r) = v.rubric.as_ref() else {
        return Ok(unscored);
    };
    let chosen = flatten_scores(r, chosen_m, "chosen_scores")?;
    let rejected = flatten_scores(r, rejected_m, "rejected_scores")?;
    let outcome = pair_outcome(r, &chosen, &rejected, &opts.score)?;
    let p = preference_reward(r, &chosen, &rejected, &opts.score, &opts.pref)
        .map_err(|e| explain_score_error(e, r, &chosen, "chosen_scores"))?;
    Ok(PairObs {
        outcome,
        r_pref: Some(p.reward),
    })
}

/// The pair's outcome by the core's exact rule (see [`crate::cmd::rubric::pair_outcome`]).
fn pair_outcome(
    r: &care_core::Rubric<'_>,
    chosen: &[f64],
    rejected: &[f64],
    opts: &ScoreOptions,
) -> Result<Outcome, LineError> {
    Ok(
        match crate::cmd::rubric::pair_outcome(r, chosen, rejected, opts)? {
            PreferenceOutcome::Win => Outcome::Win,
            PreferenceOutcome::Tie => Outcome::Tie,
            PreferenceOutcome::Loss => Outcome::Loss,
        },
    )
}

/// A pair given as rewards already computed (for example by the reward loop): compared exactly.
fn reward_pair(m: &Map<String, Value>) -> Result<PairObs, LineError> {
    let num = |key: &str, other: &str| -> Result<f64, LineError> {
        need(m, key, other)?
            .as_f64()
            .filter(|x| x.is_finite())
            .ok_or_else(|| LineError::schema(format!("\"{key}\" must be a finite number")))
    };
    let c = num("chosen_reward", "rejected_reward")?;
    let j = num("rejected_reward", "chosen_reward")?;
    let r_pref = match m.get("r_pref") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_f64()
                .filter(|x| (-1.0..=1.0).contains(x))
                .ok_or_else(|| LineError::schema("\"r_pref\" must be a number in [-1, 1]"))?,
        ),
    };
    let outcome = if c > j {
        Outcome::Win
    } else if c < j {
        Outcome::Loss
    } else {
        Outcome::Tie
    };
    Ok(PairObs { outcome, r_pref })
}

/// The tactic set: distinct label ids of `set` (aliases and repeats count once), the count of
/// unknown labels left out, and the first few of their names.
fn tactics(
    v: &Value,
    set: &LabelSet,
    policy: UnknownLabelPolicy,
) -> Result<(Vec<u8>, u32, Vec<String>), LineError> {
    let v = raw(v)?;
    let labels = str_array(&v, "tactics")?;
    let mut seen: u32 = 0;
    let mut unknown = 0;
    let mut names = Vec::new();
    for label in labels {
        match set.lookup(&label) {
            Some(id) => seen |= 1 << (id & 31),
            None => match policy {
                UnknownLabelPolicy::Error => {
                    return Err(LineError::new(
                        care_core::Error::UnknownLabel.code(),
                        format!(
                            "tactics: unknown strategy label {label:?} (labels of the {} set: \
                             --labels picks the set, --unknown-label ignore skips it)",
                            set.name
                        ),
                    ));
                }
                UnknownLabelPolicy::Ignore => {
                    unknown += 1;
                    if names.len() < UNKNOWN_NAMES_PER_LINE {
                        names.push(label.trim().chars().take(UNKNOWN_NAME_CHARS).collect());
                    }
                }
            },
        }
    }
    let ids = (0..LABEL_IDS as u8)
        .filter(|i| seen & (1 << i) != 0)
        .collect();
    Ok((ids, unknown, names))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The case rounding used to split: weights (0.35, 0.3, 0.35), 4/2/4 criteria, Cognitive
    /// and Proactive means moving by -1/20 and +1/20: exactly a tie, also with uniform weights.
    #[test]
    fn an_exact_tie_is_a_tie() {
        let crit = |n: usize, d: usize| {
            (0..n)
                .map(|i| format!("{{\"title\":\"t{d}{i}\",\"description\":\"[0] a [1] b [2] c [3] d [4] e [5] f\"}}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        let names = [
            "Cognitive Empathy",
            "Affective Empathy",
            "Proactive Empathy",
        ];
        let (w, n) = (["0.35", "0.3", "0.35"], [4, 2, 4]);
        let cats: Vec<String> = (0..3)
            .map(|d| {
                format!(
                    "{{\"category\":\"{}\",\"weight_rationale\":\"r\",\"category_weight\":{},\"criteria\":[{}]}}",
                    names[d],
                    w[d],
                    crit(n[d], d)
                )
            })
            .collect();
        let line = format!(
            "{{\"rubric\":{{\"categories\":[{}]}},\"chosen_scores\":[[2,1,2,2],[2,2],[2,3,2,2]],\"rejected_scores\":[[3,1,2,2],[2,2],[2,3,1,2]]}}",
            cats.join(",")
        );
        let pair = read_str(&line).unwrap().pair.unwrap();
        assert_eq!(pair.outcome, Outcome::Tie);
        let uniform = Options {
            score: ScoreOptions {
                uniform_weights: true,
                ..ScoreOptions::default()
            },
            ..Options::default()
        };
        let v = crate::json::parse_strict(&line).unwrap();
        assert_eq!(
            read(&uniform, &line, &v).unwrap().pair.unwrap().outcome,
            Outcome::Tie
        );
    }

    #[test]
    fn emotions_vocabulary() {
        let e = Emotions::default();
        assert_eq!(e.lookup(" Sadness "), Some(3));
        assert_eq!(e.lookup("happiness"), Some(0));
        assert_eq!(e.lookup("boredom"), None);
        let custom = Emotions::parse_list("calm, Joy ,neutral").unwrap();
        assert_eq!(custom.names(), ["calm", "Joy", "neutral"]);
        assert_eq!(custom.lookup("happiness"), Some(1));
        let own = Emotions::parse_list("joy,happiness").unwrap();
        assert_eq!(
            own.lookup("happiness"),
            Some(1),
            "a listed label is its own"
        );
        assert_eq!(
            Emotions::parse_list("calm").unwrap().lookup("happiness"),
            None
        );
        assert_eq!(e.names().len(), 6);
        assert!(Emotions::parse_list("joy,,fear").is_err());
        assert!(Emotions::parse_list("joy,JOY").is_err());
        let many = (0..33)
            .map(|i| format!("e{i}"))
            .collect::<Vec<_>>()
            .join(",");
        assert!(Emotions::parse_list(&many).is_err());
    }

    fn read_str(line: &str) -> Result<Record, LineError> {
        let v = crate::json::parse_strict(line)?;
        read(&Options::default(), line, &v)
    }

    #[test]
    fn grouping_fields() {
        let r = read_str(r#"{"model":"m1","turn":0,"emotion":null,"tactics":[]}"#).unwrap();
        assert_eq!(
            (r.variant.as_deref(), r.turn, r.emotion),
            (Some("m1"), Some(0), None)
        );
        assert_eq!(r.tactics, Some(vec![]));
        let same = read_str(r#"{"model":"m1","variant":"m1","tactics":[]}"#).unwrap();
        assert_eq!(same.variant.as_deref(), Some("m1"));
        assert_eq!(
            read_str(r#"{"model":"a","variant":"b","tactics":[]}"#)
                .unwrap_err()
                .code,
            "schema"
        );
        assert_eq!(
            read_str(r#"{"turn":1001,"tactics":[]}"#).unwrap_err().code,
            "turn_out_of_range"
        );
        assert_eq!(
            read_str(r#"{"turn":2.5,"tactics":[]}"#).unwrap_err().code,
            "turn_out_of_range"
        );
        assert_eq!(
            read_str(r#"{"emotion":"","tactics":[]}"#).unwrap_err().code,
            "empty_group"
        );
        assert_eq!(read_str(r#"[1]"#).unwrap_err().code, "schema");
    }

    #[test]
    fn rubric_sources() {
        let fixture = include_str!("../../data/rubric_sft_1.json");
        let v = serde_json::to_string(fixture).unwrap();
        let text = read_str(&format!("{{\"text\":{v}}}"))
            .unwrap()
            .rubric
            .unwrap();
        let obj = read_str(&format!("{{\"rubric\":{}}}", fixture.trim()))
            .unwrap()
            .rubric
            .unwrap();
        assert_eq!(text, obj, "a rubric as text and as an object read the same");
        assert!(text.valid && text.status == RubricStatus::Parsed && text.codes.is_empty());
        let null = read_str(r#"{"rubric":null}"#).unwrap().rubric.unwrap();
        assert_eq!(null.status, RubricStatus::Missing);
        let bad = read_str(r#"{"text":"```json\n{}\n```"}"#)
            .unwrap()
            .rubric
            .unwrap();
        assert!(!bad.valid && !bad.codes.is_empty());
        assert_eq!(
            read_str(r#"{"text":"x","rubric":"y"}"#).unwrap_err().code,
            "schema"
        );
        let nested = read_str(
            r#"{"validation":{"format_reward":0,"violations":[{"code":"weight_sum"},"weight_sum"],"weights":[0.5,0.5,0.5],"criteria":[2,2,2]}}"#,
        )
        .unwrap()
        .rubric
        .unwrap();
        let ws = ViolationCode::WeightSum.number();
        assert_eq!(nested.codes, vec![(ws, 2)]);
        assert_eq!(nested.status, RubricStatus::Parsed);
        let half = read_str(r#"{"format_reward":0,"weights":[0.5,0.5,0]}"#).unwrap_err();
        assert!(half.message.contains("both"), "{}", half.message);
        let many = read_str(r#"{"format_reward":0,"weights":[1,0,0],"criteria":[17,2,2]}"#);
        assert_eq!(many.unwrap_err().code, "schema");
    }

    #[test]
    fn tactic_sets() {
        let r = read_str(r#"{"tactics":["advice","Advice","[Question]","Questions"]}"#).unwrap();
        let set = LabelSet::care();
        let (q, a) = (
            set.lookup("Question").unwrap(),
            set.lookup("advice").unwrap(),
        );
        assert_eq!(r.tactics, Some(vec![q, a]));
        let opts = Options {
            labels: UnknownLabelPolicy::Ignore,
            ..Options::default()
        };
        let line = r#"{"tactics":["hug","advice","pat"]}"#;
        let v = crate::json::parse_strict(line).unwrap();
        let r = read(&opts, line, &v).unwrap();
        assert_eq!((r.tactics, r.unknown_tactics), (Some(vec![a]), 2));
        assert_eq!(r.unknown_names, ["hug", "pat"]);
        let e = Options {
            label_set: LabelSet::appendix_e(),
            ..Options::default()
        };
        let line = r#"{"tactics":["appraisal","other"]}"#;
        let v = crate::json::parse_strict(line).unwrap();
        let r = read(&e, line, &v).unwrap();
        assert_eq!(r.tactics, Some(vec![2, 9]));
        assert_eq!(
            read_str(r#"{"tactics":"advice"}"#).unwrap_err().code,
            "schema"
        );
    }

    #[test]
    fn reward_pairs_compare_exactly() {
        let p = |line: &str| read_str(line).unwrap().pair.unwrap();
        assert_eq!(
            p(r#"{"chosen_reward":0.3,"rejected_reward":0.1}"#).outcome,
            Outcome::Win
        );
        assert_eq!(
            p(r#"{"chosen_reward":0.3,"rejected_reward":0.3}"#).outcome,
            Outcome::Tie
        );
        let l = p(r#"{"chosen_reward":0,"rejected_reward":1,"r_pref":-0.5}"#);
        assert_eq!((l.outcome, l.r_pref), (Outcome::Loss, Some(-0.5)));
        assert_eq!(
            read_str(r#"{"chosen_reward":0.3}"#).unwrap_err().code,
            "schema"
        );
        assert_eq!(
            read_str(r#"{"chosen_reward":0.3,"rejected_reward":0.1,"r_pref":2}"#)
                .unwrap_err()
                .code,
            "schema"
        );
        assert_eq!(
            read_str(r#"{"chosen_reward":1,"rejected_reward":0,"chosen_scores":[[],[],[]]}"#)
                .unwrap_err()
                .code,
            "schema"
        );
        // Scores need a rubric; a null rubric leaves the pair unscored.
        let s = r#""chosen_scores":[[1],[1],[1]],"rejected_scores":[[1],[1],[1]]"#;
        assert_eq!(read_str(&format!("{{{s}}}")).unwrap_err().code, "schema");
        let u = read_str(&format!("{{\"rubric\":null,{s}}}"))
            .unwrap()
            .pair
            .unwrap();
        assert_eq!((u.outcome, u.r_pref), (Outcome::Unscored, None));
        let u = read_str(&format!("{{\"rubric\":\"no rubric\",{s}}}"))
            .unwrap()
            .pair
            .unwrap();
        assert_eq!(u.outcome, Outcome::Unscored);
    }
}
