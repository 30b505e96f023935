//! `care serve`'s request decoding on arbitrary bodies, through its real routes (the router
//! of `care_loop::server`, with the scripted backend so that no LLM is asked, and small
//! limits so that the limits are hit often): `/get_reward` (OpenRLHF) and `/v1/reward`
//! (groups). Never panics; the answer is 200, or a client error (400, 408, 413, 429) or the
//! `no_reward` 502 of the error policy, always with a JSON body, and an error carries a
//! stable code; afterwards the server-wide budget is entirely free again.
#![no_main]

use std::sync::{Arc, LazyLock};

use axum::body::Body;
use axum::http::Request;
use care_loop::engine::OnFailure;
use care_loop::server::{Server, ServerOptions};
use care_loop::{BackendKind, Engine, LoopConfig, Metrics};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use tower::ServiceExt;

struct Fixture {
    rt: tokio::runtime::Runtime,
    servers: [Server; 2],
}

static FIXTURE: LazyLock<Fixture> = LazyLock::new(|| {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let engine = Arc::new(
        Engine::new(
            &LoopConfig::default(),
            BackendKind::Scripted,
            None,
            Arc::new(Metrics::new()),
        )
        .expect("the scripted engine"),
    );
    let server = |policy| {
        let opts = ServerOptions {
            openrlhf_on_failure: policy,
            max_body_bytes: 64 << 10,
            max_turns: 8,
            max_responses: 32,
            max_text_bytes: 4096,
            max_inflight_bytes: 8 << 20,
            max_inflight_turns: 8,
            max_inflight_responses: 32,
            ..ServerOptions::default()
        };
        opts.check().expect("valid limits");
        Server::new(Arc::clone(&engine), opts, "scripted")
    };
    Fixture {
        rt,
        servers: [server(OnFailure::GroupMean), server(OnFailure::Error)],
    }
});

fuzz_target!(|data: &[u8]| {
    let Some((&sel, body)) = data.split_first() else {
        return;
    };
    let f = &*FIXTURE;
    let server = &f.servers[usize::from(sel & 1)];
    let route = if sel & 2 == 0 {
        "/get_reward"
    } else {
        "/v1/reward"
    };
    let req = Request::post(route)
        .header("content-type", "application/json")
        .body(Body::from(body.to_vec()))
        .expect("a request");
    let (status, bytes) = f.rt.block_on(async {
        let resp = server.router().oneshot(req).await.expect("infallible");
        let status = resp.status().as_u16();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .expect("the answer body");
        (status, bytes)
    });
    assert!(
        matches!(status, 200 | 400 | 408 | 413 | 429 | 502),
        "{route}: status {status}: {}",
        String::from_utf8_lossy(&bytes)
    );
    let v: Value = serde_json::from_slice(&bytes).expect("a JSON answer");
    if status != 200 {
        assert!(v["error"]["code"].is_string(), "{v}");
        assert_eq!(status == 502, v["error"]["code"] == "no_reward", "{v}");
    }
    assert_eq!(server.budget_in_use(), (0, 0, 0));
});
