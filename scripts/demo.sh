#!/usr/bin/env bash
# Installs dependencies, builds, and shows the model answering: SmolLM2-135M-Instruct (downloaded
# with scripts/get-model.sh into the user cache) answers one chat question. Offline, or when that
# model cannot be fetched or loaded, it says so and tells a story with the shipped stories260K.
# MODEL=path runs that model with the prompt instead (PROMPT, N_NEW, SEED). Other arguments go to
# `run` (scripts/demo.sh -n 10 --temp 0.7).
set -euo pipefail
cd "$(dirname "$0")/.."
# Arguments go on to `run`; the script's own settings are added only for options not among them (an
# option given twice is an error: `scripts/demo.sh -n 10` failed with "--n-predict was given 2 times").
args=("$@")
given() {  # given NAME...: whether an argument is one of these options (-n 10, -n10, --seed=3)
  local a n
  for a in ${args[@]+"${args[@]}"}; do
    for n in "$@"; do
      [[ $a == "$n" || $a == "$n="* || (${#n} == 2 && $a == "$n"*) ]] && return 0
    done
  done
  return 1
}
value_of() {  # value_of NAME...: the value given with one of these options (-p X, -pX, --prompt=X)
  local i a n
  for ((i = 0; i < ${#args[@]}; i++)); do
    a=${args[i]}
    for n in "$@"; do
      if [[ $a == "$n" ]]; then printf '%s' "${args[i + 1]:-}"; return 0; fi
      if [[ $a == "$n="* ]]; then printf '%s' "${a#"$n="}"; return 0; fi
      if [[ ${#n} == 2 && $a == "$n"?* ]]; then printf '%s' "${a#"$n"}"; return 0; fi
    done
  done
  return 1
}
defaults() {  # defaults VALUE NAME...: "NAME VALUE" unless the user gave the option
  local v=$1
  shift
  given "$@" || printf '%s\0%s\0' "$1" "$v"
}
scripts/setup.sh
scripts/build.sh release megakernel
if [[ -n "${MODEL:-}" ]]; then
  mapfile -d '' extra < <(defaults "${PROMPT:-Once upon a time}" -p --prompt; defaults "${N_NEW:-200}" -n --n-predict
                          defaults "${SEED:-42}" --seed)
  exec build/megakernel run -m "$MODEL" ${extra[@]+"${extra[@]}"} "$@"
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
  echo "user: $(value_of -p --prompt || printf '%s' "$question")"
  printf 'assistant: '
  mapfile -d '' extra < <(defaults "$question" -p --prompt; defaults "${N_NEW:-64}" -n --n-predict; defaults 0 --temp)
  build/megakernel run -m "$smollm2" --chat ${extra[@]+"${extra[@]}"} "$@"
else
  mapfile -d '' extra < <(defaults "${PROMPT:-Once upon a time}" -p --prompt; defaults "${N_NEW:-200}" -n --n-predict
                          defaults "${SEED:-42}" --seed)
  build/megakernel run -m ../shared/models/stories260K/stories260K.gguf ${extra[@]+"${extra[@]}"} "$@"
fi
