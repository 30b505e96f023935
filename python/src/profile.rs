//! Rubric profiles (`docs/PROFILES.md`) for Python: the `Profile` class (a built-in by name, or
//! profile JSON with every violation reported), the output-format check, the reward of one
//! response and of a GRPO group (one call, no Python loop), and the profile's judge I/O.
//! Results are the dataclasses of `care_rl._types`, built by keyword.

use care_core::profile::{
    self, BUILTIN_NAMES, OutputCheck, Profile as CoreProfile, ProfileBuf, ProfileCode,
    ProfileReport, ProfileReward, ProfileViolation,
};
use care_core::{Error, ScoreOptions};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::dlpack::{Tensor, check_outputs};
use crate::error::{OrRaise, core_err, invalid, make_code, mismatch};
use crate::reward::{fired, make, score_options, text_bytes, with_opt_rubric};

/// The code and number of an invalid profile: the C ABI's `CARE_ERR_INVALID_PROFILE` (a test
/// checks the number against `include/care.h`). Profiles that are not one JSON value at all
/// raise the core's `not_json` / `trailing_text`, as in C.
const INVALID_PROFILE: (&str, u32) = ("invalid_profile", 250);

/// A parsed, valid rubric profile, owned by Python (immutable; shareable across threads).
///
/// `Profile(name_or_json)`: a built-in name (`"care"`, `"kardia"`) or profile JSON (str or
/// bytes). An invalid profile raises `CareError` (code `invalid_profile`, or `not_json` /
/// `trailing_text` for text that is not one JSON value) with every violation in
/// `e.violations`.
#[pyclass(frozen, module = "care_rl")]
#[derive(Debug)]
pub struct Profile {
    buf: ProfileBuf,
}

macro_rules! dc {
    ($py:expr, $class:literal, { $($k:literal => $v:expr),* $(,)? }) => {{
        let kw = PyDict::new($py);
        $(kw.set_item($k, $v)?;)*
        make($py, $class, &kw)
    }};
}

fn violation<'py>(py: Python<'py>, v: &ProfileViolation) -> PyResult<Bound<'py, PyAny>> {
    dc!(py, "ProfileViolation", {
        "code" => v.code.as_str(),
        "number" => v.code.number(),
        "path" => v.path.to_string(),
        "offset" => v.offset,
        "message" => v.to_string(),
    })
}

fn violations<'py>(py: Python<'py>, r: &ProfileReport) -> PyResult<Vec<Bound<'py, PyAny>>> {
    r.violations().iter().map(|v| violation(py, v)).collect()
}

fn invalid_profile(py: Python<'_>, report: &ProfileReport) -> PyResult<PyErr> {
    let what = format!("profile\n{report}");
    let err = match report.violations().first().map(|v| v.code) {
        Some(ProfileCode::NotJson) => core_err(&what, Error::NotJson),
        Some(ProfileCode::TrailingText) => core_err(&what, Error::TrailingText),
        _ => make_code(&what, INVALID_PROFILE.0, INVALID_PROFILE.1),
    };
    err.value(py)
        .setattr("violations", violations(py, report)?)?;
    Ok(err)
}

#[pymethods]
impl Profile {
    #[new]
    fn py_new(py: Python<'_>, name_or_json: &Bound<'_, PyAny>) -> PyResult<Self> {
        let bytes = text_bytes(name_or_json, "name_or_json")?;
        if let Some(name) = BUILTIN_NAMES
            .iter()
            .find(|n| n.as_bytes() == bytes.as_slice())
        {
            let buf = ProfileBuf::builtin(name).or_raise("profile")?;
            return Ok(Profile { buf });
        }
        match ProfileBuf::parse(&bytes) {
            Ok(buf) => Ok(Profile { buf }),
            Err(report) => {
                // A bare word that is no built-in reads better as that than as bad JSON.
                let word = !bytes.is_empty()
                    && bytes
                        .iter()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'));
                if word {
                    return Err(invalid(format!(
                        "profile {:?}: not a built-in profile ({}) and not profile JSON",
                        String::from_utf8_lossy(&bytes),
                        BUILTIN_NAMES.join(", ")
                    )));
                }
                Err(invalid_profile(py, &report)?)
            }
        }
    }

    /// The profile's name.
    #[getter]
    fn name(&self) -> String {
        self.buf.profile().name().to_string()
    }

    /// The profile's description (empty when it has none).
    #[getter]
    fn description(&self) -> String {
        self.buf.profile().description().to_string()
    }

    /// `"fixed"` (the profile holds the rubric) or `"generated"` (a rubric generated per
    /// prompt supplies weights and criteria: pass it as `rubric=` to every call).
    #[getter]
    fn rubric_source(&self) -> &'static str {
        self.buf.profile().rubric_source().as_str()
    }

    /// The judge's integer score range `(min, max)`.
    #[getter]
    fn score_range(&self) -> (u8, u8) {
        self.buf.profile().score_range()
    }

    /// Every dimension in profile order: `(name, weight, number of fixed criteria)` (weight
    /// and count 0 for a generated rubric).
    #[getter]
    fn dimensions(&self) -> Vec<(String, f64, usize)> {
        self.buf
            .profile()
            .dimensions()
            .map(|d| (d.name.to_string(), d.weight, d.criteria))
            .collect()
    }

    /// Every fixed criterion in the flat score order: `(dimension, title, description,
    /// weight)` (a negative weight is a pitfall). Empty for a generated rubric.
    #[getter]
    fn criteria(&self) -> Vec<(String, String, String, f64)> {
        let p = self.buf.profile();
        (0..p.dimension_count())
            .flat_map(|i| {
                let d = p.dimension(i).map(|d| d.name).unwrap_or("").to_string();
                p.criteria(i)
                    .map(|c| {
                        (
                            d.clone(),
                            c.title.to_string(),
                            c.description.to_string(),
                            c.weight,
                        )
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// The output span names in order (empty without an output format).
    #[getter]
    fn spans(&self) -> Vec<String> {
        let p = self.buf.profile();
        (0..p.span_count())
            .filter_map(|k| p.span_name(k).map(str::to_string))
            .collect()
    }

    /// The span the judge sees, or `None` (no output format: it sees the whole output).
    #[getter]
    fn judge_span(&self) -> Option<String> {
        let p = self.buf.profile();
        p.judge_span()
            .and_then(|k| p.span_name(k))
            .map(str::to_string)
    }

    /// The emotion term as `(span, weight)`, or `None`.
    #[getter]
    fn emotion(&self) -> Option<(String, f64)> {
        let p = self.buf.profile();
        p.emotion()
            .map(|e| (p.span_name(e.span()).unwrap_or("").to_string(), e.weight()))
    }

    /// The vetoes as `(dimension, min_score)`.
    #[getter]
    fn vetoes(&self) -> Vec<(String, u8)> {
        let p = self.buf.profile();
        p.vetoes()
            .iter()
            .map(|v| {
                let d = p.dimension(usize::from(v.dimension)).map_or("", |d| d.name);
                (d.to_string(), v.min_score)
            })
            .collect()
    }

    /// `K`, the length of one response's flat score vector: the profile's criteria, or for a
    /// generated profile the `rubric`'s.
    #[pyo3(signature = (rubric=None))]
    fn total_criteria(&self, rubric: Option<&Bound<'_, PyAny>>) -> PyResult<usize> {
        with_opt_rubric(rubric, |r| {
            self.buf
                .profile()
                .total_criteria(r)
                .or_raise("total_criteria (a generated profile takes rubric=, a fixed one none)")
        })
    }

    fn __repr__(&self) -> String {
        let p = self.buf.profile();
        format!(
            "Profile(name={:?}, dimensions={}, spans={})",
            p.name(),
            p.dimension_count(),
            p.span_count()
        )
    }
}

impl Profile {
    pub fn view(&self) -> CoreProfile<'_> {
        self.buf.profile()
    }
}

/// `_care.validate_profile(text) -> ProfileValidation`: every violation, never raises for bad
/// profile text.
#[pyfunction]
pub fn validate_profile<'py>(
    py: Python<'py>,
    text: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let bytes = text_bytes(text, "text")?;
    let mut scratch = vec![0u8; bytes.len()];
    let v = profile::parse_profile(&bytes, &mut scratch);
    let valid = v.profile.is_some();
    let profile = v.profile.map(|p| Profile {
        buf: ProfileBuf::from(&p),
    });
    dc!(py, "ProfileValidation", {
        "valid" => valid,
        "violations" => violations(py, &v.report)?,
        "overflowed" => v.report.overflowed(),
        "feedback" => v.report.to_string(),
        "profile" => profile.map(|p| Py::new(py, p)).transpose()?,
    })
}

/// Byte offset and length of `s` inside `base` (every span of a check is a slice of it).
fn offsets(base: &[u8], s: &str) -> Option<(usize, usize)> {
    let off = (s.as_ptr() as usize).wrapping_sub(base.as_ptr() as usize);
    (off.checked_add(s.len())? <= base.len()).then_some((off, s.len()))
}

fn check_result<'py>(
    py: Python<'py>,
    p: &CoreProfile<'_>,
    output: &[u8],
    c: &OutputCheck<'_>,
) -> PyResult<Bound<'py, PyAny>> {
    let spans = PyDict::new(py);
    let span_offsets = PyDict::new(py);
    for k in 0..p.span_count() {
        let name = p.span_name(k).unwrap_or("");
        let s = c.span(k);
        spans.set_item(name, s)?;
        span_offsets.set_item(name, s.and_then(|s| offsets(output, s)))?;
    }
    let vs: Vec<Bound<'py, PyAny>> = c
        .report()
        .violations()
        .iter()
        .map(|v| {
            dc!(py, "OutputViolation", {
                "code" => v.code.as_str(),
                "number" => v.code.number(),
                "span" => v.span.and_then(|k| p.span_name(usize::from(k))),
                "offset" => v.offset,
                "message" => v.to_string(),
            })
        })
        .collect::<PyResult<_>>()?;
    let judge = c.judge_text();
    dc!(py, "OutputCheck", {
        "format_reward" => c.format_reward(),
        "judge_needed" => c.judge_needed(),
        "judge_text" => judge,
        "judge_offset" => judge.and_then(|s| offsets(output, s)),
        "spans" => spans,
        "span_offsets" => span_offsets,
        "violations" => vs,
        "overflowed" => c.report().overflowed(),
        "feedback" => c.report().to_string(),
    })
}

/// `_care.check_output(profile, output) -> OutputCheck`.
#[pyfunction]
pub fn check_output<'py>(
    py: Python<'py>,
    profile: &Bound<'py, Profile>,
    output: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let bytes = text_bytes(output, "output")?;
    let p = profile.get().view();
    let c = p.check_output(&bytes);
    check_result(py, &p, &bytes, &c)
}

fn reward_result<'py>(
    py: Python<'py>,
    p: &CoreProfile<'_>,
    r: &ProfileReward,
) -> PyResult<Bound<'py, PyAny>> {
    let per_dim = PyDict::new(py);
    let weights = PyDict::new(py);
    for (i, (v, w)) in r.dim_values().iter().zip(r.weights()).enumerate() {
        let name = p.dimension(i).map_or("", |d| d.name);
        per_dim.set_item(name, *v)?;
        weights.set_item(name, *w)?;
    }
    dc!(py, "ProfileReward", {
        "reward" => r.reward,
        "format_reward" => r.format_reward,
        "judge_needed" => r.judge_needed,
        "rubric_reward" => r.rubric_reward,
        "emotion_correct" => r.emotion_correct,
        "vetoed_by" => r.vetoed_by.and_then(|d| p.dimension(usize::from(d))).map(|d| d.name),
        "per_dimension" => per_dim,
        "weights" => weights,
        "fired" => fired(py, &r.fired)?,
    })
}

/// `_care.profile_reward(profile, output, scores, emotion, rubric, missing, out_of_range,
/// uniform_weights) -> ProfileReward`.
#[pyfunction]
#[pyo3(signature = (profile, output, scores, emotion=None, rubric=None, missing=None, out_of_range=None, uniform_weights=None))]
#[allow(clippy::too_many_arguments)] // one keyword argument per option, as Python sees them
pub fn profile_reward<'py>(
    py: Python<'py>,
    profile: &Bound<'py, Profile>,
    output: &Bound<'py, PyAny>,
    scores: &Bound<'py, PyAny>,
    emotion: Option<&str>,
    rubric: Option<&Bound<'py, PyAny>>,
    missing: Option<&str>,
    out_of_range: Option<&str>,
    uniform_weights: Option<bool>,
) -> PyResult<Bound<'py, PyAny>> {
    let opts = score_options(missing, out_of_range, uniform_weights)?;
    let bytes = text_bytes(output, "output")?;
    let s = Tensor::take(scores, "scores")?;
    let p = profile.get().view();
    let r = with_opt_rubric(rubric, |rb| {
        let check = p.check_output(&bytes);
        profile::profile_reward(&p, rb, &check, s.slice::<f64>()?, emotion, &opts)
            .or_raise("profile_reward")
    })?;
    reward_result(py, &p, &r)
}

/// `_care.profile_reward_group(profile, outputs, scores[M, K], out[M], emotion, rubric, ...,
/// details) -> (ProfileGroupReport, details or None)`: the whole group in one call, without the
/// GIL.
#[pyfunction]
#[pyo3(signature = (profile, outputs, scores, out, emotion=None, rubric=None, missing=None, out_of_range=None, uniform_weights=None, details=false))]
#[allow(clippy::too_many_arguments)] // one keyword argument per option, as Python sees them
pub fn profile_reward_group<'py>(
    py: Python<'py>,
    profile: &Bound<'py, Profile>,
    outputs: Vec<Bound<'py, PyAny>>,
    scores: &Bound<'py, PyAny>,
    out: &Bound<'py, PyAny>,
    emotion: Option<&str>,
    rubric: Option<&Bound<'py, PyAny>>,
    missing: Option<&str>,
    out_of_range: Option<&str>,
    uniform_weights: Option<bool>,
    details: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let opts = score_options(missing, out_of_range, uniform_weights)?;
    let texts: Vec<Vec<u8>> = outputs
        .iter()
        .map(|o| text_bytes(o, "outputs[i]"))
        .collect::<PyResult<_>>()?;
    let s = Tensor::take(scores, "scores")?;
    let mut o = Tensor::take(out, "out")?;
    check_outputs(&[&o], &[Some(&s)])?;
    let p = profile.get().view();
    let (rep, per) = with_opt_rubric(rubric, |rb| {
        let m = texts.len();
        let k = p.total_criteria(rb).or_raise(
            "profile_reward_group (a generated profile takes rubric=, a fixed one none)",
        )?;
        if o.numel() != m {
            return Err(mismatch(format!(
                "out: {} values for {m} outputs",
                o.numel()
            )));
        }
        if s.numel() != m * k {
            return Err(mismatch(format!(
                "scores: {} values for {m} outputs of {k} criteria (expected [M, K] = [{m}, {k}])",
                s.numel()
            )));
        }
        let scores = s.slice::<f64>()?;
        let out = o.slice_mut::<f64>()?;
        py.detach(|| {
            let rep = profile::profile_reward_group(&p, rb, &texts, scores, emotion, &opts, out)?;
            let per = details.then(|| per_response(&p, rb, &texts, scores, k, emotion, &opts));
            Ok::<_, Error>((rep, per))
        })
        .or_raise("profile_reward_group")
    })?;
    let report = dc!(py, "ProfileGroupReport", {
        "scored" => rep.scored,
        "malformed" => rep.malformed,
        "vetoed" => rep.vetoed,
        "emotion_correct" => rep.emotion_correct,
        "failed" => rep.failed,
        "first_error" => rep.first_error.map(|(i, e)| (i, e.code())),
        "fired" => fired(py, &rep.fired)?,
    })?;
    let per = per
        .map(|v| {
            v.into_iter()
                .map(|r| match r {
                    Ok(r) => reward_result(py, &p, &r).map(|b| b.unbind()),
                    Err(_) => Ok(py.None()),
                })
                .collect::<PyResult<Vec<_>>>()
        })
        .transpose()?;
    Ok((report, per).into_pyobject(py)?.into_any())
}

/// Each response's full result (the function the group's rewards come from), `Err` for a
/// response whose scores broke an `error` policy.
#[allow(clippy::too_many_arguments)] // the group's inputs, passed on as they are
fn per_response(
    p: &CoreProfile<'_>,
    rb: Option<&care_core::Rubric<'_>>,
    texts: &[Vec<u8>],
    scores: &[f64],
    k: usize,
    emotion: Option<&str>,
    opts: &ScoreOptions,
) -> Vec<Result<ProfileReward, Error>> {
    texts
        .iter()
        .enumerate()
        .map(|(j, t)| {
            let check = p.check_output(t);
            let row = scores.get(j * k..(j + 1) * k).unwrap_or(&[]);
            profile::profile_reward(p, rb, &check, row, emotion, opts)
        })
        .collect()
}

/// `_care.render_profile_judge_prompt(profile, context, seeker_turn, response, rubric) -> str`.
#[pyfunction]
#[pyo3(signature = (profile, context, seeker_turn, response, rubric=None))]
pub fn render_profile_judge_prompt(
    profile: &Bound<'_, Profile>,
    context: Vec<String>,
    seeker_turn: &str,
    response: &str,
    rubric: Option<&Bound<'_, PyAny>>,
) -> PyResult<String> {
    let p = profile.get().view();
    with_opt_rubric(rubric, |rb| {
        let ctx: Vec<&str> = context.iter().map(String::as_str).collect();
        let mut s = String::new();
        profile::render_profile_judge_prompt(&mut s, &p, rb, &ctx, seeker_turn, response)
            .or_raise(
                "render_profile_judge_prompt (a generated profile takes rubric=, a fixed one none)",
            )?;
        Ok(s)
    })
}

/// `_care.parse_profile_judge_output(text, profile, out[K], rubric) -> JudgeReport`.
#[pyfunction]
#[pyo3(signature = (text, profile, out, rubric=None))]
pub fn parse_profile_judge_output<'py>(
    py: Python<'py>,
    text: &Bound<'py, PyAny>,
    profile: &Bound<'py, Profile>,
    out: &Bound<'py, PyAny>,
    rubric: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let bytes = text_bytes(text, "text")?;
    let mut o = Tensor::take(out, "out")?;
    let p = profile.get().view();
    let rep = with_opt_rubric(rubric, |rb| {
        profile::parse_profile_judge_output(&bytes, &p, rb, o.slice_mut::<f64>()?)
            .or_raise("parse_profile_judge_output")
    })?;
    crate::reward::judge_report(py, &rep)
}
