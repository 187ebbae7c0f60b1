#!/usr/bin/env bash
# Installs the build dependencies from Debian 12 packages. Idempotent: does nothing when present.
set -euo pipefail
PKGS=(build-essential cmake ninja-build pkg-config libcli11-dev nlohmann-json3-dev libfmt-dev
      libgtest-dev libgmock-dev libbenchmark-dev libpcre2-dev libboost-context-dev python3 libutf8proc-dev
      libcpp-httplib-dev python3-venv)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get install -y --no-install-recommends "${missing[@]}" \
    || { $SUDO apt-get update && $SUDO apt-get install -y --no-install-recommends "${missing[@]}"; }
fi

# Models the tests and the demo use when present (never stored in the repo). Best effort: offline,
# the SmolLM2 tests are skipped and the demo falls back to stories260K. MK_FETCH_MODELS=0 skips it.
if [[ "${MK_FETCH_MODELS:-1}" == 1 ]]; then
  "$(dirname "$0")/get-model.sh" smollm2 >/dev/null || echo "setup: note: SmolLM2 not fetched; its tests will be skipped" >&2
fi

# The venv with the official openai client for the serve test and benchmark (outside the repo).
# Best effort: offline, ctest Serve.OpenAIClient is skipped with a message.
if [[ "${MK_SETUP_VENV:-1}" == 1 ]]; then
  "$(dirname "$0")/../tests/scripts/openai_venv.sh" >/dev/null || echo "setup: note: no openai venv; Serve.OpenAIClient will be skipped" >&2
fi

# cuobjdump and the nvdisasm it runs for -sass, for ctest CudaSass.* (the SASS of the generated
# cubin), from NVIDIA's PyPI wheels into ~/.cache/megakernel/tools/bin when the CUDA toolkit here lacks
# them (the cuobjdump wheel does not pull nvdisasm in). Best effort: offline, the tests are skipped
# with a message. MK_SETUP_CUOBJDUMP=0 skips it.
install_cuda_tool() {  # $1: executable name, $2: PyPI package
  local tools="${HOME}/.cache/megakernel/tools" bin
  if command -v "$1" >/dev/null || [[ -x "/usr/local/cuda/bin/$1" || -x "$tools/bin/$1" ]]; then return 0; fi
  if python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$tools/py/$1" "$2>=13,<14" 2>/dev/null \
    && bin=$(find "$tools/py/$1" -type f -name "$1" | head -1) && [[ -n "$bin" ]]; then
    mkdir -p "$tools/bin" && ln -sf "$bin" "$tools/bin/$1" && chmod +x "$bin"
  else
    echo "setup: note: $1 not installed; CudaSass.* will be skipped" >&2
  fi
}
if [[ "${MK_SETUP_CUOBJDUMP:-1}" == 1 ]]; then
  install_cuda_tool cuobjdump nvidia-cuda-cuobjdump
  install_cuda_tool nvdisasm nvidia-cuda-nvdisasm
fi
