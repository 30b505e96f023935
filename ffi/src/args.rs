//! Argument checks shared by every entry point: NULL, alignment and length checks that turn bad
//! input into a `care_result` instead of undefined behaviour or a panic.

use core::ffi::c_char;
use core::fmt::Display;
use core::mem::size_of;

use crate::detail;
use crate::result::care_result;

/// Unwraps `Ok`, or returns the error code from the enclosing entry point.
macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(value) => value,
            Err(code) => return code,
        }
    };
}

/// Checks a non-NULL, aligned pointer; NULL is `CARE_ERR_NULL_POINTER`, misaligned is
/// `CARE_ERR_INVALID_ARGUMENT`.
fn check_ptr<T>(p: *const T) -> Result<(), care_result> {
    if p.is_null() {
        Err(care_result::CARE_ERR_NULL_POINTER)
    } else if !p.is_aligned() {
        Err(care_result::CARE_ERR_INVALID_ARGUMENT)
    } else {
        Ok(())
    }
}

/// Checks that `len` elements of `T` fit in `isize::MAX` bytes, as `from_raw_parts` requires.
fn check_len<T>(len: usize) -> Result<(), care_result> {
    match len.checked_mul(size_of::<T>()) {
        Some(bytes) if bytes <= isize::MAX as usize => Ok(()),
        _ => Err(detail::fail(
            care_result::CARE_ERR_INVALID_ARGUMENT,
            format_args!(
                "a length of {len} elements of {} bytes is more than any buffer can hold",
                size_of::<T>()
            ),
        )),
    }
}

/// The C name of a `care_*` type (`care_loss_inputs`), for details; Rust paths are cut off.
pub(crate) fn c_name<T>() -> &'static str {
    let full = core::any::type_name::<T>();
    full.rsplit("::").next().unwrap_or(full)
}

/// A shared reference from a C pointer.
///
/// # Safety
/// `p` is NULL or points to a valid `T` that outlives `'a` and is not mutated meanwhile.
pub(crate) unsafe fn as_ref<'a, T>(p: *const T) -> Result<&'a T, care_result> {
    check_ptr(p)?;
    // SAFETY: non-NULL and aligned (checked); validity is the caller's contract.
    Ok(unsafe { &*p })
}

/// An input slice from a `(pointer, length)` pair. `(NULL, 0)` is the empty slice, so that an
/// empty `std::vector`'s `data()` can be passed; NULL with a non-zero length is an error.
///
/// # Safety
/// When non-NULL, `p` points to `len` initialized `T`s that outlive `'a`.
pub(crate) unsafe fn slice<'a, T>(p: *const T, len: usize) -> Result<&'a [T], care_result> {
    if len == 0 && p.is_null() {
        return Ok(&[]);
    }
    check_ptr(p)?;
    check_len::<T>(len)?;
    // SAFETY: non-NULL, aligned, size fits isize (checked); validity is the caller's contract.
    Ok(unsafe { core::slice::from_raw_parts(p, len) })
}

/// An output slice from a `(pointer, length)` pair, with the same NULL rule as [`slice`].
///
/// # Safety
/// When non-NULL, `p` points to `len` writable `T`s, not aliased by any other argument, that
/// outlive `'a`. `T` must be a plain number type (every bit pattern valid), since C may pass
/// uninitialized memory.
pub(crate) unsafe fn slice_mut<'a, T: Copy>(
    p: *mut T,
    len: usize,
) -> Result<&'a mut [T], care_result> {
    if len == 0 && p.is_null() {
        return Ok(&mut []);
    }
    check_ptr(p)?;
    check_len::<T>(len)?;
    // SAFETY: as in `slice`, plus exclusivity, which is the caller's contract.
    Ok(unsafe { core::slice::from_raw_parts_mut(p, len) })
}

/// UTF-8 text from a `(const char *, size_t)` pair (not NUL-terminated).
///
/// # Safety
/// As for [`slice`].
pub(crate) unsafe fn text<'a>(p: *const c_char, len: usize) -> Result<&'a str, care_result> {
    // SAFETY: forwarded contract; `c_char` and `u8` have the same layout.
    let bytes = unsafe { slice(p.cast::<u8>(), len) }?;
    core::str::from_utf8(bytes).map_err(|e| {
        detail::fail(
            care_result::CARE_ERR_INVALID_UTF8,
            format_args!(
                "the text is not UTF-8: the first bad byte is at offset {} of {len}",
                e.valid_up_to()
            ),
        )
    })
}

/// A checked output parameter: written only when the call succeeds.
pub(crate) struct Out<T>(*mut T);

impl<T> Out<T> {
    /// Checks `p` (non-NULL, aligned); nothing is written yet.
    pub(crate) fn new(p: *mut T) -> Result<Self, care_result> {
        check_ptr(p.cast_const())?;
        Ok(Out(p))
    }

    /// An optional output: NULL is `None` (not asked for), otherwise as [`Out::new`].
    pub(crate) fn optional(p: *mut T) -> Result<Option<Self>, care_result> {
        if p.is_null() {
            Ok(None)
        } else {
            Out::new(p).map(Some)
        }
    }

    /// Writes the value (without reading or dropping the old, possibly uninitialized, one).
    ///
    /// # Safety
    /// The pointer given to [`Out::new`] is valid for a write of `T`.
    pub(crate) unsafe fn write(self, value: T) {
        // SAFETY: non-NULL and aligned (checked in `new`); validity is the caller's contract.
        unsafe { self.0.write(value) }
    }
}

/// Copies `src` into the caller buffer `(buf, buf_len)` (no NUL is added) and stores the byte
/// count in `*out_len`. When the buffer is too small, nothing is copied, `*out_len` receives
/// the required size and the result is `CARE_ERR_BUFFER_TOO_SMALL`. `buf` may be NULL with
/// `buf_len == 0` to ask for the size.
///
/// # Safety
/// As for [`slice_mut`] on `(buf, buf_len)`; `out_len` is NULL or valid for a write.
pub(crate) unsafe fn write_bytes(
    src: &[u8],
    buf: *mut c_char,
    buf_len: usize,
    out_len: *mut usize,
) -> care_result {
    let out_len = tri!(Out::new(out_len));
    // SAFETY: forwarded contract.
    let dst = tri!(unsafe { slice_mut(buf.cast::<u8>(), buf_len) });
    match dst.get_mut(..src.len()) {
        Some(head) => {
            head.copy_from_slice(src);
            // SAFETY: forwarded contract.
            unsafe { out_len.write(src.len()) };
            care_result::CARE_OK
        }
        None => {
            // SAFETY: forwarded contract.
            unsafe { out_len.write(src.len()) };
            care_result::CARE_ERR_BUFFER_TOO_SMALL
        }
    }
}

/// An optional input slice: `(NULL, 0)` is absent (`None`); `(NULL, n > 0)` is
/// `CARE_ERR_NULL_POINTER`; otherwise as [`slice`] (an empty non-NULL slice is `Some(&[])`).
///
/// # Safety
/// As for [`slice`].
pub(crate) unsafe fn opt_slice<'a, T>(
    p: *const T,
    len: usize,
) -> Result<Option<&'a [T]>, care_result> {
    if p.is_null() {
        return if len == 0 {
            Ok(None)
        } else {
            Err(care_result::CARE_ERR_NULL_POINTER)
        };
    }
    // SAFETY: forwarded contract.
    unsafe { slice(p, len) }.map(Some)
}

/// An optional output slice, with the rule of [`opt_slice`].
///
/// # Safety
/// As for [`slice_mut`].
pub(crate) unsafe fn opt_slice_mut<'a, T: Copy>(
    p: *mut T,
    len: usize,
) -> Result<Option<&'a mut [T]>, care_result> {
    if p.is_null() {
        return if len == 0 {
            Ok(None)
        } else {
            Err(care_result::CARE_ERR_NULL_POINTER)
        };
    }
    // SAFETY: forwarded contract.
    unsafe { slice_mut(p, len) }.map(Some)
}

/// Reads a size-versioned struct whose first field is `struct_size: u32`: NULL is `None`; a
/// `struct_size` smaller than `T` is `CARE_ERR_STRUCT_SIZE` (a larger one, from a newer header,
/// is read up to `size_of::<T>()`; the trailing fields it adds are not this version's).
///
/// # Safety
/// `p` is NULL or points to at least `struct_size` readable bytes, the first four being the
/// `u32` size. `T` is a `#[repr(C)]` struct of plain numbers and raw pointers (every bit
/// pattern valid).
unsafe fn versioned<T: Copy>(p: *const T) -> Result<Option<T>, care_result> {
    if p.is_null() {
        return Ok(None);
    }
    check_ptr(p)?;
    // SAFETY: non-NULL, aligned; the first field is a `u32` (contract).
    let size = unsafe { p.cast::<u32>().read() };
    if (size as usize) < size_of::<T>() {
        let name = c_name::<T>();
        return Err(detail::fail(
            care_result::CARE_ERR_STRUCT_SIZE,
            format_args!(
                "{name}.struct_size is {size} but this library's {name} has {} bytes; set \
                 struct_size = sizeof({name}) (or fill the struct with its _default function) \
                 and rebuild against this care.h",
                size_of::<T>()
            ),
        ));
    }
    // SAFETY: at least `size_of::<T>()` bytes are readable (checked) and every bit pattern is
    // valid for `T` (contract).
    Ok(Some(unsafe { p.read() }))
}

/// An options struct (see [`versioned`]); NULL gives `default`. The callers decode it into the
/// core's options and call the core's `validate()`: the rules of every option live in
/// `care_core`, and a GPU entry point reports them before it needs a driver.
///
/// # Safety
/// As for [`versioned`].
pub(crate) unsafe fn options<T: Copy>(p: *const T, default: T) -> Result<T, care_result> {
    // SAFETY: forwarded contract.
    Ok(unsafe { versioned(p) }?.unwrap_or(default))
}

/// A required input struct (see [`versioned`]); NULL is `CARE_ERR_NULL_POINTER`.
///
/// # Safety
/// As for [`versioned`].
pub(crate) unsafe fn input<T: Copy>(p: *const T) -> Result<T, care_result> {
    // SAFETY: forwarded contract.
    unsafe { versioned(p) }?.ok_or_else(|| {
        detail::fail(
            care_result::CARE_ERR_NULL_POINTER,
            format_args!("the {} pointer is NULL; it is required", c_name::<T>()),
        )
    })
}

/// Checks an options struct with the core's own rules (`check()`), naming the field at fault
/// as `<struct>.<field>` in the detail: `care_loss_options.eps_low must be finite and >= 0`.
pub(crate) fn option_check(
    c_struct: &str,
    r: Result<(), care_core::InvalidOption>,
) -> Result<(), care_result> {
    r.map_err(|e| {
        detail::fail(
            care_result::CARE_ERR_INVALID_ARGUMENT,
            format_args!("{c_struct}.{e}"),
        )
    })
}

/// A boolean field `what` (`"care_rubric_policy.allow_think"`): 0 or 1, anything else
/// `CARE_ERR_INVALID_BOOL` (a C `bool` cannot cross the boundary safely, so flags are
/// integers, and a stray value is an error, not "true").
pub(crate) fn flag(what: &str, value: impl Into<u32>) -> Result<bool, care_result> {
    match value.into() {
        0 => Ok(false),
        1 => Ok(true),
        v => Err(detail::fail(
            care_result::CARE_ERR_INVALID_BOOL,
            format_args!("{what} is {v}; a flag must be 0 or 1"),
        )),
    }
}

/// A `u32` enum value `what` from C converted to its Rust enum; an unknown value is
/// `CARE_ERR_INVALID_ARGUMENT` (C enums arrive as plain integers, so they are never trusted),
/// and the detail lists the valid values with their names.
pub(crate) fn enum_arg<T: Copy + Display>(
    what: &str,
    value: u32,
    table: &[T],
) -> Result<T, care_result> {
    usize::try_from(value)
        .ok()
        .and_then(|i| table.get(i).copied())
        .ok_or_else(|| {
            struct Valid<'a, T>(&'a [T]);
            impl<T: Display> Display for Valid<'_, T> {
                fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                    for (i, v) in self.0.iter().enumerate() {
                        let sep = if i == 0 { "" } else { ", " };
                        write!(f, "{sep}{i} ({v})")?;
                    }
                    Ok(())
                }
            }
            detail::fail(
                care_result::CARE_ERR_INVALID_ARGUMENT,
                format_args!("{what} is {value}; valid values: {}", Valid(table)),
            )
        })
}

/// A length mismatch between `what` (`"care_loss_inputs.mask_len"`) and `base`: the
/// `CARE_ERR_LENGTH_MISMATCH` code with a detail naming both and their sizes.
pub(crate) fn mismatch(what: &str, len: usize, base: &str, want: usize) -> care_result {
    detail::fail(
        care_result::CARE_ERR_LENGTH_MISMATCH,
        format_args!("{what} is {len} but {base} is {want}; they must be equal"),
    )
}

/// Zeroed working memory of `n` elements (`f64`, `f32`, `u8`: all-zero bytes are `0`), or
/// `CARE_ERR_CAPACITY` (with a detail saying how much) when the memory cannot be had: working
/// memory sized by the caller's buffers is never an allocation failure that aborts the host
/// process. Zeroed by the allocator (`calloc`), so pages never written cost nothing.
pub(crate) fn working<T: Zeroed>(what: &str, n: usize, _zero: T) -> Result<Vec<T>, care_result> {
    let fail = || {
        detail::fail(
            care_result::CARE_ERR_CAPACITY,
            format_args!(
                "cannot allocate {} bytes of working memory for {what} ({n} elements)",
                n.saturating_mul(size_of::<T>())
            ),
        )
    };
    let layout = std::alloc::Layout::array::<T>(n).map_err(|_| fail())?;
    if layout.size() == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: a non-zero-sized layout; the pointer is checked; `T: Zeroed` is valid as all-zero
    // bytes; the vector takes the allocation with the same layout (capacity `n`).
    unsafe {
        let p = std::alloc::alloc_zeroed(layout).cast::<T>();
        if p.is_null() {
            return Err(fail());
        }
        Ok(Vec::from_raw_parts(p, n, n))
    }
}

/// Types whose all-zero bytes are a valid value (zero).
pub(crate) trait Zeroed: Copy {}
impl Zeroed for u8 {}
impl Zeroed for f32 {}
impl Zeroed for f64 {}
