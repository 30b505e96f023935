"""Selective log-softmax for PyTorch over ``libcare``: per-token log-probs (and entropy) straight
from logits without materializing the softmax, differentiable, plus the fused path from logits
to the policy loss (SPEC §10).

CUDA tensors run the fused ``care`` kernels on the current torch stream (one pass over the
logits forward, one backward; nothing of size ``[N, V]`` is allocated except the gradient, and
``inplace_backward=True`` writes that into the logits' own storage). CPU tensors run the Rust
``f64`` reference. The contract, edge cases included, is ``care_core::logsoftmax``: masked rows
give 0 and a zero gradient; a ``-inf`` logit has probability 0; a target outside ``0..V`` on a
counted row is an error.
"""

from __future__ import annotations

import ctypes

import torch

from . import _lib
from ._lib import check

__all__ = ["selective_log_softmax", "logits_policy_loss", "SelectiveLogSoftmax"]

_u32, _f64, _sz, _vp = ctypes.c_uint32, ctypes.c_double, ctypes.c_size_t, ctypes.c_void_p
_P = ctypes.POINTER

_CPU_FWD = [_u32, _vp, _sz, _sz, _sz, _sz, _vp, _sz, _u32, _vp, _sz, _f64,
            _vp, _sz, _vp, _sz, _vp, _sz]  # fmt: skip
_CPU_BWD = [_u32, _vp, _sz, _sz, _sz, _sz, _vp, _sz, _u32, _vp, _sz, _f64,
            _vp, _sz, _vp, _sz, _vp, _sz]  # fmt: skip
_SIGNATURES = {
    "care_log_softmax": (_u32, _CPU_FWD),
    "care_log_softmax_backward": (_u32, _CPU_BWD),
    "care_gpu_log_softmax": (
        _u32,
        [_u32, _vp, _sz, _u32, _sz, _vp, _sz, _u32, _vp, _sz, _f64,
         _vp, _sz, _vp, _sz, _vp, _sz, _vp, _sz, _vp],
    ),
    "care_gpu_log_softmax_status": (_u32, [_vp, _sz, _vp]),
    "care_gpu_log_softmax_backward": (
        _u32,
        [_u32, _vp, _sz, _u32, _sz, _vp, _sz, _u32, _vp, _sz, _f64,
         _vp, _sz, _vp, _sz, _vp, _sz, _vp, _sz, _vp, _sz, _vp],
    ),
    "care_gpu_logits_policy_loss": (
        _u32,
        [_u32, _vp, _sz, _u32, _sz, _vp, _sz, _u32, _vp, _sz, _f64,
         _vp, _sz,  # logp_old
         _vp, _sz,  # logp_ref
         _vp, _sz,  # seq_offsets
         _vp, _sz, _u32,  # advantages, kind
         _P(_lib.LossOptions), _u32,  # options, max_seq_len
         _vp, _sz, _vp, _sz, _vp, _sz,  # logp, lse, dlogp outputs
         _vp, _sz, _vp, _sz, _vp],  # stats, workspace, stream
    ),
}  # fmt: skip

_DTYPES = {
    torch.float32: _lib.DTYPE_F32,
    torch.bfloat16: _lib.DTYPE_BF16,
    torch.float16: _lib.DTYPE_F16,
}
_DECLARED = None


def _lib_handle():
    """``libcare`` with the log-softmax signatures declared (once)."""
    global _DECLARED
    handle = _lib.lib()
    if _DECLARED is not handle:
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(handle, name)
            fn.restype, fn.argtypes = restype, argtypes
        _DECLARED = handle
    return handle


def _ptr(t):
    return None if t is None else t.data_ptr()


def _n(t):
    return 0 if t is None else t.numel()


def _stream(device):
    return torch.cuda.current_stream(device).cuda_stream


def _rows_view(logits):
    """``(x2, rows, vocab, row_stride)``: a 2-D ``[rows, V]`` view of ``logits`` whose rows are
    ``row_stride`` elements apart, or a contiguous copy when no such view exists (for example
    ``logits[:, :-1]`` of a ``[B, L, V]`` tensor with ``B > 1``)."""
    if logits.dim() < 1:
        raise ValueError("logits must have a vocabulary dimension")
    v = logits.shape[-1]
    if logits.dtype not in _DTYPES:
        raise TypeError(f"logits dtype {logits.dtype}: expected float32, bfloat16 or float16")
    x = logits.detach()
    if x.dim() == 1:
        x = x.unsqueeze(0)
    try:
        x2 = x.view(-1, v)
    except RuntimeError:
        x2 = x.reshape(-1, v)
    if x2.stride(-1) != 1 or (x2.shape[0] > 1 and x2.stride(0) < v):
        x2 = x2.contiguous()
    stride = x2.stride(0) if x2.shape[0] > 1 else v
    return x2, x2.shape[0], v, stride


def _targets(targets, rows, device):
    t = torch.as_tensor(targets, device=device).detach().reshape(-1)
    if t.numel() != rows:
        raise ValueError(f"targets have {t.numel()} values, logits have {rows} rows")
    if t.dtype == torch.int64:
        return t.contiguous(), 1
    return t.to(torch.int32).contiguous(), 0


def _mask(mask, rows, device):
    if mask is None:
        return None
    m = torch.as_tensor(mask, device=device).detach().reshape(-1)
    if m.numel() != rows:
        raise ValueError(f"mask has {m.numel()} values, logits have {rows} rows")
    return (m != 0).to(torch.uint8).contiguous()


def _forward(x2, rows, v, stride, y, i64, m, temperature, want_entropy):
    lib = _lib_handle()
    device = x2.device
    logp = torch.empty(rows, dtype=torch.float32, device=device)
    lse = torch.empty(rows, dtype=torch.float32, device=device)
    ent = torch.empty(rows, dtype=torch.float32, device=device) if want_entropy else None
    code = _DTYPES[x2.dtype]
    if device.type == "cuda":
        ws = torch.empty(_lib.GPU_WORKSPACE_BYTES // 4, dtype=torch.int32, device=device)
        stream = _stream(device)
        check(
            lib.care_gpu_log_softmax(
                code, x2.data_ptr(), rows, v, stride, y.data_ptr(), rows, i64, _ptr(m), _n(m),
                float(temperature), logp.data_ptr(), rows, _ptr(ent), _n(ent), lse.data_ptr(),
                rows, ws.data_ptr(), _lib.GPU_WORKSPACE_BYTES, stream,
            ),
            "care_gpu_log_softmax",
        )  # fmt: skip
        return logp, ent, lse, ws
    n_el = (rows - 1) * stride + v if rows else 0
    check(
        lib.care_log_softmax(
            code, x2.data_ptr(), n_el, rows, v, stride, y.data_ptr(), rows, i64, _ptr(m), _n(m),
            float(temperature), logp.data_ptr(), rows, _ptr(ent), _n(ent), lse.data_ptr(), rows,
        ),
        "care_log_softmax",
    )  # fmt: skip
    return logp, ent, lse, None


def _backward(x2, rows, v, stride, y, i64, m, temperature, lse, ent, g, ge, inplace):
    """dlogits as a ``[rows, V]`` tensor in the logits dtype (``x2`` itself when ``inplace``)."""
    lib = _lib_handle()
    device = x2.device
    code = _DTYPES[x2.dtype]
    if device.type == "cuda":
        out = x2 if inplace else torch.empty((rows, v), dtype=x2.dtype, device=device)
        ostride = stride if inplace else v
        check(
            lib.care_gpu_log_softmax_backward(
                code, x2.data_ptr(), rows, v, stride, y.data_ptr(), rows, i64, _ptr(m), _n(m),
                float(temperature), lse.data_ptr(), rows, _ptr(ent) if ge is not None else None,
                _n(ent) if ge is not None else 0, _ptr(g), _n(g), _ptr(ge), _n(ge),
                out.data_ptr(), ostride, _stream(device),
            ),
            "care_gpu_log_softmax_backward",
        )  # fmt: skip
        return out
    out = torch.empty((rows, v), dtype=torch.float32)
    n_el = (rows - 1) * stride + v if rows else 0
    gz = g if g is not None else torch.zeros(rows, dtype=torch.float32)
    check(
        lib.care_log_softmax_backward(
            code, x2.data_ptr(), n_el, rows, v, stride, y.data_ptr(), rows, i64, _ptr(m), _n(m),
            float(temperature), gz.data_ptr(), rows, _ptr(ge), _n(ge), out.data_ptr(), rows * v,
        ),
        "care_log_softmax_backward",
    )  # fmt: skip
    return out.to(x2.dtype)


class SelectiveLogSoftmax(torch.autograd.Function):
    """``autograd.Function``: forward ``(logp, entropy)`` from logits; backward ``dlogits``."""

    @staticmethod
    def forward(
        ctx, logits, targets, mask, temperature, want_entropy, inplace_backward, check_targets
    ):
        x2, rows, v, stride = _rows_view(logits)
        y, i64 = _targets(targets, rows, logits.device)
        m = _mask(mask, rows, logits.device)
        logp, ent, lse, ws = _forward(x2, rows, v, stride, y, i64, m, temperature, want_entropy)
        if ws is not None and check_targets:
            check(
                _lib_handle().care_gpu_log_softmax_status(
                    ws.data_ptr(), _lib.GPU_WORKSPACE_BYTES, _stream(logits.device)
                ),
                "care_gpu_log_softmax (targets)",
            )
        ctx.meta = (rows, v, stride, i64, float(temperature), inplace_backward, logits.shape)
        ctx.save_for_backward(x2, y, m if m is not None else torch.empty(0), lse,
                              ent if ent is not None else torch.empty(0))  # fmt: skip
        ctx.has_mask, ctx.has_ent = m is not None, ent is not None
        lead = logits.shape[:-1]
        out_ent = ent.reshape(lead) if ent is not None else None
        if out_ent is not None:
            return logp.reshape(lead), out_ent
        return logp.reshape(lead), torch.zeros((), device=logits.device)

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        x2, y, m, lse, ent = ctx.saved_tensors
        rows, v, stride, i64, temperature, inplace, shape = ctx.meta
        m = m if ctx.has_mask else None
        g = None if g_logp is None else g_logp.reshape(-1).to(torch.float32).contiguous()
        ge = None
        if ctx.has_ent and g_ent is not None:
            ge = g_ent.reshape(-1).to(torch.float32).contiguous()
        d = _backward(x2, rows, v, stride, y, i64, m, temperature, lse,
                      ent if ctx.has_ent else None, g, ge, inplace)  # fmt: skip
        return d.reshape(shape) if d.shape != shape else d, None, None, None, None, None, None


def selective_log_softmax(
    logits,
    targets,
    *,
    temperature=1.0,
    mask=None,
    return_entropy=False,
    inplace_backward=False,
    check_targets=True,
):
    """``log_softmax(logits / temperature).gather(-1, targets)`` without the ``[N, V]``
    softmax: a float32 tensor of ``logits.shape[:-1]`` (with ``return_entropy``, also the
    entropy of every row). Differentiable w.r.t. ``logits`` (and through the entropy).

    ``logits``: ``[..., V]`` in float32, bfloat16 or float16, any row stride (a strided 2-D view
    such as ``x[:, :V]`` runs without a copy); ``targets``: int64 or int32 ids of the leading
    shape; ``mask``: optional, rows with 0 are not read and give 0. ``inplace_backward=True``
    writes ``dlogits`` over the logits' storage on the GPU (saves ``N * V`` elements; only if
    nothing else needs the logits afterwards). ``check_targets`` synchronizes once on the GPU
    to raise on a target outside ``0..V`` (such rows give NaN otherwise).
    """
    logits = torch.as_tensor(logits)
    logp, ent = SelectiveLogSoftmax.apply(
        logits, targets, mask, float(temperature), bool(return_entropy), bool(inplace_backward),
        bool(check_targets),
    )  # fmt: skip
    return (logp, ent) if return_entropy else logp


class _LogitsPolicyLoss(torch.autograd.Function):
    """The fused GPU path: forward = log-softmax + loss + dlogp, backward = dlogits."""

    @staticmethod
    def forward(ctx, logits, y, i64, m, temperature, old, ref, adv, kind, offs, opts, max_len,
                inplace, sink):  # fmt: skip
        x2, rows, v, stride = _rows_view(logits)
        device = logits.device
        lib = _lib_handle()
        logp = torch.empty(rows, dtype=torch.float32, device=device)
        lse = torch.empty_like(logp)
        dlogp = torch.empty_like(logp)
        stream = _stream(device)
        d_stats = torch.empty(_lib.GPU_LOSS_STATS_BYTES // 4, dtype=torch.int32, device=device)
        ws = torch.empty(_lib.GPU_WORKSPACE_BYTES // 4, dtype=torch.int32, device=device)
        check(
            lib.care_gpu_loss_stats_reset(d_stats.data_ptr(), _lib.GPU_LOSS_STATS_BYTES, stream),
            "care_gpu_loss_stats_reset",
        )
        check(
            lib.care_gpu_logits_policy_loss(
                _DTYPES[x2.dtype], x2.data_ptr(), rows, v, stride, y.data_ptr(), rows, i64,
                _ptr(m), _n(m), temperature, _ptr(old), _n(old), _ptr(ref), _n(ref),
                offs.data_ptr(), offs.numel(), adv.data_ptr(), adv.numel(), kind,
                ctypes.byref(opts), max_len, logp.data_ptr(), rows, lse.data_ptr(), rows,
                dlogp.data_ptr(), rows, d_stats.data_ptr(), _lib.GPU_LOSS_STATS_BYTES,
                ws.data_ptr(), _lib.GPU_WORKSPACE_BYTES, stream,
            ),
            "care_gpu_logits_policy_loss",
        )  # fmt: skip
        check(lib.care_gpu_log_softmax_status(ws.data_ptr(), _lib.GPU_WORKSPACE_BYTES, stream),
              "care_gpu_logits_policy_loss (targets)")  # fmt: skip
        stats = _lib.LossStats()
        check(
            lib.care_gpu_loss_stats_read(
                d_stats.data_ptr(), _lib.GPU_LOSS_STATS_BYTES, stream, ctypes.byref(stats)
            ),
            "care_gpu_loss_stats_read",
        )
        sink.append((stats, logp))
        ctx.meta = (rows, v, stride, i64, temperature, inplace, logits.shape)
        ctx.save_for_backward(x2, y, m if m is not None else torch.empty(0), lse, dlogp)
        ctx.has_mask = m is not None
        return torch.tensor(stats.loss, dtype=torch.float32, device=device)

    @staticmethod
    def backward(ctx, grad_output):
        x2, y, m, lse, dlogp = ctx.saved_tensors
        rows, v, stride, i64, temperature, inplace, shape = ctx.meta
        g = (dlogp * grad_output.to(torch.float32)).contiguous()
        d = _backward(x2, rows, v, stride, y, i64, m if ctx.has_mask else None, temperature, lse,
                      None, g, None, inplace)  # fmt: skip
        return (d.reshape(shape),) + (None,) * 13


def logits_policy_loss(
    logits,
    targets,
    logp_old,
    advantages,
    seq_offsets=None,
    mask=None,
    *,
    temperature=1.0,
    logp_ref=None,
    preset=None,
    inplace_backward=False,
    return_stats=False,
    **options,
):
    """The policy loss (SPEC §10) straight from logits: ``logp = selective_log_softmax(logits,
    targets, temperature)`` then :func:`care_torch.policy_loss`, as one differentiable scalar.

    On CUDA this is one fused forward (log-softmax, loss, stats and ``dL/dlogp`` on the
    device) and one backward kernel writing ``dlogits`` (over the logits' storage with
    ``inplace_backward``). On the CPU it composes the two reference functions. Layouts as
    :func:`care_torch.policy_loss`: ``logits`` ``[B, L, V]`` with ``[B, L]`` targets/mask, or
    ``[T, V]`` with CSR ``seq_offsets``; ``logp_old`` / ``logp_ref`` are float32 here. With
    ``return_stats`` returns ``(loss, stats_dict, logp)``.
    """
    from . import _torch

    logits = torch.as_tensor(logits)
    device = logits.device
    if device.type != "cuda":
        logp = selective_log_softmax(logits, targets, temperature=temperature, mask=mask)
        out = _torch.policy_loss(
            logp, logp_old, advantages, seq_offsets, mask, logp_ref=logp_ref, preset=preset,
            return_stats=return_stats, **options,
        )  # fmt: skip
        return (out[0], out[1], logp.detach()) if return_stats else out
    lead = logits.shape[:-1]
    max_len = 0
    if len(lead) == 2 and seq_offsets is None:
        b, length = lead
        seq_offsets = torch.arange(0, (b + 1) * length, length, device=device)
        max_len = length
    elif seq_offsets is None:
        raise ValueError("give seq_offsets for [T, V] logits, or pass [B, L, V] logits")
    offs = _torch._offsets(seq_offsets, device)
    n_seq = offs.numel() - 1
    rows = 1
    for s in lead:
        rows *= s
    y, i64 = _targets(targets, rows, device)
    m = _mask(mask, rows, device)
    old = _torch._flat(logp_old, torch.float32, device, "logp_old")
    ref = _torch._flat(logp_ref, torch.float32, device, "logp_ref")
    adv_t = torch.as_tensor(advantages, device=device)
    if adv_t.numel() == n_seq and not (adv_t.shape == lead and adv_t.numel() == rows):
        kind = _lib.ADV_PER_SEQUENCE
    elif adv_t.numel() == rows:
        kind = _lib.ADV_PER_TOKEN
    else:
        raise ValueError(f"advantages: expected {n_seq} (per sequence) or {rows} (per token)")
    adv = _torch._flat(adv_t, torch.float32, device, "advantages")
    opts = _lib.loss_options(preset, **options)
    sink = []
    loss = _LogitsPolicyLoss.apply(
        logits, y, i64, m, float(temperature), old, ref, adv, kind, offs, opts, max_len,
        bool(inplace_backward), sink,
    )  # fmt: skip
    if not return_stats:
        return loss
    stats, logp = sink[0]
    return loss, stats.as_dict(), logp.reshape(lead)
