//! Per-call detail text: the sentence behind the last failed call's code on this thread
//! (`"care_loss_inputs.mask_len is 7 but logp_len is 8; ..."`), read with
//! [`care_last_error_detail`].
//!
//! A code says what class of fault it was; the detail says which argument and what to fix. It
//! lives in a thread-local (like `errno`), so concurrent callers on other threads never see each
//! other's text and no entry point needs an extra parameter. Every entry point that returns a
//! `care_result` resets it on entry ([`crate::panic::run`]); a check that knows more than its
//! code writes it with [`fail`] or [`set`]. The last code is kept too, so that the detail of a
//! failure no check described is the code's own message instead of nothing.

use core::cell::RefCell;
use core::ffi::c_char;
use core::fmt::{self, Write as _};

use crate::result::care_result;

/// The longest detail kept, in bytes: a message longer than this is cut at a character
/// boundary and ends with "...", so a hostile length in an argument cannot grow it without end.
pub(crate) const MAX_DETAIL_BYTES: usize = 1024;

struct Last {
    code: care_result,
    text: String,
    /// The text came from a check that knows only the class of fault ([`set_generic`]); a
    /// caller that knows the argument's name replaces it ([`set_if_empty`]).
    generic: bool,
}

thread_local! {
    static LAST: RefCell<Last> = const {
        RefCell::new(Last {
            code: care_result::CARE_OK,
            text: String::new(),
            generic: false,
        })
    };
}

/// Forgets the previous call's detail (start of every entry point that returns a code).
pub(crate) fn reset() {
    // `try_with`/`try_borrow_mut`: during thread teardown or a re-entrant call the detail is
    // simply not kept; it must never panic or abort.
    let _ = LAST.try_with(|l| {
        if let Ok(mut l) = l.try_borrow_mut() {
            l.code = care_result::CARE_OK;
            l.text.clear();
            l.generic = false;
        }
    });
}

/// Records the code an entry point returned (end of every entry point that returns a code).
pub(crate) fn record(code: care_result) {
    let _ = LAST.try_with(|l| {
        if let Ok(mut l) = l.try_borrow_mut() {
            l.code = code;
            if code == care_result::CARE_OK {
                l.text.clear();
            }
        }
    });
}

/// Replaces the detail with `args` (cut at [`MAX_DETAIL_BYTES`]).
pub(crate) fn set(args: fmt::Arguments<'_>) {
    write(args, false);
}

/// Sets a detail that names no argument (a shared check that sees only a pointer and two
/// lengths); the caller's [`set_if_empty`] may replace it with one that does.
pub(crate) fn set_generic(args: fmt::Arguments<'_>) {
    write(args, true);
}

fn write(args: fmt::Arguments<'_>, generic: bool) {
    let _ = LAST.try_with(|l| {
        if let Ok(mut l) = l.try_borrow_mut() {
            l.text.clear();
            l.generic = generic;
            let mut w = Capped(&mut l.text);
            let _ = w.write_fmt(args);
        }
    });
}

/// Sets the detail and returns `code`: `return Err(fail(CODE, format_args!(..)))`.
pub(crate) fn fail(code: care_result, args: fmt::Arguments<'_>) -> care_result {
    set(args);
    code
}

/// Sets the detail unless a check deeper in the call already wrote one that names its
/// argument: an explanation built after the fact never hides the sentence of the check that
/// failed, but it does replace a [`set_generic`] one.
pub(crate) fn set_if_empty(args: fmt::Arguments<'_>) {
    if replaceable() {
        set(args);
    }
}

fn replaceable() -> bool {
    LAST.try_with(|l| {
        l.try_borrow()
            .map(|l| l.text.is_empty() || l.generic)
            .unwrap_or(false)
    })
    .unwrap_or(false)
}

/// A `fmt::Write` into the detail that stops at [`MAX_DETAIL_BYTES`].
struct Capped<'a>(&'a mut String);

impl fmt::Write for Capped<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        const ELLIPSIS: &str = "...";
        let room = MAX_DETAIL_BYTES - ELLIPSIS.len();
        if self.0.len() >= room {
            return Ok(());
        }
        if self.0.len() + s.len() <= room {
            self.0.push_str(s);
            return Ok(());
        }
        let mut cut = room - self.0.len();
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        self.0.push_str(&s[..cut]);
        self.0.push_str(ELLIPSIS);
        Ok(())
    }
}

/// The text [`care_last_error_detail`] returns: the detail, or the last code's message when no
/// check described the failure, or nothing after a success.
fn current() -> String {
    LAST.try_with(|l| match l.try_borrow() {
        Ok(l) if !l.text.is_empty() => l.text.clone(),
        Ok(l) if l.code != care_result::CARE_OK => l
            .code
            .message_cstr()
            .to_str()
            .unwrap_or_default()
            .to_owned(),
        _ => String::new(),
    })
    .unwrap_or_default()
}

/// Copies the detail of the last call on this thread that returned a `care_result` (this
/// function and those that return no code do not count) into `(buf, buf_len)` as UTF-8 without
/// a NUL, and its length into `*out_len`: which argument was at fault and what to fix, such as
/// `"care_loss_inputs.mask_len is 7 but logp_len is 8; every per-token array has one entry per
/// token"`. After a failure no check described, it is the code's `care_result_message`; after
/// a success it is empty (`*out_len == 0`). At most 1024 bytes.
///
/// The text is for people (logs, exceptions); branch on the code, never on the text, which may
/// be reworded between versions. A buffer too small is `CARE_ERR_BUFFER_TOO_SMALL` with the
/// size needed in `*out_len` (`buf` may be NULL with `buf_len == 0` to ask), and the detail
/// stays for the next call.
///
/// ```c
/// if (r != CARE_OK) {
///     char msg[1024]; size_t n = 0;
///     care_last_error_detail(msg, sizeof msg, &n);
///     fprintf(stderr, "care: %s (%u): %.*s\n", care_result_message(r), r, (int)n, msg);
/// }
/// ```
#[unsafe(no_mangle)]
pub unsafe extern "C" fn care_last_error_detail(
    buf: *mut c_char,
    buf_len: usize,
    out_len: *mut usize,
) -> care_result {
    crate::panic::run_keep_detail(|| {
        let text = current();
        // SAFETY: forwarded contract of the entry point.
        unsafe { crate::args::write_bytes(text.as_bytes(), buf, buf_len, out_len) }
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // test code: failing loudly is the point
mod tests {
    use super::*;

    #[test]
    fn a_long_detail_is_cut_at_a_character_boundary_with_an_ellipsis() {
        reset();
        let long = "é".repeat(MAX_DETAIL_BYTES);
        set(format_args!("{long}"));
        let t = current();
        assert!(t.len() <= MAX_DETAIL_BYTES, "{}", t.len());
        assert!(t.ends_with("..."));
        assert!(t.trim_end_matches("...").chars().all(|c| c == 'é'));
    }

    #[test]
    fn without_a_detail_a_failure_reads_as_its_code_message_and_a_success_as_nothing() {
        reset();
        record(care_result::CARE_ERR_EMPTY);
        assert_eq!(
            current(),
            care_result::CARE_ERR_EMPTY.message_cstr().to_str().unwrap()
        );
        record(care_result::CARE_OK);
        assert_eq!(current(), "");
    }

    #[test]
    fn a_generic_fallback_does_not_replace_a_specific_detail() {
        reset();
        set(format_args!("specific"));
        set_if_empty(format_args!("generic"));
        assert_eq!(current(), "specific");
    }

    #[test]
    fn a_named_explanation_replaces_a_generic_detail() {
        reset();
        set_generic(format_args!("a buffer has 3 elements where 4 are required"));
        set_if_empty(format_args!("care_logits.mask_len is 3 but rows is 4"));
        assert_eq!(current(), "care_logits.mask_len is 3 but rows is 4");
    }

    #[test]
    fn each_thread_has_its_own_detail() {
        reset();
        set(format_args!("main thread"));
        let other = std::thread::spawn(|| {
            set(format_args!("other thread"));
            current()
        })
        .join()
        .unwrap();
        assert_eq!(other, "other thread");
        assert_eq!(current(), "main thread");
    }
}
