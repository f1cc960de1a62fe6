"""The real test stack: Docker engine, distribution registries on 127.0.0.1, the fixture base.

Nothing here is mocked. Where a misbehaving network is needed, a proxy in front of the real
registry misbehaves (tests/proxy.py); the registry behind it is still real.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import copy_project, invoke

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bakery.dev import fixture as fixture_mod, stack  # noqa: E402 (after sys.path names the project)

# a test that takes one of these needs the engine and a registry: marked `stack`, so the rest runs
# alone in seconds (`invoke test --fast`); a file that reaches the stack otherwise says so itself
STACK_FIXTURES = {"registry", "basic_registry", "token_registry", "fixture_base", "fixture_base_027", "toolchain",
                  "fixture_lock", "project"}


def pytest_collection_modifyitems(items):
    for item in items:
        if STACK_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.stack)


@pytest.fixture(scope="session", autouse=True)
def temp_under_basetemp(tmp_path_factory):
    """Temporary folders the code under test makes for itself (a rebuild that gave other bytes is
    kept to be looked at) land in pytest's folder, which pytest prunes, not loose in /tmp."""
    import tempfile

    folder = tmp_path_factory.mktemp("tmp")
    saved = os.environ.get("TMPDIR")
    os.environ["TMPDIR"], tempfile.tempdir = str(folder), None
    yield folder
    if saved is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = saved
    tempfile.tempdir = None


@pytest.fixture(autouse=True)
def own_smoke_ledger(tmp_path, monkeypatch):
    """Each test its own ledger of smoke results: the images are reproducible, so one test's FAILED
    would otherwise stand against another's older PASSED for the very same digest."""
    monkeypatch.setenv("BAKERY_SMOKE_LEDGER", str(tmp_path / "smoke-ledger.json"))


@pytest.fixture(scope="session")
def registry() -> str:
    """host:port of the plain (anonymous) local registry; the engine is up too."""
    return stack.up()


@pytest.fixture(scope="session")
def basic_registry(registry) -> str:
    """host:port of a real registry that demands basic auth: alice / s3cret."""
    htpasswd = stack.state_dir() / "htpasswd"
    htpasswd.write_text(subprocess.run(["htpasswd", "-Bbn", "alice", "s3cret"], capture_output=True,
                                       text=True, check=True).stdout)
    auth = {"htpasswd": {"realm": "bakery-test", "path": str(htpasswd)}}
    return stack.ensure_registry(5001, auth=auth, name="registry-basic")


@pytest.fixture(scope="session")
def fixture_base(registry):
    """The fixture base, built by Docker from debootstrap + vLLM/AITER wheels, as a pinned Reference."""
    return fixture_mod.build(ROOT / "tests" / "fixture" / "fixture.yaml", registry, log=lambda m: None)


@pytest.fixture(scope="session")
def fixture_base_027(registry):
    """The same fixture built from vLLM 0.27.0, the release after the pinned nightly."""
    return fixture_mod.build(ROOT / "tests" / "fixture" / "fixture-vllm-0.27.0.yaml", registry, log=lambda m: None)


@pytest.fixture(scope="session")
def toolchain(registry) -> str:
    """The stand-in HIP toolchain image (Debian clang-19, ROCm device libs, CPU torch), built by
    Docker and pushed to the local registry, pinned; every build in the suite compiles hip/ over
    its files (BAKERY_TOOLCHAIN), as the fixture base has no ROCm."""
    image = fixture_mod.toolchain(ROOT / "hip" / "toolchain", ROOT / "tests" / "fixture" / "fixture.yaml",
                                  registry, log=lambda m: None)
    os.environ["BAKERY_TOOLCHAIN"] = image
    return image


@pytest.fixture(scope="session")
def fixture_lock(fixture_base, toolchain, tmp_path_factory) -> bytes:
    """overlays.lock for this machine's fixture base (its digest differs per machine: Docker
    builds are not reproducible), computed by `invoke lock` from the committed overlays."""
    lock = tmp_path_factory.mktemp("lock") / "overlays.lock"
    result = invoke(ROOT, "lock", "--base", str(fixture_base), "--lock", str(lock))
    assert result.returncode == 0, result.stderr
    return lock.read_bytes()


@pytest.fixture
def project(tmp_path, fixture_lock) -> Path:
    return copy_project(tmp_path / "project", fixture_lock)




@pytest.fixture(scope="session")
def bfcl_harness() -> tuple[str, dict]:
    """(the python of BFCL's harness venv, bakery/release/bfcl.py, built once per machine; the tool
    calls BFCL's possible answers hold for the committed spec's cases, which the stand-in serves)."""
    from bakery.dev import vllm_stand_in
    from bakery.release import bfcl, smoke_spec

    python = bfcl.ensure(ROOT)
    cases = smoke_spec.load_spec(ROOT / "provenance" / "smoke.yaml").tool_calls.cases
    return python, vllm_stand_in.bfcl_answers(python, cases)


@pytest.fixture(scope="session")
def bench_client(tmp_path_factory) -> tuple[Path, Path]:
    """(vLLM 0.26.0's own `vllm bench serve`, as a command, and a small tokenizer it loads):
    bakery/dev/bench_client.py, built once per machine."""
    from bakery.dev import bench_client as client

    command = client.ensure(ROOT)
    return command, client.tokenizer(command, tmp_path_factory.mktemp("tokenizer"))
