#!/usr/bin/env bash
# Device check for the CUDA backends (issue 4). Two halves:
#
#   bench/device_check.sh --prepare   here (no GPU needed): builds the CLI for any x86-64-v3 CPU
#                                     (not -march=native: the device's CPU differs) into
#                                     build-devcheck/, copies it, the shared libraries the device
#                                     image lacks (fmt, pcre2), stories260K and the bf16 HF fixtures
#                                     with their references into .devcheck/ (git-ignored: name it in
#                                     the device tool's `carry`, about 12 MB).
#   bench/device_check.sh             on the GPU machine (or here, as a dry run: every CUDA row then
#                                     reports the driver error and the script exits non-zero). Uses
#                                     .devcheck/, or builds with CMake when it is absent.
#
# Prints, in under 8 minutes on an H200:
#  (a) correctness
#      - stories260K greedy ids on cuda, cuda-perop and cuda-graph equal reference_greedy.json (every
#        case; the reference backend reproduces that file in tests/e2e/test_stories.cpp);
#      - synth:llama3.2-1b, 8-token prompt: last-position logits of cuda within relative L2 1e-2 of
#        the cpu backend with 16 threads (the oracle: the cpu interpreter is checked against the
#        reference backend in tests/e2e/test_cpu_stories.cpp and the CPU op tests; the reference
#        backend itself would take minutes on a 1B model);
#      - watchdog: MK_DEBUG_BREAK_WAIT=1 makes one wait unsatisfiable; the run must end with the
#        watchdog error (exit 1, "waited more than") within its timeout, not hang;
#      - every bf16 HF fixture: logits_last of cuda within relative L2 1e-2 of transformers'.
#  (b) timing: ms/token of greedy decode (64 tokens after a short prompt), effective GB/s = weight
#      bytes per token / time, and its share of the device-to-device copy bandwidth measured in the
#      same run (`megakernel bench-copy`), for cuda, cuda-graph and cuda-perop on both synthetic
#      shapes (llama3.2-1b, llama3.1-8b).
#  (c) cold (empty NVRTC cache) and cached compile time of synth:llama3.2-1b (MK_CUDA_VERBOSE line).
# Logs and JSON outputs go to $OUT (or /tmp/mk_device_check). Exit status 0 only if every check passed.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DC="$ROOT/.devcheck"
SHARED="${MK_SHARED_DIR:-$ROOT/../shared}"

if [[ "${1:-}" == "--prepare" ]]; then
  set -e
  excl="$(git rev-parse --git-common-dir)/info/exclude"
  grep -qx '/.devcheck/' "$excl" 2>/dev/null || echo '/.devcheck/' >>"$excl"
  cmake -S . -B build-devcheck -G Ninja -DCMAKE_BUILD_TYPE=Release -DMK_NATIVE=OFF -DCMAKE_CXX_FLAGS=-march=x86-64-v3 \
    -DMK_BUILD_TESTS=OFF -DMK_BUILD_BENCH=OFF >/dev/null
  cmake --build build-devcheck --target megakernel -j "${JOBS:-2}"
  rm -rf "$DC" && mkdir -p "$DC/lib" "$DC/models" "$DC/hf"
  cp build-devcheck/megakernel "$DC/"
  # Non-system libraries the binary links (the device image has its own CUDA, so not NVRTC).
  ldd build-devcheck/megakernel | awk '/=> \// {print $3}' | grep -E 'libfmt|libpcre2' | xargs -r -I{} cp -L {} "$DC/lib/"
  cp "$SHARED"/models/stories260K/{stories260K.gguf,tok512.bin,reference_greedy.json} "$DC/models/"
  for d in "$SHARED"/fixtures/hf/*_bfloat16; do cp -r "$d" "$DC/hf/"; done
  du -sh "$DC"
  exit 0
fi

OUT="${OUT:-/tmp/mk_device_check}"
mkdir -p "$OUT"
LOG="$OUT/device_check.log"
: >"$LOG"
T_START=$(date +%s)
say() { echo "$*" | tee -a "$LOG"; }
FAILED=0
fail() { say "FAIL: $*"; FAILED=1; }
pass() { say "PASS: $*"; }
PY=python3

if [[ -x "$DC/megakernel" ]]; then
  BIN="$DC/megakernel"
  export LD_LIBRARY_PATH="$DC/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
  MODELS="$DC/models"
  HF="$DC/hf"
else
  say "no .devcheck/: building with CMake"
  timeout 900 cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DMK_BUILD_TESTS=OFF -DMK_BUILD_BENCH=OFF \
    -DMK_NATIVE=OFF >>"$LOG" 2>&1 || { say "configure failed (see $LOG)"; tail -20 "$LOG"; exit 1; }
  timeout 900 cmake --build build-device --target megakernel >>"$LOG" 2>&1 || { say "build failed"; tail -40 "$LOG"; exit 1; }
  BIN="$ROOT/build-device/megakernel"
  MODELS="$SHARED/models/stories260K"
  cp "$SHARED/models/stories260K/reference_greedy.json" "$OUT/" 2>/dev/null || true
  HF="$SHARED/fixtures/hf"
fi
STORIES="$MODELS/stories260K.gguf"
TOK="$MODELS/tok512.bin"
export XDG_CACHE_HOME="$OUT/cache"  # NVRTC cache: cold first, warm after
rm -rf "$XDG_CACHE_HOME"
export MK_CUDA_WAIT_TIMEOUT_MS="${MK_CUDA_WAIT_TIMEOUT_MS:-10000}"
ERR="$OUT/err.txt"
last_err() { grep -m1 -E '^error:' "$ERR" || tail -1 "$ERR"; }

say "== device"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,memory.total --format=csv 2>&1 | tee -a "$LOG" || true

# The copy bandwidth doubles as the driver probe: without a device every CUDA row below reports the
# same driver error instead of loading multi-GB synthetic models for nothing.
COPY_GBPS=0
NO_DEVICE=""
if timeout 120 "$BIN" bench-copy --mib 1024 --reps 20 >"$OUT/copy.json" 2>"$ERR"; then
  COPY_GBPS=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['gbps'])" "$OUT/copy.json")
  say "device-to-device copy: $(cat "$OUT/copy.json")"
else
  NO_DEVICE="$(last_err)"
  fail "bench-copy: $NO_DEVICE"
fi
cuda_row() {  # name: returns 1 (after reporting) when there is no device
  if [[ -n "$NO_DEVICE" ]]; then fail "$1: $NO_DEVICE"; return 1; fi
  return 0
}

# ---------------------------------------------------------------------------------------------
say "== (a) correctness"

say "-- stories260K greedy ids vs reference_greedy.json"
REFG="$MODELS/reference_greedy.json"
[[ -f "$REFG" ]] || REFG="$OUT/reference_greedy.json"
NCASES=$($PY -c "import json,sys; print(len(json.load(open(sys.argv[1]))))" "$REFG")
for b in cuda cuda-perop cuda-graph; do
  cuda_row "greedy $b" || continue
  for ((c = 0; c < NCASES; ++c)); do
    # run.c semantics (tests/e2e/test_stories.cpp): positions 0..steps-1, sampling from the last prompt token.
    read -r n prompt_json < <($PY -c "
import json,sys; c=json.load(open(sys.argv[1]))[int(sys.argv[2])]
print(c['steps'] - len(c['prompt_ids']) + 1, json.dumps(c['prompt']))" "$REFG" "$c")
    prompt=$($PY -c "import json,sys; print(json.loads(sys.argv[1]))" "$prompt_json")
    f="$OUT/greedy_${b}_$c.json"
    if timeout 120 "$BIN" run --json --temp 0 --backend "$b" -m "$STORIES" -n "$n" -p "$prompt" >"$f" 2>"$ERR"; then
      if $PY -c "
import json,sys; e=json.load(open(sys.argv[1]))[int(sys.argv[2])]; g=json.load(open(sys.argv[3]))
sys.exit(0 if g['generated_ids']==e['generated_ids'] and g['prompt_ids']==e['prompt_ids'] else 1)" "$REFG" "$c" "$f"; then
        pass "greedy $b case $c ($n tokens) equals the reference"
      else
        fail "greedy $b case $c differs from the reference (see $f)"
      fi
    else
      fail "greedy $b case $c: $(last_err)"
    fi
  done
done

# Relative L2 of logits_last in two JSON files (logits command / reference.json).
rel_l2() {
  $PY -c "
import json,math,sys
a=json.load(open(sys.argv[1]))['logits_last']; b=json.load(open(sys.argv[2]))['logits_last']
if len(a)!=len(b) or any(math.isnan(x) or math.isinf(x) for x in a): print('inf'); sys.exit()
print('%.3e' % math.sqrt(sum((x-y)**2 for x,y in zip(a,b))/max(1e-30,sum(y*y for y in b))))" "$1" "$2"
}
below() { $PY -c "import sys; sys.exit(0 if float(sys.argv[1]) < float(sys.argv[2]) else 1)" "$1" "$2"; }

say "-- synth:llama3.2-1b: last-position logits of an 8-token prompt, cuda vs cpu (16 threads)"
IDS8="128000,791,4062,14198,39935,35308,927,279"
if cuda_row "1B logits"; then
  if timeout 300 env MK_CUDA_VERBOSE=1 "$BIN" logits -m synth:llama3.2-1b --ids "$IDS8" --backend cuda >"$OUT/l1b_cuda.json" 2>"$ERR"; then
    if timeout 300 "$BIN" logits -m synth:llama3.2-1b --ids "$IDS8" --backend cpu -t 16 >"$OUT/l1b_cpu.json" 2>"$ERR"; then
      r=$(rel_l2 "$OUT/l1b_cuda.json" "$OUT/l1b_cpu.json")
      if below "$r" 1e-2; then pass "1B logits: relative L2 $r"; else fail "1B logits: relative L2 $r >= 1e-2"; fi
    else
      fail "1B cpu oracle: $(last_err)"
    fi
  else
    fail "1B logits on cuda: $(last_err)"
  fi
fi

say "-- watchdog: one unsatisfiable wait must end in the watchdog error"
if cuda_row "watchdog"; then
  t0=$(date +%s)
  timeout 120 env MK_DEBUG_BREAK_WAIT=1 MK_CUDA_WAIT_TIMEOUT_MS=2000 "$BIN" logits -m "$STORIES" --ids 1,403,407 --backend cuda \
    >/dev/null 2>"$ERR"
  rc=$?
  secs=$(($(date +%s) - t0))
  if [[ $rc == 1 ]] && grep -q "waited more than" "$ERR"; then
    pass "watchdog after ${secs} s: $(last_err | cut -c1-200)"
  else
    fail "watchdog: exit $rc after ${secs} s (124 = hang killed by timeout): $(last_err | cut -c1-200)"
  fi
fi

say "-- HF bf16 fixtures: logits_last of cuda vs transformers (relative L2 < 1e-2)"
for d in "$HF"/*_bfloat16; do
  fam=$(basename "$d")
  cuda_row "$fam" || continue
  ids=$($PY -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['prompt_ids'])))" "$d/reference.json")
  if timeout 120 "$BIN" logits -m "$d" --ids "$ids" --backend cuda >"$OUT/hf_$fam.json" 2>"$ERR"; then
    r=$(rel_l2 "$OUT/hf_$fam.json" "$d/reference.json")
    if below "$r" 1e-2; then pass "$fam: relative L2 $r"; else fail "$fam: relative L2 $r >= 1e-2"; fi
  else
    fail "$fam: $(last_err)"
  fi
done

# ---------------------------------------------------------------------------------------------
say "== (b) decode timing: 64 greedy tokens, ms/token from the run's own decode timer"
# Weight bytes read per token: every matrix once (the tied 1B classifier reads the embedding table),
# norms in f32 (embedding lookups read one row: negligible).
weight_bytes() {  # n_vocab n_embd n_layer n_head n_head_kv n_ff tied
  $PY -c "
import sys; V,E,L,H,K,F,T=map(int,sys.argv[1:]); hd=E//H
per=(E*H*hd+2*E*K*hd+H*hd*E+3*E*F)*2+2*E*4
print(V*E*2*(1 if T else 2)+L*per+E*4)" "$@"
}
B1=$(weight_bytes 128256 2048 16 32 8 8192 1)
B8=$(weight_bytes 128256 4096 32 32 8 14336 0)
printf "%-14s %-11s %10s %10s %8s\n" model backend ms/token GB/s "%copy" | tee -a "$LOG"
for m in "llama3.2-1b $B1" "llama3.1-8b $B8"; do
  read -r name bytes <<<"$m"
  for b in cuda cuda-graph cuda-perop; do
    if [[ -n "$NO_DEVICE" ]]; then
      printf "%-14s %-11s %s\n" "$name" "$b" "no device: $NO_DEVICE" | tee -a "$LOG"
      FAILED=1
      continue
    fi
    f="$OUT/time_${name}_$b.json"
    if timeout 240 "$BIN" run --json --temp 0 --ignore-eos -m "synth:$name" -z "$TOK" -p "Once upon a time" -n 64 --backend "$b" \
      >"$f" 2>"$ERR"; then
      $PY -c "
import json,sys; r=json.load(open(sys.argv[1])); ms=r['ms_per_token']; b=float(sys.argv[2]); c=float(sys.argv[3])
gbs=b/(ms*1e-3)/1e9 if ms>0 else 0
print('%-14s %-11s %10.3f %10.0f %7.1f%%' % (sys.argv[4], sys.argv[5], ms, gbs, 100*gbs/c if c>0 else 0))" \
        "$f" "$bytes" "$COPY_GBPS" "$name" "$b" | tee -a "$LOG"
    else
      printf "%-14s %-11s %s\n" "$name" "$b" "failed: $(last_err | cut -c1-160)" | tee -a "$LOG"
      FAILED=1
    fi
  done
done
say "(weight bytes per token: 1B $B1, 8B $B8; copy bandwidth ${COPY_GBPS} GB/s, bytes read + written)"

# ---------------------------------------------------------------------------------------------
say "== (c) compile time of synth:llama3.2-1b (passes + codegen + NVRTC + module load)"
if cuda_row "compile time"; then
  for kind in cold cached; do
    [[ $kind == cold ]] && rm -rf "$XDG_CACHE_HOME"
    if timeout 300 env MK_CUDA_VERBOSE=1 "$BIN" logits -m synth:llama3.2-1b --ids 128000 --backend cuda >/dev/null 2>"$ERR"; then
      say "$kind: $(grep -m1 '^cuda compile:' "$ERR")"
    else
      fail "$kind compile: $(last_err)"
    fi
  done
fi

say "elapsed: $(($(date +%s) - T_START)) s"
if [[ $FAILED == 0 ]]; then say "ALL CHECKS PASSED"; else say "SOME CHECKS FAILED (log: $LOG)"; fi
exit $FAILED
