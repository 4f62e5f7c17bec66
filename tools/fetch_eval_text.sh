#!/usr/bin/env bash
# Fetches the held-out evaluation text for the real-model checks: The Jargon File 4.4.7 (public
# domain), from Debian's jargon-text package (apt-get download; nothing is installed). Verifies
# the text's sha256 and places it at models/eval/jargon-4.4.7.txt (git-ignored). Idempotent: a
# second run only checks the hash. The demo model never saw it (it was trained on fortunes).
set -euo pipefail
cd "$(dirname "$0")/.."

readonly package="jargon-text=4.4.7-4.1"
readonly text_sha256="40dfb4b98191a670a09a183d5798d50f243d23fdbd1495dcc0aca2ce5895ba97"
readonly dest="models/eval/jargon-4.4.7.txt"

if [ -f "$dest" ] && echo "$text_sha256  $dest" | sha256sum --check --status; then
  echo "fetch_eval_text.sh: $dest ok"
  exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "fetch_eval_text.sh: downloading $package"
if ! (cd "$tmp" && apt-get download -qq "$package" 2>/dev/null); then
  $SUDO apt-get update -qq
  (cd "$tmp" && apt-get download -qq "$package")
fi
dpkg-deb -x "$tmp"/jargon-text_*.deb "$tmp/x"
mkdir -p "$(dirname "$dest")"
zcat "$tmp/x/usr/share/doc/jargon-text/jargon.txt.gz" > "$dest.part"
if ! echo "$text_sha256  $dest.part" | sha256sum --check --status; then
  rm -f "$dest.part"
  echo "fetch_eval_text.sh: jargon.txt does not have the expected sha256 $text_sha256" >&2
  exit 1
fi
mv "$dest.part" "$dest"
echo "fetch_eval_text.sh: $dest ok"
