//! Judge I/O for any profile: the prompt renderer and the lenient judge-output parser of
//! [`crate::judge`], with the profile's dimension names as categories, its criteria and its
//! score range. A generated rubric (the `care` profile) goes through [`crate::judge`] itself.

use core::fmt::Write;

use super::{Profile, RubricSource};
use crate::judge::{
    JudgePromptLayout, JudgeReport, parse_judge_output, parse_scores_with,
    render_judge_prompt_with, write_prompt_criterion, write_prompt_dialogue_last,
    write_prompt_head, write_prompt_intro, write_prompt_tail,
};
use crate::rubric::Rubric;
use crate::{Error, Result};

/// Renders the judge prompt of `profile` for one response in the paper's order
/// ([`JudgePromptLayout::Paper`]; [`render_profile_judge_prompt_with`] takes the layout). For a
/// profile with an output format, pass the judge span, [`super::OutputCheck::judge_text`].
/// Categories are the dimension names; a pitfall criterion (negative weight) is marked as such.
/// A generated rubric renders exactly [`crate::judge::render_judge_prompt`] of `rubric`.
///
/// # Errors
/// [`Error::InvalidArgument`] when a generated profile gets no rubric or a fixed one gets one;
/// [`Error::BufferTooSmall`] when the writer fails (a full fixed-capacity buffer).
pub fn render_profile_judge_prompt<W: Write + ?Sized>(
    w: &mut W,
    profile: &Profile<'_>,
    rubric: Option<&Rubric<'_>>,
    context: &[&str],
    seeker_turn: &str,
    response: &str,
) -> Result<()> {
    render_profile_judge_prompt_with(
        w,
        profile,
        rubric,
        context,
        seeker_turn,
        response,
        JudgePromptLayout::Paper,
    )
}

/// [`render_profile_judge_prompt`] in `layout`: under [`JudgePromptLayout::SharedPrefix`] the
/// instructions, the criteria and the output shape come first and the response last, so the
/// judge calls of one group share everything before the response as a prompt prefix. A
/// generated rubric renders exactly [`render_judge_prompt_with`] of `rubric`.
///
/// # Errors
/// As [`render_profile_judge_prompt`].
pub fn render_profile_judge_prompt_with<W: Write + ?Sized>(
    w: &mut W,
    profile: &Profile<'_>,
    rubric: Option<&Rubric<'_>>,
    context: &[&str],
    seeker_turn: &str,
    response: &str,
    layout: JudgePromptLayout,
) -> Result<()> {
    let written = match (profile.rubric_source(), rubric) {
        (RubricSource::Generated, Some(r)) => {
            render_judge_prompt_with(w, r, context, seeker_turn, response, layout)
        }
        (RubricSource::Fixed, None) => (|| {
            let (lo, hi) = profile.score_range();
            match layout {
                JudgePromptLayout::Paper => {
                    write_prompt_head(w, context, seeker_turn, response, lo, hi)?;
                }
                JudgePromptLayout::SharedPrefix => {
                    write_prompt_intro(w, lo, hi)?;
                    w.write_str("\n\n## Rubric\n")?;
                }
            }
            let mut pitfalls = false;
            for (i, d) in profile.dimensions().enumerate() {
                write!(w, "\n### {}\n", d.name)?;
                for c in profile.criteria(i) {
                    pitfalls |= c.weight < 0.0;
                    write_prompt_criterion(w, c.title, c.description, c.weight < 0.0)?;
                }
            }
            write_prompt_tail(w, lo, hi, pitfalls)?;
            match layout {
                JudgePromptLayout::Paper => Ok(()),
                JudgePromptLayout::SharedPrefix => {
                    write_prompt_dialogue_last(w, context, seeker_turn, response)
                }
            }
        })(),
        _ => return Err(Error::InvalidArgument),
    };
    written.map_err(|_| Error::BufferTooSmall)
}

/// Parses a judge answer for `profile` into `out` (flat profile order, length
/// [`Profile::total_criteria`]): the same envelope rules as [`parse_judge_output`] (think
/// blocks, the last fenced json block, else the first balanced object with `criterion_scores`);
/// items match a dimension by name and a criterion of it by title, trimmed, exact first, then
/// ASCII-case-insensitive. A generated rubric parses exactly as [`parse_judge_output`].
///
/// # Errors
/// [`Error::InvalidArgument`] for a rubric that does not fit the profile (see
/// [`Profile::counts`]); otherwise as [`parse_judge_output`].
pub fn parse_profile_judge_output(
    text: &[u8],
    profile: &Profile<'_>,
    rubric: Option<&Rubric<'_>>,
    out: &mut [f64],
) -> Result<JudgeReport> {
    match (profile.rubric_source(), rubric) {
        (RubricSource::Generated, Some(r)) => parse_judge_output(text, r, out),
        (RubricSource::Fixed, None) => {
            if out.len() != profile.total_criteria(None)? {
                return Err(Error::ScoreShape);
            }
            let (lo, hi) = profile.score_range();
            let layout = profile.layout();
            parse_scores_with(text, out, (f64::from(lo), f64::from(hi)), |cat, title| {
                let by = |ci: bool| {
                    layout
                        .dims
                        .iter()
                        .position(|d| cat.trimmed_eq_str(profile.s(d.name), ci))
                };
                let d = layout.dims.get(by(false).or_else(|| by(true))?)?;
                let first = usize::from(d.first);
                let crits = layout.criteria.get(first..first + usize::from(d.count))?;
                let find = |ci: bool| {
                    crits
                        .iter()
                        .position(|c| title.trimmed_eq_str(profile.s(c.title), ci))
                };
                match find(false) {
                    Some(i) => Some((first + i, false)),
                    None => find(true).map(|i| (first + i, true)),
                }
            })
        }
        _ => Err(Error::InvalidArgument),
    }
}
