//! `care score`: the policy reward (Eq. 5) of judged responses under a rubric.

use care_core::reward::{Fired, PolicyReward};
use care_core::{
    FormatPolicy, JudgeReport, Rubric, ScoreOptions, parse_judge_output, policy_reward,
    validate_str,
};

use super::rubric::{Scratch, explain_score_error, flatten_scores, member_text, write_fired};
use serde_json::value::RawValue;

use crate::input::{Line, Members, check_members, object, raw_array, score_matrix, string};
use crate::json::{LineError, Obj};

/// Resolved options of `care score`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// Scoring policies.
    pub score: ScoreOptions,
    /// Format policy used to parse the rubric.
    pub format: FormatPolicy,
}

/// The members of an input line (besides `id` and `meta`).
pub const MEMBERS: &[&str] = &["rubric", "scores", "judge", "responses"];

/// The members of one object of `responses`.
const RESPONSE_MEMBERS: &[&str] = &["scores", "judge"];

/// Reads `{"rubric", "scores" | "judge" | "responses"}`; writes `reward` and `per_dimension`
/// (a single response) or `rewards`, `per_dimension` and `errors` (a group), plus the rubric's
/// `format_reward`, the `weights` used and the policies that `fired`.
pub fn run(opts: &Options, line: &Line<'_>, o: &mut Obj<'_>) -> Result<(), LineError> {
    let m = object(line)?;
    let text = member_text(line, "rubric")?;
    let mut scratch = Scratch::take(text.len());
    let v = validate_str(text, &opts.format, scratch.buf())?;
    let Some(rubric) = v.rubric.as_ref() else {
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
    let r_fmt = v.r_fmt();
    if let Some(responses) = m.get("responses") {
        if m.contains_key("scores") || m.contains_key("judge") {
            return Err(LineError::schema(
                "give \"responses\" or a single \"scores\"/\"judge\", not both",
            ));
        }
        return run_group(opts, rubric, r_fmt, responses, o);
    }
    let (scores, judge) = response_scores(rubric, m, "")?;
    let key = if judge.is_some() { "judge" } else { "scores" };
    let r = policy_reward(rubric, &scores, &opts.score)
        .map_err(|e| explain_score_error(e, rubric, &scores, key))?;
    o.f64("reward", r.reward);
    o.f64s("per_dimension", &r.dim_means);
    o.f64s("weights", &r.weights);
    o.u64("format_reward", u64::from(r_fmt == 1.0));
    write_fired(o, &r.fired);
    if let Some(j) = judge {
        o.obj("judge", |x| write_judge(x, &j));
    }
    Ok(())
}

/// The flat raw scores of one response object (`scores` or `judge`), and the judge report.
fn response_scores(
    rubric: &Rubric<'_>,
    m: &Members<'_>,
    at: &str,
) -> Result<(Vec<f64>, Option<JudgeReport>), LineError> {
    match (m.get("scores"), m.get("judge")) {
        (Some(s), None) => {
            let key = format!("{at}scores");
            Ok((flatten_scores(rubric, score_matrix(s, &key)?, &key)?, None))
        }
        (None, Some(j)) => {
            let j = string(j).ok_or_else(|| {
                LineError::schema(format!(
                    "\"{at}judge\" must be a string (the judge's output text)"
                ))
            })?;
            let mut out = vec![f64::NAN; rubric.total_criteria()];
            let rep = parse_judge_output(j.as_bytes(), rubric, &mut out)
                .map_err(|e| LineError::core(e, &format!("{at}judge")))?;
            Ok((out, Some(rep)))
        }
        (Some(_), Some(_)) => Err(LineError::schema(format!(
            "give \"{at}scores\" or \"{at}judge\", not both"
        ))),
        (None, None) => Err(LineError::schema(format!(
            "missing key \"{at}scores\" (or \"{at}judge\", or \"responses\")"
        ))),
    }
}

/// A whole GRPO group under one rubric (parsed once): a response that breaks an `error` policy,
/// or whose scores cannot be read, gets a `null` reward (an invalid sample for
/// `care advantages`, exactly as the core's `policy_reward_group` gives it NaN) and an entry in
/// `errors`; the line itself still succeeds.
fn run_group(
    opts: &Options,
    rubric: &Rubric<'_>,
    r_fmt: f64,
    responses: &RawValue,
    o: &mut Obj<'_>,
) -> Result<(), LineError> {
    let list = raw_array(responses, "responses")?;
    let mut judges = Vec::with_capacity(list.len());
    // Scored one by one (not through `policy_reward_group`) to keep each response's per-dimension
    // means and its own error; `policy_reward_group` keeps only the first error.
    let details: Vec<Result<PolicyReward, LineError>> = list
        .iter()
        .enumerate()
        .map(|(j, resp)| {
            let at = format!("responses[{j}].");
            let (scores, rep) = Members::of(resp)
                .ok_or_else(|| LineError::schema(format!("\"responses\"[{j}] must be an object")))
                .and_then(|rm| {
                    check_members(&rm, RESPONSE_MEMBERS, &format!("\"responses\"[{j}]: "))?;
                    response_scores(rubric, &rm, &at)
                })
                .inspect_err(|_| judges.push(None))?;
            judges.push(rep);
            policy_reward(rubric, &scores, &opts.score)
                .map_err(|e| explain_score_error(e, rubric, &scores, &format!("responses[{j}]")))
        })
        .collect();
    let rewards: Vec<f64> = details
        .iter()
        .map(|d| d.as_ref().map_or(f64::NAN, |p| p.reward))
        .collect();
    let mut fired = Fired::default();
    for p in details.iter().flatten() {
        fired.merge(&p.fired);
    }
    o.f64s("rewards", &rewards);
    o.arr("per_dimension", |a| {
        for d in &details {
            match d {
                Ok(p) => {
                    a.f64s(&p.dim_means);
                }
                Err(_) => {
                    a.null();
                }
            }
        }
    });
    let failed = details.iter().filter(|d| d.is_err()).count();
    o.u64("failed", failed as u64);
    o.arr("errors", |a| {
        for d in &details {
            match d {
                Ok(_) => {
                    a.null();
                }
                Err(e) => {
                    a.obj(|x| {
                        x.str("code", e.code).str("message", &e.message);
                    });
                }
            }
        }
    });
    let weights = details
        .iter()
        .find_map(|d| d.as_ref().ok().map(|p| p.weights))
        .unwrap_or_else(|| rubric.weights());
    o.f64s("weights", &weights);
    o.u64("format_reward", u64::from(r_fmt == 1.0));
    write_fired(o, &fired);
    if judges.iter().any(Option::is_some) {
        o.arr("judge", |a| {
            for j in &judges {
                match j {
                    Some(rep) => {
                        a.obj(|x| write_judge(x, rep));
                    }
                    None => {
                        a.null();
                    }
                }
            }
        });
    }
    Ok(())
}

/// The judge-output parser's findings.
pub fn write_judge(x: &mut Obj<'_>, j: &JudgeReport) {
    x.u64("matched", u64::from(j.matched))
        .u64("case_insensitive", u64::from(j.case_insensitive))
        .u64("missing", u64::from(j.missing))
        .u64("duplicates", u64::from(j.duplicates))
        .u64("unknown", u64::from(j.unknown))
        .u64("invalid_scores", u64::from(j.invalid_scores))
        .u64("out_of_range", u64::from(j.out_of_range))
        .u64("malformed_items", u64::from(j.malformed_items));
}
