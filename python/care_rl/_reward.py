"""The reward core (SPEC §3-8), numpy in and out; no PyTorch."""

from __future__ import annotations

from typing import Mapping, Optional, Sequence, Union

import numpy as np

from . import _care
from ._care import Rubric
from ._grpo import _count, _finite_where, _wide
from ._types import (
    Alignment,
    GeneratorReward,
    GroupReward,
    JudgeOutput,
    PolicyReward,
    PreferenceReward,
    StrategyCounts,
    Validation,
)

Text = Union[str, bytes]
RubricLike = Union[Rubric, str, bytes]
Policy = Union[None, str, Mapping[str, object]]
Scores = Union[Sequence[Optional[float]], np.ndarray]


def _f64(x, name: str, ndim: Optional[int] = None) -> np.ndarray:
    """``x`` as a C-contiguous float64 array (``None`` entries of a list become NaN)."""
    try:
        a = np.ascontiguousarray(x, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise _care.error("invalid_argument", f"{name}: expected numbers ({e})") from None
    if ndim is not None and a.ndim != ndim:
        raise _care.error("invalid_argument", f"{name}: expected {ndim} dimension(s), got shape {a.shape}")
    return a


def validate(text: Text, *, policy: Policy = None) -> Validation:
    """Validates rubric JSON against the format contract (SPEC §3) and recovers the rubric.

    ``text``: ``str`` or UTF-8 ``bytes``. ``policy``: ``None`` or ``"paper"`` (the contract
    behind ``r_fmt``), ``"lenient"`` (think blocks, code fences and the ``{"analysis",
    "rubric"}`` envelope accepted), or a dict of ``FormatPolicy`` field overrides on the
    paper's (``allow_think``, ``allow_code_fence``, ``allow_envelope``, ``weight_tolerance``,
    ``require_order``, ``require_key_order``, ``min_criteria``, ``max_criteria``,
    ``meta_words``). Never raises for bad rubric text: every violation is in the result.
    """
    return _care.validate(text, policy)


def format_reward(text: Text, *, policy: Policy = None) -> float:
    """``r_fmt`` (SPEC §3): 1.0 when ``text`` passes the format contract, else 0.0."""
    return _care.format_reward(text, policy)


def policy_reward(
    rubric: RubricLike,
    scores: Scores,
    *,
    missing: Optional[str] = None,
    out_of_range: Optional[str] = None,
    uniform_weights: Optional[bool] = None,
) -> PolicyReward:
    """Eq. 5: ``r = sum_d w_d * mean_i (raw_{d,i} / 5)`` for one response.

    ``scores``: ``K`` raw judge scores 0..5 in the rubric's flat order (see
    ``Rubric.criteria``), NaN or ``None`` for a missing one. ``missing``: ``"error"``
    (default), ``"zero"`` or ``"skip"``; ``out_of_range`` (non-integral or outside 0..5):
    ``"error"`` (default) or ``"clamp"``; ``uniform_weights``: the 1/3-each ablation.
    ``rubric``: a :class:`Rubric` or its text (parsed under the paper's policy).
    Raises ``CareError`` (``score_shape``, ``missing_score``, ``score_out_of_range``, ...).
    """
    s = _f64(scores, "scores", 1)
    return _care.policy_reward(rubric, s, missing, out_of_range, uniform_weights)


def policy_reward_group(
    rubric: RubricLike,
    scores: Union[Sequence[Scores], np.ndarray],
    *,
    missing: Optional[str] = None,
    out_of_range: Optional[str] = None,
    uniform_weights: Optional[bool] = None,
) -> GroupReward:
    """Eq. 5 for the ``M`` responses of a GRPO group under one rubric, in one call.

    ``scores``: ``[M, K]`` raw judge scores (array or list of lists; NaN/``None`` missing).
    A response that breaks an ``error`` policy gets a NaN reward (the advantage step treats
    NaN as an invalid sample) and is counted in ``report.failed``; the call itself raises only
    for a shape error. Options as :func:`policy_reward`. Returns ``rewards`` float64 ``[M]``.
    """
    s = _f64(scores, "scores")
    if s.ndim != 2:
        raise _care.error("invalid_argument", f"scores: expected [M, K], got shape {s.shape}")
    out = np.empty(s.shape[0], dtype=np.float64)
    rep = _care.policy_reward_group(rubric, s, out, missing, out_of_range, uniform_weights)
    return GroupReward(rewards=out, report=rep)


def preference_reward(
    rubric: RubricLike,
    chosen: Scores,
    rejected: Scores,
    *,
    tau: Optional[float] = None,
    scale: Optional[str] = None,
    missing: Optional[str] = None,
    out_of_range: Optional[str] = None,
    uniform_weights: Optional[bool] = None,
) -> PreferenceReward:
    """Eq. 3: ``sum_d w_d * mean_i tanh((s+_{d,i} - s-_{d,i}) / tau)`` in [-1, 1].

    ``chosen``/``rejected``: ``K`` raw scores each. ``tau`` (default 0.7, > 0); ``scale``:
    ``"normalized"`` (default, differences of raw / 5) or ``"raw"``; score options as
    :func:`policy_reward`.
    """
    c, r = _f64(chosen, "chosen", 1), _f64(rejected, "rejected", 1)
    return _care.preference_reward(rubric, c, r, tau, scale, missing, out_of_range, uniform_weights)


def generator_reward(
    rubric_text: Text,
    chosen: Scores,
    rejected: Scores,
    chosen_tactics: Sequence[str],
    *,
    lambda_: Optional[float] = None,
    gamma: Optional[float] = None,
    tau: Optional[float] = None,
    scale: Optional[str] = None,
    missing: Optional[str] = None,
    out_of_range: Optional[str] = None,
    uniform_weights: Optional[bool] = None,
    unknown_label: Optional[str] = None,
    policy: Policy = None,
) -> GeneratorReward:
    """Eq. 4, the rubric generator's reward: ``r_pref + lambda * r_align + gamma * r_fmt``.

    ``rubric_text``: the generated rubric (validated under ``policy``); ``chosen`` /
    ``rejected``: the judge's raw scores of the preference pair under it; ``chosen_tactics``:
    strategy labels of the chosen response. ``lambda_`` (0.1), ``gamma`` (0.3), ``tau`` (0.7),
    ``unknown_label`` (``"error"`` or ``"ignore"``); other options as
    :func:`preference_reward`. A text that is not a rubric gets ``r_pref = r_align = 0``.
    """
    c, r = _f64(chosen, "chosen", 1), _f64(rejected, "rejected", 1)
    return _care.generator_reward(
        rubric_text, c, r, list(chosen_tactics), lambda_, gamma, tau, scale, missing,
        out_of_range, uniform_weights, unknown_label, policy,
    )  # fmt: skip


def alignment(weights: Sequence[float], counts: Sequence[int]) -> Alignment:
    """The alignment reward with its violations (SPEC §6), from rubric weights ``(w_cog,
    w_aff, w_pro)`` (normalized here) and strategy counts ``(n_cog, n_aff, n_pro)``."""
    wide = _wide(np.asarray(list(weights), dtype=object).reshape(-1))
    _finite_where(wide, "weights")
    w = tuple(float(x) for x in wide)
    n = tuple(_count(x, f"counts[{i}]") for i, x in enumerate(counts))
    if len(w) != 3 or len(n) != 3:
        raise _care.error("length_mismatch", "weights and counts: three values each")
    return _care.alignment(w, n)


def alignment_reward(weights: Sequence[float], counts: Sequence[int]) -> float:
    """``r_align`` only (see :func:`alignment`): 0, 0.5 or 1."""
    return alignment(weights, counts).reward


def strategy_counts(labels: Sequence[str], *, unknown_label: Optional[str] = None) -> StrategyCounts:
    """Counts distinct strategy labels per dimension (SPEC §5; the list is a set).
    ``unknown_label``: ``"error"`` (default: raise ``unknown_label``) or ``"ignore"``."""
    return _care.strategy_counts(list(labels), unknown_label)


def render_judge_prompt(
    rubric: RubricLike, context: Sequence[str], seeker_turn: str, response: str
) -> str:
    """The judge prompt (SPEC §8): dialogue ``context`` lines, the seeker's latest turn, the
    candidate ``response`` and every criterion with its anchors, and the output shape."""
    return _care.render_judge_prompt(rubric, list(context), seeker_turn, response)


def parse_judge_output(text: Text, rubric: RubricLike) -> JudgeOutput:
    """Parses a judge's answer (SPEC §8) into ``K`` raw scores in the rubric's flat order
    (NaN where missing), ready for :func:`policy_reward`. Lenient about the envelope (think
    blocks, code fences, prose), strict about the content. Raises ``CareError``
    ``no_judge_json`` when no ``criterion_scores`` object is found."""
    if not isinstance(rubric, Rubric):
        rubric = Rubric(rubric)
    out = np.empty(rubric.total_criteria, dtype=np.float64)
    report = _care.parse_judge_output(text, rubric, out)
    return JudgeOutput(scores=out, report=report)
