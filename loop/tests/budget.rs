//! The server charges a request body its length plus `BYTES_PER_JSON_VALUE` per JSON value
//! (`json_values_bound`) before decoding it. This binary counts the bytes a decode really
//! holds at its peak (its own global allocator) for the shapes that decode into the most
//! memory per byte of text, and checks that the charge covers them: the byte budget of
//! `docs/RELIABILITY.md` is a counted fact, not an estimate.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use care_loop::TurnInput;
use care_loop::server::{BYTES_PER_JSON_VALUE, json_values_bound};
use serde::de::DeserializeOwned;
use serde_json::Value;

struct Peak;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Peak {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let now = LIVE.fetch_add(layout.size(), Ordering::SeqCst) + layout.size();
        PEAK.fetch_max(now, Ordering::SeqCst);
        // SAFETY: forwarded contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // Counted as a new block beside the old one (what a moving realloc holds).
        let now = LIVE.fetch_add(new_size, Ordering::SeqCst) + new_size;
        PEAK.fetch_max(now, Ordering::SeqCst);
        // SAFETY: forwarded contract.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
        p
    }
}

#[global_allocator]
static GLOBAL: Peak = Peak;

static SERIAL: Mutex<()> = Mutex::new(());

/// Peak bytes held above the starting point while `T` is decoded from `body` (and dropped).
fn peak_of_decode<T: DeserializeOwned>(body: &[u8]) -> usize {
    let _g = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let base = LIVE.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    let v: T = serde_json::from_slice(body).unwrap();
    drop(v);
    PEAK.load(Ordering::SeqCst) - base
}

fn check<T: DeserializeOwned>(name: &str, body: &str) {
    let charge = body.len() + BYTES_PER_JSON_VALUE * json_values_bound(body.as_bytes());
    let peak = peak_of_decode::<T>(body.as_bytes());
    eprintln!(
        "{name}: {} bytes of text, {} values at most, decoded peak {peak} bytes, charged {charge} ({:.1}x the text)",
        body.len(),
        json_values_bound(body.as_bytes()),
        charge as f64 / body.len() as f64
    );
    assert!(
        peak <= charge,
        "{name}: decoding held {peak} bytes, charged {charge}"
    );
}

fn repeat(open: &str, item: &str, n: usize, close: &str) -> String {
    let mut s = String::with_capacity(open.len() + (item.len() + 1) * n + close.len());
    s.push_str(open);
    for i in 0..n {
        if i > 0 {
            s.push(',');
        }
        s.push_str(item);
    }
    s.push_str(close);
    s
}

#[test]
fn the_charge_covers_what_the_worst_shapes_decode_into() {
    let n = 200_000;
    check::<Value>("numbers", &repeat("[", "0", n, "]"));
    check::<Value>("empty arrays", &repeat("[", "[]", n, "]"));
    check::<Value>("empty objects", &repeat("[", "{}", n, "]"));
    check::<Vec<String>>("empty strings", &repeat("[", "\"\"", n, "]"));
    check::<Value>("one-letter keys", &{
        let mut s = String::from("{");
        for i in 0..n {
            if i > 0 {
                s.push(',');
            }
            s.push_str(&format!("\"{i}\":0"));
        }
        s.push('}');
        s
    });
    check::<Value>(
        "small objects",
        &repeat("[", "{\"a\":0,\"b\":[]}", n / 4, "]"),
    );
    check::<Value>(
        "nesting",
        &repeat(
            "[",
            &format!("{}{}", "[".repeat(100), "]".repeat(100)),
            2000,
            "]",
        ),
    );
    check::<Vec<TurnInput>>(
        "tiny turns",
        &repeat(
            "[",
            "{\"context\":[{\"role\":\"user\",\"content\":\"\"}],\"responses\":[\"\",\"\"],\"gold\":[0,0]}",
            n / 8,
            "]",
        ),
    );
    // An ordinary body: long strings, few values, so the charge is close to the text.
    let body = repeat("[", &format!("\"{}\"", "a".repeat(8000)), 500, "]");
    check::<Vec<String>>("long strings", &body);
    let charge = body.len() + BYTES_PER_JSON_VALUE * json_values_bound(body.as_bytes());
    assert!(charge < body.len() * 11 / 10);
}

#[test]
fn the_value_bound_counts_structure_outside_strings_only() {
    assert_eq!(json_values_bound(b"0"), 1);
    assert_eq!(json_values_bound(b"[1,2,3]"), 4);
    assert_eq!(json_values_bound(b"{\"a\":1}"), 3);
    assert_eq!(json_values_bound(b"\"[,:{\""), 1);
    assert_eq!(json_values_bound(b"[\"\\\",\",1]"), 3);
}
