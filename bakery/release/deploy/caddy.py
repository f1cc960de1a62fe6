"""The front proxy, the seed's Caddy: TLS, an allowlist of client networks and only the API's paths,
as a Caddyfile and (for Kubernetes) its Deployment and Service."""

from __future__ import annotations

import ipaddress
import re

from ...errors import InputError

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
