"""What Python trainers write today for the work `care` does: the format contract of SPEC §3 as
`json.loads` + hand-written checks and as a pydantic v2 model, Eq. 5 scoring, group advantages
(numpy, vectorized; and a per-group loop as verl's reference does), and the clipped-ratio loss
with its gradient in numpy. Each function is written the straightforward way a user would, not
tuned to lose.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict

NAMES = ["Cognitive Empathy", "Affective Empathy", "Proactive Empathy"]
CAT_KEYS = ["category", "weight_rationale", "category_weight", "criteria"]
CRIT_KEYS = ["title", "description"]
SUFFIX = "value: 0, 1, 2, 3, 4, 5"


# ----------------------------------------------------------------------------------------------
# Format contract, hand-written (SPEC §3, paper policy)


def level_format_ok(desc: str) -> bool:
    pos = []
    for k in range(6):
        tag = f"[{k}]"
        if desc.count(tag) != 1:
            return False
        pos.append(desc.index(tag))
    if pos != sorted(pos):
        return False
    body = desc.rstrip()
    if not body.endswith(SUFFIX):
        return False
    end = len(body) - len(SUFFIX)
    bounds = pos[1:] + [end]
    return all(desc[p + 3 : b].strip() for p, b in zip(pos, bounds))


def check_rubric_value(obj) -> list:
    """Every violation code of a parsed rubric value (SPEC §3 order of checks)."""
    v = []
    if not isinstance(obj, dict) or list(obj.keys()) != ["categories"]:
        return ["schema"]
    cats = obj["categories"]
    if not isinstance(cats, list):
        return ["schema"]
    seen, weights, titles = [], {}, set()
    for cat in cats:
        if not isinstance(cat, dict):
            v.append("schema")
            continue
        keys = list(cat.keys())
        if set(keys) != set(CAT_KEYS) or len(keys) != 4:
            v.append("schema")
            continue
        if keys != CAT_KEYS:
            v.append("key_order")
        name = cat["category"]
        if name not in NAMES:
            v.append("unknown_category")
            continue
        if name in seen:
            v.append("duplicate_category")
            continue
        seen.append(name)
        rat = cat["weight_rationale"]
        if not isinstance(rat, str):
            v.append("schema")
        elif not rat.strip():
            v.append("empty_text")
        w = cat["category_weight"]
        if isinstance(w, bool) or not isinstance(w, (int, float)):
            v.append("schema")
        else:
            weights[name] = float(w)
            if not 0.0 <= w <= 1.0:
                v.append("weight_range")
        crit = cat["criteria"]
        if not isinstance(crit, list):
            v.append("schema")
            continue
        if not 2 <= len(crit) <= 4:
            v.append("criteria_count")
        for c in crit:
            if not isinstance(c, dict) or set(c.keys()) != set(CRIT_KEYS) or len(c) != 2:
                v.append("schema")
                continue
            if list(c.keys()) != CRIT_KEYS:
                v.append("key_order")
            t, d = c["title"], c["description"]
            if not isinstance(t, str) or not isinstance(d, str):
                v.append("schema")
                continue
            if not t.strip() or not d.strip():
                v.append("empty_text")
            key = t.strip().lower()
            if key in titles:
                v.append("duplicate_title")
            titles.add(key)
            if not level_format_ok(d):
                v.append("level_format")
    for name in NAMES:
        if name not in seen:
            v.append("missing_category")
    if seen != [n for n in NAMES if n in seen]:
        v.append("category_order")
    if len(weights) == 3 and abs(sum(weights.values()) - 1.0) > 1e-3:
        v.append("weight_sum")
    return v


def parse_text(text: str):
    """(value or None, violations) the way a careful hand-written validator parses."""
    try:
        return json.loads(text), []
    except json.JSONDecodeError as e:
        # Text before or after one JSON object: find the object and say so.
        start = text.find("{")
        if start >= 0:
            try:
                value, end = json.JSONDecoder().raw_decode(text, start)
                return value, ["trailing_text"]
            except json.JSONDecodeError:
                pass
        if "Extra data" in e.msg:
            return None, ["trailing_text"]
        return None, ["not_json"]


def validate_handwritten(text: str) -> tuple:
    value, v = parse_text(text)
    if value is not None:
        v += check_rubric_value(value)
    return (1 if not v else 0), v


def run_validate_handwritten(path: str, sink) -> list:
    rewards = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            r, v = validate_handwritten(json.loads(line)["text"])
            rewards.append(r)
            sink.write(json.dumps({"line": i, "format_reward": r, "violations": v}) + "\n")
    return rewards


# ----------------------------------------------------------------------------------------------
# Format contract as a pydantic v2 model


def make_pydantic_model():
    from typing import List, Literal

    from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

    class Criterion(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        title: str
        description: str

        @model_validator(mode="before")
        @classmethod
        def key_order(cls, data):
            if isinstance(data, dict) and list(data.keys()) != CRIT_KEYS:
                raise ValueError("key_order")
            return data

        @field_validator("title")
        @classmethod
        def title_not_blank(cls, t):
            if not t.strip():
                raise ValueError("empty_text")
            return t

        @field_validator("description")
        @classmethod
        def levels(cls, d):
            if not d.strip():
                raise ValueError("empty_text")
            if not level_format_ok(d):
                raise ValueError("level_format")
            return d

    class Category(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        category: Literal["Cognitive Empathy", "Affective Empathy", "Proactive Empathy"]
        weight_rationale: str
        category_weight: float = Field(ge=0.0, le=1.0)
        criteria: List[Criterion] = Field(min_length=2, max_length=4)

        @model_validator(mode="before")
        @classmethod
        def key_order(cls, data):
            if isinstance(data, dict) and list(data.keys()) != CAT_KEYS:
                raise ValueError("key_order")
            return data

        @field_validator("weight_rationale")
        @classmethod
        def rationale_not_blank(cls, t):
            if not t.strip():
                raise ValueError("empty_text")
            return t

    class Rubric(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        categories: List[Category]

        @model_validator(mode="after")
        def contract(self):
            names = [c.category for c in self.categories]
            if sorted(set(names)) != sorted(NAMES) or len(names) != 3:
                raise ValueError("missing_category/duplicate_category")
            if names != NAMES:
                raise ValueError("category_order")
            if abs(sum(c.category_weight for c in self.categories) - 1.0) > 1e-3:
                raise ValueError("weight_sum")
            titles = [t.title.strip().lower() for c in self.categories for t in c.criteria]
            if len(set(titles)) != len(titles):
                raise ValueError("duplicate_title")
            return self

    return Rubric


def run_validate_pydantic(path: str, sink) -> list:
    from pydantic import ValidationError

    model = make_pydantic_model()
    rewards = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            text = json.loads(line)["text"]
            try:
                model.model_validate_json(text)
                r, v = 1, []
            except ValidationError as e:
                r, v = 0, [err["type"] for err in e.errors()]
            rewards.append(r)
            sink.write(json.dumps({"line": i, "format_reward": r, "violations": v}) + "\n")
    return rewards


# ----------------------------------------------------------------------------------------------
# Scoring a GRPO group under one rubric (Eq. 5)


def score_line(obj) -> list:
    rubric = obj["rubric"]
    if check_rubric_value(rubric):
        raise ValueError("rubric breaks the format contract")
    cats = rubric["categories"]
    w = [float(c["category_weight"]) for c in cats]
    total = sum(w)
    w = [x / total for x in w] if total > 0 else [1 / 3] * 3
    counts = [len(c["criteria"]) for c in cats]
    out = []
    for resp in obj["responses"]:
        scores = resp["scores"]
        if [len(s) for s in scores] != counts:
            raise ValueError("score shape")
        r = 0.0
        for wd, sd in zip(w, scores):
            for s in sd:
                if not (isinstance(s, (int, float)) and 0 <= s <= 5 and s == int(s)):
                    raise ValueError("score out of range")
            r += wd * (sum(sd) / 5.0 / len(sd))
        out.append(r)
    return out


def run_score(path: str, sink) -> int:
    n = 0
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            rewards = score_line(json.loads(line))
            sink.write(json.dumps({"line": i, "rewards": rewards}) + "\n")
            n += len(rewards)
    return n


# ----------------------------------------------------------------------------------------------
# GRPO advantages and loss


def advantages_numpy(r, g, eps=1e-6):
    """TRL-style vectorized group normalization (verl preset numbers: eps 1e-6, unbiased std)."""
    import numpy as np

    x = r.reshape(-1, g).astype(np.float64)
    mean = x.mean(axis=1, keepdims=True)
    std = x.std(axis=1, ddof=1, keepdims=True)
    return ((x - mean) / (std + eps)).astype(np.float32).reshape(-1)


def advantages_verl_loop(r, index, eps=1e-6):
    """verl's reference loop: collect scores per prompt id in a dict, then per group mean/std,
    then a second loop over samples (written with numpy scalars instead of torch ones)."""
    import numpy as np

    id2score = defaultdict(list)
    id2mean, id2std = {}, {}
    bsz = r.shape[0]
    for i in range(bsz):
        id2score[index[i]].append(r[i])
    for idx, scores in id2score.items():
        if len(scores) == 1:
            id2mean[idx], id2std[idx] = 0.0, 1.0
        else:
            s = np.array(scores, dtype=np.float64)
            id2mean[idx], id2std[idx] = s.mean(), s.std(ddof=1)
    out = np.empty(bsz, dtype=np.float32)
    for i in range(bsz):
        out[i] = (r[i] - id2mean[index[i]]) / (id2std[index[i]] + eps)
    return out


def loss_numpy(logp, logp_old, adv_seq, offsets, mask, eps_low=0.2, eps_high=0.2, clamp=20.0):
    """token_mean clipped loss and its analytic gradient, vectorized numpy (f32 math as a
    trainer would write it, f64 only for the final sums)."""
    import numpy as np

    lengths = np.diff(offsets)
    adv = np.repeat(adv_seq, lengths)
    m = mask.astype(np.float32)
    delta = np.clip(logp - logp_old, -clamp, clamp)
    rho = np.exp(delta)
    pg1 = -adv * rho
    pg2 = -adv * np.clip(rho, 1 - eps_low, 1 + eps_high)
    per_tok = np.maximum(pg1, pg2)
    n = m.sum(dtype=np.float64)
    loss = float((per_tok * m).sum(dtype=np.float64) / n)
    active = (pg1 >= pg2) & (np.abs(logp - logp_old) <= clamp)
    grad = np.where(active, -adv * rho, 0.0).astype(np.float32) * m / np.float32(n)
    return loss, grad


def math_close(a, b, tol=1e-5):
    return math.isclose(a, b, rel_tol=tol, abs_tol=tol)


# ----------------------------------------------------------------------------------------------
# The command-line input shapes (benches/compare/shapes.py): any line `care validate` or
# `care score` reads, checked or scored the straightforward way.


def validate_line_any(line: str) -> tuple:
    """(r_fmt, violations) of one `care validate` line: `{"text": ...}` or a rubric object."""
    obj = json.loads(line)
    if isinstance(obj, dict) and "text" in obj:
        return validate_handwritten(obj["text"])
    v = check_rubric_value(obj)
    return (1 if not v else 0), v


def run_validate_any(path: str, sink) -> int:
    n = 0
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            r, v = validate_line_any(line)
            sink.write(json.dumps({"line": i, "format_reward": r, "violations": v}) + "\n")
            n += 1
    return n


def run_validate_pydantic_any(path: str, sink) -> int:
    """The pydantic model on each line's rubric: the `text` string, or the line itself."""
    from pydantic import ValidationError

    model = make_pydantic_model()
    n = 0
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            text = json.loads(line)["text"] if line.startswith('{"text"') else line
            try:
                model.model_validate_json(text)
                r, v = 1, []
            except ValidationError as e:
                r, v = 0, [err["type"] for err in e.errors()]
            sink.write(json.dumps({"line": i, "format_reward": r, "violations": v}) + "\n")
            n += 1
    return n


def judge_matrix(rubric, text: str) -> list:
    """The score matrix a judge answer gives: its `{"criterion_scores": [..]}` object, matched
    to the rubric's criteria by (category, title)."""
    start = text.find('{"criterion_scores"')
    if start < 0:
        raise ValueError("no criterion_scores object")
    obj, _ = json.JSONDecoder().raw_decode(text, start)
    by = {(it["category"], it["criterion_title"]): it["score"] for it in obj["criterion_scores"]}
    return [[by[(c["category"], k["title"])] for k in c["criteria"]] for c in rubric["categories"]]


def score_line_any(obj) -> list:
    """Rewards of one `care score` line: `responses`, or a single `scores` or `judge`."""
    if "responses" in obj:
        return score_line(obj)
    if "scores" in obj:
        scores = obj["scores"]
    else:
        scores = judge_matrix(obj["rubric"], obj["judge"])
    return score_line({"rubric": obj["rubric"], "responses": [{"scores": scores}]})


def run_score_any(path: str, sink) -> int:
    n = 0
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            rewards = score_line_any(json.loads(line))
            sink.write(json.dumps({"line": i, "rewards": rewards}) + "\n")
            n += len(rewards)
    return n
