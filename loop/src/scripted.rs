//! The offline scripted backend: **a replay of the bundled paper fixtures, not an LLM**.
//!
//! It lets a newcomer (and the README quick start) run the whole loop without a model:
//!
//! * generator: the first answer of every turn is the paper's `rubric_sft_1` with its
//!   Cognitive weight changed from 0.4 to 0.5 (weights sum to 1.1, so the validator rejects
//!   it and the repair loop runs); the answer to a repair request is `rubric_sft_1` itself.
//!   Every turn gets that rubric, whatever its context.
//! * judge: when the judged response is one of the six responses of `cli/data/demo_group.json`,
//!   the answer is that response's recorded judge output (bare JSON, a think block, a code
//!   fence, prose, string scores, compact: the parser's cases); when it is the response span
//!   of a well-formed output of `cli/data/demo_kardia.json` (`--profile kardia`,
//!   `cli/data/reward_demo_kardia.jsonl`), that output's recorded judge answer; any other
//!   response gets an answer without JSON, so it ends as `judge_invalid` with a `null` reward.
//!
//! Its model name is [`SCRIPTED_MODEL`], so its answers never mix with a real model's in the
//! cache.

use care_core::profile::Profile;
use serde::Deserialize;

use crate::llm::{ChatMessage, Completion, Usage};

/// The model name of the scripted backend (in cache keys and output lines).
pub const SCRIPTED_MODEL: &str = "care-scripted-replay";

const RUBRIC: &str = include_str!("../../cli/data/rubric_sft_1.json");
const GROUP: &str = include_str!("../../cli/data/demo_group.json");
const KARDIA_GROUP: &str = include_str!("../../cli/data/demo_kardia.json");

/// The answer to a response with no recorded judgment (no JSON, so never a score).
pub const NO_RECORDING: &str = "care scripted backend: no recorded judgment for this response (this backend replays the bundled demo only).";

#[derive(Deserialize)]
struct Group {
    responses: Vec<Recorded>,
}

#[derive(Deserialize)]
struct Recorded {
    text: String,
    judge: String,
}

#[derive(Deserialize)]
struct KardiaGroup {
    responses: Vec<KardiaRecorded>,
}

#[derive(Deserialize)]
struct KardiaRecorded {
    output: String,
    /// `null` for a malformed output (never judged).
    judge: Option<String>,
}

/// The Kardia group's recorded judgments, keyed by the span the judge is shown (the text
/// between the response tags of a well-formed output).
fn kardia_recorded() -> Vec<(String, String)> {
    let (Ok(group), Ok(profile)) = (
        serde_json::from_str::<KardiaGroup>(KARDIA_GROUP),
        Profile::builtin("kardia"),
    ) else {
        return Vec::new();
    };
    group
        .responses
        .into_iter()
        .filter_map(|r| {
            let check = profile.check_output(r.output.as_bytes());
            let span = check.judge_text()?.to_owned();
            Some((span, r.judge?))
        })
        .collect()
}

/// The scripted replay of one role.
#[derive(Debug)]
pub struct Scripted {
    judge: bool,
    recorded: Vec<(String, String)>,
}

impl Scripted {
    /// The scripted rubric generator.
    pub fn generator() -> Self {
        Scripted {
            judge: false,
            recorded: Vec::new(),
        }
    }

    /// The scripted judge.
    pub fn judge() -> Self {
        // The bundled files are checked by this crate's tests; a broken copy replays nothing.
        let mut recorded: Vec<(String, String)> = serde_json::from_str::<Group>(GROUP)
            .map(|g| g.responses.into_iter().map(|r| (r.text, r.judge)).collect())
            .unwrap_or_default();
        recorded.extend(kardia_recorded());
        Scripted {
            judge: true,
            recorded,
        }
    }

    /// [`SCRIPTED_MODEL`].
    pub fn model(&self) -> &str {
        SCRIPTED_MODEL
    }

    /// The scripted answer to `messages`.
    pub fn complete(&self, messages: &[ChatMessage]) -> Completion {
        let content = if self.judge {
            let prompt = messages.first().map_or("", |m| m.content.as_str());
            self.recorded
                .iter()
                .find(|(text, _)| {
                    prompt.contains(&format!(
                        "## Candidate supporter response\n{}\n",
                        text.trim_end()
                    ))
                })
                .map_or(NO_RECORDING.to_owned(), |(_, judge)| judge.clone())
        } else if messages.len() > 2 {
            // A repair request (system, user, assistant, user): the paper's rubric.
            RUBRIC.to_owned()
        } else {
            RUBRIC.replacen("\"category_weight\": 0.4", "\"category_weight\": 0.5", 1)
        };
        Completion {
            content,
            usage: Usage::default(),
            attempts: 1,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_bundled_demo_is_replayed() {
        // Six CARE responses, and the three well-formed outputs of the Kardia group.
        assert_eq!(Scripted::judge().recorded.len(), 6 + 3);
        let first = Scripted::generator().complete(&[
            ChatMessage::new("system", "s"),
            ChatMessage::new("user", "u"),
        ]);
        assert_ne!(first.content, RUBRIC, "the first answer must need a repair");
        assert!(first.content.contains("\"category_weight\": 0.5"));
    }
}
