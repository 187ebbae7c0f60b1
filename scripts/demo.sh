#!/usr/bin/env bash
# Installs dependencies, builds, and generates a story from stories260K (or $MODEL when set).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh release megakernel
MODEL="${MODEL:-../shared/models/stories260K/stories260K.gguf}"
build/megakernel run -m "$MODEL" -p "${PROMPT:-Once upon a time}" -n "${N_NEW:-200}" --seed "${SEED:-42}" "$@"
