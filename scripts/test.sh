#!/usr/bin/env bash
# Installs dependencies, builds (release, then ASan+UBSan and TSan: mk_tests_san, the test files of
# the labelled suites), runs ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
jobs=$(nproc)
stage() { echo "== $(date -u +%H:%M:%S) $* (${SECONDS}s since the start) =="; }  # where CI's minutes go
# ctest, and on a failure the failed checks again at the very end (a CI log is often read from its tail;
# ctest prints a failing test's output where it ended, among hundreds of others).
run_ctest() {  # build dir, ctest args
  local dir=$1 rc=0
  shift
  ctest "$@" || rc=$?
  if [[ $rc != 0 ]]; then
    echo "== failed checks (from $dir/Testing/Temporary/LastTest.log) =="
    grep -hE '^(FAIL: |\[  FAILED  \] [A-Za-z]|.*: Failure$)' "$dir/Testing/Temporary/LastTest.log" | tail -n 40 || true
    exit "$rc"
  fi
}
stage release build
scripts/build.sh release
stage release ctest
run_ctest build --preset release -j "$jobs"
if [[ "${MK_SKIP_SANITIZERS:-0}" != 1 ]]; then
  stage asan build
  scripts/build.sh asan mk_tests_san
  stage asan ctest
  run_ctest build-asan --preset asan -j "$jobs" -L asan
  stage tsan build
  scripts/build.sh tsan mk_tests_san
  stage tsan ctest
  run_ctest build-tsan --preset tsan -j "$jobs" -L tsan
fi
stage done
