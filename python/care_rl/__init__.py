"""care_rl: rubric rewards for RL on LLMs (CARE) and the GRPO step, from Rust.

``import care_rl`` needs numpy only (no PyTorch): rubric validation (:func:`validate`,
:class:`Rubric`), the format, policy, preference, generator and alignment rewards, strategy
counts, the judge prompt and judge-output parser, rubric profiles (:class:`Profile`,
:func:`check_output`, :func:`profile_reward`, :func:`profile_reward_group`, the profile judge
I/O), the chat-template table (:func:`read_prompt`, :func:`strip_end_tokens`), and the GRPO step
on numpy arrays
(:func:`group_advantages` and its cross-rank phases, :func:`policy_loss`).
``import care_rl.torch`` adds the PyTorch custom ops (``torch.ops.care.*``) and their
plain-function API. Every error is a :class:`CareError` with the stable ``code`` and
``number`` of the core (the same as the CLI's and the C ABI's).
"""

from __future__ import annotations

from . import _care
from ._care import TEMPLATE_FAMILIES, CareError, Profile, Rubric, read_prompt, strip_end_tokens
from ._grpo import (
    advantage_options,
    group_advantages,
    group_advantages_finalize,
    group_partial_squares,
    group_partial_sums,
    loss_options,
    discounted_returns,
    discounted_returns_whitened,
    gae,
    gae_whitened,
    policy_loss,
    rollout_correction,
    whiten,
)
from ._profile import (
    PROFILE_NAMES,
    check_output,
    parse_profile_judge_output,
    profile_reward,
    profile_reward_group,
    render_profile_judge_prompt,
    validate_profile,
)
from ._reward import (
    alignment,
    alignment_reward,
    format_reward,
    generator_reward,
    parse_judge_output,
    policy_reward,
    policy_reward_group,
    preference_reward,
    render_judge_prompt,
    strategy_counts,
    validate,
)
# Reward functions for trainers (TRL, verl) over a running `care serve`; stdlib only, and
# loadable by path too (verl: custom_reward_function.path=python/care_rl/rewards.py).
from .rewards import (
    CareRewardClient,
    CareRewardError,
    CareRewardWarning,
    TRLReward,
    compute_score,
    compute_score_async,
    compute_score_batch,
)
from ._types import (
    Alignment,
    Fired,
    GeneratorReward,
    GroupReport,
    GroupReward,
    JudgeOutput,
    JudgeReport,
    LossResult,
    RolloutResult,
    OutputCheck,
    OutputViolation,
    PolicyReward,
    PreferenceReward,
    ProfileGroupReport,
    ProfileGroupReward,
    ProfileReward,
    ProfileValidation,
    ProfileViolation,
    StrategyCounts,
    Validation,
    Violation,
)

__version__: str = _care.__version__

#: The loss statistics' fields in order: ``(name, C type, byte offset, combine)`` where
#: combine is ``"sum"``, ``"min"`` or ``"max"`` (how values from ranks/micro-batches merge).
LOSS_STATS_FIELDS = _care.LOSS_STATS_FIELDS

#: The rollout correction's diagnostics in order (every one a sum): the names of
#: ``LossResult.rollout`` and ``RolloutResult.stats``.
ROLLOUT_STATS_FIELDS = _care.ROLLOUT_STATS_FIELDS

__all__ = [
    "CareError",
    "Rubric",
    "validate",
    "format_reward",
    "policy_reward",
    "policy_reward_group",
    "preference_reward",
    "generator_reward",
    "alignment",
    "alignment_reward",
    "strategy_counts",
    "render_judge_prompt",
    "parse_judge_output",
    "Profile",
    "PROFILE_NAMES",
    "TEMPLATE_FAMILIES",
    "read_prompt",
    "strip_end_tokens",
    "validate_profile",
    "check_output",
    "profile_reward",
    "profile_reward_group",
    "render_profile_judge_prompt",
    "parse_profile_judge_output",
    "advantage_options",
    "loss_options",
    "group_advantages",
    "group_partial_sums",
    "group_partial_squares",
    "group_advantages_finalize",
    "policy_loss",
    "rollout_correction",
    "discounted_returns",
    "discounted_returns_whitened",
    "gae",
    "gae_whitened",
    "whiten",
    "LOSS_STATS_FIELDS",
    "ROLLOUT_STATS_FIELDS",
    "Alignment",
    "Fired",
    "GeneratorReward",
    "GroupReport",
    "GroupReward",
    "JudgeOutput",
    "JudgeReport",
    "LossResult",
    "RolloutResult",
    "OutputCheck",
    "OutputViolation",
    "PolicyReward",
    "PreferenceReward",
    "ProfileGroupReport",
    "ProfileGroupReward",
    "ProfileReward",
    "ProfileValidation",
    "ProfileViolation",
    "StrategyCounts",
    "Validation",
    "Violation",
    "CareRewardClient",
    "CareRewardError",
    "CareRewardWarning",
    "TRLReward",
    "compute_score",
    "compute_score_async",
    "compute_score_batch",
]
