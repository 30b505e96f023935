"""Result types of ``care_rl``: small frozen dataclasses, filled by the extension by keyword.

Dimensions are always in the canonical order (Cognitive, Affective, Proactive); rewards are
plain floats (SPEC §4-7 give their ranges); counts are ints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

if TYPE_CHECKING:
    import numpy as np

    from ._care import Profile, Rubric

Triple = Tuple[float, float, float]


@dataclass(frozen=True)
class Violation:
    """One violation of the rubric format contract (SPEC §3).

    ``code``/``number``: the stable violation code (``"weight_sum"``, 10); ``category`` and
    ``criterion``: positions in the JSON arrays when they apply; ``dimension``: the category's
    JSON name when known; ``offset``: byte offset in the input (parse errors, keys);
    ``message``: the one-line retry message for a generator's feedback prompt.
    """

    code: str
    number: int
    category: Optional[int]
    dimension: Optional[str]
    criterion: Optional[int]
    offset: Optional[int]
    message: str


@dataclass(frozen=True)
class Validation:
    """Result of :func:`care_rl.validate`.

    ``valid``: a rubric was recovered and nothing was violated; ``format_reward``: ``r_fmt``
    (1.0 or 0.0); ``violations``: every violation in input order (at most 64 kept,
    ``overflowed`` when more were found); ``feedback``: all messages, one per line;
    ``rubric``: the recovered rubric (it may break the contract: see ``violations``), or
    ``None`` when the text is not a rubric at all.
    """

    valid: bool
    format_reward: float
    violations: List[Violation]
    overflowed: bool
    feedback: str
    rubric: Optional["Rubric"]


@dataclass(frozen=True)
class Fired:
    """Which scoring policies changed the input (no silent defaults): counts of zeroed,
    skipped and clamped scores; whether the weights were renormalized or replaced by uniform
    ones."""

    missing_zeroed: int
    missing_skipped: int
    clamped: int
    weights_adjusted: bool
    uniform_weights: bool


@dataclass(frozen=True)
class PolicyReward:
    """Eq. 5: ``reward`` in [0, 1]; ``dim_means``: per-dimension mean normalized score;
    ``weights``: the weights used (on the simplex); ``fired``: policies that fired."""

    reward: float
    dim_means: Triple
    weights: Triple
    fired: Fired


@dataclass(frozen=True)
class GroupReport:
    """What happened while scoring a group: responses ``scored`` (finite reward) and
    ``failed`` (NaN reward under an ``error`` policy), the ``first_error`` as
    ``(response index, error code)``, and the policies ``fired`` over the group."""

    scored: int
    failed: int
    first_error: Optional[Tuple[int, str]]
    fired: Fired


@dataclass(frozen=True)
class GroupReward:
    """Result of :func:`care_rl.policy_reward_group`: ``rewards`` float64 ``[M]`` (NaN for a
    response that broke an ``error`` policy: the advantage step treats it as invalid) and the
    group's :class:`GroupReport`."""

    rewards: "np.ndarray"
    report: GroupReport


@dataclass(frozen=True)
class PreferenceReward:
    """Eq. 3: ``reward`` in [-1, 1] (weighted mean of ``tanh((s+ - s-) / tau)``),
    ``dim_means`` per dimension, ``weights`` used, ``fired`` policies."""

    reward: float
    dim_means: Triple
    weights: Triple
    fired: Fired


@dataclass(frozen=True)
class StrategyCounts:
    """Per-dimension counts of distinct known strategy labels (canonical order), plus the
    labels skipped as ``unknown`` (policy ``ignore``) or as ``duplicates``."""

    counts: Tuple[int, int, int]
    unknown: int
    duplicates: int


@dataclass(frozen=True)
class Alignment:
    """The alignment reward (SPEC §6): ``reward`` in {0, 0.5, 1}; ``top_violation``: no
    most-used dimension holds the highest weight; ``zero_violations``: pairs (z, p) with
    ``n_z = 0 < n_p`` and ``w_z > w_p``."""

    reward: float
    top_violation: bool
    zero_violations: int


@dataclass(frozen=True)
class GeneratorReward:
    """Eq. 4: ``reward = r_pref + lambda * r_align + gamma * r_fmt`` with its terms;
    ``parsed``: whether a rubric was recovered from the text; ``violations``: how many format
    violations it had; ``counts``/``alignment``: the strategy counts and alignment details;
    ``fired``: scoring policies."""

    reward: float
    r_pref: float
    r_align: float
    r_fmt: float
    parsed: bool
    violations: int
    counts: StrategyCounts
    alignment: Alignment
    fired: Fired


@dataclass(frozen=True)
class JudgeReport:
    """What the judge-output parser found (SPEC §8): criteria ``matched`` (of which
    ``case_insensitive``), ``missing`` ones (NaN), ``duplicates``, ``unknown`` items,
    ``invalid_scores``, ``out_of_range`` scores passed through, ``malformed_items``; ``clean``
    when every criterion got an in-range score and nothing odd was seen."""

    matched: int
    case_insensitive: int
    missing: int
    duplicates: int
    unknown: int
    invalid_scores: int
    out_of_range: int
    malformed_items: int
    clean: bool


@dataclass(frozen=True)
class JudgeOutput:
    """Result of :func:`care_rl.parse_judge_output`: ``scores`` float64 ``[K]`` in the
    rubric's flat order (NaN where the judge gave no usable score) and the ``report``."""

    scores: "np.ndarray"
    report: JudgeReport


@dataclass(frozen=True)
class LossResult:
    """Result of :func:`care_rl.policy_loss`: ``loss`` (this call's ``sum_t w_t * l_t``),
    ``grad`` float32 ``[T]`` (``dL/dlogp``, 0 on masked tokens) and ``stats`` (sums that add
    across micro-batches and ranks: ``tokens``, ``clipped``, ``ppo_kl_sum``, ...; ``ratio_min``
    and ``ratio_max`` combine by min and max)."""

    loss: float
    grad: "np.ndarray"
    stats: Dict[str, float]
    #: The rollout correction's diagnostics as sums, named by :data:`ROLLOUT_STATS_FIELDS`
    #: (``tokens``, ``rejected_tokens``, ``truncated``, ``weight_sum``, ``kl_sum``, ...); ``None``
    #: without ``logp_rollout``.
    rollout: Optional[Dict[str, float]] = None


@dataclass(frozen=True)
class RolloutResult:
    """Result of :func:`care_rl.rollout_correction`: ``weights`` float32 (the importance weight
    the loss applies per token, 0 on masked or rejected tokens), ``keep`` bool (the token stays
    in the loss after rejection) and ``stats`` (the diagnostics as sums, named by
    :data:`ROLLOUT_STATS_FIELDS`)."""

    weights: "np.ndarray"
    keep: "np.ndarray"
    stats: Dict[str, float]


# ---- rubric profiles (docs/PROFILES.md) --------------------------------------------------------


@dataclass(frozen=True)
class ProfileViolation:
    """One violation of the profile schema: ``code``/``number`` (``"weight_sum"``, 8),
    ``path`` (``"dimensions[1].criteria[0]"``), ``offset`` (byte offset in the JSON, when it
    applies) and the one-line ``message`` that says what to fix."""

    code: str
    number: int
    path: str
    offset: Optional[int]
    message: str


@dataclass(frozen=True)
class ProfileValidation:
    """Result of :func:`care_rl.validate_profile`: ``valid`` when there is no violation (then
    ``profile`` is the parsed :class:`care_rl.Profile`), every violation (at most 64 kept,
    ``overflowed`` when more were found) and all messages one per line in ``feedback``."""

    valid: bool
    violations: List[ProfileViolation]
    overflowed: bool
    feedback: str
    profile: Optional["Profile"]


@dataclass(frozen=True)
class OutputViolation:
    """One violation of a profile's output format: ``code``/``number`` (``"missing_span"``,
    2), the ``span`` it concerns (its name) when it concerns one, the byte ``offset`` in the
    output when it applies, and the one-line ``message``."""

    code: str
    number: int
    span: Optional[str]
    offset: Optional[int]
    message: str


@dataclass(frozen=True)
class OutputCheck:
    """Result of :func:`care_rl.check_output`: ``format_reward`` (``r_fmt``, 1.0 or 0.0);
    ``judge_needed`` (False for a malformed output, whose reward is 0 whatever the judge says:
    skip the call); ``judge_text``, what the judge sees (the judge span, or the whole output
    without an output format; ``None`` when the judge is not needed) and ``judge_offset``, its
    ``(byte offset, byte length)`` in the output; ``spans``: each span's trimmed text by name
    (``None`` when not found; found spans are reported in malformed outputs too) and
    ``span_offsets`` the same as ``(byte offset, byte length)``; every violation, ``overflowed``
    when more than 32 were found, and the ``feedback`` lines for a retry prompt."""

    format_reward: float
    judge_needed: bool
    judge_text: Optional[str]
    judge_offset: Optional[Tuple[int, int]]
    spans: Dict[str, Optional[str]]
    span_offsets: Dict[str, Optional[Tuple[int, int]]]
    violations: List[OutputViolation]
    overflowed: bool
    feedback: str


@dataclass(frozen=True)
class ProfileReward:
    """The reward of one response under a profile:
    ``reward = format_reward * (1 - veto) * ((1 - lambda) * rubric_reward + lambda * r_emo)``
    in [0, 1]; ``judge_needed`` False when the output was malformed (then the scores were not
    read); ``emotion_correct`` (``None`` without an emotion term or emotion span);
    ``vetoed_by``, the dimension whose veto set the reward to 0; ``per_dimension`` each
    dimension's value ``v_d`` and ``weights`` the weights used, by dimension name; ``fired``
    the scoring policies that fired."""

    reward: float
    format_reward: float
    judge_needed: bool
    rubric_reward: float
    emotion_correct: Optional[bool]
    vetoed_by: Optional[str]
    per_dimension: Dict[str, float]
    weights: Dict[str, float]
    fired: Fired


@dataclass(frozen=True)
class ProfileGroupReport:
    """What happened while scoring a group under a profile: responses ``scored`` (finite
    reward; malformed ones included, they score 0), of those ``malformed`` and ``vetoed``;
    ``emotion_correct`` responses; ``failed`` ones (NaN reward under an ``error`` policy) and
    the ``first_error`` as ``(response index, error code)``; the policies ``fired``."""

    scored: int
    malformed: int
    vetoed: int
    emotion_correct: int
    failed: int
    first_error: Optional[Tuple[int, str]]
    fired: Fired


@dataclass(frozen=True)
class ProfileGroupReward:
    """Result of :func:`care_rl.profile_reward_group`: ``rewards`` float64 ``[M]`` (NaN for a
    response whose scores broke an ``error`` policy), the group's ``report``, and with
    ``details=True`` each response's :class:`ProfileReward` (``None`` for a failed one)."""

    rewards: "np.ndarray"
    report: ProfileGroupReport
    details: Optional[List[Optional[ProfileReward]]]
