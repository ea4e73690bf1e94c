#!/usr/bin/env bash
# A/B of nsa builds on one GPU in one call: each build runs the same `nsa bench`
# arguments ROUNDS times, the builds alternating inside every round, so drift and
# the power cap's clock changes fall on all of them alike (an H100 running the dense
# kernels sits at its 700 W cap, 1.45-1.6 GHz). Every build keeps its own kernel
# cache and runs once untimed first (its compiles). nvidia-smi logs the SM clock,
# power and throttle reasons meanwhile (DIR/clocks.csv). Then ab_report.py prints
# each row's median per build and its ratio to the first build.
#   bash .ci/bench/ab.sh DIR ROUNDS '--suite dense' path/to/nsa-a path/to/nsa-b [...]
# Builds are named by their file names (which must differ); DIR/<name>_<round>.json
# holds each run. Each run is bounded by RUN_TIMEOUT seconds (120).
set -u
dir=${1:?usage: ab.sh DIR ROUNDS 'BENCH ARGS' NSA_A NSA_B [...]}
rounds=${2:?rounds}
args=${3:?nsa bench arguments}
shift 3
[ $# -ge 2 ] || { echo "ab.sh: give at least two builds to compare" >&2; exit 2; }
mkdir -p "$dir"
names=()
for bin in "$@"; do
  name=$(basename "$bin")
  for seen in "${names[@]}"; do
    [ "$seen" != "$name" ] || { echo "ab.sh: two builds named $name; copy them to distinct names" >&2; exit 2; }
  done
  names+=("$name")
done
cache_of() { echo "$dir/cache_$1"; }
for bin in "$@"; do
  name=$(basename "$bin")
  NSA_CACHE_DIR=$(cache_of "$name") timeout "${RUN_TIMEOUT:-120}" "$bin" bench $args > "$dir/${name}_warmup.txt" 2>&1
  echo "$name warm-up: rc $?"
done
smi=""
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active \
    --format=csv -lms 250 > "$dir/clocks.csv" 2>&1 &
  smi=$!
fi
for round in $(seq 1 "$rounds"); do
  for bin in "$@"; do
    name=$(basename "$bin")
    NSA_CACHE_DIR=$(cache_of "$name") timeout "${RUN_TIMEOUT:-120}" "$bin" bench $args \
      --json "$dir/${name}_$round.json" > "$dir/${name}_$round.txt" 2>&1
    echo "$name round $round: rc $?"
  done
done
[ -n "$smi" ] && kill "$smi"
python3 "$(dirname "$0")/ab_report.py" "$dir" "${names[@]}"
