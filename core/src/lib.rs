//! `care-core`: the `no_std` reward core of `care`.
//!
//! CARE (context-adaptive empathy rubrics) scores a supporter's reply with a rubric of three
//! weighted empathy dimensions. This crate parses and validates those rubrics without
//! allocating, computes every reward of the method (policy Eq. 5, preference Eq. 3, generator
//! Eq. 4 with alignment and format), parses judge output, and is the CPU reference of the GRPO
//! step ([`grpo`]: group advantages, the clipped-ratio loss and its gradient).
//!
//! ```
//! use care_core::grpo::{AdvantageOptions, GroupLayout, Preset, group_advantages};
//! use care_core::{FormatPolicy, ScoreOptions, policy_reward, validate};
//!
//! let text = include_str!("../../cli/data/rubric_sft_1.json"); // the bundled paper fixture
//! let mut scratch = [0u8; 16 * 1024]; // strings with escapes are decoded here
//! let v = validate(text.as_bytes(), &FormatPolicy::PAPER, &mut scratch)?;
//! assert_eq!(v.r_fmt(), 1.0, "{}", v.report);
//! let rubric = v.rubric.as_ref().ok_or(care_core::Error::FormatViolation)?;
//!
//! // Raw 0..=5 judge scores, criteria in canonical dimension order (Cog, Aff, Pro).
//! let scores = [5.0; 16];
//! let r = policy_reward(rubric, &scores[..rubric.total_criteria()], &ScoreOptions::default())?;
//! assert_eq!(r.reward, 1.0);
//!
//! // GRPO advantages for two groups of three rewards (verl's formula).
//! let rewards = [0.2f32, 0.5, 0.8, 1.0, 1.0, 1.0];
//! let mut adv = [0.0f64; 6];
//! let opts = AdvantageOptions::preset(Preset::Verl);
//! group_advantages(&rewards, None, GroupLayout::Fixed { group_size: 3 }, &opts, &mut adv, None)?;
//! assert!(adv[0] < 0.0 && adv[2] > 0.0);
//! assert_eq!(&adv[3..], &[0.0, 0.0, 0.0]); // an all-equal group gives exactly 0
//! # Ok::<(), care_core::Error>(())
//! ```
//!
//! # Names and options
//!
//! Every public enum has one stable snake_case name per variant ([`Named`]: `ALL`, `NAMES`,
//! `Display`, `FromStr`); the CLI, the C ABI and the Python bindings parse with these names.
//! Every options struct checks itself: `check()` names the first field outside its domain
//! ([`InvalidOption`]), `validate()` is the same check as [`Error::InvalidArgument`], and every
//! function that takes options calls it before it reads or writes anything else.
//!
//! # Cargo features
//!
//! The tower is `alloc` < `std`; `serde` is independent of it and works without either.
//!
//! * **(none, default)**: `no_std`, no allocation anywhere.
//! * **`alloc`**: `RubricBuf`, an owned rubric (for handles that outlive the input text). The
//!   hot paths never allocate, with or without it.
//! * **`std`** (implies `alloc`): links `std`; nothing else yet (errors implement
//!   `core::error::Error` in every configuration).
//! * **`serde`** (`no_std`-compatible, no allocation): `Serialize` and `Deserialize` for the
//!   public data types, the way `heapless` and `half` offer them: the options structs, the
//!   validation [`Report`] with its violations, results and statistics ([`PolicyReward`],
//!   [`PreferenceReward`], [`GeneratorReward`], [`GroupReport`], [`JudgeReport`],
//!   [`grpo::LossStats`], [`grpo::GroupStats`], ...), every enum by its stable name, and
//!   [`Rubric`] (serialize) / `RubricBuf` (both, with `alloc`) as rubric JSON of the format
//!   contract, so a valid rubric serializes to a text that validates again. Floats that may
//!   be infinite (the loss statistics and clamps) are written as `"inf"`, `"-inf"` or `"NaN"`
//!   in human-readable formats, which have no infinity, and read back exactly. Options
//!   are not checked on load (a struct literal is not either): every function that takes them
//!   checks them, and `check()` says which field is wrong.
//!
//! `care-core` has no JSON writer of its own and no `serde-json-core` dependency: with `serde`,
//! a `no_std` caller serializes any of these types with the serializer of its choice, for
//! example a validation report into a fixed buffer with
//! `serde_json_core::to_slice(&report, &mut buf)` (tested in `tests/serde.rs`), so a second
//! JSON writer inside the core would add a dependency without adding a capability.
#![cfg_attr(not(any(test, feature = "std")), no_std)]
#![deny(missing_docs)]

#[cfg(feature = "alloc")]
extern crate alloc;

pub mod align;
pub mod batch;
mod dtype;
pub mod error;
pub mod format;
pub mod grpo;
mod json;
pub mod judge;
pub mod logsoftmax;
pub mod names;
pub mod outcome;
pub mod profile;
pub mod reward;
pub mod rubric;
#[cfg(feature = "serde")]
mod serde_impls;
pub mod simplex;
pub mod strategy;
pub mod template;
pub use dtype::Dtype;
pub use error::{Error, InvalidOption, Result};
pub use names::{Named, UnknownName};

pub use align::{Alignment, alignment, alignment_reward};
pub use batch::{GroupReport, policy_reward_group, policy_reward_group_fixed};
pub use format::{
    FormatPolicy, Report, SyntaxIndex, Validation, Violation, ViolationCode, format_reward,
    validate, validate_indexed_into, validate_str, validate_str_into,
};
pub use judge::{
    JudgePromptLayout, JudgeReport, parse_judge_output, render_judge_prompt,
    render_judge_prompt_with,
};
pub use outcome::{PreferenceOutcome, preference_outcome};
pub use reward::{
    GeneratorOptions, GeneratorReward, MissingPolicy, PolicyReward, PreferenceOptions,
    PreferenceReward, RangePolicy, ScoreOptions, ScoreScale, generator_reward, policy_reward,
    preference_reward, reward_from_real_scores,
};
#[cfg(feature = "alloc")]
pub use rubric::RubricBuf;
pub use rubric::{Criterion, Dimension, Rubric};
pub use strategy::{StrategyCounts, UnknownLabelPolicy, strategy_counts};

// The README's Rust example runs as a doctest.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

// The Rust example of docs/PROFILES.md runs as a doctest.
#[doc = include_str!("../../docs/PROFILES.md")]
#[cfg(doctest)]
pub struct ProfilesDoctests;
