"""`invoke deploy --k8s DIR`: a fleet manifest for N single-MI300X nodes of a verified digest (smoke
required, as for --compose), validated offline against the Kubernetes schemas by
kubernetes-validate (someone else's validator), plus what it must say."""

from __future__ import annotations

import subprocess

import pytest
import yaml

import test_tamper
from support import ROOT, dev_policy, invoke
from test_tamper import TEST_RESULT, clone, drop_predicate, keyargs

# test_tamper's fixtures, bound here so that pytest finds them for this module's tests
honest, tamper_keys = test_tamper.honest, test_tamper.tamper_keys

CADDY = "docker.io/library/caddy@sha256:" + "b" * 64
VALIDATE = ROOT / ".venv" / "bin" / "kubernetes-validate"


def render(h, tmp_path, image):
    policy = dev_policy(tmp_path / "policy.yaml", h["base"])
    return invoke(h["project"], "deploy", "--k8s", str(tmp_path / "k8s"), "--image", str(image), "--proxy-image", CADDY,
                  "--replicas", "4", "--snapshot", "/srv/models/snap", "--hostname", "api.example.com",
                  "--email", "ops@example.com", "--allow", "10.0.0.0/8", "--allow", "192.168.0.0/16",
                  *keyargs(h), "--policy", str(policy))


@pytest.fixture(scope="module")
def image(honest):
    return clone(honest, "deploy-k8s")


@pytest.fixture(scope="module")
def manifests(honest, image, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("deploy")
    result = render(honest, tmp_path, image)
    assert result.returncode == 0, result.stderr
    return {d["kind"] + "/" + d["metadata"]["name"]: d for f in sorted((tmp_path / "k8s").glob("*.yaml"))
            for d in yaml.safe_load_all(f.read_text())}, tmp_path / "k8s"


def test_the_manifests_pass_the_kubernetes_schemas(manifests):
    checked = subprocess.run([str(VALIDATE), "--strict", *map(str, sorted(manifests[1].glob("*.yaml")))],
                             capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.count("passed") == 6


def test_one_digest_one_mi300x_per_node_with_composes_production_settings(manifests, image):
    pod = manifests[0]["Deployment/dsv4-flash"]["spec"]["template"]["spec"]
    assert manifests[0]["Deployment/dsv4-flash"]["spec"]["replicas"] == 4
    (container,) = pod["containers"]
    assert container["image"] == str(image) and container["resources"]["limits"] == {"amd.com/gpu": 1}
    assert pod["nodeSelector"] == {"amd.com/gpu.family": "AI", "amd.com/gpu.cu-count": "304"}
    assert pod["hostIPC"] is True and set(container["securityContext"]["capabilities"]["add"]) == {"IPC_LOCK",
                                                                                                 "SYS_PTRACE"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "110Gi"}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/models/DeepSeek-V4-Flash-0731"]["readOnly"] is True
    assert volumes["model"]["hostPath"]["path"] == "/srv/models/snap"
    assert {"/root/.aiter", "/var/crash/vllm", "/dev/shm"} <= set(mounts)
    assert volumes["aiter-cache"]["hostPath"]["path"].endswith(image.digest.hex)  # JIT code never shared between images
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["topologyKey"] == "kubernetes.io/hostname" and pod["automountServiceAccountToken"] is False
    # compose's healthcheck: 15 min to start, then every 30 s with a 10 s timeout, 3 misses
    assert container["startupProbe"]["periodSeconds"] * container["startupProbe"]["failureThreshold"] == 900
    assert container["livenessProbe"]["failureThreshold"] == 3 and container["livenessProbe"]["timeoutSeconds"] == 10


def test_only_the_proxy_reaches_vllm(manifests):
    docs = manifests[0]
    policy = docs["NetworkPolicy/dsv4-flash-only-from-proxy"]["spec"]
    assert policy["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "inference"
    assert policy["ingress"] == [{"from": [{"podSelector": {"matchLabels": {
        "app.kubernetes.io/name": "dsv4-flash", "app.kubernetes.io/component": "proxy"}}}],
        "ports": [{"protocol": "TCP", "port": 8000}]}]
    assert docs["Service/dsv4-flash"]["spec"]["type"] == "ClusterIP"
    caddy = docs["ConfigMap/dsv4-flash-proxy"]["data"]["Caddyfile"]
    assert "remote_ip 10.0.0.0/8 192.168.0.0/16" in caddy and "reverse_proxy dsv4-flash:8000" in caddy
    proxy = docs["Deployment/dsv4-flash-proxy"]["spec"]["template"]["spec"]["containers"][0]
    assert proxy["image"] == CADDY
    assert docs["Service/dsv4-flash-proxy"]["spec"]["externalTrafficPolicy"] == "Local"
    assert docs["Service/dsv4-flash-proxy"]["spec"]["loadBalancerSourceRanges"] == ["10.0.0.0/8", "192.168.0.0/16"]


def test_a_tag_is_refused_and_nothing_is_written(honest, image, tmp_path):
    result = render(honest, tmp_path, f"{image.registry}/{image.repository}:latest")
    assert result.returncode != 0 and "--image" in result.stderr and "sha256" in result.stderr
    assert not (tmp_path / "k8s").exists()


def test_a_digest_that_does_not_verify_renders_nothing(honest, tmp_path):
    """No smoke result on the digest: the fleet would run what nothing vouched for; refused."""
    unsmoked = clone(honest, "deploy-k8s-unsmoked")
    drop_predicate(TEST_RESULT)(honest, unsmoked, {})
    result = render(honest, tmp_path, unsmoked)
    assert result.returncode != 0 and f"verified {unsmoked}" not in result.stdout
    assert not (tmp_path / "k8s").exists()


def test_deploy_needs_exactly_one_place():
    result = invoke(ROOT, "deploy", "--image", "r.example/a/b@sha256:" + "a" * 64, "--proxy-image", CADDY,
                    "--hostname", "a.example.com")
    assert result.returncode == 2 and "one of them" in result.stderr


def test_deploy_asks_for_the_rebuild_the_shipped_policy_asks_for(honest, image, tmp_path):
    """The release promotes only a digest a rebuilder reproduced; deploy, with the shipped policy's
    require_rebuilds, refuses one nobody rebuilt (this image is signed and smoke-passed, not rebuilt)."""
    shipped = yaml.safe_load((ROOT / "provenance" / "policy.yaml").read_text())["require_rebuilds"]
    policy = dev_policy(tmp_path / "policy.yaml", honest["base"], require_rebuilds=shipped)
    args = ["deploy", "--k8s", str(tmp_path / "k8s"), "--image", str(image), "--proxy-image", CADDY, "--snapshot",
            "/srv/models/snap", "--hostname", "api.example.com", "--allow", "10.0.0.0/8", "--internal-tls",
            *keyargs(honest), "--policy", str(policy)]
    no_key = invoke(honest["project"], *args)
    assert no_key.returncode == 2 and no_key.stderr.strip() == (
        "error: no rebuilder public key: pass --rebuilder-key FILE, or list it under roles.rebuilder.keys in the policy "
        "(or name the role's identity under keyless.roles)")
    assert invoke(honest["project"], "keygen", "--role", "rebuilder", "--out", str(tmp_path / "r"),
                  env={"BAKERY_KEY_PASSWORD": "pw"}).returncode == 0
    result = invoke(honest["project"], *args, "--rebuilder-key", str(tmp_path / "r" / "rebuilder.pub"))
    assert result.returncode == 5, result.stdout + result.stderr
    assert "FAIL rebuilt to this digest by 0 of 1 required rebuilder" in result.stdout
    assert not (tmp_path / "k8s").exists()
