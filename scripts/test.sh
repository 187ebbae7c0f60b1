#!/usr/bin/env bash
# Installs dependencies, builds (release, then ASan+UBSan and TSan: mk_tests_san, the test files of
# the labelled suites), runs ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
jobs=$(nproc)
scripts/build.sh release
ctest --preset release -j "$jobs"
if [[ "${MK_SKIP_SANITIZERS:-0}" != 1 ]]; then
  scripts/build.sh asan mk_tests_san
  ctest --preset asan -j "$jobs" -L asan
  scripts/build.sh tsan mk_tests_san
  ctest --preset tsan -j "$jobs" -L tsan
fi
