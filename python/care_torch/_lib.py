"""ctypes declarations of the parts of ``libcare`` (``include/care.h``) that care_torch uses.

This module needs nothing but the standard library: callers pass raw addresses (``int``) and
lengths, so it works with torch tensors (``t.data_ptr()``), numpy arrays
(``a.ctypes.data``) or any other buffer. The library is found, in order, at ``$CARE_LIB``,
at ``target/release/libcare.so`` and ``target/debug/libcare.so`` of the repository this package
sits in, or by ``ctypes.util.find_library("care")``.

Every C struct and every function signature is declared here once; the test suite checks each
struct against ``include/care.h`` (field names, types and order) and the library checks the
options structs' sizes when it fills them (``struct_size``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path

__all__ = [
    "ABI_VERSION",
    "DTYPES",
    "CareError",
    "lib",
    "check",
    "advantage_options",
    "loss_options",
]

#: The C ABI version this module was written against (``CARE_ABI_VERSION``).
ABI_VERSION = 2
#: ``CARE_GPU_WORKSPACE_BYTES``.
GPU_WORKSPACE_BYTES = 64
#: ``CARE_GPU_LOSS_STATS_BYTES``.
GPU_LOSS_STATS_BYTES = 56
#: The one dtype table: ``care_dtype`` values by element type, named as ``torch`` names them.
DTYPES = {"float32": 0, "bfloat16": 1, "float16": 2}
#: ``care_advantages_kind`` values.
ADV_PER_SEQUENCE, ADV_PER_TOKEN = 0, 1

# Names of the enum values accepted by the keyword options (the C enums' order; the tests
# check each against the CARE_* constants of care.h).
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

_u32, _f32, _f64 = ctypes.c_uint32, ctypes.c_float, ctypes.c_double
_sz, _vp = ctypes.c_size_t, ctypes.c_void_p
_P = ctypes.POINTER


class Versioned(ctypes.Structure):
    """A C struct whose first field is ``struct_size``, which the constructor sets."""

    def __init__(self, **fields):
        super().__init__(**fields)
        self.struct_size = ctypes.sizeof(self)


class AdvantageOptions(Versioned):
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

    _fields_ = [("count", _u32), ("mean", _f32), ("std", _f32), ("zero_variance", _u32)]


class Rewards(Versioned):
    """``care_rewards``."""

    _fields_ = [
        ("struct_size", _u32),
        ("rewards", _vp),
        ("rewards_len", _sz),
        ("valid", _vp),
        ("valid_len", _sz),
    ]


class GroupLayout(Versioned):
    """``care_group_layout``."""

    _fields_ = [
        ("struct_size", _u32),
        ("group_size", _u32),
        ("offsets", _vp),
        ("offsets_len", _sz),
    ]


class AdvantageOutputs(Versioned):
    """``care_advantage_outputs``."""

    _fields_ = [
        ("struct_size", _u32),
        ("advantages", _vp),
        ("advantages_len", _sz),
        ("stats", _vp),
        ("stats_len", _sz),
    ]


class LossInputs(Versioned):
    """``care_loss_inputs``."""

    _fields_ = [
        ("struct_size", _u32),
        ("dtype", _u32),
        ("logp", _vp),
        ("logp_len", _sz),
        ("logp_old", _vp),
        ("logp_old_len", _sz),
        ("logp_ref", _vp),
        ("logp_ref_len", _sz),
        ("seq_offsets", _vp),
        ("seq_offsets_len", _sz),
        ("mask", _vp),
        ("mask_len", _sz),
        ("advantages", _vp),
        ("advantages_len", _sz),
        ("advantages_kind", _u32),
        ("max_seq_len", _u32),
    ]


class LossOptions(Versioned):
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
    """``care_loss_stats``: sums that add across micro-batches and ranks (the one Python copy of
    the stats layout)."""

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


class Logits(Versioned):
    """``care_logits``."""

    _fields_ = [
        ("struct_size", _u32),
        ("dtype", _u32),
        ("logits", _vp),
        ("logits_len", _sz),
        ("rows", _sz),
        ("vocab", _sz),
        ("row_stride", _sz),
        ("targets", _vp),
        ("targets_len", _sz),
        ("targets_i64", _u32),
        ("mask", _vp),
        ("mask_len", _sz),
        ("temperature", _f64),
    ]


class LogSoftmaxOutputs(Versioned):
    """``care_log_softmax_outputs``."""

    _fields_ = [
        ("struct_size", _u32),
        ("logp", _vp),
        ("logp_len", _sz),
        ("entropy", _vp),
        ("entropy_len", _sz),
        ("lse", _vp),
        ("lse_len", _sz),
    ]


class LogSoftmaxGrads(Versioned):
    """``care_log_softmax_grads``."""

    _fields_ = [
        ("struct_size", _u32),
        ("dlogp", _vp),
        ("dlogp_len", _sz),
        ("dentropy", _vp),
        ("dentropy_len", _sz),
        ("lse", _vp),
        ("lse_len", _sz),
        ("entropy", _vp),
        ("entropy_len", _sz),
    ]


class LogitsLossOutputs(Versioned):
    """``care_logits_loss_outputs``."""

    _fields_ = [
        ("struct_size", _u32),
        ("logp", _vp),
        ("logp_len", _sz),
        ("lse", _vp),
        ("lse_len", _sz),
        ("dlogp", _vp),
        ("dlogp_len", _sz),
    ]


class GpuLaunch(Versioned):
    """``care_gpu_launch``."""

    _fields_ = [
        ("struct_size", _u32),
        ("stream", _vp),
        ("workspace", _vp),
        ("workspace_len", _sz),
    ]


#: Every struct declared here, by its C name (the tests compare each with care.h).
STRUCTS = {
    "care_advantage_options": AdvantageOptions,
    "care_group_stats": GroupStats,
    "care_rewards": Rewards,
    "care_group_layout": GroupLayout,
    "care_advantage_outputs": AdvantageOutputs,
    "care_loss_inputs": LossInputs,
    "care_loss_options": LossOptions,
    "care_loss_stats": LossStats,
    "care_logits": Logits,
    "care_log_softmax_outputs": LogSoftmaxOutputs,
    "care_log_softmax_grads": LogSoftmaxGrads,
    "care_logits_loss_outputs": LogitsLossOutputs,
    "care_gpu_launch": GpuLaunch,
}


class CareError(RuntimeError):
    """A ``care_result`` other than ``CARE_OK``; ``code`` holds the number."""

    def __init__(self, code: int, what: str):
        msg = lib().care_result_message(code)
        text = msg.decode() if msg else "unknown"
        super().__init__(f"{what}: {text} (care_result {code})")
        self.code = code


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
        [_P(Rewards), _P(GroupLayout), _P(AdvantageOptions), _P(AdvantageOutputs)],
    ),
    "care_loss_options_default": (_u32, [_P(LossOptions)]),
    "care_loss_options_preset_by_name": (_u32, [ctypes.c_char_p, _sz, _P(LossOptions)]),
    "care_policy_loss": (
        _u32,
        [_P(LossInputs), _P(LossOptions), _vp, _sz, _P(_f64), _P(LossStats)],
    ),
    "care_loss_stats_empty": (_u32, [_P(LossStats)]),
    "care_loss_stats_add": (_u32, [_P(LossStats), _P(LossStats)]),
    "care_selective_log_softmax": (_u32, [_P(Logits), _P(LogSoftmaxOutputs)]),
    "care_selective_log_softmax_backward": (_u32, [_P(Logits), _P(LogSoftmaxGrads), _vp, _sz]),
    "care_logits_policy_loss": (
        _u32,
        [
            _P(Logits),
            _P(LossInputs),
            _P(LossOptions),
            _P(LogitsLossOutputs),
            _P(_f64),
            _P(LossStats),
        ],
    ),
    "care_gpu_available": (_u32, []),
    "care_gpu_group_advantages": (
        _u32,
        [_P(Rewards), _P(GroupLayout), _P(AdvantageOptions), _P(AdvantageOutputs), _vp,
         _P(GpuLaunch)],
    ),
    "care_gpu_group_advantages_status": (_u32, [_P(GpuLaunch)]),
    "care_gpu_loss_stats_reset": (_u32, [_vp, _sz, _P(GpuLaunch)]),
    "care_gpu_loss_stats_read": (_u32, [_vp, _sz, _P(GpuLaunch), _P(LossStats)]),
    "care_gpu_policy_loss": (
        _u32,
        [_P(LossInputs), _P(LossOptions), _vp, _sz, _u32, _vp, _sz, _P(GpuLaunch)],
    ),
    "care_gpu_selective_log_softmax": (
        _u32,
        [_P(Logits), _P(LogSoftmaxOutputs), _P(GpuLaunch)],
    ),
    "care_gpu_selective_log_softmax_status": (_u32, [_P(GpuLaunch)]),
    "care_gpu_selective_log_softmax_backward": (
        _u32,
        [_P(Logits), _P(LogSoftmaxGrads), _vp, _sz, _sz, _P(GpuLaunch)],
    ),
    "care_gpu_logits_policy_loss": (
        _u32,
        [_P(Logits), _P(LossInputs), _P(LossOptions), _P(LogitsLossOutputs), _vp, _sz,
         _P(GpuLaunch)],
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
            "libcare not found (build it with `cargo build --release -p libcare` or set "
            "CARE_LIB); tried: " + ", ".join(tried)
        )
    handle.care_abi_version.restype = _u32
    abi = handle.care_abi_version()
    if abi != ABI_VERSION:
        raise OSError(f"libcare ABI {abi}, this binding was written for ABI {ABI_VERSION}")
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(handle, name)
        fn.restype = restype
        fn.argtypes = argtypes
    _LIB = handle
    return handle


def check(code: int, what: str) -> None:
    """Raises :class:`CareError` unless ``code`` is ``CARE_OK``."""
    if code != 0:
        raise CareError(code, what)


def _filled(cls, fill, what: str):
    """A ``cls`` written by the library's ``fill`` (which sets ``struct_size`` to the size the
    library has for it: a mismatch means this module and the library disagree on the layout)."""
    opts = cls()
    opts.struct_size = 0
    check(fill(ctypes.byref(opts)), what)
    if opts.struct_size != ctypes.sizeof(cls):
        raise OSError(
            f"{cls.__name__}: libcare's struct_size {opts.struct_size} != "
            f"{ctypes.sizeof(cls)} declared here"
        )
    return opts


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
    h = lib()
    if preset is None:
        opts = _filled(AdvantageOptions, h.care_advantage_options_default, "advantage options")
    else:
        name = preset.encode()
        opts = _filled(
            AdvantageOptions,
            lambda p: h.care_advantage_options_preset_by_name(name, len(name), p),
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
    h = lib()
    if preset is None:
        opts = _filled(LossOptions, h.care_loss_options_default, "loss options")
    else:
        name = preset.encode()
        opts = _filled(
            LossOptions,
            lambda p: h.care_loss_options_preset_by_name(name, len(name), p),
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
