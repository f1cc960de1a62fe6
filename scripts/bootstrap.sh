#!/usr/bin/env bash
# Set up a fresh Debian 12 machine, as root, for bakery: system packages, a virtualenv with the
# project installed, and the local stack (Docker engine + registry on 127.0.0.1:5000).
# Safe to run again: it installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# sudo: the rehearsal's hosted-runner model gives its user passwordless sudo, as GitHub does
# golang-go: the tests read layers with Go's archive/tar (what the engines unpack with) as the reference
# git-lfs: as on GitHub's runners, its package installs the lfs filter system-wide; a rebuilt revision's git must not run it
# faketime: a sandbox under a process clock a year ahead (the "same digest whatever the clock" check)
# python3-numpy: a proof's run hands its data back as numpy arrays; the ordinary-user tests run proofs
# with the system's python3 (the project's venv may sit where that user cannot reach)
packages=(docker.io docker-registry skopeo debootstrap bubblewrap caddy apache2-utils python3-venv python3-numpy git git-lfs faketime ca-certificates gh golang-go sudo)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "bootstrap: installing ${missing[*]}" >&2
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -x .venv/bin/invoke ] || [ pyproject.toml -nt .venv/.installed ]; then
  echo "bootstrap: creating .venv" >&2
  python3 -m venv .venv
  .venv/bin/pip install -q --upgrade pip >/dev/null
  .venv/bin/pip install -q -e '.[test]' >.venv/install.log 2>&1 || { cat .venv/install.log >&2; exit 1; }
  touch .venv/.installed
fi

scripts/fetch-tools.sh
.venv/bin/invoke stack >/dev/null
echo "bootstrap: ready (engine up, registry on 127.0.0.1:5000)" >&2
