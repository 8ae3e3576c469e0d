#!/usr/bin/env bash
# Runs every basalt-bench workload of docs/benchmarks.md against a server that already holds the
# load phase's records (basalt-bench --workload load --records $RECORDS), one after the other.
# Before each run it waits (up to ~90 s) for the 1-minute load average to drop below 0.7 and
# writes the load average it started with into the run's log: figures from a busy machine are
# not comparable. Usage: e2e/loadgen/run-workloads.sh [endpoint] [output dir]
set -uo pipefail
ENDPOINT=${1:-127.0.0.1:18086}
OUT=${2:-/tmp/basalt-bench-runs}
RECORDS=${RECORDS:-1000000}
B=${BENCH_BIN:-${CARGO_TARGET_DIR:-$(cd "$(dirname "$0")/../.." && pwd)/target}/release/basalt-bench}
mkdir -p "$OUT"

wait_quiet() {
  for _ in $(seq 1 18); do
    l=$(cut -d' ' -f1 /proc/loadavg)
    awk "BEGIN{exit !($l < 0.7)}" && break
    sleep 5
  done
  echo "load before: $(cat /proc/loadavg)"
}

run() {
  local name=$1
  shift
  {
    wait_quiet
    echo "cmd: basalt-bench $*"
    "$B" --endpoint "$ENDPOINT" --records "$RECORDS" --progress 0 "$@"
  } > "$OUT/$name.log" 2>&1
  echo "$name: $(grep -v '^{' "$OUT/$name.log" | grep -E '^(load before|errors)' | tr '\n' ' ')"
}

run read       --workload read --concurrency 32 --duration 15
run read64     --workload read --concurrency 64 --duration 15
run write      --workload write --concurrency 64 --duration 15
run write1     --workload write --concurrency 1 --duration 10
run batch      --workload batch-write --batch 100 --concurrency 16 --duration 15
run batchnogc  --workload batch-write --batch 100 --concurrency 16 --duration 15 --max-versions 0 --table projects/bench/instances/bench/tables/nogc
run scan       --workload scan --scan-rows 100 --concurrency 16 --duration 15
run scan1000   --workload scan --scan-rows 1000 --concurrency 8 --duration 15
for w in a b c d e f; do
  run "ycsb-$w" --workload "ycsb-$w" --concurrency 32 --duration 15
done
run seqwrite   --workload write --distribution sequential --key-order ordered --concurrency 64 --duration 10 --table projects/bench/instances/bench/tables/ordered
