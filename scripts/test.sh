#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole test suite: the C++ unit
# tests (ctest) and the end-to-end tests with real PyTorch DDP (pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
(cd build && ctest --output-on-failure -j2 --timeout 300)
exec /usr/bin/python3 -m pytest -q -p no:cacheprovider tests
