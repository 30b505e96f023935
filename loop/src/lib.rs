//! `care-loop`: the CARE reward loop end to end (paper section 3.4).
//!
//! At each dialogue turn the rubric generator writes a rubric for the context; the rubric is
//! checked against the format contract of `care-core` and repaired with the validator's
//! messages a bounded number of times; a rubric-conditioned judge scores every response of the
//! GRPO group under that one rubric (bounded retries on unusable answers); Eq. 5 gives the
//! rewards. Every LLM call goes through a durable SQLite cache, so a stopped run resumes
//! without repeating a completed call.
//!
//! Surfaces: [`batch::run_jsonl`] (`care reward`), [`server`] (`care serve`: OpenRLHF's
//! `/get_reward`, a JSON API for whole groups, health and Prometheus metrics). The rubric
//! format sits behind [`profile::RubricProfile`], the one seam another profile plugs into.
//!
//! Failure semantics: every turn has a rubric status (`ok`, `invalid_rubric`,
//! `generator_error`) and every response a status (`ok`, `judge_invalid`, `judge_error`,
//! `no_rubric`); a response without a usable judgment has a `null` reward, never a 0.
//! Trainers that cannot take `null` choose an explicit [`engine::OnFailure`] policy.
#![deny(missing_docs)]

pub mod batch;
pub mod cache;
pub mod config;
pub mod engine;
pub mod fixed;
mod jsonw;
pub mod llm;
pub mod log;
pub mod metrics;
pub mod panel;
mod pool;
pub mod profile;
pub mod redis_server;
pub mod scripted;
pub mod server;
pub mod stub;
pub mod template;

pub use cache::Cache;
pub use config::{EndpointConfig, JudgeConfig, JudgeSpec, LoopConfig, PanelConfig};
pub use engine::{BackendKind, Engine, OnFailure, TurnInput, TurnResult};
pub use metrics::Metrics;
