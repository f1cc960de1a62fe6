"""Where the image runs: node policies that let a host pull and run only what our release keys signed.

`invoke policy --containers DIR` renders, from provenance/policy.yaml, the files that podman,
CRI-O and OpenShift (containers/image) enforce on every pull: `policy.json` (reject by default;
our repositories and their mirrors only with a sigstore signature by the release keys, the signed
identity bound to the allowed repository) and `registries.d/bakery.yaml` (read signatures from
the registry's cosign-style attachments). The keys go beside them. Install DIR's contents as
/etc/containers (the key paths in policy.json point there). Pure functions; the task writes.
"""

from __future__ import annotations

import ipaddress
import json
import re
from pathlib import Path

from ..errors import EnvironmentProblem, InputError
from ..files import atomic_dir
from ..trust import keys as keys_mod
from ..trust.provenance import Policy

INSTALLED = Path("/etc/containers")  # where DIR's contents are meant to be installed
KEYS_DIR = "bakery-keys"


def _exact(repository: str, what: str) -> str:
    """One repository, HOST/NAMESPACE/NAME: a shorter scope (a registry, a namespace) would admit
    every repository under it; a pattern, tag or digest is not a scope."""
    parts = repository.split("/")
    if any(c in repository for c in "*?[@") or ":" in parts[-1] or len(parts) < 3 or not all(parts) \
            or repository != repository.lower():
        raise InputError(f"{what} {repository!r}: a node policy's scope is one exact repository (HOST/NAMESPACE/NAME, "
                         f"lowercase, no pattern, tag or digest); list each repository the nodes pull from")
    return repository


def _requirements(key_paths: list[str], threshold: int, identity: dict) -> list[dict]:
    """containers-policy ANDs the requirements of a scope; each sigstoreSigned one accepts any of
    its keys. So threshold 1 is one requirement over all keys, and all-of-n is one per key; k of n
    in between has no spelling there."""
    if threshold == 1:
        return [{"type": "sigstoreSigned", "keyPaths": key_paths, "signedIdentity": identity}]
    if threshold == len(key_paths):
        return [{"type": "sigstoreSigned", "keyPath": k, "signedIdentity": identity} for k in key_paths]
    raise InputError(f"roles.release.threshold {threshold} of {len(key_paths)} keys cannot be enforced by "
                     f"containers-policy (it can say one of the keys, or all of them)")


def containers_policy(policy: Policy, mirrors: dict[str, str], installed: Path = INSTALLED,
                      accept: tuple[str, ...] = ()) -> dict[str, bytes]:
    """{relative path: bytes} of the node policy: policy.json, registries.d/bakery.yaml and the
    release keys. `accept` lists other repositories the nodes pull unsigned (the pause image, the
    proxy, a device plugin: default reject refuses them too). `mirrors` maps a mirror repository
    to the allowed repository it copies; a pull
    from the mirror must carry the original's signature, copied with it (exactRepository: the
    signature must name the original; remapIdentity would be the natural spelling, but podman 5.4
    then demands the exact reference, which a cosign signature, naming only the repository, never
    has: containers/container-libs#373)."""
    release = policy.roles["release"]
    if not release.keys:
        raise InputError("the policy lists no release key: a node policy without one would refuse everything "
                         "(add keys under roles.release in provenance/policy.yaml, or pass --key FILE)")
    distinct = list({keys_mod.keyid(k): k for k in release.keys}.values())  # one key listed twice is one signer
    files = {f"{KEYS_DIR}/release-{i}.pub": keys_mod.public_pem(k) for i, k in enumerate(distinct)}
    key_paths = [str(installed / name) for name in files]
    scopes = {}
    for repository in policy.allowed_repositories:
        scopes[_exact(repository, "allowed_repositories:")] = _requirements(
            key_paths, release.threshold, {"type": "matchRepository"})
    for mirror, original in sorted(mirrors.items()):
        if original not in scopes or mirror in scopes:
            raise InputError(f"--mirror {mirror}={original}: the original must be in allowed_repositories and the "
                             f"mirror not")
        scopes[_exact(mirror, "--mirror")] = _requirements(
            key_paths, release.threshold, {"type": "exactRepository", "dockerRepository": original})
    for other in accept:
        if _exact(other, "--accept") in scopes:
            raise InputError(f"--accept {other}: our own repositories are never accepted unsigned")
        scopes[other] = [{"type": "insecureAcceptAnything"}]
    document = {"default": [{"type": "reject"}], "transports": {"docker": scopes}}
    files["policy.json"] = (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()
    signed = sorted(set(scopes) - set(accept))
    attachments = "".join(f"  {scope}:\n    use-sigstore-attachments: true\n" for scope in signed)
    files["registries.d/bakery.yaml"] = ("# read our images' signatures from the registry (cosign's .sig tags)\n"
                                         "docker:\n" + attachments).encode()
    return files


def parse_mirrors(given: list[str]) -> dict[str, str]:
    """--mirror MIRROR/REPO=ORIGINAL/REPO, each once."""
    mirrors = {}
    for item in given:
        mirror, sep, original = item.partition("=")
        if not sep or not mirror or not original or mirror == original or mirror in mirrors:
            raise InputError(f"--mirror {item!r}: say MIRROR_HOST/REPO=ORIGINAL_HOST/REPO, each mirror once")
        mirrors[mirror] = original
    return mirrors


def write_tree(dest: Path, files: dict[str, bytes]) -> None:
    """All the files or none: written in a sibling folder, which then becomes dest (new or empty)."""
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise InputError(f"{dest} exists and is not an empty directory: give a new or empty one")
    try:
        with atomic_dir(dest) as staging:
            for name, data in files.items():
                (staging / name).parent.mkdir(parents=True, exist_ok=True)
                (staging / name).write_bytes(data)
                (staging / name).chmod(0o644)
            staging.chmod(0o755)
    except OSError as e:
        raise EnvironmentProblem(f"cannot write {dest}: {e.strerror}") from None


# -- a fleet of single-MI300X nodes on Kubernetes ---------------------------------------------------

MODEL_DIR = "/models/DeepSeek-V4-Flash-0731"
PORT = 8000
# the AMD node labeller's labels: GPU family AI (gfx9, which gfx942 is) with 304 compute units (an
# MI300X; an MI300A has 228, an MI308X 80), the same GPU the smoke policy demands
GFX942_MI300X = {"amd.com/gpu.family": "AI", "amd.com/gpu.cu-count": "304"}


def _probes(compose: dict) -> dict:
    """The compose healthcheck's timing (start_period, interval, timeout, retries) as probes."""
    check = compose["services"]["inference"]["healthcheck"]
    seconds = {"s": 1, "m": 60, "h": 3600}

    def duration(text: str) -> int:
        return int(text[:-1]) * seconds[text[-1]]

    interval, timeout, retries = duration(check["interval"]), duration(check["timeout"]), int(check["retries"])
    health = {"httpGet": {"path": "/health", "port": PORT}, "periodSeconds": interval, "timeoutSeconds": timeout}
    return {"startupProbe": {**health, "failureThreshold": duration(check["start_period"]) // interval},
            "readinessProbe": {**health, "failureThreshold": 1},
            "livenessProbe": {**health, "failureThreshold": retries}}


def _inference(image: str, replicas: int, compose: dict, snapshot: str) -> dict:
    service = compose["services"]["inference"]
    digest = image.rsplit("@sha256:", 1)[1]
    shm = service["shm_size"]
    labels = {"app.kubernetes.io/name": "dsv4-flash", "app.kubernetes.io/component": "inference"}
    container = {
        "name": "inference", "image": image, "imagePullPolicy": "IfNotPresent",
        "ports": [{"name": "http", "containerPort": PORT}],
        "resources": {"limits": {"amd.com/gpu": 1}, "requests": {"amd.com/gpu": 1}},
        # compose's cap_add: IPC_LOCK for the memlock'd KV transfers, SYS_PTRACE for crash dumps
        "securityContext": {"capabilities": {"add": ["IPC_LOCK", "SYS_PTRACE"]}},
        "volumeMounts": [{"name": "model", "mountPath": MODEL_DIR, "readOnly": True},
                         {"name": "shm", "mountPath": "/dev/shm"},
                         {"name": "aiter-cache", "mountPath": "/root/.aiter"},
                         {"name": "crash-dumps", "mountPath": "/var/crash/vllm"}],
        **_probes(compose)}
    pod = {"hostIPC": service.get("ipc") == "host", "nodeSelector": dict(GFX942_MI300X), "containers": [container],
           "automountServiceAccountToken": False,  # vLLM has no business with the Kubernetes API
           # one replica a node: they would share the node's host paths (and an 8-GPU node matches too)
           "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
               {"labelSelector": {"matchLabels": labels}, "topologyKey": "kubernetes.io/hostname"}]}},
           "volumes": [{"name": "model", "hostPath": {"path": snapshot, "type": "Directory"}},
                       {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": shm.upper().rstrip("B") + "i"}},
                       # AITER's JIT cache holds code it loads: one per image digest, never shared with another
                       {"name": "aiter-cache", "hostPath": {"path": f"/var/lib/dsv4-flash/aiter-cache/{digest}",
                                                             "type": "DirectoryOrCreate"}},
                       {"name": "crash-dumps", "hostPath": {"path": "/var/lib/dsv4-flash/crash-dumps",
                                                             "type": "DirectoryOrCreate"}}]}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "dsv4-flash", "labels": labels},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "strategy": {"type": "Recreate"},  # one GPU a node: the new pod needs the old one's GPU
                     "template": {"metadata": {"labels": labels}, "spec": pod}}}


# -- the front proxy (the seed's Caddy) --------------------------------------------------------------

# the compose stack's network (TEST-NET-1, never routed): a client Docker's userland proxy relays
# appears from its gateway, so no allowlist may include it
COMPOSE_NET = ipaddress.ip_network("192.0.2.0/24")
API_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics", "/generate")


def caddyfile(hostname: str, email: str | None, cidrs: list[str], upstream: str, internal_tls: bool) -> bytes:
    """HTTPS only; the API paths from the allowed source CIDRs reach vLLM, anything else is 403;
    responses stream unbuffered (flush_interval -1: tokens leave as they are made). With
    internal_tls, Caddy's own CA signs the certificate (no public name); else ACME, with email."""
    name = re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:([0-9]{1,5}))?", hostname)
    if not name or (name.group(3) and not 0 < int(name.group(3)) < 65536) or name.group(3) == "80":
        raise InputError(f"--hostname {hostname!r}: a DNS name (or name:port, not port 80: HTTPS only)")
    if not cidrs:
        raise InputError("--allow: give at least one source CIDR (e.g. 10.0.0.0/8): the proxy admits no one else")
    try:
        networks = [ipaddress.ip_network(c) for c in cidrs]  # strict: host bits set is a typo, not a wish
    except ValueError as e:
        raise InputError(f"--allow: {e}") from None
    wide = [str(n) for n in networks if n.prefixlen < (8 if n.version == 4 else 16)]
    if wide:
        raise InputError(f"--allow {', '.join(wide)}: wider than a /8 (IPv6 /16) is no allowlist; name the networks")
    inside = [str(n) for n in networks if n.overlaps(COMPOSE_NET)]
    if inside:
        raise InputError(f"--allow {', '.join(inside)}: overlaps the stack's own network {COMPOSE_NET}, whose "
                         f"addresses Docker's proxy can give any client")
    nets = [str(n) for n in networks]
    if not internal_tls and not (email and re.fullmatch(r"[^@\s]+@[^@\s]+\.[^@\s]+", email)):
        raise InputError("--email: ACME needs a contact address (or use --internal-tls for a private CA)")
    options = ["\tauto_https disable_redirects"] + ([f"\temail {email}"] if email and not internal_tls else [])
    site = [f"{hostname} {{"] + (["\ttls internal"] if internal_tls else [])
    for n, path in enumerate(API_PATHS):
        # one matcher per path, with the sources (one matcher: no directive order to get wrong);
        # the request goes on under the canonical path, so vLLM never sees the spelling Caddy
        # cleaned to match (/v1//models, /x/../v1/models)
        site += [f"\t@api{n} {{", f"\t\tpath {path}", f"\t\tremote_ip {' '.join(nets)}", "\t}",
                 f"\thandle @api{n} {{", f"\t\trewrite * {path}?{{query}}",
                 f"\t\treverse_proxy {upstream} {{", "\t\t\tflush_interval -1", "\t\t}", "\t}"]
    site += ["\thandle {", "\t\trespond 403", "\t}", "}"]
    return ("{\n" + "\n".join(options) + "\n}\n\n" + "\n".join(site) + "\n").encode()


def _proxy(proxy_image: str, caddy: bytes, cidrs: list[str]) -> list[dict]:
    labels = {"app.kubernetes.io/name": "dsv4-flash", "app.kubernetes.io/component": "proxy"}
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "dsv4-flash-proxy"},
              "data": {"Caddyfile": caddy.decode()}}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "dsv4-flash-proxy", "labels": labels},
        # one replica: Caddy's state (its internal CA, or its ACME account and certificates) is its own
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"automountServiceAccountToken": False, "containers": [{
                "name": "caddy", "image": proxy_image, "ports": [{"name": "https", "containerPort": 443}],
                "volumeMounts": [{"name": "config", "mountPath": "/etc/caddy"},
                                 {"name": "data", "mountPath": "/data"}]}],
                "volumes": [{"name": "config", "configMap": {"name": "dsv4-flash-proxy"}},
                            {"name": "data", "emptyDir": {}}]}}}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "dsv4-flash-proxy"},
               "spec": {"type": "LoadBalancer", "selector": labels,
                        # the client's own address must reach Caddy for its CIDR allowlist
                        "externalTrafficPolicy": "Local", "loadBalancerSourceRanges": list(cidrs),
                        "ports": [{"name": "https", "port": 443, "targetPort": "https"}]}}
    return [config, deployment, service]


def k8s_manifests(image: str, proxy_image: str, replicas: int, compose: dict, snapshot: str, hostname: str,
                  email: str | None, cidrs: list[str], internal_tls: bool) -> dict[str, bytes]:
    """{file name: YAML} for N single-MI300X nodes: the inference Deployment (image by digest only),
    its Service, a NetworkPolicy that admits only the proxy, and the proxy (Caddy) in front."""
    import yaml

    for ref, what in ((image, "--image"), (proxy_image, "--proxy-image")):
        if "@sha256:" not in ref:
            raise InputError(f"{what} {ref!r}: give REGISTRY/REPO@sha256:DIGEST (nodes run one digest, never a tag)")
    if replicas < 1:
        raise InputError("--replicas: at least 1 (one per MI300X node)")
    inference = {"app.kubernetes.io/name": "dsv4-flash", "app.kubernetes.io/component": "inference"}
    proxy = {"app.kubernetes.io/name": "dsv4-flash", "app.kubernetes.io/component": "proxy"}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "dsv4-flash"},
               "spec": {"type": "ClusterIP", "selector": inference,
                        "ports": [{"name": "http", "port": PORT, "targetPort": "http"}]}}
    network_policy = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                      "metadata": {"name": "dsv4-flash-only-from-proxy"},
                      "spec": {"podSelector": {"matchLabels": inference}, "policyTypes": ["Ingress"],
                               "ingress": [{"from": [{"podSelector": {"matchLabels": proxy}}],
                                            "ports": [{"protocol": "TCP", "port": PORT}]}]}}
    caddy = caddyfile(hostname, email, cidrs, f"dsv4-flash:{PORT}", internal_tls)
    documents = {"inference.yaml": [_inference(image, replicas, compose, snapshot), service, network_policy],
                 "proxy.yaml": _proxy(proxy_image, caddy, cidrs)}
    class Plain(yaml.SafeDumper):  # no &anchors: each manifest reads on its own
        def ignore_aliases(self, data):
            return True

    return {name: yaml.dump_all(docs, Dumper=Plain, sort_keys=False).encode() for name, docs in documents.items()}


def unenforced(policy) -> str:
    """What the verification policy demands beyond the release signature, which a node's
    policy.json cannot check (podman and CRI-O verify signatures, not attestations); '' if nothing."""
    asked = (["a passing MI300X smoke result"] if policy.require_smoke else []) + \
        ([f"{policy.require_rebuilds} matching rebuild(s)"] if policy.require_rebuilds else [])
    return " or ".join(asked)
