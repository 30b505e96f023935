//! Strategy labels and per-dimension counts (SPEC §5, paper Eq. 2 and Table 10).
//!
//! A label maps to a dimension through a fixed table of ESConv and MINT labels. Matching is
//! trimmed and ASCII-case-insensitive, and ESConv's bracketed form `[Question]` is accepted. The
//! tactic list `A+` is a **set**: a label repeated (in any accepted spelling) counts once.

use crate::names::named_enum;
use crate::rubric::Dimension;
use crate::{Error, Result};

/// The taxonomy a label comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Taxonomy {
    /// ESConv support strategies.
    Esconv,
    /// MINT empathy tactics.
    Mint,
}

named_enum!(Taxonomy, "taxonomy", {
    Esconv => "esconv", "ESConv support strategies";
    Mint => "mint", "MINT empathy tactics";
});

/// What to do with a label that maps to no dimension.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum UnknownLabelPolicy {
    /// Fail with [`Error::UnknownLabel`] (default).
    #[default]
    Error,
    /// Skip it (counted in [`StrategyCounts::unknown`]).
    Ignore,
}

named_enum!(UnknownLabelPolicy, "unknown-label policy", {
    Error => "error", "Fail with unknown_label";
    Ignore => "ignore", "Leave the label out of the counts";
});

/// A known strategy label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Label {
    /// Canonical spelling.
    pub name: &'static str,
    /// Its dimension.
    pub dimension: Dimension,
    /// Its taxonomy.
    pub taxonomy: Taxonomy,
    /// A stable id (index into [`LABELS`]); aliases share the id of their canonical label.
    pub id: u8,
}

use Dimension::{Affective as A, Cognitive as C, Proactive as P};
use Taxonomy::{Esconv as E, Mint as M};

const fn l(name: &'static str, dimension: Dimension, taxonomy: Taxonomy, id: u8) -> Label {
    Label {
        name,
        dimension,
        taxonomy,
        id,
    }
}

/// The canonical labels of SPEC §5, in table order (the `id` is the position).
pub const LABELS: [Label; 25] = [
    l("Question", C, E, 0),
    l("Restatement or Paraphrasing", C, E, 1),
    l("Others", C, E, 2),
    l("Reflection of feelings", A, E, 3),
    l("Affirmation and Reassurance", A, E, 4),
    l("Self-disclosure", A, E, 5),
    l("Providing Suggestions", P, E, 6),
    l("Information", P, E, 7),
    l("questioning", C, M, 8),
    l("paraphrasing", C, M, 9),
    l("contextualizing", C, M, 10),
    l("reappraisal", C, M, 11),
    l("validation", A, M, 12),
    l("emotional_expression", A, M, 13),
    l("terms_of_endearment", A, M, 14),
    l("self_disclosure", A, M, 15),
    l("solidarity", A, M, 16),
    l("gratitude", A, M, 17),
    l("spirituality", A, M, 18),
    l("advice", P, M, 19),
    // MINT `information` matches ESConv `Information` case-insensitively: same label, id 7.
    l("information", P, M, 7),
    l("empowerment", P, M, 21),
    l("assistance", P, M, 22),
    // Aliases accepted by SPEC §5.
    l("Questions", C, E, 0),
    l("Other", C, E, 2),
];

/// Looks a label up: trimmed, ASCII-case-insensitive, `[Label]` accepted.
pub fn lookup(label: &str) -> Option<&'static Label> {
    let mut s = label.trim();
    if let Some(inner) = s.strip_prefix('[').and_then(|x| x.strip_suffix(']')) {
        s = inner.trim();
    }
    LABELS.iter().find(|l| l.name.eq_ignore_ascii_case(s))
}

/// The dimension of `label`, if it is known.
pub fn dimension_of(label: &str) -> Option<Dimension> {
    lookup(label).map(|l| l.dimension)
}

/// Per-dimension counts of a tactic set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct StrategyCounts {
    /// `n_d`: distinct known labels per dimension, canonical order.
    pub counts: [u32; 3],
    /// Labels skipped because they are unknown (only under [`UnknownLabelPolicy::Ignore`]).
    pub unknown: u32,
    /// Labels skipped because they repeat an earlier one.
    pub duplicates: u32,
}

/// Counts `n_d = |{a in A+ : m(a) = d}|` over a list of labels, treating the list as a set.
///
/// # Errors
/// [`Error::UnknownLabel`] for an unknown label under [`UnknownLabelPolicy::Error`].
pub fn strategy_counts<S: AsRef<str>>(
    labels: &[S],
    policy: UnknownLabelPolicy,
) -> Result<StrategyCounts> {
    let mut seen: u32 = 0;
    let mut out = StrategyCounts::default();
    for s in labels {
        match lookup(s.as_ref()) {
            Some(l) => {
                let bit = 1u32 << (l.id & 31);
                if seen & bit != 0 {
                    out.duplicates += 1;
                } else {
                    seen |= bit;
                    if let Some(c) = out.counts.get_mut(l.dimension.index()) {
                        *c += 1;
                    }
                }
            }
            None => match policy {
                UnknownLabelPolicy::Error => return Err(Error::UnknownLabel),
                UnknownLabelPolicy::Ignore => out.unknown += 1,
            },
        }
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_below_32_and_aliases_share_ids() {
        for l in &LABELS {
            assert!(l.id < 32);
            let canon = LABELS.iter().find(|x| x.id == l.id).unwrap();
            assert_eq!(canon.dimension, l.dimension);
        }
    }

    #[test]
    fn lookup_forms() {
        assert_eq!(dimension_of("  [question] "), Some(Dimension::Cognitive));
        assert_eq!(dimension_of("Questions"), Some(Dimension::Cognitive));
        assert_eq!(dimension_of("other"), Some(Dimension::Cognitive));
        assert_eq!(dimension_of("SELF-DISCLOSURE"), Some(Dimension::Affective));
        assert_eq!(dimension_of("Information"), Some(Dimension::Proactive));
        assert_eq!(dimension_of("advice"), Some(Dimension::Proactive));
        assert_eq!(dimension_of("hugging"), None);
        assert_eq!(dimension_of("[]"), None);
    }

    #[test]
    fn counts_are_over_a_set() {
        let c = strategy_counts(
            &[
                "Question",
                "[Questions]",
                "question",
                "validation",
                "advice",
                "information",
            ],
            UnknownLabelPolicy::Error,
        )
        .unwrap();
        assert_eq!(c.counts, [1, 1, 2]);
        assert_eq!(c.duplicates, 2);
        let fixture =
            strategy_counts(&["questioning", "information"], UnknownLabelPolicy::Error).unwrap();
        assert_eq!(fixture.counts, [1, 0, 1]);
    }

    #[test]
    fn unknown_policy() {
        assert_eq!(
            strategy_counts(&["hug"], UnknownLabelPolicy::Error),
            Err(Error::UnknownLabel)
        );
        let c = strategy_counts(&["hug", "advice"], UnknownLabelPolicy::Ignore).unwrap();
        assert_eq!((c.counts, c.unknown), ([0, 0, 1], 1));
    }
}
