//! The panic boundary: every exported function runs its body inside [`ffi_panic_boundary!`].
//!
//! The macro goes *inside* the body (rustls-ffi style) so that cbindgen reads the plain
//! `extern "C" fn` signature. A panic unwinding out of an `extern "C"` function would abort the
//! host process; this turns it into `CARE_ERR_PANIC` (or the type's neutral value for functions
//! that do not return a code). The crate must keep `panic = "unwind"` for this to work.

use crate::result::care_result;

/// The value an entry point returns when its body panicked, and whether it is a code that the
/// per-call detail ([`crate::detail`]) follows.
pub(crate) trait PanicOrDefault {
    /// The value returned after a caught panic.
    fn value() -> Self;
    /// Whether the type is `care_result` (see [`PanicOrDefault::code`]).
    const IS_CODE: bool = false;
    /// `Some(code)` for a `care_result` (the detail is reset on entry and the code recorded on
    /// exit); `None` for the few entry points that return no code (`care_version`,
    /// `care_result_message`, ...), which leave the detail of the previous call alone.
    fn code(&self) -> Option<care_result> {
        None
    }
}

impl PanicOrDefault for care_result {
    const IS_CODE: bool = true;
    fn value() -> Self {
        care_result::CARE_ERR_PANIC
    }
    fn code(&self) -> Option<care_result> {
        Some(*self)
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

/// Runs an entry point's body under `catch_unwind`: a panic returns `PanicOrDefault::value()`,
/// with the panic's message as the detail. For a body that returns a `care_result`, the
/// previous call's detail is forgotten first and the returned code recorded after.
pub(crate) fn run<R: PanicOrDefault>(body: impl FnOnce() -> R) -> R {
    if R::IS_CODE {
        crate::detail::reset();
    }
    let out = guarded(body);
    if let Some(code) = out.code() {
        crate::detail::record(code);
    }
    out
}

/// [`run`] without touching the detail: for `care_last_error_detail`, which reads it.
pub(crate) fn run_keep_detail<R: PanicOrDefault>(body: impl FnOnce() -> R) -> R {
    guarded(body)
}

fn guarded<R: PanicOrDefault>(body: impl FnOnce() -> R) -> R {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(payload) => {
            let msg = payload
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
                .unwrap_or("(no message)");
            crate::detail::set(format_args!(
                "internal error: a panic was caught at the C boundary ({msg}); please report it"
            ));
            // Dropping the payload could itself panic (a hostile Drop); forget it instead.
            core::mem::forget(payload);
            R::value()
        }
    }
}

/// Runs the body with [`run`]; `return` inside the body returns from the entry point, as
/// usual.
macro_rules! ffi_panic_boundary {
    ( $($body:tt)* ) => {
        $crate::panic::run(|| { $($body)* })
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
