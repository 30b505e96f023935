//! `care_rl._care`: the Python extension module of `care` (PyO3, stable ABI for CPython >= 3.9).
//!
//! The Python package `care_rl` wraps these functions with type hints, docstrings and numpy
//! conversions; `care_rl.torch` registers the PyTorch custom ops on top of them. Arrays cross
//! the boundary through DLPack ([`dlpack`]), results come back as the dataclasses of
//! `care_rl._types`, and every error is a `care_rl.CareError` with the core's stable code.

mod cuda;
mod dlpack;
mod error;
mod grpo;
mod names;
mod options;
mod profile;
mod reward;
mod template;

use care_core::grpo::{Combine, FieldKind, LOSS_STATS_LAYOUT};
use care_kernels::params::{LOSS_STATS_DEVICE_LAYOUT, ROLLOUT_STATS_DEVICE_LAYOUT};
use pyo3::prelude::*;

fn kind(k: FieldKind) -> &'static str {
    k.c_name()
}

fn combine(c: Combine) -> &'static str {
    match c {
        Combine::Sum => "sum",
        Combine::Min => "min",
        Combine::Max => "max",
    }
}

#[pymodule]
fn _care(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("CareError", py.get_type::<error::CareError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // The statistics layouts, from the one table of each (care_core::grpo::LOSS_STATS_LAYOUT
    // for the host struct, care_kernels' LOSS_STATS_DEVICE_LAYOUT for the device accumulator):
    // (name, C type, byte offset, how partial values combine).
    let host: Vec<_> = LOSS_STATS_LAYOUT
        .iter()
        .map(|f| (f.name, kind(f.kind), f.offset, combine(f.combine)))
        .collect();
    let device: Vec<_> = LOSS_STATS_DEVICE_LAYOUT
        .iter()
        .map(|f| (f.name, kind(f.kind), f.offset, combine(f.combine)))
        .collect();
    m.add("LOSS_STATS_FIELDS", host)?;
    m.add("ROLLOUT_STATS_FIELDS", grpo::ROLLOUT_STATS_FIELDS.to_vec())?;
    m.add("LOGITS_NO_ROLLOUT", grpo::LOGITS_NO_ROLLOUT)?;
    m.add("LOSS_STATS_DEVICE_FIELDS", device)?;
    // The raw device rollout diagnostics (care_kernels' ROLLOUT_STATS_DEVICE_LAYOUT), in the
    // same form; the host form is ROLLOUT_STATS_FIELDS.
    let rollout_device: Vec<_> = ROLLOUT_STATS_DEVICE_LAYOUT
        .iter()
        .map(|f| (f.name, kind(f.kind), f.offset, combine(f.combine)))
        .collect();
    m.add("ROLLOUT_STATS_DEVICE_FIELDS", rollout_device)?;
    m.add("WORKSPACE_BYTES", care_kernels::WORKSPACE_BYTES)?;
    m.add_function(wrap_pyfunction!(error::error, m)?)?;
    m.add_function(wrap_pyfunction!(options::advantage_options, m)?)?;
    m.add_function(wrap_pyfunction!(options::loss_options, m)?)?;
    m.add_function(wrap_pyfunction!(options::advantage_option_fields, m)?)?;
    m.add_function(wrap_pyfunction!(options::loss_option_fields, m)?)?;
    m.add_class::<reward::Rubric>()?;
    m.add_function(wrap_pyfunction!(reward::validate, m)?)?;
    m.add_function(wrap_pyfunction!(reward::format_reward, m)?)?;
    m.add_function(wrap_pyfunction!(reward::policy_reward, m)?)?;
    m.add_function(wrap_pyfunction!(reward::policy_reward_group, m)?)?;
    m.add_function(wrap_pyfunction!(reward::preference_reward, m)?)?;
    m.add_function(wrap_pyfunction!(reward::generator_reward, m)?)?;
    m.add_function(wrap_pyfunction!(reward::alignment, m)?)?;
    m.add_function(wrap_pyfunction!(reward::strategy_counts, m)?)?;
    m.add_function(wrap_pyfunction!(reward::render_judge_prompt, m)?)?;
    m.add_function(wrap_pyfunction!(reward::parse_judge_output, m)?)?;
    m.add_class::<profile::Profile>()?;
    m.add("PROFILE_NAMES", care_core::profile::BUILTIN_NAMES.to_vec())?;
    m.add_function(wrap_pyfunction!(profile::validate_profile, m)?)?;
    m.add_function(wrap_pyfunction!(profile::check_output, m)?)?;
    m.add_function(wrap_pyfunction!(profile::profile_reward, m)?)?;
    m.add_function(wrap_pyfunction!(profile::profile_reward_group, m)?)?;
    m.add_function(wrap_pyfunction!(profile::render_profile_judge_prompt, m)?)?;
    m.add_function(wrap_pyfunction!(profile::parse_profile_judge_output, m)?)?;
    m.add(
        "TEMPLATE_FAMILIES",
        care_core::template::TemplateFamily::NAMES.to_vec(),
    )?;
    m.add_function(wrap_pyfunction!(template::read_prompt, m)?)?;
    m.add_function(wrap_pyfunction!(template::strip_end_tokens, m)?)?;
    m.add_function(wrap_pyfunction!(grpo::group_advantages, m)?)?;
    m.add_function(wrap_pyfunction!(grpo::group_partial_sums, m)?)?;
    m.add_function(wrap_pyfunction!(grpo::group_partial_squares, m)?)?;
    m.add_function(wrap_pyfunction!(grpo::group_advantages_finalize, m)?)?;
    m.add_function(wrap_pyfunction!(grpo::policy_loss, m)?)?;
    m.add_function(wrap_pyfunction!(grpo::policy_loss_workspace_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(grpo::rollout_correction, m)?)?;
    m.add_function(wrap_pyfunction!(grpo::discounted_returns, m)?)?;
    m.add_function(wrap_pyfunction!(grpo::gae, m)?)?;
    m.add_function(wrap_pyfunction!(grpo::whiten, m)?)?;
    m.add_function(wrap_pyfunction!(grpo::discounted_returns_whitened, m)?)?;
    m.add_function(wrap_pyfunction!(grpo::gae_whitened, m)?)?;
    m.add_function(wrap_pyfunction!(grpo::selective_log_softmax, m)?)?;
    m.add_function(wrap_pyfunction!(grpo::selective_log_softmax_backward, m)?)?;
    m.add_function(wrap_pyfunction!(grpo::logits_policy_loss, m)?)?;
    m.add_function(wrap_pyfunction!(cuda::check_advantage_status, m)?)?;
    m.add_function(wrap_pyfunction!(cuda::check_log_softmax_status, m)?)?;
    m.add_function(wrap_pyfunction!(cuda::check_tokens_status, m)?)?;
    m.add_function(wrap_pyfunction!(cuda::check_whiten_status, m)?)?;
    m.add_function(wrap_pyfunction!(cuda::check_whitened_status, m)?)?;
    m.add_function(wrap_pyfunction!(grpo::logits_policy_loss_fused, m)?)?;
    m.add_function(wrap_pyfunction!(grpo::fused_supported, m)?)?;
    m.add_function(wrap_pyfunction!(grpo::whitened_workspace_bytes, m)?)?;
    m.add("WHITENED_STATUS_WORD", cuda::WHITENED_STATUS_WORD)?;
    m.add("WHITEN_MEAN_STD_F64", cuda::WHITEN_MEAN_STD_F64)?;
    m.add_function(wrap_pyfunction!(cuda::cuda_driver_available, m)?)?;
    Ok(())
}
