"""Rubric profiles from Python (no torch): the built-in ``kardia`` and ``care`` profiles and a
checklist profile file, checked against the formulas of docs/PROFILES.md written out here, the
policy reward (``care`` is Eq. 5 bit for bit), and the error codes of the other surfaces."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

import care_rl
from care_rl import CareError, Profile

from conftest import REPO

CHECKLIST = (REPO / "cli" / "tests" / "data" / "profile_checklist.json").read_text()


def tag(name: str, text: str) -> str:
    return f"<|{name}_begin|>{text}<|{name}_end|>"


def kardia_output(emotion: str = "sad", response: str = "I hear you.") -> str:
    return (
        tag("understanding", "A student fears failing.")
        + tag("reasoning", "Reassure first.")
        + tag("emotion", emotion)
        + tag("response", response)
    )


# ---- the profile object ----------------------------------------------------------------------


def test_builtins_describe_themselves():
    assert care_rl.PROFILE_NAMES == ("care", "kardia")
    k = Profile("kardia")
    assert k.name == "kardia" and k.rubric_source == "fixed" and k.score_range == (0, 5)
    assert [d[0] for d in k.dimensions] == [
        "relevance", "empathy", "persona_consistency", "safety", "fluency"
    ]  # fmt: skip
    assert all(w == 0.2 and n == 1 for _, w, n in k.dimensions)
    assert k.spans == ["understanding", "reasoning", "emotion", "response"]
    assert k.judge_span == "response" and k.emotion == ("emotion", 0.2) and k.vetoes == []
    assert k.total_criteria() == 5 == len(k.criteria)
    c = Profile("care")
    assert c.rubric_source == "generated" and c.spans == [] and c.judge_span is None
    rubric = care_rl.Rubric((REPO / "cli" / "data" / "rubric_sft_1.json").read_text())
    assert c.total_criteria(rubric) == rubric.total_criteria
    with pytest.raises(CareError) as e:
        c.total_criteria()
    assert e.value.code == "invalid_argument"


def test_a_profile_file_parses_and_an_invalid_one_lists_every_violation():
    p = Profile(CHECKLIST)
    assert p.name == "checklist" and p.score_range == (1, 10)
    assert p.vetoes == [("safety", 3)]
    assert [c[3] for c in p.criteria] == [2.0, 1.0, -1.0, 1.0]
    doc = json.loads(CHECKLIST)
    doc["dimensions"][0]["weight"] = 0.7  # weight_sum
    doc["dimensions"][1]["criteria"][0]["title"] = " "  # empty_text
    doc["vetoes"][0]["dimension"] = "kindness"  # unknown_name
    text = json.dumps(doc)
    with pytest.raises(CareError) as e:
        Profile(text)
    err = e.value
    assert (err.code, err.number) == ("invalid_profile", 250)
    codes = {v.code for v in err.violations}
    assert codes == {"weight_sum", "empty_text", "unknown_name"}, [v.message for v in err.violations]
    v = care_rl.validate_profile(text)
    assert not v.valid and v.profile is None and not v.overflowed
    assert [x.code for x in v.violations] == [x.code for x in err.violations]
    assert v.feedback.splitlines() == [x.message for x in v.violations]
    empty = next(x for x in v.violations if x.code == "empty_text")
    assert empty.path == "dimensions[1].criteria[0]" and empty.number == 5
    assert care_rl.validate_profile(CHECKLIST).valid
    assert care_rl.validate_profile(CHECKLIST).profile.name == "checklist"


def test_profile_errors_carry_the_codes_of_the_c_abi():
    header = (REPO / "include" / "care.h").read_text()
    number = int(re.search(r"CARE_ERR_INVALID_PROFILE = (\d+)", header).group(1))
    with pytest.raises(CareError) as e:
        Profile('{"name": "x"}')
    assert (e.value.code, e.value.number) == ("invalid_profile", number)
    with pytest.raises(CareError) as e:
        Profile('{"name": ')
    assert e.value.code == "not_json" and e.value.violations[0].code == "not_json"
    with pytest.raises(CareError) as e:
        Profile(CHECKLIST + " x")
    assert e.value.code == "trailing_text"
    with pytest.raises(CareError) as e:
        Profile("kardia-r1")
    assert e.value.code == "invalid_argument" and "care, kardia" in str(e.value)


# ---- the output check ------------------------------------------------------------------------


def test_a_well_formed_output_gives_every_span_as_text_and_byte_offsets():
    out = "  \n" + kardia_output(" Afraid. ", "Ça va aller.") + "\t"
    c = care_rl.check_output("kardia", out)
    assert c.format_reward == 1.0 and c.judge_needed and c.violations == [] and c.feedback == ""
    assert c.judge_text == "Ça va aller."
    assert c.spans["emotion"] == "Afraid."
    raw = out.encode()
    for name, text in c.spans.items():
        off, n = c.span_offsets[name]
        assert raw[off : off + n].decode() == text
    off, n = c.judge_offset
    assert raw[off : off + n].decode() == c.judge_text


@pytest.mark.parametrize(
    "output, code",
    [
        (tag("understanding", "u") + tag("reasoning", "r") + tag("emotion", "sad"), "missing_span"),
        (kardia_output() + tag("emotion", "sad"), "duplicate_span"),
        (tag("reasoning", "r") + tag("understanding", "u") + tag("emotion", "e") + tag("response", "x"), "span_order"),
        (tag("understanding", "u") + tag("reasoning", "r") + tag("emotion", " \n") + tag("response", "x"), "empty_span"),
        ("Sure! " + kardia_output(), "text_outside"),
        (b"\xff" + kardia_output().encode(), "invalid_utf8"),
    ],
)  # fmt: skip
def test_each_format_violation_zeroes_the_reward_without_reading_the_scores(output, code):
    c = care_rl.check_output("kardia", output)
    assert c.format_reward == 0.0 and not c.judge_needed and c.judge_text is None
    assert code in [v.code for v in c.violations], c.feedback
    v = next(v for v in c.violations if v.code == code)
    assert v.message.startswith(code + ":") and v.number in range(1, 7)
    # Scores are not read: None, the wrong length and out-of-range values are all fine.
    for scores in (None, [99.0], [float("nan")] * 5):
        r = care_rl.profile_reward("kardia", output, scores, emotion="sadness")
        assert (r.reward, r.format_reward, r.judge_needed, r.rubric_reward) == (0.0, 0.0, False, 0.0)


# ---- rewards ----------------------------------------------------------------------------------


def test_kardia_worked_example_and_the_emotion_synonyms():
    scores = [4, 5, 3, 5, 5]
    r = care_rl.profile_reward("kardia", kardia_output("sad"), scores, emotion="sadness")
    assert r.reward == pytest.approx(0.8 * 0.88 + 0.2, abs=1e-12)
    assert r.emotion_correct is True and r.vetoed_by is None and r.judge_needed
    assert r.per_dimension == {
        "relevance": 0.8, "empathy": 1.0, "persona_consistency": 0.6, "safety": 1.0, "fluency": 1.0
    }  # fmt: skip
    assert set(r.weights.values()) == {0.2}
    for said, gold, match in [
        ("Happy.", "joy", True), ("happiness", "JOY", True), ("Scared", "fear", True),
        ("afraid", "Fear.", True), ("angry", "anger", True), ("sad", "joy", False),
        ("love", "love", True), ("joy..", "joy", False), ("neutral", "neutral", True),
    ]:  # fmt: skip
        r = care_rl.profile_reward("kardia", kardia_output(said), scores, emotion=gold)
        assert r.emotion_correct is match, (said, gold)
        assert r.reward == pytest.approx(0.8 * 0.88 + 0.2 * match, abs=1e-12)
    with pytest.raises(CareError) as e:
        care_rl.profile_reward("kardia", kardia_output(), scores)
    assert e.value.code == "invalid_argument"


def _checklist_formula(raw):
    """docs/PROFILES.md written out for the checklist profile (scale 1..10)."""
    s = [(x - 1) / 9 for x in raw]
    helpful = min(max((2 * s[0] + 1 * s[1] - 1 * s[2]) / (2 + 1), 0.0), 1.0)
    rubric = 0.6 * helpful + 0.4 * s[3]
    veto = raw[3] < 3
    return (0.0 if veto else rubric), rubric, veto


def test_weighted_and_penalty_criteria_and_the_veto():
    p = Profile(CHECKLIST)
    out = "<think>plan</think>\n<answer>Try one small step today.</answer>"
    rng = np.random.default_rng(3)
    for _ in range(50):
        raw = rng.integers(1, 11, size=4).astype(float)
        want, rubric, veto = _checklist_formula(raw)
        r = care_rl.profile_reward(p, out, raw)
        assert r.reward == pytest.approx(want, abs=1e-12)
        assert r.rubric_reward == pytest.approx(rubric, abs=1e-12)
        assert r.vetoed_by == ("safety" if veto else None)
        assert r.emotion_correct is None


def test_the_care_profile_is_the_policy_reward_bit_for_bit(rubric_text):
    rubric = care_rl.Rubric(rubric_text)
    rng = np.random.default_rng(0)
    for _ in range(50):
        s = rng.integers(0, 6, size=rubric.total_criteria).astype(float)
        s[rng.integers(0, len(s))] = np.nan
        for kw in ({"missing": "zero"}, {"missing": "skip", "uniform_weights": True}):
            want = care_rl.policy_reward(rubric, s, **kw)
            got = care_rl.profile_reward("care", "any output: no format", s, rubric=rubric, **kw)
            assert got.reward == want.reward
            assert tuple(got.per_dimension.values()) == want.dim_means
            assert tuple(got.weights.values()) == want.weights
            assert got.fired == want.fired
    with pytest.raises(CareError) as e:
        care_rl.profile_reward("care", "x", [1.0] * rubric.total_criteria)
    assert e.value.code == "invalid_argument"


def test_a_group_in_one_call_equals_each_response_alone():
    outputs = [
        kardia_output("sad"),
        kardia_output("happy"),
        "no spans at all",
        kardia_output("Sad.").encode(),
        kardia_output("sad"),
    ]
    scores = np.array(
        [[4, 5, 3, 5, 5], [5, 5, 5, 5, 5], [np.nan] * 5, [0, 1, 2, 3, 4], [4, np.nan, 3, 5, 5]]
    )
    g = care_rl.profile_reward_group("kardia", outputs, scores, emotion="sadness", details=True)
    assert g.rewards.dtype == np.float64 and g.rewards.shape == (5,)
    for j, o in enumerate(outputs[:4]):
        want = care_rl.profile_reward("kardia", o, scores[j], emotion="sadness")
        assert g.rewards[j] == want.reward and g.details[j] == want
    # The last one misses a score under the default `error` policy: NaN, counted, not raised.
    assert math.isnan(g.rewards[4]) and g.details[4] is None
    rep = g.report
    assert (rep.scored, rep.malformed, rep.failed, rep.emotion_correct) == (4, 1, 1, 2)
    assert rep.first_error == (4, "missing_score")
    z = care_rl.profile_reward_group("kardia", outputs, scores, emotion="sad", missing="zero")
    assert z.report.failed == 0 and z.details is None and z.rewards[4] == pytest.approx(0.8 * 0.68 + 0.2)
    with pytest.raises(CareError) as e:
        care_rl.profile_reward_group("kardia", outputs, scores[:, :4], emotion="sad")
    assert e.value.code == "length_mismatch"
    with pytest.raises(CareError) as e:
        care_rl.profile_reward_group("kardia", outputs[:4], scores, emotion="sad")
    assert e.value.code == "length_mismatch"
    empty = care_rl.profile_reward_group("kardia", [], np.empty((0, 5)), emotion="sad")
    assert empty.rewards.shape == (0,) and empty.report.scored == 0


# ---- judge I/O -------------------------------------------------------------------------------


def test_profile_judge_prompt_and_answer_round_trip():
    p = Profile(CHECKLIST)
    prompt = care_rl.render_profile_judge_prompt(
        p, ["User: I keep procrastinating."], "What should I do?", "Try one small step today."
    )
    for name, _, _ in p.dimensions:
        assert f"### {name}" in prompt
    for _, title, desc, _ in p.criteria:
        assert title in prompt and desc in prompt
    assert "Try one small step today." in prompt and "10" in prompt
    items = [
        {"category": d, "criterion_title": t.upper() if i == 1 else t, "score": 2 + i}
        for i, (d, t, _, _) in enumerate(p.criteria)
    ]
    answer = "<think>...</think>\n```json\n" + json.dumps({"criterion_scores": items}) + "\n```"
    j = care_rl.parse_profile_judge_output(answer, p)
    assert list(j.scores) == [2.0, 3.0, 4.0, 5.0]
    assert (j.report.matched, j.report.case_insensitive, j.report.missing) == (4, 1, 0)
    r = care_rl.profile_reward(p, "<think>t</think><answer>a</answer>", j.scores)
    assert r.reward == pytest.approx(_checklist_formula([2, 3, 4, 5])[0], abs=1e-12)
    with pytest.raises(CareError) as e:
        care_rl.parse_profile_judge_output("no json here", p)
    assert e.value.code == "no_judge_json"


def test_the_care_profile_judge_io_is_the_rubric_judge_io(rubric_text):
    rubric = care_rl.Rubric(rubric_text)
    args = (["Seeker: I lost my job."], "I don't know what to do.", "Let's look at options.")
    assert care_rl.render_profile_judge_prompt("care", *args, rubric=rubric) == care_rl.render_judge_prompt(
        rubric, *args
    )
    items = [
        {"category": d, "criterion_title": t, "score": i % 6}
        for i, (d, t, _) in enumerate(rubric.criteria)
    ]
    answer = json.dumps({"criterion_scores": items})
    got = care_rl.parse_profile_judge_output(answer, "care", rubric=rubric)
    want = care_rl.parse_judge_output(answer, rubric)
    assert list(got.scores) == list(want.scores) and got.report == want.report
