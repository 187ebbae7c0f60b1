#!/usr/bin/env bash
# ctest DeviceCheck.Rehearsal: bench/device_check.sh --rehearse, all three parts, on this machine (cpu,
# and cuda-emu when the binary has it, in place of the GPU backends; small shapes in place of
# 1B/8B). Each part must pass every row it runs and leave exactly its log and its tarball in $OUT,
# the tarball holding each row's JSON; the log must hold one timing row per backend and shape (the
# float shape and the quantized one: q4_1 in part1, q4_K in part2), one for the unsplit attention
# (<main>/s1) on the float shape, and part1 the flash-decoding greedy rows (--attn-splits 1, 7); part
# "tune" one row per variant.
# Env: MK_BIN (the megakernel binary), MK_SHARED_DIR, MK_DEVCHECK_BUDGET_S (rows' budget per part, 900).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d /tmp/mk_rehearsal.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
status=0
bad() { echo "FAIL: $*"; status=1; }
for part in part1 part2; do
  out="$tmp/out_$part"
  # The rows' budget (280 s per call on the device) is raised here: on a loaded 2-core machine the
  # rehearsal's rows can outlast it, and every row must run for the checks below (rows stay bounded
  # by their own timeouts).
  OUT="$out" MK_DEVCHECK_TMP="$tmp/work" MK_DEVCHECK_BUDGET_S="${MK_DEVCHECK_BUDGET_S:-900}" \
    "$root/bench/device_check.sh" --rehearse "$part"
  rc=$?
  [[ $rc == 0 ]] || bad "device_check.sh --rehearse $part exited $rc"
  log="$out/device_check_$part.log"
  files=$(cd "$out" && ls | tr '\n' ' ')
  [[ "$files" == "device_check_$part.log device_check_$part.tar.gz " ]] || bad "$part: \$OUT holds '$files', not one log and one tarball"
  grep -q "^ALL CHECKS PASSED" "$log" || bad "$part: the log does not end in ALL CHECKS PASSED"
  grep -q "^FAIL" "$log" && bad "$part: the log reports failures"
  entries=$(tar tzf "$out/device_check_$part.tar.gz" | sed 's|^\./||' | sort)
  backends=$(sed -n 's/^== rehearsal on .*: \(.*\) in place of cuda.*/\1/p' "$log")
  [[ -n "$backends" ]] || bad "$part: no rehearsal line naming the backends"
  if [[ $part == part1 ]]; then
    shapes="synth:stories260k:bf16 synth:stories260k:q4_1"
    for b in $backends; do
      for c in 0 1; do grep -qx "greedy_${b}_$c.json" <<<"$entries" || bad "part1: tarball lacks greedy_${b}_$c.json"; done
    done
    for s in 1 7; do  # flash-decoding rows on the backend standing in for cuda (the last one)
      grep -qx "greedy_${backends##* }_s$s.json" <<<"$entries" || bad "part1: tarball lacks greedy_${backends##* }_s$s.json"
    done
    [[ $(grep -c '^hf_.*_bfloat16.json$' <<<"$entries") == 9 ]] || bad "part1: tarball lacks the 9 HF fixture results"
    for fx in gemma2 gemma3 phi3_longrope iq4_nl iq4_xs; do
      grep -qx "fx_$fx.json" <<<"$entries" || bad "part1: tarball lacks fx_$fx.json (the in-repo fixture rows)"
    done
    grep -q '^PASS: .*logits: relative L2' "$log" || bad "part1: no passing logits row"
    grep -q '^PASS: host compile of synth:llama3.2-1b' "$log" || bad "part1: no host compile row"
  else
    shapes="synth:stories15m:bf16 synth:stories260k:q4_K"
    grep -q '^PASS: host compile of synth:llama3.1-8b' "$log" || bad "part2: no host compile row"
  fi
  for shape in $shapes; do
    for b in $backends; do
      grep -qE "^$shape +$b +[0-9.]+ +[0-9.]+ " "$log" || bad "$part: no timing row for $shape on $b"
      grep -qx "time_${shape//[:.]/_}_$b.json" <<<"$entries" || bad "$part: tarball lacks the timing JSON of $shape on $b"
    done
  done
  shape=${shapes%% *}  # the float shape also times the unsplit attention on the backend standing in for cuda
  grep -qE "^$shape +${backends##* }/s1 +[0-9.]+ +[0-9.]+ " "$log" || bad "$part: no unsplit-attention timing row (${backends##* }/s1)"
done
# part "tune": every variant row on the 1B stand-in, three on the others, and (with cuda-emu) the two
# traces beside the log and the tarball.
out="$tmp/out_tune"
OUT="$out" MK_DEVCHECK_TMP="$tmp/work" MK_DEVCHECK_BUDGET_S="${MK_DEVCHECK_BUDGET_S:-900}" "$root/bench/device_check.sh" --rehearse tune
rc=$?
[[ $rc == 0 ]] || bad "device_check.sh --rehearse tune exited $rc"
log="$out/device_check_tune.log"
grep -q "^ALL CHECKS PASSED" "$log" || bad "tune: the log does not end in ALL CHECKS PASSED"
grep -q "^FAIL" "$log" && bad "tune: the log reports failures"
for v in loop0 ahead default static-cp 1tile 1tile+evict evict 1tile/s1 1tile/s4 1tile/static-cp; do
  grep -qE "^synth:stories260k:bf16 +${v//+/\\+} +[0-9.]+ +[0-9.]+ " "$log" || bad "tune: no row for variant $v"
done
for shape in synth:stories15m:bf16 synth:stories260k:q4_1; do
  for v in loop0 default 1tile+evict; do
    grep -qE "^$shape +${v//+/\\+} +[0-9.]+ +[0-9.]+ " "$log" || bad "tune: no row for $shape $v"
  done
done
files=$(cd "$out" && ls | tr '\n' ' ')
want="device_check_tune.log device_check_tune.tar.gz "
grep -q "cuda-emu" <<<"$(sed -n 's/^== rehearsal on .*: \(.*\) in place of cuda.*/\1/p' "$log")" &&
  want="device_check_tune.log device_check_tune.tar.gz trace_synth_stories260k_bf16_1tile_evict.json.gz trace_synth_stories260k_bf16_default.json.gz "
[[ "$files" == "$want" ]] || bad "tune: \$OUT holds '$files', not '$want'"
[[ $status == 0 ]] && echo "rehearsal passed"
exit $status
