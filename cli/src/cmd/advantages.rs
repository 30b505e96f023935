//! `care advantages`: group-relative advantages of one batch per line (SPEC §9).

use crate::input::{
    Line, check_layout, f32_array, mask_array, object, optional, required, same_length, u32_array,
    usize_value,
};
use crate::json::{LineError, Obj};
use care_core::grpo::{AdvantageOptions, GroupLayout, GroupStats, group_advantages};

/// Resolved options: the core's [`AdvantageOptions`].
pub type Options = AdvantageOptions;

/// The members of an input line (besides `id` and `meta`).
pub const MEMBERS: &[&str] = &["rewards", "group_size", "group_offsets", "valid"];

/// Reads `{"rewards", "group_size" | "group_offsets", "valid"?}` and writes `advantages` and
/// `groups`.
pub fn run(opts: &Options, line: &Line<'_>, o: &mut Obj<'_>) -> Result<(), LineError> {
    let m = object(line)?;
    // A null reward is an invalid sample; the core treats NaN exactly that way.
    let rewards = f32_array(required(m, "rewards")?, "rewards", true)?;
    let valid = optional(m, "valid")
        .map(|v| mask_array(v, "valid"))
        .transpose()?;
    let offsets;
    let layout = match (optional(m, "group_size"), optional(m, "group_offsets")) {
        (Some(g), None) => GroupLayout::Fixed {
            group_size: usize_value(g, "group_size")?,
        },
        (None, Some(v)) => {
            offsets = u32_array(v, "group_offsets")?;
            GroupLayout::Offsets(&offsets)
        }
        (Some(_), Some(_)) => {
            return Err(LineError::schema(
                "give either \"group_size\" or \"group_offsets\", not both",
            ));
        }
        (None, None) => {
            return Err(LineError::schema(
                "missing key \"group_size\" (or \"group_offsets\")",
            ));
        }
    };
    let layout_name = match layout {
        GroupLayout::Fixed { .. } => "group_size",
        GroupLayout::Offsets(_) => "group_offsets",
    };
    let groups = check_layout(layout, rewards.len(), layout_name, "rewards")?;
    if let Some(v) = &valid {
        same_length("valid", v.len(), "rewards", rewards.len())?;
    }
    let mut adv = vec![0.0f32; rewards.len()];
    let mut stats = vec![GroupStats::default(); groups];
    group_advantages(
        &rewards,
        valid.as_deref(),
        layout,
        opts,
        &mut adv,
        Some(&mut stats),
    )?;
    o.f32s("advantages", &adv);
    o.arr("groups", |a| {
        for s in &stats {
            a.obj(|g| {
                g.u64("count", u64::from(s.count))
                    .f32("mean", s.mean)
                    .f32("std", s.std)
                    .bool("zero_variance", s.zero_variance != 0);
            });
        }
    });
    Ok(())
}
