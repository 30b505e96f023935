"""care_rl's reward functions against a real ``care serve --scripted`` on 127.0.0.1, called
the way TRL and verl call their reward functions.

``python/care_rl/rewards.py`` is stdlib only: the tests load it by path, as verl's
``custom_reward_function.path`` does (so they also run with a bare ``python3 -m pytest`` or
``python3 -m unittest`` and no installed package), and check that the installed ``care_rl``
re-exports the same functions when it is importable. They need the ``care`` binary
(``cargo build -p care-cli``; ``CARE_BIN`` names another one). The scripted backend replays
the bundled demo: responses 1-6 of ``cli/data/reward_demo.jsonl`` have recorded judgments
(response 1 is the paper's worked example, reward 0.925), response 7 has none.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import threading
import unittest
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REWARDS = ROOT / "python" / "care_rl" / "rewards.py"


def _load_by_path():
    """The module as verl loads a custom reward function: from its file, no package."""
    spec = importlib.util.spec_from_file_location("care_rl_rewards_by_path", REWARDS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_rw = _load_by_path()
CareRewardClient = _rw.CareRewardClient
CareRewardError = _rw.CareRewardError
CareRewardWarning = _rw.CareRewardWarning
TRLReward = _rw.TRLReward
compute_score = _rw.compute_score
compute_score_batch = _rw.compute_score_batch

DEMO = json.loads((ROOT / "cli" / "data" / "reward_demo.jsonl").read_text().strip())
CONTEXT = DEMO["context"]
RESPONSES = DEMO["responses"]


def care_bin() -> str:
    path = os.environ.get("CARE_BIN") or str(ROOT / os.environ.get("CARGO_TARGET_DIR", "target") / "debug" / "care")
    if not Path(path).exists():
        raise RuntimeError(f"no care binary at {path}: run `cargo build -p care-cli` or set CARE_BIN")
    return path


class Server:
    """``care serve --scripted`` on a free loopback port."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [care_bin(), "serve", "--scripted", "--no-cache", "--listen", "127.0.0.1:0"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.url = None
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            if "listening on " in line:
                self.url = line.split("listening on ")[1].split()[0]
                break
        if self.url is None:
            self.proc.kill()
            raise RuntimeError("care serve did not start")
        # Keep reading stderr so the server never blocks on a full pipe.
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()

    def stop(self) -> int:
        self.proc.terminate()  # SIGTERM: graceful shutdown
        return self.proc.wait(timeout=10)


class RewardFunctionsTest(unittest.TestCase):
    server: Server

    @classmethod
    def setUpClass(cls) -> None:
        cls.server = Server()

    @classmethod
    def tearDownClass(cls) -> None:
        assert cls.server.stop() == 0

    def test_trl_conversational_group(self) -> None:
        # TRL's call: keyword arguments, one prompt per completion (repeated num_generations
        # times), completions as [{"role": "assistant", "content": ...}], extra columns.
        f = TRLReward(url=self.server.url)
        self.assertEqual(f.__name__, "care_reward")
        prompts = [CONTEXT] * len(RESPONSES)
        completions = [[{"role": "assistant", "content": r}] for r in RESPONSES]
        rewards = f(
            prompts=prompts,
            completions=completions,
            completion_ids=[[1, 2]] * len(RESPONSES),
            trainer_state=None,
            some_column=["x"] * len(RESPONSES),
        )
        self.assertEqual(len(rewards), len(RESPONSES))
        self.assertAlmostEqual(rewards[0], 0.925, places=12)
        # Response 7 has no judgment: group_mean gives it the mean of the six valid rewards.
        self.assertAlmostEqual(rewards[6], sum(rewards[:6]) / 6, places=12)
        strict = TRLReward(url=self.server.url, on_failure="null")(prompts=prompts, completions=completions)
        self.assertIsNone(strict[6])
        self.assertEqual(strict[:6], rewards[:6])
        with self.assertRaises(CareRewardError) as e:
            TRLReward(url=self.server.url, on_failure="error")(prompts=prompts, completions=completions)
        self.assertIn("judge_invalid", str(e.exception))

    def test_trl_warns_once_per_call_when_rewards_were_not_judged(self) -> None:
        # The scripted server judges only the bundled demo: other text gets no reward, and
        # group_mean of a group with no valid reward is 0 everywhere. Such a batch of zeros
        # must not pass silently: one warning per call, with the statuses and the reason.
        f = TRLReward(url=self.server.url)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rewards = f(prompts=["How do I tell my parents?"] * 2, completions=["a", "b"])
        self.assertEqual(rewards, [0.0, 0.0])
        ours = [w for w in caught if issubclass(w.category, CareRewardWarning)]
        self.assertEqual(len(ours), 1, [str(w.message) for w in caught])
        msg = str(ours[0].message)
        for want in ("2 of 2 responses have no judged reward", "judge_invalid 2", "group_mean", "--scripted"):
            self.assertIn(want, msg)
        self.assertEqual(ours[0].filename, __file__, "the warning points at the caller")
        # Every response judged: no warning.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            f(prompts=[CONTEXT] * 2, completions=RESPONSES[:2])
        self.assertEqual([w for w in caught if issubclass(w.category, CareRewardWarning)], [])

    def test_trl_string_prompts_and_a_context_column(self) -> None:
        f = TRLReward(url=self.server.url, on_failure="null", context_column="dialogue")
        rewards = f(
            prompts=["<|im_start|>user ... <|im_end|>"] * 2,
            completions=[RESPONSES[0], RESPONSES[5]],
            dialogue=[CONTEXT, CONTEXT],
        )
        self.assertAlmostEqual(rewards[0], 0.925, places=12)
        self.assertIsNotNone(rewards[1])
        with self.assertRaises(ValueError):
            f(prompts=["p"], completions=["c"])  # the column is missing
        with self.assertRaises(ValueError):
            TRLReward(on_failure="zero")

    def test_verl_batch_and_per_sample(self) -> None:
        n = len(RESPONSES)
        out = compute_score_batch(
            data_sources=["care"] * n,
            solution_strs=RESPONSES,
            ground_truths=[None] * n,
            extra_infos=[{"context": CONTEXT, "index": i} for i in range(n)],
            url=self.server.url,
        )
        self.assertEqual(len(out), n)
        # verl aligns reward_extra_info by key: every sample has the same keys.
        self.assertTrue(all(set(d) == {"score", "care_valid", "care_judge_attempts"} for d in out))
        self.assertAlmostEqual(out[0]["score"], 0.925, places=12)
        self.assertEqual([d["care_valid"] for d in out], [1.0] * 6 + [0.0])
        self.assertEqual(out[6]["care_judge_attempts"], 3.0)
        one = compute_score("care", RESPONSES[0], None, extra_info={"context": CONTEXT}, url=self.server.url)
        self.assertAlmostEqual(one["score"], 0.925, places=12)
        with self.assertRaises(CareRewardError):
            compute_score("care", RESPONSES[6], None, extra_info={"context": CONTEXT}, url=self.server.url)
        with self.assertRaises(ValueError) as e:
            compute_score("care", "hi", None, extra_info={}, url=self.server.url)
        self.assertIn("extra_info['context']", str(e.exception))

    def test_client_results_carry_statuses(self) -> None:
        results = CareRewardClient(self.server.url).reward_turns(
            [{"context": CONTEXT, "responses": RESPONSES[:2]}, {"context": CONTEXT, "responses": ["hm"]}]
        )
        self.assertEqual(results[0]["rubric_status"], "ok")
        self.assertEqual([r["status"] for r in results[0]["responses"]], ["ok", "ok"])
        self.assertEqual(results[1]["rewards"], [None])
        self.assertEqual(results[1]["responses"][0]["status"], "judge_invalid")

    def test_stdlib_only_and_reexported_by_the_package(self) -> None:
        imported = {
            line.split()[1].split(".")[0]
            for line in REWARDS.read_text().splitlines()
            if line.startswith(("import ", "from ")) and not line.startswith("from __future__")
        }
        self.assertLessEqual(
            imported, {"asyncio", "json", "os", "ssl", "urllib", "typing", "warnings", "collections"}, "stdlib only"
        )
        try:
            import care_rl
        except ImportError:  # the source tree without the built extension: nothing to compare
            return
        self.assertEqual(care_rl.TRLReward.__module__, "care_rl.rewards")
        for name in (
            "CareRewardClient",
            "CareRewardError",
            "CareRewardWarning",
            "TRLReward",
            "compute_score",
            "compute_score_async",
            "compute_score_batch",
        ):
            self.assertIn(name, care_rl.__all__)

    def test_unreachable_server_is_a_clear_error(self) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with self.assertRaises(CareRewardError) as e:
            CareRewardClient(f"http://127.0.0.1:{port}", timeout=2).reward_turns([{"context": CONTEXT, "responses": ["x"]}])
        self.assertIn("cannot reach care serve", str(e.exception))


if __name__ == "__main__":
    unittest.main()
