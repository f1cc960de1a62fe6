# Shell functions the release's jobs share: release.yml and the role workflows it calls
# (build-and-sign.yml, rebuild.yml, smoke.yml), which GitHub runs without their caller's `env`.
# Sourced from the checkout of the revision being released: `. .github/runner.sh && NAME`.

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# bakery from requirements/release.txt, hash-locked, for the jobs that build (torch and Triton: the proofs)
install_bakery() {
  python3 -m venv .venv &&
    .venv/bin/pip install -q --require-hashes --no-deps -r requirements/release.txt \
      --extra-index-url https://download.pytorch.org/whl/cpu &&
    .venv/bin/pip install -q --no-deps --no-build-isolation -e .
}

# a fresh venv without torch or Triton, for the jobs that sign or push: nothing that runs base code
install_bakery_sign() {
  python3 -m venv --clear .venv &&
    .venv/bin/pip install -q --require-hashes --no-deps -r requirements/sign.txt &&
    .venv/bin/pip install -q --no-deps --no-build-isolation -e .
}

# bubblewrap (the sandbox of the proofs, the compile and the rebuild), which hosted runners lack:
# apt's lists on a fresh runner are stale, so update first. Ubuntu 24.04's AppArmor refuses the
# unprivileged user namespaces bubblewrap needs. A self-hosted runner may run as root without sudo.
install_bubblewrap() {
  if ! command -v bwrap >/dev/null; then as_root apt-get update -q && as_root apt-get install -y -q bubblewrap; fi
  if [ "$(cat /proc/sys/kernel/apparmor_restrict_unprivileged_userns 2>/dev/null)" = 1 ]; then
    as_root sysctl -w kernel.apparmor_restrict_unprivileged_userns=0
  fi
}

# an empty cache on the disk with the most room: the toolchain's files (many GB for the ROCm base) go
# there. A hosted runner's second disk, /mnt, has the most (66 GB against / 's 14 GB, neither promised)
empty_cache() {
  free() { df --output=avail -B1 "$1" | tail -n 1; }
  cache="$RUNNER_TEMP/bakery-cache"
  if [ -d /mnt ] && [ "$(free /mnt)" -gt "$(free "$RUNNER_TEMP")" ]; then
    as_root mkdir -p /mnt/bakery && as_root chown "$(id -u):$(id -g)" /mnt/bakery && cache=/mnt/bakery/cache
  fi
  rm -rf "$cache" && echo "BAKERY_CACHE=$cache" >> "$GITHUB_ENV" && echo "cache: $cache" && df -h / "$(dirname "$cache")"
}

# what a hosted ubuntu-24.04 image holds that no job of ours uses (its runner-images README lists
# them): the Android SDK, .NET, Haskell's ghcup, CodeQL, Swift; /opt/ghc is 22.04's Haskell
free_disk() {
  df -h / /mnt 2>/dev/null || df -h /
  sudo rm -rf /usr/local/lib/android /usr/share/dotnet /usr/local/.ghcup /opt/ghc /opt/hostedtoolcache/CodeQL \
    /usr/share/swift
  df -h / /mnt 2>/dev/null || df -h /
}

# How a signing job signs (SIGNING is the BAKERY_SIGNING variable): nothing to add in key mode (the
# role's key is in its environment's secret); --keyless as this workflow's OIDC identity, with
# --trust-config where BAKERY_SIGSTORE_TRUST_CONFIG names a Sigstore other than the public one.
sign_flags() {
  if [ "$SIGNING" = keyless ]; then
    echo --keyless
    if [ -n "$TRUST_CONFIG" ]; then
      printf '%s\n' "$TRUST_CONFIG" > "$RUNNER_TEMP/trust_config.json"
      echo --trust-config "$RUNNER_TEMP/trust_config.json"
    fi
  fi
}

# FLAG ROLE: the role's public key (from its repository variable, written to $RUNNER_TEMP/ROLE.pub)
# as FLAG, in key mode; nothing keyless, where the policy's keyless.roles name who signs
key_flag() {
  if [ "$SIGNING" != keyless ]; then echo "$1" "$RUNNER_TEMP/$2.pub"; fi
}

# the public keys from their variables, for key_flag (empty files keyless: no flag names them)
public_keys() {
  printf '%s\n' "$RELEASE_PUB" > "$RUNNER_TEMP/release.pub"
  printf '%s\n' "$REBUILDER_PUB" > "$RUNNER_TEMP/rebuilder.pub"
  printf '%s\n' "$SMOKE_PUB" > "$RUNNER_TEMP/smoke.pub"
}

# BAKERY_SIGNING as the jobs read it: unset (keys) or keyless, in any case, as GitHub's `if:` compares
# it; anything else stops the step here, before a job signs one way while its `if:`s took the other
case "$(printf '%s' "${SIGNING:-}" | tr '[:upper:]' '[:lower:]')" in
  "") SIGNING="" ;;
  keyless) SIGNING=keyless ;;
  # exit, not return: a step's `. runner.sh && ...` under bash -e would go on past a failed source
  *) echo "error: BAKERY_SIGNING is '$SIGNING': leave it unset (each role's key) or set it to keyless" >&2; exit 2 ;;
esac
