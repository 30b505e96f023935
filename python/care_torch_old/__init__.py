"""care_torch: the GRPO step of ``care`` for PyTorch, in pure Python over ``libcare``.

``advantages(rewards, group_size=..., preset=...)`` computes group-relative advantages
(SPEC §9) and ``policy_loss(logp, logp_old, advantages, seq_offsets, mask, ...)`` the
clipped-ratio policy loss (SPEC §10) as a differentiable scalar whose backward is the fused
analytic gradient. CPU tensors run the Rust reference, CUDA tensors the ``care`` kernels on
the current torch stream. No build step: build ``libcare`` once with
``cargo build --release -p care-ffi`` (or set ``CARE_LIB``) and put ``python/`` on the path.

Only ``care_torch._lib`` (ctypes, no torch) is imported eagerly; the torch functions load
torch on first use, so the ctypes layer also serves numpy callers.
"""

from __future__ import annotations

__all__ = [
    "advantages",
    "policy_loss",
    "PolicyLoss",
    "CareError",
    "gpu_available",
    "selective_log_softmax",
    "logits_policy_loss",
]

from ._lib import CareError  # noqa: E402  (no torch needed)

_TORCH_NAMES = {"advantages", "policy_loss", "PolicyLoss", "gpu_available"}


# The selective log-softmax lives in its own module (care_torch.logsoftmax), loaded lazily too.
_LOGSOFTMAX_NAMES = {"selective_log_softmax", "logits_policy_loss"}


def __getattr__(name):
    if name in _LOGSOFTMAX_NAMES:
        from . import logsoftmax

        return getattr(logsoftmax, name)
    if name in _TORCH_NAMES:
        from . import _torch

        return getattr(_torch, name)
    raise AttributeError(f"module 'care_torch' has no attribute {name!r}")
