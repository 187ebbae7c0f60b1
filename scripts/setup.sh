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

# Models the tests and the demo use when present (never stored in the repo). Best effort: offline,
# the SmolLM2 tests are skipped and the demo falls back to stories260K. MK_FETCH_MODELS=0 skips it.
if [[ "${MK_FETCH_MODELS:-1}" == 1 ]]; then
  "$(dirname "$0")/get-model.sh" smollm2 >/dev/null || echo "setup: note: SmolLM2 not fetched; its tests will be skipped" >&2
fi
