#!/usr/bin/env bash
# NVRTC's CUBIN (the product's, from the nsa cache) against nvcc's build of the same
# rendered source, for the chosen top-k kernel of each issue shape, through one
# launch path (topk_cubin_ab.cu). On the GPU machine, from the repository root:
#   bash .ci/bench/topk_cubin_ab.sh path/to/nsa [work dir]
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
  "topk.k2048.paged.sm_90a 64 131072 1"
  "topk.k2048.plain.tput.sm_90a 2048 32768 1"
  "topk.k2048.paged.tput.sm_90a 2048 32768 1"
)
for c in "${cases[@]}"; do
  read -r id rows n per_row <<<"$c"
  info="$("$nsa" inspect "$id")"
  field() { sed -n "s/^$1: *//p" <<<"$info"; }
  source="$(field source)"
  symbol="$(field symbol)"
  threads="$(field launch | awk '{print $1}')"
  smem="$(field launch | awk '{print $5}')"
  image="$(dirname "$source")/image.bin"
  nvcc -cubin -arch=sm_90a -std=c++17 -O3 -I kernels/include -o "$work/$id.nvcc.cubin" "$source"
  "$work/ab" "$rows" "$n" "$per_row" "$threads" "$smem" "$symbol" "$image" "$work/$id.nvcc.cubin" 200
done
