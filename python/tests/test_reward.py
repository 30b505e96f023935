"""The reward core from Python (no torch): validation, rewards, alignment, strategy counts and
judge I/O, checked against the SPEC formulas written out here and against the bundled paper
fixtures."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import care_rl
from care_rl import CareError, Rubric


def _paper(text: str) -> dict:
    return json.loads(text)


def _codes(v) -> list:
    return [x.code for x in v.violations]


def _eq5(weights, counts, scores) -> float:
    """SPEC §7 Eq. 5 written out: sum_d w_d * mean_i raw/5 (weights on the simplex)."""
    out, i = 0.0, 0
    for w, n in zip(weights, counts):
        dim = scores[i : i + n]
        i += n
        out += w * (sum(s / 5 for s in dim) / n if n else 0.0)
    return out


# ---- validation ------------------------------------------------------------------------------


def test_paper_fixtures_validate(rubric_text, rubric_text_2):
    for text in (rubric_text, rubric_text_2, rubric_text.encode()):
        v = care_rl.validate(text)
        assert v.valid and v.format_reward == 1.0 and v.violations == [] and not v.overflowed
        assert v.feedback == ""
        assert isinstance(v.rubric, Rubric)
    r = Rubric(rubric_text)
    doc = _paper(rubric_text)
    assert r.weights == tuple(c["category_weight"] for c in doc["categories"])
    assert r.counts == tuple(len(c["criteria"]) for c in doc["categories"])
    assert r.total_criteria == sum(r.counts)
    titles = [t for _, t, _ in r.criteria]
    assert titles == [k["title"] for c in doc["categories"] for k in c["criteria"]]
    assert r.rationales[0] == doc["categories"][0]["weight_rationale"]
    assert care_rl.format_reward(rubric_text) == 1.0


def test_every_violation_has_code_number_location_and_message(rubric_text):
    doc = _paper(rubric_text)
    doc["categories"][0]["category_weight"] = 0.9  # sum 1.5: weight_sum
    doc["categories"][1]["criteria"][1]["title"] = "  "  # empty_text
    v = care_rl.validate(json.dumps(doc))
    assert not v.valid and v.format_reward == 0.0
    by_code = {x.code: x for x in v.violations}
    assert set(by_code) == {"weight_sum", "empty_text"}, v.feedback
    e = by_code["empty_text"]
    assert (e.number, e.category, e.criterion, e.dimension) == (14, 1, 1, "Affective Empathy")
    assert e.message.startswith("empty_text: categories[1] (Affective Empathy).criteria[1]")
    assert by_code["weight_sum"].number == 10
    # The recovered rubric is still there (scoring normalizes its weights).
    assert v.rubric is not None and v.rubric.counts == (3, 2, 3)
    assert v.feedback.splitlines() == [x.message for x in v.violations]


def test_category_order_and_parse_errors(rubric_text):
    doc = _paper(rubric_text)
    doc["categories"][0], doc["categories"][1] = doc["categories"][1], doc["categories"][0]
    assert "category_order" in _codes(care_rl.validate(json.dumps(doc)))
    v = care_rl.validate('{"categories": [')
    assert _codes(v) == ["not_json"] and v.rubric is None and v.violations[0].offset is not None
    bad_utf8 = care_rl.validate(b'{"categories": "\xff"}')
    assert _codes(bad_utf8) == ["not_json"] and bad_utf8.violations[0].offset == 16
    assert _codes(care_rl.validate(rubric_text + " x")) == ["trailing_text"]


def test_policy_lenient_and_overrides(rubric_text):
    fenced = "```json\n" + rubric_text + "\n```"
    assert not care_rl.validate(fenced).valid
    assert care_rl.validate(fenced, policy="lenient").valid
    assert care_rl.validate(fenced, policy={"allow_code_fence": True}).valid
    # min_criteria 4 makes the 3/2/3 rubric break the count rule in every category.
    v = care_rl.validate(rubric_text, policy={"min_criteria": 4})
    assert _codes(v).count("criteria_count") == 3
    for bad, what in (
        ({"allow_think": 1.5}, "allow_think"),
        ({"no_such_field": True}, "no_such_field"),
        ({"min_criteria": 5, "max_criteria": 4}, "min_criteria"),
        ("strict", "strict"),
    ):
        with pytest.raises(CareError) as e:
            care_rl.validate(rubric_text, policy=bad)
        assert e.value.code == "invalid_argument" and what in str(e.value)


def test_strict_rubric_raises_with_violations(rubric_text):
    doc = _paper(rubric_text)
    doc["categories"][2]["category_weight"] = 0.5
    with pytest.raises(CareError) as e:
        Rubric(json.dumps(doc))
    assert (e.value.code, e.value.number) == ("format_violation", 206)
    assert [x.code for x in e.value.violations] == ["weight_sum"]
    assert isinstance(e.value, ValueError)
    with pytest.raises(CareError) as e:
        Rubric(42)
    assert e.value.code == "invalid_argument"


def test_a_rejected_rubric_reads_summary_first_then_one_line_per_violation(rubric_text):
    # The message a user sees first: what failed and its code on line one, then each
    # violation on its own indented line, no stray newline at either end.
    with pytest.raises(CareError) as e:
        Rubric('{"categories": []}')
    lines = str(e.value).split("\n")
    assert lines[0] == "rubric breaks the format contract (format_violation):", lines
    assert len(lines) == 1 + len(e.value.violations) and len(lines) > 1, lines
    for line, v in zip(lines[1:], e.value.violations):
        assert line.startswith("  " + v.code + ": ") and line == line.rstrip(), line
    assert e.value.message == str(e.value)
    doc = _paper(rubric_text)
    doc["categories"][2]["category_weight"] = 0.5
    with pytest.raises(CareError) as e:
        care_rl.policy_reward(json.dumps(doc), [5.0] * Rubric(rubric_text).total_criteria)
    assert str(e.value).startswith("rubric breaks the format contract (format_violation):\n  weight_sum: ")


# ---- policy reward -----------------------------------------------------------------------------


def test_policy_reward_matches_eq5(rubric_text):
    r = Rubric(rubric_text)
    rng = np.random.default_rng(0)
    for _ in range(20):
        s = rng.integers(0, 6, r.total_criteria).astype(float)
        got = care_rl.policy_reward(r, s)
        assert got.reward == pytest.approx(_eq5(r.weights, r.counts, list(s)), abs=1e-15)
        assert got.weights == r.weights and not got.fired.weights_adjusted
    # The text is accepted in place of a Rubric, and lists with ints work.
    assert care_rl.policy_reward(rubric_text, [5] * r.total_criteria).reward == 1.0
    assert care_rl.policy_reward(r, [0] * r.total_criteria).dim_means == (0.0, 0.0, 0.0)


def test_policy_reward_policies_fire_and_errors_carry_codes(rubric_text):
    r = Rubric(rubric_text)
    k = r.total_criteria
    s = [4.0] * k
    s[0] = None  # missing
    with pytest.raises(CareError) as e:
        care_rl.policy_reward(r, s)
    assert (e.value.code, e.value.number) == ("missing_score", 302)
    z = care_rl.policy_reward(r, s, missing="zero")
    assert z.fired.missing_zeroed == 1
    assert z.dim_means[0] == pytest.approx((0 + 4 + 4) / 15)
    sk = care_rl.policy_reward(r, s, missing="skip")
    assert sk.fired.missing_skipped == 1 and sk.dim_means[0] == pytest.approx(0.8)
    s2 = [4.0] * k
    s2[1] = 7
    with pytest.raises(CareError) as e:
        care_rl.policy_reward(r, s2)
    assert e.value.code == "score_out_of_range"
    assert care_rl.policy_reward(r, s2, out_of_range="clamp").fired.clamped == 1
    u = care_rl.policy_reward(r, [5, 5, 5, 0, 0, 0, 0, 0], uniform_weights=True)
    assert u.fired.uniform_weights and u.reward == pytest.approx(1 / 3)
    with pytest.raises(CareError) as e:
        care_rl.policy_reward(r, [5] * (k - 1))
    assert e.value.code == "score_shape"
    with pytest.raises(CareError) as e:
        care_rl.policy_reward(r, [5] * k, missing="sometimes")
    assert e.value.code == "invalid_argument" and "zero" in str(e.value)


def test_group_is_the_per_response_reward_bit_for_bit(rubric_text):
    r = Rubric(rubric_text)
    rng = np.random.default_rng(1)
    scores = rng.integers(0, 6, (32, r.total_criteria)).astype(np.float64)
    scores[3, 2] = np.nan  # response 3 breaks missing="error"
    scores[7, 0] = 2.5  # response 7 breaks out_of_range="error"
    g = care_rl.policy_reward_group(r, scores)
    assert g.rewards.dtype == np.float64 and g.rewards.shape == (32,)
    for j in range(32):
        if j in (3, 7):
            assert math.isnan(g.rewards[j])
        else:
            assert g.rewards[j] == care_rl.policy_reward(r, scores[j]).reward
    assert (g.report.scored, g.report.failed) == (30, 2)
    assert g.report.first_error == (3, "missing_score")
    # Lists of lists, float32 arrays and the text all take the same path.
    same = care_rl.policy_reward_group(rubric_text, scores.astype(np.float32).tolist())
    np.testing.assert_array_equal(same.rewards, g.rewards)
    with pytest.raises(CareError) as e:
        care_rl.policy_reward_group(r, scores[:, :-1])
    assert e.value.code == "length_mismatch"


# ---- preference, generator, alignment, strategies ----------------------------------------------


def test_preference_reward_matches_eq3(rubric_text):
    r = Rubric(rubric_text)
    rng = np.random.default_rng(2)
    c = rng.integers(0, 6, r.total_criteria).astype(float)
    j = rng.integers(0, 6, r.total_criteria).astype(float)
    for tau, scale in ((0.7, "normalized"), (2.0, "raw")):
        got = care_rl.preference_reward(r, c, j, tau=tau, scale=scale)
        div = 5.0 if scale == "normalized" else 1.0
        want, i = 0.0, 0
        for w, n in zip(r.weights, r.counts):
            want += w * sum(math.tanh((c[i + t] / div - j[i + t] / div) / tau) for t in range(n)) / n
            i += n
        assert got.reward == pytest.approx(want, abs=1e-14)
    with pytest.raises(CareError) as e:
        care_rl.preference_reward(r, c, j, tau=0.0)
    assert e.value.code == "invalid_argument"


def test_generator_reward_is_eq4_of_its_terms(rubric_text):
    r = Rubric(rubric_text)
    c = [5, 4, 5, 4, 5, 3, 4, 4]
    j = [2, 3, 1, 2, 2, 1, 2, 3]
    tactics = ["questioning", "information"]
    g = care_rl.generator_reward(rubric_text, c, j, tactics)
    assert g.parsed and g.r_fmt == 1.0 and g.violations == 0
    assert g.r_pref == care_rl.preference_reward(r, c, j).reward
    counts = care_rl.strategy_counts(tactics)
    assert g.counts == counts and counts.counts == (1, 0, 1)
    assert g.alignment == care_rl.alignment(r.weights, counts.counts)
    assert g.r_align == g.alignment.reward
    assert g.reward == pytest.approx(g.r_pref + 0.1 * g.r_align + 0.3 * g.r_fmt, abs=1e-15)
    g2 = care_rl.generator_reward(rubric_text, c, j, tactics, lambda_=0.5, gamma=0.0)
    assert g2.reward == pytest.approx(g.r_pref + 0.5 * g.r_align, abs=1e-15)
    junk = care_rl.generator_reward("not a rubric", c, j, tactics)
    assert not junk.parsed and junk.r_fmt == 0.0 and junk.violations >= 1
    with pytest.raises(CareError) as e:
        care_rl.generator_reward(rubric_text, c, j, ["hugging"])
    assert e.value.code == "unknown_label"
    ok = care_rl.generator_reward(rubric_text, c, j, ["hugging"], unknown_label="ignore")
    assert ok.counts.unknown == 1


def test_alignment_rules():
    assert care_rl.alignment((0.4, 0.3, 0.3), (0, 0, 0)).reward == 1.0
    # Top violation (the most-used dimension, Aff, is not the heaviest) and one zero
    # violation (Cog unused but heavier than the used Aff): two violations, reward 0.
    a = care_rl.alignment((0.5, 0.3, 0.2), (0, 1, 0))
    assert (a.reward, a.top_violation, a.zero_violations) == (0.0, True, 1)
    b = care_rl.alignment((0.5, 0.3, 0.2), (2, 1, 0))
    assert (b.reward, b.top_violation, b.zero_violations) == (1.0, False, 0)
    assert care_rl.alignment_reward((0.2, 0.3, 0.5), (1, 0, 1)) == 0.5
    with pytest.raises(CareError):
        care_rl.alignment((0.5, 0.5), (1, 1, 1))


def test_strategy_counts_are_over_a_set():
    c = care_rl.strategy_counts(
        ["Question", "[Questions]", "question", "validation", "advice", "information"]
    )
    assert (c.counts, c.duplicates, c.unknown) == ((1, 1, 2), 2, 0)
    with pytest.raises(CareError) as e:
        care_rl.strategy_counts(["hug"])
    assert (e.value.code, e.value.number) == ("unknown_label", 304)
    assert care_rl.strategy_counts(["hug", "advice"], unknown_label="ignore").unknown == 1


# ---- judge I/O -----------------------------------------------------------------------------------


def test_judge_prompt_and_demo_group(rubric_text, demo):
    r = Rubric(rubric_text)
    p = care_rl.render_judge_prompt(r, demo["context"], "I miss him.", "Reach out gently.")
    for _, title, desc in r.criteria:
        assert title.strip() in p and desc.strip() in p
    assert "Reach out gently." in p and "criterion_scores" in p
    outs = [care_rl.parse_judge_output(x["judge"], r) for x in demo["responses"]]
    scores = np.stack([o.scores for o in outs])
    assert scores.shape == (len(demo["responses"]), r.total_criteria)
    g = care_rl.policy_reward_group(r, scores, missing="zero", out_of_range="clamp")
    for row, o, reward in zip(scores, outs, g.rewards):
        assert o.report.matched + o.report.missing == r.total_criteria
        want = care_rl.policy_reward(r, row, missing="zero", out_of_range="clamp").reward
        assert reward == want
    # Advantages of the group, in one more call.
    adv = care_rl.group_advantages(g.rewards.astype(np.float32), len(g.rewards))
    assert adv.shape == g.rewards.shape and abs(float(adv.mean())) < 1e-6


def test_judge_parser_envelope_and_errors(rubric_text):
    r = Rubric(rubric_text)
    items = [
        {"category": d, "criterion_title": t, "score": 3} for d, t, _ in r.criteria
    ]
    items[0]["criterion_title"] = items[0]["criterion_title"].upper()  # case-insensitive match
    items.append({"category": "Cognitive Empathy", "criterion_title": "nope", "score": 1})
    text = "<think>scratch</think>Here:\n```json\n" + json.dumps({"criterion_scores": items}) + "\n```"
    out = care_rl.parse_judge_output(text, r)
    assert out.scores.tolist() == [3.0] * r.total_criteria
    rep = out.report
    assert (rep.matched, rep.case_insensitive, rep.unknown, rep.clean) == (8, 1, 1, False)
    with pytest.raises(CareError) as e:
        care_rl.parse_judge_output("no json here", r)
    assert (e.value.code, e.value.number) == ("no_judge_json", 207)
