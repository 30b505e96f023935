//! The rubric profile: everything the loop needs to know about a rubric format, behind one
//! trait ([`RubricProfile`]), so that another profile (Kardia-R1: fixed dimensions, a span
//! check before judging) plugs in without touching the loop.
//!
//! The loop itself ([`crate::engine`]) only moves text: it asks the profile for the messages
//! to send, hands it each answer, and follows its verdicts. [`CareProfile`] is the paper's
//! (section 3.4): a rubric generated per turn under the format contract, judged per response,
//! scored with Eq. 5 for the whole group at once (`care_core::policy_reward_group`).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use care_core::{
    Dimension, FormatPolicy, JudgePromptLayout, JudgeReport, Rubric, RubricBuf, ScoreOptions,
    parse_judge_output, policy_reward_group, render_judge_prompt_with, reward_from_real_scores,
    validate_str,
};
use serde::Serialize;
use serde_json::value::RawValue;

use crate::llm::ChatMessage;

/// The generator's system prompt of the paper (bundled with the CLI's data).
pub const GENERATOR_SYSTEM_PROMPT: &str =
    include_str!("../../cli/data/generator_system_prompt.txt");

/// A dialogue up to the seeker's latest turn, checked: at least one message, the last one
/// from the `user` (the seeker), roles `system`, `user`, `assistant` only.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Dialogue {
    messages: Vec<ChatMessage>,
}

impl Dialogue {
    /// Checks `messages`.
    ///
    /// # Errors
    /// A message saying which entry is wrong and what is expected.
    pub fn new(messages: Vec<ChatMessage>) -> Result<Dialogue, String> {
        for (i, m) in messages.iter().enumerate() {
            if !matches!(m.role.as_str(), "system" | "user" | "assistant") {
                return Err(format!(
                    "context[{i}].role is {:?}: use system, user or assistant",
                    m.role
                ));
            }
        }
        match messages.iter().rev().find(|m| m.role != "system") {
            Some(m) if m.role == "user" => Ok(Dialogue { messages }),
            Some(_) => Err(
                "the context must end with the seeker's turn (a user message): the rubric is for the reply to it"
                    .to_owned(),
            ),
            None => Err("the context has no user message".to_owned()),
        }
    }

    /// The messages as given.
    pub fn messages(&self) -> &[ChatMessage] {
        &self.messages
    }

    /// The dialogue as `seeker: ...` / `supporter: ...` lines (system messages left out: they
    /// instruct the policy, they are not part of the conversation), without the last turn.
    pub fn history_lines(&self) -> Vec<String> {
        let turns: Vec<&ChatMessage> = self
            .messages
            .iter()
            .filter(|m| m.role != "system")
            .collect();
        let n = turns.len().saturating_sub(1);
        turns.iter().take(n).map(|m| line(m)).collect()
    }

    /// The seeker's latest turn.
    pub fn seeker_turn(&self) -> &str {
        self.messages
            .iter()
            .rev()
            .find(|m| m.role == "user")
            .map_or("", |m| m.content.as_str())
    }

    /// Every turn as lines, the seeker's latest included (what the generator reads).
    pub fn transcript(&self) -> String {
        let mut s = String::new();
        for m in self.messages.iter().filter(|m| m.role != "system") {
            s.push_str(&line(m));
            s.push('\n');
        }
        s
    }
}

fn line(m: &ChatMessage) -> String {
    let who = if m.role == "user" {
        "seeker"
    } else {
        "supporter"
    };
    format!("{who}: {}", m.content.trim())
}

/// One violation of the rubric format, as the output lines carry it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ViolationOut {
    /// The stable code (`weight_sum`, ...).
    pub code: String,
    /// The one-line message (the text the repair prompt quotes).
    pub message: String,
}

/// The profile's verdict on one generator answer.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RubricCheck {
    /// `r_fmt` of the answer (1 or 0).
    pub format_reward: f64,
    /// Every violation found (empty when valid).
    pub violations: Vec<ViolationOut>,
    /// The lines the repair prompt appends (empty when valid).
    #[serde(skip)]
    pub feedback: String,
}

impl RubricCheck {
    /// Whether the rubric may be used.
    pub fn is_valid(&self) -> bool {
        self.format_reward == 1.0 && self.violations.is_empty()
    }
}

/// What to do with a response before judging it.
#[derive(Clone, Debug, PartialEq)]
pub enum Prepared {
    /// Judge this text (the whole response, or the span the profile judges).
    Judge(String),
    /// Settled without a judge call: this reward, with this status (a profile rule, e.g. a
    /// malformed response rewarded 0; never a failure in disguise).
    Settled {
        /// The reward.
        reward: f64,
        /// The status the output line shows.
        status: &'static str,
    },
}

/// Why a judge answer cannot be used; the retry prompt quotes `message`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct JudgeProblem {
    /// Stable code: `no_judge_json`, `missing_score`, `score_out_of_range`.
    pub code: &'static str,
    /// What is wrong, naming the criteria.
    pub message: String,
}

/// A rubric format and how its judge is asked and read. Implementations must be pure
/// functions of their inputs: the cache keys hash the messages they build.
pub trait RubricProfile: Send + Sync + std::fmt::Debug {
    /// A short name (`care`, `kardia`).
    fn name(&self) -> &str;

    /// A rubric to use for every turn instead of generating one (`None`: generate).
    fn fixed_rubric(&self) -> Option<&str> {
        None
    }

    /// The generator's first request for `dialogue`.
    fn generator_messages(&self, dialogue: &Dialogue) -> Vec<ChatMessage>;

    /// Checks a generator answer.
    fn check_rubric(&self, text: &str) -> RubricCheck;

    /// The user message appended after an invalid answer (the repair request).
    fn repair_message(&self, check: &RubricCheck) -> String;

    /// The rubric for the output line (`text` passed [`RubricProfile::check_rubric`]): the JSON
    /// as written ([`RubricJson::verbatim`]).
    fn rubric_json(&self, text: &str) -> RubricJson {
        RubricJson::verbatim(text)
    }

    /// Criteria per dimension of a valid rubric (the layout of a response's scores).
    fn layout(&self, rubric: &str) -> Vec<usize>;

    /// Whether and what to judge of `response`.
    fn prepare_response(&self, response: &str) -> Prepared;

    /// Whether a turn's `gold` holds what the reward needs; a message saying what is missing
    /// refuses the turn before any judge call (every response `missing_gold`).
    ///
    /// # Errors
    /// What to add to `gold`.
    fn check_gold(&self, _gold: Option<&serde_json::Value>) -> Result<(), String> {
        Ok(())
    }

    /// The judge's first request.
    fn judge_messages(&self, rubric: &str, dialogue: &Dialogue, span: &str) -> Vec<ChatMessage>;

    /// Whether [`RubricProfile::judge_messages_ordered`] can reorder this profile's criteria
    /// (a panel with `shuffle_criteria` refuses a profile that cannot).
    fn can_reorder(&self) -> bool {
        false
    }

    /// The judge's first request with the criteria shown in `order`: `order[i]` is the flat
    /// index ([`RubricProfile::layout`] order) of the criterion shown `i`-th, each dimension's
    /// criteria together ([`crate::panel::criterion_order`]). A profile whose prompt lists its
    /// dimensions in a fixed order keeps it and follows `order` within each dimension. With
    /// `order` the identity it must equal [`RubricProfile::judge_messages`]. The answer is read by
    /// [`RubricProfile::parse_answer`] as always, which matches scores by title, so they land in
    /// rubric order whatever order the judge saw.
    ///
    /// # Errors
    /// The profile cannot reorder its criteria (the default), or `order` does not fit.
    fn judge_messages_ordered(
        &self,
        _rubric: &str,
        _dialogue: &Dialogue,
        _span: &str,
        _order: &[usize],
    ) -> Result<Vec<ChatMessage>, String> {
        Err(format!(
            "profile {} cannot reorder its criteria",
            self.name()
        ))
    }

    /// Reads a judge answer into raw scores, flat in [`RubricProfile::layout`] order.
    ///
    /// # Errors
    /// Why the answer cannot be scored (the loop asks again, a bounded number of times).
    fn parse_answer(&self, rubric: &str, answer: &str) -> Result<Vec<f64>, JudgeProblem>;

    /// The user message appended after an unusable judge answer.
    fn judge_retry_message(&self, problem: &JudgeProblem) -> String {
        format!(
            "Your answer could not be used: {}. Answer again with only the JSON object, one item per criterion.",
            problem.message
        )
    }

    /// Rewards of a group under one rubric: `responses[j]` is response `j` as given,
    /// `scores[j]` its flat scores, `None` when it has none (failed or settled); `gold` is the
    /// turn's gold metadata. `None` out: no reward (never a silent 0).
    fn score_group(
        &self,
        rubric: &str,
        responses: &[String],
        scores: &[Option<Vec<f64>>],
        gold: Option<&serde_json::Value>,
    ) -> Vec<Option<f64>>;

    /// The reward of one response from real-valued scores, flat in [`RubricProfile::layout`]
    /// order: a judge panel's per-criterion aggregate of its judges' scores, rewarded by the
    /// profile's own formula (the `care` profile: Eq. 5). `response` is the response as given,
    /// `gold` the turn's gold metadata, as in [`RubricProfile::score_group`].
    ///
    /// # Errors
    /// Why the scores give no reward (a score not finite or outside the profile's range, the
    /// wrong number of scores), or the profile cannot score real-valued scores (the default).
    fn score_real(
        &self,
        _rubric: &str,
        _response: &str,
        _scores: &[f64],
        _gold: Option<&serde_json::Value>,
    ) -> Result<f64, String> {
        Err(format!(
            "profile {} cannot reward real-valued scores",
            self.name()
        ))
    }
}

/// The paper's profile: the bundled generator prompt, the format contract (`r_fmt`), the judge
/// prompt renderer and lenient parser of `care-core`, Eq. 5 under strict score policies.
#[derive(Debug)]
pub struct CareProfile {
    policy: FormatPolicy,
    score: ScoreOptions,
    layout: JudgePromptLayout,
    /// Parsed rubrics by text: a turn's rubric is read by every judge prompt, every answer and
    /// the scoring of its group, and parsing it (a full validation) costs more than a look-up.
    parsed: Mutex<ParsedRubrics>,
}

impl Clone for CareProfile {
    fn clone(&self) -> Self {
        CareProfile {
            policy: self.policy,
            score: self.score,
            layout: self.layout,
            parsed: Mutex::new(ParsedRubrics::default()),
        }
    }
}

/// Most parsed rubrics [`CareProfile`] keeps (the turns in flight need a few; past the bound
/// the memo starts over).
const PARSED_RUBRICS: usize = 1024;

/// Parsed rubrics by a hash of their text's length and ends (cheap for a text of kilobytes;
/// texts that share it are told apart by comparing them whole).
#[derive(Debug, Default)]
struct ParsedRubrics {
    by_hash: HashMap<u64, Vec<(String, Arc<RubricBuf>)>>,
    len: usize,
}

impl ParsedRubrics {
    fn hash(text: &str) -> u64 {
        use std::hash::{Hash, Hasher};
        let b = text.as_bytes();
        let mut h = std::collections::hash_map::DefaultHasher::new();
        b.len().hash(&mut h);
        b[..b.len().min(128)].hash(&mut h);
        b[b.len().saturating_sub(128)..].hash(&mut h);
        h.finish()
    }

    fn get(&self, text: &str) -> Option<Arc<RubricBuf>> {
        self.by_hash
            .get(&Self::hash(text))?
            .iter()
            .find(|(t, _)| t == text)
            .map(|(_, r)| Arc::clone(r))
    }

    fn insert(&mut self, text: &str, r: Arc<RubricBuf>) {
        if self.len >= PARSED_RUBRICS {
            self.by_hash.clear();
            self.len = 0;
        }
        self.by_hash
            .entry(Self::hash(text))
            .or_default()
            .push((text.to_owned(), r));
        self.len += 1;
    }
}

impl CareProfile {
    /// The paper's format contract, or the lenient reading (think blocks, fences, envelope).
    pub fn new(lenient_rubric: bool) -> Self {
        CareProfile {
            policy: if lenient_rubric {
                FormatPolicy::lenient()
            } else {
                FormatPolicy::PAPER
            },
            // Strict: a missing or out-of-range score makes the answer unusable (it is asked
            // again), never a silent 0 or a clamp.
            score: ScoreOptions::default(),
            layout: JudgePromptLayout::default(),
            parsed: Mutex::new(ParsedRubrics::default()),
        }
    }

    /// The same profile with the judge prompt in `layout` (the default puts the rubric and the
    /// dialogue before the response: see [`JudgePromptLayout`]).
    #[must_use]
    pub fn with_layout(mut self, layout: JudgePromptLayout) -> Self {
        self.layout = layout;
        self
    }

    /// The rubric of a text that passed [`RubricProfile::check_rubric`] (owned: no borrow of a
    /// scratch buffer outlives the call), parsed once per text.
    fn rubric(&self, text: &str) -> Option<Arc<RubricBuf>> {
        let memo = self
            .parsed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(text);
        if let Some(r) = memo {
            return Some(r);
        }
        let mut scratch = vec![0u8; text.len()];
        // The policy is one of the two built-in ones, so validation cannot fail on it.
        let v = validate_str(text, &self.policy, &mut scratch).ok()?;
        let r = Arc::new(v.rubric.as_ref().map(RubricBuf::from)?);
        self.parsed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(text, Arc::clone(&r));
        Some(r)
    }
}

impl RubricProfile for CareProfile {
    fn name(&self) -> &str {
        "care"
    }

    fn generator_messages(&self, dialogue: &Dialogue) -> Vec<ChatMessage> {
        vec![
            ChatMessage::new("system", GENERATOR_SYSTEM_PROMPT.trim_end()),
            ChatMessage::new("user", dialogue.transcript()),
        ]
    }

    fn check_rubric(&self, text: &str) -> RubricCheck {
        let mut scratch = vec![0u8; text.len()];
        let v = match validate_str(text, &self.policy, &mut scratch) {
            Ok(v) => v,
            // Only an invalid policy fails here, and the two policies of this profile are the
            // core's own constants; report it rather than trust that.
            Err(e) => {
                return RubricCheck {
                    format_reward: 0.0,
                    violations: vec![ViolationOut {
                        code: e.code().to_owned(),
                        message: e.to_string(),
                    }],
                    feedback: String::new(),
                };
            }
        };
        let violations = v
            .report
            .violations()
            .iter()
            .map(|x| ViolationOut {
                code: x.code.as_str().to_owned(),
                message: x.to_string(),
            })
            .collect();
        let mut feedback = String::new();
        let _ = v.report.write_feedback(&mut feedback);
        if v.rubric.is_none() && feedback.is_empty() {
            feedback.push_str("the text holds no rubric with the three categories\n");
        }
        RubricCheck {
            format_reward: v.r_fmt(),
            violations,
            feedback,
        }
    }

    fn repair_message(&self, check: &RubricCheck) -> String {
        format!(
            "The rubric above breaks the required format. The validator reported:\n{}Output the corrected rubric: JSON only, no explanation.",
            check.feedback
        )
    }

    fn rubric_json(&self, text: &str) -> RubricJson {
        // The generator's object as it wrote it. Under the lenient policy the text may hold a
        // think block, a fence or the {"analysis", "rubric"} envelope: the rubric object inside,
        // as written; failing that, the parsed rubric in the contract's key order.
        match embedded_rubric(text) {
            Some(r) => r,
            None => match self.rubric(text) {
                Some(r) => rubric_to_json(&r),
                None => RubricJson::string(text),
            },
        }
    }

    fn layout(&self, rubric: &str) -> Vec<usize> {
        self.rubric(rubric)
            .map_or_else(Vec::new, |r| r.rubric().counts().to_vec())
    }

    fn prepare_response(&self, response: &str) -> Prepared {
        Prepared::Judge(response.to_owned())
    }

    fn judge_messages(&self, rubric: &str, dialogue: &Dialogue, span: &str) -> Vec<ChatMessage> {
        let mut prompt = String::new();
        if let Some(r) = self.rubric(rubric) {
            let lines = dialogue.history_lines();
            let context: Vec<&str> = lines.iter().map(String::as_str).collect();
            let _ = render_judge_prompt_with(
                &mut prompt,
                &r.rubric(),
                &context,
                dialogue.seeker_turn(),
                span,
                self.layout,
            );
        }
        vec![ChatMessage::new("user", prompt)]
    }

    fn can_reorder(&self) -> bool {
        true
    }

    fn judge_messages_ordered(
        &self,
        rubric: &str,
        dialogue: &Dialogue,
        span: &str,
        order: &[usize],
    ) -> Result<Vec<ChatMessage>, String> {
        let buf = self
            .rubric(rubric)
            .ok_or_else(|| "the rubric does not parse".to_owned())?;
        let r = buf.rubric();
        let flat: Vec<(Dimension, &care_core::Criterion<'_>)> = r.iter_flat().collect();
        if crate::panel::order_blocks(&r.counts(), order).is_none() {
            return Err(format!(
                "{order:?} is not an order of the rubric's {} criteria that keeps each dimension together",
                flat.len()
            ));
        }
        let mut shown = Rubric::new();
        for d in Dimension::ALL {
            let c = r.category(d);
            if c.present {
                shown.set_category(d, c.weight, c.rationale);
            }
        }
        // The prompt lists the three categories in their canonical order (the core's
        // renderer); the order moves the criteria within each.
        for &i in order {
            let (d, c) = flat
                .get(i)
                .ok_or_else(|| format!("criterion {i} is not in the rubric"))?;
            shown
                .push_criterion(*d, c.title, c.description)
                .map_err(|e| e.to_string())?;
        }
        // Rendered as `judge_messages` renders (a test holds the two equal at the identity).
        let mut prompt = String::new();
        let lines = dialogue.history_lines();
        let context: Vec<&str> = lines.iter().map(String::as_str).collect();
        let _ = render_judge_prompt_with(
            &mut prompt,
            &shown,
            &context,
            dialogue.seeker_turn(),
            span,
            self.layout,
        );
        Ok(vec![ChatMessage::new("user", prompt)])
    }

    fn parse_answer(&self, rubric: &str, answer: &str) -> Result<Vec<f64>, JudgeProblem> {
        let Some(buf) = self.rubric(rubric) else {
            return Err(JudgeProblem {
                code: "no_rubric",
                message: "the rubric does not parse".to_owned(),
            });
        };
        let r = buf.rubric();
        let mut scores = vec![f64::NAN; r.total_criteria()];
        let report = match parse_judge_output(answer.as_bytes(), &r, &mut scores) {
            Ok(rep) => rep,
            Err(e) => {
                return Err(JudgeProblem {
                    code: e.code(),
                    message: format!(
                        "{e}: return one JSON object {{\"criterion_scores\":[{{\"category\":..,\"criterion_title\":..,\"score\":..}}]}}"
                    ),
                });
            }
        };
        check_report(&r, &report, &scores)?;
        Ok(scores)
    }

    fn score_group(
        &self,
        rubric: &str,
        _responses: &[String],
        scores: &[Option<Vec<f64>>],
        _gold: Option<&serde_json::Value>,
    ) -> Vec<Option<f64>> {
        let Some(buf) = self.rubric(rubric) else {
            return vec![None; scores.len()];
        };
        let r = buf.rubric();
        let total = r.total_criteria();
        // Responses without scores take NaN rows: Eq. 5 under the `error` missing policy gives
        // them NaN, mapped to `None` below.
        let mut flat = Vec::with_capacity(scores.len() * total);
        for s in scores {
            match s {
                Some(v) if v.len() == total => flat.extend_from_slice(v),
                _ => flat.extend(std::iter::repeat_n(f64::NAN, total)),
            }
        }
        let mut out = vec![f64::NAN; scores.len()];
        if policy_reward_group(&r, &self.score, &flat, &mut out).is_err() {
            return vec![None; scores.len()];
        }
        out.into_iter()
            .zip(scores)
            .map(|(x, s)| (s.is_some() && x.is_finite()).then_some(x))
            .collect()
    }

    fn score_real(
        &self,
        rubric: &str,
        _response: &str,
        scores: &[f64],
        _gold: Option<&serde_json::Value>,
    ) -> Result<f64, String> {
        let buf = self
            .rubric(rubric)
            .ok_or_else(|| "the rubric does not validate".to_owned())?;
        reward_from_real_scores(&buf.rubric(), scores, &self.score)
            .map(|r| r.reward)
            .map_err(|e| format!("{}: {e}", e.code()))
    }
}

/// Whether a parsed answer can be scored under the strict policies; the problem names the
/// criteria so that the retry prompt can say what to fix.
fn check_report(
    r: &care_core::Rubric<'_>,
    report: &JudgeReport,
    scores: &[f64],
) -> Result<(), JudgeProblem> {
    if report.missing > 0 {
        let mut names = String::new();
        for ((d, c), s) in r.iter_flat().zip(scores) {
            if s.is_nan() {
                if !names.is_empty() {
                    names.push_str(", ");
                }
                let _ = write!(names, "{} / {}", d.json_name(), c.title.trim());
            }
        }
        return Err(JudgeProblem {
            code: "missing_score",
            message: format!("no usable score for {} criteria: {names}", report.missing),
        });
    }
    if report.out_of_range > 0 {
        return Err(JudgeProblem {
            code: "score_out_of_range",
            message: format!("{} scores are not integers in 0..5", report.out_of_range),
        });
    }
    Ok(())
}

/// The rubric in the contract's key order (`category`, `weight_rationale`, `category_weight`,
/// `criteria`; `title`, `description`), for a lenient answer whose object could not be cut out.
fn rubric_to_json(buf: &RubricBuf) -> RubricJson {
    #[derive(Serialize)]
    struct Criterion<'a> {
        title: &'a str,
        description: &'a str,
    }
    #[derive(Serialize)]
    struct Category<'a> {
        category: &'a str,
        weight_rationale: &'a str,
        category_weight: f64,
        criteria: Vec<Criterion<'a>>,
    }
    #[derive(Serialize)]
    struct Out<'a> {
        categories: Vec<Category<'a>>,
    }
    let r = buf.rubric();
    let categories = care_core::Dimension::ALL
        .into_iter()
        .filter(|d| r.category(*d).present)
        .map(|d| {
            let c = r.category(d);
            Category {
                category: d.json_name(),
                weight_rationale: c.rationale,
                category_weight: c.weight,
                criteria: c
                    .criteria()
                    .iter()
                    .map(|k| Criterion {
                        title: k.title,
                        description: k.description,
                    })
                    .collect(),
            }
        })
        .collect();
    serde_json::to_string(&Out { categories })
        .ok()
        .and_then(|t| RawValue::from_string(t).ok())
        .map_or_else(|| RubricJson::string(""), RubricJson)
}

/// A rubric as output lines carry it: JSON text, written into the line as it is.
///
/// One rule (docs/SPEC.md): a generator answer that is JSON is written as the generator wrote
/// it, members in its order, with only the whitespace between JSON tokens removed (so the line
/// stays one line); `care analyze` validates it as it validates the generator's own text. An
/// answer that is not JSON is written as a JSON string.
#[derive(Clone, Debug)]
pub struct RubricJson(Box<RawValue>);

impl RubricJson {
    /// `text` minified when it is one JSON value, else as a JSON string.
    pub fn verbatim(text: &str) -> RubricJson {
        minify(text)
            .and_then(|m| RawValue::from_string(m).ok())
            .map_or_else(|| RubricJson::string(text), RubricJson)
    }

    /// `text` as a JSON string.
    pub fn string(text: &str) -> RubricJson {
        let quoted = serde_json::to_string(text).unwrap_or_else(|_| "\"\"".to_owned());
        RubricJson(RawValue::from_string(quoted).unwrap_or_else(|_| empty_string()))
    }

    /// The JSON text.
    pub fn get(&self) -> &str {
        self.0.get()
    }

    /// As a [`serde_json::Value`] (object members in sorted order: for reading, not writing).
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::from_str(self.get()).unwrap_or(serde_json::Value::Null)
    }
}

fn empty_string() -> Box<RawValue> {
    // `""` is JSON; the fallback of a fallback, never reached.
    RawValue::from_string("\"\"".to_owned()).unwrap_or_else(|_| RawValue::NULL.to_owned())
}

impl PartialEq for RubricJson {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl Serialize for RubricJson {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

/// `text` without the whitespace between its JSON tokens, when it is one JSON value.
pub(crate) fn minify(text: &str) -> Option<String> {
    let raw: &RawValue = serde_json::from_str(text).ok()?;
    let mut out = String::with_capacity(raw.get().len());
    let (mut in_string, mut escaped) = (false, false);
    for c in raw.get().chars() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
            out.push(c);
        } else if !matches!(c, ' ' | '\t' | '\n' | '\r') {
            out.push(c);
        }
    }
    Some(out)
}

/// The rubric object of a lenient answer, as written: the whole answer when it is a rubric
/// object, the `rubric` member of an envelope, or the first such object after a think block or
/// inside a fence (at most 64 candidate braces are tried).
fn embedded_rubric(text: &str) -> Option<RubricJson> {
    fn pick(raw: &RawValue) -> Option<RubricJson> {
        let members: std::collections::HashMap<String, &RawValue> =
            serde_json::from_str(raw.get()).ok()?;
        if members.contains_key("categories") {
            return Some(RubricJson::verbatim(raw.get()));
        }
        let inner = members.get("rubric")?;
        let inner_members: std::collections::HashMap<String, &RawValue> =
            serde_json::from_str(inner.get()).ok()?;
        inner_members
            .contains_key("categories")
            .then(|| RubricJson::verbatim(inner.get()))
    }
    if let Ok(raw) = serde_json::from_str::<&RawValue>(text) {
        return pick(raw).or_else(|| Some(RubricJson::verbatim(text)));
    }
    let start = text.find("</think>").map_or(0, |i| i + "</think>".len());
    let body = text.get(start..)?;
    for (i, _) in body.match_indices('{').take(64) {
        let mut values =
            serde_json::Deserializer::from_str(body.get(i..)?).into_iter::<&RawValue>();
        if let Some(Ok(raw)) = values.next()
            && let Some(r) = pick(raw)
        {
            return Some(r);
        }
    }
    None
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    const RUBRIC: &str = include_str!("../../cli/data/rubric_sft_1.json");

    fn dialogue() -> Dialogue {
        Dialogue::new(vec![
            ChatMessage::new("system", "be kind"),
            ChatMessage::new("user", "I feel lost."),
            ChatMessage::new("assistant", "What happened?"),
            ChatMessage::new("user", "My friend left."),
        ])
        .unwrap()
    }

    #[test]
    fn dialogue_rules() {
        let d = dialogue();
        assert_eq!(
            d.history_lines(),
            ["seeker: I feel lost.", "supporter: What happened?"]
        );
        assert_eq!(d.seeker_turn(), "My friend left.");
        assert!(!d.transcript().contains("be kind"));
        assert!(Dialogue::new(vec![]).is_err());
        assert!(
            Dialogue::new(vec![ChatMessage::new("assistant", "hi")])
                .unwrap_err()
                .contains("seeker")
        );
        assert!(
            Dialogue::new(vec![ChatMessage::new("tool", "x")])
                .unwrap_err()
                .contains("context[0].role")
        );
    }

    #[test]
    fn check_and_repair_message_quote_the_validator() {
        let p = CareProfile::new(false);
        assert!(p.check_rubric(RUBRIC).is_valid());
        let broken = RUBRIC.replacen("\"category_weight\": 0.4", "\"category_weight\": 0.5", 1);
        let c = p.check_rubric(&broken);
        assert!(!c.is_valid());
        assert_eq!(c.violations[0].code, "weight_sum");
        assert!(p.repair_message(&c).contains("weight_sum"));
        let c = p.check_rubric("sure! here it is");
        assert_eq!(c.format_reward, 0.0);
        assert!(!c.feedback.is_empty());
        assert_eq!(p.layout(RUBRIC), vec![3, 2, 3]);
    }

    #[test]
    fn the_rubric_is_written_as_the_generator_wrote_it() {
        let strict = CareProfile::new(false);
        let out = strict.rubric_json(RUBRIC);
        // One line, the members in the generator's order, nothing else changed: the paper's
        // contract (key order included) still holds for the written text.
        assert!(!out.get().contains('\n'));
        let minified = minify(RUBRIC).unwrap();
        assert_eq!(out.get(), minified);
        assert!(strict.check_rubric(out.get()).is_valid(), "{}", out.get());
        assert!(out.get().find("\"weight_rationale\"") < out.get().find("\"category_weight\""));
        // Lenient answers: the rubric object inside, as written.
        let lenient = CareProfile::new(true);
        for wrapped in [
            format!("<think>weigh it</think>\n```json\n{RUBRIC}\n```"),
            format!("{{\"analysis\": \"a {{brace}}\", \"rubric\": {RUBRIC}}}"),
        ] {
            assert!(lenient.check_rubric(&wrapped).is_valid(), "{wrapped}");
            assert_eq!(lenient.rubric_json(&wrapped), out, "{wrapped}");
        }
        // Strings keep their whitespace; non-JSON text is a JSON string.
        assert_eq!(
            RubricJson::verbatim("{ \"a\" : \" x  y \" }").get(),
            "{\"a\":\" x  y \"}"
        );
        assert_eq!(RubricJson::verbatim("not json").get(), "\"not json\"");
        assert_eq!(
            serde_json::to_string(&RubricJson::verbatim("[1, 2]")).unwrap(),
            "[1,2]"
        );
    }

    #[test]
    fn parse_answer_names_missing_criteria_and_scores_the_group() {
        let p = CareProfile::new(false);
        let err = p.parse_answer(RUBRIC, "no json here").unwrap_err();
        assert_eq!(err.code, "no_judge_json");
        let one = r#"{"criterion_scores":[{"category":"Cognitive Empathy","criterion_title":"Accurately Understand the Core Dilemma","score":5}]}"#;
        let err = p.parse_answer(RUBRIC, one).unwrap_err();
        assert_eq!(err.code, "missing_score");
        assert!(
            err.message.contains("Validate the Feeling of Awkwardness"),
            "{}",
            err.message
        );
        let all5: Vec<f64> = vec![5.0; 8];
        let r = p.score_group(RUBRIC, &["a".into(), "b".into()], &[Some(all5), None], None);
        assert_eq!(r, vec![Some(1.0), None]);
        let msgs = p.judge_messages(RUBRIC, &dialogue(), "I hear you.");
        assert!(msgs[0].content.contains("I hear you."));
        assert!(msgs[0].content.contains("seeker: I feel lost."));
    }

    #[test]
    fn an_ordered_prompt_is_the_prompt_at_the_identity_and_moves_the_criteria_otherwise() {
        let p = CareProfile::new(false);
        let d = dialogue();
        let plain = p.judge_messages(RUBRIC, &d, "I hear you.");
        let id: Vec<usize> = (0..8).collect();
        assert_eq!(
            p.judge_messages_ordered(RUBRIC, &d, "I hear you.", &id)
                .unwrap(),
            plain
        );
        let moved = p
            .judge_messages_ordered(RUBRIC, &d, "I hear you.", &[2, 1, 0, 3, 4, 5, 6, 7])
            .unwrap();
        assert_ne!(moved, plain);
        let pos = |m: &[ChatMessage], t: &str| m[0].content.find(t).unwrap();
        let (first, third) = (
            "Accurately Understand the Core Dilemma",
            "Stay Grounded in the Seeker's Context",
        );
        assert!(pos(&plain, first) < pos(&plain, third));
        assert!(pos(&moved, first) > pos(&moved, third));
        assert!(p.judge_messages_ordered(RUBRIC, &d, "x", &[0, 1]).is_err());
        // The three sections keep their canonical order whatever the block order.
        let blocks_moved = p
            .judge_messages_ordered(RUBRIC, &d, "I hear you.", &[5, 6, 7, 3, 4, 0, 1, 2])
            .unwrap();
        assert_eq!(blocks_moved, plain);
    }
}
