//! `care score --profile NAME|FILE`: rewards under a rubric profile (`docs/PROFILES.md`).
//!
//! A line is `{"output": "<policy output>", "scores": .. | "judge": "<judge output>",
//! "emotion": "<gold label>"}` (plus `"rubric"` for a generated profile such as `care`), or
//! `"responses": [{"output", "scores" | "judge"}, ..]` for a whole GRPO group sharing the
//! `rubric` and `emotion` of the line. Scores are an object by dimension name, or an array of
//! arrays in profile order; raw scores in the profile's range, `null` = missing.

use std::sync::Arc;

use care_core::profile::{
    OutputCheck, Profile, ProfileBuf, ProfileReward, RubricSource, normalize_label,
    parse_profile_judge_output, profile_reward,
};
use care_core::reward::Fired;
use care_core::{FormatPolicy, JudgeReport, Rubric, ScoreOptions, Validation};
use serde_json::value::RawValue;
use std::borrow::Cow;

use super::rubric::{Scratch, member_text, validate_rubric, write_fired};
use super::score::write_judge;
use crate::input::{Line, Members, check_members, number_or_null, object, raw_array, string};
use crate::json::{Arr, LineError, Obj};

/// Resolved options of `care score --profile`.
#[derive(Clone, Debug)]
pub struct Options {
    /// The profile (parsed once, shared by the worker threads).
    pub profile: Arc<ProfileBuf>,
    /// Scoring policies.
    pub score: ScoreOptions,
    /// Format policy used to parse the rubric of a generated profile.
    pub format: FormatPolicy,
}

/// The profile named by `--profile`: a built-in name (`care`, `kardia`; names win over files
/// of the same name, write `./kardia` for such a file), else a JSON file.
///
/// # Errors
/// One line naming the problem: an unknown name that is no file, an unreadable file, or every
/// violation of an invalid profile.
pub fn load_profile(spec: &str) -> Result<ProfileBuf, String> {
    if care_core::profile::BUILTIN_NAMES.contains(&spec) {
        return ProfileBuf::builtin(spec).map_err(|e| format!("built-in profile {spec}: {e}"));
    }
    let text = std::fs::read(spec).map_err(|e| {
        format!(
            "--profile {spec}: not a built-in profile ({}) and not a readable file ({e})",
            care_core::profile::BUILTIN_NAMES.join(", ")
        )
    })?;
    ProfileBuf::parse(&text).map_err(|report| {
        let all: Vec<String> = report.violations().iter().map(|v| v.to_string()).collect();
        let more = if report.overflowed() { " | ..." } else { "" };
        format!(
            "invalid profile {spec} ({} violations): {}{more}",
            all.len(),
            all.join(" | ")
        )
    })
}

/// The members of an input line (besides `id` and `meta`).
pub const MEMBERS: &[&str] = &[
    "rubric",
    "output",
    "scores",
    "judge",
    "emotion",
    "responses",
];

/// The members of one object of `responses`.
const RESPONSE_MEMBERS: &[&str] = &["output", "scores", "judge"];

/// Reads one line (see the module docs); writes `profile`, `reward`, `format_reward`,
/// `format_violations`, `judge_needed`, `emotion_correct`, `rubric_reward`, `per_dimension`
/// (by name), `weights` (by name), `vetoed_by` and `fired`, plus `judge` and, for a generated
/// rubric, `rubric_format_reward`; for a group, the same members as arrays over the responses
/// with `failed` and `errors`.
pub fn run(opts: &Options, line: &Line<'_>, o: &mut Obj<'_>) -> Result<(), LineError> {
    let m = object(line)?;
    let p = opts.profile.profile();
    // The rubric of a generated profile, validated with the line's format policy.
    let text;
    let mut scratch;
    let v;
    let mut rubric_format = None;
    let rubric: Option<&Rubric<'_>> = if p.rubric_source() == RubricSource::Fixed {
        if m.contains_key("rubric") {
            return Err(LineError::schema(format!(
                "profile {} has a fixed rubric; remove \"rubric\"",
                p.name()
            )));
        }
        None
    } else {
        text = member_text(line, "rubric")?;
        scratch = Scratch::take(text.len());
        v = {
            let mut v = Validation::default();
            validate_rubric(line, text, &opts.format, scratch.buf(), &mut v)?;
            v
        };
        let Some(r) = v.rubric.as_ref() else {
            let first = v
                .report
                .violations()
                .first()
                .map_or_else(|| "the rubric did not parse".to_owned(), |x| x.to_string());
            return Err(LineError::new(
                care_core::Error::FormatViolation.code(),
                format!("rubric: {first}"),
            ));
        };
        // The rubric's own r_fmt (the generator's format), distinct from the policy output's.
        rubric_format = Some(u64::from(v.r_fmt() == 1.0));
        Some(r)
    };
    let gold = gold_label(&p, m)?;
    let gold = gold.as_deref();
    o.str("profile", p.name());
    if let Some(responses) = m.get("responses") {
        if ["output", "scores", "judge"]
            .iter()
            .any(|k| m.contains_key(k))
        {
            return Err(LineError::schema(
                "give \"responses\" or a single \"output\"/\"scores\"/\"judge\", not both",
            ));
        }
        run_group(opts, &p, rubric, gold, responses, o)?;
    } else {
        let out = output_text(&p, m, "")?;
        let check = p.check_output(out.as_bytes());
        let (r, judge) = score_one(opts, &p, rubric, &check, m, gold, "")?;
        write_reward(o, &p, &check, &r);
        if let Some(j) = judge {
            o.obj("judge", |x| write_judge(x, &j));
        }
    }
    if let Some(f) = rubric_format {
        o.u64("rubric_format_reward", f);
    }
    Ok(())
}

/// The gold emotion label: required (and not blank) when the profile has an emotion term.
fn gold_label<'a>(p: &Profile<'_>, m: &Members<'a>) -> Result<Option<Cow<'a, str>>, LineError> {
    let gold = match m.get("emotion") {
        None => None,
        Some(v) if v.get() == "null" => None,
        Some(v) => Some(string(v).ok_or_else(|| {
            LineError::schema("\"emotion\" must be a string (the gold emotion label)")
        })?),
    };
    if p.emotion().is_some() {
        match gold.as_deref() {
            None => {
                return Err(LineError::schema(format!(
                    "missing key \"emotion\" (the gold emotion label; profile {} has an emotion term)",
                    p.name()
                )));
            }
            Some(g) if normalize_label(g).is_empty() => {
                return Err(LineError::schema("\"emotion\" must be a non-blank label"));
            }
            Some(_) => {}
        }
    }
    Ok(gold)
}

/// The policy output of a response: required when the profile has an output format.
fn output_text<'a>(p: &Profile<'_>, m: &Members<'a>, at: &str) -> Result<Cow<'a, str>, LineError> {
    match m.get("output") {
        Some(v) => string(v).ok_or_else(|| {
            LineError::schema(format!(
                "\"{at}output\" must be a string (the policy's output text)"
            ))
        }),
        None if p.has_output_format() => Err(LineError::schema(format!(
            "missing key \"{at}output\" (profile {} checks the output's format)",
            p.name()
        ))),
        None => Ok(Cow::Borrowed("")),
    }
}

/// Scores one response: its scores (or judge answer) are read only when the output is
/// well-formed, since a malformed output scores 0 whatever they say.
fn score_one(
    opts: &Options,
    p: &Profile<'_>,
    rubric: Option<&Rubric<'_>>,
    check: &OutputCheck<'_>,
    m: &Members<'_>,
    gold: Option<&str>,
    at: &str,
) -> Result<(ProfileReward, Option<JudgeReport>), LineError> {
    let (scores, judge) = if check.judge_needed() {
        response_scores(p, rubric, m, at)?
    } else {
        (Vec::new(), None)
    };
    let key = if judge.is_some() { "judge" } else { "scores" };
    let r = profile_reward(p, rubric, check, &scores, gold, &opts.score)
        .map_err(|e| explain_score_error(e, p, rubric, &scores, &format!("{at}{key}")))?;
    Ok((r, judge))
}

/// The flat raw scores of one response (`scores` or `judge`), and the judge report.
fn response_scores(
    p: &Profile<'_>,
    rubric: Option<&Rubric<'_>>,
    m: &Members<'_>,
    at: &str,
) -> Result<(Vec<f64>, Option<JudgeReport>), LineError> {
    let (counts, total) = p
        .counts(rubric)
        .map_err(|e| LineError::core(e, "profile"))?;
    match (m.get("scores"), m.get("judge")) {
        (Some(s), None) => Ok((flatten(p, &counts, s, &format!("{at}scores"))?, None)),
        (None, Some(j)) => {
            let j = string(j).ok_or_else(|| {
                LineError::schema(format!(
                    "\"{at}judge\" must be a string (the judge's output text)"
                ))
            })?;
            let mut out = vec![f64::NAN; total];
            let rep = parse_profile_judge_output(j.as_bytes(), p, rubric, &mut out)
                .map_err(|e| LineError::core(e, &format!("{at}judge")))?;
            Ok((out, Some(rep)))
        }
        (Some(_), Some(_)) => Err(LineError::schema(format!(
            "give \"{at}scores\" or \"{at}judge\", not both"
        ))),
        (None, None) => Err(LineError::schema(format!(
            "missing key \"{at}scores\" (or \"{at}judge\"): the output is well-formed, so it needs its judge scores"
        ))),
    }
}

/// The dimension names of a profile, for messages.
fn dimension_list(p: &Profile<'_>) -> String {
    p.dimensions()
        .map(|d| format!("{:?}", d.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Flattens `scores` (an object by dimension name, or an array of arrays in profile order)
/// into the profile's flat order, `NaN` for `null`, after checking every dimension has one
/// score per criterion.
fn flatten(
    p: &Profile<'_>,
    counts: &[usize],
    v: &RawValue,
    key: &str,
) -> Result<Vec<f64>, LineError> {
    let n = p.dimension_count();
    let mut rows: Vec<Option<Vec<&RawValue>>> = vec![None; n];
    let list = raw_array(v, key).ok().filter(|l| l.len() == n);
    if let Some(obj) = Members::of(v) {
        // By name, in key order (as the checks always ran), so the first bad name is stable.
        let mut by_key: Vec<(&str, &RawValue)> = obj.iter().collect();
        by_key.sort_by_key(|(name, _)| *name);
        for (name, row) in by_key {
            let d = p.dimension_index(name).ok_or_else(|| {
                LineError::schema(format!(
                    "\"{key}\" names no dimension of profile {}: {name:?} (its dimensions: {})",
                    p.name(),
                    dimension_list(p)
                ))
            })?;
            rows[d] =
                Some(raw_array(row, key).map_err(|_| {
                    LineError::schema(format!("\"{key}\".{name:?} must be an array"))
                })?);
        }
    } else if let Some(list) = list {
        for (slot, row) in rows.iter_mut().zip(list) {
            *slot = raw_array(row, key).ok();
        }
    } else {
        return Err(LineError::schema(format!(
            "\"{key}\" must be an object by dimension name ({}) or an array of {n} arrays",
            dimension_list(p)
        )));
    }
    let mut flat = Vec::with_capacity(counts.iter().sum());
    for (d, (row, &want)) in rows.iter().zip(counts).enumerate() {
        let name = p.dimension(d).map_or("?", |x| x.name);
        let Some(row) = row else {
            return Err(LineError::schema(format!(
                "\"{key}\" lacks dimension {name:?} (an array, one score per criterion)"
            )));
        };
        if row.len() != want {
            return Err(LineError::new(
                care_core::Error::ScoreShape.code(),
                format!(
                    "\"{key}\".{name:?} has {} scores but the profile has {want} {name} criteria",
                    row.len()
                ),
            ));
        }
        for (i, s) in row.iter().enumerate() {
            let x = number_or_null(s).ok_or_else(|| {
                LineError::schema(format!("\"{key}\".{name:?}[{i}] must be a number or null"))
            })?;
            flat.push(x.unwrap_or(f64::NAN));
        }
    }
    Ok(flat)
}

/// A scoring error with the criterion that caused it.
fn explain_score_error(
    err: care_core::Error,
    p: &Profile<'_>,
    rubric: Option<&Rubric<'_>>,
    flat: &[f64],
    key: &str,
) -> LineError {
    let (lo, hi) = p.score_range();
    let (lo, hi) = (f64::from(lo), f64::from(hi));
    let in_range = |x: f64| (lo..=hi).contains(&x) && x.round() == x;
    let bad = |x: f64| match err {
        care_core::Error::MissingScore => x.is_nan(),
        care_core::Error::ScoreOutOfRange => !x.is_nan() && !in_range(x),
        _ => false,
    };
    let Some((i, &x)) = flat.iter().enumerate().find(|(_, x)| bad(**x)) else {
        return LineError::core(err, key);
    };
    // Flat index -> (dimension, criterion).
    let counts = p.counts(rubric).map(|c| c.0).unwrap_or_default();
    let (mut d, mut k) = (0usize, i);
    while d < counts.len() && k >= counts[d] {
        k -= counts[d];
        d += 1;
    }
    let name = p.dimension(d).map_or("?", |x| x.name);
    let what = if x.is_nan() {
        "has no score".to_owned()
    } else {
        format!("has score {x}, not an integer in {lo}..={hi}")
    };
    LineError::new(err.code(), format!("{key}.{name:?}[{k}] {what}"))
}

/// Writes the members of one response's reward.
fn write_reward(o: &mut Obj<'_>, p: &Profile<'_>, check: &OutputCheck<'_>, r: &ProfileReward) {
    o.f64("reward", r.reward);
    o.u64("format_reward", u64::from(r.format_reward == 1.0));
    o.arr("format_violations", |a| write_violations(a, p, check));
    o.bool("judge_needed", r.judge_needed);
    opt_bool(o, "emotion_correct", r.emotion_correct);
    o.f64("rubric_reward", r.rubric_reward);
    if r.judge_needed {
        o.obj("per_dimension", |x| by_name(x, p, r.dim_values()));
    } else {
        o.null("per_dimension");
    }
    o.obj("weights", |x| by_name(x, p, r.weights()));
    match r.vetoed_by.and_then(|d| p.dimension(usize::from(d))) {
        Some(d) => o.str("vetoed_by", d.name),
        None => o.null("vetoed_by"),
    };
    write_fired(o, &r.fired);
}

fn opt_bool(o: &mut Obj<'_>, key: &str, v: Option<bool>) {
    match v {
        Some(b) => o.bool(key, b),
        None => o.null(key),
    };
}

fn by_name(x: &mut Obj<'_>, p: &Profile<'_>, values: &[f64]) {
    for (d, v) in p.dimensions().zip(values) {
        x.f64(d.name, *v);
    }
}

fn write_violations(a: &mut Arr<'_>, p: &Profile<'_>, check: &OutputCheck<'_>) {
    for v in check.report().violations() {
        a.obj(|x| {
            x.str("code", v.code.as_str());
            match v.span.and_then(|k| p.span_name(usize::from(k))) {
                Some(s) => x.str("span", s),
                None => x.null("span"),
            };
            x.opt_u64("offset", v.offset.map(|o| o as u64))
                .str("message", &v.to_string());
        });
    }
    if check.report().overflowed() {
        a.obj(|x| {
            x.str("code", "truncated")
                .str("message", "more violations were found than reported");
        });
    }
}

/// One response of a group: its check, and its reward or error.
struct Scored<'o> {
    check: Option<OutputCheck<'o>>,
    result: Result<(ProfileReward, Option<JudgeReport>), LineError>,
}

/// A whole GRPO group under one profile (and rubric): a response that fails gets a `null`
/// reward (an invalid sample for `care advantages`, as the core's `profile_reward_group` gives
/// it NaN) and an entry in `errors`; the line itself still succeeds.
fn run_group(
    opts: &Options,
    p: &Profile<'_>,
    rubric: Option<&Rubric<'_>>,
    gold: Option<&str>,
    responses: &RawValue,
    o: &mut Obj<'_>,
) -> Result<(), LineError> {
    let list = raw_array(responses, "responses")?;
    // Each response's members and decoded output first: the checks below borrow the outputs.
    let read: Vec<Result<(Members<'_>, Cow<'_, str>), LineError>> = list
        .iter()
        .enumerate()
        .map(|(j, resp)| {
            let rm = Members::of(resp).ok_or_else(|| {
                LineError::schema(format!("\"responses\"[{j}] must be an object"))
            })?;
            check_members(&rm, RESPONSE_MEMBERS, &format!("\"responses\"[{j}]: "))?;
            let out = output_text(p, &rm, &format!("responses[{j}]."))?;
            Ok((rm, out))
        })
        .collect();
    let scored: Vec<Scored<'_>> = read
        .iter()
        .enumerate()
        .map(|(j, r)| match r {
            Ok((rm, out)) => {
                let at = format!("responses[{j}].");
                let check = p.check_output(out.as_bytes());
                let result = score_one(opts, p, rubric, &check, rm, gold, &at);
                Scored {
                    check: Some(check),
                    result,
                }
            }
            Err(e) => Scored {
                check: None,
                result: Err(e.clone()),
            },
        })
        .collect();
    let ok = |s: &Scored<'_>| s.result.as_ref().ok().map(|(r, _)| *r);
    o.arr("rewards", |a| {
        for s in &scored {
            a.f64(ok(s).map_or(f64::NAN, |r| r.reward));
        }
    });
    o.arr("format_rewards", |a| {
        for s in &scored {
            match &s.check {
                Some(c) => a.u64(u64::from(c.is_ok())),
                None => a.null(),
            };
        }
    });
    o.arr("format_violations", |a| {
        for s in &scored {
            match &s.check {
                Some(c) => a.arr(|x| write_violations(x, p, c)),
                None => a.null(),
            };
        }
    });
    o.arr("judge_needed", |a| {
        for s in &scored {
            match &s.check {
                Some(c) => a.bool(c.judge_needed()),
                None => a.null(),
            };
        }
    });
    o.arr("emotion_correct", |a| {
        for s in &scored {
            match ok(s).and_then(|r| r.emotion_correct) {
                Some(b) => a.bool(b),
                None => a.null(),
            };
        }
    });
    o.arr("per_dimension", |a| {
        for s in &scored {
            match ok(s).filter(|r| r.judge_needed) {
                Some(r) => a.obj(|x| by_name(x, p, r.dim_values())),
                None => a.null(),
            };
        }
    });
    o.arr("vetoed_by", |a| {
        for s in &scored {
            match ok(s)
                .and_then(|r| r.vetoed_by)
                .and_then(|d| p.dimension(usize::from(d)))
            {
                Some(d) => a.str(d.name),
                None => a.null(),
            };
        }
    });
    let failed = scored.iter().filter(|s| s.result.is_err()).count();
    o.u64("failed", failed as u64);
    o.arr("errors", |a| {
        for s in &scored {
            match &s.result {
                Ok(_) => a.null(),
                Err(e) => a.obj(|x| {
                    x.str("code", e.code).str("message", &e.message);
                }),
            };
        }
    });
    if let Some(w) = scored
        .iter()
        .find_map(|s| ok(s).map(|r| r.weights().to_vec()))
    {
        o.obj("weights", |x| by_name(x, p, &w));
    }
    let mut fired = Fired::default();
    for s in &scored {
        if let Some(r) = ok(s) {
            fired.merge(&r.fired);
        }
    }
    write_fired(o, &fired);
    let judges: Vec<Option<JudgeReport>> = scored
        .iter()
        .map(|s| s.result.as_ref().ok().and_then(|(_, j)| *j))
        .collect();
    if judges.iter().any(Option::is_some) {
        o.arr("judge", |a| {
            for j in &judges {
                match j {
                    Some(rep) => a.obj(|x| write_judge(x, rep)),
                    None => a.null(),
                };
            }
        });
    }
    Ok(())
}
