//! The reward core (SPEC §3-8) for Python: rubric validation, the policy, preference and
//! generator rewards, alignment, strategy counts and judge I/O. Results are the dataclasses of
//! `care_rl._types`, built here by keyword, so each field is named once in Python and filled
//! from the core's own struct.

use care_core::reward::{Fired, PolicyReward};
use care_core::{
    Dimension, FormatPolicy, GeneratorOptions, MissingPolicy, PreferenceOptions, RangePolicy,
    RubricBuf, ScoreOptions, ScoreScale, UnknownLabelPolicy, Validation, Violation,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyString};

use crate::dlpack::{Tensor, check_outputs};
use crate::error::{OrRaise, core_err_lines, invalid, mismatch};
use crate::names::parse;

/// A parsed rubric that passed the format contract (SPEC §1, §3), owned by Python.
///
/// `Rubric(text, policy=None)` parses and validates `text` (str or bytes) and raises
/// `CareError` (code `format_violation`, with `e.violations`) unless it passes. Scoring
/// functions take a `Rubric` (parsed once) or the rubric text.
#[pyclass(frozen, module = "care_rl")]
#[derive(Debug)]
pub struct Rubric {
    buf: RubricBuf,
}

#[pymethods]
impl Rubric {
    #[new]
    #[pyo3(signature = (text, policy=None))]
    fn py_new(
        py: Python<'_>,
        text: &Bound<'_, PyAny>,
        policy: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let policy = format_policy(policy)?;
        let bytes = text_bytes(text, "text")?;
        strict_rubric(py, &bytes, &policy)
    }

    /// The stored `category_weight`s `(w_cog, w_aff, w_pro)`, as parsed (canonical order).
    #[getter]
    fn weights(&self) -> (f64, f64, f64) {
        let w = self.buf.rubric().weights();
        (w[0], w[1], w[2])
    }

    /// The weights scoring uses: on the simplex (L1-normalized when off it; SPEC §4).
    #[getter]
    fn scoring_weights(&self) -> (f64, f64, f64) {
        let w = self.buf.rubric().scoring_weights();
        (w[0], w[1], w[2])
    }

    /// Criteria per dimension `(n_cog, n_aff, n_pro)`.
    #[getter]
    fn counts(&self) -> (usize, usize, usize) {
        let c = self.buf.rubric().counts();
        (c[0], c[1], c[2])
    }

    /// `K`, the number of criteria: the length of one response's score vector.
    #[getter]
    fn total_criteria(&self) -> usize {
        self.buf.rubric().total_criteria()
    }

    /// Every criterion in the flat score order: `(dimension, title, description)`.
    #[getter]
    fn criteria(&self) -> Vec<(&'static str, String, String)> {
        self.buf
            .rubric()
            .iter_flat()
            .map(|(d, c)| {
                (
                    d.json_name(),
                    c.title.to_string(),
                    c.description.to_string(),
                )
            })
            .collect()
    }

    /// The three `weight_rationale` texts (canonical order).
    #[getter]
    fn rationales(&self) -> (String, String, String) {
        let r = self.buf.rubric();
        let t = |d: Dimension| r.category(d).rationale.to_string();
        (
            t(Dimension::Cognitive),
            t(Dimension::Affective),
            t(Dimension::Proactive),
        )
    }

    fn __repr__(&self) -> String {
        let (w, c) = (self.weights(), self.counts());
        format!(
            "Rubric(weights=({}, {}, {}), counts=({}, {}, {}))",
            w.0, w.1, w.2, c.0, c.1, c.2
        )
    }
}

/// `str` (UTF-8) or `bytes` as bytes.
pub fn text_bytes(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<u8>> {
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(s.to_cow()?.as_bytes().to_vec());
    }
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    Err(invalid(format!(
        "{name}: expected str or bytes, got {}",
        obj.get_type().name()?
    )))
}

fn strict_rubric(py: Python<'_>, text: &[u8], policy: &FormatPolicy) -> PyResult<Rubric> {
    let mut scratch = vec![0u8; text.len()];
    let v = care_core::validate(text, policy, &mut scratch).or_raise("validate")?;
    match &v.rubric {
        Some(r) if v.report.is_ok() => Ok(Rubric {
            buf: RubricBuf::from(r),
        }),
        _ => {
            // The summary first, then one indented line per violation (the validator's retry
            // messages), with no trailing newline.
            let mut lines = Vec::with_capacity(v.report.violations().len() + 1);
            for x in v.report.violations() {
                let mut line = String::new();
                // Writing into a String cannot fail.
                let _ = x.write_message(&mut line);
                lines.push(line);
            }
            if v.report.overflowed() {
                lines.push("(more violations were found than reported)".to_owned());
            }
            let err = core_err_lines(care_core::Error::FormatViolation, &lines);
            err.value(py).setattr("violations", violations(py, &v)?)?;
            Err(err)
        }
    }
}

/// Runs `f` on the rubric of `obj`: a `Rubric`, or text parsed under the paper's policy.
fn with_rubric<R>(
    obj: &Bound<'_, PyAny>,
    f: impl FnOnce(&care_core::Rubric<'_>) -> PyResult<R>,
) -> PyResult<R> {
    if let Ok(r) = obj.cast::<Rubric>() {
        return f(&r.get().buf.rubric());
    }
    let text = text_bytes(obj, "rubric").map_err(|_| {
        invalid("rubric: expected a care_rl.Rubric, or the rubric text (str or bytes)".into())
    })?;
    let r = strict_rubric(obj.py(), &text, &FormatPolicy::PAPER)?;
    f(&r.buf.rubric())
}

/// Runs `f` on the rubric of `obj` when one is given (`None` and Python `None`: no rubric).
pub fn with_opt_rubric<R>(
    obj: Option<&Bound<'_, PyAny>>,
    f: impl FnOnce(Option<&care_core::Rubric<'_>>) -> PyResult<R>,
) -> PyResult<R> {
    match obj.filter(|o| !o.is_none()) {
        Some(o) => with_rubric(o, |r| f(Some(r))),
        None => f(None),
    }
}

/// The dataclasses of `care_rl._types`, looked up once.
fn types(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static MODULE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    Ok(MODULE
        .get_or_try_init(py, || {
            Ok::<_, PyErr>(py.import("care_rl._types")?.into_any().unbind())
        })?
        .bind(py))
}

/// `care_rl._types.<class>(**kwargs)`.
pub fn make<'py>(
    py: Python<'py>,
    class: &str,
    kwargs: &Bound<'py, PyDict>,
) -> PyResult<Bound<'py, PyAny>> {
    types(py)?.getattr(class)?.call((), Some(kwargs))
}

macro_rules! dc {
    ($py:expr, $class:literal, { $($k:literal => $v:expr),* $(,)? }) => {{
        let kw = PyDict::new($py);
        $(kw.set_item($k, $v)?;)*
        make($py, $class, &kw)
    }};
}

/// `FormatPolicy` from `None` (the paper's), `"paper"`, `"lenient"`, or a dict of field
/// overrides on the paper's policy.
pub fn format_policy(obj: Option<&Bound<'_, PyAny>>) -> PyResult<FormatPolicy> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(FormatPolicy::PAPER);
    };
    if let Ok(name) = obj.extract::<String>() {
        return match name.as_str() {
            "paper" => Ok(FormatPolicy::PAPER),
            "lenient" => Ok(FormatPolicy::lenient()),
            _ => Err(invalid(format!(
                "policy={name:?}: expected \"paper\", \"lenient\" or a dict of FormatPolicy fields"
            ))),
        };
    }
    let kw = obj.cast::<PyDict>().map_err(|_| {
        invalid(
            "policy: expected None, \"paper\", \"lenient\" or a dict of FormatPolicy fields".into(),
        )
    })?;
    let mut p = FormatPolicy::PAPER;
    for (k, v) in kw.iter() {
        let key: String = k.extract()?;
        let flag = |v: &Bound<'_, PyAny>| -> PyResult<bool> {
            v.extract::<bool>()
                .map_err(|_| invalid(format!("policy[{key:?}]: expected a bool")))
        };
        let count = |v: &Bound<'_, PyAny>| -> PyResult<u8> {
            v.extract::<u8>()
                .map_err(|_| invalid(format!("policy[{key:?}]: expected an integer in 0..=255")))
        };
        match key.as_str() {
            "allow_think" => p.allow_think = flag(&v)?,
            "allow_code_fence" => p.allow_code_fence = flag(&v)?,
            "allow_envelope" => p.allow_envelope = flag(&v)?,
            "require_order" => p.require_order = flag(&v)?,
            "require_key_order" => p.require_key_order = flag(&v)?,
            "meta_words" => p.meta_words = flag(&v)?,
            "min_criteria" => p.min_criteria = count(&v)?,
            "max_criteria" => p.max_criteria = count(&v)?,
            "weight_tolerance" => {
                p.weight_tolerance = v
                    .extract::<f64>()
                    .map_err(|_| invalid(format!("policy[{key:?}]: expected a number")))?
            }
            _ => {
                return Err(invalid(format!(
                    "policy: unknown FormatPolicy field {key:?} (expected allow_think, \
                     allow_code_fence, allow_envelope, weight_tolerance, require_order, \
                     require_key_order, min_criteria, max_criteria, meta_words)"
                )));
            }
        }
    }
    if !(p.weight_tolerance.is_finite() && p.weight_tolerance >= 0.0) {
        return Err(invalid(
            "policy: weight_tolerance must be finite and >= 0".into(),
        ));
    }
    if p.min_criteria > p.max_criteria {
        return Err(invalid(
            "policy: min_criteria must be <= max_criteria".into(),
        ));
    }
    Ok(p)
}

fn violations<'py>(py: Python<'py>, v: &Validation<'_>) -> PyResult<Vec<Bound<'py, PyAny>>> {
    v.report
        .violations()
        .iter()
        .map(|x| violation(py, x))
        .collect()
}

fn violation<'py>(py: Python<'py>, v: &Violation) -> PyResult<Bound<'py, PyAny>> {
    dc!(py, "Violation", {
        "code" => v.code.as_str(),
        "number" => v.code.number(),
        "category" => v.category,
        "dimension" => v.dimension.map(Dimension::json_name),
        "criterion" => v.criterion,
        "offset" => v.offset,
        "message" => v.to_string(),
    })
}

/// `_care.validate(text, policy) -> Validation`.
#[pyfunction]
#[pyo3(signature = (text, policy=None))]
pub fn validate<'py>(
    py: Python<'py>,
    text: &Bound<'py, PyAny>,
    policy: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let policy = format_policy(policy)?;
    let bytes = text_bytes(text, "text")?;
    let mut scratch = vec![0u8; bytes.len()];
    let v = care_core::validate(&bytes, &policy, &mut scratch).or_raise("validate")?;
    let rubric = v.rubric.as_ref().map(|r| Rubric {
        buf: RubricBuf::from(r),
    });
    dc!(py, "Validation", {
        "valid" => v.is_valid(),
        "format_reward" => v.r_fmt(),
        "violations" => violations(py, &v)?,
        "overflowed" => v.report.overflowed(),
        "feedback" => v.report.to_string(),
        "rubric" => rubric.map(|r| Py::new(py, r)).transpose()?,
    })
}

/// `_care.format_reward(text, policy) -> float`.
#[pyfunction]
#[pyo3(signature = (text, policy=None))]
pub fn format_reward(text: &Bound<'_, PyAny>, policy: Option<&Bound<'_, PyAny>>) -> PyResult<f64> {
    let policy = format_policy(policy)?;
    let bytes = text_bytes(text, "text")?;
    let mut scratch = vec![0u8; bytes.len()];
    care_core::format_reward(&bytes, &policy, &mut scratch).or_raise("format_reward")
}

pub fn score_options(
    missing: Option<&str>,
    out_of_range: Option<&str>,
    uniform_weights: Option<bool>,
) -> PyResult<ScoreOptions> {
    let mut o = ScoreOptions::default();
    if let Some(m) = missing {
        o.missing = parse::<MissingPolicy>("missing", m)?;
    }
    if let Some(r) = out_of_range {
        o.out_of_range = parse::<RangePolicy>("out_of_range", r)?;
    }
    if let Some(u) = uniform_weights {
        o.uniform_weights = u;
    }
    Ok(o)
}

pub fn fired<'py>(py: Python<'py>, f: &Fired) -> PyResult<Bound<'py, PyAny>> {
    dc!(py, "Fired", {
        "missing_zeroed" => f.missing_zeroed,
        "missing_skipped" => f.missing_skipped,
        "clamped" => f.clamped,
        "weights_adjusted" => f.weights_adjusted,
        "uniform_weights" => f.uniform_weights,
    })
}

fn triple(x: [f64; 3]) -> (f64, f64, f64) {
    (x[0], x[1], x[2])
}

fn policy_result<'py>(py: Python<'py>, r: &PolicyReward) -> PyResult<Bound<'py, PyAny>> {
    dc!(py, "PolicyReward", {
        "reward" => r.reward,
        "dim_means" => triple(r.dim_means),
        "weights" => triple(r.weights),
        "fired" => fired(py, &r.fired)?,
    })
}

/// `_care.policy_reward(rubric, scores, missing, out_of_range, uniform_weights)`.
#[pyfunction]
#[pyo3(signature = (rubric, scores, missing=None, out_of_range=None, uniform_weights=None))]
pub fn policy_reward<'py>(
    py: Python<'py>,
    rubric: &Bound<'py, PyAny>,
    scores: &Bound<'py, PyAny>,
    missing: Option<&str>,
    out_of_range: Option<&str>,
    uniform_weights: Option<bool>,
) -> PyResult<Bound<'py, PyAny>> {
    let opts = score_options(missing, out_of_range, uniform_weights)?;
    let s = Tensor::take(scores, "scores")?;
    let r = with_rubric(rubric, |r| {
        care_core::policy_reward(r, s.slice::<f64>()?, &opts).or_raise("policy_reward")
    })?;
    policy_result(py, &r)
}

/// `_care.policy_reward_group(rubric, scores[M, K], out[M], ...) -> GroupReport`: one call
/// for a GRPO group; a response that breaks an `error` policy gets NaN in `out`.
#[pyfunction]
#[pyo3(signature = (rubric, scores, out, missing=None, out_of_range=None, uniform_weights=None))]
pub fn policy_reward_group<'py>(
    py: Python<'py>,
    rubric: &Bound<'py, PyAny>,
    scores: &Bound<'py, PyAny>,
    out: &Bound<'py, PyAny>,
    missing: Option<&str>,
    out_of_range: Option<&str>,
    uniform_weights: Option<bool>,
) -> PyResult<Bound<'py, PyAny>> {
    let opts = score_options(missing, out_of_range, uniform_weights)?;
    let s = Tensor::take(scores, "scores")?;
    let mut o = Tensor::take(out, "out")?;
    check_outputs(&[&o], &[Some(&s)])?;
    let rep = with_rubric(rubric, |r| {
        let k = r.total_criteria();
        let m = o.numel();
        if s.numel() != m * k {
            return Err(mismatch(format!(
                "scores: {} values for {m} responses of {k} criteria (expected [M, K] = [{m}, {k}])",
                s.numel()
            )));
        }
        let scores = s.slice::<f64>()?;
        let out = o.slice_mut::<f64>()?;
        py.detach(|| care_core::policy_reward_group(r, &opts, scores, out))
            .or_raise("policy_reward_group")
    })?;
    dc!(py, "GroupReport", {
        "scored" => rep.scored,
        "failed" => rep.failed,
        "first_error" => rep.first_error.map(|(i, e)| (i, e.code())),
        "fired" => fired(py, &rep.fired)?,
    })
}

fn pref_options(tau: Option<f64>, scale: Option<&str>) -> PyResult<PreferenceOptions> {
    let mut p = PreferenceOptions::default();
    if let Some(t) = tau {
        p.tau = t;
    }
    if let Some(s) = scale {
        p.scale = parse::<ScoreScale>("scale", s)?;
    }
    Ok(p)
}

/// `_care.preference_reward(rubric, chosen, rejected, tau, scale, ...) -> PreferenceReward`.
#[pyfunction]
#[pyo3(signature = (rubric, chosen, rejected, tau=None, scale=None, missing=None, out_of_range=None, uniform_weights=None))]
#[allow(clippy::too_many_arguments)] // one keyword argument per option, as Python sees them
pub fn preference_reward<'py>(
    py: Python<'py>,
    rubric: &Bound<'py, PyAny>,
    chosen: &Bound<'py, PyAny>,
    rejected: &Bound<'py, PyAny>,
    tau: Option<f64>,
    scale: Option<&str>,
    missing: Option<&str>,
    out_of_range: Option<&str>,
    uniform_weights: Option<bool>,
) -> PyResult<Bound<'py, PyAny>> {
    let opts = score_options(missing, out_of_range, uniform_weights)?;
    let pref = pref_options(tau, scale)?;
    let (c, r) = (
        Tensor::take(chosen, "chosen")?,
        Tensor::take(rejected, "rejected")?,
    );
    let out = with_rubric(rubric, |rb| {
        care_core::preference_reward(rb, c.slice::<f64>()?, r.slice::<f64>()?, &opts, &pref)
            .or_raise("preference_reward")
    })?;
    dc!(py, "PreferenceReward", {
        "reward" => out.reward,
        "dim_means" => triple(out.dim_means),
        "weights" => triple(out.weights),
        "fired" => fired(py, &out.fired)?,
    })
}

fn strategy_result<'py>(
    py: Python<'py>,
    c: &care_core::StrategyCounts,
) -> PyResult<Bound<'py, PyAny>> {
    dc!(py, "StrategyCounts", {
        "counts" => (c.counts[0], c.counts[1], c.counts[2]),
        "unknown" => c.unknown,
        "duplicates" => c.duplicates,
    })
}

fn alignment_result<'py>(py: Python<'py>, a: &care_core::Alignment) -> PyResult<Bound<'py, PyAny>> {
    dc!(py, "Alignment", {
        "reward" => a.reward,
        "top_violation" => a.top_violation,
        "zero_violations" => a.zero_violations,
    })
}

/// `_care.generator_reward(rubric_text, chosen, rejected, chosen_tactics, ...)`.
#[pyfunction]
#[pyo3(signature = (rubric_text, chosen, rejected, chosen_tactics, lambda_=None, gamma=None, tau=None, scale=None, missing=None, out_of_range=None, uniform_weights=None, unknown_label=None, policy=None))]
#[allow(clippy::too_many_arguments)] // one keyword argument per option, as Python sees them
pub fn generator_reward<'py>(
    py: Python<'py>,
    rubric_text: &Bound<'py, PyAny>,
    chosen: &Bound<'py, PyAny>,
    rejected: &Bound<'py, PyAny>,
    chosen_tactics: Vec<String>,
    lambda_: Option<f64>,
    gamma: Option<f64>,
    tau: Option<f64>,
    scale: Option<&str>,
    missing: Option<&str>,
    out_of_range: Option<&str>,
    uniform_weights: Option<bool>,
    unknown_label: Option<&str>,
    policy: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let mut o = GeneratorOptions::default();
    if let Some(l) = lambda_ {
        o.lambda = l;
    }
    if let Some(g) = gamma {
        o.gamma = g;
    }
    o.preference = pref_options(tau.or(Some(o.preference.tau)), scale)?;
    o.score = score_options(missing, out_of_range, uniform_weights)?;
    if let Some(u) = unknown_label {
        o.labels = parse::<UnknownLabelPolicy>("unknown_label", u)?;
    }
    o.format = format_policy(policy)?;
    let text = text_bytes(rubric_text, "rubric_text")?;
    let (c, r) = (
        Tensor::take(chosen, "chosen")?,
        Tensor::take(rejected, "rejected")?,
    );
    let mut scratch = vec![0u8; text.len()];
    let g = care_core::generator_reward(
        &text,
        &mut scratch,
        c.slice::<f64>()?,
        r.slice::<f64>()?,
        &chosen_tactics,
        &o,
    )
    .or_raise("generator_reward")?;
    dc!(py, "GeneratorReward", {
        "reward" => g.reward,
        "r_pref" => g.r_pref,
        "r_align" => g.r_align,
        "r_fmt" => g.r_fmt,
        "parsed" => g.parsed,
        "violations" => g.violations,
        "counts" => strategy_result(py, &g.counts)?,
        "alignment" => alignment_result(py, &g.alignment)?,
        "fired" => fired(py, &g.fired)?,
    })
}

/// `_care.alignment(weights, counts) -> Alignment`.
#[pyfunction]
pub fn alignment<'py>(
    py: Python<'py>,
    weights: [f64; 3],
    counts: [u32; 3],
) -> PyResult<Bound<'py, PyAny>> {
    alignment_result(py, &care_core::alignment(weights, counts))
}

/// `_care.strategy_counts(labels, unknown_label) -> StrategyCounts`.
#[pyfunction]
#[pyo3(signature = (labels, unknown_label=None))]
pub fn strategy_counts<'py>(
    py: Python<'py>,
    labels: Vec<String>,
    unknown_label: Option<&str>,
) -> PyResult<Bound<'py, PyAny>> {
    let policy = match unknown_label {
        Some(u) => parse::<UnknownLabelPolicy>("unknown_label", u)?,
        None => UnknownLabelPolicy::default(),
    };
    let c = care_core::strategy_counts(&labels, policy).or_raise("strategy_counts")?;
    strategy_result(py, &c)
}

/// `_care.render_judge_prompt(rubric, context, seeker_turn, response) -> str`.
#[pyfunction]
pub fn render_judge_prompt(
    rubric: &Bound<'_, PyAny>,
    context: Vec<String>,
    seeker_turn: &str,
    response: &str,
) -> PyResult<String> {
    with_rubric(rubric, |r| {
        let ctx: Vec<&str> = context.iter().map(String::as_str).collect();
        let mut s = String::new();
        care_core::render_judge_prompt(&mut s, r, &ctx, seeker_turn, response)
            .map_err(|_| invalid("render_judge_prompt: formatting failed".into()))?;
        Ok(s)
    })
}

/// `_care.parse_judge_output(text, rubric, out[K]) -> JudgeReport`.
#[pyfunction]
pub fn parse_judge_output<'py>(
    py: Python<'py>,
    text: &Bound<'py, PyAny>,
    rubric: &Bound<'py, PyAny>,
    out: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let bytes = text_bytes(text, "text")?;
    let mut o = Tensor::take(out, "out")?;
    let rep = with_rubric(rubric, |r| {
        care_core::parse_judge_output(&bytes, r, o.slice_mut::<f64>()?)
            .or_raise("parse_judge_output")
    })?;
    judge_report(py, &rep)
}

/// A `care_rl.JudgeReport` of the core's report.
pub fn judge_report<'py>(
    py: Python<'py>,
    rep: &care_core::JudgeReport,
) -> PyResult<Bound<'py, PyAny>> {
    dc!(py, "JudgeReport", {
        "matched" => rep.matched,
        "case_insensitive" => rep.case_insensitive,
        "missing" => rep.missing,
        "duplicates" => rep.duplicates,
        "unknown" => rep.unknown,
        "invalid_scores" => rep.invalid_scores,
        "out_of_range" => rep.out_of_range,
        "malformed_items" => rep.malformed_items,
        "clean" => rep.is_clean(),
    })
}
