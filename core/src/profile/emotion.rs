//! The emotion term: the policy's emotion span against a gold label, through a synonym table.
//!
//! Both labels are normalized ([`normalize_label`]: trim ASCII whitespace, drop one trailing
//! `.`, compare ASCII-case-insensitively). Two labels match when they map to the same canonical
//! label of the table (a canonical label maps to itself, a synonym to its canonical label); a
//! gold label outside the table matches only itself. Table entries are stored normalized and
//! lowercase (the profile parser checks that), so no comparison allocates.

use super::{EmotionLayout, Profile};

/// The normalized form of an emotion label, up to ASCII case: ASCII whitespace trimmed at both
/// ends, then one trailing `.` dropped. (Compare the result ASCII-case-insensitively.)
///
/// ```
/// use care_core::profile::normalize_label;
/// assert_eq!(normalize_label("  Happy.\n"), "Happy");
/// assert_eq!(normalize_label("joy.."), "joy."); // only one dot
/// assert_eq!(normalize_label("joy ."), "joy "); // the dot is dropped after trimming
/// ```
pub fn normalize_label(label: &str) -> &str {
    let t = label.trim_matches(|c: char| c.is_ascii_whitespace());
    t.strip_suffix('.').unwrap_or(t)
}

/// The emotion term of a profile: which span holds the predicted emotion, its weight `lambda`,
/// and the label table.
#[derive(Clone, Copy, Debug)]
pub struct EmotionSpec<'p, 'a> {
    profile: &'p Profile<'a>,
    layout: &'p EmotionLayout,
}

impl<'p, 'a> EmotionSpec<'p, 'a> {
    pub(crate) fn new(profile: &'p Profile<'a>, layout: &'p EmotionLayout) -> Self {
        EmotionSpec { profile, layout }
    }

    /// Index of the span that holds the predicted emotion.
    pub fn span(&self) -> usize {
        usize::from(self.layout.span)
    }

    /// `lambda`: the weight of `r_emo` in the reward.
    pub fn weight(&self) -> f64 {
        self.layout.weight
    }

    /// Number of canonical labels.
    pub fn label_count(&self) -> usize {
        self.layout.labels.len()
    }

    /// Canonical label `i`.
    pub fn label(&self, i: usize) -> Option<&'a str> {
        self.layout.labels.get(i).map(|l| self.profile.s(l.0))
    }

    /// The synonyms of canonical label `i`.
    pub fn synonyms(&self, i: usize) -> impl Iterator<Item = &'a str> + '_ {
        let (first, count) = self
            .layout
            .labels
            .get(i)
            .map_or((0, 0), |l| (usize::from(l.1), usize::from(l.2)));
        self.layout
            .synonyms
            .get(first..first + count)
            .unwrap_or(&[])
            .iter()
            .map(|r| self.profile.s(*r))
    }

    /// The index of the canonical label that `label` maps to (after normalization), if any.
    pub fn canonical_index(&self, label: &str) -> Option<usize> {
        let n = normalize_label(label);
        (0..self.label_count()).find(|&i| {
            self.label(i).is_some_and(|l| l.eq_ignore_ascii_case(n))
                || self.synonyms(i).any(|s| s.eq_ignore_ascii_case(n))
        })
    }

    /// The canonical label that `label` maps to, if any.
    pub fn canonical(&self, label: &str) -> Option<&'a str> {
        self.canonical_index(label).and_then(|i| self.label(i))
    }

    /// Whether the predicted label matches the gold label (see the module docs).
    pub fn matches(&self, predicted: &str, gold: &str) -> bool {
        match self.canonical_index(gold) {
            Some(g) => self.canonical_index(predicted) == Some(g),
            None => normalize_label(predicted).eq_ignore_ascii_case(normalize_label(gold)),
        }
    }
}
