"""ctypes declarations of the parts of ``libcare`` (``include/care.h``) that the GRPO step uses.

This module needs nothing but the standard library: callers pass raw addresses (``int``) and
lengths, so it works with torch tensors (``t.data_ptr()``), numpy arrays
(``a.ctypes.data``) or any other buffer. The library is found, in order, at ``$CARE_LIB``,
at ``target/release/libcare.so`` and ``target/debug/libcare.so`` of the repository this package
sits in, or by ``ctypes.util.find_library("care")``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path

__all__ = [
    "ABI_VERSION",
    "AdvantageOptions",
    "CareError",
    "GroupStats",
    "LossOptions",
    "LossStats",
    "DTYPE_F32",
    "DTYPE_BF16",
    "DTYPE_F16",
    "GPU_LOSS_STATS_BYTES",
    "GPU_WORKSPACE_BYTES",
    "lib",
    "check",
    "advantage_options",
    "loss_options",
]

#: The C ABI version this module was written against (``CARE_ABI_VERSION``).
ABI_VERSION = 1
#: ``CARE_GPU_WORKSPACE_BYTES``.
GPU_WORKSPACE_BYTES = 64
#: ``CARE_GPU_LOSS_STATS_BYTES``.
GPU_LOSS_STATS_BYTES = 56
#: ``care_dtype`` values.
DTYPE_F32, DTYPE_BF16, DTYPE_F16 = 0, 1, 2
#: ``care_advantages_kind`` values.
ADV_PER_SEQUENCE, ADV_PER_TOKEN = 0, 1

# Names of the enum values accepted by the keyword options (the C enums' order).
BASELINES = {"mean": 0, "leave_one_out": 1, "none": 2}
SCALES = {"group_std": 0, "batch_std": 1, "none": 2}
STD_KINDS = {"unbiased": 0, "biased": 1}
SINGLETONS = {"zero": 0, "raw": 1, "error": 2}
AGGREGATIONS = {
    "token_mean": 0,
    "seq_mean_token_mean": 1,
    "seq_mean_token_sum": 2,
    "seq_mean_token_sum_norm": 3,
    "token_sum": 4,
}
KL_ESTIMATORS = {"k1": 0, "abs": 1, "k2": 2, "k3": 3}
RATIO_LEVELS = {"token": 0, "sequence": 1}

_u32, _f64, _sz, _vp = ctypes.c_uint32, ctypes.c_double, ctypes.c_size_t, ctypes.c_void_p


class AdvantageOptions(ctypes.Structure):
    """``care_advantage_options``."""

    _fields_ = [
        ("struct_size", _u32),
        ("baseline", _u32),
        ("scale", _u32),
        ("std_kind", _u32),
        ("singleton", _u32),
        ("reserved", _u32),
        ("eps", _f64),
    ]


class GroupStats(ctypes.Structure):
    """``care_group_stats``."""

    _fields_ = [
        ("count", _u32),
        ("mean", ctypes.c_float),
        ("std", ctypes.c_float),
        ("zero_variance", _u32),
    ]


class LossOptions(ctypes.Structure):
    """``care_loss_options``."""

    _fields_ = [
        ("struct_size", _u32),
        ("aggregation", _u32),
        ("ratio_level", _u32),
        ("kl_estimator", _u32),
        ("eps_low", _f64),
        ("eps_high", _f64),
        ("dual_clip", _f64),
        ("log_ratio_clamp", _f64),
        ("seq_log_ratio_max", _f64),
        ("beta", _f64),
        ("kl_input_clamp", _f64),
        ("kl_output_clamp", _f64),
        ("global_tokens", _f64),
        ("global_sequences", _f64),
        ("horizon", _f64),
    ]


class LossStats(ctypes.Structure):
    """``care_loss_stats``: sums that add across micro-batches and ranks."""

    _fields_ = [
        (name, _f64)
        for name in (
            "tokens",
            "sequences",
            "loss",
            "clipped",
            "clipped_low",
            "clipped_high",
            "dual_clipped",
            "ppo_kl_sum",
            "kl_sum",
            "ratio_sum",
            "log_ratio_clamped",
            "non_finite",
            "ratio_min",
            "ratio_max",
        )
    ]

    def as_dict(self) -> dict:
        """The statistics as a plain ``dict`` of floats."""
        return {name: getattr(self, name) for name, _ in self._fields_}


class CareError(RuntimeError):
    """A ``care_result`` other than ``CARE_OK``; ``code`` holds the number."""

    def __init__(self, code: int, what: str):
        msg = lib().care_result_message(code)
        text = msg.decode() if msg else "unknown"
        super().__init__(f"{what}: {text} (care_result {code})")
        self.code = code


_P = ctypes.POINTER
_LOSS_CPU_ARGS = [
    _vp, _sz,  # logp
    _vp, _sz,  # logp_old
    _vp, _sz,  # logp_ref
    _vp, _sz,  # seq_offsets
    _vp, _sz,  # mask
    _vp, _sz,  # advantages
    _u32,  # advantages_kind
    _P(LossOptions),
    _vp, _sz,  # grad_out
    _P(_f64),  # loss_out
    _P(LossStats),
]  # fmt: skip

_SIGNATURES = {
    "care_abi_version": (_u32, []),
    "care_result_message": (ctypes.c_char_p, [_u32]),
    "care_advantage_options_default": (_u32, [_P(AdvantageOptions)]),
    "care_advantage_options_preset_by_name": (
        _u32,
        [ctypes.c_char_p, _sz, _P(AdvantageOptions)],
    ),
    "care_group_advantages": (
        _u32,
        [_vp, _sz, _vp, _sz, _u32, _vp, _sz, _P(AdvantageOptions), _vp, _sz, _vp, _sz],
    ),
    "care_loss_options_default": (_u32, [_P(LossOptions)]),
    "care_loss_options_preset_by_name": (_u32, [ctypes.c_char_p, _sz, _P(LossOptions)]),
    "care_policy_loss_f32": (_u32, _LOSS_CPU_ARGS),
    "care_policy_loss_bf16": (_u32, _LOSS_CPU_ARGS),
    "care_policy_loss_f16": (_u32, _LOSS_CPU_ARGS),
    "care_loss_stats_empty": (_u32, [_P(LossStats)]),
    "care_loss_stats_add": (_u32, [_P(LossStats), _P(LossStats)]),
    "care_gpu_available": (_u32, []),
    "care_gpu_group_advantages": (
        _u32,
        [_vp, _sz, _vp, _sz, _u32, _vp, _sz, _P(AdvantageOptions), _vp, _sz, _vp, _sz,
         _vp,  # d_batch_std (optional)
         _vp, _sz, _vp],
    ),  # fmt: skip
    "care_gpu_advantage_status": (_u32, [_vp, _sz, _vp]),
    "care_gpu_loss_stats_reset": (_u32, [_vp, _sz, _vp]),
    "care_gpu_loss_stats_read": (_u32, [_vp, _sz, _vp, _P(LossStats)]),
    "care_gpu_policy_loss": (
        _u32,
        [
            _u32,  # dtype
            _vp, _sz,  # logp
            _vp, _sz,  # logp_old
            _vp, _sz,  # logp_ref
            _vp, _sz,  # seq_offsets
            _vp, _sz,  # mask
            _vp, _sz,  # advantages
            _u32,  # advantages_kind
            _P(LossOptions),
            _u32,  # max_seq_len
            _vp, _sz,  # grad_out
            _u32,  # grad_in_input_dtype
            _vp, _sz,  # stats
            _vp, _sz,  # workspace
            _vp,  # stream
        ],
    ),
}  # fmt: skip

_LIB = None


def _candidates():
    env = os.environ.get("CARE_LIB")
    if env:
        yield Path(env)
    root = Path(__file__).resolve().parents[2]
    target = Path(os.environ.get("CARGO_TARGET_DIR", root / "target"))
    for profile in ("release", "debug"):
        yield target / profile / "libcare.so"
    found = ctypes.util.find_library("care")
    if found:
        yield Path(found)


def lib() -> ctypes.CDLL:
    """The loaded ``libcare`` with every used function's signature declared (loaded once)."""
    global _LIB
    if _LIB is not None:
        return _LIB
    tried = []
    for path in _candidates():
        tried.append(str(path))
        # A bare name from find_library is resolved by the loader, not the file system.
        if path.exists() or os.sep not in str(path):
            handle = ctypes.CDLL(str(path))
            break
    else:
        raise OSError(
            "libcare not found (build it with `cargo build --release -p care-ffi` or set "
            "CARE_LIB); tried: " + ", ".join(tried)
        )
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(handle, name)
        fn.restype = restype
        fn.argtypes = argtypes
    abi = handle.care_abi_version()
    if abi != ABI_VERSION:
        raise OSError(f"libcare ABI {abi}, this binding was written for ABI {ABI_VERSION}")
    _LIB = handle
    return handle


def check(code: int, what: str) -> None:
    """Raises :class:`CareError` unless ``code`` is ``CARE_OK``."""
    if code != 0:
        raise CareError(code, what)


def _pick(table: dict, key: str, value) -> int:
    if isinstance(value, int):
        return value
    try:
        return table[value]
    except KeyError:
        raise ValueError(f"{key}={value!r}: expected one of {sorted(table)}") from None


def advantage_options(
    preset=None,
    *,
    baseline=None,
    scale=None,
    std=None,
    singleton=None,
    eps=None,
) -> AdvantageOptions:
    """Options from a preset name (``"verl"``, ``"trl"``, ``"trl_batch"``, ``"openrlhf"``,
    ``"dr_grpo"``, ``"rloo"``; ``None`` = the SPEC defaults), then single fields overridden."""
    opts = AdvantageOptions()
    if preset is None:
        check(lib().care_advantage_options_default(ctypes.byref(opts)), "advantage options")
    else:
        name = preset.encode()
        check(
            lib().care_advantage_options_preset_by_name(name, len(name), ctypes.byref(opts)),
            f"advantage preset {preset!r}",
        )
    if baseline is not None:
        opts.baseline = _pick(BASELINES, "baseline", baseline)
    if scale is not None:
        opts.scale = _pick(SCALES, "scale", scale)
    if std is not None:
        opts.std_kind = _pick(STD_KINDS, "std", std)
    if singleton is not None:
        opts.singleton = _pick(SINGLETONS, "singleton", singleton)
    if eps is not None:
        opts.eps = float(eps)
    return opts


def loss_options(preset=None, **fields) -> LossOptions:
    """Options from a loss preset name (``"verl"``, ``"trl"``; ``None`` = the SPEC defaults),
    then fields overridden: ``aggregation``, ``ratio_level``, ``kl`` (estimator) by name or
    number, and any float field of ``care_loss_options`` (``eps_low``, ``beta``, ...)."""
    opts = LossOptions()
    if preset is None:
        check(lib().care_loss_options_default(ctypes.byref(opts)), "loss options")
    else:
        name = preset.encode()
        check(
            lib().care_loss_options_preset_by_name(name, len(name), ctypes.byref(opts)),
            f"loss preset {preset!r}",
        )
    floats = {name for name, typ in LossOptions._fields_ if typ is _f64}
    for key, value in fields.items():
        if value is None:
            continue
        if key == "aggregation":
            opts.aggregation = _pick(AGGREGATIONS, key, value)
        elif key == "ratio_level":
            opts.ratio_level = _pick(RATIO_LEVELS, key, value)
        elif key == "kl":
            opts.kl_estimator = _pick(KL_ESTIMATORS, key, value)
        elif key in floats:
            setattr(opts, key, float(value))
        else:
            raise TypeError(f"unknown loss option {key!r}")
    return opts
