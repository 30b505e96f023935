//! The options of the format contract.

use crate::error::{InvalidOption, domain};
use crate::{Error, Result};

/// The options of the format contract. [`FormatPolicy::PAPER`] (the `Default`) is the policy
/// behind `r_fmt`.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(deny_unknown_fields)
)]
pub struct FormatPolicy {
    /// Strip a leading `<think>...</think>` block, or everything up to a lone `</think>`.
    pub allow_think: bool,
    /// Accept one ```` ```json ```` code fence around the value.
    pub allow_code_fence: bool,
    /// Accept the envelope `{"analysis": ..., "rubric": {...}}`.
    pub allow_envelope: bool,
    /// Allowed `|sum(w) - 1|`: finite and `>= 0`.
    pub weight_tolerance: f64,
    /// Require categories in the order Cognitive, Affective, Proactive.
    pub require_order: bool,
    /// Require the key order of categories and criteria.
    pub require_key_order: bool,
    /// Fewest criteria per category (`<= max_criteria`).
    pub min_criteria: u8,
    /// Most criteria per category.
    pub max_criteria: u8,
    /// Lint for meta words (gold, reference, ...).
    pub meta_words: bool,
}

impl FormatPolicy {
    /// The paper's contract (SPEC §3 defaults).
    pub const PAPER: FormatPolicy = FormatPolicy {
        allow_think: false,
        allow_code_fence: false,
        allow_envelope: false,
        weight_tolerance: 1e-3,
        require_order: true,
        require_key_order: true,
        min_criteria: 2,
        max_criteria: 4,
        meta_words: false,
    };

    /// The paper's contract (same as [`FormatPolicy::PAPER`]).
    pub const fn paper() -> Self {
        Self::PAPER
    }

    /// Checks the fields: `weight_tolerance` finite and `>= 0`, `min_criteria <= max_criteria`.
    ///
    /// # Errors
    /// The first field outside its domain.
    pub fn check(&self) -> core::result::Result<(), InvalidOption> {
        InvalidOption::require(
            domain::finite_non_negative(self.weight_tolerance),
            "weight_tolerance",
            domain::FINITE_NON_NEGATIVE,
        )?;
        InvalidOption::require(
            self.min_criteria <= self.max_criteria,
            "min_criteria",
            "<= max_criteria",
        )
    }

    /// [`FormatPolicy::check`] as an [`Error`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when a field is outside its domain.
    pub fn validate(&self) -> Result<()> {
        self.check().map_err(Error::from)
    }

    /// A lenient policy for reading model output that is not being rewarded: think blocks,
    /// code fences and the envelope accepted; everything else as [`FormatPolicy::PAPER`].
    pub const fn lenient() -> Self {
        FormatPolicy {
            allow_think: true,
            allow_code_fence: true,
            allow_envelope: true,
            ..Self::PAPER
        }
    }
}

impl Default for FormatPolicy {
    fn default() -> Self {
        Self::PAPER
    }
}
