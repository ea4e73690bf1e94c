#!/usr/bin/env bash
# What programmatic dependent launch (PDL) would save on back-to-back top-k launches,
# before the product launches anything that way: for each issue shape's chosen kernel,
# nvcc builds the rendered source as it is (A) and with `griddepcontrol.wait` then
# `griddepcontrol.launch_dependents` at the top of the kernel (B). topk_cubin_ab.cu
# times A against B twice: both launched plainly (what the two instructions cost), then
# B with programmatic stream serialization (what the overlap of a launch with the
# previous kernel's run saves). Every timing's output is checked. On the GPU machine,
# from the repository root:
#   bash .ci/bench/topk_pdl_probe.sh path/to/nsa [work dir]
# Not part of the product or of CI.
set -euo pipefail
nsa="$1"
work="${2:-$(mktemp -d)}"
mkdir -p "$work"
nvcc -std=c++17 -O3 -arch=sm_90a -I kernels/include -o "$work/ab" .ci/bench/topk_cubin_ab.cu -lcuda

# id, rows, keys per row, CTAs per row
cases=(
  "topk_cluster.k2048.plain.c8.sm_90a 1 131072 8"
  "topk_cluster.k2048.paged.c8.sm_90a 1 131072 8"
  "topk.k2048.plain.sm_90a 64 131072 1"
  "topk.k2048.plain.tput.sm_90a 2048 32768 1"
)
for c in "${cases[@]}"; do
  read -r id rows n per_row <<<"$c"
  info="$("$nsa" inspect "$id")"
  field() { sed -n "s/^$1: *//p" <<<"$info"; }
  source="$(field source)"
  symbol="$(field symbol)"
  threads="$(field launch | awk '{print $1}')"
  smem="$(field launch | awk '{print $5}')"
  # The kernel's opening line ends its parameter list with `status) {`.
  sed '/nsa::u32\* status) {$/a\  asm volatile("griddepcontrol.wait;" ::: "memory");\n  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");' \
    "$source" >"$work/$id.pdl.cu"
  if [ "$(grep -c griddepcontrol "$work/$id.pdl.cu")" != 2 ]; then
    echo "$id: no kernel opening line found in $source" >&2
    exit 1
  fi
  nvcc -cubin -arch=sm_90a -std=c++17 -O3 -I kernels/include -o "$work/$id.a.cubin" "$source"
  nvcc -cubin -arch=sm_90a -std=c++17 -O3 -I kernels/include -o "$work/$id.pdl.cubin" "$work/$id.pdl.cu"
  for mode in plain pdl; do
    "$work/ab" "$rows" "$n" "$per_row" "$threads" "$smem" "$symbol" "$work/$id.a.cubin" "$work/$id.pdl.cubin" 200 "$mode"
  done
done
