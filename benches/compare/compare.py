"""Runs `care` and the Python baselines on the same generated data in one run and prints a
Markdown table of times, rates and ratios. Started by `benches/compare/run.sh`, which builds
everything and makes the venv; see that file for the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402

import baselines as bl  # noqa: E402

try:
    import care_rl  # noqa: E402
except ImportError as e:  # pragma: no cover - a setup error, said plainly
    sys.exit(f"compare.py needs the care_rl package (pip install ./python; run.sh does): {e}")

ROWS = []


def timed(fn, repeat):
    """(median seconds, last result) over `repeat` runs."""
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def row(task, impl, secs, units, unit, base_secs=None, note=""):
    ROWS.append(
        {
            "task": task,
            "impl": impl,
            "secs": secs,
            "rate": units / secs if secs > 0 else float("inf"),
            "unit": unit,
            "speedup": (base_secs / secs) if base_secs else None,
            "note": note,
        }
    )


def fmt_rate(x, unit):
    for div, p in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= div:
            return f"{x / div:.2f} {p}{unit}"
    return f"{x:.1f} {unit}"


def fmt_time(s):
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


def print_table():
    print("| task | implementation | time | rate | care speed-up |")
    print("|---|---|---:|---:|---:|")
    for r in ROWS:
        sp = f"{r['speedup']:.1f}x" if r["speedup"] else ""
        note = f" ({r['note']})" if r["note"] else ""
        print(
            f"| {r['task']} | {r['impl']}{note} | {fmt_time(r['secs'])} | "
            f"{fmt_rate(r['rate'], r['unit'])} | {sp} |"
        )


def run_care(bin_path, sub, path, threads):
    with open(os.devnull, "wb") as null:
        p = subprocess.run(
            [bin_path, sub, "--no-progress", "--threads", str(threads), path],
            stdout=null,
            stderr=subprocess.PIPE,
        )
    if p.returncode != 0:
        raise RuntimeError(f"care {sub} failed ({p.returncode}): {p.stderr.decode()[:300]}")


def care_format_rewards(bin_path, lines):
    """care's r_fmt for the given JSONL lines (to check that everyone agrees)."""
    p = subprocess.run(
        [bin_path, "validate", "--no-progress", "-"],
        input="".join(lines).encode(),
        capture_output=True,
    )
    if p.returncode != 0:
        raise RuntimeError(p.stderr.decode()[:300])
    return [int(json.loads(x)["format_reward"]) for x in p.stdout.decode().splitlines()]


def rubric_rows(args, care_bin):
    vpath = str(Path(args.data) / "validate.jsonl")
    size = os.path.getsize(vpath)
    with open(vpath, encoding="utf-8") as f:
        head = [next(f) for _ in range(100)]
    lines = sum(1 for _ in open(vpath, "rb"))
    mb = size / 2**20
    print(f"# validate: {vpath}: {lines} lines, {mb:.0f} MiB", file=sys.stderr)

    with open(os.devnull, "w") as null:
        t_py, _ = timed(lambda: bl.run_validate_handwritten(vpath, null), 1)
        t_pd, _ = timed(lambda: bl.run_validate_pydantic(vpath, null), 1)
    row("validate JSONL", "Python json + hand-written checks", t_py, size, "B/s")
    row("validate JSONL", "Python pydantic v2 model", t_pd, size, "B/s")

    # Do all three agree on the 100-rubric mix? (care_rl.format_reward is the library verdict.)
    texts = [json.loads(x)["text"] for x in head]
    lib_r = [int(care_rl.format_reward(t)) for t in texts]
    hand_r = [bl.validate_handwritten(t)[0] for t in texts]
    model = bl.make_pydantic_model()
    pyd_r = []
    for t in texts:
        try:
            model.model_validate_json(t)
            pyd_r.append(1)
        except Exception:
            pyd_r.append(0)
    same_hand = sum(a == b for a, b in zip(lib_r, hand_r))
    same_pyd = sum(a == b for a, b in zip(lib_r, pyd_r))
    agree = (
        f"r_fmt agreement with care on the 100-rubric mix: hand-written {same_hand}/100, "
        f"pydantic {same_pyd}/100 (care: {sum(lib_r)} valid)"
    )
    print("# " + agree, file=sys.stderr)

    if care_bin:
        try:
            cli_r = care_format_rewards(care_bin, head)
            same_cli = sum(a == b for a, b in zip(cli_r, lib_r))
            print(f"# care validate CLI agrees with care_rl on {same_cli}/100", file=sys.stderr)
            for threads, label in ((1, "1 thread"), (0, "all cores")):
                t, _ = timed(lambda: run_care(care_bin, "validate", vpath, threads), args.repeat)
                row("validate JSONL", f"`care validate` ({label})", t, size, "B/s", t_py,
                    f"vs hand-written; {t_pd / t:.1f}x vs pydantic")  # fmt: skip
        except (RuntimeError, OSError) as e:
            print(f"# care validate not measured: {e}", file=sys.stderr)
    return agree


def score_rows(args, care_bin):
    spath = str(Path(args.data) / "score.jsonl")
    size = os.path.getsize(spath)
    with open(os.devnull, "w") as null:
        t_py, n_resp = timed(lambda: bl.run_score(spath, null), 1)
    row("score JSONL (groups of 6)", "Python json + checks + Eq. 5", t_py, n_resp, "responses/s")
    if care_bin:
        try:
            for threads, label in ((1, "1 thread"), (0, "all cores")):
                t, _ = timed(lambda: run_care(care_bin, "score", spath, threads), args.repeat)
                row("score JSONL (groups of 6)", f"`care score` ({label})", t, n_resp,
                    "responses/s", t_py)  # fmt: skip
        except (RuntimeError, OSError) as e:
            print(f"# care score not measured: {e}", file=sys.stderr)
    print(f"# score: {spath}: {size / 2**20:.0f} MiB, {n_resp} responses", file=sys.stderr)


def advantage_rows(args):
    rng = np.random.default_rng(0)
    for n, g in ((8192, 16), (1 << 20, 64), (1 << 22, 64)):
        r = (rng.integers(0, 31, n) / 30).astype(np.float32)

        def care():
            return care_rl.group_advantages(r, g, preset="verl")

        rep = max(args.repeat, 5)
        t_np, a_np = timed(lambda: bl.advantages_numpy(r, g), rep)
        index = np.repeat(np.arange(n // g), g).tolist()
        r_list = r.tolist()
        t_loop, a_loop = timed(
            lambda: bl.advantages_verl_loop(np.asarray(r_list), index), 1 if n > 10**5 else rep
        )
        t_c, a_c = timed(care, rep)
        # verl's loop gives A = r / (1 + eps) to singleton groups, which never occur here.
        err = max(float(np.abs(a_c - a_np).max()), float(np.abs(a_c - a_loop).max()))
        task = f"advantages N={n}, G={g}"
        row(task, "numpy vectorized (reshape, mean, std ddof=1)", t_np, n, "samples/s")
        row(task, "Python per-group loop (verl reference style)", t_loop, n, "samples/s")
        row(task, "care_rl.group_advantages (numpy API, 1 core)", t_c, n, "samples/s", t_np,
            f"vs numpy; {t_loop / t_c:.0f}x vs loop; max abs diff {err:.1e}")  # fmt: skip


def loss_rows(args):
    rng = np.random.default_rng(1)
    seq = 1024
    for t in (1 << 20, 1 << 22):
        b = t // seq
        logp = -(rng.random(t, dtype=np.float32) * 4)
        old = (logp + 0.15 * rng.standard_normal(t).astype(np.float32)).astype(np.float32)
        offs = (np.arange(b + 1) * seq).astype(np.uint32)
        mask = (np.arange(t) % seq >= seq // 10).astype(np.uint8)
        adv = rng.standard_normal(b).astype(np.float32)

        def care():
            # The SPEC defaults: token_mean, eps 0.2 / 0.2, log-ratio clamp 20 (as loss_numpy).
            res = care_rl.policy_loss(logp, old, adv, offs, mask)
            return res.loss, res.grad

        rep = max(args.repeat, 5)
        t_np, (l_np, g_np) = timed(lambda: bl.loss_numpy(logp, old, adv, offs, mask), rep)
        t_c, (l_c, g_c) = timed(care, rep)
        err = float(np.abs(g_c - g_np).max())
        task = f"loss + grad T={t >> 20}M tokens (f32)"
        row(task, "numpy vectorized", t_np, t, "tokens/s")
        row(task, "care_rl.policy_loss (numpy API, 1 core)", t_c, t, "tokens/s", t_np,
            f"vs numpy; loss diff {abs(l_c - l_np):.1e}, max grad diff {err:.1e}")  # fmt: skip


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="folder with validate.jsonl and score.jsonl")
    ap.add_argument("--care", default=str(ROOT / "target/release/care"))
    ap.add_argument("--repeat", type=int, default=3, help="runs per care measurement (median)")
    ap.add_argument("--only", choices=["rubric", "grpo"], default=None)
    args = ap.parse_args()
    care_bin = args.care if Path(args.care).exists() else None
    if care_bin is None:
        print(f"# {args.care} not found: care CLI rows skipped", file=sys.stderr)
    agree = ""
    if args.only in (None, "rubric"):
        agree = rubric_rows(args, care_bin)
        score_rows(args, care_bin)
    if args.only in (None, "grpo"):
        advantage_rows(args)
        loss_rows(args)
    cpu = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    print(
        f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {cpu}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, numpy {np.__version__}, care_rl {care_rl.__version__}"
        + (f", pydantic {__import__('pydantic').VERSION}" if args.only != "grpo" else "")
        + f". Python file rows: one run; care rows: median of {args.repeat} "
        "(advantages/loss: median of max(repeat, 5); the 1M+ verl-loop rows one run).\n"
    )
    if agree:
        print(agree + "\n")
    print_table()


if __name__ == "__main__":
    main()
