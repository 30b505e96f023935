"""Turns the console output of `cargo bench -p care-benches` into the README's Markdown table
(median time and median throughput of each benchmark; criterion prints [low median high]).

    cargo bench -p care-benches 2>&1 | tee bench.log
    python3 benches/compare/criterion_table.py bench.log
"""

import re
import sys

ID = re.compile(r"^([a-z_]+/[^\s]+)\s*(time:.*)?$")
NUM = r"([0-9.]+ \S+)"
TIME = re.compile(r"time:\s+\[" + NUM + " " + NUM + " " + NUM + r"\]")
THRPT = re.compile(r"thrpt:\s+\[" + NUM + " " + NUM + " " + NUM + r"\]")


def main(path):
    rows, current, lines_note = [], None, {}
    for line in open(path, encoding="utf-8", errors="replace"):
        line = line.rstrip()
        m = re.match(r"^cli/(\w+): (\d+) MiB input holds (\d+) lines", line)
        if m:
            lines_note[m.group(1)] = int(m.group(3))
            continue
        m = ID.match(line)
        if m and not line.startswith("Benchmarking"):
            current = {"id": m.group(1), "time": None, "thrpt": None}
            rows.append(current)
            line = m.group(2) or ""
        if current is None:
            continue
        t = TIME.search(line)
        if t and current["time"] is None:
            current["time"] = t.group(2)
        h = THRPT.search(line)
        if h and current["thrpt"] is None:
            current["thrpt"] = h.group(2)
    print("| benchmark | median time | median throughput |")
    print("|---|---:|---:|")
    for r in rows:
        if r["time"] is None:
            continue
        extra = ""
        for sub, n in lines_note.items():
            if r["id"].startswith(f"cli/jsonl/{sub}/"):
                secs = to_secs(r["time"])
                extra = f" ({n / secs / 1e3:.1f} k lines/s)"
        print(f"| `{r['id']}` | {r['time']} | {r['thrpt'] or ''}{extra} |")


def to_secs(s):
    v, unit = s.split()
    return float(v) * {"s": 1, "ms": 1e-3, "µs": 1e-6, "us": 1e-6, "ns": 1e-9}[unit]


if __name__ == "__main__":
    main(sys.argv[1])
