//! Opaque handles: how a Rust value crosses the C boundary and comes back.
//!
//! Immutable, shareable objects (a parsed rubric) are `Arc`s: `_clone` bumps the count and
//! `_free` drops one reference, so a handle can be shared across threads. Objects owned by one
//! caller (a validation report) are `Box`es. Each C-visible type is a zero-sized opaque struct
//! tied to its Rust type by [`Handle`], so a pointer can only be cast back to what it was made
//! from.

use std::sync::Arc;

use crate::result::care_result;

/// Ties an opaque C type to the Rust value behind its pointers.
pub(crate) trait Handle: Sized {
    /// The Rust value a pointer to `Self` really points to.
    type Rust;
}

/// Moves `value` into a new `Arc` and returns it as an opaque C pointer.
pub(crate) fn arc_into_c<H: Handle>(value: H::Rust) -> *const H {
    Arc::into_raw(Arc::new(value)).cast()
}

/// Borrows the value behind an `Arc` handle.
///
/// # Safety
/// `p` is NULL or came from [`arc_into_c::<H>`] and has not been freed.
pub(crate) unsafe fn arc_ref<'a, H: Handle>(p: *const H) -> Result<&'a H::Rust, care_result> {
    if p.is_null() {
        return Err(care_result::CARE_ERR_NULL_POINTER);
    }
    // SAFETY: `p` is a live `Arc<H::Rust>` pointer (contract); the caller holds a reference.
    Ok(unsafe { &*p.cast::<H::Rust>() })
}

/// Adds one reference to an `Arc` handle and returns the same pointer.
///
/// # Safety
/// As for [`arc_ref`].
pub(crate) unsafe fn arc_clone<H: Handle>(p: *const H) -> Result<*const H, care_result> {
    if p.is_null() {
        return Err(care_result::CARE_ERR_NULL_POINTER);
    }
    // SAFETY: `p` is a live `Arc<H::Rust>` pointer (contract).
    unsafe { Arc::increment_strong_count(p.cast::<H::Rust>()) };
    Ok(p)
}

/// Drops one reference of an `Arc` handle; NULL is a no-op.
///
/// # Safety
/// `p` is NULL or came from [`arc_into_c::<H>`] / [`arc_clone`] and this reference is not used
/// again.
pub(crate) unsafe fn arc_free<H: Handle>(p: *const H) {
    if !p.is_null() {
        // SAFETY: `p` owns one strong count (contract).
        drop(unsafe { Arc::from_raw(p.cast::<H::Rust>()) });
    }
}

/// Moves `value` into a new `Box` and returns it as an opaque C pointer.
pub(crate) fn box_into_c<H: Handle>(value: H::Rust) -> *mut H {
    Box::into_raw(Box::new(value)).cast()
}

/// Borrows the value behind a `Box` handle.
///
/// # Safety
/// `p` is NULL or came from [`box_into_c::<H>`] and has not been freed.
pub(crate) unsafe fn box_ref<'a, H: Handle>(p: *const H) -> Result<&'a H::Rust, care_result> {
    if p.is_null() {
        return Err(care_result::CARE_ERR_NULL_POINTER);
    }
    // SAFETY: `p` is a live `Box<H::Rust>` pointer (contract).
    Ok(unsafe { &*p.cast::<H::Rust>() })
}

/// Frees a `Box` handle; NULL is a no-op.
///
/// # Safety
/// `p` is NULL or came from [`box_into_c::<H>`] and is not used again.
pub(crate) unsafe fn box_free<H: Handle>(p: *mut H) {
    if !p.is_null() {
        // SAFETY: `p` is the unique owner (contract).
        drop(unsafe { Box::from_raw(p.cast::<H::Rust>()) });
    }
}
