//! The reward loop's reading of LLM answers on arbitrary bytes: a chat-completion body or an
//! event stream (the first byte picks the `Content-Type`), and a `Retry-After` value. Never
//! panics; an answer's text is never longer than the body it came from (it is decoded from
//! it); a `Retry-After` is a non-negative number or nothing, and the wait made of it never
//! exceeds the cap, whatever the cap.
#![no_main]

use care_loop::config::{MAX_SECS, saturating_secs};
use care_loop::llm::{decode_answer, parse_retry_after};
use libfuzzer_sys::fuzz_target;
use std::time::Duration;

fuzz_target!(|data: &[u8]| {
    let Some((&kind, body)) = data.split_first() else {
        return;
    };
    let content_type = match kind % 4 {
        0 => None,
        1 => Some("application/json"),
        2 => Some("text/event-stream"),
        _ => Some(" TEXT/EVENT-STREAM; charset=utf-8"),
    };
    if let Ok((text, _usage)) = decode_answer(content_type, body) {
        assert!(text.len() <= body.len(), "{} > {}", text.len(), body.len());
    }
    // The same bytes as a header value and a cap.
    let value = String::from_utf8_lossy(body);
    let cap = f64::from(kind) * 0.25;
    match parse_retry_after(&value) {
        Some(v) => {
            assert!(v >= 0.0 && !v.is_nan(), "{value:?} -> {v}");
            assert!(saturating_secs(v, cap) <= Duration::from_secs_f64(cap));
        }
        None => {}
    }
    let d = saturating_secs(
        f64::from_bits(u64::from_le_bytes(
            body.get(..8)
                .and_then(|b| b.try_into().ok())
                .unwrap_or([0; 8]),
        )),
        cap,
    );
    assert!(d <= Duration::from_secs_f64(cap.min(MAX_SECS)));
});
