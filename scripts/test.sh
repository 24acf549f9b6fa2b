#!/usr/bin/env bash
# Installs dependencies, builds, and runs the test suite: the C++ unit tests
# (ctest), then the end-to-end tests with real PyTorch DDP (pytest).
#   scripts/test.sh           everything (what CI runs)
#   scripts/test.sh --quick   the fast tier: ctest's unit tests and the pytest
#                             tests not marked slow (tests/conftest.py, TIERS)
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
if [[ "${1:-}" == "--quick" ]]; then
  quick=1
  shift
fi
scripts/install-deps.sh
scripts/build.sh
if ((quick)); then
  (cd build && ctest --output-on-failure -j2 --timeout 300 -L unit)
  exec /usr/bin/python3 -m pytest -q -p no:cacheprovider --durations=15 -m "not slow" tests "$@"
fi
(cd build && ctest --output-on-failure -j2 --timeout 300)
exec /usr/bin/python3 -m pytest -q -p no:cacheprovider --durations=30 tests "$@"
