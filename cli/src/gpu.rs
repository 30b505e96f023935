//! The GRPO step ([`GrpoDevice`]) on a CUDA device, through `care-kernels`.
//!
//! Used only when [`care_kernels::cuda::driver_available`] finds a driver and device 0 opens;
//! everything is copied to the device, run with the synchronous `*_on` API, and copied back,
//! which is the simplest correct use for a demo (a trainer passes its own device pointers).

use std::sync::Arc;

use care_core::grpo::{
    AdvantageOptions, Advantages, GroupLayout, GroupStats, LossInputs, LossOptions, LossOutput,
};
use care_kernels::cuda::{self, DeviceAdvantageInputs, DeviceLossInputs};
use cudarc::driver::{CudaContext, CudaStream};

use crate::device::GrpoDevice;

/// Device 0's default stream.
#[derive(Debug)]
pub struct Gpu {
    stream: Arc<CudaStream>,
    name: String,
}

impl Gpu {
    /// Opens device 0, or `None` without a driver or device (checked before any context is
    /// created, since creating one without a driver would panic inside `cudarc`).
    pub fn open() -> Option<Gpu> {
        if !cuda::driver_available() {
            return None;
        }
        let ctx = CudaContext::new(0).ok()?;
        let name = ctx.name().unwrap_or_else(|_| "CUDA device 0".to_owned());
        Some(Gpu {
            stream: ctx.default_stream(),
            name,
        })
    }
}

fn driver<E: std::fmt::Debug>(e: E) -> String {
    format!("CUDA: {e:?}")
}

impl GrpoDevice for Gpu {
    fn name(&self) -> String {
        format!("GPU: {} (care-kernels)", self.name)
    }

    fn advantages(
        &self,
        rewards: &[f32],
        layout: GroupLayout<'_>,
        opts: &AdvantageOptions,
        out: &mut [f32],
        stats: &mut [GroupStats],
    ) -> Result<(), String> {
        let s = &self.stream;
        let d_rewards = s.clone_htod(rewards).map_err(driver)?;
        let mut d_out = s.alloc_zeros::<f32>(rewards.len()).map_err(driver)?;
        let (group_size, offsets) = match layout {
            GroupLayout::Fixed { group_size } => (
                u32::try_from(group_size).map_err(|_| "group size exceeds u32".to_owned())?,
                None,
            ),
            GroupLayout::Offsets(o) => (0, Some(s.clone_htod(o).map_err(driver)?)),
        };
        let inputs = DeviceAdvantageInputs {
            rewards: &d_rewards,
            valid: None,
            group_size,
            offsets: offsets.as_ref(),
        };
        cuda::group_advantages_on(s, &inputs, opts, &mut d_out, Some(stats))
            .map_err(|e| e.to_string())?;
        let host = s.clone_dtoh(&d_out).map_err(driver)?;
        out.copy_from_slice(&host);
        Ok(())
    }

    fn loss(
        &self,
        inputs: &LossInputs<'_, f32>,
        opts: &LossOptions,
        grad: &mut [f32],
    ) -> Result<LossOutput, String> {
        let s = &self.stream;
        let up = |v: &[f32]| s.clone_htod(v).map_err(driver);
        let logp = up(inputs.logp)?;
        let logp_old = inputs.logp_old.map(up).transpose()?;
        let logp_ref = inputs.logp_ref.map(up).transpose()?;
        let logp_rollout = inputs.logp_rollout.map(up).transpose()?;
        let (adv, adv_per_token) = match inputs.advantages {
            Advantages::PerSequence(a) => (up(a)?, false),
            Advantages::PerToken(a) => (up(a)?, true),
        };
        let mask = inputs
            .mask
            .map(|m| s.clone_htod(m).map_err(driver))
            .transpose()?;
        let seq_offsets = s.clone_htod(inputs.seq_offsets).map_err(driver)?;
        let max_seq_len = inputs
            .seq_offsets
            .windows(2)
            .map(|w| w[1].saturating_sub(w[0]))
            .max()
            .unwrap_or(0);
        let mut d_grad = s.alloc_zeros::<f32>(inputs.logp.len()).map_err(driver)?;
        let out = cuda::grpo_loss_with_on(
            s,
            &DeviceLossInputs {
                logp: &logp,
                logp_old: logp_old.as_ref(),
                logp_ref: logp_ref.as_ref(),
                adv: &adv,
                adv_per_token,
                mask: mask.as_ref(),
                seq_offsets: &seq_offsets,
                max_seq_len,
                logp_rollout: logp_rollout.as_ref(),
            },
            opts,
            &mut d_grad,
        )
        .map_err(|e| e.to_string())?;
        let host = s.clone_dtoh(&d_grad).map_err(driver)?;
        if host.len() != grad.len() {
            return Err(care_core::Error::LengthMismatch.to_string());
        }
        grad.copy_from_slice(&host);
        Ok(out)
    }
}
