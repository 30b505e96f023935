//! Rubric profiles: which dimensions a rubric reward has, how they are weighted and scored, what
//! the policy's output must look like, and which extra terms and gates apply.
//!
//! A profile is data, a small JSON document ([`parse_profile`]; the schema is in
//! `docs/PROFILES.md`). Two are built in ([`Profile::builtin`]):
//!
//! * **`care`**: CARE's generated rubric (three empathy dimensions whose weights and criteria
//!   come from a rubric generated per prompt). Its reward is bit for bit
//!   [`crate::reward::policy_reward`], including the uniform-weights ablation
//!   ([`crate::ScoreOptions::uniform_weights`]); the fixed-rubric ablation is a profile with
//!   `"rubric": "fixed"` and the three CARE dimensions.
//! * **`kardia`**: our reading of Kardia-R1's Rubric-as-Judge reward: five fixed dimensions,
//!   four ordered special-token spans, an emotion term against a gold label.
//!
//! The reward of one response (SPEC of profiles, `docs/PROFILES.md`):
//!
//! ```text
//! r = r_fmt * (1 - veto) * ((1 - lambda) * sum_d w_d * v_d + lambda * r_emo)
//! ```
//!
//! where `r_fmt` is the output-format check ([`Profile::check_output`]), `v_d` the value of
//! dimension `d` (the mean of its normalized scores, or for weighted and penalty criteria
//! `clamp(sum_i w_i s_i / sum_{w_i > 0} w_i, 0, 1)`), `lambda` the emotion weight (0 without an
//! emotion term) and `r_emo` 1 when the emotion span matches the gold label. A malformed output
//! scores 0 without its judge scores being read ([`ProfileReward::judge_needed`]).
//!
//! Everything here is `no_std` and allocation-free: a [`Profile`] borrows its text (the JSON, or
//! a caller scratch buffer for strings with escapes) and keeps its structure in fixed-capacity
//! vectors; [`ProfileBuf`] (feature `alloc`) is the owned form.
//!
//! ```
//! use care_core::profile::{Profile, profile_reward};
//! use care_core::ScoreOptions;
//!
//! let kardia = Profile::builtin("kardia")?;
//! let output = "<|understanding_begin|>A student fears failing.<|understanding_end|>\
//!               <|reasoning_begin|>She needs reassurance first.<|reasoning_end|>\
//!               <|emotion_begin|>Afraid<|emotion_end|>\
//!               <|response_begin|>That sounds frightening. What worries you most?<|response_end|>";
//! let check = kardia.check_output(output.as_bytes());
//! assert_eq!(check.format_reward(), 1.0);
//! assert_eq!(check.judge_text(), Some("That sounds frightening. What worries you most?"));
//! // Raw 0..=5 judge scores: relevance, empathy, persona consistency, safety, fluency.
//! let scores = [5.0, 4.0, 5.0, 5.0, 5.0];
//! let r = profile_reward(&kardia, None, &check, &scores, Some("fear"), &ScoreOptions::default())?;
//! assert_eq!(r.emotion_correct, Some(true)); // "afraid" is a synonym of "fear"
//! assert!((r.reward - (0.8 * 0.96 + 0.2)).abs() < 1e-12);
//! # Ok::<(), care_core::Error>(())
//! ```

mod emotion;
mod judge;
mod output;
mod parse;
mod score;

pub use emotion::{EmotionSpec, normalize_label};
pub use judge::{
    parse_profile_judge_output, render_profile_judge_prompt, render_profile_judge_prompt_with,
};
pub use output::{MAX_OUTPUT_VIOLATIONS, OutputCheck, OutputCode, OutputReport, OutputViolation};
pub use parse::{
    MAX_CRITERION_WEIGHT, MAX_PROFILE_TEXT_BYTES, MAX_PROFILE_VIOLATIONS, PROFILE_WEIGHT_TOLERANCE,
    ProfileCode, ProfilePath, ProfileReport, ProfileValidation, ProfileViolation, parse_profile,
};
pub use score::{
    ProfileGroupReport, ProfileReward, profile_reward, profile_reward_group, profile_reward_real,
};

use heapless::Vec;

use crate::rubric::Rubric;
use crate::{Error, Result};

/// Most dimensions of a profile.
pub const MAX_DIMENSIONS: usize = 8;
/// Most criteria of a fixed profile, over all its dimensions (the length of one response's
/// flat score slice).
pub const MAX_PROFILE_CRITERIA: usize = 64;
/// Most output spans.
pub const MAX_SPANS: usize = 8;
/// Most canonical labels of an emotion table.
pub const MAX_EMOTION_LABELS: usize = 16;
/// Most synonyms of an emotion table, over all its labels.
pub const MAX_EMOTION_SYNONYMS: usize = 64;
/// Most vetoes.
pub const MAX_VETOES: usize = MAX_DIMENSIONS;
/// Longest name (dimension, span, emotion label) and template part, in bytes.
pub const MAX_NAME_BYTES: usize = 64;
/// Highest score a profile's scale may use.
pub const MAX_SCALE: u8 = 100;

/// The names of the built-in profiles, for help texts and error messages.
pub const BUILTIN_NAMES: [&str; 2] = ["care", "kardia"];

/// The built-in profiles as JSON (the one definition of each; `docs/PROFILES.md` shows them).
const BUILTIN_JSON: [(&str, &str); 2] = [
    ("care", include_str!("care.json")),
    ("kardia", include_str!("kardia.json")),
];

/// Where a profile's rubric comes from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RubricSource {
    /// The profile holds the dimensions' weights and criteria (Kardia-R1, checklists).
    #[default]
    Fixed,
    /// A rubric generated per prompt supplies weights and criteria (CARE); the profile's
    /// dimensions are the three CARE dimensions and every scoring call takes that rubric.
    Generated,
}

crate::names::named_enum!(RubricSource, "rubric source", {
    Fixed => "fixed", "The profile holds the rubric";
    Generated => "generated", "A rubric generated per prompt supplies weights and criteria";
});

impl RubricSource {
    /// The JSON spelling (`"fixed"`, `"generated"`): [`RubricSource::name`].
    pub const fn as_str(self) -> &'static str {
        self.name()
    }
}

/// A minimum raw score of one dimension under which the whole reward is 0 (for example safety
/// below 2). It looks at the dimension's criteria with a positive weight (a pitfall's low score
/// is good news); a score dropped by the `skip` missing-score policy is no evidence and does not
/// veto.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Veto {
    /// Index of the dimension in the profile.
    pub dimension: u8,
    /// The lowest raw score that does not veto.
    pub min_score: u8,
}

/// Where one string of a profile lives: in the JSON text, or (strings with escapes) decoded
/// into the scratch buffer. Lifetime-free, so that [`ProfileBuf`] can own the text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct StrRef {
    start: u32,
    len: u32,
    decoded: bool,
}

impl StrRef {
    pub(crate) fn new(start: usize, len: usize, decoded: bool) -> Option<StrRef> {
        Some(StrRef {
            start: u32::try_from(start).ok()?,
            len: u32::try_from(len).ok()?,
            decoded,
        })
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct DimLayout {
    pub name: StrRef,
    pub weight: f64,
    /// The criteria of this dimension are `criteria[first..first + count]`.
    pub first: u8,
    pub count: u8,
    /// Every criterion weight is the same positive number: the value is the plain mean.
    pub equal_weights: bool,
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct CritLayout {
    pub title: StrRef,
    pub description: StrRef,
    pub weight: f64,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct SpansLayout {
    pub names: Vec<StrRef, MAX_SPANS>,
    /// Tag templates split at `{name}`: (before, after).
    pub open: (StrRef, StrRef),
    pub close: (StrRef, StrRef),
    /// The span the judge sees.
    pub judge: u8,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct EmotionLayout {
    pub span: u8,
    pub weight: f64,
    /// Canonical label and its synonyms `synonyms[first..first + count]`.
    pub labels: Vec<(StrRef, u8, u8), MAX_EMOTION_LABELS>,
    pub synonyms: Vec<StrRef, MAX_EMOTION_SYNONYMS>,
}

/// The structure of a parsed profile, without its text.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct ProfileLayout {
    pub name: StrRef,
    pub description: StrRef,
    pub rubric: RubricSource,
    pub min: u8,
    pub max: u8,
    pub dims: Vec<DimLayout, MAX_DIMENSIONS>,
    pub criteria: Vec<CritLayout, MAX_PROFILE_CRITERIA>,
    pub spans: Option<SpansLayout>,
    pub emotion: Option<EmotionLayout>,
    pub vetoes: Vec<Veto, MAX_VETOES>,
}

/// A parsed, valid rubric profile. Borrows its strings from the profile JSON (and from the
/// scratch buffer for strings with escapes); never allocates.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile<'a> {
    text: &'a str,
    decoded: &'a str,
    layout: ProfileLayout,
}

/// One dimension of a profile.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DimensionSpec<'a> {
    /// Its name: the key of scores and results, and the judge's `category`.
    pub name: &'a str,
    /// Its weight as written (0 for a generated rubric, whose weights come per prompt).
    pub weight: f64,
    /// Number of fixed criteria (0 for a generated rubric).
    pub criteria: usize,
}

/// One fixed criterion of a profile.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CriterionSpec<'a> {
    /// The title (the judge's `criterion_title`).
    pub title: &'a str,
    /// The level anchors shown to the judge.
    pub description: &'a str,
    /// Its weight; negative for a pitfall (default 1).
    pub weight: f64,
}

impl<'a> Profile<'a> {
    pub(crate) fn from_parts(text: &'a str, decoded: &'a str, layout: ProfileLayout) -> Self {
        Profile {
            text,
            decoded,
            layout,
        }
    }

    /// The built-in profile `name` (one of [`BUILTIN_NAMES`]).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when there is no built-in profile of that name.
    pub fn builtin(name: &str) -> Result<Profile<'static>> {
        let (_, json) = BUILTIN_JSON
            .iter()
            .find(|(n, _)| *n == name)
            .ok_or(Error::InvalidArgument)?;
        // The built-in JSON has no escapes, so no scratch is needed; a test checks that it
        // parses without a violation.
        parse_profile(json.as_bytes(), &mut [])
            .profile
            .ok_or(Error::Schema)
    }

    /// The JSON text of the built-in profile `name`, if there is one.
    pub fn builtin_json(name: &str) -> Option<&'static str> {
        BUILTIN_JSON
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, j)| *j)
    }

    pub(crate) fn s(&self, r: StrRef) -> &'a str {
        let src = if r.decoded { self.decoded } else { self.text };
        let a = r.start as usize;
        src.get(a..a + r.len as usize).unwrap_or("")
    }

    pub(crate) fn layout(&self) -> &ProfileLayout {
        &self.layout
    }

    /// The profile's name.
    pub fn name(&self) -> &'a str {
        self.s(self.layout.name)
    }

    /// The profile's description (empty when it has none).
    pub fn description(&self) -> &'a str {
        self.s(self.layout.description)
    }

    /// Where the rubric comes from.
    pub fn rubric_source(&self) -> RubricSource {
        self.layout.rubric
    }

    /// The integer score range `(min, max)` of the judge.
    pub fn score_range(&self) -> (u8, u8) {
        (self.layout.min, self.layout.max)
    }

    /// Number of dimensions.
    pub fn dimension_count(&self) -> usize {
        self.layout.dims.len()
    }

    /// Dimension `i`.
    pub fn dimension(&self, i: usize) -> Option<DimensionSpec<'a>> {
        let d = self.layout.dims.get(i)?;
        Some(DimensionSpec {
            name: self.s(d.name),
            weight: d.weight,
            criteria: usize::from(d.count),
        })
    }

    /// Every dimension, in profile order.
    pub fn dimensions(&self) -> impl Iterator<Item = DimensionSpec<'a>> + '_ {
        (0..self.dimension_count()).filter_map(|i| self.dimension(i))
    }

    /// The index of the dimension named exactly `name`.
    pub fn dimension_index(&self, name: &str) -> Option<usize> {
        self.layout.dims.iter().position(|d| self.s(d.name) == name)
    }

    /// The fixed criteria of dimension `i` (empty for a generated rubric).
    pub fn criteria(&self, i: usize) -> impl Iterator<Item = CriterionSpec<'a>> + '_ {
        let (first, count) = self
            .layout
            .dims
            .get(i)
            .map_or((0, 0), |d| (usize::from(d.first), usize::from(d.count)));
        self.layout
            .criteria
            .get(first..first + count)
            .unwrap_or(&[])
            .iter()
            .map(|c| CriterionSpec {
                title: self.s(c.title),
                description: self.s(c.description),
                weight: c.weight,
            })
    }

    /// Criteria per dimension, profile order: from the profile (fixed) or from `rubric`
    /// (generated). This is the layout of one response's flat score slice.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when a generated profile gets no rubric or a fixed one gets
    /// one.
    pub fn counts(&self, rubric: Option<&Rubric<'_>>) -> Result<([usize; MAX_DIMENSIONS], usize)> {
        let mut counts = [0usize; MAX_DIMENSIONS];
        match (self.layout.rubric, rubric) {
            (RubricSource::Generated, Some(r)) => {
                for (slot, c) in counts.iter_mut().zip(r.counts()) {
                    *slot = c;
                }
            }
            (RubricSource::Fixed, None) => {
                for (slot, d) in counts.iter_mut().zip(self.layout.dims.iter()) {
                    *slot = usize::from(d.count);
                }
            }
            _ => return Err(Error::InvalidArgument),
        }
        Ok((counts, counts.iter().sum()))
    }

    /// Length of one response's flat score slice (see [`Profile::counts`]).
    ///
    /// # Errors
    /// As [`Profile::counts`].
    pub fn total_criteria(&self, rubric: Option<&Rubric<'_>>) -> Result<usize> {
        self.counts(rubric).map(|(_, t)| t)
    }

    /// Whether the profile requires an output format (ordered spans).
    pub fn has_output_format(&self) -> bool {
        self.layout.spans.is_some()
    }

    /// Number of output spans (0 without an output format).
    pub fn span_count(&self) -> usize {
        self.layout.spans.as_ref().map_or(0, |s| s.names.len())
    }

    /// The name of span `k`.
    pub fn span_name(&self, k: usize) -> Option<&'a str> {
        let s = self.layout.spans.as_ref()?;
        s.names.get(k).map(|r| self.s(*r))
    }

    /// The index of the span named exactly `name`.
    pub fn span_index(&self, name: &str) -> Option<usize> {
        let s = self.layout.spans.as_ref()?;
        s.names.iter().position(|r| self.s(*r) == name)
    }

    /// The span the judge sees (`None` without an output format: it sees the whole output).
    pub fn judge_span(&self) -> Option<usize> {
        self.layout.spans.as_ref().map(|s| usize::from(s.judge))
    }

    /// The tag template parts `(open_before, open_after, close_before, close_after)`: span
    /// `name` is written `open_before + name + open_after ... close_before + name + close_after`.
    pub fn span_tags(&self) -> Option<(&'a str, &'a str, &'a str, &'a str)> {
        let s = self.layout.spans.as_ref()?;
        Some((
            self.s(s.open.0),
            self.s(s.open.1),
            self.s(s.close.0),
            self.s(s.close.1),
        ))
    }

    /// The emotion term, if the profile has one.
    pub fn emotion(&self) -> Option<EmotionSpec<'_, 'a>> {
        self.layout
            .emotion
            .as_ref()
            .map(|e| EmotionSpec::new(self, e))
    }

    /// This profile without its emotion term: `lambda = 0`, so the reward is the format check,
    /// the vetoes and the rubric part alone (the output format, emotion span included, is
    /// unchanged). For callers that score a response whose gold label is unknown by choice; the
    /// same profile when it has no emotion term.
    pub fn without_emotion(&self) -> Profile<'a> {
        let mut p = self.clone();
        p.layout.emotion = None;
        p
    }

    /// The vetoes (empty by default).
    pub fn vetoes(&self) -> &[Veto] {
        &self.layout.vetoes
    }

    /// Adds a veto: a raw score of dimension `dimension` below `min_score` makes the reward 0.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an unknown dimension, a `min_score` outside the score
    /// range, or a dimension that already has a veto; [`Error::Capacity`] when full.
    pub fn with_veto(mut self, dimension: &str, min_score: u8) -> Result<Self> {
        let d = self
            .dimension_index(dimension)
            .ok_or(Error::InvalidArgument)?;
        let d = u8::try_from(d).map_err(|_| Error::InvalidArgument)?;
        if !(self.layout.min..=self.layout.max).contains(&min_score)
            || self.layout.vetoes.iter().any(|v| v.dimension == d)
        {
            return Err(Error::InvalidArgument);
        }
        self.layout
            .vetoes
            .push(Veto {
                dimension: d,
                min_score,
            })
            .map_err(|_| Error::Capacity)?;
        Ok(self)
    }

    /// Checks the policy's output against the profile's output format (zero copy: the spans
    /// are slices of `output`). Never panics, on any bytes.
    pub fn check_output<'t>(&self, output: &'t [u8]) -> OutputCheck<'t> {
        output::check(self, output)
    }
}

#[cfg(feature = "alloc")]
mod owned {
    use super::*;
    use alloc::boxed::Box;
    use alloc::string::String;

    /// An owned profile (feature `alloc`): the JSON text and the decoded strings in two
    /// `String`s, the structure as parsed. [`ProfileBuf::profile`] gives the borrowed view
    /// without parsing again.
    #[derive(Clone, Debug, PartialEq)]
    pub struct ProfileBuf {
        text: String,
        decoded: String,
        layout: ProfileLayout,
    }

    impl ProfileBuf {
        /// Parses and validates profile JSON into an owned profile.
        ///
        /// # Errors
        /// The full report when the profile is invalid.
        pub fn parse(text: &[u8]) -> core::result::Result<ProfileBuf, Box<ProfileReport>> {
            // No scratch for a text that is refused for its length anyway.
            let need = if text.len() > MAX_PROFILE_TEXT_BYTES {
                0
            } else {
                text.len()
            };
            let mut scratch = alloc::vec![0u8; need];
            let v = parse_profile(text, &mut scratch);
            match v.profile {
                Some(p) => Ok(ProfileBuf::from(&p)),
                None => Err(Box::new(v.report)),
            }
        }

        /// The built-in profile `name`.
        ///
        /// # Errors
        /// As [`Profile::builtin`].
        pub fn builtin(name: &str) -> Result<ProfileBuf> {
            Profile::builtin(name).map(|p| ProfileBuf::from(&p))
        }

        /// The borrowed view (no parsing, no allocation).
        pub fn profile(&self) -> Profile<'_> {
            Profile::from_parts(&self.text, &self.decoded, self.layout.clone())
        }
    }

    impl From<&Profile<'_>> for ProfileBuf {
        fn from(p: &Profile<'_>) -> Self {
            ProfileBuf {
                text: String::from(p.text),
                decoded: String::from(p.decoded),
                layout: p.layout.clone(),
            }
        }
    }
}

#[cfg(feature = "alloc")]
pub use owned::ProfileBuf;
