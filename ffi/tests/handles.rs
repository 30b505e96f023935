//! Handle lifetime: every misuse of a handle is detected, for every handle type, from any
//! thread, without reading freed memory (`CARE_ERR_INVALID_HANDLE`):
//! * a double free;
//! * a use after free, by every kind of call that takes the handle;
//! * a use after free from another thread while a clone of the handle keeps the object alive
//!   (the clone keeps working; the freed handle does not);
//! * a free racing calls on other threads: each call either runs on the live object and gets
//!   the right answer, or is refused, and the object outlives every call that started.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use std::ffi::c_char;
use std::ptr::{null, null_mut};
use std::sync::{Arc, Barrier};

use care_ffi::care_result::{self, *};
use care_ffi::profile::*;
use care_ffi::reward::*;
use care_ffi::rubric::*;

/// A handle value that may cross threads (the handles are documented thread-safe; the value is
/// a token, checked by every call).
#[derive(Debug)]
struct H<T>(*const T);
// Not derived: a derive would require `T: Copy`, and the opaque C types are not.
impl<T> Clone for H<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for H<T> {}
// SAFETY: a handle is a token; the library checks it on every call from any thread.
unsafe impl<T> Send for H<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for H<T> {}

impl<T> H<T> {
    /// The handle (a method, so that a closure captures the whole `Send` wrapper).
    fn get(self) -> *const T {
        self.0
    }
}

fn rubric() -> *const care_rubric {
    let text = common::fixture("rubric_sft_1.json");
    let mut r = null();
    // SAFETY: valid pointers.
    assert_eq!(
        unsafe { care_rubric_parse(text.as_ptr().cast(), text.len(), null(), &mut r) },
        CARE_OK
    );
    r
}

fn report() -> *mut care_validation_report {
    let mut r = null_mut();
    let text = b"{}";
    // SAFETY: valid pointers.
    assert_eq!(
        unsafe { care_rubric_validate(text.as_ptr().cast(), 2, null(), &mut r) },
        CARE_OK
    );
    r
}

fn kardia() -> *const care_profile {
    let mut p = null();
    // SAFETY: valid pointers.
    assert_eq!(
        unsafe { care_profile_builtin(c"kardia".as_ptr(), 6, &mut p) },
        CARE_OK
    );
    p
}

fn profile_report() -> *mut care_profile_report {
    let mut r = null_mut();
    let text = b"[]";
    // SAFETY: valid pointers.
    assert_eq!(
        unsafe { care_profile_validate(text.as_ptr().cast(), 2, &mut r) },
        CARE_OK
    );
    r
}

/// Every call that reads a rubric handle, with its result (and nothing written on failure).
fn rubric_calls(r: *const care_rubric) -> Vec<(&'static str, care_result)> {
    let mut w = [7.0; 3];
    let mut c = [7usize; 3];
    let mut total = 7usize;
    let (mut t, mut tl, mut d, mut dl) = (null::<c_char>(), 7usize, null::<c_char>(), 7usize);
    let scores = [3.0; 8];
    let mut reward = 7.0;
    let mut rewards = [7.0; 1];
    let mut clone = null();
    let mut buf = [0u8; 8192];
    let mut len = 7usize;
    let ji = care_judge_prompt_inputs {
        struct_size: size_of::<care_judge_prompt_inputs>() as u32,
        context: null(),
        context_lens: null(),
        context_count: 0,
        seeker_turn: c"Hi".as_ptr(),
        seeker_turn_len: 2,
        response: c"Hello".as_ptr(),
        response_len: 5,
    };
    let judge = br#"{"criterion_scores":[]}"#;
    let mut js = [7.0; 8];
    // SAFETY: valid pointers; the handle is checked.
    let out = unsafe {
        vec![
            ("weights", care_rubric_weights(r, w.as_mut_ptr(), 3)),
            ("counts", care_rubric_criteria_counts(r, c.as_mut_ptr(), 3)),
            ("total", care_rubric_total_criteria(r, &mut total)),
            (
                "criterion",
                care_rubric_criterion(r, 0, 0, &mut t, &mut tl, &mut d, &mut dl),
            ),
            (
                "policy_reward",
                care_policy_reward(r, scores.as_ptr(), 8, null(), &mut reward, null_mut()),
            ),
            (
                "policy_reward_group",
                care_policy_reward_group(
                    r,
                    scores.as_ptr(),
                    8,
                    null(),
                    rewards.as_mut_ptr(),
                    1,
                    null_mut(),
                ),
            ),
            (
                "judge_prompt_render",
                care_judge_prompt_render(r, &ji, buf.as_mut_ptr().cast(), buf.len(), &mut len),
            ),
            (
                "judge_output_parse",
                care_judge_output_parse(
                    r,
                    judge.as_ptr().cast(),
                    judge.len(),
                    js.as_mut_ptr(),
                    8,
                    null_mut(),
                ),
            ),
            ("clone", care_rubric_clone(r, &mut clone)),
        ]
    };
    let all_ok = out.iter().all(|(_, c)| *c == CARE_OK);
    if all_ok {
        // SAFETY: the clone is a live handle, released once.
        assert_eq!(unsafe { care_rubric_free(clone) }, CARE_OK);
    } else {
        assert!(clone.is_null(), "a failed clone wrote its output");
        assert_eq!(
            (w, c, total, reward, rewards[0]),
            ([7.0; 3], [7; 3], 7, 7.0, 7.0)
        );
        assert_eq!((tl, dl, len, js), (7, 7, 7, [7.0; 8]));
    }
    out
}

fn profile_calls(p: *const care_profile) -> Vec<(&'static str, care_result)> {
    let out_text = b"<|response_begin|>x<|response_end|>";
    let mut check = std::mem::MaybeUninit::<care_output_check>::zeroed();
    let mut info = std::mem::MaybeUninit::<care_profile_info>::zeroed();
    let (mut name, mut len) = (null::<c_char>(), 0usize);
    let mut total = 7usize;
    let mut clone = null();
    let scores = [4.0; 5];
    let resp = care_profile_response {
        struct_size: size_of::<care_profile_response>() as u32,
        rubric: null(),
        output: out_text.as_ptr().cast(),
        output_len: out_text.len(),
        scores: scores.as_ptr(),
        scores_len: 5,
        gold_emotion: c"joy".as_ptr(),
        gold_emotion_len: 3,
    };
    let mut result = std::mem::MaybeUninit::<care_profile_reward_result>::zeroed();
    // SAFETY: valid pointers; the handle is checked.
    let out = unsafe {
        vec![
            ("name", care_profile_name(p, &mut name, &mut len)),
            ("info", care_profile_describe(p, info.as_mut_ptr())),
            ("total", care_profile_total_criteria(p, null(), &mut total)),
            (
                "check_output",
                care_profile_check_output(
                    p,
                    out_text.as_ptr().cast(),
                    out_text.len(),
                    check.as_mut_ptr(),
                ),
            ),
            (
                "reward",
                care_profile_reward(p, &resp, null(), result.as_mut_ptr()),
            ),
            ("clone", care_profile_clone(p, &mut clone)),
        ]
    };
    if out.iter().all(|(_, c)| *c == CARE_OK) {
        // SAFETY: the clone is a live handle, released once.
        assert_eq!(unsafe { care_profile_free(clone) }, CARE_OK);
    } else {
        assert!(clone.is_null() && name.is_null() && total == 7);
    }
    out
}

fn report_calls(r: *const care_validation_report) -> Vec<(&'static str, care_result)> {
    let mut n = 7usize;
    let (mut f, mut p, mut o) = (7.0, 7u32, 7u32);
    let mut len = 7usize;
    // SAFETY: valid pointers; the handle is checked.
    unsafe {
        vec![
            ("count", care_validation_report_count(r, &mut n)),
            (
                "summary",
                care_validation_report_summary(r, &mut f, &mut p, &mut o),
            ),
            (
                "feedback",
                care_validation_report_feedback(r, null_mut(), 0, &mut len),
            ),
        ]
    }
}

fn profile_report_calls(r: *const care_profile_report) -> Vec<(&'static str, care_result)> {
    let mut n = 7usize;
    let mut len = 7usize;
    // SAFETY: valid pointers; the handle is checked.
    unsafe {
        vec![
            ("count", care_profile_report_count(r, &mut n, null_mut())),
            (
                "feedback",
                care_profile_report_feedback(r, null_mut(), 0, &mut len),
            ),
        ]
    }
}

fn assert_all(calls: Vec<(&'static str, care_result)>, want: care_result, what: &str) {
    for (name, code) in calls {
        // `feedback` with a (NULL, 0) buffer asks for the size: BUFFER_TOO_SMALL is its success.
        let code = if code == CARE_ERR_BUFFER_TOO_SMALL {
            CARE_OK
        } else {
            code
        };
        assert_eq!(code, want, "{what}: {name}");
    }
}

#[test]
fn double_free_is_detected_for_every_handle_type() {
    // SAFETY: handles are checked, whatever their value.
    unsafe {
        let r = rubric();
        assert_eq!(care_rubric_free(r), CARE_OK);
        assert_eq!(care_rubric_free(r), CARE_ERR_INVALID_HANDLE);
        let v = report();
        assert_eq!(care_validation_report_free(v), CARE_OK);
        assert_eq!(care_validation_report_free(v), CARE_ERR_INVALID_HANDLE);
        let p = kardia();
        assert_eq!(care_profile_free(p), CARE_OK);
        assert_eq!(care_profile_free(p), CARE_ERR_INVALID_HANDLE);
        let q = profile_report();
        assert_eq!(care_profile_report_free(q), CARE_OK);
        assert_eq!(care_profile_report_free(q), CARE_ERR_INVALID_HANDLE);
    }
}

#[test]
fn a_double_free_leaves_the_other_references_intact() {
    // When a handle was the rubric's address, a second free dropped a reference that the
    // clone owned; now it is refused, and the clone still owns the rubric.
    let r = rubric();
    let mut c = null();
    // SAFETY: handles are checked.
    unsafe {
        assert_eq!(care_rubric_clone(r, &mut c), CARE_OK);
        assert_eq!(care_rubric_free(r), CARE_OK);
        assert_eq!(care_rubric_free(r), CARE_ERR_INVALID_HANDLE);
        assert_eq!(care_rubric_free(r), CARE_ERR_INVALID_HANDLE);
    }
    assert_all(
        rubric_calls(c),
        CARE_OK,
        "the clone after a double free of the original",
    );
    // SAFETY: as above.
    assert_eq!(unsafe { care_rubric_free(c) }, CARE_OK);
}

#[test]
fn use_after_free_is_detected_for_every_call_of_every_handle_type() {
    let r = rubric();
    assert_all(rubric_calls(r), CARE_OK, "live rubric");
    // SAFETY: handles are checked.
    assert_eq!(unsafe { care_rubric_free(r) }, CARE_OK);
    assert_all(rubric_calls(r), CARE_ERR_INVALID_HANDLE, "freed rubric");

    let v = report();
    assert_all(report_calls(v), CARE_OK, "live report");
    // SAFETY: handles are checked.
    assert_eq!(unsafe { care_validation_report_free(v) }, CARE_OK);
    assert_all(report_calls(v), CARE_ERR_INVALID_HANDLE, "freed report");

    let p = kardia();
    let live = profile_calls(p);
    // The response is malformed for kardia (three spans missing): still a result, CARE_OK.
    assert_all(live, CARE_OK, "live profile");
    // SAFETY: handles are checked.
    assert_eq!(unsafe { care_profile_free(p) }, CARE_OK);
    assert_all(profile_calls(p), CARE_ERR_INVALID_HANDLE, "freed profile");

    let q = profile_report();
    assert_all(profile_report_calls(q), CARE_OK, "live profile report");
    // SAFETY: handles are checked.
    assert_eq!(unsafe { care_profile_report_free(q) }, CARE_OK);
    assert_all(
        profile_report_calls(q),
        CARE_ERR_INVALID_HANDLE,
        "freed profile report",
    );
}

#[test]
fn a_freed_slot_reused_by_a_new_handle_does_not_revive_the_old_one() {
    let r = rubric();
    // SAFETY: handles are checked.
    assert_eq!(unsafe { care_rubric_free(r) }, CARE_OK);
    // New handles take the freed slot (with a new generation).
    let fresh: Vec<_> = (0..4).map(|_| rubric()).collect();
    assert!(!fresh.contains(&r));
    assert_all(
        rubric_calls(r),
        CARE_ERR_INVALID_HANDLE,
        "stale handle after reuse",
    );
    for h in fresh {
        assert_all(rubric_calls(h), CARE_OK, "fresh handle");
        // SAFETY: as above.
        assert_eq!(unsafe { care_rubric_free(h) }, CARE_OK);
    }
}

#[test]
fn use_after_free_from_another_thread_while_a_clone_is_alive() {
    let r = rubric();
    let p = kardia();
    let (mut rc, mut pc) = (null(), null());
    // SAFETY: handles are checked.
    unsafe {
        assert_eq!(care_rubric_clone(r, &mut rc), CARE_OK);
        assert_eq!(care_profile_clone(p, &mut pc), CARE_OK);
        assert_ne!((r, p), (rc, pc), "a clone is a handle of its own");
        assert_eq!(care_rubric_free(r), CARE_OK);
        assert_eq!(care_profile_free(p), CARE_OK);
    }
    let (r, rc, p, pc) = (H(r), H(rc), H(p), H(pc));
    std::thread::spawn(move || {
        assert_all(
            rubric_calls(r.get()),
            CARE_ERR_INVALID_HANDLE,
            "freed rubric, other thread",
        );
        assert_all(rubric_calls(rc.get()), CARE_OK, "its clone, other thread");
        assert_all(
            profile_calls(p.get()),
            CARE_ERR_INVALID_HANDLE,
            "freed profile, other thread",
        );
        assert_all(profile_calls(pc.get()), CARE_OK, "its clone, other thread");
        // The other thread releases the clones: the objects go with them.
        // SAFETY: handles are checked.
        unsafe {
            assert_eq!(care_rubric_free(rc.get()), CARE_OK);
            assert_eq!(care_profile_free(pc.get()), CARE_OK);
        }
    })
    .join()
    .unwrap();
    assert_all(
        rubric_calls(rc.get()),
        CARE_ERR_INVALID_HANDLE,
        "both handles freed",
    );
    assert_all(
        profile_calls(pc.get()),
        CARE_ERR_INVALID_HANDLE,
        "both handles freed",
    );
}

#[test]
fn a_free_racing_calls_on_other_threads_never_breaks_a_running_call() {
    // 4 threads score a large group again and again on one handle while the main thread frees
    // it (5 ms after they start): every call either gets the single-threaded answer or CARE_ERR_INVALID_HANDLE, and
    // once a thread has been refused it is refused for good.
    let r = rubric();
    let mut total = 0;
    // SAFETY: live handle.
    assert_eq!(
        unsafe { care_rubric_total_criteria(r, &mut total) },
        CARE_OK
    );
    let g = 20_000;
    let scores: Arc<Vec<f64>> = Arc::new((0..g * total).map(|i| ((i * 7) % 6) as f64).collect());
    let mut want = vec![0.0; g];
    // SAFETY: valid pointers.
    let code = unsafe {
        care_policy_reward_group(
            r,
            scores.as_ptr(),
            scores.len(),
            null(),
            want.as_mut_ptr(),
            g,
            null_mut(),
        )
    };
    assert_eq!(code, CARE_OK);
    let want = Arc::new(want);
    let start = Arc::new(Barrier::new(5));
    let h = H(r);
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (scores, want, start) =
                (Arc::clone(&scores), Arc::clone(&want), Arc::clone(&start));
            std::thread::spawn(move || {
                start.wait();
                let (mut ok, mut refused) = (0, 0);
                let mut out = vec![0.0; g];
                // Until refused a few times (the main thread frees the handle meanwhile).
                while refused < 3 {
                    assert!(ok < 1_000_000, "the handle was never freed");
                    // SAFETY: valid pointers; the handle is checked.
                    let code = unsafe {
                        care_policy_reward_group(
                            h.get(),
                            scores.as_ptr(),
                            scores.len(),
                            null(),
                            out.as_mut_ptr(),
                            g,
                            null_mut(),
                        )
                    };
                    match code {
                        CARE_OK => {
                            assert_eq!(refused, 0, "a call succeeded after one was refused");
                            assert_eq!(
                                out.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                                want.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
                            );
                            ok += 1;
                        }
                        CARE_ERR_INVALID_HANDLE => refused += 1,
                        other => panic!("unexpected {other:?}"),
                    }
                }
                (ok, refused)
            })
        })
        .collect();
    start.wait();
    std::thread::sleep(std::time::Duration::from_millis(5));
    // SAFETY: handles are checked.
    assert_eq!(unsafe { care_rubric_free(h.get()) }, CARE_OK);
    for w in workers {
        let (_ok, refused) = w.join().unwrap();
        assert_eq!(refused, 3);
    }
    assert_all(
        rubric_calls(h.get()),
        CARE_ERR_INVALID_HANDLE,
        "after the race",
    );
}

#[test]
fn result_code_of_a_bad_handle_is_documented() {
    let msg = care_ffi::result::care_result_message(care_result::CARE_ERR_INVALID_HANDLE as u32);
    // SAFETY: a static NUL-terminated string.
    let msg = unsafe { std::ffi::CStr::from_ptr(msg) }.to_str().unwrap();
    assert!(msg.contains("freed"), "{msg}");
    assert!(common::header().contains("CARE_ERR_INVALID_HANDLE = 154"));
}
