"""`care validate` and `care score` end to end on each command-line input shape, against the
Python baselines of baselines.py, in one run: MB/s per implementation, care's speed-up over
each baseline, the two-thread scaling and care's peak RSS. Started by `benches/compare/shapes.sh`,
which builds `care`, generates the files and makes the venv; see that file for the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import baselines as bl  # noqa: E402

VALIDATE = ["objects", "text", "pretty", "mixed30"]
SCORE = ["score-scores", "score-judge", "score-group8"]


def run_care(care, sub, path, threads):
    """(seconds, peak RSS in MiB) of one `care` run with output to /dev/null."""
    with open(os.devnull, "wb") as null:
        t0 = time.perf_counter()
        p = subprocess.Popen(
            [care, sub, "--no-progress", "--threads", str(threads), path],
            stdout=null,
            stderr=subprocess.PIPE,
        )
        _, status, usage = os.wait4(p.pid, 0)
        secs = time.perf_counter() - t0
        err = p.stderr.read().decode()[:300]
        p.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"care {sub} failed: {err}")
    return secs, usage.ru_maxrss / 1024


def care_median(care, sub, path, threads, repeat):
    runs = [run_care(care, sub, path, threads) for _ in range(repeat)]
    return statistics.median(t for t, _ in runs), max(m for _, m in runs)


def python_once(fn, path):
    with open(os.devnull, "w") as null:
        t0 = time.perf_counter()
        fn(path, null)
        return time.perf_counter() - t0


def agreement(care, path, n=200):
    """How many of the first n lines get the same r_fmt from care and the hand-written check."""
    with open(path, encoding="utf-8") as f:
        head = [next(f) for _ in range(n)]
    p = subprocess.run(
        [care, "validate", "--no-progress", "-"], input="".join(head).encode(), capture_output=True
    )
    cli = [json.loads(x).get("format_reward") for x in p.stdout.decode().splitlines()]
    py = [bl.validate_line_any(x)[0] for x in head]
    return sum(a == b for a, b in zip(cli, py))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="folder with shape-<name>.jsonl files")
    ap.add_argument("--care", default=str(ROOT / "target/release/care"))
    ap.add_argument("--repeat", type=int, default=3, help="runs per care measurement (median)")
    ap.add_argument("--shapes", default=",".join(VALIDATE + SCORE))
    ap.add_argument("--no-python", action="store_true", help="care rows only")
    args = ap.parse_args()
    try:
        import pydantic  # noqa: F401

        have_pydantic = True
    except ImportError:
        have_pydantic = False
        print("# pydantic not installed: its rows are skipped", file=sys.stderr)

    print("| shape | implementation | time | MB/s | care 1 thread vs this | peak RSS |")
    print("|---|---|---:|---:|---:|---:|")
    for shape in args.shapes.split(","):
        path = str(Path(args.data) / f"shape-{shape}.jsonl")
        size = os.path.getsize(path)
        sub = "validate" if shape in VALIDATE else "score"
        rows = []
        t1, m1 = care_median(args.care, sub, path, 1, args.repeat)
        t2, m2 = care_median(args.care, sub, path, 2, args.repeat)
        rows.append((f"`care {sub} --threads 1`", t1, f"{m1:.0f} MiB"))
        rows.append((f"`care {sub} --threads 2` ({t1 / t2:.2f}x 1 thread)", t2, f"{m2:.0f} MiB"))
        if not args.no_python:
            if sub == "validate":
                rows.append(("Python json + hand-written checks", python_once(bl.run_validate_any, path), ""))
                if have_pydantic:
                    rows.append(("Python pydantic v2 model", python_once(bl.run_validate_pydantic_any, path), ""))
                print(f"# {shape}: care and hand-written agree on r_fmt for {agreement(args.care, path)}/200 lines",
                      file=sys.stderr)  # fmt: skip
            else:
                rows.append(("Python json + checks + Eq. 5", python_once(bl.run_score_any, path), ""))
        for impl, secs, rss in rows:
            mbs = size / secs / 1e6
            ratio = "" if impl.startswith("`care") else f"{secs / t1:.1f}x"
            print(f"| {shape} ({size / 2**20:.0f} MiB) | {impl} | {secs:.2f} s | {mbs:.0f} | "
                  f"{ratio} | {rss} |")  # fmt: skip
        sys.stdout.flush()


if __name__ == "__main__":
    main()
