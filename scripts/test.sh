#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test: the C++ tests (ctest,
# every label), then the end-to-end tests with real PyTorch (pytest, every
# tier: root, slurm, postgres, browser, slow). What runs where and how long
# each part takes: docs/testing.md.
#   scripts/test.sh            everything; what CI runs on a fresh clone
#   scripts/test.sh --quick    the inner loop on a built tree: no install, the
#                              unit-labelled C++ tests and the pytest tests not
#                              marked slow
# Arguments after the option go to pytest. TG_TEST_WORKERS sets pytest's
# parallel workers (default 4: the tests mostly wait on timeouts and
# heartbeats, not the CPU).
#
# End-to-end tests run in parallel (pytest-xdist, a file's tests on one
# worker), then the few marked `serial` (timing that needs a quiet machine)
# alone. The tests run under scripts/leftovers.py, which fails the run if
# they left anything behind: files in /tmp or /dev/shm, processes, mounts,
# network namespaces or links, cgroups.
set -euo pipefail
cd "$(dirname "$0")/.."

timed() {  # timed NAME COMMAND...: runs it, prints its wall time
  local name="$1" start=$SECONDS rc=0 note=""
  shift
  "$@" || rc=$?
  ((rc == 0)) || note=" (exit $rc)"
  printf 'time: %-8s %4d s%s\n' "$name" $((SECONDS - start)) "$note"
  return $rc
}

if [[ "${1:-}" == "--phases" ]]; then  # the tests themselves, under leftovers.py
  shift
  quick="$1" base="$2"
  shift 2
  workers="${TG_TEST_WORKERS:-4}"
  pytest=(/usr/bin/python3 -m pytest -q -p no:cacheprovider --basetemp="$base" -rfE)
  failed=0
  if ((quick)); then
    timed ctest bash -c 'cd build && ctest --output-on-failure -j2 --timeout 300 -L unit' || failed=1
    timed pytest "${pytest[@]}" -n "$workers" --dist loadfile -m "not slow" --durations=15 tests "$@" || failed=1
  else
    timed ctest bash -c 'cd build && ctest --output-on-failure -j2 --timeout 300' || failed=1
    timed pytest "${pytest[@]}" -n "$workers" --dist loadfile -m "not serial" --durations=30 tests "$@" || failed=1
    rc=0
    timed serial "${pytest[@]}" -m serial --durations=10 tests "$@" || rc=$?
    ((rc == 0 || rc == 5)) || failed=1  # 5: arguments that select no serial test
  fi
  rm -rf "$base"
  exit $failed
fi

quick=0
if [[ "${1:-}" == "--quick" ]]; then
  quick=1
  shift
fi
start=$SECONDS
((quick)) || timed install scripts/install-deps.sh
timed build scripts/build.sh
# pytest's scratch directory is the run's own: made before the snapshot, removed after.
state="$(mktemp -d /tmp/tg-test-run.XXXXXX)"
rc=0
timed tests /usr/bin/python3 scripts/leftovers.py --ignore "$(basename "$state")" -- \
  "$0" --phases "$quick" "$state/pytest" "$@" || rc=$?
rm -rf "$state"
printf 'time: %-8s %4d s\n' all $((SECONDS - start))
exit $rc
