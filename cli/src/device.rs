//! The GRPO step (advantages and loss) behind one trait, [`GrpoDevice`], with the CPU
//! reference of `care-core` as [`Cpu`]; [`crate::gpu`] adds the CUDA kernels. The demo picks
//! one at run time; neither implementation knows about the demo.

use care_core::grpo::{
    AdvantageOptions, GroupLayout, GroupStats, LossInputs, LossOptions, LossOutput,
    group_advantages, policy_loss,
};

/// The GRPO step (advantages and loss) on some device.
pub trait GrpoDevice {
    /// The device as printed in the table, e.g. `"CPU (care-core reference)"`.
    fn name(&self) -> String;
    /// Group advantages, as [`care_core::grpo::group_advantages`].
    fn advantages(
        &self,
        rewards: &[f32],
        layout: GroupLayout<'_>,
        opts: &AdvantageOptions,
        out: &mut [f32],
        stats: &mut [GroupStats],
    ) -> Result<(), String>;
    /// The clipped-ratio loss and its gradient, as [`care_core::grpo::policy_loss`].
    fn loss(
        &self,
        inputs: &LossInputs<'_, f32>,
        opts: &LossOptions,
        grad: &mut [f32],
    ) -> Result<LossOutput, String>;
}

/// The CPU reference of `care-core`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cpu;

impl GrpoDevice for Cpu {
    fn name(&self) -> String {
        "CPU (care-core reference)".to_owned()
    }
    fn advantages(
        &self,
        rewards: &[f32],
        layout: GroupLayout<'_>,
        opts: &AdvantageOptions,
        out: &mut [f32],
        stats: &mut [GroupStats],
    ) -> Result<(), String> {
        group_advantages(rewards, None, layout, opts, out, Some(stats)).map_err(|e| e.to_string())
    }
    fn loss(
        &self,
        inputs: &LossInputs<'_, f32>,
        opts: &LossOptions,
        grad: &mut [f32],
    ) -> Result<LossOutput, String> {
        policy_loss(inputs, opts, grad).map_err(|e| e.to_string())
    }
}
