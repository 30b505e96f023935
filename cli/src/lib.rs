//! `care-cli`: the library behind the `care` binary.
//!
//! The binary is a thin `clap` front end; everything it does per input line lives here so that a
//! fuzzer or a test can call exactly the code path the binary uses ([`process_line`]), and the
//! streaming engine ([`engine::run`]) can be driven on any reader and writer.
#![deny(missing_docs)]

pub mod analyze;
pub mod app;
pub mod args;
pub mod cmd;
pub mod demo;
pub mod device;
pub mod engine;
pub mod gpu;
pub mod input;
pub mod json;
pub mod reward_loop;
pub mod scan;

pub use cmd::{Command, process_line, process_line_reference};
pub use engine::{EngineOptions, Summary};
