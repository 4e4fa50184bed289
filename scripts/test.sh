#!/usr/bin/env bash
# The whole test suite, set-up included: runtime C++ unit tests, then pytest.
# Extra arguments go to pytest (e.g. scripts/test.sh tests/test_guard_and_streams.py -x).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh

echo "[test] runtime C++ unit tests"
cmake -S csrc/runtime -B build/runtime -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build/runtime >/dev/null
build/runtime/runtime_tests | tail -n 1

echo "[test] pytest"
exec .venv/bin/python -m pytest "${@:-tests}"
