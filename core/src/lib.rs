//! `care-core`: the `no_std` reward core of `care`.
#![cfg_attr(not(any(test, feature = "std")), no_std)]
#![deny(missing_docs)]

#[cfg(feature = "alloc")]
extern crate alloc;

pub mod align;
pub mod batch;
pub mod error;
pub mod format;
pub mod grpo;
mod json;
pub mod judge;
pub mod reward;
pub mod rubric;
pub mod simplex;
pub mod strategy;
pub use error::{Error, Result};

pub use align::{Alignment, alignment, r_align};
pub use batch::{GroupReport, score_group, score_group_fixed};
pub use format::{FormatPolicy, Report, Validation, Violation, ViolationCode, validate};
pub use judge::{JudgeReport, parse_judge_output, render_judge_prompt};
pub use reward::{
    GeneratorOptions, GeneratorReward, MissingPolicy, PolicyReward, PrefOptions, PrefReward,
    RangePolicy, ScoreOptions, ScoreScale, generator_reward, policy_reward, pref_reward,
};
#[cfg(feature = "alloc")]
pub use rubric::RubricBuf;
pub use rubric::{Criterion, Dimension, Rubric};
pub use strategy::{StrategyCounts, UnknownLabelPolicy, count_labels};

// The README's Rust example runs as a doctest.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
