#!/usr/bin/env bash
# Installs the Python package the way a user does (`pip install ./nsa-runtime/python`,
# which builds the extension with maturin), with its test extras (numpy, pytest),
# into the virtual environment .nsa-tools/py, then runs the given command there:
#   bash .ci/python.sh python -m pytest -q nsa-runtime/python/tests/test_api.py
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.nsa-tools/py"
if [ ! -x "$venv/bin/python" ]; then
  echo "[nsa] creating the Python environment $venv" >&2
  python3 -m venv "$venv" || {
    echo "[nsa] python3 -m venv failed: install the venv module (Debian/Ubuntu: apt-get install python3-venv)" >&2
    exit 1
  }
fi
echo "[nsa] pip install ./nsa-runtime/python[test] (builds the extension)" >&2
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$root/nsa-runtime/python[test]"
export PATH="$venv/bin:$PATH"
# The package must find NVRTC through its pinned wheel alone.
unset NSA_NVRTC_PATH LD_LIBRARY_PATH
cd "$root"
exec "$@"
