"""The torch side of care_torch: tensors in, tensors out, ``libcare`` underneath."""

from __future__ import annotations

import ctypes

import torch

from . import _lib
from ._lib import check

__all__ = ["advantages", "policy_loss", "PolicyLoss", "gpu_available"]

_DTYPES = {
    torch.float32: (_lib.DTYPE_F32, "care_policy_loss_f32"),
    torch.bfloat16: (_lib.DTYPE_BF16, "care_policy_loss_bf16"),
    torch.float16: (_lib.DTYPE_F16, "care_policy_loss_f16"),
}


def gpu_available() -> bool:
    """``True`` when libcare finds a CUDA driver and a device (``care_gpu_available``)."""
    return _lib.lib().care_gpu_available() == 0


def _ptr(t):
    return None if t is None else t.data_ptr()


def _n(t):
    return 0 if t is None else t.numel()


def _stream(device):
    # The CUstream of torch's current stream: care enqueues its kernels behind the trainer's.
    return torch.cuda.current_stream(device).cuda_stream


def _flat(t, dtype, device, name):
    """A contiguous 1-D view (or copy) of ``t`` with ``dtype`` on ``device``."""
    if t is None:
        return None
    t = torch.as_tensor(t)
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device}")
    return t.detach().reshape(-1).to(dtype).contiguous()


def _offsets(t, device):
    # care reads uint32 offsets; int32 has the same bits for offsets below 2**31.
    t = torch.as_tensor(t, device=device)
    if t.numel() and int(t.max()) >= 2**31:
        raise ValueError("seq/group offsets must be below 2**31")
    return t.detach().reshape(-1).to(torch.int32).contiguous()


def _mask(t, device):
    if t is None:
        return None
    t = torch.as_tensor(t, device=device).detach().reshape(-1)
    return (t != 0).to(torch.uint8).contiguous()


def advantages(
    rewards,
    group_size=None,
    *,
    group_offsets=None,
    valid=None,
    preset="verl",
    baseline=None,
    scale=None,
    std=None,
    singleton=None,
    eps=None,
    return_stats=False,
    check_status=True,
    batch_std=None,
):
    """Group-relative advantages of ``rewards`` (SPEC §9), as a float32 tensor of its shape.

    ``rewards`` is 1-D ``[N]`` with ``group_size`` (or CSR ``group_offsets``), or 2-D
    ``[B, G]`` (one group per row; ``group_size`` may be left out). ``valid`` is an optional
    mask of the same numel (a NaN reward is invalid too; invalid samples get 0). ``preset``:
    ``"verl"``, ``"trl"``, ``"trl_batch"``, ``"openrlhf"``, ``"dr_grpo"``, ``"rloo"`` or
    ``None`` (SPEC defaults); the keywords override single fields (by name, e.g.
    ``scale="none"``). CUDA tensors run one ``care`` kernel launch on the current stream; with
    ``check_status`` (default) the call then synchronizes to raise on an infinite reward or a
    singleton group under ``singleton="error"``.

    ``batch_std`` (CUDA only): a one-element float32 device tensor holding the batch std to
    use under ``scale="batch_std"`` (e.g. all-reduced across ranks); ``None`` computes it
    from this call's rewards.

    With ``return_stats`` returns ``(advantages, stats)`` where ``stats`` is an int/float
    tensor ``[B, 4]``: count, mean, std, zero_variance (count and flag as floats).
    """
    rewards = torch.as_tensor(rewards)
    shape, device = rewards.shape, rewards.device
    if group_size is None and group_offsets is None:
        if rewards.dim() != 2:
            raise ValueError("give group_size or group_offsets, or a 2-D [B, G] rewards tensor")
        group_size = rewards.shape[1]
    r = _flat(rewards, torch.float32, device, "rewards")
    v = _mask(valid, device)
    offs = None if group_offsets is None else _offsets(group_offsets, device)
    gs = 0 if offs is not None else int(group_size)
    n = r.numel()
    n_groups = (offs.numel() - 1) if offs is not None else (n // gs if gs else 0)
    opts = _lib.advantage_options(
        preset, baseline=baseline, scale=scale, std=std, singleton=singleton, eps=eps
    )
    out = torch.empty(n, dtype=torch.float32, device=device)
    bstd = None
    if batch_std is not None:
        if device.type != "cuda":
            raise ValueError("batch_std is for CUDA rewards (the CPU path computes its own)")
        bstd = _flat(batch_std, torch.float32, device, "batch_std")
        if bstd.numel() != 1:
            raise ValueError("batch_std must hold exactly one value")
    stats = None
    if return_stats:
        # care_group_stats is {u32, f32, f32, u32}: 16 bytes per group.
        stats = torch.empty((max(n_groups, 0), 4), dtype=torch.int32, device=device)
    lib = _lib.lib()
    if device.type == "cuda":
        ws = torch.empty(_lib.GPU_WORKSPACE_BYTES // 4, dtype=torch.int32, device=device)
        stream = _stream(device)
        check(
            lib.care_gpu_group_advantages(
                r.data_ptr(), n, _ptr(v), _n(v), gs, _ptr(offs), _n(offs), ctypes.byref(opts),
                out.data_ptr(), n, _ptr(stats), 0 if stats is None else n_groups,
                _ptr(bstd), ws.data_ptr(), _lib.GPU_WORKSPACE_BYTES, stream,
            ),
            "care_gpu_group_advantages",
        )  # fmt: skip
        if check_status:
            check(
                lib.care_gpu_advantage_status(ws.data_ptr(), _lib.GPU_WORKSPACE_BYTES, stream),
                "care_gpu_group_advantages",
            )
    else:
        check(
            lib.care_group_advantages(
                r.data_ptr(), n, _ptr(v), _n(v), gs, _ptr(offs), _n(offs), ctypes.byref(opts),
                out.data_ptr(), n, _ptr(stats), 0 if stats is None else n_groups,
            ),
            "care_group_advantages",
        )  # fmt: skip
    out = out.reshape(shape)
    if not return_stats:
        return out
    f = stats.view(torch.float32)
    table = torch.stack(
        [stats[:, 0].to(torch.float32), f[:, 1], f[:, 2], stats[:, 3].to(torch.float32)], dim=1
    )
    return out, table


def _loss_call(logp, logp_old, logp_ref, adv, adv_kind, offs, mask, opts, max_len, want_grad):
    """One libcare loss call; returns (loss float32 0-d tensor, grad or None, LossStats)."""
    lib = _lib.lib()
    dtype_code, cpu_fn = _DTYPES[logp.dtype]
    t = logp.numel()
    device = logp.device
    # The CPU entry points always write the gradient; the GPU one may skip it (forward only).
    need = want_grad or device.type != "cuda"
    grad = torch.empty(t, dtype=torch.float32, device=device) if need else None
    stats = _lib.LossStats()
    if device.type == "cuda":
        stream = _stream(device)
        d_stats = torch.empty(_lib.GPU_LOSS_STATS_BYTES // 4, dtype=torch.int32, device=device)
        ws = torch.empty(_lib.GPU_WORKSPACE_BYTES // 4, dtype=torch.int32, device=device)
        check(
            lib.care_gpu_loss_stats_reset(d_stats.data_ptr(), _lib.GPU_LOSS_STATS_BYTES, stream),
            "care_gpu_loss_stats_reset",
        )
        check(
            lib.care_gpu_policy_loss(
                dtype_code, logp.data_ptr(), t, _ptr(logp_old), _n(logp_old),
                _ptr(logp_ref), _n(logp_ref), offs.data_ptr(), offs.numel(),
                _ptr(mask), _n(mask), adv.data_ptr(), adv.numel(), adv_kind,
                ctypes.byref(opts), max_len, _ptr(grad), _n(grad), 0,
                d_stats.data_ptr(), _lib.GPU_LOSS_STATS_BYTES,
                ws.data_ptr(), _lib.GPU_WORKSPACE_BYTES, stream,
            ),
            "care_gpu_policy_loss",
        )  # fmt: skip
        # Reading the stats synchronizes the stream (the loss is one of them).
        check(
            lib.care_gpu_loss_stats_read(
                d_stats.data_ptr(), _lib.GPU_LOSS_STATS_BYTES, stream, ctypes.byref(stats)
            ),
            "care_gpu_loss_stats_read",
        )
        loss = torch.tensor(stats.loss, dtype=torch.float32, device=device)
    else:
        loss_out = ctypes.c_double()
        check(
            getattr(lib, cpu_fn)(
                logp.data_ptr(), t, _ptr(logp_old), _n(logp_old), _ptr(logp_ref), _n(logp_ref),
                offs.data_ptr(), offs.numel(), _ptr(mask), _n(mask),
                adv.data_ptr(), adv.numel(), adv_kind, ctypes.byref(opts),
                _ptr(grad), _n(grad), ctypes.byref(loss_out), ctypes.byref(stats),
            ),
            cpu_fn,
        )  # fmt: skip
        loss = torch.tensor(loss_out.value, dtype=torch.float32)
    return loss, grad, stats


class PolicyLoss(torch.autograd.Function):
    """``autograd.Function`` of the fused loss: the forward computes the loss and the analytic
    gradient in one pass; the backward only scales the saved gradient by ``grad_output``."""

    @staticmethod
    def forward(ctx, logp, logp_old, logp_ref, adv, adv_kind, offs, mask, opts, max_len, sink):
        flat = logp.detach().reshape(-1).contiguous()
        loss, grad, stats = _loss_call(
            flat, logp_old, logp_ref, adv, adv_kind, offs, mask, opts, max_len,
            want_grad=ctx.needs_input_grad[0],
        )  # fmt: skip
        # `sink` (a list) hands the call's statistics back to `policy_loss`.
        sink.append(stats)
        ctx.logp_shape, ctx.logp_dtype = logp.shape, logp.dtype
        if grad is not None:
            ctx.save_for_backward(grad)
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        (grad,) = ctx.saved_tensors
        g = (grad * grad_output.to(grad.dtype)).to(ctx.logp_dtype).reshape(ctx.logp_shape)
        return g, None, None, None, None, None, None, None, None, None


def policy_loss(
    logp,
    logp_old,
    advantages,
    seq_offsets=None,
    mask=None,
    *,
    logp_ref=None,
    preset=None,
    return_stats=False,
    **options,
):
    """The clipped-ratio policy loss of one micro-batch (SPEC §10) as a 0-d float32 tensor;
    ``loss.backward()`` writes ``dL/dlogp`` (the fused analytic gradient) into ``logp.grad``.

    Layouts: ``logp`` is 1-D ``[T]`` with CSR ``seq_offsets`` ``[B + 1]``, or padded 2-D
    ``[B, L]`` (then ``seq_offsets`` may be left out and ``mask`` is the ``[B, L]`` response
    mask, as in verl and TRL). ``logp_old`` (``None``: on-policy) and ``logp_ref`` have
    ``logp``'s shape; f32, bf16 or f16, all one dtype. ``advantages`` are per sequence
    (``[B]``) or per token (``logp``'s shape). ``preset``: ``"verl"``, ``"trl"`` or ``None``;
    ``options`` override fields: ``aggregation`` (``"token_mean"``, ``"seq_mean_token_mean"``,
    ``"seq_mean_token_sum"``, ``"seq_mean_token_sum_norm"``, ``"token_sum"``),
    ``ratio_level`` (``"token"``, ``"sequence"``), ``kl`` (``"k1"``, ``"abs"``, ``"k2"``,
    ``"k3"``), and ``eps_low``, ``eps_high``, ``dual_clip``, ``beta``, ``log_ratio_clamp``,
    ``seq_log_ratio_max``, ``kl_input_clamp``, ``kl_output_clamp``, ``global_tokens``,
    ``global_sequences``, ``horizon``. With ``return_stats`` returns ``(loss, stats_dict)``.

    CUDA tensors run the fused ``care`` kernel on the current stream; the call synchronizes
    once to read the loss. CPU tensors run the Rust reference (f64 accumulation).
    """
    logp_t = torch.as_tensor(logp)
    device, dtype = logp_t.device, logp_t.dtype
    if dtype not in _DTYPES:
        raise TypeError(f"logp dtype {dtype}: expected float32, bfloat16 or float16")
    max_len = 0
    if logp_t.dim() == 2 and seq_offsets is None:
        b, length = logp_t.shape
        seq_offsets = torch.arange(0, (b + 1) * length, length, device=device)
        max_len = length
    elif seq_offsets is None:
        raise ValueError("give seq_offsets for a 1-D logp, or pass a 2-D [B, L] logp")
    offs = _offsets(seq_offsets, device)
    n_seq = offs.numel() - 1
    old = _flat(logp_old, dtype, device, "logp_old")
    ref = _flat(logp_ref, dtype, device, "logp_ref")
    m = _mask(mask, device)
    adv_t = torch.as_tensor(advantages, device=device)
    if adv_t.shape == logp_t.shape and adv_t.numel() != n_seq:
        kind = _lib.ADV_PER_TOKEN
    elif adv_t.numel() == n_seq:
        kind = _lib.ADV_PER_SEQUENCE
    elif adv_t.numel() == logp_t.numel():
        kind = _lib.ADV_PER_TOKEN
    else:
        raise ValueError(
            f"advantages have {adv_t.numel()} values: expected {n_seq} (per sequence) "
            f"or {logp_t.numel()} (per token)"
        )
    adv = _flat(adv_t, torch.float32, device, "advantages")
    opts = _lib.loss_options(preset, **options)
    sink = []
    loss = PolicyLoss.apply(logp_t, old, ref, adv, kind, offs, m, opts, max_len, sink)
    if not return_stats:
        return loss
    return loss, sink[0].as_dict()
