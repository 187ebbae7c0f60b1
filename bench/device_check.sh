#!/usr/bin/env bash
# Device check for the CUDA backends (issue 4). Two halves:
#
#   bench/device_check.sh --prepare   here (no GPU needed): builds the CLI, copies it, the shared
#                                     libraries the device image may lack (fmt, pcre2) and the
#                                     stories260K files into .devcheck/ (ignored by git; name it in
#                                     the device tool's `carry`).
#   bench/device_check.sh             on the GPU machine: uses .devcheck/ (or builds with CMake when
#                                     it is absent and the build dependencies are installed), then
#                                     prints correctness checks and a timing table.
#
# Correctness: logits of every prompt position from cuda (dynamic, static-rr, static-cp schedules),
# cuda-perop and cuda-graph against the reference backend (max |diff| / max |ref| under 1e-3 and the
# same argmax everywhere), then greedy decode text equal to the reference's.
# Timing: ms/token of decode (-n tokens after a short prompt) per backend, median of 3 runs.
# Everything is bounded by `timeout`; a failing check prints FAIL and the script exits non-zero at
# the end, after the table. Logs go to $OUT (or /tmp/mk_device_check).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DC="$ROOT/.devcheck"

if [[ "${1:-}" == "--prepare" ]]; then
  grep -qx '/.devcheck/' .git/info/exclude 2>/dev/null || echo '/.devcheck/' >>"$(git rev-parse --git-common-dir)/info/exclude"
  cmake --preset release >/dev/null
  cmake --build --preset release --target megakernel
  rm -rf "$DC" && mkdir -p "$DC/lib" "$DC/models"
  cp build/megakernel "$DC/"
  # Non-system libraries the binary links (the device image has its own CUDA, so not NVRTC).
  ldd build/megakernel | awk '/=> \// {print $3}' | grep -E 'libfmt|libpcre2' | xargs -r -I{} cp -L {} "$DC/lib/"
  cp ../shared/models/stories260K/{stories260K.gguf,tok512.bin} "$DC/models/"
  du -sh "$DC"
  exit 0
fi

OUT="${OUT:-/tmp/mk_device_check}"
mkdir -p "$OUT"
LOG="$OUT/device_check.log"
: >"$LOG"
say() { echo "$*" | tee -a "$LOG"; }
FAILED=0
fail() { say "FAIL: $*"; FAILED=1; }

if [[ -x "$DC/megakernel" ]]; then
  BIN="$DC/megakernel"
  export LD_LIBRARY_PATH="$DC/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
  MODELS="$DC/models"
else
  say "no .devcheck/: building with CMake"
  timeout 900 cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DMK_BUILD_TESTS=OFF -DMK_BUILD_BENCH=OFF \
    -DMK_NATIVE=OFF >>"$LOG" 2>&1 || { say "configure failed (see $LOG)"; tail -20 "$LOG"; exit 1; }
  timeout 900 cmake --build build-device --target megakernel >>"$LOG" 2>&1 || { say "build failed"; tail -40 "$LOG"; exit 1; }
  BIN="$ROOT/build-device/megakernel"
  MODELS="${MK_MODELS:-$ROOT/../shared/models/stories260K}"
fi
MODEL="$MODELS/stories260K.gguf"
TOK="$MODELS/tok512.bin"
export XDG_CACHE_HOME="$OUT/cache"  # NVRTC cache: cold first, warm after

say "== device"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv 2>&1 | tee -a "$LOG" || true
"$BIN" info -m "$MODEL" >>"$LOG" 2>&1 || true

PY=python3
IDS="1,403,407,261,378,429,280,414,319,270,397,265,285,415,276,334"  # < n_vocab 512

say "== correctness: logits of $(echo "$IDS" | tr ',' '\n' | wc -l) positions vs reference"
timeout 120 "$BIN" logits -m "$MODEL" --ids "$IDS" --backend reference >"$OUT/logits_reference.json" 2>"$OUT/err_reference.txt" \
  || fail "reference logits: $(tail -3 "$OUT/err_reference.txt" | tr '\n' ' ')"
check_logits() {  # name, extra args...
  local name="$1"; shift
  local f="$OUT/logits_${name}.json"
  local t0
  t0=$(date +%s.%N)
  if ! timeout 300 "$BIN" logits -m "$MODEL" --ids "$IDS" "$@" >"$f" 2>"$OUT/err_$name.txt"; then
    fail "$name: logits command failed: $(tail -3 "$OUT/err_$name.txt" | tr '\n' ' ')"
    return
  fi
  local secs
  secs=$($PY -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$t0" "$(date +%s.%N)")
  $PY - "$OUT/logits_reference.json" "$f" "$name" "$secs" <<'EOF' | tee -a "$LOG" || FAILED=1
import json, math, sys
ref, got, name, secs = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3], sys.argv[4]
a, b = ref["logits_last"], got["logits_last"]
bad = any(math.isnan(x) or math.isinf(x) for x in b)
diff = max(abs(x - y) for x, y in zip(a, b)) / max(1e-30, max(abs(x) for x in a))
same = ref["argmax_all"] == got["argmax_all"]
ok = not bad and diff < 1e-3 and same and len(a) == len(b)
print(f"{'PASS' if ok else 'FAIL'}: {name:24s} rel max diff {diff:.2e}, argmax {'same' if same else 'DIFFERENT'} ({secs} s incl. compile)")
sys.exit(0 if ok else 1)
EOF
}
check_logits cuda-dynamic --backend cuda --schedule dynamic
check_logits cuda-dynamic-warm --backend cuda --schedule dynamic
check_logits cuda-static-rr --backend cuda --schedule static-rr
check_logits cuda-static-cp --backend cuda --schedule static-cp
check_logits cuda-perop --backend cuda-perop
check_logits cuda-graph --backend cuda-graph

say "== correctness: greedy text vs reference"
gen() { timeout 300 "$BIN" run -m "$MODEL" -z "$TOK" -p "Once upon a time" -n "$2" --temp 0 --ignore-eos --json --backend "$1" "${@:3}"; }
gen reference 64 >"$OUT/gen_reference.json" 2>>"$LOG" || fail "reference generation"
for b in cuda cuda-perop cuda-graph; do
  if gen "$b" 64 >"$OUT/gen_$b.json" 2>"$OUT/err_gen_$b.txt"; then
    $PY -c "import json,sys; a=json.load(open('$OUT/gen_reference.json')); b=json.load(open('$OUT/gen_$b.json')); ok=a['generated_ids']==b['generated_ids']; print(('PASS' if ok else 'FAIL')+': greedy text $b '+('same' if ok else 'differs')); sys.exit(0 if ok else 1)" \
      | tee -a "$LOG" || FAILED=1
  else
    fail "$b generation: $(tail -3 "$OUT/err_gen_$b.txt" | tr '\n' ' ')"
  fi
done

say "== timing: decode ms/token (stories260K, 200 tokens, median of 3)"
printf "%-22s %12s %12s\n" backend ms/token tokens/s | tee -a "$LOG"
for cfg in "cuda dynamic" "cuda static-cp" "cuda-perop dynamic" "cuda-graph dynamic" "reference dynamic"; do
  read -r backend schedule <<<"$cfg"
  set -- "$backend" "$schedule"
  ms=()
  for _ in 1 2 3; do
    if r=$(gen "$1" 200 --schedule "$2" 2>>"$LOG"); then
      ms+=("$($PY -c "import json,sys; print(json.loads(sys.argv[1])['ms_per_token'])" "$r")")
    fi
  done
  if ((${#ms[@]})); then
    med=$(printf "%s\n" "${ms[@]}" | sort -g | sed -n "$(((${#ms[@]} + 1) / 2))p")
    printf "%-22s %12.4f %12.1f\n" "$1/$2" "$med" "$($PY -c "print(1000/$med if $med>0 else 0)")" | tee -a "$LOG"
  else
    printf "%-22s %12s\n" "$1/$2" "failed" | tee -a "$LOG"
    FAILED=1
  fi
done
say "(the Llama-3.2-1B / 8B-shape rows need synthetic models: see docs/cuda.md)"
if [[ $FAILED == 0 ]]; then say "ALL CHECKS PASSED"; else say "SOME CHECKS FAILED (log: $LOG)"; fi
exit $FAILED
