#!/usr/bin/env bash
# CPU speed, side by side in one run: megakernel vs llama.cpp (through llama-cpp-python) on the same
# GGUF files — SmolLM2-135M-Instruct Q4_1 (scripts/get-model.sh smollm2) and a 768-wide synthetic
# Llama quantized by llama.cpp to Q8_0 and Q4_K_M. Prints a Markdown table (docs/PERFORMANCE.md).
#
# Usage: bench/llamacpp_compare.sh [--avx2] [--threads N] [--prompt N] [--gen N] [--reps N]
#   --avx2: stand in for an AVX2-only machine on an AVX-512 CPU: llama.cpp from a second venv
#   (.../venvs/llamacpp-avx2) built with GGML_NATIVE=OFF, AVX2/FMA/F16C/BMI2 on and AVX-512/AVX-VNNI
#   off; megakernel with MK_GEMM_ISA=avx2 (its quantized tiles' AVX2 variants). Those variants are
#   compiled with the build's flags added, so in the default -march=native build on an AVX-512 CPU
#   they use EVEX encodings and 32 registers: for real AVX2 code, build with -DMK_NATIVE=OFF
#   -DCMAKE_CXX_FLAGS=-march=haswell and pass that binary as MEGAKERNEL=.../megakernel.
# Needs: build/megakernel (scripts/build.sh release megakernel), pip access to PyPI the first time:
# the venv (llama-cpp-python 0.3.16 built from source, ~10 min on 2 cores; gguf; numpy) lives in
# ${XDG_CACHE_HOME:-$HOME/.cache}/megakernel/venvs/llamacpp, generated models in .../bench/.
# llama.cpp is never a runtime dependency of megakernel.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/megakernel"
venv="$cache/venvs/llamacpp"
cmake_args="${CMAKE_ARGS:-}"
args=()
avx2=0
# The options are checked (and --help answered) before the venv build, which takes ~10 minutes.
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
while (($#)); do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    --avx2) avx2=1 ;;
    --threads | --prompt | --gen | --reps)
      [[ $# -ge 2 && "$2" =~ ^[0-9]+$ ]] || { echo "error: $1 needs a whole number (see --help)" >&2; exit 2; }
      args+=("$1" "$2"); shift ;;
    *) echo "error: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
set -- "${args[@]+"${args[@]}"}"
if ((avx2)); then
  venv="$cache/venvs/llamacpp-avx2"
  cmake_args="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF"
  export MK_GEMM_ISA=avx2
fi
bin="${MEGAKERNEL:-$root/build/megakernel}"
[[ -x "$bin" ]] || { echo "error: $bin not found (scripts/build.sh release megakernel)" >&2; exit 1; }
if ! "$venv/bin/python" -c "import llama_cpp, gguf, numpy" 2>/dev/null; then
  echo "llamacpp_compare: building llama-cpp-python in $venv (about 10 minutes)" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip
  # --no-cache-dir: pip's wheel cache is keyed by the source package, not by CMAKE_ARGS, so it would
  # hand one venv the wheel built for the other
  CMAKE_ARGS="$cmake_args" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" "$venv/bin/pip" install --quiet --no-cache-dir \
    llama-cpp-python==0.3.16 gguf numpy
fi
smollm2="$("$root/scripts/get-model.sh" smollm2)"
exec "$venv/bin/python" "$root/bench/llamacpp_compare.py" --megakernel "$bin" --model "$smollm2" \
  --synth --vocab-from "$smollm2" --work "$cache/bench" "$@"
