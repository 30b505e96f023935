//! One stable name for every variant of every public fieldless enum of the crate.
//!
//! Each enum has inherent `ALL` and `NAMES` arrays (number order), `name()`, `help()` and
//! `from_name()`, [`core::fmt::Display`] (the name) and [`core::str::FromStr`] (exactly the
//! name, nothing else); with the `serde` feature it serializes as its name. The [`Named`] trait
//! gives generic code (a CLI's value parser, a binding's option table) the same facts. Names are
//! snake_case, never change, and are what the CLI, the C ABI's string look-ups and the Python
//! bindings accept. Nothing here allocates.

use core::fmt;

use crate::Error;

/// A public fieldless enum of `care-core` with one stable snake_case name per variant.
pub trait Named: Copy + Eq + Sized + 'static {
    /// What the enum is, for messages (`"aggregation"`).
    const KIND: &'static str;
    /// Every variant, in number order.
    const ALL: &'static [Self];
    /// The stable names, in the order of [`Named::ALL`].
    const NAMES: &'static [&'static str];

    /// The stable name of this variant.
    fn name(self) -> &'static str;

    /// One line that says what the variant does (help texts).
    fn help(self) -> &'static str;

    /// The variant whose name is exactly `name` (case-sensitive, no trimming).
    fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|v| v.name() == name)
    }
}

/// A string that is none of an enum's names (the error of every `FromStr` of the crate).
/// Converts into [`Error::InvalidArgument`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UnknownName {
    /// What was being parsed ([`Named::KIND`]).
    pub kind: &'static str,
    /// The names that would have been accepted ([`Named::NAMES`]).
    pub expected: &'static [&'static str],
}

impl UnknownName {
    /// The error for an unknown name of `T`.
    pub const fn of<T: Named>() -> Self {
        UnknownName {
            kind: T::KIND,
            expected: T::NAMES,
        }
    }
}

impl fmt::Display for UnknownName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown {} (expected ", self.kind)?;
        write_list(f, self.expected)?;
        f.write_str(")")
    }
}

impl core::error::Error for UnknownName {}

impl From<UnknownName> for Error {
    fn from(_: UnknownName) -> Self {
        Error::InvalidArgument
    }
}

/// Writes `a, b or c`.
fn write_list(f: &mut fmt::Formatter<'_>, names: &[&str]) -> fmt::Result {
    for (i, n) in names.iter().enumerate() {
        if i > 0 {
            f.write_str(if i + 1 == names.len() { " or " } else { ", " })?;
        }
        f.write_str(n)?;
    }
    Ok(())
}

/// The names of `all` through `name`, as a const array (so that `NAMES` is derived from the
/// one `name` function of an enum whose names are written there, never listed twice).
macro_rules! names_of {
    ($ty:ty, $all:expr, $name:ident) => {{
        const N: usize = $all.len();
        let all: [$ty; N] = $all;
        let mut out = [""; N];
        let mut i = 0;
        while i < N {
            out[i] = all[i].$name();
            i += 1;
        }
        out
    }};
}
pub(crate) use names_of;

/// `Display`, `FromStr`, [`Named`] and (feature `serde`) serialization by name, for an enum
/// with inherent `ALL`, `NAMES`, `name`, `help` and `from_name`.
macro_rules! impl_named {
    ($ty:ty, $kind:literal) => {
        impl $crate::names::Named for $ty {
            const KIND: &'static str = $kind;
            const ALL: &'static [Self] = &<$ty>::ALL;
            const NAMES: &'static [&'static str] = &<$ty>::NAMES;
            fn name(self) -> &'static str {
                <$ty>::name(self)
            }
            fn help(self) -> &'static str {
                <$ty>::help(self)
            }
            fn from_name(name: &str) -> Option<Self> {
                <$ty>::from_name(name)
            }
        }

        impl core::str::FromStr for $ty {
            type Err = $crate::names::UnknownName;
            /// Parses exactly one of the stable names.
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                <$ty>::from_name(s).ok_or($crate::names::UnknownName::of::<$ty>())
            }
        }

        #[cfg(feature = "serde")]
        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(<$ty>::name(*self))
            }
        }

        #[cfg(feature = "serde")]
        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_str($crate::names::NameVisitor::<$ty>(core::marker::PhantomData))
            }
        }
    };
}
pub(crate) use impl_named;

/// Defines the names of a fieldless enum in one table: inherent `ALL`, `NAMES`, `name`, `help`
/// and `from_name`, `Display` (the name, padded as `{:<8}` asks), then [`impl_named!`].
macro_rules! named_enum {
    ($ty:ident, $kind:literal, { $($v:ident => $name:literal, $help:literal;)+ }) => {
        impl $ty {
            /// Every variant, in number order.
            pub const ALL: [$ty; [$($name),+].len()] = [$($ty::$v),+];
            /// The stable names, in the order of `ALL`.
            pub const NAMES: [&'static str; [$($name),+].len()] = [$($name),+];

            /// The stable snake_case name (CLI values, C and Python look-ups, `serde`).
            pub const fn name(self) -> &'static str {
                match self {
                    $($ty::$v => $name,)+
                }
            }

            /// One line that says what the variant does (help texts).
            pub const fn help(self) -> &'static str {
                match self {
                    $($ty::$v => $help,)+
                }
            }

            /// The variant named exactly `name`; `None` for any other string.
            pub fn from_name(name: &str) -> Option<$ty> {
                match name {
                    $($name => Some($ty::$v),)+
                    _ => None,
                }
            }
        }

        impl core::fmt::Display for $ty {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.pad(self.name())
            }
        }

        $crate::names::impl_named!($ty, $kind);
    };
}
pub(crate) use named_enum;

/// Deserializes a [`Named`] enum from its name.
#[cfg(feature = "serde")]
pub(crate) struct NameVisitor<T>(pub(crate) core::marker::PhantomData<T>);

#[cfg(feature = "serde")]
impl<'de, T: Named> serde::de::Visitor<'de> for NameVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a {} name: ", T::KIND)?;
        write_list(f, T::NAMES)
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<T, E> {
        T::from_name(v).ok_or_else(|| E::unknown_variant(v, T::NAMES))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::format::ViolationCode;
    use crate::grpo::{
        AdvantageEstimator, Aggregation, Baseline, Bypass, IsLevel, KlEstimator, LossPreset,
        MaskedToken, PolicyLoss, Preset, RatioLevel, Rejection, RejectionMode, Reweight, Scale,
        SequenceCount, SingletonPolicy, StdKind,
    };
    use crate::reward::{MissingPolicy, RangePolicy, ScoreScale};
    use crate::rubric::Dimension;
    use crate::strategy::{Taxonomy, UnknownLabelPolicy};
    use std::string::ToString;

    /// The relations every named enum keeps: names are unique snake_case, `from_name` and
    /// `FromStr` invert `name`, `Display` prints the name (an [`Error`] prints its message and
    /// code), and anything else is rejected with the list of names.
    fn check<
        T: Named + core::fmt::Display + core::str::FromStr<Err = UnknownName> + core::fmt::Debug,
    >() {
        assert_eq!(T::ALL.len(), T::NAMES.len(), "{}", T::KIND);
        for (i, (&v, &n)) in T::ALL.iter().zip(T::NAMES).enumerate() {
            assert_eq!(v.name(), n);
            assert!(
                !n.is_empty()
                    && n.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{} name {n:?} is not snake_case",
                T::KIND
            );
            assert!(!v.help().is_empty());
            assert_eq!(T::from_name(n), Some(v));
            assert_eq!(n.parse::<T>(), Ok(v));
            if T::KIND == "error code" {
                assert!(v.to_string().ends_with(&std::format!("({n})")));
            } else {
                assert_eq!(v.to_string(), n);
            }
            assert!(!T::NAMES[..i].contains(&n), "{} name {n:?} twice", T::KIND);
            // Exactly the name: no case folding, no trimming.
            assert_eq!(T::from_name(&n.to_ascii_uppercase()), None);
            assert!(std::format!(" {n}").parse::<T>().is_err());
        }
        let e = "no such name".parse::<T>().unwrap_err();
        assert_eq!((e.kind, e.expected), (T::KIND, T::NAMES));
        let msg = e.to_string();
        assert!(
            msg.starts_with("unknown ") && msg.contains(T::NAMES[0]),
            "{msg}"
        );
        assert_eq!(Error::from(e), Error::InvalidArgument);
    }

    #[test]
    fn every_public_enum_keeps_the_name_relations() {
        check::<MissingPolicy>();
        check::<RangePolicy>();
        check::<ScoreScale>();
        check::<Taxonomy>();
        check::<UnknownLabelPolicy>();
        check::<Dimension>();
        check::<ViolationCode>();
        check::<Error>();
        check::<Baseline>();
        check::<Scale>();
        check::<StdKind>();
        check::<SingletonPolicy>();
        check::<Preset>();
        check::<Aggregation>();
        check::<KlEstimator>();
        check::<RatioLevel>();
        check::<LossPreset>();
        check::<Reweight>();
        check::<IsLevel>();
        check::<Rejection>();
        check::<RejectionMode>();
        check::<PolicyLoss>();
        check::<SequenceCount>();
        check::<Bypass>();
        check::<MaskedToken>();
        check::<AdvantageEstimator>();
        check::<crate::Dtype>();
        check::<crate::profile::RubricSource>();
        check::<crate::profile::OutputCode>();
        check::<crate::profile::ProfileCode>();
    }

    #[test]
    fn all_is_in_number_order_for_the_c_enums() {
        // The C ABI passes these as their discriminants; `ALL[i]` must be variant number `i`.
        macro_rules! in_order {
            ($($t:ty),+) => {$(
                for (i, v) in <$t>::ALL.iter().enumerate() {
                    assert_eq!(*v as usize, i, "{}", stringify!($t));
                }
            )+};
        }
        in_order!(
            Baseline,
            Scale,
            StdKind,
            SingletonPolicy,
            Preset,
            Aggregation,
            KlEstimator
        );
        in_order!(RatioLevel, LossPreset, Dimension);
        in_order!(
            Reweight,
            IsLevel,
            Rejection,
            RejectionMode,
            PolicyLoss,
            SequenceCount,
            Bypass,
            MaskedToken
        );
    }

    #[test]
    fn names_are_the_ones_every_surface_already_accepts() {
        // Pinned: the CLI's values, the C header's docs and care_torch's tables use these.
        assert_eq!(
            Preset::NAMES,
            [
                "verl",
                "trl",
                "trl_batch",
                "openrlhf",
                "dr_grpo",
                "rloo",
                "opo",
                "remax",
                "grpo_passk",
                "gpg",
                "reinforce_pp_baseline",
                "verl_gpg"
            ]
        );
        assert_eq!(LossPreset::NAMES[..2], ["verl", "trl"]);
        assert_eq!(
            Baseline::NAMES,
            [
                "mean",
                "leave_one_out",
                "none",
                "length_weighted",
                "external",
                "pass_k"
            ]
        );
        assert_eq!(Scale::NAMES, ["group_std", "batch_std", "none"]);
        assert_eq!(StdKind::NAMES, ["unbiased", "biased"]);
        assert_eq!(SingletonPolicy::NAMES, ["zero", "raw", "error"]);
        assert_eq!(
            Aggregation::NAMES,
            [
                "token_mean",
                "seq_mean_token_mean",
                "seq_mean_token_sum",
                "seq_mean_token_sum_norm",
                "token_sum",
                "token_sum_norm"
            ]
        );
        assert_eq!(KlEstimator::NAMES, ["k1", "abs", "k2", "k3"]);
        assert_eq!(RatioLevel::NAMES, ["token", "sequence", "sequence_token"]);
        assert_eq!(MissingPolicy::NAMES, ["error", "zero", "skip"]);
        assert_eq!(RangePolicy::NAMES, ["error", "clamp"]);
        assert_eq!(ScoreScale::NAMES, ["normalized", "raw"]);
        assert_eq!(UnknownLabelPolicy::NAMES, ["error", "ignore"]);
        assert_eq!(Dimension::NAMES, ["cog", "aff", "pro"]);
        assert_eq!(Error::NAMES[0], "length_mismatch");
        assert_eq!(ViolationCode::NAMES[15], "meta_word");
    }

    #[test]
    fn display_pads_like_a_str() {
        assert_eq!(std::format!("[{:<8}]", Scale::None), "[none    ]");
        assert_eq!(
            UnknownName::of::<StdKind>().to_string(),
            "unknown std estimator (expected unbiased or biased)"
        );
    }
}
