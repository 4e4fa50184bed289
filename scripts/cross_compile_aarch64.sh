#!/usr/bin/env bash
# Cross-compiles the extension for aarch64 (AWS Graviton and other Arm hosts):
# every translation unit of torchneuron._C with setup.py's flags, against the
# headers of PyTorch 2.13.0's aarch64 wheel, then links it against that wheel's
# libraries; builds csrc/runtime's C++ tests and, where qemu-user is installed,
# runs them. Shows that no x86-only code sits outside the ISA-guarded files
# (csrc/bridge/kernels/isa_*.cpp, nki_gemm_amx.cpp).
#
#   scripts/cross_compile_aarch64.sh          # installs the cross toolchain (apt) if missing
#
# Output under build/aarch64/ (objects, _C.so, runtime_tests); the wheel is
# cached under build/aarch64/wheel/. Debian's cross toolchain is
# g++-aarch64-linux-gnu; Python's headers are the host interpreter's (they
# differ by platform only in pyconfig.h, whose values are those of any LP64
# Linux), so nothing is linked against Python.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=build/aarch64
CXX=aarch64-linux-gnu-g++
JOBS=${MAX_JOBS:-2}
mkdir -p "$OUT/wheel" "$OUT/obj"

if ! command -v "$CXX" >/dev/null; then
  echo "[cross] installing Debian's aarch64 cross toolchain"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++-aarch64-linux-gnu >/dev/null
fi

# PyTorch 2.13.0 for aarch64, as pip resolves it for Python 3.11 (wheel only, no dependencies).
if ! ls "$OUT"/wheel/torch-2.13.0-*aarch64*.whl >/dev/null 2>&1; then
  echo "[cross] downloading torch 2.13.0's aarch64 wheel"
  .venv/bin/python -m pip download -q torch==2.13.0 --platform manylinux_2_28_aarch64 --python-version 3.11 \
    --implementation cp --only-binary=:all: --no-deps -d "$OUT/wheel"
fi
WHEEL=$(ls "$OUT"/wheel/torch-2.13.0-*aarch64*.whl | head -n 1)
TORCH="$OUT/torch"
if [ ! -f "$TORCH/.from" ] || [ "$(cat "$TORCH/.from")" != "$WHEEL" ]; then
  rm -rf "$TORCH" && mkdir -p "$TORCH"
  .venv/bin/python - "$WHEEL" "$TORCH" <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist()
                               if n.startswith(("torch/include/", "torch/lib/", "torch.libs/"))])
EOF
  echo "$WHEEL" > "$TORCH/.from"
fi
echo "[cross] $($CXX --version | head -n 1); against $(basename "$WHEEL")"

# setup.py's flags (torch.utils.cpp_extension's and the extension's own).
PYINC=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['include'])")
TI="$TORCH/torch/include"
FLAGS=(-DNDEBUG -fwrapv -O2 -Wall -fPIC -Wno-unused-parameter -fopenmp -std=c++20
       -DTORCH_API_INCLUDE_EXTENSION_H -DTORCH_EXTENSION_NAME=_C
       -I"$ROOT/csrc" -I"$TI/kineto" -I"$TI" -I"$TI/torch/csrc/api/include" -I"$PYINC")
export PATH="/usr/lib/ccache:$PATH" CCACHE_BASEDIR="$ROOT"
command -v ccache >/dev/null && CXX="ccache $CXX"

mapfile -t SOURCES < <(ls csrc/runtime/*.cpp; find csrc/bridge -name '*.cpp' | sort)
echo "[cross] compiling ${#SOURCES[@]} translation units for aarch64"
fails=0
compile() {
  local src=$1 obj="$OUT/obj/${1//\//_}.o"
  if ! $CXX "${FLAGS[@]}" -c "$src" -o "$obj" 2>"$obj.log"; then
    echo "[cross] FAILED $src:"; grep -m 5 error "$obj.log"; return 1
  fi
}
for src in "${SOURCES[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || fails=$((fails + 1)); done
  compile "$src" &
done
while [ "$(jobs -rp | wc -l)" -gt 0 ]; do wait -n || fails=$((fails + 1)); done
if [ "$fails" -ne 0 ]; then
  echo "[cross] $fails of ${#SOURCES[@]} translation units failed"; exit 1
fi
echo "[cross] all ${#SOURCES[@]} translation units compiled"

# x86 code in an object would show as an x86 instruction set; aarch64 objects only.
file "$OUT"/obj/*.o | grep -v "ARM aarch64" && { echo "[cross] objects of another machine"; exit 1; }

# Linked as setup.py links it, against the wheel's libtorch (its own
# dependencies, libgomp included, resolve at load time on an aarch64 host).
${CXX#ccache } -shared -fopenmp "$OUT"/obj/*.o -L"$TORCH/torch/lib" -lc10 -ltorch -ltorch_cpu -ltorch_python \
  -Wl,-rpath-link,"$TORCH/torch/lib":"$TORCH/torch.libs" -o "$OUT/_C.so"
echo "[cross] linked $OUT/_C.so: $(file -b "$OUT/_C.so" | cut -d, -f1-2)"
undefined=$(aarch64-linux-gnu-nm -D --undefined-only "$OUT/_C.so" | grep -c " U " || true)
echo "[cross] $undefined undefined dynamic symbols (libtorch, libc, Python at load time)"

# The torch-free runtime's C++ tests, static, run under qemu-user where installed.
${CXX#ccache } -std=c++17 -O2 -Wall -Wextra -static -pthread -Icsrc/runtime csrc/runtime/*.cpp \
  csrc/runtime/tests/runtime_tests.cpp -o "$OUT/runtime_tests"
if command -v qemu-aarch64 >/dev/null; then
  echo "[cross] runtime tests under qemu-aarch64: $(qemu-aarch64 "$OUT/runtime_tests" | tail -n 1)"
else
  echo "[cross] built $OUT/runtime_tests (install qemu-user to run it here)"
fi
