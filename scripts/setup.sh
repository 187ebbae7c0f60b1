#!/usr/bin/env bash
# Installs the build dependencies from Debian 12 packages. Idempotent: does nothing when present.
set -euo pipefail
PKGS=(build-essential cmake ninja-build pkg-config libcli11-dev nlohmann-json3-dev libfmt-dev
      libgtest-dev libgmock-dev libbenchmark-dev libpcre2-dev libboost-context-dev python3 libutf8proc-dev)
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

# cuobjdump (reads the SASS of generated kernels in CudaCodegen tests) when the CUDA toolkit here
# lacks it: NVIDIA's own wheel from PyPI, unpacked into the user cache (never into the repo).
# Optional: without it (offline) that test is skipped with its reason.
tools="${XDG_CACHE_HOME:-$HOME/.cache}/megakernel/tools"
if [[ -d /usr/local/cuda ]] && ! command -v cuobjdump >/dev/null && [[ ! -x /usr/local/cuda/bin/cuobjdump ]] \
   && [[ ! -x "$tools/bin/cuobjdump" ]] && command -v python3 >/dev/null; then
  tmp=$(mktemp -d)
  if python3 -m pip download --quiet --no-deps "nvidia-cuda-cuobjdump==13.5.37" -d "$tmp" >/dev/null 2>&1; then
    mkdir -p "$tools/bin"
    python3 -m zipfile -e "$tmp"/nvidia_cuda_cuobjdump-*.whl "$tmp/x"
    install -m 755 "$tmp/x/nvidia/cu13/bin/cuobjdump" "$tools/bin/cuobjdump"
    echo "setup: cuobjdump installed in $tools/bin"
  else
    echo "setup: cuobjdump not available (offline?); the SASS test will be skipped"
  fi
  rm -rf "$tmp"
fi
# Models the tests and the demo use when present (never stored in the repo). Best effort: offline,
# the SmolLM2 tests are skipped and the demo falls back to stories260K. MK_FETCH_MODELS=0 skips it.
if [[ "${MK_FETCH_MODELS:-1}" == 1 ]]; then
  "$(dirname "$0")/get-model.sh" smollm2 >/dev/null || echo "setup: note: SmolLM2 not fetched; its tests will be skipped" >&2
fi
