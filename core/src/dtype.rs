//! The element types of the GPU kernels and the C ABI: one table of names, sizes and numbers
//! that `care-kernels` (kernel selection), `care-ffi` (`care_dtype`) and the Python bindings
//! derive from.

use core::fmt;

use crate::Error;

/// A floating-point element type of the kernels' inputs (log-probs, logits): `f32`, `bf16`
/// (`half::bf16`, `__nv_bfloat16` bits) or `f16` (`half::f16`, `__half` bits). The kernels always
/// compute in `f32`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// IEEE single precision, 4 bytes.
    F32,
    /// bfloat16 (the top half of an `f32`), 2 bytes.
    Bf16,
    /// IEEE half precision, 2 bytes.
    F16,
}

impl Dtype {
    /// Every dtype. The position in this array is the dtype's [`Dtype::number`] (the C ABI's
    /// `care_dtype` value), so the order never changes; new dtypes are appended.
    pub const ALL: [Dtype; 3] = [Dtype::F32, Dtype::Bf16, Dtype::F16];

    /// The stable names, in [`Dtype::ALL`] order (for help texts).
    pub const NAMES: [&'static str; 3] = [Dtype::F32.name(), Dtype::Bf16.name(), Dtype::F16.name()];

    /// The stable name: `"f32"`, `"bf16"`, `"f16"` (also the suffix of the kernel symbols and
    /// [`crate::grpo::LogProb::NAME`] of the matching Rust type).
    pub const fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "f16",
        }
    }

    /// One line for help texts.
    pub const fn help(self) -> &'static str {
        match self {
            Dtype::F32 => "IEEE single precision, 4 bytes",
            Dtype::Bf16 => "bfloat16, 2 bytes",
            Dtype::F16 => "IEEE half precision, 2 bytes",
        }
    }

    /// The dtype named exactly `name` ([`Dtype::name`]); `None` for any other string.
    pub fn from_name(name: &str) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|d| d.name() == name)
    }

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 | Dtype::F16 => 2,
        }
    }

    /// The stable number: the position in [`Dtype::ALL`] (C `CARE_DTYPE_F32 = 0`,
    /// `CARE_DTYPE_BF16 = 1`, `CARE_DTYPE_F16 = 2`).
    pub const fn number(self) -> u32 {
        match self {
            Dtype::F32 => 0,
            Dtype::Bf16 => 1,
            Dtype::F16 => 2,
        }
    }

    /// The dtype of a stable number, or [`Error::InvalidArgument`] for any other value.
    pub const fn from_number(n: u32) -> Result<Dtype, Error> {
        match n {
            0 => Ok(Dtype::F32),
            1 => Ok(Dtype::Bf16),
            2 => Ok(Dtype::F16),
            _ => Err(Error::InvalidArgument),
        }
    }

    /// The dtype of a [`crate::grpo::LogProb`] element type (`None` for `f64`, which only the
    /// CPU reference reads).
    pub fn of<T: crate::grpo::LogProb>() -> Option<Dtype> {
        T::NAME.parse().ok()
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

// `FromStr` (exactly a stable name; anything else is an `UnknownName`, which converts into
// `Error::InvalidArgument`), `Named`, and serialization by name.
crate::names::impl_named!(Dtype, "dtype");

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn names_numbers_and_sizes_round_trip() {
        for (i, d) in Dtype::ALL.into_iter().enumerate() {
            assert_eq!(d.number() as usize, i);
            assert_eq!(Dtype::from_number(d.number()), Ok(d));
            assert_eq!(Dtype::NAMES[i], d.name());
            assert_eq!(d.name().parse::<Dtype>(), Ok(d));
            assert_eq!(d.to_string(), d.name());
        }
        assert_eq!(Dtype::from_number(3), Err(Error::InvalidArgument));
        for bad in ["", "F32", "fp32", "bf16 ", "f64", "float"] {
            let e = bad.parse::<Dtype>().unwrap_err();
            assert_eq!(Error::from(e), Error::InvalidArgument, "{bad:?}");
        }
    }

    #[test]
    fn sizes_and_names_agree_with_the_element_types() {
        assert_eq!(Dtype::of::<f32>(), Some(Dtype::F32));
        assert_eq!(Dtype::of::<half::bf16>(), Some(Dtype::Bf16));
        assert_eq!(Dtype::of::<half::f16>(), Some(Dtype::F16));
        assert_eq!(Dtype::of::<f64>(), None);
        assert_eq!(Dtype::F32.size(), core::mem::size_of::<f32>());
        assert_eq!(Dtype::Bf16.size(), core::mem::size_of::<half::bf16>());
        assert_eq!(Dtype::F16.size(), core::mem::size_of::<half::f16>());
    }
}
