//! Group and sequence layouts: fixed group size or CSR offsets, validated once.

use crate::{Error, Result};

/// How the `N` samples of a batch are split into groups (one group per prompt).
///
/// Samples of a group are contiguous. `Fixed { group_size: G }` is the TRL/OpenRLHF layout
/// (`N = B * G`); `Offsets(o)` is a CSR array with `B + 1` entries, `o[0] = 0`, non-decreasing,
/// `o[B] = N`, so group `g` is `o[g]..o[g + 1]` (ragged groups and empty groups allowed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupLayout<'a> {
    /// Every group has exactly `group_size` samples; `group_size` must be non-zero and divide `N`.
    Fixed {
        /// Samples per group (`G`).
        group_size: usize,
    },
    /// CSR group offsets, `B + 1` entries.
    Offsets(&'a [u32]),
}

impl GroupLayout<'_> {
    /// Checks the layout against `n` samples and returns the number of groups `B`.
    ///
    /// Errors: [`Error::InvalidLayout`] for a zero group size, a size that does not divide `n`,
    /// or offsets that [`validate_offsets`] rejects.
    pub fn validate(&self, n: usize) -> Result<usize> {
        match *self {
            GroupLayout::Fixed { group_size } => {
                if group_size == 0 || !n.is_multiple_of(group_size) {
                    return Err(Error::InvalidLayout);
                }
                Ok(n / group_size)
            }
            GroupLayout::Offsets(o) => validate_offsets(o, n),
        }
    }

    /// The sample range of group `g`. Only meaningful after [`GroupLayout::validate`] succeeded
    /// and for `g` below the group count it returned; out-of-range `g` gives an empty range.
    pub fn range(&self, g: usize) -> core::ops::Range<usize> {
        match *self {
            GroupLayout::Fixed { group_size } => g * group_size..(g + 1) * group_size,
            GroupLayout::Offsets(o) => match (o.get(g), o.get(g + 1)) {
                (Some(&a), Some(&b)) => a as usize..b as usize,
                _ => 0..0,
            },
        }
    }
}

/// Checks a CSR offset array for `n` elements and returns the number of segments.
///
/// Valid means: at least one entry, `o[0] == 0`, non-decreasing, last entry `== n`.
/// Errors: [`Error::InvalidLayout`] otherwise.
pub fn validate_offsets(o: &[u32], n: usize) -> Result<usize> {
    let (first, last) = match (o.first(), o.last()) {
        (Some(&f), Some(&l)) => (f, l),
        _ => return Err(Error::InvalidLayout),
    };
    if first != 0 || last as usize != n {
        return Err(Error::InvalidLayout);
    }
    if o.windows(2).any(|w| w[0] > w[1]) {
        return Err(Error::InvalidLayout);
    }
    Ok(o.len() - 1)
}

/// Why a layout was refused ([`Error::InvalidLayout`]), for messages that say what to fix:
/// [`GroupLayout::fault`] and [`offsets_fault`] find it, [`LayoutFault::named`] words it with
/// the caller's names for the arrays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayoutFault {
    /// `Fixed { group_size: 0 }`.
    ZeroGroupSize,
    /// The group size does not divide the number of values.
    NotMultiple {
        /// Number of values.
        n: usize,
        /// The group size.
        group_size: usize,
    },
    /// An offsets array with no entry (it needs `B + 1 >= 1`).
    NoOffsets,
    /// The first offset is not 0.
    FirstNotZero {
        /// The first offset.
        first: u32,
    },
    /// `o[index] < o[index - 1]`.
    Decreasing {
        /// Index of the smaller entry.
        index: usize,
    },
    /// The last offset is not the number of values.
    LastNotLength {
        /// The last offset.
        last: u32,
        /// Number of values.
        n: usize,
    },
}

impl LayoutFault {
    /// The fault as one sentence, with `offsets` the name of the offsets array or group size
    /// (`"group_offsets"`, `"group_size"`) and `values` the name of the array it splits.
    pub fn named<'a>(self, offsets: &'a str, values: &'a str) -> NamedLayoutFault<'a> {
        NamedLayoutFault {
            fault: self,
            offsets,
            values,
        }
    }
}

/// [`LayoutFault`] with the names of its arrays; see [`LayoutFault::named`].
#[derive(Clone, Copy, Debug)]
pub struct NamedLayoutFault<'a> {
    fault: LayoutFault,
    offsets: &'a str,
    values: &'a str,
}

impl core::fmt::Display for NamedLayoutFault<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let (o, v) = (self.offsets, self.values);
        match self.fault {
            LayoutFault::ZeroGroupSize => write!(f, "{o} is 0; it must be at least 1"),
            LayoutFault::NotMultiple { n, group_size } => {
                write!(f, "{v} has {n} values, not a multiple of {o} {group_size}")
            }
            LayoutFault::NoOffsets => {
                write!(
                    f,
                    "{o} is empty; it needs at least [0] (one more entry than groups)"
                )
            }
            LayoutFault::FirstNotZero { first } => {
                write!(f, "{o}[0] is {first}; the offsets must start at 0")
            }
            LayoutFault::Decreasing { index } => write!(
                f,
                "{o}[{index}] is smaller than {o}[{}]; the offsets must not decrease",
                index - 1
            ),
            LayoutFault::LastNotLength { last, n } => write!(
                f,
                "{o} ends at {last} but {v} has {n} values; the last offset must equal the length"
            ),
        }
    }
}

impl GroupLayout<'_> {
    /// Why [`GroupLayout::validate`] refuses this layout for `n` values (`None`: it accepts it).
    pub fn fault(&self, n: usize) -> Option<LayoutFault> {
        match *self {
            GroupLayout::Fixed { group_size: 0 } => Some(LayoutFault::ZeroGroupSize),
            GroupLayout::Fixed { group_size } if !n.is_multiple_of(group_size) => {
                Some(LayoutFault::NotMultiple { n, group_size })
            }
            GroupLayout::Fixed { .. } => None,
            GroupLayout::Offsets(o) => offsets_fault(o, n),
        }
    }
}

/// Why [`validate_offsets`] refuses `o` for `n` elements (`None`: it accepts it); the first
/// fault in the order: empty, first entry, order, last entry.
pub fn offsets_fault(o: &[u32], n: usize) -> Option<LayoutFault> {
    let Some(&first) = o.first() else {
        return Some(LayoutFault::NoOffsets);
    };
    if first != 0 {
        return Some(LayoutFault::FirstNotZero { first });
    }
    if let Some(i) = o.windows(2).position(|w| w[0] > w[1]) {
        return Some(LayoutFault::Decreasing { index: i + 1 });
    }
    match o.last() {
        Some(&last) if last as usize != n => Some(LayoutFault::LastNotLength { last, n }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_layout_checks_divisibility() {
        assert_eq!(GroupLayout::Fixed { group_size: 4 }.validate(8), Ok(2));
        assert_eq!(
            GroupLayout::Fixed { group_size: 3 }.validate(8),
            Err(Error::InvalidLayout)
        );
        assert_eq!(
            GroupLayout::Fixed { group_size: 0 }.validate(0),
            Err(Error::InvalidLayout)
        );
        assert_eq!(GroupLayout::Fixed { group_size: 2 }.validate(0), Ok(0));
    }

    #[test]
    fn offsets_must_be_csr() {
        assert_eq!(validate_offsets(&[0, 2, 2, 5], 5), Ok(3));
        assert_eq!(validate_offsets(&[0], 0), Ok(0));
        assert_eq!(validate_offsets(&[], 0), Err(Error::InvalidLayout));
        assert_eq!(validate_offsets(&[1, 5], 5), Err(Error::InvalidLayout));
        assert_eq!(
            validate_offsets(&[0, 3, 2, 5], 5),
            Err(Error::InvalidLayout)
        );
        assert_eq!(validate_offsets(&[0, 4], 5), Err(Error::InvalidLayout));
        assert_eq!(GroupLayout::Offsets(&[0, 2, 5]).range(1), 2..5);
    }

    /// Relation: `fault` is `None` exactly when `validate` accepts, for every small layout.
    #[test]
    fn fault_is_none_exactly_when_the_layout_is_valid() {
        for n in 0..5usize {
            for g in 0..4usize {
                let l = GroupLayout::Fixed { group_size: g };
                assert_eq!(l.fault(n).is_none(), l.validate(n).is_ok(), "n {n} g {g}");
            }
            for len in 0..4usize {
                // Every offsets array of `len` entries with values in 0..=4 (`code` in base 5).
                for code in 0..5u32.pow(len as u32) {
                    let mut o = [0u32; 4];
                    let mut c = code;
                    for slot in &mut o[..len] {
                        *slot = c % 5;
                        c /= 5;
                    }
                    let o = &o[..len];
                    assert_eq!(
                        offsets_fault(o, n).is_none(),
                        validate_offsets(o, n).is_ok()
                    );
                }
            }
        }
    }

    #[cfg(feature = "alloc")]
    #[test]
    #[allow(clippy::unwrap_used)] // a fault is the point of each case
    fn faults_name_the_arrays_and_sizes() {
        use alloc::string::ToString;
        let f = |l: GroupLayout<'_>, n| {
            l.fault(n)
                .unwrap()
                .named("group_size", "rewards")
                .to_string()
        };
        assert_eq!(
            f(GroupLayout::Fixed { group_size: 3 }, 2),
            "rewards has 2 values, not a multiple of group_size 3"
        );
        assert_eq!(
            f(GroupLayout::Fixed { group_size: 0 }, 2),
            "group_size is 0; it must be at least 1"
        );
        let o = |o: &[u32], n| {
            offsets_fault(o, n)
                .unwrap()
                .named("seq_offsets", "logp")
                .to_string()
        };
        assert_eq!(
            o(&[0, 4], 5),
            "seq_offsets ends at 4 but logp has 5 values; the last offset must equal the length"
        );
        assert_eq!(
            o(&[0, 3, 2, 5], 5),
            "seq_offsets[2] is smaller than seq_offsets[1]; the offsets must not decrease"
        );
        assert_eq!(
            o(&[1, 5], 5),
            "seq_offsets[0] is 1; the offsets must start at 0"
        );
        assert_eq!(
            o(&[], 0),
            "seq_offsets is empty; it needs at least [0] (one more entry than groups)"
        );
    }
}
