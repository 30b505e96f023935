//! Secrets stay out of logs: the API key of an endpoint, read from the environment, never
//! shows in a `Debug` of the engine. One test in its own binary, so that setting the variable
//! races with no other thread.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use care_loop::{BackendKind, EndpointConfig, Engine, LoopConfig, Metrics};

/// The API key read from the environment never shows in a `Debug` of the engine (a log line).
#[test]
fn the_api_key_stays_out_of_debug_output() {
    // SAFETY: the only test of this binary: no other thread reads the environment now.
    unsafe { std::env::set_var("CARE_TEST_JUDGE_KEY", "sk-very-secret") };
    let mut cfg = LoopConfig {
        generator: EndpointConfig::new("http://127.0.0.1:9/v1", "g"),
        judge: EndpointConfig::new("http://127.0.0.1:9/v1", "j").into(),
        ..LoopConfig::default()
    };
    cfg.judge.judges[0].endpoint.api_key_env = Some("CARE_TEST_JUDGE_KEY".into());
    let e = Engine::new(&cfg, BackendKind::Http, None, Arc::new(Metrics::new())).unwrap();
    let text = format!("{e:?}");
    assert!(!text.contains("sk-very-secret"), "{text}");
    assert!(text.contains("<set>"), "{text}");
}
