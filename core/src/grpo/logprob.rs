//! The log-prob element types the loss reads: `f32`, `half::bf16`, `half::f16`.

use crate::{Error, Result};

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
    impl Sealed for f64 {}
}

/// A log-probability element: `f32`, `half::bf16` or `half::f16` (the dtypes of the kernels
/// and the C ABI), widened to `f64` on read; `f64` is also accepted by the CPU reference (for
/// `f64` callers and finite-difference tests). Sealed.
pub trait LogProb: Copy + bytemuck::Pod + sealed::Sealed {
    /// The dtype's name as the CLI and the C ABI spell it (`"f32"`, `"bf16"`, `"f16"`, `"f64"`).
    const NAME: &'static str;

    /// The value widened to `f64` (exact for all three types).
    fn to_f64(self) -> f64;

    /// Views native-endian raw bytes (for example a buffer from C or a file) as elements,
    /// without copying.
    ///
    /// Errors: [`Error::LengthMismatch`] if the byte length is not a multiple of the element
    /// size, [`Error::InvalidLayout`] if the bytes are not aligned for the element type.
    fn from_bytes(bytes: &[u8]) -> Result<&[Self]> {
        bytemuck::try_cast_slice(bytes).map_err(|e| match e {
            bytemuck::PodCastError::TargetAlignmentGreaterAndInputNotAligned => {
                Error::InvalidLayout
            }
            _ => Error::LengthMismatch,
        })
    }
}

impl LogProb for f32 {
    const NAME: &'static str = "f32";
    #[inline]
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
}

impl LogProb for f64 {
    const NAME: &'static str = "f64";
    #[inline]
    fn to_f64(self) -> f64 {
        self
    }
}

impl LogProb for half::bf16 {
    const NAME: &'static str = "bf16";
    /// Non-NaN values widen through `f32` (a bf16 is the top half of an `f32`; both steps are
    /// exact), which is branch-free; NaN takes `half`'s conversion, so every one of the 65536
    /// inputs gives the bits of `half::bf16::to_f64` (tested exhaustively).
    #[inline]
    fn to_f64(self) -> f64 {
        if self.is_nan() {
            half::bf16::to_f64(self)
        } else {
            f64::from(f32::from_bits(u32::from(self.to_bits()) << 16))
        }
    }
}

impl LogProb for half::f16 {
    const NAME: &'static str = "f16";
    #[inline]
    fn to_f64(self) -> f64 {
        half::f16::to_f64(self)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn bf16_widening_matches_half_for_every_value() {
        for bits in 0..=u16::MAX {
            let x = half::bf16::from_bits(bits);
            assert_eq!(
                LogProb::to_f64(x).to_bits(),
                half::bf16::to_f64(x).to_bits(),
                "{bits:#06x}"
            );
        }
    }

    #[test]
    fn widening_is_exact_and_bytes_cast() {
        assert_eq!(half::bf16::from_f32(-1.5).to_f64(), -1.5);
        assert_eq!(half::f16::from_f32(-0.25).to_f64(), -0.25);
        assert!(half::bf16::NAN.to_f64().is_nan());
        let raw: [u8; 4] = (-2.0f32).to_le_bytes();
        let v = <half::bf16 as LogProb>::from_bytes(&raw[..3]);
        assert_eq!(v, Err(Error::LengthMismatch));
        let w = [0x3f80u16, 0xc000]; // bf16 1.0, -2.0
        let bytes: &[u8] = bytemuck::cast_slice(&w);
        let v = <half::bf16 as LogProb>::from_bytes(bytes).unwrap();
        assert_eq!(v[0].to_f64(), 1.0);
        assert_eq!(v[1].to_f64(), -2.0);
    }
}
