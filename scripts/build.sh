#!/usr/bin/env bash
# Incremental build of the extension in place (ninja + ccache).
set -euo pipefail
cd "$(dirname "$0")/.."
# Autoload off: setup.py imports torch, which must not try to load the
# extension being built.
# CCACHE_BASEDIR and CCACHE_NOHASHDIR: paths under the checkout are hashed
# relative to it and the working directory not at all (-g would add it), so another
# checkout (a git worktree) of the same sources hits the same cache entries.
export PATH="/usr/lib/ccache:$PATH" MAX_JOBS="${MAX_JOBS:-2}" TORCH_DEVICE_BACKEND_AUTOLOAD=0 CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
.venv/bin/python setup.py -q build_ext --inplace 2>&1 | grep -E "error|Error|warning: unused" || true
test -f torchneuron/_C.cpython-*.so
