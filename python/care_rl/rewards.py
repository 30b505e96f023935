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

A prompt given as text goes to the server as it is (``prompt``): ``care serve`` reads a
chat-templated one back into its messages and strips the template's end tokens from the
responses (``docs/REWARD_LOOP.md``, "Chat templates"); chat messages go as ``context``. The gold
a profile needs (Kardia's ``{"emotion": ...}``) comes from a dataset column (TRL), or verl's
``ground_truth`` or ``extra_info["gold"]``.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import urllib.error
import urllib.parse
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
        ``status``, ``scores``, ``stripped``, ...), ``rubric_status``, ``rubric`` and ``calls``.
        """
        body = _request_body(turns, on_failure)
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
        return self._results(answer, len(turns))

    async def reward_turns_async(self, turns: Sequence[dict], on_failure: str = "null") -> list[dict]:
        """:meth:`reward_turns` as a coroutine: the request runs on the event loop (asyncio
        streams), so awaiting it never blocks the loop's other tasks."""
        body = _request_body(turns, on_failure)
        try:
            code, data = await asyncio.wait_for(_post_async(self.url + "/v1/reward", body), self.timeout)
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError) as e:
            raise CareRewardError(f"cannot reach care serve at {self.url}: {e!r}") from e
        if code != 200:
            detail = data.decode("utf-8", "replace")
            raise CareRewardError(f"care serve at {self.url} answered HTTP {code}: {detail}")
        return self._results(json.loads(data), len(turns))

    def _results(self, answer: Any, n: int) -> list[dict]:
        results = answer.get("results") if isinstance(answer, dict) else None
        if not isinstance(results, list) or len(results) != n:
            raise CareRewardError(f"care serve at {self.url} answered without one result per turn")
        return results


def _request_body(turns: Sequence[dict], on_failure: str) -> bytes:
    return json.dumps({"turns": list(turns), "on_failure": _check_policy(on_failure)}).encode()


async def _post_async(url: str, body: bytes) -> tuple[int, bytes]:
    """One HTTP/1.1 POST of JSON over asyncio streams: (status, body)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url}")
    secure = parts.scheme == "https"
    port = parts.port or (443 if secure else 80)
    reader, writer = await asyncio.open_connection(
        parts.hostname, port, ssl=ssl.create_default_context() if secure else None
    )
    try:
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        head = (
            f"POST {target} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        writer.write(head.encode("latin-1") + body)
        await writer.drain()
        status = (await reader.readline()).split()
        if len(status) < 2 or not status[1].isdigit():
            raise ValueError(f"not an HTTP answer: {b' '.join(status)!r}")
        headers: dict[str, str] = {}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    break
                data += await reader.readexactly(size)
                await reader.readline()
        elif "content-length" in headers:
            data = await reader.readexactly(int(headers["content-length"]))
        else:
            data = await reader.read()
        return int(status[1]), data
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except OSError:
            pass


def _messages(prompt: Any) -> list[dict]:
    """A TRL/verl prompt as chat messages: a string is one user message; a conversation keeps
    its ``role``/``content`` pairs."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, (list, tuple)) and all(isinstance(m, dict) for m in prompt):
        return [{"role": str(m.get("role", "")), "content": str(m.get("content", ""))} for m in prompt]
    raise ValueError(f"a prompt must be a string or a list of chat messages, not {type(prompt).__name__}")


def _dialogue(prompt: Any) -> dict:
    """A turn's dialogue member: text goes as ``prompt`` (the server reads a chat-templated
    prompt into its messages, a plain one as one user message); chat messages as ``context``."""
    if isinstance(prompt, str):
        return {"prompt": prompt}
    return {"context": _messages(prompt)}


def _context(value: Any) -> list[dict]:
    """Chat messages from a dataset value: a list of messages, or a JSON string of one."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise ValueError(f"a context must be chat messages or a JSON string of them: {e}") from e
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"a context must be chat messages, not {type(value).__name__}")
    return _messages(value)


def _gold(value: Any) -> dict | None:
    """A turn's gold: an object (``{"emotion": "sadness"}``), a JSON string of one, or a plain
    label string, read as the gold emotion; ``None`` or a blank string for none."""
    if value is None:
        return None
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return None
        if text.startswith("{"):
            try:
                parsed = json.loads(text)
            except ValueError as e:
                raise ValueError(f"a gold value that starts with {{ must be a JSON object: {e}") from e
            if isinstance(parsed, dict):
                return parsed
        return {"emotion": text}
    raise ValueError(f"a gold value must be an object, a JSON string of one, or a label, not {type(value).__name__}")


def _text(completion: Any) -> str:
    """A completion's text: a string, or the content of the last assistant message."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (list, tuple)) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    raise ValueError(f"a completion must be a string or a list of messages, not {type(completion).__name__}")


def _group(specs: Iterable[dict], responses: Sequence[str]) -> tuple[list[dict], list[tuple[int, int]]]:
    """One turn per distinct dialogue and gold (``specs[i]``: ``context`` or ``prompt``, and
    ``gold``), the responses in it, and where each sample went."""
    turns: list[dict] = []
    index: dict[str, int] = {}
    place: list[tuple[int, int]] = []
    for spec, response in zip(specs, responses):
        key = json.dumps(spec, sort_keys=True)
        if key not in index:
            index[key] = len(turns)
            turns.append({**spec, "responses": []})
        t = index[key]
        place.append((t, len(turns[t]["responses"])))
        turns[t]["responses"].append(response)
    return turns, place


def _spread(results: list[dict], place: list[tuple[int, int]]) -> tuple[list[float | None], list[dict]]:
    rewards = [results[t]["rewards"][j] for t, j in place]
    details = [results[t]["responses"][j] for t, j in place]
    return rewards, details


def _reward_groups(
    client: CareRewardClient, specs: Iterable[dict], responses: Sequence[str], on_failure: str
) -> tuple[list[float | None], list[dict]]:
    """Groups samples by dialogue (one turn, one rubric, per distinct dialogue and gold),
    rewards them, and returns the rewards and the per-response results in sample order."""
    turns, place = _group(specs, responses)
    results = client.reward_turns(turns, on_failure=on_failure) if turns else []
    return _spread(results, place)


def _with_gold(spec: dict, gold: dict | None) -> dict:
    return {**spec, "gold": gold} if gold is not None else spec


class TRLReward:
    """A TRL ``GRPOTrainer`` reward function: ``reward_funcs=[TRLReward()]``.

    TRL calls it as ``f(prompts=..., completions=..., completion_ids=..., **columns)`` and
    expects one ``float`` (or ``None``) per completion. Prompts may be strings (sent as they
    are: a chat-templated one is read back into its messages by the server) or chat messages
    (conversational datasets); the ``num_generations`` completions of one prompt share one
    rubric. A dataset column named ``context_column`` (chat messages, or a JSON string of
    them), when given, replaces the prompt as the dialogue the rubric is written for; a column
    named ``gold_column`` gives each prompt's gold (``{"emotion": "sadness"}``, a JSON string of
    it, or the emotion label alone), which the Kardia profile needs.
    """

    def __init__(
        self,
        url: str | None = None,
        on_failure: str = "group_mean",
        context_column: str | None = None,
        timeout: float = 3600.0,
        gold_column: str | None = None,
    ) -> None:
        self.client = CareRewardClient(url, timeout)
        self.on_failure = _check_policy(on_failure)
        self.context_column = context_column
        self.gold_column = gold_column
        # TRL logs each reward function under its __name__.
        self.__name__ = "care_reward"

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
        for column in (self.context_column, self.gold_column):
            if column is not None and column not in kwargs:
                raise ValueError(f"no dataset column {column!r} among {sorted(kwargs)}")
        if self.context_column is not None:
            specs = [{"context": _context(c)} for c in kwargs[self.context_column]]
        else:
            specs = [_dialogue(p) for p in prompts]
        if self.gold_column is not None:
            specs = [_with_gold(s, _gold(g)) for s, g in zip(specs, kwargs[self.gold_column])]
        rewards, details = _reward_groups(self.client, specs, [_text(c) for c in completions], self.on_failure)
        _warn_unjudged("care_rl.TRLReward", self.client.url, details, self.on_failure)
        return rewards


def _verl_turn(extra_info: Any, ground_truth: Any) -> dict:
    """A verl sample's dialogue (``extra_info["context"]``: chat messages, or
    ``extra_info["prompt"]``: a chat-templated prompt) and gold (``extra_info["gold"]``, else
    ``ground_truth``)."""
    if isinstance(extra_info, dict) and "context" in extra_info:
        spec = {"context": _context(extra_info["context"])}
    elif isinstance(extra_info, dict) and isinstance(extra_info.get("prompt"), str):
        spec = {"prompt": extra_info["prompt"]}
    else:
        raise ValueError(
            "care_rl needs the dialogue in extra_info['context'] (chat messages ending with the "
            "seeker's turn) or extra_info['prompt'] (the chat-templated prompt): add it in the "
            "dataset preprocessing"
        )
    gold = extra_info.get("gold") if "gold" in extra_info else ground_truth
    return _with_gold(spec, _gold(gold))


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
    """verl ``custom_reward_function`` for one sample (the default ``naive`` reward manager).

    The dialogue comes from ``extra_info["context"]`` (or ``extra_info["prompt"]``), the gold
    from ``extra_info["gold"]`` or ``ground_truth``. One sample is a group of one, so
    ``group_mean`` has nothing to average: the default is ``"error"``. The server shares one
    rubric among the samples of a dialogue however they arrive. Prefer
    :func:`compute_score_batch` with the ``batch`` manager, or :func:`compute_score_async`
    with verl's reward loop.
    """
    policy = _check_policy(on_failure)
    rewards, details = _reward_groups(
        CareRewardClient(url), [_verl_turn(extra_info, ground_truth)], [solution_str], policy
    )
    return _verl_result(rewards[0], details[0])


async def compute_score_async(
    data_source: Any,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    url: str | None = None,
    on_failure: str = "error",
    **kwargs: Any,
) -> dict:
    """:func:`compute_score` as a coroutine function, for verl's reward loop
    (``verl/experimental/reward_loop``), which awaits ``compute_score`` once per sample when
    ``inspect.iscoroutinefunction`` says it is one. The request runs on the event loop, so the
    other samples' requests go out meanwhile; the arguments (``reward_router_address`` and
    ``reward_model_tokenizer`` among them, ignored) and the result are :func:`compute_score`'s.
    """
    policy = _check_policy(on_failure)
    turns, place = _group([_verl_turn(extra_info, ground_truth)], [solution_str])
    results = await CareRewardClient(url).reward_turns_async(turns, on_failure=policy)
    rewards, details = _spread(results, place)
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
    batch in one request, grouped by dialogue (``extra_info["context"]`` or
    ``extra_info["prompt"]``) and gold (``extra_info["gold"]`` or ``ground_truths[i]``)."""
    if not (len(solution_strs) == len(extra_infos) == len(ground_truths)):
        raise ValueError(
            f"{len(solution_strs)} solutions, {len(ground_truths)} ground truths and {len(extra_infos)} extra_infos"
        )
    policy = _check_policy(on_failure)
    specs = [_verl_turn(e, g) for e, g in zip(extra_infos, ground_truths)]
    rewards, details = _reward_groups(CareRewardClient(url), specs, list(solution_strs), policy)
    return [_verl_result(r, d) for r, d in zip(rewards, details)]
