#!/usr/bin/env bash
# Two builds of each issue shape's chosen top-k kernel, timed through one launch path
# (topk_cubin_ab.cu), interleaved, every output checked. On the GPU machine, from the
# repository root:
#   bash .ci/bench/topk_cubin_ab.sh path/to/nsa [work dir] [pdl]
# Default: NVRTC's CUBIN (the product's, from the nsa cache) against nvcc's build of
# the same rendered source, which separates code generation from the launch path.
# `pdl`: what programmatic dependent launch would save, before the product launches
# anything that way. nvcc builds the source as rendered (A) and with
# `griddepcontrol.wait` then `griddepcontrol.launch_dependents` at the top of the
# kernel (B); A runs against B launched plainly (what the two instructions cost), then
# against B launched with programmatic stream serialization (what overlapping a
# launch with the previous kernel's run saves).
# Not part of the product or of CI.
set -euo pipefail
nsa="$1"
work="${2:-$(mktemp -d)}"
mode="${3:-codegen}"
mkdir -p "$work"
nvcc -std=c++17 -O3 -arch=sm_90a -I kernels/include -o "$work/ab" .ci/bench/topk_cubin_ab.cu -lcuda
build() { nvcc -cubin -arch=sm_90a -std=c++17 -O3 -I kernels/include -o "$1" "$2"; }

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
  ab() { "$work/ab" "$rows" "$n" "$per_row" "$threads" "$smem" "$symbol" "$1" "$2" 200 "${3:-}"; }
  if [ "$mode" = pdl ]; then
    # The kernel's opening line ends its parameter list with `status) {`.
    sed '/nsa::u32\* status) {$/a\  asm volatile("griddepcontrol.wait;" ::: "memory");\n  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");' \
      "$source" >"$work/$id.pdl.cu"
    if [ "$(grep -c griddepcontrol "$work/$id.pdl.cu")" != 2 ]; then
      echo "$id: no kernel opening line found in $source" >&2
      exit 1
    fi
    build "$work/$id.nvcc.cubin" "$source"
    build "$work/$id.pdl.cubin" "$work/$id.pdl.cu"
    ab "$work/$id.nvcc.cubin" "$work/$id.pdl.cubin"
    ab "$work/$id.nvcc.cubin" "$work/$id.pdl.cubin" pdl
  else
    build "$work/$id.nvcc.cubin" "$source"
    ab "$(dirname "$source")/image.bin" "$work/$id.nvcc.cubin"
  fi
done
