"""The suite without PyTorch: the torch modules are visible skips with their reason, never
collection errors (PYTHON.md promises it; a newcomer's first ``pytest`` run has no torch).

Torch is hidden from a child pytest (``sys.modules["torch"] = None`` makes ``import torch``
raise ImportError), so this holds on a machine that has torch too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = """
import sys
sys.modules["torch"] = None  # import torch -> ImportError, as on a machine without it
import pytest
sys.exit(pytest.main(sys.argv[1:]))
"""


def test_torch_modules_skip_visibly_without_torch():
    env = {k: v for k, v in os.environ.items() if k not in ("CARE_REQUIRE_TORCH", "CARE_REQUIRE_GPU")}
    files = [str(HERE / "test_torch_ops.py"), str(HERE / "test_distributed.py")]
    out = subprocess.run(
        [sys.executable, "-c", CHILD, *files, "-rs", "-q", "-p", "no:cacheprovider"],
        cwd=HERE, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    text = out.stdout + out.stderr
    # 5: pytest's "no tests collected" (both modules skipped whole); a collection error is 2.
    assert out.returncode in (0, 5), text
    assert "error" not in text.lower(), text
    assert "2 skipped" in text and "skipped torch test: torch is not installed" in text, text
