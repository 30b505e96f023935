//! Opaque handles: how a Rust value crosses the C boundary and comes back, with every misuse
//! of a handle (a double free, a use after free, a handle of another type, a value that never
//! came from this library) detected and reported as `CARE_ERR_INVALID_HANDLE`.
//!
//! # Why a registry, not a pointer
//!
//! A handle that is the address of the object cannot be checked soundly: after its `_free`,
//! reading anything through it (a reference count, a magic number) reads freed memory, which is
//! undefined behaviour whatever the value found there, and keeping every freed allocation alive
//! to make that read legal would leak. So a handle is not an address. It is a token
//! `(type tag, generation, slot)` packed into a pointer-sized value (never NULL, never
//! dereferenced, built without provenance); the objects live in one registry per handle type,
//! a vector of slots, each holding an `Arc` of the object and the generation of the handle
//! that owns it. Every call decodes the token and looks it up under a read lock: a wrong tag,
//! a slot out of range, a slot whose generation differs (freed, then perhaps reused) or an empty
//! slot is `CARE_ERR_INVALID_HANDLE`, found without touching any memory the token names.
//!
//! * **References.** Each handle is one reference. `_clone` makes a new handle (its own slot)
//!   to the same object, and `_free` empties exactly that slot; the object is dropped with its
//!   last handle. Freeing one handle therefore invalidates that handle only: a use of it is
//!   detected even while a clone keeps the object alive.
//! * **Calls in flight.** A call clones the slot's `Arc` and releases the lock before it works,
//!   so a `_free` on another thread never frees an object a running call reads (the object
//!   lives until that call returns), and never waits for it.
//! * **Generations.** `_free` bumps the slot's generation before the slot is reused. A slot
//!   whose generation would wrap is retired (never reused, a few bytes), so a stale handle can
//!   never match a later one: detection is exact, not probabilistic.
//! * **Type tags.** The top bits hold a per-type tag whose high bit is set, so a rubric handle
//!   passed as a profile, or a real user-space pointer (whose top bits are 0 on every 64-bit
//!   platform this library supports), never decodes as a live handle.
//!
//! The registries are the library's only global mutable state besides the CUDA module cache.

use std::sync::{Arc, PoisonError, RwLock};

use crate::result::care_result;

/// Bits of a token: slot index (low), generation, type tag (high).
const INDEX_BITS: u32 = if usize::BITS >= 64 { 32 } else { 20 };
const GEN_BITS: u32 = if usize::BITS >= 64 { 24 } else { 8 };
const TAG_SHIFT: u32 = INDEX_BITS + GEN_BITS;
const TAG_BITS: u32 = usize::BITS - TAG_SHIFT;
const INDEX_MASK: usize = (1 << INDEX_BITS) - 1;
const GEN_MASK: usize = (1 << GEN_BITS) - 1;
/// Slots a registry can hold (one more would not fit the index bits).
const MAX_SLOTS: usize = INDEX_MASK;
/// The last generation a slot may carry; a slot freed at this generation is retired.
const MAX_GEN: u32 = GEN_MASK as u32;

/// Ties an opaque C type to the Rust value behind its handles and to that value's registry.
pub(crate) trait Handle: Sized + 'static {
    /// The Rust value a handle of `Self` stands for.
    type Rust: Send + Sync + 'static;
    /// The type tag (1..=7), unique per handle type.
    const TAG: usize;
    /// The registry of live `Self` handles.
    fn registry() -> &'static Registry<Self::Rust>;
}

/// Declares the registry of a handle type: `handle_type!(care_rubric => RubricHandle, 1);`.
macro_rules! handle_type {
    ($c:ty => $rust:ty, $tag:literal) => {
        impl $crate::handle::Handle for $c {
            type Rust = $rust;
            const TAG: usize = $tag;
            fn registry() -> &'static $crate::handle::Registry<$rust> {
                static REGISTRY: $crate::handle::Registry<$rust> = $crate::handle::Registry::new();
                &REGISTRY
            }
        }
    };
}

#[derive(Debug)]
struct Slot<T> {
    /// The generation of the handle that owns this slot (or of the next one, when empty).
    generation: u32,
    value: Option<Arc<T>>,
}

#[derive(Debug)]
struct Slots<T> {
    slots: Vec<Slot<T>>,
    /// Empty slots that may be reused.
    free: Vec<u32>,
}

/// The live handles of one type.
#[derive(Debug)]
pub(crate) struct Registry<T> {
    inner: RwLock<Slots<T>>,
}

impl<T> Registry<T> {
    pub(crate) const fn new() -> Self {
        Registry {
            inner: RwLock::new(Slots {
                slots: Vec::new(),
                free: Vec::new(),
            }),
        }
    }
}

/// The tag bits of type `H`: the tag with the top bit set (so that no user-space pointer,
/// whose top bits are clear, decodes as a handle).
fn tag_bits<H: Handle>() -> usize {
    const { assert!(TAG_BITS >= 4) };
    (H::TAG | (1 << (TAG_BITS - 1))) << TAG_SHIFT
}

fn encode<H: Handle>(index: usize, generation: u32) -> *const H {
    let token = tag_bits::<H>() | ((generation as usize & GEN_MASK) << INDEX_BITS) | index;
    // A token, not an address: no provenance, never dereferenced (the C side only copies it).
    core::ptr::without_provenance(token)
}

/// `(slot, generation)` of a token of type `H`, or `None` for a value that is not one.
fn decode<H: Handle>(p: *const H) -> Option<(usize, u32)> {
    let token = p.addr();
    if token & !((1 << TAG_SHIFT) - 1) != tag_bits::<H>() {
        return None;
    }
    Some((
        token & INDEX_MASK,
        ((token >> INDEX_BITS) & GEN_MASK) as u32,
    ))
}

/// Registers `value` under a new handle.
///
/// # Errors
/// `CARE_ERR_CAPACITY` when the registry has no slot left (more live handles of one type than
/// the index bits can name).
pub(crate) fn insert<H: Handle>(value: H::Rust) -> Result<*const H, care_result> {
    insert_arc::<H>(Arc::new(value))
}

fn insert_arc<H: Handle>(value: Arc<H::Rust>) -> Result<*const H, care_result> {
    let mut s = H::registry()
        .inner
        .write()
        .unwrap_or_else(PoisonError::into_inner);
    let index = match s.free.pop() {
        Some(i) => i as usize,
        None => {
            let i = s.slots.len();
            if i >= MAX_SLOTS {
                return Err(care_result::CARE_ERR_CAPACITY);
            }
            s.slots.push(Slot {
                generation: 0,
                value: None,
            });
            i
        }
    };
    let slot = &mut s.slots[index];
    slot.value = Some(value);
    Ok(encode::<H>(index, slot.generation))
}

/// The object behind a live handle (a new reference, held for the call).
///
/// # Errors
/// `CARE_ERR_NULL_POINTER` for NULL; `CARE_ERR_INVALID_HANDLE` for a freed handle, a handle of
/// another type or a value that never was a handle.
pub(crate) fn get<H: Handle>(p: *const H) -> Result<Arc<H::Rust>, care_result> {
    get_unexplained(p).map_err(|e| explain::<H>(e, p))
}

/// The detail of a refused handle: NULL, or not a live handle of this type.
fn explain<H>(code: care_result, p: *const H) -> care_result {
    let name = crate::args::c_name::<H>();
    match code {
        care_result::CARE_ERR_NULL_POINTER => {
            crate::detail::fail(code, format_args!("the {name} handle is NULL"))
        }
        care_result::CARE_ERR_INVALID_HANDLE => crate::detail::fail(
            code,
            format_args!(
                "{p:p} is not a live {name} handle: it was freed already, was never returned \
                 by this library, or is a handle of another type"
            ),
        ),
        other => other,
    }
}

fn get_unexplained<H: Handle>(p: *const H) -> Result<Arc<H::Rust>, care_result> {
    if p.is_null() {
        return Err(care_result::CARE_ERR_NULL_POINTER);
    }
    let (index, generation) = decode(p).ok_or(care_result::CARE_ERR_INVALID_HANDLE)?;
    let s = H::registry()
        .inner
        .read()
        .unwrap_or_else(PoisonError::into_inner);
    match s.slots.get(index) {
        Some(Slot {
            generation: g,
            value: Some(v),
        }) if *g == generation => Ok(Arc::clone(v)),
        _ => Err(care_result::CARE_ERR_INVALID_HANDLE),
    }
}

/// A new handle to the object of `p` (one more reference; `p` stays valid).
///
/// # Errors
/// As [`get`] and [`insert`].
pub(crate) fn clone<H: Handle>(p: *const H) -> Result<*const H, care_result> {
    let value = get(p)?;
    insert_arc::<H>(value)
}

/// Releases the handle `p` (NULL: nothing to do); the object is dropped with its last handle,
/// once no call that uses it is running.
///
/// # Errors
/// `CARE_ERR_INVALID_HANDLE` when `p` is not a live handle of this type (a double free, among
/// others); nothing changes then.
pub(crate) fn free<H: Handle>(p: *const H) -> Result<(), care_result> {
    free_unexplained(p).map_err(|e| explain::<H>(e, p))
}

fn free_unexplained<H: Handle>(p: *const H) -> Result<(), care_result> {
    if p.is_null() {
        return Ok(());
    }
    let (index, generation) = decode(p).ok_or(care_result::CARE_ERR_INVALID_HANDLE)?;
    let value = {
        let mut s = H::registry()
            .inner
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(slot) = s.slots.get_mut(index) else {
            return Err(care_result::CARE_ERR_INVALID_HANDLE);
        };
        if slot.generation != generation || slot.value.is_none() {
            return Err(care_result::CARE_ERR_INVALID_HANDLE);
        }
        let value = slot.value.take();
        if slot.generation < MAX_GEN {
            slot.generation += 1;
            // A failed allocation here aborts (it cannot unwind with the lock half-updated).
            s.free.push(index as u32);
        }
        value
    };
    // The object (perhaps a large rubric) is dropped after the lock is released.
    drop(value);
    Ok(())
}

/// Code of a call whose body is just the release of a handle.
pub(crate) fn free_code<H: Handle>(p: *const H) -> care_result {
    match free(p) {
        Ok(()) => care_result::CARE_OK,
        Err(e) => e,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // test code: failing loudly is the point
mod tests {
    use super::*;

    #[derive(Debug)]
    struct A;
    #[derive(Debug)]
    struct B;
    handle_type!(A => u64, 6);
    handle_type!(B => u64, 7);

    #[test]
    fn tokens_round_trip_and_never_look_like_pointers_or_other_types() {
        for (i, g) in [(0, 0), (INDEX_MASK, MAX_GEN), (12345, 77)] {
            let p = encode::<A>(i, g);
            assert!(!p.is_null());
            assert_eq!(decode(p), Some((i, g)));
            assert_eq!(decode(p.cast::<B>()), None, "a handle of another type");
        }
        let x = 5u64;
        assert_eq!(decode((&raw const x).cast::<A>()), None, "a real pointer");
        assert_eq!(decode(core::ptr::without_provenance::<A>(1)), None);
    }

    #[test]
    fn free_invalidates_exactly_one_handle_and_slots_are_reused_with_a_new_generation() {
        let a = insert::<A>(1).unwrap();
        let b = clone(a).unwrap();
        assert_ne!(a, b);
        assert_eq!(free(a), Ok(()));
        assert_eq!(get(a).err(), Some(care_result::CARE_ERR_INVALID_HANDLE));
        assert_eq!(free(a), Err(care_result::CARE_ERR_INVALID_HANDLE));
        assert_eq!(*get(b).unwrap(), 1);
        // The freed slot is reused, under another generation: the old token stays dead.
        let c = insert::<A>(2).unwrap();
        assert_eq!(decode(c).map(|d| d.0), decode(a).map(|d| d.0));
        assert_ne!(c, a);
        assert_eq!(get(a).err(), Some(care_result::CARE_ERR_INVALID_HANDLE));
        assert_eq!(*get(c).unwrap(), 2);
        assert_eq!(free(b), Ok(()));
        assert_eq!(free(c), Ok(()));
        assert_eq!(free::<A>(core::ptr::null()), Ok(()));
        assert_eq!(
            get::<A>(core::ptr::null()).err(),
            Some(care_result::CARE_ERR_NULL_POINTER)
        );
    }

    #[test]
    fn a_slot_at_the_last_generation_is_retired_not_reused() {
        let b = insert::<B>(9).unwrap();
        let (i, _) = decode(b).unwrap();
        {
            let mut s = B::registry().inner.write().unwrap();
            s.slots[i].generation = MAX_GEN;
        }
        let last = encode::<B>(i, MAX_GEN);
        assert_eq!(free(last), Ok(()));
        let next = insert::<B>(10).unwrap();
        assert_ne!(
            decode(next).map(|d| d.0),
            Some(i),
            "the retired slot is not reused"
        );
        assert_eq!(get(last).err(), Some(care_result::CARE_ERR_INVALID_HANDLE));
        assert_eq!(free(next), Ok(()));
        // The original `b` token has generation 0 and its slot is retired: dead too.
        assert_eq!(free(b), Err(care_result::CARE_ERR_INVALID_HANDLE));
    }
}
