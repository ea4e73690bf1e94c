#!/usr/bin/env bash
# The Python package's GPU checks in one go, on a machine with an NVIDIA GPU and
# torch but no Rust: the README example, tests/test_gpu.py, tests/test_layer_gpu.py and
# tests/test_parity_gpu.py (against the Rust GPU test's dump in NSA_PARITY_DIR), and the benchmark
# beside the peers. PKG holds the unpacked wheel (`python -m zipfile -e nsa-*.whl
# PKG`), DEPS pytest and its dependencies when the machine lacks them, PEERS the
# prebuilt peers (flashmla/, sgl_topk/, deepgemm.tar.xz); results go to $OUT.
#   PKG=gpu-bin/py DEPS=gpu-bin/pydeps PEERS=peers bash nsa-runtime/python/tests/run_on_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
export OUT="${OUT:-/tmp/nsa-python-gpu}"
out="$OUT"
mkdir -p "$out"
export PYTHONPATH="$(realpath "${PKG:?the unpacked wheel}")${DEPS:+:$(realpath "$DEPS")}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c 'import sys, torch, nsa; print("python", sys.version.split()[0], "torch", torch.__version__, "nsa", nsa.__version__)'
echo "--- README example"
awk '/^## Use it from PyTorch/{f=1} f&&/^```python/{p=1;next} p&&/^```/{exit} p' README.md > "$out/readme_example.py"
timeout 300 python3 "$out/readme_example.py" && echo "README example: ok"
echo "--- tests/test_gpu.py tests/test_layer_gpu.py tests/test_parity_gpu.py"
timeout "${TEST_TIMEOUT:-400}" python3 -m pytest -q -rs -p no:cacheprovider nsa-runtime/python/tests/test_gpu.py \
  nsa-runtime/python/tests/test_layer_gpu.py nsa-runtime/python/tests/test_parity_gpu.py 2>&1 | tee "$out/pytest.txt" | tail -40
if [ -n "${PEERS:-}" ]; then
  echo "--- .ci/bench/python_compat.py"
  timeout "${BENCH_TIMEOUT:-300}" python3 .ci/bench/python_compat.py "$PEERS" | tee "$out/python_compat.txt" | tail -40
fi
