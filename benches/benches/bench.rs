//! The one criterion harness of `care` (see the README "Performance" section for the commands).
// Setup reads the checked-in fixtures, which are valid; a failure there is a broken bench.
#![allow(clippy::expect_used)]
use criterion::{criterion_group, criterion_main};

mod cli;
mod grpo;
mod rubric;

criterion_group!(
    benches,
    rubric::register_benches,
    grpo::register_benches,
    cli::register_benches,
    cli::register_shape_benches
);
criterion_main!(benches);
