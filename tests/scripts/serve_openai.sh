#!/usr/bin/env bash
# ctest Serve.OpenAIClient: `megakernel serve` checked with the official openai Python client
# (tests/scripts/serve_openai.py). Skips (exit 77, shown as skipped by ctest) with a visible
# message when the openai package cannot be installed. Env: MK_BIN, MK_SHARED_DIR.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
py=$("$here/openai_venv.sh") || { echo "SKIPPED: the openai Python package is not available (run scripts/setup.sh with network)"; exit 77; }
exec "$py" "$here/serve_openai.py"
