"""A fleet of single-MI300X nodes on Kubernetes (`invoke deploy --k8s DIR`): the inference
Deployment by digest, its Service, a NetworkPolicy that admits only the front proxy, and the proxy."""

from __future__ import annotations

from ...errors import InputError
from .caddy import _proxy, caddyfile

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
