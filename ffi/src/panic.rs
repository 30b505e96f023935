//! The panic boundary: every exported function runs its body inside [`ffi_panic_boundary!`].
//!
//! The macro goes *inside* the body (rustls-ffi style) so that cbindgen reads the plain
//! `extern "C" fn` signature. A panic unwinding out of an `extern "C"` function would abort the
//! host process; this turns it into `CARE_ERR_PANIC` (or the type's neutral value for functions
//! that do not return a code). The crate must keep `panic = "unwind"` for this to work.

use crate::result::care_result;

/// The value an entry point returns when its body panicked.
pub(crate) trait PanicOrDefault {
    /// The value returned after a caught panic.
    fn value() -> Self;
}

impl PanicOrDefault for care_result {
    fn value() -> Self {
        care_result::CARE_ERR_PANIC
    }
}

impl PanicOrDefault for () {
    fn value() -> Self {}
}

impl PanicOrDefault for u32 {
    fn value() -> Self {
        0
    }
}

impl PanicOrDefault for usize {
    fn value() -> Self {
        0
    }
}

impl<T> PanicOrDefault for *const T {
    fn value() -> Self {
        core::ptr::null()
    }
}

impl<T> PanicOrDefault for *mut T {
    fn value() -> Self {
        core::ptr::null_mut()
    }
}

/// Runs the body under `catch_unwind`; a panic returns `PanicOrDefault::value()`.
/// `return` inside the body returns from the entry point, as usual.
macro_rules! ffi_panic_boundary {
    ( $($body:tt)* ) => {
        match ::std::panic::catch_unwind(::std::panic::AssertUnwindSafe(|| { $($body)* })) {
            Ok(value) => value,
            Err(_) => $crate::panic::PanicOrDefault::value(),
        }
    };
}

#[cfg(test)]
#[allow(clippy::panic)] // the point of these tests
mod tests {
    use super::*;

    fn panicking_code(fire: bool) -> care_result {
        ffi_panic_boundary! {
            if fire {
                panic!("test panic inside an entry point");
            }
            care_result::CARE_OK
        }
    }

    fn panicking_pointer() -> *const u8 {
        ffi_panic_boundary! {
            let v: Vec<u8> = Vec::new();
            // Out-of-bounds indexing panics; the boundary turns it into NULL.
            &v[3] as *const u8
        }
    }

    #[test]
    fn a_panic_becomes_care_err_panic_or_the_neutral_value() {
        assert_eq!(panicking_code(false), care_result::CARE_OK);
        assert_eq!(panicking_code(true), care_result::CARE_ERR_PANIC);
        assert!(panicking_pointer().is_null());
    }
}
