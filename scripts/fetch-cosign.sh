#!/usr/bin/env bash
# Put Debian 13's cosign (2.5) in .tools/bin, the independent verifier the tests use. Debian 12
# has no cosign, and its skopeo/podman refuse sigstore signatures; trixie's cosign runs here.
# A private apt state under .tools/apt: the host's apt setup is not touched.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .tools/bin/cosign ] && exit 0
root="$PWD/.tools/apt"
mkdir -p "$root/lists/partial" "$root/cache/archives/partial" "$root/prefs.d" .tools/bin
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
(cd "$root" && apt-get download -q cosign >/dev/null 2>&1)
dpkg-deb -x "$root"/cosign_*.deb "$root/x"
cp "$root/x/usr/bin/cosign" .tools/bin/cosign
echo "fetch-cosign: $(.tools/bin/cosign version 2>/dev/null | grep GitVersion)" >&2
