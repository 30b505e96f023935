"""Rubric profiles (docs/PROFILES.md), numpy in and out; no PyTorch.

A :class:`Profile` says which dimensions a reward has, how they are weighted and scored, what
the policy's output must look like (ordered spans in tags) and which extra terms and gates
apply. Built in: ``"care"`` (CARE's generated rubric, bit for bit :func:`policy_reward`) and
``"kardia"`` (our reading of Kardia-R1's rubric-as-judge reward).
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import numpy as np

from . import _care
from ._care import Profile, Rubric
from ._reward import _f64
from ._types import JudgeOutput, OutputCheck, ProfileGroupReward, ProfileReward, ProfileValidation

Text = Union[str, bytes]
RubricLike = Union[Rubric, str, bytes, None]
Scores = Union[Sequence[Optional[float]], np.ndarray, None]

#: The names of the built-in profiles.
PROFILE_NAMES = tuple(_care.PROFILE_NAMES)


def _profile(p: Union[Profile, str, bytes]) -> Profile:
    return p if isinstance(p, Profile) else Profile(p)


def validate_profile(text: Text) -> ProfileValidation:
    """Validates profile JSON (the schema of docs/PROFILES.md) and reports **every** violation
    with its stable code, where it is and what to fix; ``profile`` is the parsed profile when
    there is none. Never raises for bad profile text (``Profile(text)`` does)."""
    return _care.validate_profile(text)


def check_output(profile: Union[Profile, str], output: Text) -> OutputCheck:
    """The output-format check of ``profile`` on one policy output (``str`` or ``bytes``; any
    bytes: invalid UTF-8 is a violation, not an error): ``r_fmt``, whether the judge is needed,
    what the judge sees, every span (text and byte offsets) and every violation."""
    return _care.check_output(_profile(profile), output)


def profile_reward(
    profile: Union[Profile, str],
    output: Text,
    scores: Scores,
    *,
    emotion: Optional[str] = None,
    rubric: RubricLike = None,
    missing: Optional[str] = None,
    out_of_range: Optional[str] = None,
    uniform_weights: Optional[bool] = None,
) -> ProfileReward:
    """The reward of one response under ``profile`` (docs/PROFILES.md):
    ``r = r_fmt * (1 - veto) * ((1 - lambda) * sum_d w_d * v_d + lambda * r_emo)``.

    ``output``: the policy output, checked against the profile's format. ``scores``: ``K`` raw
    judge scores in the profile's range (``Profile.score_range``), flat in profile order
    (``Profile.criteria``; for a generated profile the rubric's order), NaN or ``None`` for a
    missing one; not read (and may be ``None``) when the output is malformed. ``emotion``: the
    gold emotion label, required by a profile with an emotion term (``kardia``). ``rubric``:
    the prompt's generated rubric for a generated profile (``care``), ``None`` for a fixed one.
    ``missing`` / ``out_of_range`` / ``uniform_weights`` as :func:`care_rl.policy_reward`.
    Raises ``CareError`` (``score_shape``, ``missing_score``, ``score_out_of_range``,
    ``invalid_argument`` for a missing gold label or a rubric that does not fit the profile).
    """
    s = np.empty(0, dtype=np.float64) if scores is None else _f64(scores, "scores", 1)
    return _care.profile_reward(
        _profile(profile), output, s, emotion, rubric, missing, out_of_range, uniform_weights
    )


def profile_reward_group(
    profile: Union[Profile, str],
    outputs: Sequence[Text],
    scores: Union[Sequence[Scores], np.ndarray],
    *,
    emotion: Optional[str] = None,
    rubric: RubricLike = None,
    missing: Optional[str] = None,
    out_of_range: Optional[str] = None,
    uniform_weights: Optional[bool] = None,
    details: bool = False,
) -> ProfileGroupReward:
    """The rewards of the ``M`` responses of one GRPO group under ``profile``, in one call
    (the whole group is scored in Rust, without the GIL).

    ``outputs``: ``M`` policy outputs; ``scores``: ``[M, K]`` raw judge scores (the rows of
    malformed outputs are not read: fill them with anything, e.g. NaN). One prompt, so one
    ``emotion`` gold label and one ``rubric``. A response whose scores break an ``error``
    policy gets a NaN reward (an invalid sample for the advantage step) and is counted in
    ``report.failed``; the call raises only for its arguments. With ``details``, also each
    response's :class:`ProfileReward`. Options as :func:`profile_reward`.
    """
    p = _profile(profile)
    outs = list(outputs)
    s = _f64(scores, "scores")
    if s.ndim != 2 and not (s.size == 0 and len(outs) == 0):
        raise _care.error("invalid_argument", f"scores: expected [M, K], got shape {s.shape}")
    if s.ndim == 2 and s.shape[0] != len(outs):
        raise _care.error(
            "length_mismatch", f"scores: {s.shape[0]} rows for {len(outs)} outputs (expected [M, K])"
        )
    out = np.empty(len(outs), dtype=np.float64)
    report, per = _care.profile_reward_group(
        p, outs, s, out, emotion, rubric, missing, out_of_range, uniform_weights, details
    )
    return ProfileGroupReward(rewards=out, report=report, details=per)


def render_profile_judge_prompt(
    profile: Union[Profile, str],
    context: Sequence[str],
    seeker_turn: str,
    response: str,
    *,
    rubric: RubricLike = None,
) -> str:
    """The judge prompt of ``profile`` for one response: the dialogue ``context`` lines, the
    user's latest turn, the ``response`` (for a profile with spans, pass the judge span:
    ``check_output(...).judge_text``), one section per dimension with every criterion and its
    anchors (pitfalls marked), and the answer shape with the profile's score range. A generated
    profile takes the prompt's ``rubric`` (and renders :func:`care_rl.render_judge_prompt`)."""
    return _care.render_profile_judge_prompt(
        _profile(profile), list(context), seeker_turn, response, rubric
    )


def parse_profile_judge_output(
    text: Text, profile: Union[Profile, str], *, rubric: RubricLike = None
) -> JudgeOutput:
    """Parses a judge's answer for ``profile`` into ``K`` raw scores in flat profile order
    (NaN where missing), ready for :func:`profile_reward`. Envelope rules as
    :func:`care_rl.parse_judge_output`; items match a dimension by name and a criterion by
    title (trimmed, exact first, then ASCII-case-insensitive). Raises ``CareError``
    ``no_judge_json`` when no ``criterion_scores`` object is found."""
    p = _profile(profile)
    out = np.empty(p.total_criteria(rubric), dtype=np.float64)
    report = _care.parse_profile_judge_output(text, p, out, rubric)
    return JudgeOutput(scores=out, report=report)
