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
}
