#!/usr/bin/env bash
# The measurements behind BENCHMARKS.md's generated tables, on a machine with an NVIDIA GPU:
# each `nsa bench` suite into DIR/nsa_<suite>.json, then (with PEERS, a copy of
# ../shared/peers) the peer libraries into DIR/peers.json, the dense suite's torch
# peers into DIR/torch_dense.json (where torch is installed), in the same call, and
# DIR/commands.json naming what ran; top-k also on N(0, 1) values and on the indexer's own
# logits, whose rows the top-k peers are timed on too (DIR/peers_topk_values.json). Then,
# where Rust runs:
#   python3 .ci/bench/report.py --results DIR --write BENCHMARKS.md
# and copy DIR's files into .ci/bench/results/.
#   NSA=path/to/nsa PEERS=peers bash .ci/bench/measure.sh DIR [suite ...]
# Suites default to every family with a table: topk decode prefill dense indexer kv plan metadata layer.
# Each suite runs under SUITE_TIMEOUT seconds (120); the peers under PEERS_BUDGET_S (their default).
set -u
dir=${1:?usage: measure.sh DIR [suite ...]}
shift
suites=${*:-topk decode prefill dense indexer kv plan metadata layer}
nsa=${NSA:-nsa}
mkdir -p "$dir"
declare -A args=(
  [topk]="--topk-chosen-only --topk-page-sizes 1,64"
)
commands="{"
for s in $suites; do
  start=$SECONDS
  timeout "${SUITE_TIMEOUT:-120}" "$nsa" bench --suite "$s" ${args[$s]:-} --json "$dir/nsa_$s.json" > "$dir/nsa_$s.txt" 2>&1
  echo "nsa bench --suite $s: rc $? in $((SECONDS - start)) s"
  cmd="nsa bench --suite $s ${args[$s]:+${args[$s]} }--json"
  [ -n "${PEERS:-}" ] && case $s in decode | prefill | indexer) cmd="$cmd, then bash peers/run.sh, one call" ;; esac
  if [ "$s" = topk ]; then
    # The same shapes on N(0, 1) values and on the indexer's own logits (dumped for the peers).
    for values in gaussian indexer; do
      dump=""
      [ "$values" = indexer ] && dump="--topk-dump $dir/topk_scores"
      timeout "${SUITE_TIMEOUT:-120}" "$nsa" bench --suite topk ${args[topk]} --topk-values $values $dump \
        --json "$dir/nsa_topk_$values.json" > "$dir/nsa_topk_$values.txt" 2>&1
      echo "nsa bench --suite topk --topk-values $values: rc $?"
    done
    cmd="$cmd, the same with --topk-values gaussian and with --topk-values indexer --topk-dump DIR"
    [ -n "${PEERS:-}" ] && cmd="$cmd, then bash peers/run.sh and python3 .ci/bench/peers_topk_values.py on the dumped rows, one call"
  fi
  if [ "$s" = dense ]; then
    OUT="$dir" timeout "${SUITE_TIMEOUT:-120}" python3 "$(dirname "$0")/torch_dense.py" > "$dir/torch_dense.txt" 2>&1
    echo "torch dense peers: rc $?"
    cmd="$cmd, then python3 .ci/bench/torch_dense.py, one call"
  fi
  commands="$commands\"$s\": \"${cmd//  / }\", "
done
echo "${commands%, }}" > "$dir/commands.json"
if [ -n "${PEERS:-}" ]; then
  OUT="$dir" bash "$PEERS/run.sh" > "$dir/peers.txt" 2>&1
  echo "peers: rc $? ($(grep -c '"peer"' "$dir/peers.json" 2>/dev/null || echo 0) rows)"
  if [ -d "$dir/topk_scores" ]; then
    PYTHONPATH=/tmp/peers_site:/tmp/peers_work/fi_site${PYTHONPATH:+:$PYTHONPATH} python3 "$(dirname "$0")/peers_topk_values.py" \
      --scores "$dir/topk_scores" --peers "$PEERS" --json "$dir/peers_topk_values.json" > "$dir/peers_topk_values.txt" 2>&1
    echo "top-k peers on the indexer's logits: rc $?"
    rm -rf "$dir/topk_scores"
  fi
fi
