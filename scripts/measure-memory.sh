#!/usr/bin/env bash
# Peak resident memory of `care` on the largest legal lines (16 MiB, the default
# --max-line-bytes), for the three subcommands whose output grows fastest per input byte.
# docs/RELIABILITY.md ("Streaming") quotes this script's output.
#
#   bash scripts/measure-memory.sh [path/to/care]   (default: builds target/release/care)
set -euo pipefail
cd "$(dirname "$0")/.."
care=${1:-}
if [[ -z "$care" ]]; then
    cargo build --release -q -p care-cli
    care=target/release/care
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

python3 - "$dir" <<'EOF'
import sys
d = sys.argv[1]
limit = 16 << 20  # the default --max-line-bytes

def fill(prefix, item, suffix):
    # As many copies of `item` as fit in one line of at most `limit` bytes.
    n = (limit - len(prefix) - len(suffix)) // len(item)
    return prefix + item * n + suffix

# advantages: singleton groups, the largest output per input byte (two output arrays).
adv = fill('{"group_size":1,"rewards":[', '0,', '0]}')
# loss: one sequence of n tokens, logp and logp_old per token ("0," each), one advantage.
n = (limit - 100) // 4
zeros = ",".join(["0"] * n)
loss = '{"seq_offsets":[0,%d],"advantages":[1],"logp":[%s],"logp_old":[%s]}' % (n, zeros, zeros)
# score: the paper's rubric_sft_1 (bundled), a group of score matrices.
import json
rubric = json.load(open("cli/data/rubric_sft_1.json"))
matrix = [[5] * len(c["criteria"]) for c in rubric["categories"]]
resp = json.dumps({"scores": matrix}, separators=(",", ":"))
score = fill('{"rubric":%s,"responses":[' % json.dumps(rubric, separators=(",", ":")),
             resp + ",", resp + "]}")
for name, line in (("advantages", adv), ("loss", loss), ("score", score)):
    assert len(line) <= limit, name
    with open(f"{d}/{name}.jsonl", "w") as f:
        f.write(line + "\n")
EOF

# The output is at most --max-line-bytes too: a longer one is stopped while it is written and
# replaced by an `output_too_long` error line, which is the worst case for memory.
printf '| subcommand | input line | answer | peak RSS |\n|---|---|---|---|\n'
for sub in advantages loss score; do
    in=$dir/$sub.jsonl
    /usr/bin/time -f '%M' -o "$dir/rss" "$care" "$sub" --threads 2 "$in" >"$dir/out" 2>/dev/null || true
    answer=$(head -c 200 "$dir/out" | grep -o '"code":"[a-z_]*"' | head -1 | cut -d'"' -f4 || true)
    answer=${answer:-"$(printf '%.1f' "$(echo "$(stat -c %s "$dir/out") / 1048576" | bc -l)") MiB"}
    printf '| `%s` | %.1f MiB | %s | %d MB |\n' "$sub" \
        "$(echo "$(stat -c %s "$in") / 1048576" | bc -l)" "$answer" "$(( $(cat "$dir/rss") / 1000 ))"
done
