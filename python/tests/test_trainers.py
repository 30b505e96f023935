"""The trainers' own calling conventions against a real ``care serve`` on 127.0.0.1 whose LLMs
are the project's stub (``care_loop::stub``, the test double for an LLM, run as the
``stub_llm`` example):

* TRL: its own ``GRPOTrainer`` for a few steps on a tiny GPT-2 built from a config, with a
  tokenizer trained here (no model hub), rewarded by ``TRLReward``; the rewards TRL logged are
  ``care serve``'s answers and the stub saw one generator call per dialogue.
* OpenRLHF (``SingleTurnAgentExecutor``, current release): one sample per ``/get_reward``
  request, the group's samples concurrently, the chat-templated prompt, a query decoded with
  the template's special tokens, the gold in the label, empty lists to the other
  ``--remote_rm_url`` endpoints.
* verl: the classic ``naive`` (keyword arguments per sample) and ``batch`` managers, and the
  async reward loop, which awaits a coroutine ``compute_score`` once per sample.

The conventions are as each trainer's source has them (``/work/shared/notes/trainer-conventions.md``
lists the facts); the harnesses below are written for these tests, not copied. They need the
``care`` binary and the ``stub_llm`` example (``cargo build -p care-cli``, ``cargo build -p
care-loop --example stub_llm``; ``CARE_BIN`` and ``CARE_STUB_BIN`` name others).
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import inspect
import json
import math
import os
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import need_torch

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("care_rl_rewards_trainers", ROOT / "python" / "care_rl" / "rewards.py")
assert _spec is not None and _spec.loader is not None
rw = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rw)

TARGET = ROOT / os.environ.get("CARGO_TARGET_DIR", "target") / "debug"


def _binary(env: str, path: Path, build: str) -> str:
    p = os.environ.get(env) or str(path)
    if not Path(p).exists():
        raise RuntimeError(f"no binary at {p}: run `{build}` or set {env}")
    return p


def _listening(proc: subprocess.Popen, what: str) -> str:
    """Reads stderr up to the "listening on URL" line; keeps draining it afterwards."""
    assert proc.stderr is not None
    for line in proc.stderr:
        if "listening on " in line:
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return line.split("listening on ")[1].split()[0]
    proc.kill()
    raise RuntimeError(f"{what} did not start")


class Stack:
    """The stub LLM and ``care serve`` on it (with a cache, so each dialogue's rubric is asked
    for once whatever the order of requests)."""

    def __init__(self, profile: str = "care", judge_ms: int = 0) -> None:
        self.dir = tempfile.TemporaryDirectory()
        stub = _binary("CARE_STUB_BIN", TARGET / "examples" / "stub_llm", "cargo build -p care-loop --example stub_llm")
        self.stub = subprocess.Popen(
            [stub, "--profile", profile, "--judge-ms", str(judge_ms)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stub_url = _listening(self.stub, "stub_llm")
        fast = {"max_attempts": 2, "backoff_initial_secs": 0.001, "backoff_max_secs": 0.002}
        config = {
            "generator": {"base_url": self.stub_url, "model": "stub-generator", **fast},
            "judge": {"base_url": self.stub_url, "model": "stub-judge", **fast},
            "profile": profile,
        }
        cfg = Path(self.dir.name) / "loop.json"
        cfg.write_text(json.dumps(config))
        care = _binary("CARE_BIN", TARGET / "care", "cargo build -p care-cli")
        self.serve = subprocess.Popen(
            [care, "serve", "--config", str(cfg), "--cache", str(Path(self.dir.name) / "c.sqlite"),
             "--listen", "127.0.0.1:0"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.url = _listening(self.serve, "care serve")

    def calls(self) -> list[dict]:
        base = self.stub_url.rsplit("/v1", 1)[0]
        with urllib.request.urlopen(base + "/stub/calls", timeout=10) as r:
            return json.loads(r.read())

    def generator_calls_per_dialogue(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for c in self.calls():
            if c["role"] == "generator":
                transcript = c["messages"][1]["content"]
                counts[transcript] = counts.get(transcript, 0) + 1
        return counts

    def post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(
            self.url + path, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        self.serve.terminate()
        assert self.serve.wait(timeout=10) == 0
        self.stub.kill()
        self.stub.wait(timeout=10)
        self.dir.cleanup()


@pytest.fixture(scope="module")
def care_stack():
    s = Stack("care", judge_ms=0)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def kardia_stack():
    s = Stack("kardia", judge_ms=0)
    yield s
    s.stop()


DIALOGUES = [
    [{"role": "user", "content": "I feel lost since my best friend moved away."}],
    [
        {"role": "system", "content": "You are a supportive listener."},
        {"role": "user", "content": "Work has been so stressful lately."},
        {"role": "assistant", "content": "That sounds exhausting. What weighs on you most?"},
        {"role": "user", "content": "My manager criticises everything I do."},
    ],
]


def chatml(messages: list[dict]) -> str:
    """What a ChatML (Qwen) chat template writes, with the generation prompt."""
    body = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return body + "<|im_start|>assistant\n"


def transcript(messages: list[dict]) -> str:
    """The dialogue as the generator reads it (care-loop's Dialogue::transcript)."""
    return "".join(
        f"{'seeker' if m['role'] == 'user' else 'supporter'}: {m['content'].strip()}\n"
        for m in messages
        if m["role"] != "system"
    )


def kardia_output(emotion: str, score: int) -> str:
    return (
        "<|understanding_begin|>They feel alone.<|understanding_end|>"
        "<|reasoning_begin|>Acknowledge first.<|reasoning_end|>"
        f"<|emotion_begin|>{emotion}<|emotion_end|>"
        f"<|response_begin|>score:{score}<|response_end|>"
    )


# ---- TRL ---------------------------------------------------------------------------------


def _tiny_policy():
    """A one-layer GPT-2 from a config and a byte-level BPE tokenizer trained here (no hub),
    knowing ChatML's special tokens."""
    need_torch()
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    corpus = [m["content"] for d in DIALOGUES for m in d] * 10
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=320,
            special_tokens=["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token="<unk>"
    )
    config = GPT2Config(
        vocab_size=len(hf), n_positions=256, n_embd=32, n_layer=1, n_head=2,
        bos_token_id=hf.eos_token_id, eos_token_id=hf.eos_token_id, pad_token_id=hf.pad_token_id,
    )
    torch.manual_seed(0)
    return GPT2LMHeadModel(config), hf


class RecordingReward(rw.TRLReward):
    """``TRLReward`` that keeps each call's prompts, completions and answers (for the test)."""

    def __init__(self, *a, **k) -> None:
        super().__init__(*a, **k)
        self.seen: list[tuple[list, list, list]] = []

    def __call__(self, prompts, completions, **kwargs):
        rewards = super().__call__(prompts=prompts, completions=completions, **kwargs)
        self.seen.append((list(prompts), list(completions), list(rewards)))
        return rewards


def test_trl_grpo_trainer_logs_care_serves_rewards(care_stack, tmp_path):
    model, tokenizer = _tiny_policy()
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    # String prompts as a dataset holds them after applying the chat template.
    prompts = [chatml(d) for d in DIALOGUES]
    reward = RecordingReward(url=care_stack.url)
    assert reward.__name__ == "care_reward"
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=2,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        seed=0,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=args,
        train_dataset=Dataset.from_dict({"prompt": prompts * 2}),
        processing_class=tokenizer,
    )
    trainer.train()

    logged = [h["rewards/care_reward/mean"] for h in trainer.state.log_history if "rewards/care_reward/mean" in h]
    assert len(logged) == 2 and len(reward.seen) == 2
    client = rw.CareRewardClient(care_stack.url)
    for mean, (ps, cs, rewards) in zip(logged, reward.seen):
        assert len(rewards) == 4 and all(isinstance(r, float) for r in rewards)
        assert len(set(ps)) == 1, "one prompt's group per step"
        # TRL logged the mean of what care serve answered (TRL keeps rewards in float32).
        assert math.isclose(mean, sum(rewards) / len(rewards), rel_tol=0, abs_tol=1e-6)
        # And care serve answers the same for the same completions, asked directly.
        turn = {"prompt": ps[0], "responses": cs}
        assert client.reward_turns([turn], on_failure="group_mean")[0]["rewards"] == rewards
    # One generator call per dialogue, each seeing the dialogue, not the template markup.
    asked = {p for ps, _, _ in reward.seen for p in ps}
    counts = care_stack.generator_calls_per_dialogue()
    want = {transcript(d): 1 for d in DIALOGUES if chatml(d) in asked}
    assert {t: counts.get(t) for t in want} == want
    assert not any("<|im_start|>" in t for t in counts)


# ---- OpenRLHF ----------------------------------------------------------------------------


def _openrlhf_sample(url: str, query: str, prompt: str, label, out: list, i: int) -> None:
    body = json.dumps({"query": [query], "prompts": [prompt], "labels": [label]}).encode()
    req = urllib.request.Request(url + "/get_reward", data=body, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        out[i] = json.loads(r.read())


def openrlhf(url: str, prompt: str, completions: list[str], label, end_token: str) -> list[dict]:
    """The requests of one prompt's group as OpenRLHF's SingleTurnAgentExecutor sends them with
    two reward endpoints: per sample, concurrently, the query decoded with the special tokens
    (so it ends with the end token), and an empty payload to the second endpoint."""
    out: list = [None] * len(completions)
    threads = [
        threading.Thread(target=_openrlhf_sample, args=(url, prompt + c + end_token, prompt, label, out, i))
        for i, c in enumerate(completions)
    ]
    for t in threads:
        t.start()
    req = urllib.request.Request(
        url + "/get_reward",
        data=json.dumps({"query": [], "prompts": [], "labels": []}).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        assert json.loads(r.read())["rewards"] == []
    for t in threads:
        t.join()
    return out


def test_openrlhf_requests_get_the_clean_dialogues_rewards(care_stack):
    completions = [f"score:{n}" for n in (5, 3, 1, 4)]
    before = care_stack.generator_calls_per_dialogue()
    for d in DIALOGUES:
        prompt = chatml(d)
        # No --label_key: OpenRLHF sends "" as the label.
        answers = openrlhf(care_stack.url, prompt, completions, "", "<|im_end|>")
        got = [a["rewards"][0] for a in answers]
        want = rw.CareRewardClient(care_stack.url).reward_turns([{"context": d, "responses": completions}])[0]
        assert got == want["rewards"]
        assert [a["extra_logs"]["care_stripped"] for a in answers] == [[1.0]] * len(completions)
        assert [a["extra_logs"]["care_template_parsed"] for a in answers] == [[1.0]] * len(completions)
    after = care_stack.generator_calls_per_dialogue()
    for d in DIALOGUES:
        assert after.get(transcript(d)) == 1, (before, after)


def test_openrlhf_kardia_gold_in_the_label(kardia_stack):
    d = DIALOGUES[1]
    group = [kardia_output("Sad", 5), kardia_output("angry", 4), "I am sure it will pass!"]
    label = json.dumps({"gold": {"emotion": "sadness"}})
    answers = openrlhf(kardia_stack.url, chatml(d), group, label, "<|im_end|>")
    got = [a["rewards"][0] for a in answers]
    want = rw.CareRewardClient(kardia_stack.url).reward_turns(
        [{"context": d, "responses": group, "gold": {"emotion": "sadness"}}]
    )[0]["rewards"]
    assert got == want
    assert all(math.isclose(a, b, abs_tol=1e-12) for a, b in zip(got, [1.0, 0.8 * 0.8, 0.0])), got
    # Without the gold in the label: refused before any judge call (no reward, care_valid 0).
    judge_calls = len(kardia_stack.calls())
    answers = openrlhf(kardia_stack.url, chatml(d), group[:1], "", "<|im_end|>")
    assert answers[0]["extra_logs"]["care_valid"] == [0.0]
    assert len(kardia_stack.calls()) == judge_calls


# ---- verl --------------------------------------------------------------------------------


def _verl_custom_fn(raw_fn, reward_kwargs: dict):
    """How verl wraps ``custom_reward_function`` (name + reward_kwargs): a partial that merges
    the configured kwargs into each call's, async when the function is a coroutine function."""

    def merge(raw, extra, *args, **kwargs):
        return raw(*args, **{**kwargs, **extra})

    async def merge_async(raw, extra, *args, **kwargs):
        return await raw(*args, **{**kwargs, **extra})

    wrapper = merge_async if inspect.iscoroutinefunction(raw_fn) else merge
    return functools.partial(wrapper, raw_fn, reward_kwargs)


def test_verl_naive_and_batch_managers(care_stack):
    d = DIALOGUES[1]
    sols = [f"score:{n}" for n in (5, 2, 4)]
    infos = [{"context": d, "index": i, "num_turns": 2, "rollout_reward_scores": {}} for i in range(len(sols))]
    batch = _verl_custom_fn(rw.compute_score_batch, {"url": care_stack.url})
    out = batch(data_sources=["care"] * 3, solution_strs=sols, ground_truths=[None] * 3, extra_infos=infos)
    assert [set(o) for o in out] == [{"score", "care_valid", "care_judge_attempts"}] * 3
    naive = _verl_custom_fn(rw.compute_score, {"url": care_stack.url})
    one = [naive(data_source="care", solution_str=s, ground_truth=None, extra_info=e) for s, e in zip(sols, infos)]
    assert [o["score"] for o in one] == [o["score"] for o in out]
    want = rw.CareRewardClient(care_stack.url).reward_turns([{"context": d, "responses": sols}])[0]["rewards"]
    assert [o["score"] for o in out] == want
    # A templated prompt in extra_info instead of the messages reads the same.
    by_prompt = naive(data_source="care", solution_str=sols[0], ground_truth=None, extra_info={"prompt": chatml(d)})
    assert by_prompt["score"] == want[0]


def test_verl_async_reward_loop_awaits_compute_score_without_blocking():
    stack = Stack("kardia", judge_ms=500)
    try:
        fn = _verl_custom_fn(rw.compute_score_async, {"url": stack.url})
        # verl's reward loop awaits it when inspect says it is a coroutine function.
        assert inspect.iscoroutinefunction(fn)
        d = DIALOGUES[0]
        sols = [kardia_output("sad", 5), kardia_output("happy", 2), kardia_output("Sadness.", 3)]

        async def run_single(i: int, s: str):
            # One sample per call, with the extra kwargs a configured reward router adds.
            extra_info = {"context": d, "num_turns": 2, "rollout_reward_scores": {}}
            return await fn(
                data_source="empathy",
                solution_str=s,
                ground_truth="sadness",
                extra_info=extra_info,
                reward_router_address="127.0.0.1:1",
                reward_model_tokenizer=None,
            )

        async def main():
            ticks = 0
            done = asyncio.Event()

            async def ticker():
                nonlocal ticks
                while not done.is_set():
                    await asyncio.sleep(0.02)
                    ticks += 1

            t = asyncio.create_task(ticker())
            started = time.monotonic()
            out = await asyncio.gather(*(run_single(i, s) for i, s in enumerate(sols)))
            elapsed = time.monotonic() - started
            done.set()
            await t
            return out, ticks, elapsed

        out, ticks, elapsed = asyncio.run(main())
        # The loop kept running while the requests were out: about one tick per 20 ms of the
        # judge's 500 ms. A blocking call would let the ticker run only between samples.
        assert ticks >= 10, (ticks, elapsed)
        scores = [o["score"] for o in out]
        assert all(math.isclose(a, b, abs_tol=1e-12) for a, b in zip(scores, [1.0, 0.8 * 0.4, 0.8 * 0.6 + 0.2])), scores
        assert all(o["care_valid"] == 1.0 for o in out)
        # A sample without a reward (here: no gold emotion) raises under the default
        # on_failure="error" (a group of one has no mean to impute).
        with pytest.raises(rw.CareRewardError, match="missing_gold"):
            asyncio.run(fn(data_source="x", solution_str=sols[0], ground_truth=None, extra_info={"context": d}))
    finally:
        stack.stop()


def test_async_client_reports_an_unreachable_server():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(rw.CareRewardError, match="cannot reach care serve"):
        asyncio.run(
            rw.compute_score_async("x", "y", None, extra_info={"context": DIALOGUES[0]}, url=f"http://127.0.0.1:{port}")
        )


def test_trl_call_with_templated_prompts_and_a_gold_column(kardia_stack):
    # TRL's call shape with a dataset column "gold" (an object, or the JSON string a text column
    # holds) and string prompts written by the chat template.
    f = rw.TRLReward(url=kardia_stack.url, gold_column="gold")
    prompt = chatml(DIALOGUES[1])
    rewards = f(
        prompts=[prompt, prompt],
        completions=[kardia_output("sad", 5), kardia_output("joy", 5)],
        completion_ids=[[1], [2]],
        gold=[{"emotion": "sadness"}, '{"emotion": "sadness"}'],
        trainer_state=None,
    )
    assert rewards[0] == 1.0 and math.isclose(rewards[1], 0.8, abs_tol=1e-12), rewards
    with pytest.raises(ValueError, match="no dataset column 'gold'"):
        f(prompts=[prompt], completions=["x"])


def test_the_documented_trainer_recipes_name_what_exists():
    """The "From your trainer" sections name functions, arguments and flags that exist: every
    verl ``custom_reward_function.name`` is a function of rewards.py (``compute_score_async`` a
    coroutine function, the reward loop's requirement), every ``TRLReward(...)`` keyword is a
    parameter, every ``--data.*``/``--reward.*`` flag is OpenRLHF's current spelling."""
    import re

    docs = (ROOT / "docs" / "REWARD_LOOP.md").read_text() + (ROOT / "docs" / "PYTHON.md").read_text()
    names = set(re.findall(r"custom_reward_function\.name=(\w+)", docs))
    assert names == {"compute_score", "compute_score_async", "compute_score_batch"}, names
    for n in names:
        assert callable(getattr(rw, n))
    assert inspect.iscoroutinefunction(rw.compute_score_async)
    assert not inspect.iscoroutinefunction(rw.compute_score)
    params = set(inspect.signature(rw.TRLReward).parameters)
    used = set(re.findall(r"TRLReward\((\w+)=", docs)) | set(re.findall(r", (\w+_column)=", docs))
    assert used and used <= params, (used, params)
    # OpenRLHF's flags as its argparse spells them (openrlhf/cli/train_ppo_ray.py, 2026).
    flags = set(re.findall(r"--((?:data|reward)\.\w+)", docs))
    assert flags <= {
        "data.prompt_dataset", "data.input_key", "data.label_key", "data.apply_chat_template", "reward.remote_url",
    }, flags
    assert {"data.label_key", "reward.remote_url"} <= flags
