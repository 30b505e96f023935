//! Lengths are checked before anything is sized by them. A caller's buffer may be real but
//! huge (reserved address space that was never touched), and the length it claims may be
//! wrong: such a call must be refused with its code without allocating (or touching) memory
//! in proportion to that length. This binary counts every byte the process allocates (its own
//! global allocator), so "no allocation" is a counted fact, not a timing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::ptr::{null, null_mut};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use care_ffi::care_result;
use care_ffi::profile::*;
use care_ffi::reward::*;
use care_ffi::rubric::*;

use care_result::*;

/// The system allocator, counting the bytes asked for.
struct Counting;

static ALLOCATED: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarded contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATED.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarded contract.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATED.fetch_add(new_size, Ordering::Relaxed);
        // SAFETY: forwarded contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The tests of this file run one at a time (the counter is process-wide).
static SERIAL: Mutex<()> = Mutex::new(());

/// Bytes allocated while `f` runs.
fn allocated_by<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let before = ALLOCATED.load(Ordering::SeqCst);
    let r = f();
    (r, ALLOCATED.load(Ordering::SeqCst) - before)
}

/// `len` bytes of reserved address space: readable zero pages that cost no memory until
/// written (`MAP_NORESERVE`), unmapped on drop.
struct Reserved {
    ptr: *mut libc::c_void,
    len: usize,
}

impl Reserved {
    fn new(len: usize) -> Reserved {
        // SAFETY: an anonymous private mapping; no file, no fixed address.
        let ptr = unsafe {
            libc::mmap(
                null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED, "cannot reserve {len} bytes");
        Reserved { ptr, len }
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// Less than this is "no allocation sized by the length" (the calls allocate a few small
/// things, such as the last-error detail).
const SMALL: usize = 1 << 20;

fn paper_rubric() -> *const care_rubric {
    let text = common::fixture("rubric_sft_1.json");
    let mut r = null();
    // SAFETY: valid pointers.
    let code = unsafe { care_rubric_parse(text.as_ptr().cast(), text.len(), null(), &mut r) };
    assert_eq!(code, CARE_OK);
    r
}

/// Issue case: `scores_len = 1 << 38` with a real (reserved) buffer of that many doubles used
/// to abort the process ("memory allocation of 2199023255552 bytes failed") before the length
/// check. Now: `CARE_ERR_SCORE_SHAPE`, nothing allocated, nothing written.
#[test]
fn judge_output_parse_with_a_huge_scores_len_is_a_shape_error_without_allocating() {
    let _g = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let rubric = paper_rubric();
    let answer = b"{\"criterion_scores\":[]}";
    for len in [1usize << 38, 3 << 30, 49, 0] {
        let buf = Reserved::new(len.max(1) * 8);
        let (code, bytes) = allocated_by(|| {
            // SAFETY: a live handle; `buf` holds `len` doubles.
            unsafe {
                care_judge_output_parse(
                    rubric,
                    answer.as_ptr().cast(),
                    answer.len(),
                    buf.ptr.cast(),
                    len,
                    null_mut(),
                )
            }
        });
        assert_eq!(code, CARE_ERR_SCORE_SHAPE, "scores_len {len}");
        assert!(bytes < SMALL, "scores_len {len}: {bytes} bytes allocated");
        // Nothing written: the first double is still the untouched zero page.
        // SAFETY: readable mapping of at least 8 bytes.
        assert_eq!(unsafe { *buf.ptr.cast::<u64>() }, 0);
    }
    // SAFETY: the handle from `paper_rubric`.
    assert_eq!(unsafe { care_rubric_free(rubric) }, CARE_OK);
}

/// The same for the profile entry point, for a fixed profile and for the generated one with a
/// rubric.
#[test]
fn profile_judge_output_parse_with_a_huge_scores_len_is_a_shape_error_without_allocating() {
    let _g = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let rubric = paper_rubric();
    for (name, r) in [("kardia", null()), ("care", rubric)] {
        let mut p = null();
        // SAFETY: valid pointers.
        let code = unsafe { care_profile_builtin(name.as_ptr().cast(), name.len(), &mut p) };
        assert_eq!(code, CARE_OK);
        let answer = b"{\"criterion_scores\":[]}";
        for len in [1usize << 38, 3 << 30, 65] {
            let buf = Reserved::new(len * 8);
            let (code, bytes) = allocated_by(|| {
                // SAFETY: live handles; `buf` holds `len` doubles.
                unsafe {
                    care_profile_judge_output_parse(
                        p,
                        r,
                        answer.as_ptr().cast(),
                        answer.len(),
                        buf.ptr.cast(),
                        len,
                        null_mut(),
                    )
                }
            });
            assert_eq!(code, CARE_ERR_SCORE_SHAPE, "{name}: scores_len {len}");
            assert!(bytes < SMALL, "{name}: scores_len {len}: {bytes} bytes");
            // SAFETY: readable mapping.
            assert_eq!(unsafe { *buf.ptr.cast::<u64>() }, 0);
        }
        // SAFETY: the handle from care_profile_builtin.
        assert_eq!(unsafe { care_profile_free(p) }, CARE_OK);
    }
    // SAFETY: the handle from `paper_rubric`.
    assert_eq!(unsafe { care_rubric_free(rubric) }, CARE_OK);
}

/// A profile text longer than the parser takes (4 GiB) is refused for its length without a
/// scratch buffer of that size: it is read (UTF-8 is checked first), never copied.
#[test]
fn a_profile_text_over_4_gib_is_refused_without_a_scratch_copy() {
    let _g = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let len = (4usize << 30) + 16;
    let text = Reserved::new(len);
    let (code, bytes) = allocated_by(|| {
        let mut rep = null_mut();
        // SAFETY: `text` holds `len` readable bytes.
        let code = unsafe { care_profile_validate(text.ptr.cast(), len, &mut rep) };
        assert_eq!(code, CARE_OK);
        let mut n = 0usize;
        let mut more = 0u32;
        // SAFETY: the report just made.
        assert_eq!(
            unsafe { care_profile_report_count(rep, &mut n, &mut more) },
            CARE_OK
        );
        assert_eq!(n, 1);
        // SAFETY: as above.
        unsafe { care_profile_report_free(rep) };
        let mut p = null();
        // SAFETY: as above.
        unsafe { care_profile_parse(text.ptr.cast(), len, &mut p) }
    });
    assert_ne!(code, CARE_OK);
    assert!(bytes < SMALL, "{bytes} bytes allocated");
}

/// Working memory sized by a real (reserved) buffer that the process cannot have is
/// `CARE_ERR_CAPACITY`, not an aborted host: a rubric text of 2 TiB of reserved address space
/// needs a scratch of the same size. Under Linux's heuristic overcommit (mode 0, the default)
/// and strict accounting (2) the allocator refuses it; with overcommit always on (1) it is
/// granted lazily and the call succeeds. Either way the process survives (it used to abort).
#[test]
fn working_memory_that_cannot_be_had_is_care_err_capacity_not_an_abort() {
    let _g = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let len = 2usize << 40;
    let text = Reserved::new(len);
    let mut rep = null_mut();
    // SAFETY: `text` holds `len` readable bytes.
    let code = unsafe { care_rubric_validate(text.ptr.cast(), len, null(), &mut rep) };
    let mode = std::fs::read_to_string("/proc/sys/vm/overcommit_memory").unwrap_or_default();
    if mode.trim() == "1" {
        assert!(code == CARE_OK || code == CARE_ERR_CAPACITY, "{code:?}");
    } else {
        assert_eq!(code, CARE_ERR_CAPACITY);
        assert!(rep.is_null(), "nothing written on error");
        let detail = common::last_error_detail();
        assert!(
            detail.contains("cannot allocate 2199023255552 bytes"),
            "{detail}"
        );
    }
    if !rep.is_null() {
        // SAFETY: the report just made.
        unsafe { care_validation_report_free(rep) };
    }
}
