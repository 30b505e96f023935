//! `care advantages`: the advantages of one batch per line: group-relative advantages of
//! outcome rewards (SPEC §9, §18), or the token-level estimators (GAE, REINFORCE++; SPEC §18)
//! over token rewards, each optionally whitened over the batch's tokens.

use crate::input::{
    Line, Members, check_layout, f32_array, mask_array, object, optional, required, same_length,
    u32_array, usize_value,
};
use crate::json::{LineError, Obj};
use care_core::grpo::{
    AdvantageEstimator, AdvantageOptions, GaeOptions, GroupInputs, GroupLayout, GroupStats,
    WhitenOptions, broadcast_to_tokens, discounted_returns, discounted_returns_whitened, gae,
    gae_whitened, group_advantages_with, narrow_f32, whiten,
};

/// Resolved options of `care advantages`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Options {
    /// Which estimator.
    pub estimator: AdvantageEstimator,
    /// The group estimator's options.
    pub group: AdvantageOptions,
    /// The token-level estimators' discount and GAE lambda.
    pub gae: GaeOptions,
    /// Whiten the token advantages over the line's counted tokens.
    pub whiten: Option<WhitenOptions>,
}

impl From<AdvantageOptions> for Options {
    /// The group estimator with these options, no whitening.
    fn from(group: AdvantageOptions) -> Self {
        Options {
            estimator: AdvantageEstimator::Group,
            group,
            gae: GaeOptions::default(),
            whiten: None,
        }
    }
}

impl Default for Options {
    fn default() -> Self {
        AdvantageOptions::default().into()
    }
}

/// The members the group estimator reads (besides `id` and `meta`).
pub const GROUP_MEMBERS: &[&str] = &[
    "rewards",
    "group_size",
    "group_offsets",
    "valid",
    "lengths",
    "baselines",
    "seq_offsets",
    "mask",
];

/// The members the token-level estimators read (besides `id` and `meta`).
pub const GAE_MEMBERS: &[&str] = &["token_rewards", "values", "seq_offsets", "mask"];

/// The members an input line may hold under `opts`. The two token-level estimators share one
/// line shape (REINFORCE++ does not read `values`, so one file serves both); a group member
/// under a token-level estimator, or the reverse, is unknown: an error, never ignored.
pub fn members(opts: &Options) -> &'static [&'static str] {
    match opts.estimator {
        AdvantageEstimator::Group => GROUP_MEMBERS,
        AdvantageEstimator::Gae | AdvantageEstimator::ReinforcePp => GAE_MEMBERS,
    }
}

/// Reads one line and writes its advantages:
///
/// * group: `{"rewards", "group_size" | "group_offsets", "valid"?, "lengths"?, "baselines"?,
///   "seq_offsets"?, "mask"?}` gives `advantages` and `groups`, plus `token_advantages` (the
///   broadcast, whitened with `--whiten`) when `seq_offsets` is given;
/// * gae: `{"token_rewards", "values", "seq_offsets", "mask"?}` gives `advantages` and
///   `returns` per token;
/// * reinforce_pp: `{"token_rewards", "seq_offsets", "mask"?}` gives `returns` and
///   `advantages` (the returns, whitened with `--whiten`).
pub fn run(opts: &Options, line: &Line<'_>, o: &mut Obj<'_>) -> Result<(), LineError> {
    let m = object(line)?;
    match opts.estimator {
        AdvantageEstimator::Group => group(opts, m, o),
        AdvantageEstimator::Gae | AdvantageEstimator::ReinforcePp => token_level(opts, m, o),
    }
}

fn group(opts: &Options, m: &Members<'_>, o: &mut Obj<'_>) -> Result<(), LineError> {
    // A null reward is an invalid sample; the core treats NaN exactly that way.
    let rewards = f32_array(required(m, "rewards")?, "rewards", true)?;
    let valid = optional(m, "valid")
        .map(|v| mask_array(v, "valid"))
        .transpose()?;
    let lengths = optional(m, "lengths")
        .map(|v| u32_array(v, "lengths"))
        .transpose()?;
    let baselines = optional(m, "baselines")
        .map(|v| f32_array(v, "baselines", true))
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
    if let Some(v) = &lengths {
        same_length("lengths", v.len(), "rewards", rewards.len())?;
    }
    if let Some(v) = &baselines {
        same_length("baselines", v.len(), "rewards", rewards.len())?;
    }
    let inputs = GroupInputs {
        lengths: lengths.as_deref(),
        baselines: baselines.as_deref(),
        ..GroupInputs::new(&rewards, valid.as_deref(), layout)
    };
    // In f64 until the output: the token advantages are broadcast and whitened unrounded.
    let mut adv64 = vec![0.0f64; rewards.len()];
    let mut stats = vec![GroupStats::default(); groups];
    group_advantages_with(&inputs, &opts.group, &mut adv64, Some(&mut stats))?;
    let adv: Vec<f32> = adv64.iter().map(|&a| narrow_f32(a)).collect();
    let tokens = match optional(m, "seq_offsets") {
        Some(v) => {
            let seq_offsets = u32_array(v, "seq_offsets")?;
            let mask = optional(m, "mask")
                .map(|v| mask_array(v, "mask"))
                .transpose()?;
            let t = seq_offsets.last().copied().unwrap_or(0) as usize;
            let mut tok = vec![0.0f64; t];
            broadcast_to_tokens(&adv64, &seq_offsets, mask.as_deref(), &mut tok)?;
            if let Some(w) = &opts.whiten {
                whiten(&mut tok, mask.as_deref(), w)?;
            }
            Some(tok.iter().map(|&a| narrow_f32(a)).collect::<Vec<f32>>())
        }
        None if opts.whiten.is_some() => {
            return Err(LineError::schema(
                "--whiten needs \"seq_offsets\" (the token layout to whiten over)",
            ));
        }
        None => None,
    };
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
    if let Some(tok) = tokens {
        o.f32s("token_advantages", &tok);
    }
    Ok(())
}

fn token_level(opts: &Options, m: &Members<'_>, o: &mut Obj<'_>) -> Result<(), LineError> {
    let rewards = f32_array(required(m, "token_rewards")?, "token_rewards", false)?;
    let seq_offsets = u32_array(required(m, "seq_offsets")?, "seq_offsets")?;
    let mask = optional(m, "mask")
        .map(|v| mask_array(v, "mask"))
        .transpose()?;
    let t = rewards.len();
    let (mut adv, mut ret) = (vec![0.0f32; t], vec![0.0f32; t]);
    let mk = mask.as_deref();
    // With --whiten, the estimator whitens its own f64 values (never rounded before).
    match (opts.estimator, &opts.whiten) {
        (AdvantageEstimator::Gae, w) => {
            let values = f32_array(required(m, "values")?, "values", false)?;
            let g = &opts.gae;
            match w {
                Some(w) => {
                    gae_whitened(
                        &rewards,
                        &values,
                        &seq_offsets,
                        mk,
                        g,
                        w,
                        &mut adv,
                        &mut ret,
                    )?;
                }
                None => gae(&rewards, &values, &seq_offsets, mk, g, &mut adv, &mut ret)?,
            }
        }
        (_, Some(w)) => {
            discounted_returns_whitened(
                &rewards,
                &seq_offsets,
                mk,
                &opts.gae,
                w,
                &mut adv,
                &mut ret,
            )?;
        }
        (_, None) => {
            discounted_returns(&rewards, &seq_offsets, mk, &opts.gae, &mut ret)?;
            adv.copy_from_slice(&ret);
        }
    }
    o.f32s("advantages", &adv).f32s("returns", &ret);
    Ok(())
}
