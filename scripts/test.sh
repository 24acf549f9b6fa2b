#!/usr/bin/env bash
# Installs dependencies, builds, and runs the tests: the C++ tests (ctest),
# then the end-to-end tests with real PyTorch (pytest).
#   scripts/test.sh         the CI tier (what CI runs): every ctest test but the
#                           slow one, and the pytest tests not marked slow
#   scripts/test.sh --all   everything: adds the slow tier (real multi-node jobs,
#                           network namespaces, Slurm, PostgreSQL outages, the browser)
# Arguments after the option go to pytest (tiers: tests/conftest.py, TIERS;
# docs/testing.md).
set -euo pipefail
cd "$(dirname "$0")/.."
all=0
if [[ "${1:-}" == "--all" ]]; then
  all=1
  shift
fi
scripts/install-deps.sh
scripts/build.sh
if ((all)); then
  (cd build && ctest --output-on-failure -j2 --timeout 300)
  exec /usr/bin/python3 -m pytest -q -p no:cacheprovider --durations=30 tests "$@"
fi
(cd build && ctest --output-on-failure -j2 --timeout 300 -LE slow)
exec /usr/bin/python3 -m pytest -q -p no:cacheprovider --durations=15 -m "not slow" tests "$@"
