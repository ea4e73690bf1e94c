#!/usr/bin/env bash
# Provisions what nsa needs besides Rust, then runs the given command:
#   bash .ci/env.sh <command...>
# - NVRTC 13.0.88 (official pip wheel nvidia-cuda-nvrtc) into .nsa-tools/, exported
#   as NSA_NVRTC_PATH so nsa finds it without LD_LIBRARY_PATH;
# - clang-19 + lld-19 (Debian) for the offline gfx942 (ROCm) compile, when root and missing.
# Idempotent: a second run finds everything in place and only runs the command.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
nvrtc_version="13.0.88"
tools="$root/.nsa-tools"
nvrtc_dir="$tools/nvrtc-$nvrtc_version"
nvrtc_lib="$nvrtc_dir/nvidia/cu13/lib"

if [ ! -f "$nvrtc_lib/libnvrtc.so.13" ] || [ ! -f "$nvrtc_lib/libnvrtc-builtins.so.13.0" ]; then
  echo "[nsa] installing nvidia-cuda-nvrtc==$nvrtc_version into $nvrtc_dir" >&2
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps \
    --target "$nvrtc_dir.partial" "nvidia-cuda-nvrtc==$nvrtc_version"
  rm -rf "$nvrtc_dir" && mv "$nvrtc_dir.partial" "$nvrtc_dir"
fi
export NSA_NVRTC_PATH="$nvrtc_lib"

if [ -z "${NSA_HIP_CLANG:-}" ] && ! command -v clang-19 >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[nsa] installing clang-19 and lld-19 (Debian) for the gfx942 offline compile" >&2
    { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang-19 lld-19 >/dev/null; } ||
      echo "[nsa] apt-get install clang-19 lld-19 failed: gfx942 tests will fail (NSA_SKIP_HIP=1 skips them knowingly)" >&2
  else
    echo "[nsa] clang-19 not found and cannot apt-get install it (not root): gfx942 tests will fail; set NSA_SKIP_HIP=1 to skip them knowingly" >&2
  fi
fi

exec "$@"
