"""The proofs' sandbox, from the attacker's side: a proof (the base's code runs inside it) that
looks for every secret a build job holds. Run plainly, the same script finds them all (the
control); run the way bakery runs proofs, it finds nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bakery import prove, sandbox
from bakery.errors import EnvironmentProblem

from conftest import ROOT

SECRETS = {"GITHUB_TOKEN": "ghs_secret", "BAKERY_REGISTRY_PASSWORD": "hunter2", "BAKERY_KEY_PASSWORD": "pw",
           "BAKERY_SIGNING_KEY": "-----BEGIN ENCRYPTED PRIVATE KEY-----", "SAMPLES": "3"}

HOSTILE = '''
import json, os, socket, sys
found = []
for path in {paths!r}:
    try:
        open(path).read()
        found.append("read " + path)
    except OSError:
        pass
for name in {names!r}:
    if name in os.environ:
        found.append("env " + name)
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=3).close()
    found.append("connected to the registry")
except OSError:
    pass
for path in {writable!r}:
    try:
        open(path, "a").close()
        found.append("wrote " + path)
    except OSError:
        pass
print(json.dumps({{"verdict": "BROKEN" if found else "FIXED", "reason": "; ".join(found) or "found nothing",
                  "target": 0}}))
'''


@pytest.fixture
def hostile(tmp_path, registry, monkeypatch):
    """A project whose proof is hostile, a HOME with a registry login, key files, tokens in the environment."""
    home, project = tmp_path / "home", tmp_path / "project"
    (home / ".docker").mkdir(parents=True)
    (home / ".docker" / "config.json").write_text('{"auths": {"ghcr.io": {"auth": "YWxpY2U6czNjcmV0"}}}')
    (project / "keys").mkdir(parents=True)
    (project / "keys" / "release.key").write_text("-----BEGIN ENCRYPTED PRIVATE KEY-----\n")
    proofs = project / "overlays" / "proofs"
    proofs.mkdir(parents=True)
    shutil.copy(ROOT / "overlays" / "proofs" / "_proof.py", proofs)
    venv_file = Path(sys.prefix) / "pyvenv.cfg"
    (proofs / "hostile.py").write_text(HOSTILE.format(
        paths=[str(home / ".docker" / "config.json"), str(project / "keys" / "release.key"),
               "/root/.docker/config.json", str(ROOT / "README.md")],
        names=sorted(SECRETS), port=registry.rsplit(":", 1)[1],
        writable=[str(venv_file), str(proofs / "planted.py")]))
    # (inside, a folder under /tmp, as this test's project is, lands on the sandbox's own /tmp: a
    # write there reaches nothing of the host, which is what the test checks for planted.py)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("BAKERY_CACHE", str(tmp_path / "cache"))
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    return prove.ProofSpec(proofs / "hostile.py")


def test_run_plainly_the_hostile_proof_finds_every_secret(hostile):
    """The control: without the sandbox, each thing the proof looks for is there to take."""
    done = subprocess.run([sys.executable, str(hostile.script), "/dev/null"], capture_output=True, text=True,
                          env=os.environ)
    reason = json.loads(done.stdout)["reason"]
    for what in ("read " + str(Path(os.environ["HOME"]) / ".docker" / "config.json"), "keys/release.key",
                 "env GITHUB_TOKEN", "env BAKERY_SIGNING_KEY", "env SAMPLES", "connected to the registry",
                 "wrote " + str(hostile.script.parent / "planted.py")):
        assert what in reason, reason


def test_in_the_sandbox_the_hostile_proof_finds_nothing(hostile):
    verdict = prove.run(hostile, b"print('the base code')\n", {})
    found = [f for f in verdict.reason.split("; ") if not f.endswith("/planted.py")]
    assert verdict.reason == "found nothing" or not found, verdict.reason
    assert not (hostile.script.parent / "planted.py").exists()  # nothing written reached the host


def test_real_proofs_run_in_the_sandbox(tmp_path, monkeypatch):
    """The sandbox still holds what a proof needs: torch, the proof's folder, hip/, its inputs."""
    monkeypatch.setenv("BAKERY_CACHE", str(tmp_path / "cache"))
    from bakery import overlays

    lock = json.loads((ROOT / "overlays" / "overlays.lock").read_text())
    stock = {e["id"]: ROOT / "overlays" / "stock" / e["base_sha256"] for e in lock["overlays"] if e["base_sha256"]}
    swiglu = next(o for o in overlays.load(ROOT / "overlays" / "overlays.yaml") if o.id == "exact-swiglu-clamp-kernel")
    verdict = prove.run(swiglu.proof, stock[swiglu.id].read_bytes(), {})
    assert verdict.verdict == prove.BROKEN, verdict.reason  # it imports hip/bakery_kernels and torch inside


def test_without_bubblewrap_proofs_do_not_run(hostile, monkeypatch):
    monkeypatch.setattr(sandbox, "BWRAP", "bwrap-not-installed")
    with pytest.raises(EnvironmentProblem, match="apt-get install bubblewrap"):
        prove.run(hostile, b"", {})


def test_a_sandbox_that_cannot_start_is_the_machines_problem_not_a_verdict(hostile, tmp_path, monkeypatch):
    """Where user namespaces are refused (Ubuntu 24.04's AppArmor default, not this machine), bwrap
    fails before running anything: a stand-in bwrap that fails the same way gives one clear line."""
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sandbox, "BWRAP", str(fake))
    with pytest.raises(EnvironmentProblem, match=r"sandbox cannot start here \(bwrap: setting up uid map"):
        prove.run(hostile, b"", {})


@pytest.mark.parametrize("body, reason", [
    # a flood: the write past 64 MiB fails (Python ignores SIGXFSZ: EFBIG); none of it is held in memory
    ("import sys\nchunk = b'x' * (1 << 20)\nwhile True:\n    sys.stdout.buffer.write(chunk)\n",
     "the proof failed (exit 1): OSError: [Errno 27] File too large"),
    # bytes that are not UTF-8, then a crash
    ("import sys\nsys.stdout.buffer.write(b'\\xff\\xfe')\nsys.stderr.buffer.write(b'\\xff oops\\n')\nsys.exit(3)\n",
     "the proof failed (exit 3): \ufffd oops"),
    # the code inside pretends to be bwrap failing: still a verdict on the code, never a machine problem
    ("import sys\nprint('bwrap: setting up uid map: Permission denied', file=sys.stderr)\nsys.exit(1)\n",
     "the proof failed (exit 1): bwrap: setting up uid map"),
])
def test_whatever_the_code_inside_prints_is_a_verdict(body, reason, tmp_path, monkeypatch):
    monkeypatch.setenv("BAKERY_CACHE", str(tmp_path / "cache"))
    proofs = tmp_path / "project" / "overlays" / "proofs"
    proofs.mkdir(parents=True)
    shutil.copy(ROOT / "overlays" / "proofs" / "_proof.py", proofs)
    (proofs / "loud.py").write_text(body)
    verdict = prove.run(prove.ProofSpec(proofs / "loud.py"), b"", {})
    assert verdict.verdict == prove.CANNOT and verdict.reason.startswith(reason), verdict.reason
