#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test: the C++ tests (ctest,
# every label), then the end-to-end tests with real PyTorch (pytest, every
# tier: root, slurm, postgres, browser, slow). What runs where and how long
# each part takes: docs/testing.md.
#   scripts/test.sh            everything; what CI runs on a fresh machine
#   scripts/test.sh --quick    the inner loop on a built tree: no install, the
#                              unit-labelled C++ tests and the pytest tests not
#                              marked slow
# Arguments after the option go to pytest. TG_TEST_WORKERS sets pytest's
# parallel workers (default 4: the tests mostly wait on timeouts and
# heartbeats, not the CPU).
#
# End-to-end tests run in parallel (pytest-xdist, a file's tests on one
# worker), then the few marked `serial` (timing that needs a quiet machine)
# alone. Last, scripts/leftovers.py fails the run if it left anything behind:
# files in /tmp or /dev/shm, processes, mounts, network namespaces or links,
# cgroups.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
if [[ "${1:-}" == "--quick" ]]; then
  quick=1
  shift
fi
workers="${TG_TEST_WORKERS:-4}"
declare -a timings=()
timed() {  # timed NAME COMMAND...: runs it, records its wall time
  local name="$1" start=$SECONDS rc=0
  shift
  "$@" || rc=$?
  timings+=("$(printf '%-8s %4d s' "$name" $((SECONDS - start)))")
  return $rc
}
summary() {
  echo "--- time by part (wall) ---"
  printf '%s\n' "${timings[@]}"
}
trap summary EXIT

((quick)) || timed install scripts/install-deps.sh
timed build scripts/build.sh

# What exists before the tests run; pytest's scratch directory is the run's own.
state="$(mktemp -d /tmp/tg-test-run.XXXXXX)"
base="$state/pytest"
/usr/bin/python3 scripts/leftovers.py snapshot "$state/before.json"
failed=0
pytest=(/usr/bin/python3 -m pytest -q -p no:cacheprovider --basetemp="$base" -rfE)
if ((quick)); then
  timed ctest bash -c 'cd build && ctest --output-on-failure -j2 --timeout 300 -L unit' || failed=1
  timed pytest "${pytest[@]}" -n "$workers" --dist loadfile -m "not slow" --durations=15 tests "$@" || failed=1
else
  timed ctest bash -c 'cd build && ctest --output-on-failure -j2 --timeout 300' || failed=1
  timed pytest "${pytest[@]}" -n "$workers" --dist loadfile -m "not serial" --durations=30 tests "$@" || failed=1
  timed serial "${pytest[@]}" -m serial --durations=10 tests "$@" || failed=1
fi
rm -rf "$base"
timed check /usr/bin/python3 scripts/leftovers.py check "$state/before.json" --ignore "$(basename "$state")" || failed=1
rm -rf "$state"
exit $failed
