#!/usr/bin/env bash
# Checks that the sanitizer presets' test binary (mk_tests_san, tests/CMakeLists.txt) holds every
# suite that its gtest filter selects: a suite outside the file list would be skipped silently there
# (a filter that matches nothing passes).
# Usage: check_sanitizer_lists.sh MK_TESTS TESTS_DIR FILTER1 FILES1 [FILTER2 FILES2 ...]
# (FILES: the test sources, relative to TESTS_DIR, separated by ';' or spaces.)
set -euo pipefail
exe=$1 dir=$2
shift 2
bad=0
while (($#)); do
  filter=$1 files=${2//;/ }
  shift 2
  paths=()
  for f in $files; do
    [[ -f "$dir/$f" ]] || { echo "listed test file $f does not exist"; bad=1; }
    paths+=("$dir/$f")
  done
  # Suite names the filter selects: "Suite." lines, the instantiation prefix of parameterised ones cut.
  suites=$("$exe" --gtest_list_tests --gtest_filter="$filter" | grep -v '^ ' | grep '\.$' | sed 's/\.$//; s|.*/||' | sort -u)
  [[ -n "$suites" ]] || { echo "filter selects no test: $filter"; bad=1; }
  for s in $suites; do
    if ! grep -qE "^(TEST|TEST_F|TEST_P|TYPED_TEST)\($s," "${paths[@]}"; then
      echo "suite $s (selected by $filter) is not defined in: $files"
      bad=1
    fi
  done
  echo "$(wc -w <<<"$suites") suites selected by '${filter:0:60}...'"
done
exit $bad
