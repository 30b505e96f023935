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
    Profile, RubricSource, parse_profile_judge_output, profile_reward_group, profile_reward_real,
    render_profile_judge_prompt_with,
};
use care_core::{JudgePromptLayout, ScoreOptions};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::llm::ChatMessage;
use crate::profile::{Dialogue, JudgeProblem, Prepared, RubricCheck, RubricProfile};

/// The status of a response that breaks the profile's output format (reward 0, not judged).
pub const MALFORMED_OUTPUT: &str = "malformed_output";

/// What a profile with an emotion term does with a turn whose `gold` has no emotion label.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MissingGold {
    /// Refuse the turn before any judge call: every response `missing_gold`, no reward.
    #[default]
    Refuse,
    /// Score it without the emotion term (`lambda = 0`: the format check, the vetoes and the
    /// rubric part).
    WithoutEmotion,
}

/// A built-in fixed profile of `care-core`.
#[derive(Debug, Clone)]
pub struct FixedProfile {
    profile: Profile<'static>,
    /// The same profile without its emotion term (for [`MissingGold::WithoutEmotion`]).
    without_emotion: Profile<'static>,
    json: &'static str,
    score: ScoreOptions,
    layout: JudgePromptLayout,
    missing_gold: MissingGold,
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
            without_emotion: profile.without_emotion(),
            profile,
            json,
            score: ScoreOptions::default(),
            layout: JudgePromptLayout::default(),
            missing_gold: MissingGold::Refuse,
        })
    }

    /// The same profile with the judge prompt in `layout` (the default puts the criteria and
    /// the dialogue before the response span: see [`JudgePromptLayout`]).
    #[must_use]
    pub fn with_layout(mut self, layout: JudgePromptLayout) -> Self {
        self.layout = layout;
        self
    }

    /// What a turn without a gold emotion gets.
    #[must_use]
    pub fn with_missing_gold(mut self, missing_gold: MissingGold) -> Self {
        self.missing_gold = missing_gold;
        self
    }

    /// The gold emotion of a turn: `gold.emotion`, a non-blank string. `Ok(None)` when the
    /// profile has no emotion term, or it is missing and the turn is scored without the term.
    fn gold_emotion<'g>(&self, gold: Option<&'g Value>) -> Result<Option<&'g str>, String> {
        if self.profile.emotion().is_none() {
            return Ok(None);
        }
        match gold.and_then(|g| g.get("emotion")) {
            Some(Value::String(e)) if !e.trim().is_empty() => Ok(Some(e)),
            Some(v) if !v.is_null() && !v.is_string() => Err(format!(
                "gold.emotion is {v}: give the gold emotion label as a string"
            )),
            _ => match self.missing_gold {
                MissingGold::WithoutEmotion => Ok(None),
                MissingGold::Refuse => Err(format!(
                    "the {} profile's reward has an emotion term and the turn has no gold \
                     emotion: give gold.emotion (in an OpenRLHF label: {{\"gold\": \
                     {{\"emotion\": ...}}}}), or set missing_gold to without_emotion",
                    self.profile.name()
                )),
            },
        }
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

    fn check_gold(&self, gold: Option<&Value>) -> Result<(), String> {
        self.gold_emotion(gold).map(|_| ())
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

    fn can_reorder(&self) -> bool {
        true
    }

    fn judge_messages_ordered(
        &self,
        _rubric: &str,
        dialogue: &Dialogue,
        span: &str,
        order: &[usize],
    ) -> Result<Vec<ChatMessage>, String> {
        // The profile with its dimensions and their criteria listed in the new order, parsed
        // again (no check depends on that order, so the reordered profile is valid).
        let mut v: Value = serde_json::from_str(self.json).map_err(|e| e.to_string())?;
        let layout = self.layout(self.json);
        let blocks = crate::panel::order_blocks(&layout, order).ok_or_else(|| {
            format!("{order:?} is not an order of the profile's criteria that keeps each dimension together")
        })?;
        let dims = v
            .get_mut("dimensions")
            .and_then(Value::as_array_mut)
            .ok_or_else(|| "the profile has no dimensions".to_owned())?;
        let starts: Vec<usize> = layout
            .iter()
            .scan(0usize, |acc, &n| {
                let s = *acc;
                *acc += n;
                Some(s)
            })
            .collect();
        let mut shown_dims = Vec::with_capacity(dims.len());
        for (d, crits) in &blocks {
            let mut dim = dims
                .get(*d)
                .cloned()
                .ok_or_else(|| format!("dimension {d} is not in the profile"))?;
            let start = starts.get(*d).copied().unwrap_or(0);
            let all = dim
                .get("criteria")
                .and_then(Value::as_array)
                .cloned()
                .ok_or_else(|| "a dimension has no criteria".to_owned())?;
            let shown: Vec<Value> = crits
                .iter()
                .filter_map(|&i| all.get(i - start).cloned())
                .collect();
            if let Some(slot) = dim.get_mut("criteria") {
                *slot = Value::Array(shown);
            }
            shown_dims.push(dim);
        }
        *dims = shown_dims;
        let buf = care_core::profile::ProfileBuf::parse(v.to_string().as_bytes())
            .map_err(|_| "the reordered profile does not parse".to_owned())?;
        let shown = buf.profile();
        // Rendered as `judge_messages` renders (a test holds the two equal at the identity).
        let lines = dialogue.history_lines();
        let context: Vec<&str> = lines.iter().map(String::as_str).collect();
        let mut prompt = String::new();
        render_profile_judge_prompt_with(
            &mut prompt,
            &shown,
            None,
            &context,
            dialogue.seeker_turn(),
            span,
            self.layout,
        )
        .map_err(|e| e.to_string())?;
        Ok(vec![ChatMessage::new("user", prompt)])
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
        // check_gold refused the turn before any judge call when this fails.
        let Ok(emotion) = self.gold_emotion(gold) else {
            return vec![None; responses.len()];
        };
        let profile = if emotion.is_none() {
            &self.without_emotion
        } else {
            &self.profile
        };
        let mut out = vec![f64::NAN; responses.len()];
        if profile_reward_group(
            profile,
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

    fn score_real(
        &self,
        _rubric: &str,
        response: &str,
        scores: &[f64],
        gold: Option<&Value>,
    ) -> Result<f64, String> {
        let emotion = self.gold_emotion(gold)?;
        let profile = if emotion.is_none() {
            &self.without_emotion
        } else {
            &self.profile
        };
        let check = profile.check_output(response.as_bytes());
        profile_reward_real(profile, None, &check, scores, emotion, &self.score)
            .map(|r| r.reward)
            .map_err(|e| format!("{}: {e}", e.code()))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn an_ordered_prompt_is_the_prompt_at_the_identity_and_moves_the_criteria_otherwise() {
        let p = FixedProfile::builtin("kardia").unwrap();
        let d = Dialogue::new(vec![ChatMessage::new("user", "I can't sleep.")]).unwrap();
        let rubric = p.fixed_rubric().unwrap().to_owned();
        let plain = p.judge_messages(&rubric, &d, "I hear you.");
        let layout = p.layout(&rubric);
        let total: usize = layout.iter().sum();
        let id: Vec<usize> = (0..total).collect();
        assert_eq!(
            p.judge_messages_ordered(&rubric, &d, "I hear you.", &id)
                .unwrap(),
            plain
        );
        // Kardia-R1 has one criterion per dimension: the dimensions move as blocks.
        assert_eq!(layout, vec![1; 5]);
        let order: Vec<usize> = (0..total).rev().collect();
        let moved = p
            .judge_messages_ordered(&rubric, &d, "I hear you.", &order)
            .unwrap();
        assert_ne!(moved, plain);
        assert_eq!(moved[0].content.len(), plain[0].content.len());
        let pos = |m: &[ChatMessage], t: &str| m[0].content.find(t).unwrap();
        let (relevance, fluency) = ("Relevance to the user's message", "Fluency and naturalness");
        assert!(pos(&plain, relevance) < pos(&plain, fluency));
        assert!(pos(&moved, relevance) > pos(&moved, fluency));
        assert!(
            p.judge_messages_ordered(&rubric, &d, "x", &[0, 0, 1, 2, 3])
                .is_err(),
            "not a permutation"
        );
    }
}
