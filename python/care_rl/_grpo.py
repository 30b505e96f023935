"""The GRPO step on the CPU with numpy (SPEC §9-11): advantages, their cross-rank phases and
the policy loss with its gradient. ``care_rl.torch`` has the same functions for tensors."""

from __future__ import annotations

import math
import operator
from typing import Dict, Optional, Sequence, Union

import numpy as np

from . import _care
from ._types import LossResult, RolloutResult

Array = Union[np.ndarray, Sequence[float]]


def advantage_options(preset: Optional[str] = None, **overrides) -> str:
    """The canonical text of an advantage option set (what the ops take): a preset
    (``"verl"``, ``"trl"``, ``"trl_batch"``, ``"openrlhf"``, ``"dr_grpo"``, ``"rloo"``;
    ``None`` = the SPEC §9 defaults), then fields overridden by name: ``baseline``
    (``"mean"``, ``"leave_one_out"``, ``"none"``), ``scale`` (``"group_std"``,
    ``"batch_std"``, ``"none"``), ``std_kind`` (``"unbiased"``, ``"biased"``), ``singleton``
    (``"zero"``, ``"raw"``, ``"error"``), ``eps`` (>= 0). Checked by the core."""
    return _care.advantage_options(preset, **overrides)


def loss_options(preset: Optional[str] = None, **overrides) -> str:
    """The canonical text of a loss option set: a preset (``"verl"``, ``"trl"``; ``None`` =
    the SPEC §10 defaults), then fields overridden by name: ``aggregation``
    (``"token_mean"``, ``"seq_mean_token_mean"``, ``"seq_mean_token_sum"``,
    ``"seq_mean_token_sum_norm"``, ``"token_sum"``), ``ratio_level`` (``"token"``,
    ``"sequence"``), ``kl_estimator`` (``"k1"``, ``"abs"``, ``"k2"``, ``"k3"``), and the
    numbers ``eps_low``, ``eps_high``, ``dual_clip``, ``log_ratio_clamp``,
    ``seq_log_ratio_max``, ``beta``, ``kl_input_clamp``, ``kl_output_clamp``,
    ``global_tokens``, ``global_sequences``, ``horizon``. Checked by the core."""
    return _care.loss_options(preset, **overrides)


def _arr(x, dtype, name: str) -> np.ndarray:
    a = _f32(x, name) if dtype == np.float32 else np.asarray(x, dtype=dtype)
    return np.ascontiguousarray(a).reshape(-1)


_F32_MAX = float(np.finfo(np.float32).max)


def _f32(x, name: str) -> np.ndarray:
    """``x`` as float32, keeping its shape. The rule of every surface (CLI, C, Python): a value
    is rounded to the nearest float32, and a finite one that rounds to infinity (``1e39``) is a
    ``non_finite`` error naming the array and index, never an infinity passed on."""
    src = np.asarray(x)
    if src.dtype == np.float32:
        return src
    wide = src.astype(np.float64)
    with np.errstate(over="ignore"):
        a = wide.astype(np.float32)
    bad = np.flatnonzero(np.isinf(a) & np.isfinite(wide))
    if bad.size:
        at = np.unravel_index(int(bad[0]), a.shape) if a.ndim else ()
        place = name + "".join(f"[{int(i)}]" for i in at)
        raise _care.error(
            "non_finite", f"{place} = {float(wide.reshape(-1)[bad[0]]):g} exceeds the f32 range (|x| <= {_F32_MAX:g})"
        )
    return a


_U32_MAX = 2**32 - 1


def _first_bad(flat: np.ndarray, bad: np.ndarray, name: str, what: str):
    """The ``schema`` error naming ``name[i]`` at the first index where ``bad`` holds."""
    i = int(np.flatnonzero(bad)[0])
    v = flat[i]
    v = v.item() if isinstance(v, np.generic) else v
    return _care.error("schema", f"{name}[{i}] = {v!r} must be {what}")


def _count(x, name: str) -> int:
    """A size (``group_size``): a non-negative integer. An integral float (``4.0``) is that
    integer; ``2.9``, NaN, ``None`` or a negative number is a ``schema`` error (a
    ``ValueError``), never truncated, as the command line refuses it."""
    try:
        v = operator.index(x)
    except TypeError:
        try:
            f = float(x)
        except (TypeError, ValueError):
            f = math.nan
        if not (math.isfinite(f) and f == math.floor(f)):
            raise _care.error("schema", f"{name} = {x!r} must be a non-negative integer") from None
        v = int(f)
    if v < 0:
        raise _care.error("schema", f"{name} = {x!r} must be a non-negative integer")
    return v


def _offsets(x, name: str) -> np.ndarray:
    """A layout (``seq_offsets``, ``group_offsets``) as flat uint32: every value an integer
    in ``0..=4294967295`` (an integral float is that integer); anything else, ``None``
    included, is a ``schema`` error naming the index, never truncated or wrapped."""
    a = np.asarray(x)
    flat = a.reshape(-1)
    what = "an integer in 0..=4294967295"
    if a.dtype.kind == "b":
        return np.ascontiguousarray(flat.astype(np.uint32))
    if a.dtype.kind in "iu":
        bad = (flat < 0) | (flat > _U32_MAX)
    else:
        wide = _wide(flat)
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(wide) | (wide != np.floor(wide)) | (wide < 0) | (wide > _U32_MAX)
    if bad.any():
        raise _first_bad(flat, bad, name, what)
    return np.ascontiguousarray(flat.astype(np.uint32))


def _number(v) -> float:
    """``v`` as a float, NaN for ``None`` and anything that is not a number."""
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _wide(flat: np.ndarray) -> np.ndarray:
    """A flat array as float64, NaN where an entry is ``None`` or not a number."""
    if flat.dtype.kind in "biuf":
        return flat.astype(np.float64)
    return np.array([_number(v) for v in flat], dtype=np.float64)


def _layout(rewards: np.ndarray, group_size, group_offsets):
    if group_offsets is not None:
        return 0, _offsets(group_offsets, "group_offsets")
    if group_size is None:
        if rewards.ndim != 2:
            raise _care.error("invalid_argument", "give group_size or group_offsets, or 2-D [B, G] rewards")
        group_size = rewards.shape[1]
    return _count(group_size, "group_size"), None


def _mask(m, name: str) -> Optional[np.ndarray]:
    """A mask as flat uint8 (1 = counted / valid): each value ``True``, ``False``, ``0`` or
    ``1``, as on the command line; anything else (``0.5``, NaN, ``None``) is a ``schema``
    error naming the index."""
    if m is None:
        return None
    flat = np.asarray(m).reshape(-1)
    if flat.dtype.kind == "b":
        return flat.astype(np.uint8)
    wide = _wide(flat)
    bad = (wide != 0) & (wide != 1)
    if bad.any():
        raise _first_bad(flat, bad, name, "true, false, 0 or 1")
    return (wide != 0).astype(np.uint8)


def _finite_where(values: np.ndarray, name: str, counted: Optional[np.ndarray] = None) -> None:
    """The command line's rule for numbers that a result needs: ``None`` or NaN (or an
    infinity) where a value is read is ``non_finite``, naming the array and index; masked
    positions (``counted == 0``) are never read and may hold anything."""
    flat = np.asarray(values).reshape(-1)
    bad = ~np.isfinite(flat)
    if counted is not None and counted.size == flat.size:
        bad &= counted != 0
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        v = flat[i]
        shown = "None or NaN" if np.isnan(v) else f"{float(v):g}"
        raise _care.error(
            "non_finite",
            f"{name}[{i}] is {shown} where a number is needed (give a number, or mask the entry out)",
        )


def group_advantages(
    rewards: Array,
    group_size: Optional[int] = None,
    *,
    group_offsets: Optional[Array] = None,
    valid: Optional[Array] = None,
    preset: Optional[str] = "verl",
    dtype=np.float32,
    return_stats: bool = False,
    **overrides,
):
    """Group-relative advantages (SPEC §9) with the shape of ``rewards``.

    ``rewards``: float32 ``[N]`` with ``group_size`` (contiguous groups) or CSR
    ``group_offsets`` ``[B + 1]``, or ``[B, G]``. ``valid``: optional mask (a NaN reward is
    invalid too; invalid samples get 0). ``preset`` and ``overrides`` as
    :func:`advantage_options`. ``dtype``: float32 (default) or float64 output (the values
    are computed in float64 either way). With ``return_stats``, also float64 ``[B, 4]``: count,
    mean, std, zero_variance per group.
    """
    r = _f32(rewards, "rewards")
    shape = r.shape
    r = np.ascontiguousarray(r).reshape(-1)
    gs, offs = _layout(np.asarray(rewards), group_size, group_offsets)
    b = (len(offs) - 1) if offs is not None else (r.size // gs if gs else 0)
    opts = _care.advantage_options(preset, **overrides)
    out = np.empty(r.size, dtype=dtype)
    stats = np.empty((max(b, 0), 4), dtype=np.float64) if return_stats else None
    _care.group_advantages(r, out, opts, gs, offs, _mask(valid, "valid"), stats)
    out = out.reshape(shape)
    return (out, stats) if return_stats else out


def group_partial_sums(
    rewards: Array,
    group_size: Optional[int] = None,
    *,
    group_offsets: Optional[Array] = None,
    valid: Optional[Array] = None,
) -> np.ndarray:
    """Cross-rank advantages, step 1 (SPEC §11): float64 ``[B, 2]`` (count, sum) of this
    rank's valid rewards per group. Every rank describes the same ``B`` groups (a group with
    no local samples is an empty CSR range). All-reduce the result with a sum."""
    r = _arr(rewards, np.float32, "rewards")
    gs, offs = _layout(np.asarray(rewards), group_size, group_offsets)
    b = (len(offs) - 1) if offs is not None else (r.size // gs if gs else 0)
    out = np.empty((max(b, 0), 2), dtype=np.float64)
    _care.group_partial_sums(r, out, gs, offs, _mask(valid, "valid"))
    return out


def group_partial_squares(
    rewards: Array,
    sums: np.ndarray,
    group_size: Optional[int] = None,
    *,
    group_offsets: Optional[Array] = None,
    valid: Optional[Array] = None,
) -> np.ndarray:
    """Step 2: float64 ``[B]``, this rank's squared deviations from each group's global mean
    (from the all-reduced ``sums``). All-reduce the result with a sum."""
    r = _arr(rewards, np.float32, "rewards")
    gs, offs = _layout(np.asarray(rewards), group_size, group_offsets)
    out = np.empty(np.asarray(sums).shape[0], dtype=np.float64)
    s = np.ascontiguousarray(_wide(np.asarray(sums).reshape(-1)).reshape(np.shape(sums)))
    _finite_where(s, "sums")
    _care.group_partial_squares(r, s, out, gs, offs, _mask(valid, "valid"))
    return out


def group_advantages_finalize(
    rewards: Array,
    sums: np.ndarray,
    m2: np.ndarray,
    group_size: Optional[int] = None,
    *,
    group_offsets: Optional[Array] = None,
    valid: Optional[Array] = None,
    preset: Optional[str] = "verl",
    dtype=np.float32,
    **overrides,
) -> np.ndarray:
    """Step 3: this rank's advantages from the all-reduced ``sums`` and ``m2``; equal to
    :func:`group_advantages` over the whole batch up to the reduction order."""
    r = _f32(rewards, "rewards")
    shape = r.shape
    r = np.ascontiguousarray(r).reshape(-1)
    gs, offs = _layout(np.asarray(rewards), group_size, group_offsets)
    opts = _care.advantage_options(preset, **overrides)
    out = np.empty(r.size, dtype=dtype)
    s = np.ascontiguousarray(_wide(np.asarray(sums).reshape(-1)).reshape(np.shape(sums)))
    q = np.ascontiguousarray(_wide(np.asarray(m2).reshape(-1)))
    _finite_where(s, "sums")
    _finite_where(q, "m2")
    _care.group_advantages_finalize(r, s, q, out, opts, gs, offs, _mask(valid, "valid"))
    return out.reshape(shape)


def advantage_kind(adv_shape, logp_shape, n_tok: int, n_seq: int, per_token: Optional[bool]) -> bool:
    """Whether advantages of ``adv_shape`` are per token (else per sequence): a padded
    ``[B, L]`` layout decides by shape, a flat one by count (per sequence when both fit,
    unless ``per_token`` says otherwise)."""
    size = math.prod(adv_shape)
    if per_token is None:
        if len(logp_shape) == 2 and tuple(adv_shape) == tuple(logp_shape):
            per_token = True
        elif size == n_seq:
            per_token = False
        else:
            per_token = size == n_tok
    want = n_tok if per_token else n_seq
    if size != want:
        raise _care.error("length_mismatch", f"advantages: {size} values, expected {n_seq} (one per sequence) or {n_tok} "
            "(one per token)")
    return per_token


def stats_dict(values: Sequence[float]) -> Dict[str, float]:
    """The loss statistics as a dict, named by the core's field table."""
    return {f[0]: float(v) for f, v in zip(_care.LOSS_STATS_FIELDS, values)}


def policy_loss(
    logp: Array,
    logp_old: Optional[Array],
    advantages: Array,
    seq_offsets: Optional[Array] = None,
    mask: Optional[Array] = None,
    *,
    logp_ref: Optional[Array] = None,
    logp_rollout: Optional[Array] = None,
    preset: Optional[str] = None,
    per_token: Optional[bool] = None,
    **overrides,
) -> LossResult:
    """The clipped-ratio policy loss of one micro-batch and its gradient (SPEC §10), on the
    CPU in float64 accumulation.

    ``logp``: ``[T]`` with CSR ``seq_offsets`` ``[B + 1]``, or padded ``[B, L]`` (then the
    offsets may be left out and ``mask`` is the ``[B, L]`` response mask). ``logp_old``
    (``None``: on-policy) and ``logp_ref`` have its shape and dtype (float32 or float64).
    ``advantages``: ``[B]`` per sequence or ``logp``'s shape per token. Options as
    :func:`loss_options`; ``per_token`` decides between the two advantage layouts when the
    shapes do not (1-D ``logp`` with as many tokens as sequences). Returns the loss, ``grad = dL/dlogp`` (float32, ``logp``'s shape)
    and the statistics as sums.

    ``logp_rollout`` (the inference engine's log-probs, ``logp``'s shape and dtype) turns on
    the rollout correction (SPEC §16) set by the ``rollout_*`` options (``rollout_is``,
    ``rollout_is_threshold``, ``rollout_rs`` with ``rollout_rs_threshold``, ...); its weights
    are constants of the gradient, and ``result.rollout`` holds its diagnostics.
    """
    lp = np.asarray(logp)
    if lp.dtype not in (np.float32, np.float64):
        lp = _f32(lp, "logp")
    shape = lp.shape
    if seq_offsets is None:
        if lp.ndim != 2:
            raise _care.error("invalid_argument", "give seq_offsets for 1-D logp, or pass [B, L] logp")
        b, length = shape
        seq_offsets = np.arange(0, (b + 1) * length, length, dtype=np.uint32) if b else np.zeros(1, np.uint32)
    offs = _offsets(seq_offsets, "seq_offsets")
    flat = np.ascontiguousarray(lp).reshape(-1)
    old = None if logp_old is None else _arr(logp_old, lp.dtype, "logp_old")
    ref = None if logp_ref is None else _arr(logp_ref, lp.dtype, "logp_ref")
    roll = None if logp_rollout is None else _arr(logp_rollout, lp.dtype, "logp_rollout")
    adv = _f32(advantages, "advantages")
    kind = advantage_kind(adv.shape, shape, flat.size, offs.size - 1, per_token)
    opts = _care.loss_options(preset, **overrides)
    m = _mask(mask, "mask")
    # As `care loss`: a log-prob the loss reads (a counted token) must be a number; the
    # reference only when the KL term is on; every advantage always.
    _finite_where(flat, "logp", m)
    for name, a in (("logp_old", old), ("logp_rollout", roll)):
        if a is not None:
            _finite_where(a, name, m)
    if ref is not None and _option(opts, "beta") > 0:
        _finite_where(ref, "logp_ref", m)
    _finite_where(adv, "advantages")
    grad = np.empty(flat.size, dtype=np.float32)
    stats = np.empty(len(_care.LOSS_STATS_FIELDS), dtype=np.float64)
    rstats = None if roll is None else np.zeros(len(_care.ROLLOUT_STATS_FIELDS), dtype=np.float64)
    loss = _care.policy_loss(
        flat, np.ascontiguousarray(adv).reshape(-1), offs, grad, stats,
        opts, kind, old, ref, m,
        logp_rollout=roll, rollout_stats=rstats,
    )  # fmt: skip
    rollout = None if roll is None else rollout_stats_dict(rstats)
    return LossResult(loss=float(loss), grad=grad.reshape(shape), stats=stats_dict(stats), rollout=rollout)


def _option(text: str, field: str) -> float:
    """A number field of a canonical option text (``"...,beta=0.1,..."``)."""
    for part in text.split(","):
        key, _, value = part.partition("=")
        if key == field:
            return float(value)
    return 0.0


def rollout_stats_dict(values: Sequence[float]) -> Dict[str, float]:
    """The rollout correction's diagnostics as a dict, named by ``ROLLOUT_STATS_FIELDS``."""
    return {name: float(v) for name, v in zip(_care.ROLLOUT_STATS_FIELDS, values)}


def rollout_correction(
    logp_old: Array,
    logp_rollout: Array,
    seq_offsets: Optional[Array] = None,
    mask: Optional[Array] = None,
    *,
    preset: Optional[str] = None,
    **overrides,
) -> RolloutResult:
    """The rollout correction on its own (SPEC §16), for a trainer that applies the weights
    in its own loss: per token the importance weight :func:`policy_loss` would apply and
    whether the token survives rejection, and the diagnostics as sums.

    ``logp_old`` (the proximal policy: ``logp`` when on-policy) and ``logp_rollout``:
    ``[T]`` with CSR ``seq_offsets``, or padded ``[B, L]`` with an optional ``[B, L]`` mask;
    one dtype (float32 or float64). Options: the ``rollout_*`` fields of
    :func:`loss_options`.
    """
    old = np.asarray(logp_old)
    if old.dtype not in (np.float32, np.float64):
        old = _f32(old, "logp_old")
    shape = old.shape
    if seq_offsets is None:
        if old.ndim != 2:
            raise _care.error("invalid_argument", "give seq_offsets for 1-D logp_old, or pass [B, L] logp_old")
        b, length = shape
        seq_offsets = np.arange(0, (b + 1) * length, length, dtype=np.uint32) if b else np.zeros(1, np.uint32)
    offs = _offsets(seq_offsets, "seq_offsets")
    flat = np.ascontiguousarray(old).reshape(-1)
    roll = _arr(logp_rollout, old.dtype, "logp_rollout")
    m = _mask(mask, "mask")
    _finite_where(flat, "logp_old", m)
    _finite_where(roll, "logp_rollout", m)
    weights = np.empty(flat.size, dtype=np.float32)
    keep = np.empty(flat.size, dtype=np.uint8)
    stats = np.empty(len(_care.ROLLOUT_STATS_FIELDS), dtype=np.float64)
    _care.rollout_correction(
        flat, roll, offs, weights, keep, stats, _care.loss_options(preset, **overrides), m,
    )  # fmt: skip
    return RolloutResult(
        weights=weights.reshape(shape), keep=keep.reshape(shape).astype(bool), stats=rollout_stats_dict(stats)
    )


def _token_layout(x: np.ndarray, seq_offsets, name: str) -> np.ndarray:
    if seq_offsets is not None:
        return _offsets(seq_offsets, "seq_offsets")
    if x.ndim != 2:
        raise _care.error("invalid_argument", f"give seq_offsets for 1-D {name}, or pass [B, L] {name}")
    b, length = x.shape
    return np.arange(0, (b + 1) * length, length, dtype=np.uint32) if b else np.zeros(1, np.uint32)


def _on_cuda(*xs) -> bool:
    """Whether any argument is a CUDA tensor (checked without importing torch)."""
    return any(getattr(x, "is_cuda", False) is True for x in xs)


def discounted_returns(
    token_rewards: Array,
    seq_offsets: Optional[Array] = None,
    mask: Optional[Array] = None,
    *,
    gamma: float = 1.0,
    masked_token: str = "skip",
) -> np.ndarray:
    """Discounted returns ``G_t = r_t + gamma * G_next`` over each sequence's counted tokens
    (SPEC §18; REINFORCE++ before whitening, ReMax's reward-to-go with ``gamma = 1``).
    ``token_rewards``: ``[T]`` with CSR ``seq_offsets`` or padded ``[B, L]`` (with an optional
    ``[B, L]`` mask). Returns float32 of the same shape, 0 on masked tokens. A masked token is
    skipped (``masked_token="skip"``, verl since 2026-08) or restarts the return before it
    (``"reset"``, verl before).

    CUDA tensors are passed to :func:`care_rl.torch.discounted_returns`, which returns a CUDA
    tensor, bit-identical to the host result, without synchronizing (a malformed layout is
    raised only under :func:`care_rl.torch.set_device_checks`)."""
    if _on_cuda(token_rewards, seq_offsets, mask):
        from . import torch as ct

        return ct.discounted_returns(token_rewards, seq_offsets, mask, gamma=gamma, masked_token=masked_token)
    r = _f32(token_rewards, "token_rewards")
    offs = _token_layout(r, seq_offsets, "token_rewards")
    m = _mask(mask, "mask")
    _finite_where(r, "token_rewards", m)
    out = np.empty(r.size, dtype=np.float32)
    _care.discounted_returns(
        np.ascontiguousarray(r).reshape(-1), offs, out, float(gamma), m, masked_token=masked_token
    )
    return out.reshape(r.shape)


def discounted_returns_whitened(
    token_rewards: Array,
    seq_offsets: Optional[Array] = None,
    mask: Optional[Array] = None,
    *,
    gamma: float = 1.0,
    masked_token: str = "skip",
    eps: float = 1e-8,
    std_kind: str = "unbiased",
    count_eps: float = 0.0,
):
    """:func:`discounted_returns` whitened over the counted tokens in one call, every
    intermediate in float64 (the returns are never rounded before they are whitened; verl's
    ``reinforce_plus_plus`` with ``count_eps=1e-8``, its ``masked_mean``). Returns
    ``(advantages, returns, mean, std)``: float32 of ``token_rewards``' shape (0 where masked)
    and the returns' statistics. CUDA tensors: :func:`care_rl.torch.discounted_returns_whitened`
    (the same f64 chain on the device; ``mean`` and ``std`` are 0-d device tensors)."""
    if _on_cuda(token_rewards, seq_offsets, mask):
        from . import torch as ct

        return ct.discounted_returns_whitened(
            token_rewards, seq_offsets, mask, gamma=gamma, masked_token=masked_token, eps=eps,
            std_kind=std_kind, count_eps=count_eps,
        )  # fmt: skip
    r = _f32(token_rewards, "token_rewards")
    offs = _token_layout(r, seq_offsets, "token_rewards")
    adv = np.empty(r.size, dtype=np.float32)
    ret = np.empty(r.size, dtype=np.float32)
    mean, std = _care.discounted_returns_whitened(
        np.ascontiguousarray(r).reshape(-1), offs, adv, ret, float(gamma), _mask(mask, "mask"), masked_token,
        float(eps), std_kind, float(count_eps),
    )  # fmt: skip
    return adv.reshape(r.shape), ret.reshape(r.shape), mean, std


def gae(
    token_rewards: Array,
    values: Array,
    seq_offsets: Optional[Array] = None,
    mask: Optional[Array] = None,
    *,
    gamma: float = 1.0,
    lambda_: float = 1.0,
):
    """Generalized advantage estimation by a reverse scan per sequence (SPEC §18):
    ``(advantages, returns)``, float32 of ``token_rewards``' shape, ``returns = advantages +
    values`` (the value targets), 0 on masked tokens. Not whitened: :func:`whiten` the
    advantages for verl's ``gae``. Layouts as :func:`discounted_returns`; ``values`` has the
    rewards' shape. CUDA tensors: :func:`care_rl.torch.gae`, as :func:`discounted_returns`."""
    if _on_cuda(token_rewards, values, seq_offsets, mask):
        from . import torch as ct

        return ct.gae(token_rewards, values, seq_offsets, mask, gamma=gamma, lambda_=lambda_)
    r = _f32(token_rewards, "token_rewards")
    offs = _token_layout(r, seq_offsets, "token_rewards")
    v = _arr(values, np.float32, "values")
    m = _mask(mask, "mask")
    _finite_where(r, "token_rewards", m)
    _finite_where(v, "values", m)
    adv = np.empty(r.size, dtype=np.float32)
    ret = np.empty(r.size, dtype=np.float32)
    _care.gae(
        np.ascontiguousarray(r).reshape(-1), v, offs, adv, ret, float(gamma), float(lambda_), m,
    )  # fmt: skip
    return adv.reshape(r.shape), ret.reshape(r.shape)


def gae_whitened(
    token_rewards: Array,
    values: Array,
    seq_offsets: Optional[Array] = None,
    mask: Optional[Array] = None,
    *,
    gamma: float = 1.0,
    lambda_: float = 1.0,
    eps: float = 1e-8,
    std_kind: str = "unbiased",
    count_eps: float = 0.0,
):
    """:func:`gae` with the advantages whitened over the counted tokens in one call, every
    intermediate in float64 (verl's ``gae`` with ``count_eps=1e-8``); the returns are not
    whitened. Returns ``(advantages, returns, mean, std)`` (the statistics of the advantages
    before whitening). CUDA tensors: :func:`care_rl.torch.gae_whitened`."""
    if _on_cuda(token_rewards, values, seq_offsets, mask):
        from . import torch as ct

        return ct.gae_whitened(
            token_rewards, values, seq_offsets, mask, gamma=gamma, lambda_=lambda_, eps=eps,
            std_kind=std_kind, count_eps=count_eps,
        )  # fmt: skip
    r = _f32(token_rewards, "token_rewards")
    offs = _token_layout(r, seq_offsets, "token_rewards")
    v = _arr(values, np.float32, "values")
    adv = np.empty(r.size, dtype=np.float32)
    ret = np.empty(r.size, dtype=np.float32)
    mean, std = _care.gae_whitened(
        np.ascontiguousarray(r).reshape(-1), v, offs, adv, ret, float(gamma), float(lambda_), _mask(mask, "mask"),
        float(eps), std_kind, float(count_eps),
    )  # fmt: skip
    return adv.reshape(r.shape), ret.reshape(r.shape), mean, std


def whiten(
    values: Array, mask: Optional[Array] = None, *, eps: float = 1e-8, std_kind: str = "unbiased", count_eps: float = 0.0
):
    """``(x - mean) / sqrt(var + eps)`` over the counted values (SPEC §18; verl's
    ``masked_whiten`` with the defaults and exact means, or with ``count_eps=1e-8`` as its
    ``masked_mean`` divides; OpenRLHF with ``std_kind="biased"``). Returns
    ``(whitened, mean, std)``: a float32 copy of ``values``' shape (0 where masked) and the
    statistics of the counted values.

    CUDA tensors are passed to :func:`care_rl.torch.whiten`: the whitened copy is a CUDA
    tensor and the mean and std 0-d float64 CUDA tensors (nothing synchronizes; a non-finite
    value is raised only under :func:`care_rl.torch.set_device_checks`)."""
    if _on_cuda(values, mask):
        from . import torch as ct

        return ct.whiten(values, mask, eps=eps, std_kind=std_kind, count_eps=count_eps)
    v = np.array(_f32(values, "values"))  # a copy: whitened in place below
    flat = v.reshape(-1)
    mean, std = _care.whiten(flat, float(eps), std_kind, _mask(mask, "mask"), count_eps=float(count_eps))
    return flat.reshape(v.shape), mean, std
