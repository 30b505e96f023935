#!/usr/bin/env bash
# Instructions a `care serve` process executes per group (8 responses, an instant stub LLM),
# counted by callgrind on that process alone: the load test (stub + one client) runs in another
# process and drives it. Two runs of N1 and N2 groups; (count(N2) - count(N1)) / (N2 - N1)
# leaves out start-up and shut-down. Instruction counts do not depend on the machine's load.
# docs/PERFORMANCE.md ("Reward server") quotes this script's output.
#
#   bash scripts/serve-instructions.sh [none|sqlite|redis] [N1 N2] [path/to/care]
#
# Note: valgrind hides SHA extensions from the program, so SHA-256 (the cache keys) runs its
# portable code here; on a CPU with SHA-NI it costs a fraction of what the count shows.
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${1:-sqlite}
n1=${2:-20}
n2=${3:-60}
care=${4:-}
target=${CARGO_TARGET_DIR:-target}
if [[ -z "$care" ]]; then
    cargo build --release -q -p care-cli --bin care
    care=$target/release/care
fi
cargo build --release -q -p care-loop --example loadtest
loadtest=$target/release/examples/loadtest
command -v valgrind >/dev/null || { echo "valgrind is needed" >&2; exit 2; }

dir=$(mktemp -d)
redis_pid=""
cleanup() {
    [[ -n "$redis_pid" ]] && kill "$redis_pid" 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
serve_port=$(free_port)
stub_port=$(free_port)
cat > "$dir/loop.json" <<JSON
{"generator": {"base_url": "http://127.0.0.1:$stub_port/v1", "model": "g", "max_concurrency": 1024, "timeout_secs": 600},
 "judge": {"base_url": "http://127.0.0.1:$stub_port/v1", "model": "j", "max_concurrency": 1024, "timeout_secs": 600}}
JSON
case $cache in
    none) cache_args=(--no-cache) ;;
    sqlite) cache_args=(--cache "$dir/cache.sqlite") ;;
    redis)
        redis_port=$(free_port)
        redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
            --daemonize no --logfile "$dir/redis.log" &
        redis_pid=$!
        sleep 0.5
        cache_args=(--cache "redis://127.0.0.1:$redis_port/0")
        ;;
    *) echo "cache: none, sqlite or redis" >&2; exit 2 ;;
esac

count() {
    local n=$1
    rm -f "$dir"/cache.sqlite*
    [[ -n "$redis_pid" ]] && redis-cli -p "$redis_port" flushall >/dev/null
    valgrind --tool=callgrind --callgrind-out-file="$dir/cg.$n" "$care" serve \
        --config "$dir/loop.json" --listen "127.0.0.1:$serve_port" "${cache_args[@]}" \
        2>"$dir/serve.$n.log" &
    local pid=$!
    "$loadtest" --servers "http://127.0.0.1:$serve_port" --stub-listen "127.0.0.1:$stub_port" \
        --clients 1 --requests "$n" --group 8 --generator-ms 0 --judge-ms 0 --max-seconds 900 \
        >/dev/null
    kill -INT "$pid"
    wait "$pid" || true
    callgrind_annotate "$dir/cg.$n" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}'
}
c1=$(count "$n1")
c2=$(count "$n2")
echo "care serve, cache $cache: $c1 instructions for $n1 groups, $c2 for $n2: $(((c2 - c1) / (n2 - n1))) per group of 8"
