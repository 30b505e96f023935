"""The GRPO step of ``care`` for PyTorch: custom ops in the ``care::`` namespace and the plain
functions that call them.

Ops (``torch.ops.care.*``, each with a fake implementation for ``torch.compile`` and, where a
gradient exists, a registered autograd formula):

* ``care::group_advantages``: advantages of a batch of rewards (SPEC §9), not differentiable.
* ``care::policy_loss``: the clipped-ratio loss (SPEC §10) and ``dL/dlogp`` in one pass; the
  backward only scales the saved gradient.
* ``care::selective_log_softmax`` / ``care::selective_log_softmax_backward``: per-token
  log-probs, entropy and log-sum-exp straight from logits (SPEC §13), and ``dL/dlogits``.
* ``care::logits_policy_loss``: the fused path from logits to the loss (log-probs, loss,
  ``dL/dlogp`` and stats in one forward; ``dL/dlogits`` in the backward).
* ``care::logits_policy_loss_fused``: the one-pass path for the token-local losses: loss,
  stats, log-probs and ``dL/dlogits`` from one read of the logits (on CUDA, one kernel); not
  differentiable (its output is the gradient).
* ``care::discounted_returns``, ``care::gae``, ``care::whiten``: the token-level estimators
  (SPEC §18), not differentiable; ``care::discounted_returns_whitened`` and
  ``care::gae_whitened``: an estimator and its whitening in one op, every intermediate in
  float64 (on CUDA too: the unrounded values wait in the workspace between the kernels).

CPU tensors run the Rust reference (float64 accumulation); CUDA tensors run the ``care``
kernels on ``torch.cuda.current_stream()`` with outputs allocated by PyTorch, and nothing
synchronizes the device: the loss comes back as a device tensor and device-side statuses
stay on the device, so a step can be captured in a CUDA graph. Use the functions below
(:func:`advantages`, :func:`policy_loss`, :func:`selective_log_softmax`,
:func:`logits_policy_loss`); they prepare layouts and options and call the ops.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple, Union

import torch
from torch import Tensor
from torch.utils.dlpack import to_dlpack

from . import _care
from ._care import CareError
from ._grpo import _count, _option, advantage_kind
from ._grpo import _finite_where as _np_finite
from ._grpo import _mask as _np_mask
from ._grpo import _offsets as _np_offsets

__all__ = [
    "CareError",
    "advantages",
    "policy_loss",
    "selective_log_softmax",
    "logits_policy_loss",
    "logits_policy_loss_fused",
    "fused_supported",
    "group_partial_sums",
    "group_partial_squares",
    "group_advantages_finalize",
    "discounted_returns",
    "gae",
    "whiten",
    "discounted_returns_whitened",
    "gae_whitened",
    "stats_dict",
    "rollout_stats_dict",
    "set_device_checks",
    "gpu_available",
    "advantage_options",
    "loss_options",
    "LOSS_STATS_FIELDS",
]

#: The loss statistics' fields, in the order of the ``[14]`` stats tensors:
#: ``(name, C type, byte offset, combine)``; combine is ``"sum"``, ``"min"`` or ``"max"``.
LOSS_STATS_FIELDS = _care.LOSS_STATS_FIELDS
_N_STATS = len(LOSS_STATS_FIELDS)
_N_ROLLOUT = len(_care.ROLLOUT_STATS_FIELDS)
_WS_WORDS = _care.WORKSPACE_BYTES // 4


def gpu_available() -> bool:
    """Whether the ``care`` kernels can run: a CUDA driver loads and PyTorch sees a GPU."""
    return _care.cuda_driver_available() and torch.cuda.is_available()


# Option texts are built by the Rust core; under torch.compile they are graph constants
# (computed once at trace time), so the ops' schemas never depend on the option set.
@torch.compiler.assume_constant_result
def _adv_opts(preset: Optional[str], items: Tuple[Tuple[str, object], ...]) -> str:
    return _care.advantage_options(preset, **dict(items))


@torch.compiler.assume_constant_result
def _loss_opts(preset: Optional[str], items: Tuple[Tuple[str, object], ...]) -> str:
    return _care.loss_options(preset, **dict(items))


def advantage_options(preset: Optional[str] = None, **overrides) -> str:
    """Canonical advantage option text (see :func:`care_rl.advantage_options`)."""
    return _adv_opts(preset, tuple(sorted(overrides.items())))


def loss_options(preset: Optional[str] = None, **overrides) -> str:
    """Canonical loss option text (see :func:`care_rl.loss_options`)."""
    return _loss_opts(preset, tuple(sorted(overrides.items())))


# ---- glue: DLPack, streams, workspaces --------------------------------------------------

_DEVICE_CHECKS = False


def set_device_checks(enabled: bool) -> None:
    """Debugging aid: when on, every CUDA op waits for its kernels and raises the
    ``CareError`` of a device status (an infinite reward, a singleton group under
    ``singleton="error"``, a target outside ``0..V``, token offsets that are not a CSR
    layout, a non-finite value to whiten), as the CPU path does. Off by default:
    it synchronizes the device, which a training step (and CUDA-graph capture) must not."""
    global _DEVICE_CHECKS
    _DEVICE_CHECKS = bool(enabled)


def _check(ws: Optional[Tensor], check) -> None:
    if ws is not None and _DEVICE_CHECKS:
        check(int(ws[0].item()))


def _dl(t: Optional[Tensor]):
    return None if t is None else to_dlpack(t)


def _stream(t: Tensor) -> int:
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


def _workspace(t: Tensor, words: int = _WS_WORDS) -> Optional[Tensor]:
    return torch.empty(words, dtype=torch.int32, device=t.device) if t.is_cuda else None


def _loss_workspace(logp: Tensor, opts: str) -> Optional[Tensor]:
    # Clip-Cov and KL-Cov select tokens on the device: 8 bytes a token of workspace more.
    if not logp.is_cuda:
        return None
    need = _care.policy_loss_workspace_bytes(opts, logp.numel())
    return _workspace(logp, -(-need // 4))


class _On:
    """Makes the tensor's GPU the current device for a launch (a no-op on the CPU)."""

    def __init__(self, t: Tensor):
        self.guard = torch.cuda.device(t.device) if t.is_cuda else None

    def __enter__(self):
        if self.guard is not None:
            self.guard.__enter__()

    def __exit__(self, *exc):
        if self.guard is not None:
            self.guard.__exit__(*exc)


def _with_denominators(options: str, global_tokens: float, global_sequences: float, horizon: float) -> str:
    # Later keys win in the option text; 0 keeps the option's own value.
    extra = [
        f"{k}={v!r}"
        for k, v in (
            ("global_tokens", global_tokens),
            ("global_sequences", global_sequences),
            ("horizon", horizon),
        )
        if v > 0
    ]
    return ",".join([options] + extra) if extra else options


def _loss_dtype(logp: Tensor) -> torch.dtype:
    return torch.float64 if logp.dtype == torch.float64 else torch.float32


def _stats_dtype(t: Tensor) -> torch.dtype:
    # Host: the core's f64 fields; CUDA: the raw device accumulator (f32 sums, u32 counts).
    return torch.float32 if t.is_cuda else torch.float64


def _out_dtype(logits: Tensor) -> torch.dtype:
    return torch.float64 if logits.dtype == torch.float64 and not logits.is_cuda else torch.float32


# ---- care::group_advantages --------------------------------------------------------------


@torch.library.custom_op("care::group_advantages", mutates_args=())
def _group_advantages_op(
    rewards: Tensor,
    valid: Optional[Tensor],
    group_offsets: Optional[Tensor],
    group_size: int,
    options: str,
) -> Tensor:
    out = torch.empty(rewards.shape, dtype=torch.float32, device=rewards.device)
    ws = _workspace(rewards)
    with _On(rewards):
        _care.group_advantages(
            _dl(rewards), _dl(out), options, group_size, _dl(group_offsets), _dl(valid),
            None, _stream(rewards), _dl(ws),
        )  # fmt: skip
    _check(ws, _care.check_advantage_status)
    return out


@_group_advantages_op.register_fake
def _(rewards, valid, group_offsets, group_size, options):
    return torch.empty_like(rewards, dtype=torch.float32)


def _adv_setup(ctx, inputs, output):
    # Advantages are data for the loss, not a function to differentiate: marked so, a
    # reward that requires grad gives an advantage that does not (like argmax), instead of
    # a silently wrong gradient.
    ctx.mark_non_differentiable(output)


def _adv_backward(ctx, grad):
    raise RuntimeError("care::group_advantages is not differentiable")


_group_advantages_op.register_autograd(_adv_backward, setup_context=_adv_setup)


# ---- care::policy_loss -------------------------------------------------------------------


@torch.library.custom_op("care::policy_loss", mutates_args=())
def _policy_loss_op(
    logp: Tensor,
    logp_old: Optional[Tensor],
    logp_ref: Optional[Tensor],
    advantages: Tensor,
    seq_offsets: Tensor,
    mask: Optional[Tensor],
    options: str,
    adv_per_token: bool,
    global_tokens: float,
    global_sequences: float,
    horizon: float,
    max_seq_len: int,
    logp_rollout: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    dev = logp.device
    grad = torch.empty(logp.shape, dtype=torch.float32, device=dev)
    stats = torch.empty(_N_STATS, dtype=_stats_dtype(logp), device=dev)
    # The rollout diagnostics, in the stats' form (host: float64 in ROLLOUT_STATS_FIELDS order;
    # CUDA: the raw device struct); all zero without logp_rollout.
    rstats = torch.empty(_N_ROLLOUT, dtype=_stats_dtype(logp), device=dev)
    opts = _with_denominators(options, global_tokens, global_sequences, horizon)
    with _On(logp):
        loss = _care.policy_loss(
            _dl(logp), _dl(advantages), _dl(seq_offsets), _dl(grad), _dl(stats), opts,
            adv_per_token, _dl(logp_old), _dl(logp_ref), _dl(mask), max_seq_len,
            _stream(logp), _dl(_loss_workspace(logp, opts)), logp_rollout=_dl(logp_rollout),
            rollout_stats=_dl(rstats),
        )  # fmt: skip
    if loss is None:  # CUDA: the loss is the first device statistic (no host read)
        out = stats[0].clone()
    else:
        out = torch.tensor(loss, dtype=_loss_dtype(logp))
    return out, grad, stats, rstats


@_policy_loss_op.register_fake
def _(logp, logp_old, logp_ref, advantages, seq_offsets, mask, options, adv_per_token,
      global_tokens, global_sequences, horizon, max_seq_len, logp_rollout=None):  # fmt: skip
    loss = logp.new_empty((), dtype=_loss_dtype(logp))
    grad = logp.new_empty(logp.shape, dtype=torch.float32)
    stats = logp.new_empty((_N_STATS,), dtype=_stats_dtype(logp))
    rstats = logp.new_empty((_N_ROLLOUT,), dtype=_stats_dtype(logp))
    return loss, grad, stats, rstats


def _loss_setup(ctx, inputs, output):
    _, grad, stats, rstats = output
    ctx.mark_non_differentiable(grad, stats, rstats)
    ctx.save_for_backward(grad)
    ctx.logp_dtype = inputs[0].dtype


def _loss_backward(ctx, g_loss, g_grad, g_stats, g_rstats):
    (grad,) = ctx.saved_tensors
    # The forward computed dL/dlogp; the chain rule only scales it. Nothing flows to
    # logp_old, logp_ref or logp_rollout (the rollout weights are constants, as in verl).
    dlogp = (grad * g_loss.to(grad.dtype)).to(ctx.logp_dtype)
    return (dlogp,) + (None,) * 12


_policy_loss_op.register_autograd(_loss_backward, setup_context=_loss_setup)


# ---- care::selective_log_softmax(_backward) -----------------------------------------------


@torch.library.custom_op("care::selective_log_softmax", mutates_args=())
def _sls_op(
    logits: Tensor, targets: Tensor, mask: Optional[Tensor], temperature: float, want_entropy: bool
) -> Tuple[Tensor, Tensor, Tensor]:
    n, dev, dt = logits.shape[0], logits.device, _out_dtype(logits)
    logp = torch.empty(n, dtype=dt, device=dev)
    lse = torch.empty(n, dtype=dt, device=dev)
    ent = torch.empty(n if want_entropy else 0, dtype=dt, device=dev)
    ws = _workspace(logits)
    with _On(logits):
        _care.selective_log_softmax(
            _dl(logits), _dl(targets), _dl(logp), _dl(lse), temperature, _dl(mask),
            _dl(ent) if want_entropy else None, _stream(logits), _dl(ws),
        )  # fmt: skip
    _check(ws, _care.check_log_softmax_status)
    return logp, ent, lse


@_sls_op.register_fake
def _(logits, targets, mask, temperature, want_entropy):
    n, dt = logits.shape[0], _out_dtype(logits)
    return (
        logits.new_empty((n,), dtype=dt),
        logits.new_empty((n if want_entropy else 0,), dtype=dt),
        logits.new_empty((n,), dtype=dt),
    )


@torch.library.custom_op("care::selective_log_softmax_backward", mutates_args=())
def _sls_backward_op(
    logits: Tensor,
    targets: Tensor,
    mask: Optional[Tensor],
    temperature: float,
    lse: Tensor,
    entropy: Optional[Tensor],
    dlogp: Optional[Tensor],
    dentropy: Optional[Tensor],
) -> Tensor:
    out = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
    with _On(logits):
        _care.selective_log_softmax_backward(
            _dl(logits), _dl(targets), _dl(out), _dl(lse), temperature, _dl(mask),
            _dl(entropy), _dl(dlogp), _dl(dentropy), _stream(logits),
        )  # fmt: skip
    return out


@_sls_backward_op.register_fake
def _(logits, targets, mask, temperature, lse, entropy, dlogp, dentropy):
    return logits.new_empty(logits.shape)


def _no_double_backward(ctx, *grads):
    raise RuntimeError("care::selective_log_softmax_backward has no second derivative")


_sls_backward_op.register_autograd(_no_double_backward, setup_context=lambda ctx, inputs, output: None)


def _grad_in(g: Optional[Tensor], like: Tensor) -> Optional[Tensor]:
    """An upstream gradient as the kernels read it: contiguous, in the output dtype."""
    return None if g is None else g.to(like.dtype).contiguous()


def _sls_setup(ctx, inputs, output):
    logits, targets, mask, temperature, want_entropy = inputs
    logp, ent, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(logits, targets, mask, lse, ent if want_entropy else None)
    ctx.temperature = temperature


def _sls_backward(ctx, g_logp, g_ent, g_lse):
    logits, targets, mask, lse, ent = ctx.saved_tensors
    dent = _grad_in(g_ent, lse) if ent is not None else None
    d = torch.ops.care.selective_log_softmax_backward(
        logits, targets, mask, ctx.temperature, lse, ent, _grad_in(g_logp, lse), dent
    )
    return d, None, None, None, None


_sls_op.register_autograd(_sls_backward, setup_context=_sls_setup)


# ---- care::logits_policy_loss ---------------------------------------------------------------


@torch.library.custom_op("care::logits_policy_loss", mutates_args=())
def _logits_loss_op(
    logits: Tensor,
    targets: Tensor,
    logp_old: Optional[Tensor],
    logp_ref: Optional[Tensor],
    advantages: Tensor,
    seq_offsets: Tensor,
    mask: Optional[Tensor],
    temperature: float,
    options: str,
    adv_per_token: bool,
    global_tokens: float,
    global_sequences: float,
    horizon: float,
    max_seq_len: int,
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    n, dev, dt = logits.shape[0], logits.device, _out_dtype(logits)
    logp = torch.empty(n, dtype=dt, device=dev)
    lse = torch.empty(n, dtype=dt, device=dev)
    dlogp = torch.empty(n, dtype=torch.float32, device=dev)
    stats = torch.empty(_N_STATS, dtype=_stats_dtype(logits), device=dev)
    opts = _with_denominators(options, global_tokens, global_sequences, horizon)
    ws = _workspace(logits)
    with _On(logits):
        loss = _care.logits_policy_loss(
            _dl(logits), _dl(targets), _dl(advantages), _dl(seq_offsets), _dl(logp), _dl(lse),
            _dl(dlogp), _dl(stats), opts, adv_per_token, temperature, _dl(logp_old),
            _dl(logp_ref), _dl(mask), max_seq_len, _stream(logits), _dl(ws),
        )  # fmt: skip
    _check(ws, _care.check_log_softmax_status)
    out = stats[0].clone() if loss is None else torch.tensor(loss, dtype=_loss_dtype(logits))
    return out, stats, logp, lse, dlogp


@_logits_loss_op.register_fake
def _(logits, targets, logp_old, logp_ref, advantages, seq_offsets, mask, temperature, options,
      adv_per_token, global_tokens, global_sequences, horizon, max_seq_len):  # fmt: skip
    n, dt = logits.shape[0], _out_dtype(logits)
    return (
        logits.new_empty((), dtype=_loss_dtype(logits)),
        logits.new_empty((_N_STATS,), dtype=_stats_dtype(logits)),
        logits.new_empty((n,), dtype=dt),
        logits.new_empty((n,), dtype=dt),
        logits.new_empty((n,), dtype=torch.float32),
    )


def _logits_loss_setup(ctx, inputs, output):
    logits, targets, mask, temperature = inputs[0], inputs[1], inputs[6], inputs[7]
    _, stats, logp, lse, dlogp = output
    ctx.mark_non_differentiable(stats, logp, lse, dlogp)
    ctx.save_for_backward(logits, targets, mask, lse, dlogp)
    ctx.temperature = temperature


def _logits_loss_backward(ctx, g_loss, g_stats, g_logp, g_lse, g_dlogp):
    logits, targets, mask, lse, dlogp = ctx.saved_tensors
    g = (dlogp * g_loss.to(dlogp.dtype)).to(lse.dtype).contiguous()
    d = torch.ops.care.selective_log_softmax_backward(
        logits, targets, mask, ctx.temperature, lse, None, g, None
    )
    return (d,) + (None,) * 13


_logits_loss_op.register_autograd(_logits_loss_backward, setup_context=_logits_loss_setup)


# ---- care::logits_policy_loss_fused ---------------------------------------------------------


def _no_grad_setup(ctx, inputs, output):
    # Returns, GAE and whitened advantages are targets for the loss, not functions to
    # differentiate (as care::group_advantages).
    ctx.mark_non_differentiable(*(output if isinstance(output, tuple) else (output,)))


def _not_differentiable(name: str):
    def backward(ctx, *grads):
        raise RuntimeError(f"care::{name} is not differentiable")

    return backward


_FUSED_REFUSED = (
    "logits_policy_loss_fused: the one-pass path computes token-local losses only (ratio_level token, "
    "policy_loss clip, cispo, sapo or gpg, no rollout correction, bypass off); use logits_policy_loss"
)


@torch.library.custom_op("care::logits_policy_loss_fused", mutates_args=())
def _fused_op(
    logits: Tensor,
    targets: Tensor,
    logp_old: Optional[Tensor],
    logp_ref: Optional[Tensor],
    advantages: Tensor,
    seq_offsets: Tensor,
    mask: Optional[Tensor],
    temperature: float,
    options: str,
    adv_per_token: bool,
    global_tokens: float,
    global_sequences: float,
    horizon: float,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    opts = _with_denominators(options, global_tokens, global_sequences, horizon)
    if not _care.fused_supported(opts):
        raise _care.error("invalid_argument", _FUSED_REFUSED)
    if not logits.is_cuda:
        # The host has no one-pass kernel: the three-step reference, the same values.
        loss, stats, logp, lse, dlogp = torch.ops.care.logits_policy_loss(
            logits, targets, logp_old, logp_ref, advantages, seq_offsets, mask, temperature, opts,
            adv_per_token, 0.0, 0.0, 0.0, 0,
        )  # fmt: skip
        d = torch.ops.care.selective_log_softmax_backward(
            logits, targets, mask, temperature, lse, None, dlogp.to(lse.dtype).contiguous(), None
        )
        return loss, stats, logp, d
    n = logits.shape[0]
    logp = torch.empty(n, dtype=torch.float32, device=logits.device)
    dlogits = torch.empty_like(logits)
    stats = torch.empty(_N_STATS, dtype=torch.float32, device=logits.device)
    ws = _workspace(logits)
    with _On(logits):
        _care.logits_policy_loss_fused(
            _dl(logits), _dl(targets), _dl(advantages), _dl(seq_offsets), _dl(stats), opts, adv_per_token,
            temperature, _dl(logp_old), _dl(logp_ref), _dl(mask), _dl(dlogits), _dl(logp), None,
            _stream(logits), _dl(ws),
        )  # fmt: skip
    _check(ws, _care.check_log_softmax_status)
    return stats[0].clone(), stats, logp, dlogits


@_fused_op.register_fake
def _(logits, targets, logp_old, logp_ref, advantages, seq_offsets, mask, temperature, options,
      adv_per_token, global_tokens, global_sequences, horizon):  # fmt: skip
    n = logits.shape[0]
    return (
        logits.new_empty((), dtype=_loss_dtype(logits)),
        logits.new_empty((_N_STATS,), dtype=_stats_dtype(logits)),
        logits.new_empty((n,), dtype=_out_dtype(logits)),
        torch.empty_like(logits),
    )


_fused_op.register_autograd(_not_differentiable("logits_policy_loss_fused"), setup_context=_no_grad_setup)


# ---- the plain functions ---------------------------------------------------------------------


def _flat(t, dtype: Optional[torch.dtype], device, name: str) -> Optional[Tensor]:
    if t is None:
        return None
    t = torch.as_tensor(t, device=device)
    if t.device != device:
        raise _care.error("invalid_argument", f"{name} is on {t.device}, expected {device}")
    t = t.reshape(-1)
    if dtype is not None:
        t = t.to(dtype)
    return t.contiguous()


def _host_checks() -> bool:
    """Whether values may be read on the host: not while ``torch.compile`` traces (a read
    would break the graph; the compiled step runs the same ops, checked when run eagerly)."""
    return not torch.compiler.is_compiling()


def _offsets(t, device, name: str = "seq_offsets") -> Tensor:
    """A layout as int32 (care reads uint32; int32 has the same bits for every offset below
    2**32). On the CPU every value must be an integer in ``0..=4294967295`` (``schema``
    otherwise, naming the index, as :func:`care_rl.policy_loss`); on CUDA, where reading values
    would synchronize, a floating-point layout is refused by its dtype and the kernels check
    the rest."""
    t = torch.as_tensor(t, device=device).reshape(-1)
    if t.is_cuda:
        if t.is_floating_point() or t.is_complex():
            raise _care.error("schema", f"{name} is a {t.dtype} tensor; give integer offsets")
    elif t.dtype != torch.bool and _host_checks():
        wide = t.detach().to(torch.float64) if t.is_floating_point() else t.detach()
        _np_offsets(wide.numpy(), name)
    return t.to(torch.int32).contiguous()


def _mask(t, device, name: str = "mask") -> Optional[Tensor]:
    """A mask: bool or uint8 as given; other dtypes must hold 0 or 1 (checked on the CPU, as
    :func:`care_rl.policy_loss` does; on CUDA every non-zero value counts)."""
    if t is None:
        return None
    t = torch.as_tensor(t, device=device).reshape(-1)
    if t.dtype in (torch.bool, torch.uint8):
        return t.contiguous()
    if not t.is_cuda and _host_checks():
        _np_mask(t.detach().to(torch.float64).numpy(), name)
    return (t != 0).contiguous()


def _host_finite(t: Optional[Tensor], name: str, mask: Optional[Tensor] = None) -> None:
    """On the CPU, a value that a result reads (an unmasked one) must be finite: ``None``-like
    NaN or an infinity is ``non_finite`` naming the index, as :func:`care_rl.policy_loss`. CUDA
    tensors are not read back (see :func:`set_device_checks`)."""
    if t is None or t.is_cuda or not _host_checks():
        return
    counted = None if mask is None or mask.is_cuda else mask.detach().to(torch.uint8).numpy()
    _np_finite(t.detach().to(torch.float64).numpy(), name, counted)


def _padded_offsets(b: int, length: int, device) -> Tensor:
    return torch.arange(0, (b + 1) * length, max(length, 1), dtype=torch.int32, device=device)[: b + 1]


def advantages(
    rewards,
    group_size: Optional[int] = None,
    *,
    group_offsets=None,
    valid=None,
    preset: Optional[str] = "verl",
    options: Optional[str] = None,
    **overrides,
) -> Tensor:
    """Group-relative advantages (SPEC §9) as a float32 tensor of ``rewards``' shape.

    ``rewards``: ``[N]`` with ``group_size`` (contiguous groups) or CSR ``group_offsets``
    ``[B + 1]``, or ``[B, G]`` (one group per row). ``valid``: optional mask (a NaN reward is
    invalid too; invalid samples get 0). ``preset`` (``"verl"``, ``"trl"``, ``"trl_batch"``,
    ``"openrlhf"``, ``"dr_grpo"``, ``"rloo"``, ``None``) and ``overrides`` (``baseline``,
    ``scale``, ``std_kind``, ``singleton``, ``eps``), or a ready ``options`` text. On CUDA an
    infinite reward or a singleton group under ``singleton="error"`` is not raised (that would
    synchronize); :func:`set_device_checks` turns such checks on for debugging.
    """
    r = torch.as_tensor(rewards)
    shape, device = r.shape, r.device
    if group_size is None and group_offsets is None:
        if r.dim() != 2:
            raise _care.error("invalid_argument", "give group_size or group_offsets, or [B, G] rewards")
        group_size = r.shape[1]
    offs = None if group_offsets is None else _offsets(group_offsets, device, "group_offsets")
    opts = options if options is not None else advantage_options(preset, **overrides)
    out = torch.ops.care.group_advantages(
        _flat(r, torch.float32, device, "rewards"), _mask(valid, device, "valid"), offs,
        0 if offs is not None else _count(group_size, "group_size"), opts,
    )  # fmt: skip
    return out.reshape(shape)


def _loss_layout(lead: Sequence[int], seq_offsets, device) -> Tuple[Tensor, int]:
    if seq_offsets is None:
        if len(lead) != 2:
            raise _care.error(
                "invalid_argument", "give seq_offsets for a flat token layout, or a padded [B, L] one"
            )
        b, length = lead
        return _padded_offsets(b, length, device), length
    return _offsets(seq_offsets, device), 0


def policy_loss(
    logp: Tensor,
    logp_old: Optional[Tensor],
    advantages,
    seq_offsets=None,
    mask=None,
    *,
    logp_ref: Optional[Tensor] = None,
    logp_rollout: Optional[Tensor] = None,
    preset: Optional[str] = None,
    options: Optional[str] = None,
    per_token: Optional[bool] = None,
    global_tokens: float = 0.0,
    global_sequences: float = 0.0,
    horizon: float = 0.0,
    return_stats: bool = False,
    return_rollout_stats: bool = False,
    **overrides,
):
    """The clipped-ratio policy loss of one micro-batch (SPEC §10) as a 0-d tensor
    (float32; float64 for float64 ``logp`` on the CPU); ``loss.backward()`` writes the fused
    analytic ``dL/dlogp`` into ``logp.grad``.

    Layouts: ``logp`` ``[T]`` with CSR ``seq_offsets`` ``[B + 1]``, or padded ``[B, L]``
    (offsets may be left out; ``mask`` is the ``[B, L]`` response mask, as in verl and TRL).
    ``logp_old`` (``None``: on-policy) and ``logp_ref`` have ``logp``'s shape and dtype
    (float32, bfloat16, float16; float64 on the CPU). ``advantages``: ``[B]`` per sequence or
    ``logp``'s shape per token (``per_token`` decides when the shapes do not). Options:
    ``preset`` (``"verl"``, ``"trl"``) and ``overrides`` (see :func:`care_rl.loss_options`),
    or a ready ``options`` text. ``global_tokens``, ``global_sequences``, ``horizon``: the
    denominators over all ranks and micro-batches (0: this call's own), as numbers so that the
    option text stays a compile-time constant. ``logp_rollout`` (the inference engine's
    log-probs, ``logp``'s shape and dtype) turns on the rollout correction of the ``rollout_*``
    options (SPEC §16); it gets no gradient (the weights are constants). Its diagnostics are
    computed in the same pass (on CUDA too) and returned with ``return_rollout_stats``.

    With ``return_stats`` returns ``(loss, stats)``: ``stats`` a float64 ``[14]`` tensor on
    ``logp``'s device in :data:`LOSS_STATS_FIELDS` order (sums: all-reduce them; see
    :func:`stats_dict`). With ``return_rollout_stats`` the rollout diagnostics follow as the
    last element, a float64 ``[13]`` tensor on ``logp``'s device in
    :data:`care_rl.ROLLOUT_STATS_FIELDS` order (sums; all zero without ``logp_rollout``; see
    :func:`rollout_stats_dict`). On CUDA nothing is read back to the host.
    """
    lead = tuple(logp.shape)
    device = logp.device
    offs, max_len = _loss_layout(lead, seq_offsets, device)
    flat = logp.reshape(-1)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    old = _flat(logp_old, logp.dtype, device, "logp_old")
    ref = _flat(logp_ref, logp.dtype, device, "logp_ref")
    roll = _flat(logp_rollout, logp.dtype, device, "logp_rollout")
    if roll is not None:
        roll = roll.detach()
    adv_t = torch.as_tensor(advantages, device=device)
    kind = advantage_kind(tuple(adv_t.shape), lead, math.prod(lead), offs.shape[0] - 1, per_token)
    adv = _flat(adv_t, torch.float32, device, "advantages")
    opts = options if options is not None else loss_options(preset, **overrides)
    m = _mask(mask, device)
    # As care_rl.policy_loss (checked on the CPU only: CUDA values are not read back).
    _host_finite(flat, "logp", m)
    _host_finite(old, "logp_old", m)
    _host_finite(roll, "logp_rollout", m)
    if ref is not None and _option(opts, "beta") > 0:
        _host_finite(ref, "logp_ref", m)
    _host_finite(adv, "advantages")
    loss, _, stats, rstats = torch.ops.care.policy_loss(
        flat, old, ref, adv, offs, m, opts, kind,
        float(global_tokens), float(global_sequences), float(horizon), max_len, roll,
    )  # fmt: skip
    out = (loss,)
    if return_stats:
        out += (_host_layout(stats),)
    if return_rollout_stats:
        out += (_rollout_host_layout(rstats),)
    return out if len(out) > 1 else loss


def _host_layout(stats: Tensor) -> Tensor:
    """Statistics as float64 ``[14]`` in ``LOSS_STATS_FIELDS`` order, on their device."""
    if not stats.is_cuda:
        return stats
    # The raw device struct: f32 sums/extrema and u32 counts at the offsets of
    # LOSS_STATS_DEVICE_FIELDS. Its "no finite ratio" marker for ratio_max is 0 (every ratio
    # is positive), which the host layout spells -inf (LossStatsRaw::to_core).
    f32, i32 = stats, stats.view(torch.int32)
    by_name = {}
    for name, kind, offset, _ in _care.LOSS_STATS_DEVICE_FIELDS:
        src = f32 if kind == "float" else i32
        by_name[name] = src[offset // 4].to(torch.float64)
    rmax = by_name["ratio_max"]
    by_name["ratio_max"] = torch.where(rmax > 0, rmax, torch.full_like(rmax, -math.inf))
    return torch.stack([by_name[f[0]] for f in LOSS_STATS_FIELDS])


def _rollout_host_layout(rstats: Tensor) -> Tensor:
    """Rollout diagnostics as float64 ``[13]`` in ``ROLLOUT_STATS_FIELDS`` order, on their
    device."""
    if not rstats.is_cuda:
        return rstats
    # The raw device struct: f32 sums and u32 counts at the offsets of
    # ROLLOUT_STATS_DEVICE_FIELDS (every field a sum; zero is the empty value).
    f32, i32 = rstats, rstats.view(torch.int32)
    by_name = {}
    for name, kind, offset, _ in _care.ROLLOUT_STATS_DEVICE_FIELDS:
        src = f32 if kind == "float" else i32
        by_name[name] = src[offset // 4].to(torch.float64)
    return torch.stack([by_name[n] for n in _care.ROLLOUT_STATS_FIELDS])


def rollout_stats_dict(rstats: Tensor) -> dict:
    """A ``[13]`` rollout-diagnostics tensor as ``{name: float}`` (reads it to the host, as
    :func:`stats_dict`)."""
    return {n: float(v) for n, v in zip(_care.ROLLOUT_STATS_FIELDS, rstats.tolist())}


def stats_dict(stats: Tensor) -> dict:
    """A ``[14]`` statistics tensor as ``{name: float}`` (reads it to the host: on CUDA this
    synchronizes, so call it where the trainer logs, not inside a captured step)."""
    return {f[0]: float(v) for f, v in zip(LOSS_STATS_FIELDS, stats.tolist())}


def _logits_2d(logits: Tensor) -> Tensor:
    """``[..., V]`` as ``[N, V]``: a view when the rows are evenly spaced, else a copy."""
    v = logits.shape[-1]
    x = logits.unsqueeze(0) if logits.dim() == 1 else logits
    x2 = x.reshape(-1, v)
    if x2.shape[0] > 1 and (x2.stride(-1) != 1 or x2.stride(0) < v):
        x2 = x2.contiguous()
    return x2


def _targets(targets, rows: int, device) -> Tensor:
    t = torch.as_tensor(targets, device=device).reshape(-1)
    if t.dtype not in (torch.int64, torch.int32):
        # Token ids are integers: a floating-point id is never truncated (refused by dtype on
        # CUDA, by value on the CPU).
        if t.is_floating_point() or t.is_complex():
            bad = t.is_cuda or t.is_complex() or (_host_checks() and not bool(torch.all(t == torch.trunc(t))))
            if bad:
                raise _care.error("schema", f"targets is a {t.dtype} tensor with non-integer ids; give integer token ids")
        t = t.to(torch.int64)
    return t.contiguous()


def selective_log_softmax(
    logits: Tensor,
    targets,
    *,
    temperature: float = 1.0,
    mask=None,
    return_entropy: bool = False,
):
    """``log_softmax(logits / temperature).gather(-1, targets)`` without the ``[N, V]``
    softmax: float32 (float64 for float64 CPU logits) of ``logits.shape[:-1]``; with
    ``return_entropy`` also each row's entropy. Differentiable through both.

    ``logits``: ``[..., V]`` float32/bfloat16/float16 (float64 on the CPU); evenly strided rows
    (such as ``x[:, :V]``) are read in place. ``targets``: int64/int32 ids of the leading shape.
    ``mask``: rows with 0 are not read and give 0 (and a zero gradient). On CUDA a target
    outside ``0..V`` on a counted row gives NaN (the CPU raises).
    """
    lead = logits.shape[:-1]
    x2 = _logits_2d(logits)
    y = _targets(targets, x2.shape[0], logits.device)
    logp, ent, _ = torch.ops.care.selective_log_softmax(
        x2, y, _mask(mask, logits.device), float(temperature), bool(return_entropy)
    )
    if return_entropy:
        return logp.reshape(lead), ent.reshape(lead)
    return logp.reshape(lead)


def logits_policy_loss(
    logits: Tensor,
    targets,
    logp_old,
    advantages,
    seq_offsets=None,
    mask=None,
    *,
    temperature: float = 1.0,
    logp_ref=None,
    logp_rollout=None,
    preset: Optional[str] = None,
    options: Optional[str] = None,
    per_token: Optional[bool] = None,
    global_tokens: float = 0.0,
    global_sequences: float = 0.0,
    horizon: float = 0.0,
    return_stats: bool = False,
    return_logp: bool = False,
    **overrides,
):
    """The policy loss straight from logits: ``policy_loss(selective_log_softmax(logits,
    targets, temperature), ...)`` as one op (on CUDA: one fused forward, one backward kernel
    writing ``dL/dlogits``).

    ``logits`` ``[B, L, V]`` with ``[B, L]`` targets/mask (padded), or ``[T, V]`` with CSR
    ``seq_offsets``; ``logp_old``/``logp_ref`` float32 of the leading shape. Other arguments
    as :func:`policy_loss`, except ``logp_rollout``: the fused path has no rollout correction,
    so it is refused (``invalid_argument``, as ``care_logits_policy_loss`` in C). Returns the
    loss, or a tuple with the stats (``return_stats``) and the detached log-probs
    (``return_logp``), in that order.
    """
    if logp_rollout is not None:
        raise _care.error("invalid_argument", _care.LOGITS_NO_ROLLOUT)
    lead = tuple(logits.shape[:-1])
    device = logits.device
    offs, max_len = _loss_layout(lead, seq_offsets, device)
    x2 = _logits_2d(logits)
    n = x2.shape[0]
    y = _targets(targets, n, device)
    lp_dtype = _out_dtype(logits)
    old = _flat(logp_old, lp_dtype, device, "logp_old")
    ref = _flat(logp_ref, lp_dtype, device, "logp_ref")
    adv_t = torch.as_tensor(advantages, device=device)
    kind = advantage_kind(tuple(adv_t.shape), lead, n, offs.shape[0] - 1, per_token)
    adv = _flat(adv_t, torch.float32, device, "advantages")
    opts = options if options is not None else loss_options(preset, **overrides)
    loss, stats, logp, _, _ = torch.ops.care.logits_policy_loss(
        x2, y, old, ref, adv, offs, _mask(mask, device), float(temperature), opts, kind,
        float(global_tokens), float(global_sequences), float(horizon), max_len,
    )  # fmt: skip
    if not (return_stats or return_logp):
        return loss
    out = (loss,)
    if return_stats:
        out += (_host_layout(stats),)
    if return_logp:
        out += (logp.reshape(lead),)
    return out


def fused_supported(preset: Optional[str] = None, options: Optional[str] = None, **overrides) -> bool:
    """Whether :func:`logits_policy_loss_fused` computes this loss: the token-local losses (the
    token-level ratio with the clipped ratio, the dual clip, CISPO, SAPO or GPG, any KL
    estimator and aggregation) without the rollout correction or bypass mode."""
    return _care.fused_supported(options if options is not None else loss_options(preset, **overrides))


def logits_policy_loss_fused(
    logits: Tensor,
    targets,
    logp_old,
    advantages,
    seq_offsets=None,
    mask=None,
    *,
    temperature: float = 1.0,
    logp_ref=None,
    preset: Optional[str] = None,
    options: Optional[str] = None,
    per_token: Optional[bool] = None,
    global_tokens: float = 0.0,
    global_sequences: float = 0.0,
    horizon: float = 0.0,
    in_place: bool = False,
    return_stats: bool = False,
    return_logp: bool = False,
    **overrides,
):
    """The loss and ``dL/dlogits`` in one pass over the logits (the token-local losses,
    :func:`fused_supported`): returns ``(loss, dlogits)`` (``dlogits`` of the logits' shape
    and dtype, for ``dL/dloss = 1``), then the stats (``return_stats``) and the detached
    log-probs (``return_logp``). The same values as :func:`logits_policy_loss` and its
    backward, within the kernels' tolerance (bit for bit at the same block size): on CUDA one
    kernel reads each row once and writes its gradient at once; on the CPU the three-step
    reference. Not an autograd function: pass ``dlogits`` on yourself (``logits.backward
    (dlogits)``, or return it from a ``torch.autograd.Function``). ``in_place=True`` (CUDA)
    writes the gradient over ``logits`` and returns it as ``dlogits`` (no extra ``N x V``
    buffer; eager only, not through ``torch.compile``). Arguments otherwise as
    :func:`logits_policy_loss`; options outside :func:`fused_supported` raise
    ``invalid_argument``."""
    lead = tuple(logits.shape[:-1])
    device = logits.device
    offs, _ = _loss_layout(lead, seq_offsets, device)
    x2 = _logits_2d(logits.detach())
    n = x2.shape[0]
    y = _targets(targets, n, device)
    lp_dtype = _out_dtype(logits)
    old = _flat(logp_old, lp_dtype, device, "logp_old")
    ref = _flat(logp_ref, lp_dtype, device, "logp_ref")
    adv_t = torch.as_tensor(advantages, device=device)
    kind = advantage_kind(tuple(adv_t.shape), lead, n, offs.shape[0] - 1, per_token)
    adv = _flat(adv_t, torch.float32, device, "advantages")
    opts = options if options is not None else loss_options(preset, **overrides)
    m = _mask(mask, device)
    if in_place:
        if not logits.is_cuda or x2.data_ptr() != logits.data_ptr():
            raise _care.error(
                "invalid_argument",
                "logits_policy_loss_fused: in_place needs CUDA logits whose rows are evenly spaced "
                "with contiguous elements (a view as [N, V])",
            )
        if not _care.fused_supported(opts):
            raise _care.error("invalid_argument", _FUSED_REFUSED)
        full = _with_denominators(opts, float(global_tokens), float(global_sequences), float(horizon))
        stats = torch.empty(_N_STATS, dtype=torch.float32, device=device)
        logp = torch.empty(n, dtype=torch.float32, device=device)
        ws = _workspace(x2)
        with _On(x2):
            _care.logits_policy_loss_fused(
                _dl(x2), _dl(y), _dl(adv), _dl(offs), _dl(stats), full, kind, float(temperature), _dl(old),
                _dl(ref), _dl(m), None, _dl(logp), None, _stream(x2), _dl(ws),
            )  # fmt: skip
        _check(ws, _care.check_log_softmax_status)
        loss, d = stats[0].clone(), logits
    else:
        loss, stats, logp, d2 = torch.ops.care.logits_policy_loss_fused(
            x2, y, old, ref, adv, offs, m, float(temperature), opts, kind,
            float(global_tokens), float(global_sequences), float(horizon),
        )  # fmt: skip
        d = d2.reshape(logits.shape)
    out = (loss, d)
    if return_stats:
        out += (_host_layout(stats),)
    if return_logp:
        out += (logp.reshape(lead),)
    return out


# ---- cross-rank advantages on tensors (SPEC §11) ---------------------------------------------


def _groups(rewards: Tensor, group_size, group_offsets):
    if group_offsets is not None:
        offs = _offsets(group_offsets, rewards.device, "group_offsets")
        return 0, offs, offs.shape[0] - 1
    if group_size is None:
        if rewards.dim() != 2:
            raise _care.error("invalid_argument", "give group_size or group_offsets, or [B, G] rewards")
        group_size = rewards.shape[1]
    gs = _count(group_size, "group_size")
    return gs, None, (rewards.numel() // gs if gs else 0)


def group_partial_sums(rewards: Tensor, group_size=None, *, group_offsets=None, valid=None) -> Tensor:
    """Step 1 of the cross-rank advantages (SPEC §11): float64 ``[B, 2]`` (count, sum) of
    this rank's valid rewards per group, on ``rewards``' device. ``all_reduce`` it (SUM).
    Every rank passes the same ``B`` groups (empty CSR ranges for groups it does not hold)."""
    r = torch.as_tensor(rewards)
    gs, offs, b = _groups(r, group_size, group_offsets)
    flat = _flat(r.detach(), torch.float32, r.device, "rewards")
    out = torch.empty((b, 2), dtype=torch.float64, device=r.device)
    with _On(flat):
        _care.group_partial_sums(
            _dl(flat), _dl(out), gs, _dl(offs), _dl(_mask(valid, r.device)), _stream(flat),
            _dl(_workspace(flat)),
        )  # fmt: skip
    return out


def group_partial_squares(
    rewards: Tensor, sums: Tensor, group_size=None, *, group_offsets=None, valid=None
) -> Tensor:
    """Step 2: float64 ``[B]``, this rank's squared deviations from each group's global mean
    (``sums`` all-reduced). ``all_reduce`` it (SUM)."""
    r = torch.as_tensor(rewards)
    gs, offs, b = _groups(r, group_size, group_offsets)
    flat = _flat(r.detach(), torch.float32, r.device, "rewards")
    out = torch.empty(b, dtype=torch.float64, device=r.device)
    with _On(flat):
        _care.group_partial_squares(
            _dl(flat), _dl(sums.detach().contiguous()), _dl(out), gs, _dl(offs),
            _dl(_mask(valid, r.device)), _stream(flat), _dl(_workspace(flat)),
        )  # fmt: skip
    return out


def group_advantages_finalize(
    rewards: Tensor,
    sums: Tensor,
    m2: Tensor,
    group_size=None,
    *,
    group_offsets=None,
    valid=None,
    preset: Optional[str] = "verl",
    options: Optional[str] = None,
    dtype: torch.dtype = torch.float32,
    **overrides,
) -> Tensor:
    """Step 3: this rank's advantages from the all-reduced ``sums`` and ``m2`` (``rewards``'
    shape), equal to :func:`advantages` over the whole batch up to the reduction order.
    ``dtype`` float64 is available on the CPU (the value computed in float64, not rounded)."""
    r = torch.as_tensor(rewards)
    gs, offs, b = _groups(r, group_size, group_offsets)
    flat = _flat(r.detach(), torch.float32, r.device, "rewards")
    out = torch.empty(flat.shape, dtype=dtype, device=r.device)
    opts = options if options is not None else advantage_options(preset, **overrides)
    with _On(flat):
        _care.group_advantages_finalize(
            _dl(flat), _dl(sums.detach().contiguous()), _dl(m2.detach().contiguous()), _dl(out), opts, gs,
            _dl(offs), _dl(_mask(valid, r.device)), None, _stream(flat), _dl(_workspace(flat)),
        )  # fmt: skip
    return out.reshape(r.shape)


# ---- token-level estimators (SPEC §18) -------------------------------------------------------


@torch.library.custom_op("care::discounted_returns", mutates_args=())
def _returns_op(
    token_rewards: Tensor, seq_offsets: Tensor, mask: Optional[Tensor], gamma: float, masked_token: str
) -> Tensor:
    out = torch.empty(token_rewards.shape, dtype=torch.float32, device=token_rewards.device)
    ws = _workspace(token_rewards)
    with _On(token_rewards):
        _care.discounted_returns(
            _dl(token_rewards), _dl(seq_offsets), _dl(out), gamma, _dl(mask), _stream(token_rewards), _dl(ws),
            masked_token,
        )  # fmt: skip
    _check(ws, _care.check_tokens_status)
    return out


@_returns_op.register_fake
def _(token_rewards, seq_offsets, mask, gamma, masked_token):
    return torch.empty_like(token_rewards, dtype=torch.float32)


_returns_op.register_autograd(_not_differentiable("discounted_returns"), setup_context=_no_grad_setup)


@torch.library.custom_op("care::gae", mutates_args=())
def _gae_op(
    token_rewards: Tensor, values: Tensor, seq_offsets: Tensor, mask: Optional[Tensor], gamma: float, lambda_: float
) -> Tuple[Tensor, Tensor]:
    adv = torch.empty(token_rewards.shape, dtype=torch.float32, device=token_rewards.device)
    ret = torch.empty_like(adv)
    ws = _workspace(token_rewards)
    with _On(token_rewards):
        _care.gae(
            _dl(token_rewards), _dl(values), _dl(seq_offsets), _dl(adv), _dl(ret), gamma, lambda_, _dl(mask),
            _stream(token_rewards), _dl(ws),
        )  # fmt: skip
    _check(ws, _care.check_tokens_status)
    return adv, ret


@_gae_op.register_fake
def _(token_rewards, values, seq_offsets, mask, gamma, lambda_):
    return torch.empty_like(token_rewards, dtype=torch.float32), torch.empty_like(token_rewards, dtype=torch.float32)


_gae_op.register_autograd(_not_differentiable("gae"), setup_context=_no_grad_setup)


@torch.library.custom_op("care::whiten", mutates_args=())
def _whiten_op(
    values: Tensor, mask: Optional[Tensor], eps: float, std_kind: str, count_eps: float
) -> Tuple[Tensor, Tensor]:
    out = values.to(torch.float32, copy=True).contiguous()  # whitened in place below
    ws = _workspace(values)
    with _On(values):
        got = _care.whiten(_dl(out), eps, std_kind, _dl(mask), _stream(values), _dl(ws), count_eps)
    if ws is None:
        return out, torch.tensor(got, dtype=torch.float64)
    _check(ws, _care.check_whiten_status)
    # The mean and std stay on the device: read from the workspace's statistics by a kernel.
    words = ws.view(torch.float64)
    i_mean, i_std = _care.WHITEN_MEAN_STD_F64
    return out, torch.stack((words[i_mean], words[i_std]))


@_whiten_op.register_fake
def _(values, mask, eps, std_kind, count_eps):
    return torch.empty_like(values, dtype=torch.float32), values.new_empty(2, dtype=torch.float64)


_whiten_op.register_autograd(_not_differentiable("whiten"), setup_context=_no_grad_setup)


def _whitened(token_rewards: Tensor, values: Optional[Tensor], seq_offsets: Tensor, mask: Optional[Tensor],
              gamma: float, lambda_: float, masked_token: str, eps: float, std_kind: str,
              count_eps: float) -> Tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    adv = torch.empty(token_rewards.shape, dtype=torch.float32, device=token_rewards.device)
    ret = torch.empty_like(adv)
    ws = None
    if token_rewards.is_cuda:
        need = _care.whitened_workspace_bytes(token_rewards.numel())
        ws = _workspace(token_rewards, -(-need // 4))
    tail = (float(eps), std_kind, float(count_eps), _stream(token_rewards), _dl(ws))
    with _On(token_rewards):
        if values is None:
            got = _care.discounted_returns_whitened(
                _dl(token_rewards), _dl(seq_offsets), _dl(adv), _dl(ret), gamma, _dl(mask), masked_token, *tail
            )  # fmt: skip
        else:
            got = _care.gae_whitened(
                _dl(token_rewards), _dl(values), _dl(seq_offsets), _dl(adv), _dl(ret), gamma, lambda_, _dl(mask),
                *tail,
            )  # fmt: skip
    if ws is None:
        return adv, ret, torch.tensor(got, dtype=torch.float64)
    if _DEVICE_CHECKS:
        _care.check_whitened_status(int(ws[_care.WHITENED_STATUS_WORD].item()), int(ws[0].item()))
    words = ws[: _WS_WORDS].view(torch.float64)
    i_mean, i_std = _care.WHITEN_MEAN_STD_F64
    return adv, ret, torch.stack((words[i_mean], words[i_std]))


@torch.library.custom_op("care::discounted_returns_whitened", mutates_args=())
def _returns_whitened_op(
    token_rewards: Tensor, seq_offsets: Tensor, mask: Optional[Tensor], gamma: float, masked_token: str,
    eps: float, std_kind: str, count_eps: float,
) -> Tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    return _whitened(token_rewards, None, seq_offsets, mask, gamma, 1.0, masked_token, eps, std_kind, count_eps)


@_returns_whitened_op.register_fake
def _(token_rewards, seq_offsets, mask, gamma, masked_token, eps, std_kind, count_eps):
    f = torch.empty_like(token_rewards, dtype=torch.float32)
    return f, torch.empty_like(f), token_rewards.new_empty(2, dtype=torch.float64)


_returns_whitened_op.register_autograd(
    _not_differentiable("discounted_returns_whitened"), setup_context=_no_grad_setup
)


@torch.library.custom_op("care::gae_whitened", mutates_args=())
def _gae_whitened_op(
    token_rewards: Tensor, values: Tensor, seq_offsets: Tensor, mask: Optional[Tensor], gamma: float,
    lambda_: float, eps: float, std_kind: str, count_eps: float,
) -> Tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    return _whitened(token_rewards, values, seq_offsets, mask, gamma, lambda_, "skip", eps, std_kind, count_eps)


@_gae_whitened_op.register_fake
def _(token_rewards, values, seq_offsets, mask, gamma, lambda_, eps, std_kind, count_eps):
    f = torch.empty_like(token_rewards, dtype=torch.float32)
    return f, torch.empty_like(f), token_rewards.new_empty(2, dtype=torch.float64)


_gae_whitened_op.register_autograd(_not_differentiable("gae_whitened"), setup_context=_no_grad_setup)


def _token_offsets(x: Tensor, seq_offsets, name: str) -> Tensor:
    if seq_offsets is not None:
        return _offsets(seq_offsets, x.device)
    if x.dim() != 2:
        raise _care.error("invalid_argument", f"give seq_offsets for 1-D {name}, or pass [B, L] {name}")
    b, length = x.shape
    return torch.arange(b + 1, dtype=torch.int32, device=x.device) * length


def discounted_returns(token_rewards, seq_offsets=None, mask=None, *, gamma: float = 1.0, masked_token: str = "skip") -> Tensor:
    """Discounted returns ``G_t = r_t + gamma * G_next`` over each sequence's counted tokens
    (SPEC §18), as :func:`care_rl.discounted_returns` (``masked_token`` included), on
    ``token_rewards``' device: a float32
    tensor of its shape, 0 on masked tokens. Layouts: ``[T]`` with CSR ``seq_offsets``
    ``[B + 1]``, or padded ``[B, L]`` (with an optional ``[B, L]`` mask). CUDA results equal
    the CPU's bit for bit. On CUDA the offsets are not read on the host: a malformed layout
    (``invalid_layout`` on the CPU) leaves unspecified outputs and is raised only under
    :func:`set_device_checks`."""
    r = torch.as_tensor(token_rewards)
    offs = _token_offsets(r, seq_offsets, "token_rewards")
    flat, m = _flat(r.detach(), torch.float32, r.device, "token_rewards"), _mask(mask, r.device)
    _host_finite(flat, "token_rewards", m)
    out = torch.ops.care.discounted_returns(flat, offs, m, float(gamma), str(masked_token))
    return out.reshape(r.shape)


def gae(token_rewards, values, seq_offsets=None, mask=None, *, gamma: float = 1.0, lambda_: float = 1.0):
    """Generalized advantage estimation (SPEC §18), as :func:`care_rl.gae`, on
    ``token_rewards``' device: ``(advantages, returns)``, float32 tensors of its shape,
    ``returns = advantages + values``, 0 on masked tokens; not whitened (see :func:`whiten`).
    Layouts and CUDA behaviour as :func:`discounted_returns`."""
    r = torch.as_tensor(token_rewards)
    offs = _token_offsets(r, seq_offsets, "token_rewards")
    v = _flat(torch.as_tensor(values, device=r.device).detach(), torch.float32, r.device, "values")
    flat, m = _flat(r.detach(), torch.float32, r.device, "token_rewards"), _mask(mask, r.device)
    _host_finite(flat, "token_rewards", m)
    _host_finite(v, "values", m)
    adv, ret = torch.ops.care.gae(flat, v, offs, m, float(gamma), float(lambda_))
    return adv.reshape(r.shape), ret.reshape(r.shape)


def whiten(values, mask=None, *, eps: float = 1e-8, std_kind: str = "unbiased", count_eps: float = 0.0):
    """``(x - mean) / sqrt(var + eps)`` over the counted values (SPEC §18), as
    :func:`care_rl.whiten`, on ``values``' device: ``(whitened, mean, std)``, a float32 copy
    of ``values``' shape (0 where masked) and two 0-d float64 tensors. On CUDA the statistics
    stay on the device (within the documented ``Whiten`` tolerance of the CPU); a non-finite
    counted value (``non_finite`` on the CPU) leaves the copy unwhitened and is raised only
    under :func:`set_device_checks`."""
    v = torch.as_tensor(values)
    flat = _flat(v.detach(), torch.float32, v.device, "values")
    out, stats = torch.ops.care.whiten(flat, _mask(mask, v.device), float(eps), str(std_kind), float(count_eps))
    return out.reshape(v.shape), stats[0], stats[1]


def discounted_returns_whitened(
    token_rewards, seq_offsets=None, mask=None, *, gamma: float = 1.0, masked_token: str = "skip",
    eps: float = 1e-8, std_kind: str = "unbiased", count_eps: float = 0.0,
):  # fmt: skip
    """:func:`discounted_returns` and their whitening over the counted tokens in one op, every
    intermediate in float64, as :func:`care_rl.discounted_returns_whitened` (verl's
    ``reinforce_plus_plus``; ``count_eps=1e-8`` for its ``masked_mean``), on ``token_rewards``'
    device: ``(advantages, returns, mean, std)``, two float32 tensors of its shape (0 where
    masked) and two 0-d float64 tensors (the returns' statistics). On CUDA the unrounded returns
    wait in the workspace between the scan and the whitening (8 bytes a token); the returns
    equal the CPU's bit for bit, the advantages agree within the ``Whiten`` tolerance; a
    malformed layout or a non-finite return is raised only under :func:`set_device_checks`
    (the advantages are then left unwritten)."""
    r = torch.as_tensor(token_rewards)
    offs = _token_offsets(r, seq_offsets, "token_rewards")
    adv, ret, stats = torch.ops.care.discounted_returns_whitened(
        _flat(r.detach(), torch.float32, r.device, "token_rewards"), offs, _mask(mask, r.device), float(gamma),
        str(masked_token), float(eps), str(std_kind), float(count_eps),
    )  # fmt: skip
    return adv.reshape(r.shape), ret.reshape(r.shape), stats[0], stats[1]


def gae_whitened(
    token_rewards, values, seq_offsets=None, mask=None, *, gamma: float = 1.0, lambda_: float = 1.0,
    eps: float = 1e-8, std_kind: str = "unbiased", count_eps: float = 0.0,
):  # fmt: skip
    """:func:`gae` with its advantages whitened in one op, every intermediate in float64, as
    :func:`care_rl.gae_whitened` (verl's ``gae``): ``(advantages, returns, mean, std)``, the
    returns ``A + V`` not whitened, the statistics those of the advantages before whitening.
    Layouts and CUDA behaviour as :func:`discounted_returns_whitened`."""
    r = torch.as_tensor(token_rewards)
    offs = _token_offsets(r, seq_offsets, "token_rewards")
    v = _flat(torch.as_tensor(values, device=r.device).detach(), torch.float32, r.device, "values")
    adv, ret, stats = torch.ops.care.gae_whitened(
        _flat(r.detach(), torch.float32, r.device, "token_rewards"), v, offs, _mask(mask, r.device),
        float(gamma), float(lambda_), float(eps), str(std_kind), float(count_eps),
    )  # fmt: skip
    return adv.reshape(r.shape), ret.reshape(r.shape), stats[0], stats[1]
