"""CARE reward functions for TRL and verl, calling a running ``care serve``.

The server does the work (one rubric per dialogue turn shared by the group, judging with
bounded retries, the durable cache); these functions only group the trainer's samples by
dialogue, send one request, and put the rewards back in the trainer's order.

A response without a usable judgment has no reward (``null`` from the server). What a trainer
gets instead is an explicit policy, ``on_failure``:

* ``"group_mean"``: the mean of the valid rewards of its group, so its GRPO advantage is 0
  (a group with no valid reward gets 0 everywhere: constant, so no gradient). The default for
  TRL and verl: TRL sums its reward functions with ``nansum``, so ``None`` from the only
  reward function would become a 0, and verl takes no ``None`` at all.
* ``"null"``: ``None`` (TRL then excludes it when another reward function scores the sample).
* ``"error"``: raise :class:`CareRewardError` naming the failed responses.

The server URL is the ``url`` argument, else the ``CARE_REWARD_URL`` environment variable,
else ``http://127.0.0.1:8000``.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
import warnings
from collections import Counter
from typing import Any, Iterable, Sequence

DEFAULT_URL = "http://127.0.0.1:8000"
ON_FAILURE = ("null", "group_mean", "error")


class CareRewardError(RuntimeError):
    """The server could not be reached, refused the request, or (``on_failure="error"``)
    had no reward for a response."""


class CareRewardWarning(UserWarning):
    """Some rewards of a call were not judged: filled in under ``on_failure``, or ``None``."""


def _warn_unjudged(who: str, url: str, details: Sequence[dict], on_failure: str) -> None:
    """One warning per call when a response has no judged reward, with the statuses and what
    the trainer got instead: a batch of silent zeros (``group_mean`` of groups with no valid
    reward) must never look like a batch of real rewards."""
    missing = Counter(str(d.get("status")) for d in details if d.get("reward") is None)
    n = sum(missing.values())
    if n == 0:
        return
    statuses = ", ".join(f"{k} {v}" for k, v in sorted(missing.items()))
    got = {
        "group_mean": "the mean of its group's judged rewards, 0.0 for a group with none",
        "null": "None",
        "error": "an error",
    }.get(on_failure, on_failure)
    hint = ""
    if "judge_invalid" in missing and n == len(details):
        hint = (
            " No response was judged: a `care serve --scripted` server replays the bundled "
            "demo only and judges no other text; start it with an LLM judge "
            "(--judge-url, --judge-model) for real rewards."
        )
    warnings.warn(
        f"{who}: {n} of {len(details)} responses have no judged reward from care serve at "
        f"{url} ({statuses}); on_failure={on_failure!r} gave them {got}.{hint}",
        CareRewardWarning,
        stacklevel=3,
    )


def _url(url: str | None) -> str:
    return (url or os.environ.get("CARE_REWARD_URL") or DEFAULT_URL).rstrip("/")


def _check_policy(on_failure: str) -> str:
    if on_failure not in ON_FAILURE:
        raise ValueError(f"on_failure={on_failure!r}: use one of {', '.join(ON_FAILURE)}")
    return on_failure


class CareRewardClient:
    """The JSON API of ``care serve`` (``POST /v1/reward``) for whole groups."""

    def __init__(self, url: str | None = None, timeout: float = 3600.0) -> None:
        self.url = _url(url)
        self.timeout = timeout

    def reward_turns(self, turns: Sequence[dict], on_failure: str = "null") -> list[dict]:
        """One result per turn (``{"context": [...], "responses": [...]}``), in order.

        Each result has ``rewards`` (under ``on_failure``), ``responses`` (``reward``,
        ``status``, ``scores``, ...), ``rubric_status``, ``rubric`` and ``calls``.
        """
        body = json.dumps({"turns": list(turns), "on_failure": _check_policy(on_failure)}).encode()
        req = urllib.request.Request(
            self.url + "/v1/reward",
            data=body,
            headers={"content-type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                answer = json.loads(resp.read())
        except urllib.error.HTTPError as e:
            detail = e.read().decode("utf-8", "replace")
            raise CareRewardError(f"care serve at {self.url} answered HTTP {e.code}: {detail}") from e
        except (urllib.error.URLError, OSError) as e:
            raise CareRewardError(f"cannot reach care serve at {self.url}: {e}") from e
        results = answer.get("results")
        if not isinstance(results, list) or len(results) != len(turns):
            raise CareRewardError(f"care serve at {self.url} answered without one result per turn")
        return results


def _messages(prompt: Any) -> list[dict]:
    """A TRL/verl prompt as chat messages: a string is one user message; a conversation keeps
    its ``role``/``content`` pairs."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, (list, tuple)) and all(isinstance(m, dict) for m in prompt):
        return [{"role": str(m.get("role", "")), "content": str(m.get("content", ""))} for m in prompt]
    raise ValueError(f"a prompt must be a string or a list of chat messages, not {type(prompt).__name__}")


def _text(completion: Any) -> str:
    """A completion's text: a string, or the content of the last assistant message."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (list, tuple)) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    raise ValueError(f"a completion must be a string or a list of messages, not {type(completion).__name__}")


def _reward_groups(
    client: CareRewardClient, contexts: Iterable[list[dict]], responses: Sequence[str], on_failure: str
) -> tuple[list[float | None], list[dict]]:
    """Groups samples by context (one turn per distinct dialogue), rewards them, and returns
    the rewards and the per-response results in sample order."""
    turns: list[dict] = []
    index: dict[str, int] = {}
    place: list[tuple[int, int]] = []
    for context, response in zip(contexts, responses):
        key = json.dumps(context, sort_keys=True)
        if key not in index:
            index[key] = len(turns)
            turns.append({"context": context, "responses": []})
        t = index[key]
        place.append((t, len(turns[t]["responses"])))
        turns[t]["responses"].append(response)
    results = client.reward_turns(turns, on_failure=on_failure) if turns else []
    rewards = [results[t]["rewards"][j] for t, j in place]
    details = [results[t]["responses"][j] for t, j in place]
    return rewards, details


class TRLReward:
    """A TRL ``GRPOTrainer`` reward function: ``reward_funcs=[TRLReward()]``.

    TRL calls it as ``f(prompts=..., completions=..., completion_ids=..., **columns)`` and
    expects one ``float`` (or ``None``) per completion. Prompts may be strings or chat
    messages (conversational datasets); the ``num_generations`` completions of one prompt
    share one rubric. A dataset column named ``context_column`` (chat messages), when given,
    replaces the prompt as the dialogue the rubric is written for.
    """

    def __init__(
        self,
        url: str | None = None,
        on_failure: str = "group_mean",
        context_column: str | None = None,
        timeout: float = 3600.0,
    ) -> None:
        self.client = CareRewardClient(url, timeout)
        self.on_failure = _check_policy(on_failure)
        self.context_column = context_column
        # TRL logs each reward function under its __name__.
        self.__name__ = "care_reward"

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
        if self.context_column is not None:
            if self.context_column not in kwargs:
                raise ValueError(f"no dataset column {self.context_column!r} among {sorted(kwargs)}")
            contexts = [_messages(c) for c in kwargs[self.context_column]]
        else:
            contexts = [_messages(p) for p in prompts]
        rewards, details = _reward_groups(self.client, contexts, [_text(c) for c in completions], self.on_failure)
        _warn_unjudged("care_rl.TRLReward", self.client.url, details, self.on_failure)
        return rewards


def _verl_context(extra_info: Any) -> list[dict]:
    if isinstance(extra_info, dict) and "context" in extra_info:
        return _messages(extra_info["context"])
    raise ValueError(
        "care_rl needs the dialogue in extra_info['context'] (chat messages ending with the "
        "seeker's turn): add it in the dataset preprocessing"
    )


def _verl_result(reward: float | None, detail: dict) -> dict:
    # Same keys for every sample (verl aligns reward_extra_info by key), numbers only.
    return {
        "score": reward,
        "care_valid": 1.0 if detail.get("reward") is not None else 0.0,
        "care_judge_attempts": float(detail.get("judge_attempts", 0)),
    }


def compute_score(
    data_source: Any,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    url: str | None = None,
    on_failure: str = "error",
    **kwargs: Any,
) -> dict:
    """verl ``custom_reward_function`` for one sample (the default reward manager).

    The dialogue comes from ``extra_info["context"]``. One sample is a group of one, so
    ``group_mean`` has nothing to average: the default is ``"error"``. Prefer
    :func:`compute_score_batch`, which sends each prompt's group together.
    """
    policy = _check_policy(on_failure)
    rewards, details = _reward_groups(
        CareRewardClient(url), [_verl_context(extra_info)], [solution_str], policy
    )
    return _verl_result(rewards[0], details[0])


def compute_score_batch(
    data_sources: Sequence[Any],
    solution_strs: Sequence[str],
    ground_truths: Sequence[Any],
    extra_infos: Sequence[dict | None],
    url: str | None = None,
    on_failure: str = "group_mean",
    **kwargs: Any,
) -> list[dict]:
    """verl ``custom_reward_function`` for ``reward_model.reward_manager=batch``: the whole
    batch in one request, grouped by ``extra_info["context"]``."""
    if not (len(solution_strs) == len(extra_infos)):
        raise ValueError(f"{len(solution_strs)} solutions but {len(extra_infos)} extra_infos")
    policy = _check_policy(on_failure)
    contexts = [_verl_context(e) for e in extra_infos]
    rewards, details = _reward_groups(CareRewardClient(url), contexts, list(solution_strs), policy)
    return [_verl_result(r, d) for r, d in zip(rewards, details)]
