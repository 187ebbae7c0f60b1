#!/usr/bin/env bash
# Installs dependencies, builds, and shows the model answering: SmolLM2-135M-Instruct (downloaded
# with scripts/get-model.sh into the user cache) answers one chat question. Offline, or when that
# model cannot be fetched or loaded, it says so and tells a story with the shipped stories260K.
# MODEL=path runs that model with the prompt instead (PROMPT, N_NEW, SEED).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh release megakernel
if [[ -n "${MODEL:-}" ]]; then
  exec build/megakernel run -m "$MODEL" -p "${PROMPT:-Once upon a time}" -n "${N_NEW:-200}" --seed "${SEED:-42}" "$@"
fi
smollm2=""
if smollm2=$(scripts/get-model.sh smollm2); then
  if ! err=$(build/megakernel info -m "$smollm2" 2>&1 >/dev/null); then
    echo "demo: cannot load $smollm2 (${err#error: }); using stories260K instead" >&2
    smollm2=""
  fi
else
  echo "demo: SmolLM2 could not be downloaded (offline?); using stories260K instead" >&2
  smollm2=""
fi
if [[ -n "$smollm2" ]]; then
  question="${PROMPT:-What is the capital of France? Answer in one sentence.}"
  echo "user: $question"
  printf 'assistant: '
  build/megakernel run -m "$smollm2" --chat -p "$question" -n "${N_NEW:-64}" --temp 0 "$@"
else
  build/megakernel run -m ../shared/models/stories260K/stories260K.gguf -p "${PROMPT:-Once upon a time}" \
    -n "${N_NEW:-200}" --seed "${SEED:-42}" "$@"
fi
