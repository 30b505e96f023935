#!/usr/bin/env bash
# Wall-clock latency of `care serve` binaries against one another: each binary runs as its own
# process with an instant stub LLM, driven by the load test (stub + clients in one process),
# the binaries alternated ROUNDS times. Prints the load test's row (p50 and p99 of a group over
# the stub, requests/s) and the server process's CPU time per group (user and system, from
# /proc). docs/PERFORMANCE.md ("Reward server") quotes it; run it on a quiet machine.
#
#   bash scripts/serve-latency.sh CACHE(none|sqlite) GROUPS CLIENTS ROUNDS care [care ...]
#   e.g. bash scripts/serve-latency.sh sqlite 2000 1 3 /tmp/care-main target/release/care
set -euo pipefail
cd "$(dirname "$0")/.."
cache=$1; groups=$2; clients=$3; rounds=$4; shift 4
[[ $# -ge 1 ]] || { echo "give at least one care binary" >&2; exit 2; }
target=${CARGO_TARGET_DIR:-target}
cargo build --release -q -p care-loop --example loadtest
loadtest=$target/release/examples/loadtest
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ticks=$(getconf CLK_TCK)
for round in $(seq "$rounds"); do
    for care in "$@"; do
        dir=$(mktemp -d)
        serve_port=$(free_port)
        stub_port=$(free_port)
        cat > "$dir/loop.json" <<JSON
{"generator": {"base_url": "http://127.0.0.1:$stub_port/v1", "model": "g", "max_concurrency": 1024, "timeout_secs": 60},
 "judge": {"base_url": "http://127.0.0.1:$stub_port/v1", "model": "j", "max_concurrency": 1024, "timeout_secs": 60}}
JSON
        case $cache in
            none) cache_args=(--no-cache) ;;
            sqlite) cache_args=(--cache "$dir/cache.sqlite") ;;
            *) echo "cache: none or sqlite" >&2; exit 2 ;;
        esac
        "$care" serve --config "$dir/loop.json" --listen "127.0.0.1:$serve_port" "${cache_args[@]}" 2>/dev/null &
        pid=$!
        row=$("$loadtest" --servers "http://127.0.0.1:$serve_port" --stub-listen "127.0.0.1:$stub_port" \
            --clients "$clients" --requests "$groups" --group 8 --generator-ms 0 --judge-ms 0 | tail -1)
        read -r user sys < <(awk '{print $14, $15}' "/proc/$pid/stat")
        kill -INT "$pid"
        wait "$pid" || true
        rm -rf "$dir"
        cpu=$(python3 -c "print(f'{($user + $sys) / $ticks / $groups * 1e3:.2f} ms CPU per group ({$user / $ticks / $groups * 1e3:.2f} user, {$sys / $ticks / $groups * 1e3:.2f} system)')")
        echo "round $round $care: $row care serve: $cpu"
    done
done
