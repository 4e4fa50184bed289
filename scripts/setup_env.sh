#!/usr/bin/env bash
# Everything a fresh machine needs: .venv at the repo root, PyTorch 2.13.0 (CPU)
# and the other requirements, ccache, chromium for the browser test, the
# extension (built once, incrementally afterwards) and the package's
# registration with PyTorch's autoload.
# Safe to run again: each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages, with apt-get (as root, or through sudo); stops the set-up with
# a message when apt cannot be used.
apt_install() {
  local sudo=""
  if [ "$(id -u)" != 0 ]; then
    if ! command -v sudo >/dev/null; then
      echo "[setup] error: installing $* needs root or sudo; install them by hand" >&2
      exit 1
    fi
    sudo="sudo"
  fi
  if ! command -v apt-get >/dev/null; then
    echo "[setup] error: apt-get is not available; install the Debian packages $* by hand" >&2
    exit 1
  fi
  if ! $sudo apt-get update -qq >/dev/null || ! $sudo apt-get install -y -qq "$@" >/dev/null; then
    echo "[setup] error: apt-get could not install $*" >&2
    exit 1
  fi
}

if ! command -v ccache >/dev/null || ! command -v ninja >/dev/null || ! command -v cmake >/dev/null; then
  echo "[setup] installing ccache, ninja and cmake (apt)"
  apt_install ccache ninja-build cmake
fi

# iproute2's ip: the multi-node torchrun test's network namespaces (tests/test_distributed_launch.py).
if ! command -v ip >/dev/null; then
  echo "[setup] installing iproute2 (apt)"
  apt_install iproute2
fi

# Chromium and its WebDriver: the explorer's browser test (tests/explorer/).
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  echo "[setup] installing chromium and chromium-driver (apt)"
  apt_install chromium chromium-driver
fi

if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  python3 -m venv .venv
fi
stamp=.venv/.requirements.sha
want=$(cat requirements.txt constraints.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[setup] installing requirements (torch 2.13.0 CPU, ...)"
  .venv/bin/pip install -q --disable-pip-version-check -r requirements.txt -c constraints.txt
  echo "$want" > "$stamp"
fi

echo "[setup] building the extension"
scripts/build.sh

# Registered = the autoload entry point and the torchneuron-lockin command exist and the top-level packages
# (torchneuron, torch_neuronx, nki) resolve into this checkout; -P keeps the current
# directory off sys.path, so only the installed mapping answers.
if ! TORCH_DEVICE_BACKEND_AUTOLOAD=0 .venv/bin/python -P -c "
import importlib.metadata as m, importlib.util as u, os, sys
here = os.path.realpath(sys.argv[1])
ok = any(e.name == 'torchneuron' for e in m.entry_points(group='torch.backends'))
ok = ok and any(e.name == 'torchneuron-lockin' for e in m.entry_points(group='console_scripts'))
for name in ('torchneuron', 'torch_neuronx', 'nki'):
    spec = u.find_spec(name)
    ok = ok and spec is not None and os.path.realpath(spec.origin).startswith(here + os.sep)
sys.exit(0 if ok else 1)" "$PWD"; then
  echo "[setup] registering torchneuron with pip (editable, autoload entry point)"
  TORCH_DEVICE_BACKEND_AUTOLOAD=0 TORCHNEURON_METADATA_ONLY=1 .venv/bin/pip install -q --disable-pip-version-check --no-build-isolation --no-deps -e .
fi
