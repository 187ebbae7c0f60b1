#!/usr/bin/env bash
# Device check for the CUDA backends (issues 4 and 8).
#
#   bench/device_check.sh --prepare      here (no GPU needed): builds the CLI for any x86-64-v3 CPU
#                                        (not -march=native: the device's CPU differs) into
#                                        build-devcheck/, copies it, the shared libraries the device
#                                        image may lack (all but glibc, libstdc++ and CUDA's),
#                                        stories260K and the bf16 HF fixtures with their references
#                                        into .devcheck/ (git-ignored: name it in the device tool's
#                                        `carry`, about 20 MB).
#   bench/device_check.sh part1          on the GPU machine: correctness + the 1B rows (< 5 min)
#   bench/device_check.sh part2          on the GPU machine: the 8B rows (< 5 min)
#   bench/device_check.sh tune           on the GPU machine: the megakernel's variants side by side
#                                        (descriptor preload, one tile per SM, L2 policy, splits)
#   bench/device_check.sh [all]          both parts in one call (a dry run here reports the driver
#                                        error on every CUDA row and exits non-zero)
#   bench/device_check.sh --rehearse [part1|part2|all|tune]
#                                        here, in CI (tests/scripts/device_check_rehearsal.sh): every
#                                        row with `cpu` (and `cuda-emu` when the binary has it) in place
#                                        of the GPU backends and small shapes in place of 1B/8B, so the
#                                        script itself is tested before a device sees it.
#
# Rows
#  part1 (a) correctness
#      - stories260K greedy ids on cuda, cuda-perop and cuda-graph equal reference_greedy.json (every
#        case; the reference backend reproduces that file in tests/e2e/test_stories.cpp);
#      - synth:llama3.2-1b, 8-token prompt: last-position logits of cuda within relative L2 1e-2 of
#        the cpu backend with 16 threads (the oracle: the cpu interpreter is checked against the
#        reference backend by the e2e tests; the reference backend would take minutes on 1B);
#      - watchdog: MK_DEBUG_BREAK_WAIT=1 makes one wait unsatisfiable; the run must end with the
#        watchdog error (exit 1, "waited more than") within its timeout, not hang;
#      - every bf16 HF fixture: logits_last of cuda within relative L2 1e-2 of transformers';
#      - the in-repo fixtures (tests/data: gemma2 soft-caps, gemma3, phi3_longrope, iq4_nl, iq4_xs,
#        qwen3moe's mixtures of experts: Qwen3-MoE, Mixtral layout, Q8_0 experts):
#        logits_last of cuda within relative L2 1e-3 of the reference backend (also in `tune`).
#      - flash-decoding: stories260K greedy (case 0) on cuda with --attn-splits 1 and 7 (the
#        default rows above run the backend's automatic splits).
#  part1 (b) + part2: ms/token of greedy decode (64 tokens; 16 in rehearsal, after a 4-token prompt given as ids: the
#      synthetic shapes have no tokenizer), effective GB/s = weight bytes read per token / time, and
#      its share of the device-to-device copy bandwidth measured in the same call (`megakernel
#      bench-copy`), for cuda, cuda-graph and cuda-perop (automatic attention splits), and on the
#      float shapes cuda/s1 (cuda with --attn-splits 1: no flash-decoding); part1 on
#      synth:llama3.2-1b and the same shape quantized to q4_1 (synth:llama3.2-1b:q4_1: the weights
#      are synthesised and quantized on the device machine, no file is carried), part2 on
#      synth:llama3.1-8b and the 1B in q4_K. Each row also logs its `<backend> compile:` line (MK_CUDA_VERBOSE).
#  part1 (c) / part2: compile time: the host passes (`compile --emit program -t 132`, shapes only)
#      and, part1, cold (empty NVRTC cache) and cached compile of the 1B (`cuda compile:` line; a missing one fails).
#
# Output: $OUT (default /tmp/mk_device_check/out) receives exactly two files per call,
# device_check_<part>.log and device_check_<part>.tar.gz (every JSON and stderr file of the call);
# the work folder and the NVRTC cache stay under /tmp/mk_device_check. Each part stops starting new
# rows after MK_DEVCHECK_BUDGET_S seconds (default 280; 560 for `all`) and reports the rest as skipped. Exit status
# 0 only if every row that ran passed.
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
  # Every library the binary links except glibc's, the compiler runtime's and CUDA's (the device
  # image has its own NVRTC and driver; a Debian libstdc++ would be older than the one NVRTC needs).
  ldd build-devcheck/megakernel | awk '/=> \// {print $3}' \
    | grep -vE '/(libc|libm|libpthread|librt|libdl|ld-linux[^/]*|libstdc\+\+|libgcc_s|libnvrtc[^/]*|libcuda)\.so' \
    | xargs -r -I{} cp -L {} "$DC/lib/"
  cp "$SHARED"/models/stories260K/{stories260K.gguf,tok512.bin,reference_greedy.json} "$DC/models/"
  for d in "$SHARED"/fixtures/hf/*_bfloat16; do cp -r "$d" "$DC/hf/"; done
  du -sh "$DC"
  exit 0
fi

REHEARSE=0
PART=all
for a in "$@"; do
  case "$a" in
    --rehearse) REHEARSE=1 ;;
    -h | --help) sed -n '2,/^set -uo pipefail/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    part1 | part2 | all | tune) PART=$a ;;
    *) echo "error: unknown argument '$a' (usage: $0 [--prepare | [--rehearse] [part1|part2|all|tune]])" >&2; exit 2 ;;
  esac
done

TMPROOT="${MK_DEVCHECK_TMP:-/tmp/mk_device_check}"
OUT="${OUT:-$TMPROOT/out}"
WORK="$TMPROOT/work_$PART$([[ $REHEARSE == 1 ]] && echo _rehearse)"
mkdir -p "$OUT"
rm -rf "$WORK" && mkdir -p "$WORK"
LOG="$OUT/device_check_$PART.log"
TARBALL="$OUT/device_check_$PART.tar.gz"
rm -f "$TARBALL"
: >"$LOG"
T_START=$(date +%s)
BUDGET="${MK_DEVCHECK_BUDGET_S:-$([[ $PART == all ]] && echo 560 || echo 280)}"  # seconds of rows per call
say() { echo "$*" | tee -a "$LOG"; }
FAILED=0
fail() { say "FAIL: $*"; FAILED=1; }
pass() { say "PASS: $*"; }
skip() { say "SKIP: $*"; }
PY=python3
# One tarball of the work folder, whatever way the script ends (a timeout's SIGTERM included).
finish() {
  tar czf "$TARBALL" -C "$WORK" . 2>/dev/null || true
}
trap finish EXIT
trap 'say "interrupted after $(($(date +%s) - T_START)) s"; exit 1' TERM INT

# Seconds left in this call's budget; rows start only with time left, and never run past it.
left() { echo $((BUDGET - ($(date +%s) - T_START))); }
tmo() {  # tmo SECONDS: the smaller of SECONDS and the budget left (at least 1)
  local l
  l=$(left)
  ((l < $1)) && echo $((l > 1 ? l : 1)) || echo "$1"
}
have_time() {  # have_time ROW: false (after reporting the skip) when the budget is spent
  if (($(left) < 5)); then skip "$1: the ${BUDGET} s budget of this call is spent"; return 1; fi
  return 0
}

if [[ $REHEARSE == 1 ]]; then
  BIN="${MK_BIN:-$ROOT/build/megakernel}"
  [[ -x "$BIN" ]] || { say "error: $BIN not found (build it, or set MK_BIN)"; exit 1; }
  MODELS="$SHARED/models/stories260K"
  HF="$SHARED/fixtures/hf"
elif [[ -x "$DC/megakernel" ]]; then
  BIN="$DC/megakernel"
  export LD_LIBRARY_PATH="$DC/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
  MODELS="$DC/models"
  HF="$DC/hf"
else
  say "no .devcheck/: building with CMake"
  timeout 900 cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DMK_BUILD_TESTS=OFF -DMK_BUILD_BENCH=OFF \
    -DMK_NATIVE=OFF >>"$WORK/build.txt" 2>&1 || { say "configure failed"; tail -20 "$WORK/build.txt" | tee -a "$LOG"; exit 1; }
  timeout 900 cmake --build build-device --target megakernel >>"$WORK/build.txt" 2>&1 \
    || { say "build failed"; tail -40 "$WORK/build.txt" | tee -a "$LOG"; exit 1; }
  BIN="$ROOT/build-device/megakernel"
  MODELS="$SHARED/models/stories260K"
  HF="$SHARED/fixtures/hf"
  T_START=$(date +%s)  # the build does not count against the rows' budget
fi
STORIES="$MODELS/stories260K.gguf"
REFG="$MODELS/reference_greedy.json"
export XDG_CACHE_HOME="$TMPROOT/cache"  # NVRTC cache: under /tmp, not in $OUT
export MK_CUDA_WAIT_TIMEOUT_MS="${MK_CUDA_WAIT_TIMEOUT_MS:-10000}"
ERR="$WORK/err.txt"
: >"$ERR"
last_err() { grep -m1 -E '^error:' "$ERR" || tail -1 "$ERR"; }
keep_err() { cp "$ERR" "$WORK/$1.err" 2>/dev/null || true; }  # the row's stderr goes into the tarball

say "== device_check $PART ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(git rev-parse --short HEAD 2>/dev/null || echo '?'), budget ${BUDGET} s)"
# Backends and shapes. On the device: the GPU backends and the real shapes. Rehearsal: `cpu` (and
# `cuda-emu` when this binary has it: the unknown-backend error lists the available ones) and small
# shapes; the oracle of the logits row becomes `reference`, which differs from `cpu` in every kernel.
if [[ $REHEARSE == 1 ]]; then
  avail=$("$BIN" logits -m "$STORIES" --ids 1 --backend '?' 2>&1 | sed -n '/available: /{s/.*available: //; s/ (see --help)$//; p}')
  BACKENDS=(cpu)
  [[ ",${avail// /}," == *",cuda-emu,"* ]] && BACKENDS+=(cuda-emu)
  MAIN="${BACKENDS[-1]}"  # stands in for `cuda` in the rows that run one backend
  # Small enough for cuda-emu (fibers for threads) to stay within CI time; the "8B" is the larger.
  SHAPE1="synth:stories260k:bf16"
  SHAPE8="synth:stories15m:bf16"
  # Quantized rows: q4_1 / q4_K where rows are whole blocks; stories260k's 172-wide ffn_down stays
  # f32 and its 64-wide rows fall back to q8_0 for q4_K (synth.h), so both rows still run quantized
  # device code (q4_1, q8_0) on cuda-emu in seconds.
  SHAPE1Q="synth:stories260k:q4_1"
  SHAPE1QK="synth:stories260k:q4_K"
  N_DECODE=16
  ORACLE=(--backend reference)
  say "== rehearsal on $(hostname): ${BACKENDS[*]} in place of cuda, cuda-graph, cuda-perop; $SHAPE1 for the 1B rows, $SHAPE8 for the 8B rows (available backends: $avail)"
else
  BACKENDS=(cuda cuda-graph cuda-perop)
  MAIN=cuda
  SHAPE1="synth:llama3.2-1b"
  SHAPE8="synth:llama3.1-8b"
  SHAPE1Q="synth:llama3.2-1b:q4_1"
  SHAPE1QK="synth:llama3.2-1b:q4_K"
  N_DECODE=64
  ORACLE=(--backend cpu -t 16)
fi
# Token ids valid in every vocabulary here (stories260K has 512): the synthetic shapes have no
# tokenizer, and their random weights make any ids as good as any others.
IDS8="1,403,407,261,54,315,29,440"
IDS_PROMPT="1,403,407,261"

if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,memory.total --format=csv 2>&1 | tee -a "$LOG"
else
  say "nvidia-smi: not found"
fi

# The copy bandwidth doubles as the driver probe: without a device every CUDA row below reports the
# same driver error instead of synthesising multi-GB models for nothing. The rehearsal runs the probe
# too (it must fail cleanly, not crash) but needs no device.
COPY_GBPS=0
NO_DEVICE=""
if timeout 120 "$BIN" bench-copy --mib 1024 --reps 20 >"$WORK/copy.json" 2>"$ERR"; then
  COPY_GBPS=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['gbps'])" "$WORK/copy.json")
  say "device-to-device copy: $(cat "$WORK/copy.json")"
else
  rc=$?
  msg="$(last_err)"
  keep_err copy
  if [[ $REHEARSE == 1 ]]; then
    # No GPU here: the probe must end with an error message, not a crash or a hang.
    if [[ $rc == 1 && "$msg" == error:* ]]; then skip "bench-copy (rehearsal, no GPU): $msg"; else fail "bench-copy: exit $rc: $msg"; fi
  else
    NO_DEVICE="$msg"
    fail "bench-copy: $NO_DEVICE"
  fi
fi
gpu_row() {  # gpu_row NAME: false (after reporting) when there is no device or no time left
  if [[ -n "$NO_DEVICE" ]]; then fail "$1: $NO_DEVICE"; return 1; fi
  have_time "$1"
}

# Relative L2 of logits_last in two JSON files (logits command / reference.json).
rel_l2() {
  $PY -c "
import json,math,sys
a=json.load(open(sys.argv[1]))['logits_last']; b=json.load(open(sys.argv[2]))['logits_last']
if len(a)!=len(b) or any(math.isnan(x) or math.isinf(x) for x in a): print('inf'); sys.exit()
print('%.3e' % math.sqrt(sum((x-y)**2 for x,y in zip(a,b))/max(1e-30,sum(y*y for y in b))))" "$1" "$2"
}
below() { $PY -c "import sys; sys.exit(0 if float(sys.argv[1]) < float(sys.argv[2]) else 1)" "$1" "$2"; }

# ---------------------------------------------------------------------------------------------
correctness() {
  say "== (a) correctness"
  say "-- stories260K greedy ids vs reference_greedy.json"
  local ncases b c n prompt_json prompt f r t0 rc secs fam d ids s
  ncases=$($PY -c "import json,sys; print(len(json.load(open(sys.argv[1]))))" "$REFG")
  for b in "${BACKENDS[@]}"; do
    for ((c = 0; c < ncases; ++c)); do
      gpu_row "greedy $b case $c" || continue
      # run.c semantics (tests/e2e/test_stories.cpp): positions 0..steps-1, sampling from the last prompt token.
      read -r n prompt_json < <($PY -c "
import json,sys; c=json.load(open(sys.argv[1]))[int(sys.argv[2])]
print(c['steps'] - len(c['prompt_ids']) + 1, json.dumps(c['prompt']))" "$REFG" "$c")
      prompt=$($PY -c "import json,sys; print(json.loads(sys.argv[1]))" "$prompt_json")
      f="$WORK/greedy_${b}_$c.json"
      if timeout "$(tmo 120)" "$BIN" run --json --temp 0 --backend "$b" -m "$STORIES" -n "$n" -p "$prompt" >"$f" 2>"$ERR"; then
        if $PY -c "
import json,sys; e=json.load(open(sys.argv[1]))[int(sys.argv[2])]; g=json.load(open(sys.argv[3]))
sys.exit(0 if g['generated_ids']==e['generated_ids'] and g['prompt_ids']==e['prompt_ids'] else 1)" "$REFG" "$c" "$f"; then
          pass "greedy $b case $c ($n tokens) equals the reference"
        else
          fail "greedy $b case $c differs from the reference (see $(basename "$f") in the tarball)"
        fi
      else
        fail "greedy $b case $c: $(last_err)"
        keep_err "greedy_${b}_$c"
      fi
    done
  done

  # The GPU backends split attention (flash-decoding) by default, ceil(SMs / n_head_kv) ranges; the
  # rehearsal's few emulated blocks would not split, so this row names odd splits explicitly.
  say "-- flash-decoding: stories260K greedy on $MAIN with --attn-splits 1 and 7 (case 0)"
  for s in 1 7; do
    gpu_row "greedy $MAIN --attn-splits $s" || continue
    read -r n prompt_json < <($PY -c "
import json,sys; c=json.load(open(sys.argv[1]))[0]
print(c['steps'] - len(c['prompt_ids']) + 1, json.dumps(c['prompt']))" "$REFG")
    prompt=$($PY -c "import json,sys; print(json.loads(sys.argv[1]))" "$prompt_json")
    f="$WORK/greedy_${MAIN}_s$s.json"
    if timeout "$(tmo 120)" "$BIN" run --json --temp 0 --backend "$MAIN" --attn-splits "$s" -m "$STORIES" -n "$n" -p "$prompt" >"$f" 2>"$ERR"; then
      if $PY -c "
import json,sys; e=json.load(open(sys.argv[1]))[0]; g=json.load(open(sys.argv[2]))
sys.exit(0 if g['generated_ids']==e['generated_ids'] else 1)" "$REFG" "$f"; then
        pass "greedy $MAIN --attn-splits $s ($n tokens) equals the reference"
      else
        fail "greedy $MAIN --attn-splits $s differs from the reference (see $(basename "$f") in the tarball)"
      fi
    else
      fail "greedy $MAIN --attn-splits $s: $(last_err)"
      keep_err "greedy_${MAIN}_s$s"
    fi
  done

  say "-- $SHAPE1: last-position logits of an 8-token prompt, $MAIN vs ${ORACLE[*]}"
  if gpu_row "$SHAPE1 logits"; then
    if timeout "$(tmo 240)" env MK_CUDA_VERBOSE=1 "$BIN" logits -m "$SHAPE1" --ids "$IDS8" --backend "$MAIN" >"$WORK/l1b_$MAIN.json" 2>"$ERR"; then
      keep_err "l1b_$MAIN"
      if timeout "$(tmo 240)" "$BIN" logits -m "$SHAPE1" --ids "$IDS8" "${ORACLE[@]}" >"$WORK/l1b_oracle.json" 2>"$ERR"; then
        r=$(rel_l2 "$WORK/l1b_$MAIN.json" "$WORK/l1b_oracle.json")
        if below "$r" 1e-2; then pass "$SHAPE1 logits: relative L2 $r"; else fail "$SHAPE1 logits: relative L2 $r >= 1e-2"; fi
      else
        fail "$SHAPE1 oracle: $(last_err)"
        keep_err l1b_oracle
      fi
    else
      fail "$SHAPE1 logits on $MAIN: $(last_err)"
      keep_err "l1b_$MAIN"
    fi
  fi

  say "-- watchdog: one unsatisfiable wait must end in the watchdog error"
  if [[ $REHEARSE == 1 && $MAIN == cpu ]]; then
    skip "watchdog (rehearsal): MK_DEBUG_BREAK_WAIT is a device-side injection; cpu has no such hook (cuda-emu runs it)"
  elif gpu_row "watchdog"; then
    t0=$(date +%s)
    timeout "$(tmo 120)" env MK_DEBUG_BREAK_WAIT=1 MK_CUDA_WAIT_TIMEOUT_MS=2000 "$BIN" logits -m "$STORIES" --ids 1,403,407 --backend "$MAIN" \
      >/dev/null 2>"$ERR"
    rc=$?
    secs=$(($(date +%s) - t0))
    keep_err watchdog
    if [[ $rc == 1 ]] && grep -q "waited more than" "$ERR"; then
      pass "watchdog after ${secs} s: $(last_err | cut -c1-200)"
    else
      fail "watchdog: exit $rc after ${secs} s (124 = hang killed by timeout): $(last_err | cut -c1-200)"
    fi
  fi

  say "-- HF bf16 fixtures: logits_last of $MAIN vs transformers (relative L2 < 1e-2)"
  for d in "$HF"/*_bfloat16; do
    fam=$(basename "$d")
    gpu_row "$fam" || continue
    ids=$($PY -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['prompt_ids'])))" "$d/reference.json")
    if timeout "$(tmo 120)" "$BIN" logits -m "$d" --ids "$ids" --backend "$MAIN" >"$WORK/hf_$fam.json" 2>"$ERR"; then
      r=$(rel_l2 "$WORK/hf_$fam.json" "$d/reference.json")
      if below "$r" 1e-2; then pass "$fam: relative L2 $r"; else fail "$fam: relative L2 $r >= 1e-2"; fi
    else
      fail "$fam: $(last_err)"
      keep_err "hf_$fam"
    fi
  done
  fixtures_row
}

# In-repo fixtures of features and weight types no GPU row above reaches (Gemma 2's soft-caps and
# windows, Gemma 3, Phi-3 LongRoPE, iq4_nl and iq4_xs weights written by llama.cpp's quantizer,
# mixtures of experts):
# logits_last of $MAIN within relative L2 1e-3 of the reference backend (float activations on both;
# cuda-emu measured ~1e-6 of it), and, for the log, the distance to llama.cpp's own last row.
fixtures_row() {
  say "-- in-repo fixtures: logits_last of $MAIN vs reference (relative L2 < 1e-3)"
  local name f ids ctx r r2 tol=1e-3
  [[ $MAIN == cpu ]] && tol=1e-1  # cpu quantizes activations to q8 as llama.cpp does (qwen3moe q8_0: 4.2e-2)
  # <folder>[:<file>:<expected.json key of its logits>]; a folder alone: its first GGUF, "logits"
  local spec dir file key
  for spec in gemma2 gemma3 phi3_longrope iq4_nl iq4_xs qwen3moe:qwen3moe-tiny.f32.gguf: \
      qwen3moe:mixtral-tiny.f32.gguf:mixtral qwen3moe:qwen3moe-tiny.q8_0.gguf:q8_0; do
    IFS=: read -r dir file key <<<"$spec"
    name=$dir${file:+/${file%.gguf}}
    gpu_row "fixture $name" || continue
    if [[ -n $file ]]; then f="$ROOT/tests/data/$dir/$file"; else f=$(ls "$ROOT/tests/data/$dir"/*.gguf | head -1); fi
    name=${name//\//_}
    read -r ids ctx < <($PY -c "
import json,sys; d=json.load(open(sys.argv[1]))
print(','.join(map(str, d['prompt_ids'])), d['long']['n_ctx'] if 'long' in d else len(d['prompt_ids']))" "$ROOT/tests/data/$dir/expected.json")
    if timeout "$(tmo 120)" "$BIN" logits -m "$f" --ids "$ids" -c "$ctx" --backend "$MAIN" >"$WORK/fx_$name.json" 2>"$ERR"; then
      keep_err "fx_$name"
      if timeout "$(tmo 120)" "$BIN" logits -m "$f" --ids "$ids" -c "$ctx" --backend reference >"$WORK/fx_${name}_ref.json" 2>"$ERR"; then
        r=$(rel_l2 "$WORK/fx_$name.json" "$WORK/fx_${name}_ref.json")
        r2=$($PY -c "
import json,math,sys
a=json.load(open(sys.argv[1]))['logits_last']; d=json.load(open(sys.argv[2])); b=(d[sys.argv[3]] if sys.argv[3] else d['long'] if 'long' in d else d)['logits'][-1]
print('%.3e' % math.sqrt(sum((x-y)**2 for x,y in zip(a,b))/max(1e-30,sum(y*y for y in b))))" "$WORK/fx_$name.json" "$ROOT/tests/data/$dir/expected.json" "$key")
        if below "$r" "$tol"; then pass "fixture $name: relative L2 $r (llama.cpp's last row: $r2)"; else fail "fixture $name: relative L2 $r >= $tol (llama.cpp's last row: $r2)"; fi
      else
        fail "fixture $name reference: $(last_err)"
        keep_err "fx_${name}_ref"
      fi
    else
      fail "fixture $name on $MAIN: $(last_err)"
      keep_err "fx_$name"
    fi
  done
}

# ---------------------------------------------------------------------------------------------
# Weight bytes read per token, from `info` (shapes only): every tensor once, except the token
# embedding of an untied model (a lookup reads one row); a tied model's classifier reads all of it.
weight_bytes() {
  "$BIN" info -m "$1" 2>"$ERR" | $PY -c "
import re,sys
total=embd=0; tied=True
for line in sys.stdin:
    m=re.match(r'\s*(\S+)\s+\S+\s+\[[^\]]*\]\s+(\d+) bytes', line)
    if m and m.group(1)=='token_embd.weight': embd=int(m.group(2))
    if m and m.group(1)=='output.weight': tied=False
    m=re.match(r'total: (\d+) bytes', line)
    if m: total=int(m.group(1))
print(total if tied else total-embd)"
}

timing() {  # timing SHAPE
  local shape=$1 bytes b f line
  say "== decode timing on $shape: $N_DECODE greedy tokens after a 4-token prompt (--ids), ms/token from the run's own decode timer"
  bytes=$(weight_bytes "$shape")
  printf "%-24s %-11s %10s %10s %8s\n" model backend ms/token GB/s "%copy" | tee -a "$LOG"
  # Rows: each backend with its default (the GPU backends: flash-decoding splits, auto), then, on
  # the float shapes, the megakernel with one unsplit attention op per KV group ("$MAIN/s1"): what
  # the splits gain.
  local row extra rows=("${BACKENDS[@]}")
  [[ $shape == *:q* ]] || rows+=("$MAIN/s1")
  for row in "${rows[@]}"; do
    b=${row%/s1}
    extra=()
    [[ $row == */s1 ]] && extra=(--attn-splits 1)
    if [[ -n "$NO_DEVICE" ]]; then
      printf "%-24s %-11s %s\n" "$shape" "$row" "no device: $NO_DEVICE" | tee -a "$LOG"
      FAILED=1
      continue
    fi
    have_time "timing $shape $row" || continue
    f="$WORK/time_${shape//[:.]/_}_${row//\//_}.json"
    if timeout "$(tmo 240)" env MK_CUDA_VERBOSE=1 "$BIN" run --json --temp 0 --ignore-eos -m "$shape" --ids "$IDS_PROMPT" -n "$N_DECODE" \
      --backend "$b" "${extra[@]}" >"$f" 2>"$ERR"; then
      $PY -c "
import json,sys; r=json.load(open(sys.argv[1])); ms=r['ms_per_token']; b=float(sys.argv[2]); c=float(sys.argv[3])
assert len(r['generated_ids'])==int(sys.argv[6]), 'expected %s generated ids, got %d' % (sys.argv[6], len(r['generated_ids']))
gbs=b/(ms*1e-3)/1e9 if ms>0 else 0
print('%-24s %-11s %10.3f %10.1f %7s' % (sys.argv[4], sys.argv[5], ms, gbs, '%.1f%%' % (100*gbs/c) if c>0 else 'n/a'))" \
        "$f" "$bytes" "$COPY_GBPS" "$shape" "$row" "$N_DECODE" 2>>"$ERR" | tee -a "$LOG"
      [[ ${PIPESTATUS[0]} == 0 ]] || fail "timing $shape $row: $(tail -1 "$ERR")"
      line=$(grep -m1 "^$b compile:" "$ERR") && say "   $row $line"  # the CUDA backends' (MK_CUDA_VERBOSE)
    else
      printf "%-24s %-11s %s\n" "$shape" "$row" "failed: $(last_err | cut -c1-160)" | tee -a "$LOG"
      FAILED=1
    fi
    keep_err "time_${shape//[:.]/_}_${row//\//_}"
  done
  say "(weight bytes per token: $bytes; copy bandwidth ${COPY_GBPS} GB/s, bytes read + written)"
}

host_compile() {  # host_compile SHAPE: the passes for 132 workers from shapes alone
  local shape=$1 t0 ms
  have_time "compile $shape" || return
  t0=$(date +%s%N)
  if timeout "$(tmo 120)" env MK_TIME_PASSES=1 "$BIN" compile -m "$shape" --emit program -t 132 -o "$WORK/program.txt" 2>"$ERR"; then
    ms=$((($(date +%s%N) - t0) / 1000000))
    pass "host compile of $shape (132 workers, shapes only): $ms ms ($(grep -m1 instructions "$ERR" | cut -c1-100))"
  else
    fail "host compile of $shape: $(last_err)"
  fi
  keep_err "compile_${shape//[:.]/_}"
  rm -f "$WORK/program.txt"
}

device_compile() {  # device_compile SHAPE: cold and cached NVRTC compile (MK_CUDA_VERBOSE line)
  local shape=$1 kind line
  say "== compile time of $shape on $MAIN (passes + codegen + NVRTC + module load)"
  for kind in cold cached; do
    gpu_row "$kind compile" || continue
    [[ $kind == cold ]] && rm -rf "$XDG_CACHE_HOME"
    if timeout "$(tmo 240)" env MK_CUDA_VERBOSE=1 "$BIN" logits -m "$shape" --ids 1 --backend "$MAIN" >/dev/null 2>"$ERR"; then
      if line=$(grep -m1 "^$MAIN compile:" "$ERR"); then
        say "$kind: $line"
      else
        fail "$kind compile: no '$MAIN compile:' line (MK_CUDA_VERBOSE) from $MAIN"
      fi
    else
      fail "$kind compile: $(last_err)"
    fi
    keep_err "compile_${kind}"
  done
}

# part "tune": the megakernel's variants side by side in one call, on the 1B (and the 8B) shape: the
# loop of the first GPU run (MK_CUDA_PRELOAD=0 MK_CUDA_CLAIM_AHEAD=1, one wait per token:
# MK_CUDA_DECODE_STEPS=1), the claim before the wait (MK_CUDA_CLAIM_AHEAD=1), one wait per token
# (steps1; the default issues 8 greedy steps per wait), the static schedule, one matmul tile per SM per op
# (MK_CUDA_TILES_PER_WORKER=1, large MK_CUDA_TILE_BYTES), the L2 evict-first policy on weight loads,
# q/k/v in whole heads (MK_CUDA_HEAD_TILES=1, the tiling before 2026-12-06), and attention splits. Every variant's greedy ids must equal the first variant's (any tiling and
# loop give the same bits). Then a trace of the default variant (trace_<shape>.txt: per-SM busy,
# wait, idle and the per-opcode summary).
# One matmul tile per SM per op: tiles as wide as the SM count allows (4 MB of weights at most; the
# rehearsal's emulated blocks have less shared memory for a tile's columns).
TB=$([[ $REHEARSE == 1 ]] && echo 65536 || echo 4194304)
tune() {
  local shape=$1 bytes name envs extra f ref="" ms
  bytes=$(weight_bytes "$shape")
  say "== tune on $shape: $N_DECODE greedy tokens after a 4-token prompt"
  printf "%-24s %-34s %10s %10s %8s\n" model variant ms/token GB/s "%copy" | tee -a "$LOG"
  local variants=(
    "loop0|MK_CUDA_PRELOAD=0 MK_CUDA_CLAIM_AHEAD=1 MK_CUDA_DECODE_STEPS=1|"
    "ahead|MK_CUDA_CLAIM_AHEAD=1|"
    "default||"
    "steps1|MK_CUDA_DECODE_STEPS=1|"
    "heads|MK_CUDA_HEAD_TILES=1|"
    "static-cp||--schedule static-cp"
    "1tile|MK_CUDA_TILES_PER_WORKER=1 MK_CUDA_TILE_BYTES=$TB|"
    "1tile+evict|MK_CUDA_TILES_PER_WORKER=1 MK_CUDA_TILE_BYTES=$TB MK_CUDA_EVICT_FIRST=1|"
    "evict|MK_CUDA_EVICT_FIRST=1|"
    "1tile/s1|MK_CUDA_TILES_PER_WORKER=1 MK_CUDA_TILE_BYTES=$TB|--attn-splits 1"
    "1tile/s4|MK_CUDA_TILES_PER_WORKER=1 MK_CUDA_TILE_BYTES=$TB|--attn-splits 4"
    "1tile/static-cp|MK_CUDA_TILES_PER_WORKER=1 MK_CUDA_TILE_BYTES=$TB|--schedule static-cp"
  )
  [[ -n "${MK_TUNE_VARIANTS:-}" ]] && IFS=';' read -r -a variants <<<"$MK_TUNE_VARIANTS"
  for v in "${variants[@]}"; do
    IFS='|' read -r name envs extra <<<"$v"
    if [[ -n "$NO_DEVICE" ]]; then fail "tune $shape $name: $NO_DEVICE"; continue; fi
    have_time "tune $shape $name" || continue
    f="$WORK/tune_${shape//[:.]/_}_${name//[\/+]/_}.json"
    # shellcheck disable=SC2086
    if timeout "$(tmo 120)" env MK_CUDA_VERBOSE=1 $envs "$BIN" run --json --temp 0 --ignore-eos -m "$shape" --ids "$IDS_PROMPT" \
      -n "$N_DECODE" --backend "$MAIN" $extra >"$f" 2>"$ERR"; then
      ms=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['ms_per_token'])" "$f")
      $PY -c "
import sys; ms=float(sys.argv[1]); b=float(sys.argv[2]); c=float(sys.argv[3]); gbs=b/(ms*1e-3)/1e9 if ms>0 else 0
print('%-24s %-34s %10.3f %10.1f %7s' % (sys.argv[4], sys.argv[5], ms, gbs, '%.1f%%' % (100*gbs/c) if c>0 else 'n/a'))" \
        "$ms" "$bytes" "$COPY_GBPS" "$shape" "$name" | tee -a "$LOG"
      if [[ -z "$ref" ]]; then
        ref=$f
      elif ! $PY -c "
import json,sys; a=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2])); sys.exit(0 if a['generated_ids']==b['generated_ids'] else 1)" "$ref" "$f"; then
        fail "tune $shape $name: greedy ids differ from $(basename "$ref")"
      fi
    else
      printf "%-24s %-34s %s\n" "$shape" "$name" "failed: $(last_err | cut -c1-160)" | tee -a "$LOG"
      FAILED=1
    fi
    keep_err "tune_${shape//[:.]/_}_${name//[\/+]/_}"
  done
}
trace_default() {  # trace_default SHAPE [NAME ENV...]: per-SM busy / wait / idle and the per-opcode summary
  local shape=$1 name=${2:-default} t="$WORK/trace_${1//[:.]/_}_${2:-default}"
  local envs=("${@:3}")
  gpu_row "trace $shape" || return
  if [[ $MAIN == cpu ]]; then skip "trace (rehearsal): cpu"; return; fi
  if timeout "$(tmo 120)" env "${envs[@]}" "$BIN" run --json --temp 0 --ignore-eos -m "$shape" --ids "$IDS_PROMPT" -n 8 --backend "$MAIN" \
    --trace "$t.json" >/dev/null 2>"$t.txt"; then
    say "trace of $shape ($name): $(grep -m1 '^trace:' "$t.txt")"
    sed -n '/opcode/,$p' "$t.txt" | tee -a "$LOG"
    # Per-op spans of one step, tiles per block, and the step replayed under the other claim policies.
    $PY "$ROOT/bench/trace_sim.py" "$t.json" --ops 2>&1 | awk 'NR <= 14 || /^simulated|measured/' | tee -a "$LOG"
    gzip -c "$t.json" >"$OUT/$(basename "$t").json.gz" && rm -f "$t.json"  # beside the tarball: each file back is <= 16 MB
  else
    fail "trace $shape: $(tail -1 "$t.txt")"
  fi
}

if [[ $PART == tune ]]; then
  say "-- stories260K greedy ids vs reference_greedy.json (case 0) on $MAIN, default variant"
  read -r n prompt_json < <($PY -c "
import json,sys; c=json.load(open(sys.argv[1]))[0]
print(c['steps'] - len(c['prompt_ids']) + 1, json.dumps(c['prompt']))" "$REFG")
  prompt=$($PY -c "import json,sys; print(json.loads(sys.argv[1]))" "$prompt_json")
  for v in "" "MK_CUDA_TILES_PER_WORKER=1 MK_CUDA_TILE_BYTES=$TB MK_CUDA_EVICT_FIRST=1"; do
    gpu_row "greedy $MAIN ${v:-default}" || continue
    # shellcheck disable=SC2086
    if timeout "$(tmo 60)" env $v "$BIN" run --json --temp 0 --backend "$MAIN" -m "$STORIES" -n "$n" -p "$prompt" >"$WORK/g.json" 2>"$ERR" \
      && $PY -c "
import json,sys; e=json.load(open(sys.argv[1]))[0]; g=json.load(open(sys.argv[2])); sys.exit(0 if g['generated_ids']==e['generated_ids'] else 1)" "$REFG" "$WORK/g.json"; then
      pass "greedy $MAIN ${v:-default} equals the reference"
    else
      fail "greedy $MAIN ${v:-default}: $(last_err)"
    fi
  done
  fixtures_row
  tune "$SHAPE1"
  trace_default "$SHAPE1"
  trace_default "$SHAPE1" 1tile_evict MK_CUDA_TILES_PER_WORKER=1 MK_CUDA_TILE_BYTES=$TB MK_CUDA_EVICT_FIRST=1
  MK_TUNE_VARIANTS="loop0|MK_CUDA_PRELOAD=0 MK_CUDA_CLAIM_AHEAD=1 MK_CUDA_DECODE_STEPS=1|;default||;steps1|MK_CUDA_DECODE_STEPS=1|;heads|MK_CUDA_HEAD_TILES=1|;1tile+evict|MK_CUDA_TILES_PER_WORKER=1 MK_CUDA_TILE_BYTES=$TB MK_CUDA_EVICT_FIRST=1|" tune "$SHAPE8"
  MK_TUNE_VARIANTS="loop0|MK_CUDA_PRELOAD=0 MK_CUDA_CLAIM_AHEAD=1 MK_CUDA_DECODE_STEPS=1|;default||;steps1|MK_CUDA_DECODE_STEPS=1|;1tile+evict|MK_CUDA_TILES_PER_WORKER=1 MK_CUDA_TILE_BYTES=$TB MK_CUDA_EVICT_FIRST=1|" tune "$SHAPE1Q"
fi
if [[ $PART == part1 || $PART == all ]]; then
  correctness
  rm -rf "$XDG_CACHE_HOME"  # the 1B rows start cold: the first one's `cuda compile:` line is the cold one
  timing "$SHAPE1"
  timing "$SHAPE1Q"
  say "== host compile time"
  host_compile synth:llama3.2-1b
  device_compile "$SHAPE1"
fi
if [[ $PART == part2 || $PART == all ]]; then
  rm -rf "$XDG_CACHE_HOME"
  timing "$SHAPE8"
  say "== host compile time"
  host_compile synth:llama3.1-8b
  timing "$SHAPE1QK"
fi

say "elapsed: $(($(date +%s) - T_START)) s"
if [[ $FAILED == 0 ]]; then say "ALL CHECKS PASSED"; else say "SOME CHECKS FAILED"; fi
exit $FAILED
