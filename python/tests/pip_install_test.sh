#!/usr/bin/env bash
# `pip install .` from this checkout into a fresh virtual environment (Debian's numpy and pytest visible
# through --system-site-packages; pip fetches scikit-build-core and nanobind for the build), then the
# core's tests against the installed package, run from outside the source tree.
# Usage: pip_install_test.sh SOURCE_DIR [PYTHON]
set -euo pipefail
src=$1; python=${2:-/usr/bin/python3}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$python" -m venv --system-site-packages "$tmp/venv"
# The Python core runs host arrays: without CUDA the build skips the device kernels' compile time.
"$tmp/venv/bin/pip" install -q "$src" --config-settings=cmake.define.RA_ENABLE_CUDA=OFF \
  --config-settings=build-dir="$tmp/build"
cp "$src/python/tests/test_core.py" "$src/python/tests/reference.py" "$tmp/"
cd "$tmp"
"$tmp/venv/bin/python" -c "import ringattn, os; assert os.path.dirname(ringattn.__file__).startswith('$tmp/venv'), ringattn.__file__"
OMP_NUM_THREADS=1 "$tmp/venv/bin/python" -m pytest -q -p no:cacheprovider test_core.py
echo "pip install test OK"
