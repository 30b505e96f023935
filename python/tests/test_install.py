"""The installed package works from any directory with no environment variable: a fresh
interpreter in an empty temporary directory, with PYTHONPATH and every CARE_* variable
removed, imports care_rl from site-packages (not from the source tree), scores the paper
fixture and computes advantages; importing care_rl does not import torch."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from conftest import DATA, REPO

SCRIPT = textwrap.dedent(
    """
    import sys, care_rl
    assert "torch" not in sys.modules, "import care_rl must not import torch"
    text = open(sys.argv[1]).read()
    r = care_rl.Rubric(text)
    rewards = care_rl.policy_reward_group(r, [[5] * r.total_criteria, [3] * r.total_criteria]).rewards
    adv = care_rl.group_advantages(rewards.astype("float32"), 2, preset="verl")
    print(care_rl.__file__)
    print(rewards.tolist(), adv.tolist())
    """
)


def test_import_from_anywhere(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("CARE_")}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(DATA / "rubric_sft_1.json")],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    location, values = out[0], out[1]
    assert "site-packages" in location and not location.startswith(str(REPO)), location
    rewards, adv = (eval(x) for x in values.replace("] [", "]|[").split("|"))
    assert rewards == [1.0, 0.6]  # all fives; all threes (Eq. 5 on the paper rubric)
    want = 0.2 / (0.2 * 2**0.5 + 1e-6)  # verl: (r - mean) / (unbiased std + 1e-6)
    assert abs(adv[0] - want) < 1e-6 and abs(adv[1] + want) < 1e-6
