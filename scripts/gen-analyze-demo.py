#!/usr/bin/env python3
"""Writes cli/data/analyze_demo.jsonl, the small demo input of `care analyze`.

The data is SYNTHETIC: drawn from a fixed-seed generator so that the report shows the shapes the
CARE paper describes (it is not the paper's data):

* rubric weights of two generator variants by dialogue turn and user emotion (Figures 3, 4, 9):
  "SFT" stays Cognitive-dominant; "SFT+RL" starts Affective-dominant and crosses over to
  Cognitive around turn 8, and leans Affective on negative emotions;
* preference pairs scored under generated rubrics for three generator variants, with win, tie
  and loss counts in the proportions of the paper's Table 4 rows (base, SFT, SFT+RL), in
  shuffled order;
* MINT tactic sets of policy responses for "MICA" and "CARE(M)" by emotion (Figures 5, 10);
* a few rubrics that break the format contract, one failed generation ("rubric": null), and
  three lines that `care analyze` must skip (an unknown emotion, an empty variant name, a pair
  without its rejected side), so that every section of the report has something to show.

Deterministic: its own splitmix64 generator, no dependency, same bytes on every run and
platform. Usage (from the repository root):

    python3 scripts/gen-analyze-demo.py            # rewrite cli/data/analyze_demo.jsonl
    python3 scripts/gen-analyze-demo.py --check    # exit 1 if the checked-in file differs
"""
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "cli" / "data" / "analyze_demo.jsonl"
EMOTIONS = ["joy", "surprise", "fear", "sadness", "disgust", "anger"]
NEGATIVE = {"fear", "sadness", "disgust", "anger"}
DIMS = ["Cognitive Empathy", "Affective Empathy", "Proactive Empathy"]


class Rng:
    """splitmix64: tiny, well known, and identical everywhere."""

    def __init__(self, seed):
        self.s = seed & 0xFFFFFFFFFFFFFFFF

    def next(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        return z ^ (z >> 31)

    def uniform(self):
        return (self.next() >> 11) / float(1 << 53)

    def below(self, n):
        return self.next() % n

    def choice(self, xs):
        return xs[self.below(len(xs))]


def weights(rng, mu_cog, mu_aff):
    """Integer percentages near the means (noise of a few points), summing to exactly 100."""
    noise = lambda: rng.below(9) - 4  # -4..4 points
    cog = min(max(round(100 * mu_cog) + noise(), 5), 80)
    aff = min(max(round(100 * mu_aff) + noise(), 5), 90 - cog)
    return [cog, aff, 100 - cog - aff]


def pct(p):
    return "%d.%02d" % (p // 100, p % 100)


def rubric(w, tag, per_dim=(2, 2, 2)):
    """A compact rubric in the generator's format (key order as the contract requires)."""
    cats = []
    for d, name in enumerate(DIMS):
        crits = [
            {
                "title": "%s %s %d" % (name.split()[0], tag, i + 1),
                "description": "[0] absent [1] token [2] partial [3] adequate [4] strong "
                "[5] exemplary value: 0, 1, 2, 3, 4, 5",
            }
            for i in range(per_dim[d])
        ]
        cats.append(
            {
                "category": name,
                "weight_rationale": "priority for this turn",
                "category_weight": w[d] / 100,
                "criteria": crits,
            }
        )
    return {"categories": cats}


def means(variant, turn, emotion):
    if variant == "SFT":
        cog, aff = 0.42, 0.33
    else:
        cog = 0.30 + 0.011 * (turn - 1)
        aff = 0.46 - 0.011 * (turn - 1)
        shift = 0.04 if emotion in NEGATIVE else -0.04 if emotion == "joy" else 0.0
        cog, aff = cog - shift, aff + shift
    return cog, aff


def dump(obj):
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def lines():
    rng = Rng(20260521)
    out = []
    # Figures 3, 4, 9: rubrics by turn and emotion, as `care validate` reports them...
    for variant in ["SFT", "SFT+RL"]:
        for turn in range(1, 13):
            for _ in range(8):
                emotion = rng.choice(EMOTIONS)
                w = weights(rng, *means(variant, turn, emotion))
                out.append(
                    '{"variant":%s,"turn":%d,"emotion":"%s","format_reward":1,"violations":[],'
                    '"weights":[%s,%s,%s],"criteria":[2,2,2]}'
                    % (dump(variant), turn, emotion, pct(w[0]), pct(w[1]), pct(w[2]))
                )
        # ... and a few as raw generator output that `care analyze` validates itself.
        for k in range(6):
            turn, emotion = 1 + rng.below(12), rng.choice(EMOTIONS)
            w = weights(rng, *means(variant, turn, emotion))
            text = dump(rubric(w, "t%d" % k))
            out.append(dump({"variant": variant, "turn": turn, "emotion": emotion, "text": text}))
    # Rubrics that break the contract, and a failed generation.
    bad_sum = rubric([50, 30, 10], "s")
    out.append(dump({"variant": "SFT", "turn": 3, "emotion": "sadness", "text": dump(bad_sum)}))
    fenced = "```json\n" + dump(rubric([40, 35, 25], "f")) + "\n```"
    out.append(dump({"variant": "SFT+RL", "turn": 5, "emotion": "fear", "text": fenced}))
    many = rubric([40, 35, 25], "m", per_dim=(5, 2, 2))
    out.append(dump({"variant": "SFT+RL", "turn": 9, "emotion": "joy", "text": dump(many)}))
    out.append(dump({"variant": "SFT+RL", "turn": 2, "emotion": "anger", "rubric": None}))
    # Table 4: pairs scored under each variant's rubric; win, tie and loss counts in the
    # proportions of the paper's rows (percent), shuffled.
    table4 = [("base", 49.3, 13.8), ("SFT", 47.6, 24.1), ("SFT+RL", 59.4, 11.5)]
    pairs = 30
    for variant, win, tie in table4:
        wins, ties = round(pairs * win / 100), round(pairs * tie / 100)
        outcomes = ["win"] * wins + ["tie"] * ties + ["loss"] * (pairs - wins - ties)
        for j in range(len(outcomes) - 1, 0, -1):
            k = rng.below(j + 1)
            outcomes[j], outcomes[k] = outcomes[k], outcomes[j]
        for k, outcome in enumerate(outcomes):
            w = weights(rng, 0.36, 0.40)
            rej = [[2 + rng.below(3) for _ in range(2)] for _ in range(3)]
            cho = [row[:] for row in rej]
            d, i = rng.below(3), rng.below(2)
            if outcome == "win":
                cho[d][i] += 1
            elif outcome == "loss":
                rej[d][i] += 1
            else:
                # A tie: the same scores, sometimes in another order within a dimension.
                cho[d].reverse()
                rej[d] = sorted(rej[d])
                cho[d] = sorted(cho[d], reverse=rng.below(2) == 1)
            out.append(
                dump(
                    {
                        "variant": variant,
                        "rubric": rubric(w, "p%d" % k),
                        "chosen_scores": cho,
                        "rejected_scores": rej,
                    }
                )
            )
    # Figures 5 and 10: MINT tactics of policy responses by emotion.
    profiles = {
        "MICA": {"paraphrasing": 0.75, "validation": 0.25, "advice": 0.2, "questioning": 0.1},
        "CARE(M)": {
            "paraphrasing": 0.4,
            "questioning": 0.45,
            "reappraisal": 0.35,
            "validation": 0.4,
            "emotional_expression": 0.2,
            "information": 0.3,
            "empowerment": 0.3,
        },
    }
    for variant, probs in profiles.items():
        for emotion in EMOTIONS:
            for _ in range(10):
                tactics = []
                for label, p in probs.items():
                    # Negative emotions draw more validation; joy more empowerment.
                    if label in ("validation", "emotional_expression") and emotion in NEGATIVE:
                        p = min(1.0, p + 0.2)
                    if label == "empowerment" and emotion == "joy":
                        p = min(1.0, p + 0.3)
                    if rng.uniform() < p:
                        tactics.append(label)
                out.append(dump({"variant": variant, "emotion": emotion, "tactics": tactics}))
    # Lines the report must skip, each for a different reason.
    out.append('{"variant":"MICA","emotion":"boredom","tactics":["advice"]}')
    out.append('{"variant":"","turn":4,"format_reward":0,"violations":["not_json"]}')
    out.append(
        dump({"variant": "SFT", "rubric": rubric([40, 35, 25], "x"), "chosen_scores": [[4, 4], [4, 4], [4, 4]]})
    )
    return out


def main():
    text = "".join(line + "\n" for line in lines())
    if sys.argv[1:] == ["--check"]:
        if OUT.read_text(encoding="utf-8") != text:
            print("%s is stale: run python3 scripts/gen-analyze-demo.py" % OUT, file=sys.stderr)
            return 1
        return 0
    if sys.argv[1:]:
        print(__doc__, file=sys.stderr)
        return 2
    OUT.write_text(text, encoding="utf-8")
    print("wrote %s (%d lines, %d bytes)" % (OUT, text.count("\n"), len(text.encode())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
