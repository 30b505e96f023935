//! `care generator-reward` (alias `care pref`): the generator reward (Eq. 4) of a rubric from
//! one preference pair.

use care_core::reward::generator_reward_validated;
use care_core::{GeneratorOptions, Validation};

use super::rubric::{
    Scratch, explain_score_error, flatten_scores, locate_score_error, member_text, pair_outcome,
    validate_rubric, write_fired,
};
use crate::input::{Line, object, required, score_matrix, str_array};
use crate::json::{LineError, Obj};

/// Resolved options: the core's [`GeneratorOptions`] (tau, lambda, gamma, scale, score and
/// format policies, unknown-label policy).
pub type Options = GeneratorOptions;

/// The members of an input line (besides `id` and `meta`).
pub const MEMBERS: &[&str] = &[
    "rubric",
    "chosen_scores",
    "rejected_scores",
    "chosen_tactics",
];

/// Reads `{"rubric", "chosen_scores", "rejected_scores", "chosen_tactics"}`; writes `r_pref`,
/// `r_align`, `r_fmt`, `reward`, `counts`, and the details behind them.
///
/// A rubric text that does not parse is data, not an error: SPEC §7 gives it
/// `r_pref = r_align = r_fmt = 0`, and its scores are then not read.
pub fn run(opts: &Options, line: &Line<'_>, o: &mut Obj<'_>) -> Result<(), LineError> {
    let m = object(line)?;
    let text = member_text(line, "rubric")?;
    let tactics = str_array(required(m, "chosen_tactics")?, "chosen_tactics")?;
    let tactics: Vec<&str> = tactics.iter().map(|t| t.as_ref()).collect();
    let chosen_v = required(m, "chosen_scores")?;
    let rejected_v = required(m, "rejected_scores")?;
    let mut scratch = Scratch::take(text.len());
    let mut v = Validation::default();
    validate_rubric(line, text, &opts.format, scratch.buf(), &mut v)?;
    let (chosen, rejected) = match v.rubric.as_ref() {
        Some(r) => (
            flatten_scores(r, score_matrix(chosen_v, "chosen_scores")?, "chosen_scores")?,
            flatten_scores(
                r,
                score_matrix(rejected_v, "rejected_scores")?,
                "rejected_scores",
            )?,
        ),
        None => (Vec::new(), Vec::new()),
    };
    let g = generator_reward_validated(&v, &chosen, &rejected, &tactics, opts).map_err(|e| {
        // Name the criterion (chosen side first, as the core checks it first per pair).
        match (v.rubric.as_ref(), e) {
            (Some(r), care_core::Error::MissingScore | care_core::Error::ScoreOutOfRange) => {
                locate_score_error(e, r, &chosen, "chosen_scores")
                    .unwrap_or_else(|| explain_score_error(e, r, &rejected, "rejected_scores"))
            }
            (_, care_core::Error::UnknownLabel) => {
                let unknown = tactics
                    .iter()
                    .find(|t| care_core::strategy::lookup(t).is_none())
                    .map_or(String::new(), |t| format!(" {t:?}"));
                LineError::new(
                    e.code(),
                    format!(
                        "chosen_tactics: unknown strategy label{unknown} (ESConv or MINT labels; --unknown-label ignore skips it)"
                    ),
                )
            }
            _ => LineError::from(e),
        }
    })?;
    // Which response the rubric prefers (Table 4's win, tie or loss), decided exactly; none
    // when the rubric did not parse.
    let outcome = match v.rubric.as_ref() {
        Some(r) => Some(pair_outcome(r, &chosen, &rejected, &opts.score)?),
        None => None,
    };
    o.f64("r_pref", g.r_pref)
        .f64("r_align", g.r_align)
        .u64("r_fmt", u64::from(g.r_fmt == 1.0))
        .f64("reward", g.reward);
    match outcome {
        Some(x) => o.str("outcome", x.name()),
        None => o.null("outcome"),
    };
    o.arr("counts", |a| {
        for c in g.counts.counts {
            a.u64(u64::from(c));
        }
    });
    o.bool("parsed", g.parsed)
        .u64("violations", u64::from(g.violations));
    o.obj("alignment", |x| {
        x.bool("top_violation", g.alignment.top_violation)
            .u64("zero_violations", u64::from(g.alignment.zero_violations));
    });
    o.obj("labels", |x| {
        x.u64("unknown", u64::from(g.counts.unknown))
            .u64("duplicates", u64::from(g.counts.duplicates));
    });
    write_fired(o, &g.fired);
    Ok(())
}
