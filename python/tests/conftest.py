"""Shared fixtures of the care_rl test suite.

* The package under test is the installed one (``pip install ./python``): these tests never
  put the source tree on ``sys.path``.
* Without PyTorch the torch tests skip, visibly, unless ``CARE_REQUIRE_TORCH=1`` (set by CI),
  which turns the skip into a failure.
* Without a GPU the CUDA tests skip with "skipped GPU test", unless ``CARE_REQUIRE_GPU=1``,
  which turns the skip into a failure.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "cli" / "data"


def _require(var: str) -> bool:
    return os.environ.get(var, "") not in ("", "0")


def need_torch():
    """Imports torch, or skips (fails under CARE_REQUIRE_TORCH=1).

    Called at a test module's top level (``torch = need_torch()``) it skips the whole module,
    reported as one visible skip with the reason; inside a test it skips that test."""
    try:
        import torch  # noqa: F401
    except ImportError as e:
        if _require("CARE_REQUIRE_TORCH"):
            pytest.fail(f"CARE_REQUIRE_TORCH=1 but torch is not importable: {e}")
        # allow_module_level: the torch modules call this at import time, where a plain skip
        # is a collection error instead of a skip.
        pytest.skip("skipped torch test: torch is not installed", allow_module_level=True)
    return torch


def need_gpu():
    """Skips (fails under CARE_REQUIRE_GPU=1) unless torch sees a GPU and care loads the
    CUDA driver."""
    torch = need_torch()
    import care_rl.torch as ct

    if not ct.gpu_available():
        if _require("CARE_REQUIRE_GPU"):
            pytest.fail("CARE_REQUIRE_GPU=1 but no CUDA device is available")
        pytest.skip("skipped GPU test: no CUDA device", allow_module_level=True)
    return torch


@pytest.fixture(scope="session")
def rubric_text() -> str:
    return (DATA / "rubric_sft_1.json").read_text()


@pytest.fixture(scope="session")
def rubric_text_2() -> str:
    return (DATA / "rubric_sft_2.json").read_text()


@pytest.fixture(scope="session")
def demo() -> dict:
    return json.loads((DATA / "demo_group.json").read_text())
