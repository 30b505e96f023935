//! A fixed rubric profile of `care-core` (Kardia-R1 and the like) in the loop.
//!
//! The profile holds the rubric (its dimensions, weights and criteria), so no generator is
//! called. Before judging, each response goes through the profile's output check
//! ([`care_core::profile::Profile::check_output`]): a malformed output is settled with reward
//! 0 and status `malformed_output`, without a judge call; a well-formed one is judged on its
//! judge span only (Kardia-R1: the text between the response tags). The group's rewards are
//! [`care_core::profile::profile_reward_group`], with the gold emotion of the turn
//! (`gold.emotion`) when the profile has an emotion term.

use care_core::profile::{
    Profile, RubricSource, parse_profile_judge_output, profile_reward_group,
    render_profile_judge_prompt_with,
};
use care_core::{JudgePromptLayout, ScoreOptions};
use serde_json::Value;

use crate::llm::ChatMessage;
use crate::profile::{Dialogue, JudgeProblem, Prepared, RubricCheck, RubricProfile};

/// The status of a response that breaks the profile's output format (reward 0, not judged).
pub const MALFORMED_OUTPUT: &str = "malformed_output";

/// A built-in fixed profile of `care-core`.
#[derive(Debug, Clone)]
pub struct FixedProfile {
    profile: Profile<'static>,
    json: &'static str,
    score: ScoreOptions,
    layout: JudgePromptLayout,
}

impl FixedProfile {
    /// The built-in profile `name` (`kardia`).
    ///
    /// # Errors
    /// An unknown name, or a profile whose rubric is generated (that is [`crate::profile::CareProfile`]).
    pub fn builtin(name: &str) -> Result<FixedProfile, String> {
        let (Ok(profile), Some(json)) = (Profile::builtin(name), Profile::builtin_json(name))
        else {
            return Err(format!("unknown profile {name:?}: use care or kardia"));
        };
        if profile.rubric_source() != RubricSource::Fixed {
            return Err(format!(
                "profile {name:?} generates its rubric: use the care profile"
            ));
        }
        Ok(FixedProfile {
            profile,
            json,
            score: ScoreOptions::default(),
            layout: JudgePromptLayout::default(),
        })
    }

    /// The same profile with the judge prompt in `layout` (the default puts the criteria and
    /// the dialogue before the response span: see [`JudgePromptLayout`]).
    #[must_use]
    pub fn with_layout(mut self, layout: JudgePromptLayout) -> Self {
        self.layout = layout;
        self
    }

    fn total(&self) -> usize {
        self.profile.total_criteria(None).unwrap_or(0)
    }
}

impl RubricProfile for FixedProfile {
    fn name(&self) -> &str {
        self.profile.name()
    }

    fn fixed_rubric(&self) -> Option<&str> {
        Some(self.json)
    }

    fn generator_messages(&self, _dialogue: &Dialogue) -> Vec<ChatMessage> {
        // Never asked: the rubric is fixed.
        Vec::new()
    }

    fn check_rubric(&self, _text: &str) -> RubricCheck {
        // The built-in profile was validated when it was parsed.
        RubricCheck {
            format_reward: 1.0,
            violations: Vec::new(),
            feedback: String::new(),
        }
    }

    fn repair_message(&self, _check: &RubricCheck) -> String {
        String::new()
    }

    fn layout(&self, _rubric: &str) -> Vec<usize> {
        self.profile
            .counts(None)
            .map(|(c, _total)| {
                c.iter()
                    .take(self.profile.dimension_count())
                    .copied()
                    .collect()
            })
            .unwrap_or_default()
    }

    fn prepare_response(&self, response: &str) -> Prepared {
        if !self.profile.has_output_format() {
            return Prepared::Judge(response.to_owned());
        }
        let check = self.profile.check_output(response.as_bytes());
        match check.judge_text() {
            Some(span) if check.format_reward() == 1.0 => Prepared::Judge(span.to_owned()),
            _ => Prepared::Settled {
                reward: 0.0,
                status: MALFORMED_OUTPUT,
            },
        }
    }

    fn judge_messages(&self, _rubric: &str, dialogue: &Dialogue, span: &str) -> Vec<ChatMessage> {
        let lines = dialogue.history_lines();
        let context: Vec<&str> = lines.iter().map(String::as_str).collect();
        let mut prompt = String::new();
        let _ = render_profile_judge_prompt_with(
            &mut prompt,
            &self.profile,
            None,
            &context,
            dialogue.seeker_turn(),
            span,
            self.layout,
        );
        vec![ChatMessage::new("user", prompt)]
    }

    fn parse_answer(&self, _rubric: &str, answer: &str) -> Result<Vec<f64>, JudgeProblem> {
        let mut scores = vec![f64::NAN; self.total()];
        let report =
            parse_profile_judge_output(answer.as_bytes(), &self.profile, None, &mut scores)
                .map_err(|e| JudgeProblem {
                    code: e.code(),
                    message: format!("{e}: return one JSON object {{\"criterion_scores\":[...]}}"),
                })?;
        if report.missing > 0 {
            return Err(JudgeProblem {
                code: "missing_score",
                message: format!("no usable score for {} criteria", report.missing),
            });
        }
        if report.out_of_range > 0 {
            let (lo, hi) = self.profile.score_range();
            return Err(JudgeProblem {
                code: "score_out_of_range",
                message: format!(
                    "{} scores are not integers in {lo}..{hi}",
                    report.out_of_range
                ),
            });
        }
        Ok(scores)
    }

    fn score_group(
        &self,
        _rubric: &str,
        responses: &[String],
        scores: &[Option<Vec<f64>>],
        gold: Option<&Value>,
    ) -> Vec<Option<f64>> {
        let total = self.total();
        let mut flat = Vec::with_capacity(scores.len() * total);
        for s in scores {
            match s {
                Some(v) if v.len() == total => flat.extend_from_slice(v),
                _ => flat.extend(std::iter::repeat_n(f64::NAN, total)),
            }
        }
        let emotion = gold.and_then(|g| g.get("emotion")).and_then(Value::as_str);
        let mut out = vec![f64::NAN; responses.len()];
        if profile_reward_group(
            &self.profile,
            None,
            responses,
            &flat,
            emotion,
            &self.score,
            &mut out,
        )
        .is_err()
        {
            return vec![None; responses.len()];
        }
        out.into_iter()
            .zip(scores)
            .map(|(x, s)| (s.is_some() && x.is_finite()).then_some(x))
            .collect()
    }
}
