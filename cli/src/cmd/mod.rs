//! The data subcommands: one resolved [`Command`] and [`process_line`], the exact per-line code
//! path of the binary.

use crate::engine::LineProcessor;
use crate::input::{Line, PASSTHROUGH, check_members};
use crate::json::{LineError, Obj, line_text, push_error_line};

pub mod advantages;
pub mod generator_reward;
pub mod loss;
pub(crate) mod rubric;
pub mod score;
pub mod score_profile;
pub mod validate;

/// A data subcommand with its options resolved into `care-core` types.
#[derive(Clone, Debug)]
pub enum Command {
    /// `care validate`.
    Validate(validate::Options),
    /// `care score`.
    Score(score::Options),
    /// `care score --profile`.
    ScoreProfile(score_profile::Options),
    /// `care generator-reward` (alias `care pref`).
    GeneratorReward(generator_reward::Options),
    /// `care advantages`.
    Advantages(advantages::Options),
    /// `care loss` (boxed: the loss options with the rollout correction are a few hundred
    /// bytes).
    Loss(Box<loss::Options>),
}

/// Processes one input line (`bytes`, without the newline) as the binary does: returns the
/// output JSON object (no newline) and whether it is a success line (`false`: an error line).
///
/// Never panics on any input; every failure is an error line with a stable code.
pub fn process_line(cmd: &Command, line: u64, bytes: &[u8]) -> (String, bool) {
    let mut out = String::new();
    let ok = cmd.process(line, bytes, &mut out);
    (out, ok)
}

impl LineProcessor for Command {
    fn process(&self, line: u64, bytes: &[u8], out: &mut String) -> bool {
        let mark = out.len();
        match self.write_line(line, bytes, out) {
            Ok(()) => true,
            Err(err) => {
                out.truncate(mark);
                push_error_line(out, line, &err);
                false
            }
        }
    }
}

impl Command {
    /// The members this subcommand reads from an input object (besides [`PASSTHROUGH`]);
    /// `None` when the line is not checked member by member (`care validate` on a rubric
    /// object, whose own keys the format contract checks).
    fn members(&self, input: &Line<'_>) -> Option<&'static [&'static str]> {
        Some(match self {
            Command::Validate(_) if input.get("text").is_none() => return None,
            Command::Validate(_) => validate::MEMBERS,
            Command::Score(_) => score::MEMBERS,
            Command::ScoreProfile(_) => score_profile::MEMBERS,
            Command::GeneratorReward(_) => generator_reward::MEMBERS,
            Command::Advantages(o) => advantages::members(o),
            Command::Loss(_) => loss::MEMBERS,
        })
    }

    fn write_line(&self, line: u64, bytes: &[u8], out: &mut String) -> Result<(), LineError> {
        let text = line_text(bytes)?;
        let input = Line::parse(text)?;
        if let (Some(known), Some(m)) = (self.members(&input), input.members()) {
            check_members(m, known, "")?;
        }
        Obj::try_write(out, |o| {
            o.u64("line", line);
            // `id` and `meta` are copied through byte for byte, so that outputs join back to
            // their inputs exactly (`18446744073709551616`, `1e2` and `-0` stay as written).
            for key in PASSTHROUGH {
                if let Some(v) = input.get(key) {
                    o.raw(key, v.get());
                }
            }
            match self {
                Command::Validate(opts) => validate::run(opts, &input, o),
                Command::Score(opts) => score::run(opts, &input, o),
                Command::ScoreProfile(opts) => score_profile::run(opts, &input, o),
                Command::GeneratorReward(opts) => generator_reward::run(opts, &input, o),
                Command::Advantages(opts) => advantages::run(opts, &input, o),
                Command::Loss(opts) => loss::run(opts, &input, o),
            }
        })
    }
}
