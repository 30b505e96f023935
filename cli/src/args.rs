//! Command-line arguments of `care` (clap derive), with an example in every help text.

use std::path::PathBuf;

use care_core::grpo::{
    AdvantageEstimator, Aggregation, Baseline, Bypass, IsLevel, KlEstimator, LossPreset,
    MaskedToken, PolicyLoss, Preset, RatioLevel, RejectionMode, Reweight, Scale, SequenceCount,
    SingletonPolicy, StdKind,
};
use care_core::{
    GeneratorOptions, MissingPolicy, Named, PreferenceOptions, RangePolicy, ScoreScale,
    UnknownLabelPolicy,
};
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::{Args, Parser, Subcommand};

const MAIN_AFTER: &str = "\
Every data subcommand reads JSON Lines (a file, or `-` for stdin) and writes exactly one JSON line
per input line to stdout, in input order, each with \"line\" (1-based). A line that cannot be
processed gives {\"line\":n,\"error\":{\"code\":\"...\",\"message\":\"...\"}} and processing goes on.
Members a subcommand does not read are ignored; an \"id\" member is copied to the output line.

Exit status: 0 when every line was read (per-line errors are data), 1 with --strict when any line
failed, 2 on usage or I/O errors (one line on stderr).

Examples:
  care demo
  care validate rubrics.jsonl > report.jsonl
  echo '{\"rewards\":[1,0,0.5,0.5],\"group_size\":2}' | care advantages --preset trl -";

/// A clap value parser for a `care-core` enum: the possible values and their help come from
/// the core's names ([`Named`]), so `--help`, the error for a bad value and its "similar
/// value" tip list exactly what the library accepts.
pub fn named<T: Named + Send + Sync>() -> impl TypedValueParser<Value = T> {
    // The possible-values parser has already accepted the string, so `from_name` finds it.
    PossibleValuesParser::new(T::ALL.iter().map(|v| possible(*v)))
        .try_map(|s| T::from_name(&s).ok_or(care_core::UnknownName::of::<T>()))
}

fn possible<T: Named>(v: T) -> PossibleValue {
    PossibleValue::new(v.name()).help(v.help())
}

/// The command-line flag that sets an options field, for messages about invalid options.
/// Flags are the fields' names in kebab case, except where the CLI chose a shorter name.
pub fn flag_of(field: &str) -> String {
    match field {
        "eps_low" => "--clip-low".to_owned(),
        "eps_high" => "--clip-high".to_owned(),
        "global_sequences" => "--global-seqs".to_owned(),
        "ratio_level" => "--ratio".to_owned(),
        "rollout.reject" => "--rollout-rs-threshold".to_owned(),
        "rollout.is_level" => "--rollout-is".to_owned(),
        f => format!("--{}", f.replace(['_', '.'], "-")),
    }
}

/// `care`: CARE empathy rubrics as RL rewards, on JSON Lines.
#[derive(Debug, Parser)]
#[command(
    name = "care",
    version,
    about = "CARE empathy rubrics as RL rewards: validate, score, generator-reward, advantages and loss on JSON Lines",
    after_help = MAIN_AFTER
)]
pub struct Cli {
    /// The subcommand.
    #[command(subcommand)]
    pub command: CliCommand,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum CliCommand {
    /// Check generated rubrics against the format contract (r_fmt and every violation).
    #[command(allow_negative_numbers = true, after_help = VALIDATE_AFTER)]
    Validate {
        /// Format policy.
        #[command(flatten)]
        format: FormatArgs,
        /// Input and engine options.
        #[command(flatten)]
        io: IoArgs,
    },
    /// Score judged responses under a rubric (policy reward, Eq. 5), or under a rubric profile.
    #[command(allow_negative_numbers = true, after_help = SCORE_AFTER)]
    Score {
        /// Score under a rubric profile: a built-in name (care, kardia) or a profile JSON file
        /// (docs/PROFILES.md). Without it, the CARE policy reward of a line's rubric.
        #[arg(long, value_name = "NAME|FILE")]
        profile: Option<String>,
        /// Scoring policy.
        #[command(flatten)]
        score: ScoreArgs,
        /// Format policy used to parse a rubric given as text.
        #[command(flatten)]
        format: FormatArgs,
        /// Input and engine options.
        #[command(flatten)]
        io: IoArgs,
    },
    /// Generator reward of a rubric from a preference pair (Eq. 4: r_pref + lambda r_align + gamma r_fmt).
    #[command(
        name = "generator-reward",
        visible_alias = "pref",
        allow_negative_numbers = true,
        after_help = GENERATOR_REWARD_AFTER
    )]
    GeneratorReward {
        /// Preference and generator-reward options.
        #[command(flatten)]
        generator: GeneratorArgs,
        /// Scoring policy.
        #[command(flatten)]
        score: ScoreArgs,
        /// Format policy (the r_fmt term).
        #[command(flatten)]
        format: FormatArgs,
        /// Input and engine options.
        #[command(flatten)]
        io: IoArgs,
    },
    /// Group-relative advantages (GRPO, Dr. GRPO, RLOO, anchor presets).
    #[command(allow_negative_numbers = true, after_help = ADV_AFTER)]
    Advantages {
        /// Advantage options.
        #[command(flatten)]
        adv: AdvArgs,
        /// Input and engine options.
        #[command(flatten)]
        io: IoArgs,
    },
    /// Clipped-ratio policy loss, its gradient and stats, for one micro-batch per line.
    #[command(allow_negative_numbers = true, after_help = LOSS_AFTER)]
    Loss {
        /// Loss options (boxed: dozens of optional fields).
        #[command(flatten)]
        loss: Box<LossArgs>,
        /// Input and engine options.
        #[command(flatten)]
        io: IoArgs,
    },
    /// Tables and charts of the paper's analyses (preference recovery, weights by turn and
    /// emotion, strategy use, format health) from JSON Lines, into a report directory.
    #[command(allow_negative_numbers = true, after_help = crate::analyze::cli::AFTER_HELP)]
    Analyze {
        /// Report options.
        #[command(flatten)]
        analyze: crate::analyze::cli::AnalyzeArgs,
        /// Scoring policy for pairs given as scores.
        #[command(flatten)]
        score: ScoreArgs,
        /// Format policy for rubric text.
        #[command(flatten)]
        format: FormatArgs,
        /// Input and engine options.
        #[command(flatten)]
        io: IoArgs,
    },
    /// Run the CARE loop on bundled paper data and print it as a table.
    #[command(
        allow_negative_numbers = true,
        after_help = "Example:\n  cargo run --release -p care-cli -- demo"
    )]
    Demo,
    /// The reward loop on JSON Lines: generate a rubric per turn, judge every response, reward.
    #[command(after_help = crate::reward_loop::REWARD_AFTER)]
    Reward(crate::reward_loop::RewardArgs),
    /// The reward server (OpenRLHF /get_reward, a JSON API for groups, health, metrics).
    #[command(after_help = crate::reward_loop::SERVE_AFTER)]
    Serve(crate::reward_loop::ServeArgs),
}

const VALIDATE_AFTER: &str = "\
Input line: {\"text\": \"<raw generator output>\"}, or a rubric object (validated as the line's text).
Output: format_reward (0 or 1), violations [{code, category, criterion, message}], and when the text
parsed, weights [cog, aff, pro] and criteria (count per dimension).

Example:
  echo '{\"text\":\"not a rubric\"}' | care validate -
  care validate --allow-think --max-criteria 5 generations.jsonl";

const SCORE_AFTER: &str = "\
Input line: {\"rubric\": <object or raw text>, \"scores\": [[cog..],[aff..],[pro..]]}
  (raw 0..5 scores per dimension, criteria in rubric order; null = missing),
  or \"judge\": \"<judge output text>\" instead of \"scores\",
  or \"responses\": [{\"scores\": ..} | {\"judge\": ..}, ...] for a whole GRPO group.
Output: reward and per_dimension (or rewards and per_dimension per response for a group).

With --profile NAME|FILE (built-in: care, kardia; docs/PROFILES.md):
Input line: {\"output\": \"<policy output>\", \"scores\": {\"<dimension>\": [..], ..} or \"judge\": \"<judge output>\",
  \"emotion\": \"<gold label>\"} (plus \"rubric\" for care), or \"responses\": [{\"output\", ..}, ..].
Output: reward, format_reward, format_violations, judge_needed, emotion_correct, rubric_reward,
  per_dimension and weights (by dimension name), vetoed_by, fired (arrays for a group).

Examples:
  care score --missing skip judged.jsonl
  care score --profile kardia rollouts.jsonl";

const GENERATOR_REWARD_AFTER: &str = "\
Input line: {\"rubric\": \"<raw generator output text>\", \"chosen_scores\": [[..],[..],[..]],
  \"rejected_scores\": [[..],[..],[..]], \"chosen_tactics\": [\"questioning\", ...]}
Output: r_pref, r_align, r_fmt, reward (= r_pref + lambda r_align + gamma r_fmt) and counts.
`care pref` is the same subcommand under its earlier name (same options, same output).

Example:
  care generator-reward --tau 0.7 --lambda 0.1 --gamma 0.3 pairs.jsonl";

const ADV_AFTER: &str = "\
Input line (--estimator group, the default): {\"rewards\": [..], \"group_size\": G} or
  {\"rewards\": [..], \"group_offsets\": [0, ..]}, optional \"valid\": [true|false|0|1, ..]; a null
  reward is invalid (A = 0, left out of the stats). OPO (--baseline length_weighted) reads
  \"lengths\", ReMax (--baseline external) \"baselines\"; with \"seq_offsets\" (and \"mask\") the
  advantages are also broadcast to \"token_advantages\" (whitened with --whiten).
Output: advantages and groups [{count, mean, std, zero_variance}].
--estimator gae: {\"token_rewards\", \"values\", \"seq_offsets\", \"mask\"?} -> advantages, returns.
--estimator reinforce_pp: {\"token_rewards\", \"seq_offsets\", \"mask\"?} -> advantages, returns.
A preset sets every option; options given after it override single fields.

Example:
  echo '{\"rewards\":[1,0,0.5,null],\"group_size\":2}' | care advantages --preset verl -";

const LOSS_AFTER: &str = "\
Input line: {\"logp\": [..], \"logp_old\": [..] | null, \"logp_ref\": [..] | null,
  \"logp_rollout\": [..] | null, \"seq_offsets\": [0, ..], \"mask\": [..] | null, \"advantages\": [..]}
  (advantages per sequence if there is one per sequence, else per token).
Output: loss, grad (dL/dlogp per token) and stats (sums, addable across micro-batches); with
  \"logp_rollout\", rollout (the rollout correction's diagnostics, sums); with clip_cov or kl_cov,
  cov_selected.

Example:
  echo '{\"logp\":[-1,-2],\"logp_old\":[-1.1,-2],\"seq_offsets\":[0,2],\"advantages\":[1]}' | care loss -";

/// Input and engine options shared by the data subcommands.
#[derive(Debug, Args, Clone)]
pub struct IoArgs {
    /// JSON Lines input file; `-` reads stdin.
    #[arg(default_value = "-")]
    pub input: PathBuf,
    /// Exit with status 1 when any line gave an error line.
    #[arg(long)]
    pub strict: bool,
    /// Longest accepted input line in bytes; a longer line gives a `line_too_long` error line.
    #[arg(long, default_value_t = crate::engine::DEFAULT_MAX_LINE_BYTES, value_name = "N")]
    pub max_line_bytes: usize,
    /// Worker threads, at most 1024 (0 = one per core).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub threads: usize,
    /// Never draw the progress bar (it is drawn only when stderr is a terminal anyway).
    #[arg(long)]
    pub no_progress: bool,
}

/// The format policy (SPEC §3).
#[derive(Debug, Args, Clone, Default)]
pub struct FormatArgs {
    /// Strip a leading `<think>...</think>` block (or everything up to a lone `</think>`).
    #[arg(long)]
    pub allow_think: bool,
    /// Accept one ```json code fence around the rubric.
    #[arg(long)]
    pub allow_code_fence: bool,
    /// Accept the `{"analysis": .., "rubric": ..}` envelope.
    #[arg(long)]
    pub allow_envelope: bool,
    /// Tolerance of the weight-sum check `|sum - 1| <= X`.
    #[arg(long, value_name = "X")]
    pub weight_tolerance: Option<f64>,
    /// Do not require the category order Cognitive, Affective, Proactive.
    #[arg(long)]
    pub no_order: bool,
    /// Do not require the key order of categories and criteria.
    #[arg(long)]
    pub no_key_order: bool,
    /// Fewest criteria per category (0..=255).
    #[arg(long, value_name = "N")]
    pub min_criteria: Option<u8>,
    /// Most criteria per category (0..=255).
    #[arg(long, value_name = "N")]
    pub max_criteria: Option<u8>,
    /// Report meta words (gold, reference, ideal, ground truth, target response, ...).
    #[arg(long)]
    pub meta_words: bool,
}

/// Scoring policy (SPEC §7).
#[derive(Debug, Args, Clone, Default)]
pub struct ScoreArgs {
    /// Missing score policy.
    #[arg(long, value_parser = named::<MissingPolicy>(), default_value_t = MissingPolicy::Error)]
    pub missing: MissingPolicy,
    /// Out-of-range score policy.
    #[arg(long, value_parser = named::<RangePolicy>(), default_value_t = RangePolicy::Error)]
    pub out_of_range: RangePolicy,
    /// Ablation: every dimension weight 1/3.
    #[arg(long)]
    pub uniform_weights: bool,
}

/// Preference and generator reward options (SPEC §6, §7); the defaults are the paper's.
#[derive(Debug, Args, Clone)]
pub struct GeneratorArgs {
    /// Temperature of `tanh((s+ - s-) / tau)`.
    #[arg(long, default_value_t = PreferenceOptions::PAPER.tau)]
    pub tau: f64,
    /// Weight of r_align in the generator reward.
    #[arg(long, default_value_t = GeneratorOptions::PAPER.lambda)]
    pub lambda: f64,
    /// Weight of r_fmt in the generator reward.
    #[arg(long, default_value_t = GeneratorOptions::PAPER.gamma)]
    pub gamma: f64,
    /// Score scale for r_pref.
    #[arg(long, value_parser = named::<ScoreScale>(), default_value_t = PreferenceOptions::PAPER.scale)]
    pub scale: ScoreScale,
    /// Unknown strategy label policy.
    #[arg(long, value_parser = named::<UnknownLabelPolicy>(), default_value_t = GeneratorOptions::PAPER.labels)]
    pub unknown_label: UnknownLabelPolicy,
}

/// Advantage options (SPEC §9): a preset, then single-field overrides.
#[derive(Debug, Args, Clone, Default)]
pub struct AdvArgs {
    /// Start from an anchor trainer's options.
    #[arg(long, value_parser = named::<Preset>())]
    pub preset: Option<Preset>,
    /// Baseline (default mean; rloo: leave_one_out).
    #[arg(long, value_parser = named::<Baseline>())]
    pub baseline: Option<Baseline>,
    /// Scale (default group_std; trl_batch: batch_std; dr_grpo, rloo: none).
    #[arg(long, value_parser = named::<Scale>())]
    pub scale: Option<Scale>,
    /// Std estimator (default unbiased).
    #[arg(long, value_parser = named::<StdKind>())]
    pub std: Option<StdKind>,
    /// Added to the std before dividing (default 1e-6; trl 1e-4; openrlhf 1e-9).
    #[arg(long)]
    pub eps: Option<f64>,
    /// Groups with one valid sample (default zero; verl: raw; openrlhf: error).
    #[arg(long, value_parser = named::<SingletonPolicy>())]
    pub singleton: Option<SingletonPolicy>,
    /// A floor under the std before eps is added: max(std, X) (default 0 = off).
    #[arg(long, value_name = "X")]
    pub std_floor: Option<f64>,
    /// A factor on every advantage (default none; gpg: N / (N - M); nonzero: verl's
    /// N / count_nonzero(rewards)).
    #[arg(long, value_parser = named::<Reweight>())]
    pub reweight: Option<Reweight>,
    /// The estimator (default group; gae and reinforce_pp read token rewards).
    #[arg(long, value_parser = named::<AdvantageEstimator>(), default_value = "group")]
    pub estimator: AdvantageEstimator,
    /// Discount gamma of gae and reinforce_pp, in [0, 1] (default 1).
    #[arg(long, value_name = "X")]
    pub gamma: Option<f64>,
    /// GAE lambda, in [0, 1] (default 1).
    #[arg(long, value_name = "X")]
    pub lambda: Option<f64>,
    /// reinforce_pp: what a masked token does to the returns (default skip, verl since
    /// 2026-08; reset: the return restarts at 0 before it, verl before).
    #[arg(long, value_parser = named::<MaskedToken>())]
    pub masked_token: Option<MaskedToken>,
    /// Whiten the token advantages over the line's counted tokens (verl's gae, REINFORCE++ and
    /// REINFORCE++-baseline do): (x - mean) / sqrt(var + eps), var by --std.
    #[arg(long)]
    pub whiten: bool,
    /// The eps of --whiten (default 1e-8).
    #[arg(long, value_name = "X", requires = "whiten")]
    pub whiten_eps: Option<f64>,
    /// Added to the count in --whiten's means (default 0; verl's masked_mean: 1e-8).
    #[arg(long, value_name = "X", requires = "whiten")]
    pub whiten_count_eps: Option<f64>,
}

/// `--kl`: a KL estimator of the core, or `none` (no KL term, whatever `--beta` says).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KlChoice {
    /// `none`: `beta = 0`.
    Off,
    /// A [`KlEstimator`] by its name.
    Estimator(KlEstimator),
}

/// The value parser of `--kl`: `none`, then the core's estimator names.
fn kl_choice() -> impl TypedValueParser<Value = KlChoice> {
    let values = std::iter::once(PossibleValue::new("none").help("No KL term"))
        .chain(KlEstimator::ALL.iter().map(|v| possible(*v)));
    PossibleValuesParser::new(values).try_map(|s| match s.as_str() {
        "none" => Ok(KlChoice::Off),
        name => name.parse().map(KlChoice::Estimator),
    })
}

/// Loss options (SPEC §10): a preset, then single-field overrides.
#[derive(Debug, Args, Clone, Default)]
pub struct LossArgs {
    /// Start from an anchor trainer's options.
    #[arg(long, value_parser = named::<LossPreset>())]
    pub preset: Option<LossPreset>,
    /// eps_low: the ratio is clipped below at 1 - X (default 0.2).
    #[arg(long, value_name = "X")]
    pub clip_low: Option<f64>,
    /// eps_high: the ratio is clipped above at 1 + X (default 0.2; DAPO uses 0.28).
    #[arg(long, value_name = "X")]
    pub clip_high: Option<f64>,
    /// Dual clip constant c > 1 (default 0 = off; verl preset 3).
    #[arg(long, value_name = "C")]
    pub dual_clip: Option<f64>,
    /// Token (default), sequence (GSPO) or sequence_token (GSPO-token) ratio.
    #[arg(long, value_parser = named::<RatioLevel>())]
    pub ratio: Option<RatioLevel>,
    /// KL estimator (default k3); `none` turns the KL term off whatever --beta says.
    #[arg(long, value_parser = kl_choice())]
    pub kl: Option<KlChoice>,
    /// KL coefficient beta (default 0: no KL term; needs logp_ref in the input).
    #[arg(long)]
    pub beta: Option<f64>,
    /// Aggregation (default token_mean).
    #[arg(long, value_parser = named::<Aggregation>())]
    pub agg: Option<Aggregation>,
    /// Global counted-token count N_tok (all ranks, all micro-batches; default: this line's).
    #[arg(long, value_name = "N")]
    pub global_tokens: Option<f64>,
    /// Global sequence count N_seq (default: this line's sequences with a counted token).
    #[arg(long, value_name = "N")]
    pub global_seqs: Option<f64>,
    /// Horizon H of seq_mean_token_sum_norm (default: the longest sequence of the line).
    #[arg(long, value_name = "H")]
    pub horizon: Option<f64>,
    /// Bound of the log-ratio clamp |logp - logp_old| (default 20; inf turns it off).
    #[arg(long, value_name = "X")]
    pub log_ratio_clamp: Option<f64>,
    /// GSPO: cap of the mean log ratio (default 10; inf turns it off).
    #[arg(long, value_name = "X")]
    pub seq_log_ratio_max: Option<f64>,
    /// Bound of the KL input |logp_ref - logp| (default 20; inf turns it off).
    #[arg(long, value_name = "X")]
    pub kl_input_clamp: Option<f64>,
    /// Bound of the k3 value (default 10; inf turns it off).
    #[arg(long, value_name = "X")]
    pub kl_output_clamp: Option<f64>,
    /// Every safety clamp off (log ratio, GSPO mean, KL input, k3 output, rollout log ratio):
    /// a peer without them, bit for bit on extreme inputs.
    #[arg(long)]
    pub no_clamps: bool,
    /// The policy-gradient term (default clip).
    #[arg(long, value_parser = named::<PolicyLoss>())]
    pub policy_loss: Option<PolicyLoss>,
    /// What the local N_seq counts (default non_empty; TRL grpo / dr_grpo: all).
    #[arg(long, value_parser = named::<SequenceCount>())]
    pub sequence_count: Option<SequenceCount>,
    /// SAPO temperature for A > 0 (default 1).
    #[arg(long, value_name = "X")]
    pub sapo_tau_pos: Option<f64>,
    /// SAPO temperature for A <= 0 (default 1.05).
    #[arg(long, value_name = "X")]
    pub sapo_tau_neg: Option<f64>,
    /// Clip-Cov / KL-Cov: share of counted tokens selected (default 2e-4).
    #[arg(long, value_name = "X")]
    pub cov_ratio: Option<f64>,
    /// Clip-Cov: lower end of the covariance window (default 1).
    #[arg(long, value_name = "X")]
    pub clip_cov_lb: Option<f64>,
    /// Clip-Cov: upper end of the covariance window (default 5).
    #[arg(long, value_name = "X")]
    pub clip_cov_ub: Option<f64>,
    /// KL-Cov: coefficient of |log ratio| on selected tokens (default 1; verl_kl_cov: 0.1).
    #[arg(long, value_name = "X")]
    pub kl_cov_coef: Option<f64>,
    /// GMPO: the floor under the rollout weights in their geometric mean, ln(w + X) (default
    /// 0; verl_geo_mean: 1e-10).
    #[arg(long, value_name = "X")]
    pub gmpo_weight_floor: Option<f64>,
    /// VESPO: the Gamma weight's power k for A >= 0 (default 2).
    #[arg(long, value_name = "X")]
    pub vespo_k_pos: Option<f64>,
    /// VESPO: its decay lambda for A >= 0 (default 3).
    #[arg(long, value_name = "X")]
    pub vespo_lambda_pos: Option<f64>,
    /// VESPO: k for A < 0 (default 3).
    #[arg(long, value_name = "X")]
    pub vespo_k_neg: Option<f64>,
    /// VESPO: lambda for A < 0 (default 2).
    #[arg(long, value_name = "X")]
    pub vespo_lambda_neg: Option<f64>,
    /// verl's bypass mode: "logp_rollout" stands in for the missing "logp_old" and the
    /// importance weights are reported, not applied (on, or off; verl_bypass: on).
    #[arg(long, value_parser = named::<Bypass>())]
    pub bypass: Option<Bypass>,
    /// Rollout correction (with "logp_rollout" in the input): importance weights (default off).
    #[arg(long, value_parser = named::<IsLevel>())]
    pub rollout_is: Option<IsLevel>,
    /// Truncation C of the importance weights (default 2; inf: none).
    #[arg(long, value_name = "C")]
    pub rollout_is_threshold: Option<f64>,
    /// Lower truncation of the importance weights (default 0: none).
    #[arg(long, value_name = "C")]
    pub rollout_is_threshold_low: Option<f64>,
    /// Rejection criteria, comma-separated (verl's rollout_rs: token_k1, seq_mean_k3, ...).
    #[arg(long, value_name = "LIST", requires = "rollout_rs_threshold")]
    pub rollout_rs: Option<String>,
    /// Their thresholds: one shared or one per criterion, comma-separated; k1 takes
    /// lower_upper or one number u for [1/u, u] (verl's rollout_rs_threshold).
    #[arg(long, value_name = "LIST", requires = "rollout_rs")]
    pub rollout_rs_threshold: Option<String>,
    /// What a rejected token becomes (default drop; zero_weight keeps it counted).
    #[arg(long, value_parser = named::<RejectionMode>())]
    pub rollout_rejection: Option<RejectionMode>,
    /// Bound of the rollout log ratio before exp (default 20; inf turns it off).
    #[arg(long, value_name = "X")]
    pub rollout_log_ratio_clamp: Option<f64>,
}
