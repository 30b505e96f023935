//! The rubric model (SPEC §1): three empathy dimensions, each with a weight and a short list of
//! `(title, description)` criteria.
//!
//! [`Rubric`] borrows its text (`&'a str` into the caller's input, or into a caller scratch
//! buffer for JSON strings with escapes) and stores criteria in fixed-capacity `heapless`
//! vectors, so building and reading one never allocates. `RubricBuf` (feature `alloc`) is the
//! owned form for handles that outlive the input (C ABI, CLI).

use crate::{Error, Result};
use heapless::Vec;

/// Most criteria stored per dimension. Larger than any sensible `max_criteria`, so that a rubric
/// with too many criteria is reported as `criteria_count` (a contract violation) before it is
/// reported as `capacity` (a limit of this library).
pub const MAX_CRITERIA: usize = 16;

/// Most criteria in a whole rubric (`3 * MAX_CRITERIA`).
pub const MAX_TOTAL_CRITERIA: usize = 3 * MAX_CRITERIA;

/// One of the three empathy dimensions, in canonical order (the discriminant is the index used
/// in every `[_; 3]` array of this crate and in the C ABI).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Dimension {
    /// Cognitive empathy: understanding the seeker's situation and perspective.
    Cognitive = 0,
    /// Affective empathy: emotional attunement and validation.
    Affective = 1,
    /// Proactive empathy: suggestions, information and empowerment.
    Proactive = 2,
}

impl Dimension {
    /// The three dimensions in canonical order.
    pub const ALL: [Dimension; 3] = [
        Dimension::Cognitive,
        Dimension::Affective,
        Dimension::Proactive,
    ];

    /// The short names, in the order of [`Dimension::ALL`].
    pub const NAMES: [&'static str; 3] =
        crate::names::names_of!(Dimension, Dimension::ALL, short_name);

    /// The canonical index (0, 1, 2).
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The dimension with canonical index `i`, if `i < 3`.
    pub const fn from_index(i: usize) -> Option<Dimension> {
        match i {
            0 => Some(Dimension::Cognitive),
            1 => Some(Dimension::Affective),
            2 => Some(Dimension::Proactive),
            _ => None,
        }
    }

    /// The exact category name used in rubric JSON (`"Cognitive Empathy"`, ...).
    pub const fn json_name(self) -> &'static str {
        match self {
            Dimension::Cognitive => "Cognitive Empathy",
            Dimension::Affective => "Affective Empathy",
            Dimension::Proactive => "Proactive Empathy",
        }
    }

    /// A short lowercase name (`"cog"`, `"aff"`, `"pro"`) for logs and CLI fields; the
    /// dimension's [`crate::Named`] name.
    pub const fn short_name(self) -> &'static str {
        match self {
            Dimension::Cognitive => "cog",
            Dimension::Affective => "aff",
            Dimension::Proactive => "pro",
        }
    }

    /// The dimension whose JSON name is exactly `name` (case-sensitive, no trimming, as the
    /// format contract requires).
    pub fn from_json_name(name: &str) -> Option<Dimension> {
        Dimension::ALL.into_iter().find(|d| d.json_name() == name)
    }

    /// The dimension whose [`Dimension::short_name`] is exactly `name`.
    pub fn from_short_name(name: &str) -> Option<Dimension> {
        Dimension::ALL.into_iter().find(|d| d.short_name() == name)
    }

    // The `Named` vocabulary, as inherent functions so that `impl_named!` applies.
    const fn name(self) -> &'static str {
        self.short_name()
    }
    const fn help(self) -> &'static str {
        self.json_name()
    }
    fn from_name(name: &str) -> Option<Dimension> {
        Dimension::from_short_name(name)
    }
}

crate::names::impl_named!(Dimension, "dimension");

impl core::fmt::Display for Dimension {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.pad(self.short_name())
    }
}

/// One criterion: a title and a description with the `[0]`..`[5]` level anchors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Criterion<'a> {
    /// The criterion title, as written (not trimmed).
    pub title: &'a str,
    /// The description with the score-level anchors.
    pub description: &'a str,
}

/// One dimension of a rubric: its weight, rationale and criteria.
///
/// Equality compares what the rubric means (presence, the parsed weight, rationale and
/// criteria), not [`Category::weight_text`], the spelling the weight was read from.
#[derive(Clone, Debug)]
pub struct Category<'a> {
    /// Whether the rubric defines this dimension at all (a missing dimension has weight 0 and
    /// no criteria).
    pub present: bool,
    /// The `category_weight` as parsed (not normalized; 0 when missing or not a number).
    pub weight: f64,
    /// The `category_weight` exactly as written in the rubric JSON (a JSON number), or `""`
    /// when the weight did not come from JSON text. The exact comparisons of
    /// [`crate::outcome`] read this text, never the rounded `weight`.
    pub weight_text: &'a str,
    /// The `weight_rationale` text (empty when missing).
    pub rationale: &'a str,
    criteria: Vec<Criterion<'a>, MAX_CRITERIA>,
}

impl<'a> Category<'a> {
    const EMPTY: Category<'static> = Category {
        present: false,
        weight: 0.0,
        weight_text: "",
        rationale: "",
        criteria: Vec::new(),
    };

    /// The criteria of this dimension, in rubric order.
    pub fn criteria(&self) -> &[Criterion<'a>] {
        &self.criteria
    }
}

impl PartialEq for Category<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.present == other.present
            && self.weight == other.weight
            && self.rationale == other.rationale
            && self.criteria == other.criteria
    }
}

/// A rubric: for each dimension (canonical order Cog, Aff, Pro) a weight and its criteria.
///
/// A `Rubric` produced by [`crate::format::validate`] may break the format contract (see the
/// validation report); scoring functions accept it anyway and normalize its weights (SPEC §4).
#[derive(Clone, Debug, PartialEq)]
pub struct Rubric<'a> {
    categories: [Category<'a>; 3],
}

impl Default for Rubric<'_> {
    fn default() -> Self {
        Self::new()
    }
}

impl<'a> Rubric<'a> {
    /// An empty rubric: no dimension present, all weights 0.
    pub const fn new() -> Self {
        Rubric {
            categories: [Category::EMPTY, Category::EMPTY, Category::EMPTY],
        }
    }

    /// Marks dimension `d` present with weight `weight` and rationale `rationale` (criteria are
    /// kept). The weight is stored as given; validation is the format checker's job. Its text
    /// is cleared: [`Rubric::set_weight_text`] gives it when the weight was read from JSON.
    pub fn set_category(&mut self, d: Dimension, weight: f64, rationale: &'a str) {
        let c = self.category_mut(d);
        c.present = true;
        c.weight = weight;
        c.weight_text = "";
        c.rationale = rationale;
    }

    /// Records the JSON number text that dimension `d`'s weight was parsed from (the
    /// validator does; see [`Category::weight_text`]).
    pub fn set_weight_text(&mut self, d: Dimension, text: &'a str) {
        self.category_mut(d).weight_text = text;
    }

    /// The weights' texts as written, canonical order (`""` where there is none).
    pub fn weight_texts(&self) -> [&'a str; 3] {
        [
            self.categories[0].weight_text,
            self.categories[1].weight_text,
            self.categories[2].weight_text,
        ]
    }

    /// Appends a criterion to dimension `d` (marking it present).
    ///
    /// # Errors
    /// [`Error::Capacity`] when the dimension already holds [`MAX_CRITERIA`] criteria.
    pub fn push_criterion(
        &mut self,
        d: Dimension,
        title: &'a str,
        description: &'a str,
    ) -> Result<()> {
        let c = self.category_mut(d);
        c.present = true;
        c.criteria
            .push(Criterion { title, description })
            .map_err(|_| Error::Capacity)
    }

    fn category_mut(&mut self, d: Dimension) -> &mut Category<'a> {
        // `Dimension` discriminants are 0..3, so this index is always in bounds.
        &mut self.categories[d.index()]
    }

    /// The category of dimension `d`.
    pub fn category(&self, d: Dimension) -> &Category<'a> {
        // In bounds: see `category_mut`.
        &self.categories[d.index()]
    }

    /// The three categories in canonical order.
    pub fn categories(&self) -> &[Category<'a>; 3] {
        &self.categories
    }

    /// The weights as parsed, canonical order (missing dimension: 0). Not normalized; see
    /// [`Rubric::scoring_weights`].
    pub fn weights(&self) -> [f64; 3] {
        [
            self.categories[0].weight,
            self.categories[1].weight,
            self.categories[2].weight,
        ]
    }

    /// The weights used for scoring: [`crate::simplex::scoring_weights`] of
    /// [`Rubric::weights`] (negative or non-finite entries count as 0, then L1-normalized,
    /// uniform when nothing positive is left). Always on the simplex.
    pub fn scoring_weights(&self) -> [f64; 3] {
        crate::simplex::scoring_weights(self.weights())
    }

    /// The criteria of dimension `d`, in rubric order.
    pub fn criteria(&self, d: Dimension) -> &[Criterion<'a>] {
        self.category(d).criteria()
    }

    /// Number of criteria per dimension, canonical order (the layout of a flat score slice).
    pub fn counts(&self) -> [usize; 3] {
        [
            self.categories[0].criteria.len(),
            self.categories[1].criteria.len(),
            self.categories[2].criteria.len(),
        ]
    }

    /// Total number of criteria (the length of one response's flat score slice).
    pub fn total_criteria(&self) -> usize {
        self.counts().iter().sum()
    }

    /// Every criterion in flat-score order (Cog criteria, then Aff, then Pro, each in rubric
    /// order), with its dimension.
    pub fn iter_flat(&self) -> impl Iterator<Item = (Dimension, &Criterion<'a>)> + '_ {
        Dimension::ALL
            .into_iter()
            .flat_map(move |d| self.criteria(d).iter().map(move |c| (d, c)))
    }

    /// Position in the flat score slice of criterion `i` of dimension `d`.
    pub fn flat_index(&self, d: Dimension, i: usize) -> Option<usize> {
        let counts = self.counts();
        if i >= counts.get(d.index()).copied().unwrap_or(0) {
            return None;
        }
        Some(counts.iter().take(d.index()).sum::<usize>() + i)
    }
}

#[cfg(feature = "alloc")]
mod owned {
    use super::*;
    use alloc::string::String;
    use alloc::vec::Vec as AVec;

    /// An owned rubric (feature `alloc`): all text in one `String`, criteria as byte ranges into
    /// it. [`RubricBuf::rubric`] gives the borrowed view without re-parsing.
    ///
    /// Equality is that of the borrowed views ([`Rubric`]'s), so the spelling of a weight
    /// does not count.
    #[derive(Clone, Debug)]
    pub struct RubricBuf {
        text: String,
        // Per dimension: present, weight, rationale range, criteria (title range, description range).
        cats: [OwnedCat; 3],
    }

    #[derive(Clone, Debug, Default)]
    struct OwnedCat {
        present: bool,
        weight: f64,
        weight_text: (usize, usize),
        rationale: (usize, usize),
        criteria: AVec<((usize, usize), (usize, usize))>,
    }

    impl RubricBuf {
        /// The borrowed view of this rubric (no parsing, no allocation).
        pub fn rubric(&self) -> Rubric<'_> {
            let mut r = Rubric::new();
            for (d, oc) in Dimension::ALL.into_iter().zip(self.cats.iter()) {
                let c = r.category_mut(d);
                c.present = oc.present;
                c.weight = oc.weight;
                c.weight_text = self.slice(oc.weight_text);
                c.rationale = self.slice(oc.rationale);
                for &(t, de) in &oc.criteria {
                    // Capacity cannot be exceeded: a RubricBuf is only built from a Rubric,
                    // whose dimensions hold at most MAX_CRITERIA criteria.
                    let _ = c.criteria.push(Criterion {
                        title: self.slice(t),
                        description: self.slice(de),
                    });
                }
            }
            r
        }

        fn slice(&self, (a, b): (usize, usize)) -> &str {
            self.text.get(a..b).unwrap_or("")
        }

        /// Length in bytes of the text this rubric owns.
        pub fn text_len(&self) -> usize {
            self.text.len()
        }
    }

    impl PartialEq for RubricBuf {
        fn eq(&self, other: &Self) -> bool {
            self.rubric() == other.rubric()
        }
    }

    impl From<&Rubric<'_>> for RubricBuf {
        fn from(r: &Rubric<'_>) -> Self {
            let mut text = String::new();
            let mut push = |s: &str| {
                let a = text.len();
                text.push_str(s);
                (a, text.len())
            };
            let mut cats: [OwnedCat; 3] = Default::default();
            for (d, oc) in Dimension::ALL.into_iter().zip(cats.iter_mut()) {
                let c = r.category(d);
                oc.present = c.present;
                oc.weight = c.weight;
                oc.weight_text = push(c.weight_text);
                oc.rationale = push(c.rationale);
                for cr in c.criteria() {
                    let t = push(cr.title);
                    let de = push(cr.description);
                    oc.criteria.push((t, de));
                }
            }
            RubricBuf { text, cats }
        }
    }

    impl From<Rubric<'_>> for RubricBuf {
        fn from(r: Rubric<'_>) -> Self {
            RubricBuf::from(&r)
        }
    }
}

#[cfg(feature = "alloc")]
pub use owned::RubricBuf;

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn accessors_and_flat_layout() {
        let mut r = Rubric::new();
        assert_eq!(r.total_criteria(), 0);
        r.set_category(Dimension::Proactive, 0.2, "p");
        r.push_criterion(Dimension::Proactive, "p0", "d").unwrap();
        r.push_criterion(Dimension::Cognitive, "c0", "d").unwrap();
        r.push_criterion(Dimension::Cognitive, "c1", "d").unwrap();
        assert_eq!(r.counts(), [2, 0, 1]);
        assert_eq!(r.weights(), [0.0, 0.0, 0.2]);
        assert_eq!(r.scoring_weights(), [0.0, 0.0, 1.0]);
        let titles: std::vec::Vec<&str> = r.iter_flat().map(|(_, c)| c.title).collect();
        assert_eq!(titles, ["c0", "c1", "p0"]);
        assert_eq!(r.flat_index(Dimension::Proactive, 0), Some(2));
        assert_eq!(r.flat_index(Dimension::Affective, 0), None);
        assert_eq!(r.flat_index(Dimension::Cognitive, 2), None);
        assert!(!r.category(Dimension::Affective).present);
        for _ in 0..MAX_CRITERIA {
            let _ = r.push_criterion(Dimension::Affective, "a", "d");
        }
        assert_eq!(
            r.push_criterion(Dimension::Affective, "a", "d"),
            Err(Error::Capacity)
        );
        assert_eq!(
            Dimension::from_json_name("Affective Empathy"),
            Some(Dimension::Affective)
        );
        assert_eq!(Dimension::from_json_name("affective empathy"), None);
        assert_eq!(Dimension::from_index(3), None);
    }

    #[cfg(feature = "alloc")]
    #[test]
    fn owned_round_trip() {
        let text = std::string::String::from("title with \"quote\"");
        let mut r = Rubric::new();
        r.set_category(Dimension::Cognitive, 0.7, "why");
        r.push_criterion(Dimension::Cognitive, &text, "desc")
            .unwrap();
        r.set_category(Dimension::Affective, 0.3, "because");
        r.set_weight_text(Dimension::Affective, "0.30");
        let owned = RubricBuf::from(&r);
        drop(r); // the owned form must not borrow the original text
        drop(text);
        let back = owned.rubric();
        assert_eq!(back.weights(), [0.7, 0.3, 0.0]);
        assert_eq!(
            back.criteria(Dimension::Cognitive)[0].title,
            "title with \"quote\""
        );
        assert_eq!(back.category(Dimension::Affective).rationale, "because");
        assert_eq!(back.weight_texts(), ["", "0.30", ""]);
        assert!(!back.category(Dimension::Proactive).present);
        assert_eq!(RubricBuf::from(back.clone()).rubric(), back);
    }
}
