#!/usr/bin/env bash
# Set up everything aot needs on a fresh Debian machine: Mesa's software Vulkan (so WebGPU
# has an adapter without a GPU) and a virtual environment in .venv with aot, its test
# dependencies and the CPU build of PyTorch (the parity oracle).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! ldconfig -p 2>/dev/null | grep -q libvulkan_lvp; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq mesa-vulkan-drivers libvulkan1 python3-venv >/dev/null
fi

# the web target's tests drive Debian's chromium (its WebGPU adapter is SwiftShader on machines
# without a GPU) through Playwright, which pyproject's test extra installs; they skip without it
if ! command -v chromium >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq chromium >/dev/null || echo "setup: chromium not installed; the web tests will be skipped"
fi

# tests/test_web_npm.py installs the web package with npm and bundles it (esbuild, vite, tsc from
# the registry); it skips without node and npm
if ! command -v npm >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq nodejs npm >/dev/null || echo "setup: nodejs/npm not installed; the npm package tests will be skipped"
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[test]"
# scripts/demo.sh plots its loss curve here (never in the deployed package's environment)
.venv/bin/python -c "import matplotlib" 2>/dev/null || .venv/bin/python -m pip install -q matplotlib || echo "setup: matplotlib not installed; demo.sh will skip its plot"
# test-only oracle; a wheel of this version is on the build machines already
.venv/bin/python -m pip install -q "torch==2.13.0" || echo "setup: torch not installed; PyTorch parity tests will be skipped"
echo "setup: ready (.venv)"
