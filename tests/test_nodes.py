"""Nodes that refuse anything but our signed digest: `invoke policy --containers DIR` enforced by the
real podman 5 of Debian 13 (Debian 12's podman is built with sigstore verification disabled).

The node is a debootstrapped Debian 13 minbase with podman, imported into Docker (like the fixture
base), with DIR installed as its /etc/containers; it pulls from the local registry. Images are built
and signed by `invoke build` and `invoke attest`, as a release is. Each refusal is podman's own.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest
import requests

from support import NODE_FLAGS, PODMAN, ROOT, invoke, last_line, podman_node
from test_attest import PASSWORD


@pytest.fixture(scope="module")
def node_image() -> str:
    return podman_node()


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    found = {}
    for who in ("ours", "other"):
        d = tmp_path_factory.mktemp(f"keys-{who}")
        assert invoke(ROOT, "keygen", "--out", str(d), env=PASSWORD).returncode == 0
        found[who] = (d / "release.key", d / "release.pub")
    return found


def build(project: Path, registry: str, base, repo: str, epoch: int) -> tuple[str, Path]:
    out = project / f"out-{epoch}"
    built = invoke(project, "build", "--base", str(base), "--push", f"{registry}/{repo}:{epoch}", "--out", str(out),
                   env={"SOURCE_DATE_EPOCH": str(epoch)})
    assert built.returncode == 0, built.stderr
    return last_line(built), out / "build-record.json"


def attest(project: Path, ref: str, record: Path, key: Path) -> None:
    done = invoke(project, "attest", ref, "--record", str(record), "--key", str(key), env=PASSWORD)
    assert done.returncode == 0, done.stderr


def copy_manifest(registry: str, src_repo: str, src_tag: str, dest_repo: str, dest_tag: str) -> None:
    """A manifest and its blobs, byte for byte, to another repository or tag of the same registry."""
    accept = "application/vnd.oci.image.manifest.v1+json"
    got = requests.get(f"http://{registry}/v2/{src_repo}/manifests/{src_tag}", headers={"Accept": accept})
    got.raise_for_status()
    manifest = got.json()
    for blob in [manifest["config"]] + manifest["layers"]:
        if src_repo != dest_repo:
            mounted = requests.post(f"http://{registry}/v2/{dest_repo}/blobs/uploads/",
                                    params={"mount": blob["digest"], "from": src_repo})
            assert mounted.status_code == 201, mounted.text
    put = requests.put(f"http://{registry}/v2/{dest_repo}/manifests/{dest_tag}", data=got.content,
                       headers={"Content-Type": got.headers["Content-Type"]})
    assert put.status_code == 201, put.text


def sig_tag(ref: str) -> str:
    return ref.split("@")[1].replace(":", "-") + ".sig"


@pytest.fixture(scope="module")
def pulls(registry, fixture_base, fixture_lock, keys, node_image, tmp_path_factory):
    """Every case pulled by one podman node, once: {case: (exit code, podman's output)}."""
    from support import copy_project

    project = copy_project(tmp_path_factory.mktemp("nodes") / "project", fixture_lock)
    repo, mirror = f"nodes/app-{uuid.uuid4().hex[:8]}", f"nodes/mirror-{uuid.uuid4().hex[:8]}"
    signed, record = build(project, registry, fixture_base, repo, 1700000100)
    attest(project, signed, record, keys["ours"][0])
    unsigned, _ = build(project, registry, fixture_base, repo, 1700000101)
    foreign, foreign_record = build(project, registry, fixture_base, repo, 1700000102)
    attest(project, foreign, foreign_record, keys["other"][0])
    resigned, _ = build(project, registry, fixture_base, repo, 1700000103)
    copy_manifest(registry, repo, sig_tag(signed), repo, sig_tag(resigned))  # an old signature, a changed image
    digest = signed.split("@")[1]
    copy_manifest(registry, repo, digest, mirror, digest)  # mirrored without its signature
    bare_mirror = f"{registry}/{mirror}@{digest}"
    signed_mirror = f"{registry}/{mirror}-signed@{digest}"
    copy_manifest(registry, repo, digest, f"{mirror}-signed", digest)
    copy_manifest(registry, repo, sig_tag(signed), f"{mirror}-signed", sig_tag(signed))

    policy_yaml = tmp_path_factory.mktemp("policy") / "policy.yaml"
    text = (ROOT / "provenance" / "policy.yaml").read_text()
    policy_yaml.write_text(text.replace("  - ghcr.io/dsv4-mi300x/vllm-dsv4-flash-mi300x",
                                        f"  - {registry}/{repo}"))
    etc = tmp_path_factory.mktemp("etc") / "containers"
    written = invoke(ROOT, "policy", "--containers", str(etc), "--policy", str(policy_yaml),
                     "--key", str(keys["ours"][1]), "--mirror", f"{registry}/{mirror}={registry}/{repo}",
                     "--mirror", f"{registry}/{mirror}-signed={registry}/{repo}")
    assert written.returncode == 0, written.stderr
    (etc / "registries.conf.d").mkdir()
    (etc / "registries.conf.d" / "50-test-registry.conf").write_text(
        f'[[registry]]\nlocation = "{registry}"\ninsecure = true\n')  # the test registry speaks plain HTTP
    cases = {"signed": signed, "unsigned": unsigned, "other key": foreign, "old signature": resigned,
             "mirror without signature": bare_mirror, "mirror with signature": signed_mirror,
             "unlisted repository": f"{registry}/{repo}-unlisted@{digest}"}
    copy_manifest(registry, repo, digest, f"{repo}-unlisted", digest)
    copy_manifest(registry, repo, sig_tag(signed), f"{repo}-unlisted", sig_tag(signed))
    script = "".join(f"echo '=== {name}'; {PODMAN} pull -q {ref} 2>&1; echo \"=== rc $?\"; " for name, ref in cases.items())
    script += (f"echo '=== run'; {PODMAN} run --rm -q --network host --cgroups disabled "
               f"--entrypoint /usr/local/bin/bakery-selfcheck {signed} 2>&1; echo \"=== rc $?\"")
    mounts = [f"{etc / name}:/etc/containers/{name}:ro" for name in
              ("policy.json", "registries.d/bakery.yaml", "bakery-keys", "registries.conf.d/50-test-registry.conf")]
    run = subprocess.run(["docker", "run", "--rm", *NODE_FLAGS, *[a for m in mounts for a in ("-v", m)],
                          node_image, "sh", "-c", script], capture_output=True, text=True, timeout=900)
    results: dict[str | None, tuple[int, str]] = {}  # by case: (exit code, what it printed)
    name: str | None = None
    lines: list[str] = []
    for line in run.stdout.splitlines():
        if line.startswith("=== rc "):
            results[name] = (int(line.split()[-1]), "\n".join(lines))
        elif line.startswith("=== "):
            name, lines = line[4:], []
        else:
            lines.append(line)
    assert set(results) == set(cases) | {"run"}, run.stdout + run.stderr
    return results


def test_our_signed_digest_is_pulled_and_its_self_check_runs(pulls):
    assert pulls["signed"][0] == 0, pulls["signed"][1]
    code, said = pulls["run"]
    assert code == 0 and "bakery-selfcheck:" in said and "verified" in said, said


@pytest.mark.parametrize("case, podman_says", [
    ("unsigned", "A signature was required, but no signature exists"),
    ("other key", "cryptographic signature verification failed"),
    ("old signature", "does not match"),
    ("mirror without signature", "A signature was required, but no signature exists"),
    ("unlisted repository", "is rejected by policy"),
])
def test_the_node_refuses(pulls, case, podman_says):
    code, said = pulls[case]
    assert code != 0 and podman_says in said, said


def test_a_mirror_that_carries_our_signature_is_pulled(pulls):
    """The signature names the original repository; the node's policy remaps the mirror to it."""
    assert pulls["mirror with signature"][0] == 0, pulls["mirror with signature"][1]


# -- what the policy can and cannot say, one clear line each -------------------------------------------

def test_a_threshold_the_node_cannot_enforce_is_refused(keys, tmp_path):
    policy = tmp_path / "policy.yaml"
    text = (ROOT / "provenance" / "policy.yaml").read_text()
    policy.write_text(text.replace("release: {keys: [], threshold: 1}", "release: {keys: [], threshold: 2}"))
    keys_args = ["--key", str(keys["ours"][1]), "--key", str(keys["other"][1])]
    both = invoke(ROOT, "policy", "--containers", str(tmp_path / "two"), "--policy", str(policy), *keys_args)
    assert both.returncode == 0, both.stderr  # 2 of 2: one requirement per key
    # the shipped policy asks for a rebuild, which no node can check: the tool says so, and what to run
    assert "note: nodes check the release signature only, not 1 matching rebuild(s): run `invoke verify`" in \
        both.stderr
    rules = json.loads((tmp_path / "two" / "policy.json").read_text())["transports"]["docker"]
    assert [r["keyPath"] for r in next(iter(rules.values()))] == [
        "/etc/containers/bakery-keys/release-0.pub", "/etc/containers/bakery-keys/release-1.pub"]
    third = tmp_path / "third"
    assert invoke(ROOT, "keygen", "--out", str(third), env=PASSWORD).returncode == 0
    result = invoke(ROOT, "policy", "--containers", str(tmp_path / "three"), "--policy", str(policy), *keys_args,
                    "--key", str(third / "release.pub"))
    assert result.returncode != 0 and "threshold 2 of 3 keys cannot be enforced" in result.stderr
    assert not (tmp_path / "three").exists()


def test_a_pattern_or_an_unknown_mirror_is_refused_and_nothing_is_written(keys, tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text((ROOT / "provenance" / "policy.yaml").read_text().replace(
        "  - ghcr.io/dsv4-mi300x/vllm-dsv4-flash-mi300x", "  - ghcr.io/dsv4-mi300x/*"))
    result = invoke(ROOT, "policy", "--containers", str(tmp_path / "out"), "--policy", str(policy),
                    "--key", str(keys["ours"][1]))
    assert result.returncode != 0 and "one exact repository" in result.stderr
    result = invoke(ROOT, "policy", "--containers", str(tmp_path / "out"), "--key", str(keys["ours"][1]),
                    "--mirror", "mirror.internal/vllm=ghcr.io/someone/else")
    assert result.returncode != 0 and "the original must be in allowed_repositories" in result.stderr
    assert not (tmp_path / "out").exists()


def test_other_images_are_accepted_only_by_name_and_a_key_listed_twice_is_one_signer(keys, tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text((ROOT / "provenance" / "policy.yaml").read_text().replace(
        "release: {keys: [], threshold: 1}", f"release: {{keys: ['{keys['ours'][1]}'], threshold: 2}}"))
    twice = invoke(ROOT, "policy", "--containers", str(tmp_path / "twice"), "--policy", str(policy),
                   "--key", str(keys["ours"][1]))
    assert twice.returncode != 0 and "threshold 2 of 1 keys" in twice.stderr  # not two requirements on one key
    result = invoke(ROOT, "policy", "--containers", str(tmp_path / "out"), "--key", str(keys["ours"][1]),
                    "--accept", "registry.k8s.io/pause/pause")
    assert result.returncode == 0, result.stderr
    scopes = json.loads((tmp_path / "out" / "policy.json").read_text())["transports"]["docker"]
    assert scopes["registry.k8s.io/pause/pause"] == [{"type": "insecureAcceptAnything"}]
    ours = invoke(ROOT, "policy", "--containers", str(tmp_path / "ours"), "--key", str(keys["ours"][1]),
                  "--accept", "ghcr.io/dsv4-mi300x/vllm-dsv4-flash-mi300x")
    assert ours.returncode != 0 and "never accepted unsigned" in ours.stderr
