#!/usr/bin/env bash
# Makes (or reuses) the Python venv with the official `openai` client that tests/scripts/serve_openai.py
# and bench/serve_load.py use; it lives outside the repo: ${MK_VENV:-${XDG_CACHE_HOME:-~/.cache}/megakernel/venv-openai}.
# Prints the venv's python on stdout; exits 1 (with a note on stderr) when the package cannot be
# installed (offline). Called by scripts/setup.sh (network at setup time) and by the test.
set -uo pipefail
venv="${MK_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/megakernel/venv-openai}"
if [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c "import openai" 2>/dev/null; then
  echo "$venv/bin/python"; exit 0
fi
mkdir -p "$(dirname "$venv")"
python3 -m venv "$venv" >&2 || { echo "note: cannot create a venv at $venv (python3-venv missing?)" >&2; exit 1; }
"$venv/bin/pip" install --quiet --disable-pip-version-check "openai>=1.30,<3" >&2 \
  || { echo "note: cannot install the openai package into $venv (offline?)" >&2; exit 1; }
echo "$venv/bin/python"
