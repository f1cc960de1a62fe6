"""`invoke prune` on a real docker-registry 2.8 whose garbage is then collected by its own
`garbage-collect`: a simulated month (bakery/dev/month.py) and one real release, built, attested and
verified by `invoke verify` before and after. What must be kept is worked out here from the month's
own record (which candidates are newest by commit, which nightly each release was built on), not
from prune's table."""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import subprocess
import time
from pathlib import Path

import pytest
import requests
from cryptography.hazmat.primitives.asymmetric import ec

from bakery.dev import month as month_mod, stack
from bakery.oci import mirror
from bakery.oci.refs import Digest, Reference
from bakery.oci.registry import Registry
from bakery.oci.store import RegistryStore
from bakery.release.track.upstream import list_tags
from bakery.trust import keys, sign
from support import copy_project, dev_policy, invoke, last_line

PORT = 5014  # 5000-5004 and 5010-5013 are other tests'
PASSWORD = {"BAKERY_KEY_PASSWORD": "prune test password"}


@pytest.fixture(scope="module")
def host():
    return stack.ensure_registry(PORT, name="registry-prune", collected=True)


def on_disk() -> int:
    """Bytes under the prune registry's storage root."""
    root = stack.registry_dir(PORT, "registry-prune") / "data"
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def blob_present(host_name: str, repo: str, digest) -> bool:
    return requests.head(f"http://{host_name}/v2/{repo}/blobs/{digest}", timeout=10).status_code == 200


@pytest.fixture(scope="module")
def world(host, fixture_base, fixture_lock, tmp_path_factory):
    """The month (6 nightlies, 2 candidates a day, 2 promoted) plus a real release (v1.0.0) built on
    the fixture base mirrored as the oldest nightly; the project, keys, policy, ledger, retention."""
    tmp = tmp_path_factory.mktemp("prune")
    run = secrets.token_hex(3)
    app, mirror_repo = f"prune-{run}/app", f"prune-{run}/mirror"
    project = copy_project(tmp / "project", fixture_lock)
    d = tmp / "keys"
    assert invoke(project, "keygen", "--out", str(d), env=PASSWORD).returncode == 0
    os.environ.update(PASSWORD)  # the key is decrypted here, for the month's signatures
    try:
        signer = sign.Signer(keys.load_private(d / "release.key"))
    finally:
        for k in PASSWORD:
            os.environ.pop(k, None)
    # the real release first: the fixture base as the mirror's oldest nightly, a build on it, attested
    base = Reference(host, mirror_repo, None, fixture_base.digest)
    copied = mirror.copy(fixture_base, base.with_tag(f"kept-sha256-{fixture_base.pin.hex}"), log=lambda m: None)
    sha = subprocess.run(["git", "-C", str(project), "rev-parse", "HEAD"], capture_output=True, text=True,
                         check=True).stdout.strip()
    # pinned as a user pins it: upstream's name, read from the mirror
    (project / "image" / "base.yaml").write_text(f"image: {fixture_base}\nplatform: linux/amd64\n"
                                                 f"mirror: {host}/{mirror_repo}\n")
    built = invoke(project, "build", "--push", f"{host}/{app}:candidate-{sha}", env={"SOURCE_DATE_EPOCH": "1700000000"})
    assert built.returncode == 0, built.stderr
    real = Reference.parse(last_line(built))
    attested = invoke(project, "attest", str(real), "--key", str(d / "release.key"), env=PASSWORD)
    assert attested.returncode == 0, attested.stderr
    Registry(host).put_manifest(app, "v1.0.0", *Registry(host).get_manifest(real)[:2])
    month = month_mod.simulate(host, app, mirror_repo, project, signer, nightlies=6, candidates_per=2, promoted=2,
                               layer_bytes=64 * 1024)
    ledger = tmp / "nightlies.yaml"
    text = month_mod.ledger_text(month, host, "upstream.invalid/rocm/vllm-dev", mirror_repo)
    ledger.write_text(text)
    _add_base_to_ledger(ledger, copied, host, mirror_repo)
    (tmp / "retention.yaml").write_text("candidates: 3\nnightlies: 2\n")
    policy = dev_policy(tmp / "policy.yaml", fixture_base)
    return {"host": host, "app": app, "mirror": mirror_repo, "project": project, "month": month, "real": real,
            "base": copied, "pub": d / "release.pub", "ledger": ledger, "policy": policy,
            "retention": tmp / "retention.yaml", "tmp": tmp}


def _add_base_to_ledger(ledger: Path, base: Reference, host: str, mirror_repo: str) -> None:
    """The fixture base as the ledger's oldest nightly."""
    import yaml

    doc = yaml.safe_load(ledger.read_text())
    doc["nightlies"].append({"digest": str(base.digest), "index": None, "created": "2025-11-01T00:00:00Z",
                             "seen": "2025-11-01T00:00:00Z", "tags": ["nightly-fixture"], "moved": {}, "deleted": [],
                             "vllm": {"version": "0.26.0", "commit": None}, "aiter": {"version": "0.1.7", "commit": None},
                             "mirrored": f"{host}/{mirror_repo}@{base.digest}", "tried": None})
    ledger.write_text(yaml.safe_dump(doc, sort_keys=False))


def prune(w, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return invoke(w["project"], "prune", f"{w['host']}/{w['app']}", "--key", str(w["pub"]), "--policy",
                  str(w["policy"]), "--retention", str(w["retention"]), "--ledger", str(w["ledger"]), *extra, env=env)


def rows(out: str) -> dict[str, str]:
    """{digest hex prefix: keep|delete} from prune's table."""
    found = {}
    for line in out.splitlines():
        m = re.match(r"(keep|delete)\s+\S+\s+[\d.]+\s+\S+@([0-9a-f]{12})\s", line)
        if m:
            found[m.group(2)] = m.group(1)
    return found


def expected(w) -> tuple[set[str], set[str]]:
    """(kept, deleted) subjects' digest prefixes, from the month's record: the 3 newest candidates by
    commit (the real release's commit is the oldest), every release, the kernel artifacts of those,
    the 2 newest nightlies and each release's base."""
    m = w["month"]
    newest = [c for _, c in m.candidates][-3:]
    releases = list(m.releases.values())
    kept = {c.pin.hex[:12] for c in newest + releases} | {w["real"].pin.hex[:12]}
    kept |= {m.kernels[str(c.digest)].pin.hex[:12] for c in newest + releases}
    digests = [str(c.digest) for _, c in m.candidates]
    bases = {m.nightlies[digests.index(str(r.digest)) // 2].pin.hex[:12] for r in releases}  # 2 candidates a day
    kept |= {n.pin.hex[:12] for n in m.nightlies[-2:]} | bases | {w["base"].pin.hex[:12]}
    every = {c.pin.hex[:12] for _, c in m.candidates} | {k.pin.hex[:12] for k in m.kernels.values()} | \
        {n.pin.hex[:12] for n in m.nightlies}
    return kept, every - kept


def tags_of(w) -> dict[str, list[str]]:
    reg = Registry(w["host"])
    return {repo: sorted(list_tags(reg, repo)) for repo in (w["app"], w["mirror"])}


def release_whole(w, ref: Reference) -> None:
    """A synthetic release still verifies: its signature and provenance by the release key, and every
    blob of it, its kernel artifact and its base is in the registry."""
    from bakery.oci.store import RegistryStore
    from bakery.release import prune as prune_mod
    from bakery.trust import policy as policy_mod

    rules = policy_mod.load_policy(w["policy"], w["project"], {"release": [w["pub"]]})
    store_of = lambda digest: (RegistryStore(ref.with_digest(digest)), ref.with_digest(digest))  # noqa: E731
    prov = prune_mod.verified_provenance(store_of, rules)(ref.digest, True)
    reg = Registry(w["host"])
    for repo, digest in [(w["app"], ref.digest), *[(w["app"] if w["app"] in u else w["mirror"], d)
                                                 for u, d in _named(prov)]]:
        body, _, _ = reg.get_manifest(Reference(w["host"], repo, None, digest))
        for blob, _ in prune_mod._blobs(body):
            assert blob_present(w["host"], repo, blob), f"{repo}@{digest}: blob {blob} is gone"


def _named(prov) -> list:
    return [(d["uri"], Digest.parse(d["uri"].rsplit("@", 1)[1]))
            for d in prov.document["buildDefinition"]["resolvedDependencies"] if d.get("uri", "").startswith("docker://")]


def test_a_dry_run_prints_the_plan_and_changes_nothing(world):
    before = tags_of(world)
    planned = prune(world)
    assert planned.returncode == 0, planned.stderr
    table = rows(planned.stdout)
    kept, deleted = expected(world)
    assert {h for h in kept if table.get(h) != "keep"} == set(), planned.stdout
    assert {h for h in deleted if table.get(h) != "delete"} == set(), planned.stdout
    # each signature, attestation and bundle goes with its subject: kept with a kept one, deleted with a deleted one
    dependents = 0
    for line in planned.stdout.splitlines():
        m = re.match(r"(keep|delete)\s+(signature|attestation|referrers|referrer)\s.*?(?:sha256-([0-9a-f]{12})|of "
                     r"([0-9a-f]{12}))", line)
        if m:
            dependents += 1
            subject = m.group(3) or m.group(4)
            assert table.get(subject) == m.group(1), line
    assert dependents > 4 * len(world["month"].candidates)
    assert "a dry run: --apply deletes them" in planned.stdout
    assert re.search(r"up to [\d.]+ MB freed once the registry collects garbage", planned.stdout)
    assert tags_of(world) == before


def test_a_foreign_tag_is_never_touched(world):
    """A tag bakery does not write (someone's `latest`) on a candidate prune would delete: kept, and
    with it that candidate's signatures. One (`stable`) on a release: still a release, so what its
    provenance names is kept too."""
    m = world["month"]
    old = m.candidates[1][1]
    reg = Registry(world["host"])
    reg.put_manifest(world["app"], "latest", *reg.get_manifest(old)[:2])
    release = m.releases["v0.1.0"]
    reg.put_manifest(world["app"], "stable", *reg.get_manifest(release)[:2])  # stays: the release is kept
    try:
        planned = prune(world)
        assert planned.returncode == 0, planned.stderr
        line = next(line for line in planned.stdout.splitlines() if old.pin.hex[:12] in line and "latest" in line)
        assert line.startswith("keep") and "never touched" in line
        table = rows(planned.stdout)
        assert table[release.pin.hex[:12]] == "keep" and table[m.kernels[str(release.digest)].pin.hex[:12]] == "keep"
        assert table[old.pin.hex[:12]] == "keep"
        sigs = [line for line in planned.stdout.splitlines() if f"sha256-{old.pin.hex}.sig" in line]
        assert sigs and sigs[0].startswith("keep"), sigs
    finally:
        reg.delete_manifest(world["app"], old.digest)  # gone with its tags: the next test's plan is the month's


def test_apply_killed_midway_leaves_every_release_whole_and_a_rerun_finishes(world, tmp_path):
    """Killed after its third delete: every release still verifies (subjects go first, their
    signatures after); run again, prune finishes and a third run finds nothing to delete. Then the
    registry's garbage collection frees at least what prune said, and `invoke verify` still passes
    on the real release, blobs fetched."""
    trace = tmp_path / "trace"
    dry = prune(world, env={"BAKERY_CRASH_TRACE": str(trace)})
    assert dry.returncode == 0, dry.stderr
    said = re.search(r"up to ([\d.]+) MB freed", dry.stdout)
    assert said, dry.stdout
    reclaimable = float(said.group(1)) * 1e6
    listing_points = len(trace.read_text().splitlines())
    disk_before = on_disk()
    killed = prune(world, "--apply", env={"BAKERY_CRASH_AT": str(listing_points + 3)})
    assert killed.returncode == -9, killed.stdout + killed.stderr
    for ref in world["month"].releases.values():
        release_whole(world, ref)
    verified = invoke(world["project"], "verify", str(world["real"]), "--key", str(world["pub"]), "--policy",
                      str(world["policy"]))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    before_rerun = rows(prune(world).stdout)
    kinds = {m.group(2): m.group(1) for m in re.finditer(r"delete\s+(\S+)\s+[\d.]+\s+\S+@([0-9a-f]{12})\s",
                                                           prune(world).stdout)}
    deletes = tmp_path / "deletes"
    again = prune(world, "--apply", env={"BAKERY_CRASH_TRACE": str(deletes)})
    assert again.returncode == 0 and re.search(r"deleted \d+", again.stdout), again.stdout + again.stderr
    order = [kinds[m.group(1)] for m in re.finditer(r"DELETE /v2/\S+/manifests/sha256:([0-9a-f]{12})",
                                                      deletes.read_text())]
    assert sorted(order) and len(order) == sum(1 for v in before_rerun.values() if v == "delete")
    dependents = [i for i, kind in enumerate(order) if kind in ("signature", "attestation", "referrers", "referrer")]
    assert dependents and max(i for i, k in enumerate(order) if i not in dependents) < min(dependents), order
    settled = prune(world)
    assert settled.returncode == 0 and ", 0 to delete" in settled.stdout, settled.stdout
    stack.garbage_collect(PORT, "registry-prune")
    freed = disk_before - on_disk()
    assert freed >= 0.95 * reclaimable > 0, (freed, reclaimable)
    for ref in world["month"].releases.values():
        release_whole(world, ref)
    verified = invoke(world["project"], "verify", str(world["real"]), "--key", str(world["pub"]), "--policy",
                      str(world["policy"]))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    _, deleted = expected(world)
    gone = [c for _, c in world["month"].candidates if c.pin.hex[:12] in deleted]
    assert gone and not any(Registry(world["host"]).manifest_exists(world["app"], c.digest) for c in gone)


def test_a_registry_that_refuses_deletes_is_one_line(world, tmp_path):
    """docker-registry with deletes off answers 405: prune --apply says so, and what to do, in one line."""
    host = stack.ensure_registry(5015, name="registry-nodelete", deletes=False)
    reg = Registry(host)
    store_month = month_mod.simulate(host, "nodelete/app", "nodelete/mirror", world["project"],
                                     _signer(tmp_path), nightlies=2, candidates_per=2, promoted=0, layer_bytes=1024)
    assert store_month.candidates
    refused = invoke(world["project"], "prune", f"{host}/nodelete/app", "--key", str(tmp_path / "release.pub"),
                     "--policy", str(world["policy"]), "--retention", str(world["retention"]), "--ledger",
                     str(tmp_path / "none.yaml"), "--apply")
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert refused.returncode != 0 and len(errors) == 1 and "refuses deletes (HTTP 405)" in errors[0], refused.stderr
    first = store_month.candidates[0][1].digest
    assert first is not None and reg.manifest_exists("nodelete/app", first)


def _signer(tmp_path: Path) -> sign.Signer:
    key = ec.generate_private_key(ec.SECP256R1())
    (tmp_path / "release.pub").write_bytes(keys.public_pem(key.public_key()))
    return sign.Signer(key)


# -- from the attacker's side: push rights to the registry, or a registry that lies ------------------

def small_month(world, tmp_path, name: str):
    """A month of its own (3 nightlies, 2 candidates a day, one promoted: the oldest) beside the world's."""
    run = f"{name}-{secrets.token_hex(3)}"
    signer = _signer(tmp_path)
    month = month_mod.simulate(world["host"], f"{run}/app", f"{run}/mirror", world["project"], signer, nightlies=3,
                               candidates_per=2, promoted=1, layer_bytes=1024)
    (tmp_path / "nightlies.yaml").write_text(month_mod.ledger_text(month, world["host"], "upstream.invalid/v", f"{run}/mirror"))
    (tmp_path / "retention.yaml").write_text("candidates: 1\nnightlies: 1\n")

    def plan(*extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return invoke(world["project"], "prune", f"{world['host']}/{run}/app", "--key", str(tmp_path / "release.pub"),
                      "--policy", str(world["policy"]), "--retention", str(tmp_path / "retention.yaml"), "--ledger",
                      str(tmp_path / "nightlies.yaml"), *extra, env=env)

    return month, f"{run}/app", plan


def test_tags_and_listings_a_pusher_forges_never_cost_a_release_what_it_needs(world, tmp_path):
    """Each forgery would have had a dependency of the release deleted:
    - the release's .att manifest also tagged as another digest's attestation (two subjects);
    - the release itself also tagged sha256-<hex>, a fallback index's tag (a release is a release);
    - a deletable candidate's fallback index rewritten to list the release's own bundles (a referrer
      is a subject's only if its own manifest says so)."""
    from bakery.oci.referrers import fallback_tag
    from bakery.oci.registry import OCI_INDEX

    month, app, plan = small_month(world, tmp_path, "forged")
    reg = Registry(world["host"])
    release = month.releases["v0.1.0"]
    doomed = month.candidates[1][1]  # not the newest, not the release
    att = reg.get_manifest(Reference(world["host"], app, f"sha256-{release.pin.hex}.att", None))
    reg.put_manifest(app, f"sha256-{doomed.pin.hex}.att", att[0], att[1])
    reg.put_manifest(app, f"sha256-{'e' * 64}", *reg.get_manifest(release)[:2])
    ours = reg.get_manifest(Reference(world["host"], app, fallback_tag(release.pin), None))[0]
    reg.put_manifest(app, fallback_tag(doomed.pin), ours, OCI_INDEX)  # the release's bundles, listed as the doomed one's
    planned = plan()
    assert planned.returncode == 0, planned.stderr
    table = rows(planned.stdout)
    assert table[doomed.pin.hex[:12]] == "delete", planned.stdout
    assert table[att[2].hex[:12]] == "keep", planned.stdout  # the release's attestations
    assert table[month.kernels[str(release.digest)].pin.hex[:12]] == "keep", planned.stdout
    assert json.loads(ours)["manifests"]
    for entry in json.loads(ours)["manifests"]:
        assert table[entry["digest"].split(":")[1][:12]] == "keep", (entry["digest"], planned.stdout)
    applied = plan("--apply")
    assert applied.returncode == 0, applied.stderr
    release_whole({**world, "app": app, "mirror": app.replace("/app", "/mirror"), "pub": tmp_path / "release.pub"},
                  release)


def test_a_tag_added_after_the_plan_stops_the_deletes(world, tmp_path):
    """A promote between prune's listing and its deletes would lose its new tag with the digest it
    deletes: the tags are listed again first, and any change stops prune with nothing deleted."""
    from bakery.release import prune as prune_mod

    month, app, _ = small_month(world, tmp_path, "raced")
    reg = Registry(world["host"])
    stored = prune_mod.inventory(reg, app)
    prune_mod.unchanged(reg, app, stored)  # nothing changed: no error
    reg.put_manifest(app, "v9.9.9", *reg.get_manifest(month.candidates[0][1])[:2])
    with pytest.raises(Exception, match=r"changed since prune read them \(1 added, 0 gone\): nothing deleted"):
        prune_mod.unchanged(reg, app, stored)


def test_a_release_tag_the_registry_lists_and_then_denies_stops_the_prune(world, tmp_path):
    """A registry that lists v0.1.0 and then answers 404 for it (broken, or lying) would have had the
    release left out of the plan and its signatures and kernel artifact deleted: prune stops with
    one line, and nothing is deleted."""
    from proxy import FaultyProxy

    month, app, _ = small_month(world, tmp_path, "denied")
    before = sorted(list_tags(Registry(world["host"]), app))
    missing = (404, {"Content-Type": "application/json"}, b'{"errors":[{"code":"MANIFEST_UNKNOWN"}]}')
    with FaultyProxy(world["host"], [], overrides={f"/v2/{app}/manifests/v0.1.0": missing}) as proxy:
        refused = invoke(world["project"], "prune", f"{proxy.host}/{app}", "--key", str(tmp_path / "release.pub"),
                         "--policy", str(world["policy"]), "--retention", str(tmp_path / "retention.yaml"),
                         "--ledger", str(tmp_path / "none.yaml"), "--apply")
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert refused.returncode != 0 and len(errors) == 1 and "was listed and then not found" in errors[0], refused.stderr
    assert sorted(list_tags(Registry(world["host"]), app)) == before


def test_a_candidate_off_the_released_line_cannot_crowd_the_newest_out(world, tmp_path):
    """candidate-<sha> for a commit on another branch, dated next year (what push rights can make):
    ranked oldest, so the newest candidate of the released line (HEAD's history) stays kept."""
    month, app, plan = small_month(world, tmp_path, "crowded")
    project = world["project"]
    git = ["git", "-C", str(project)]
    head = subprocess.run([*git, "rev-parse", "--abbrev-ref", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()  # the branch the world's commits go on
    future = {**os.environ, "GIT_AUTHOR_DATE": "@1893456000 +0000", "GIT_COMMITTER_DATE": "@1893456000 +0000",
              "GIT_AUTHOR_NAME": "p", "GIT_AUTHOR_EMAIL": "p@localhost", "GIT_COMMITTER_NAME": "p",
              "GIT_COMMITTER_EMAIL": "p@localhost"}
    subprocess.run([*git, "checkout", "-q", "-b", f"side-{secrets.token_hex(3)}"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "from the future"], check=True, env=future)
    side = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run([*git, "checkout", "-q", head], check=True)
    reg = Registry(world["host"])
    old = month.candidates[1][1]  # neither the release (the first) nor the newest
    reg.put_manifest(app, f"candidate-{side}", *reg.get_manifest(old)[:2])  # an old image, under the future commit
    planned = plan()
    assert planned.returncode == 0, planned.stderr
    table = rows(planned.stdout)
    newest = month.candidates[-1][1]
    assert table[newest.pin.hex[:12]] == "keep" and table[old.pin.hex[:12]] == "delete", planned.stdout
    assert f"candidate-{side}: not a commit of this checkout's history (HEAD's ancestors): ranked oldest" in \
        planned.stderr + planned.stdout


def test_a_release_between_its_build_and_its_sign_job_keeps_what_it_pushed(world, tmp_path):
    """The newest candidate is pushed with its kernel artifact, neither signed yet (the sign job waits
    for its reviewers): the unsigned kernel artifact is kept, or the sign job would find it gone."""
    month, app, plan = small_month(world, tmp_path, "inflight")
    store = RegistryStore(Reference(world["host"], app, None, None))
    project = world["project"]
    sha = month_mod._commit(project, 1893456000, "a release in flight")  # the newest on HEAD's line
    built, _ = month_mod.image(store, [], f"candidate-{sha}", 1024)
    kernels, _ = month_mod.image(store, [], f"kernels-{secrets.token_hex(32)}", 1024)
    planned = plan()
    assert planned.returncode == 0, planned.stderr
    table = rows(planned.stdout)
    assert table[built.pin.hex[:12]] == "keep" and table[kernels.pin.hex[:12]] == "keep", planned.stdout
    line = next(line for line in planned.stdout.splitlines() if kernels.pin.hex[:12] in line)
    assert "its release may still sign it" in line


# -- GHCR: deletes are package versions, deleted through GitHub's REST API ---------------------------

def _ghcr(world, tmp_path: Path, run: str, package=None):
    """The GitHub stand-in (the only GitHub here) serving run/app and run/mirror as container packages
    of the owner `run`, their versions read from the prune registry's own store, 7 to a page."""
    from bakery.dev.github_stand_in import GitHubStandIn, RegistryPackage

    gh = GitHubStandIn(tmp_path / "github", run, "bakery", "ghcr-test-token", port=0)
    storage = stack.registry_dir(PORT, "registry-prune") / "data"
    gh.state.packages = {name: (package or RegistryPackage)(world["host"], f"{run}/{name}", storage)
                         for name in ("app", "mirror")}
    gh.state.repo.page_size = 7
    env = {"GITHUB_API_URL": gh.api, "GITHUB_TOKEN": "ghcr-test-token", "REQUESTS_CA_BUNDLE": str(gh.ca)}
    return gh, env


def test_ghcr_deletes_go_through_the_package_versions_api(world, tmp_path):
    """GHCR answers no registry DELETE: a proxy in front of the registry answers each with 405, as
    GHCR does. With --via github, prune deletes exactly what its dry run planned (subjects, their
    signatures and their untagged bundles) as package versions, one DELETE each through GitHub's API,
    the listing read page by page; the release stays whole and a second plan finds nothing to delete."""
    from proxy import Fault, FaultyProxy

    month, app, plan = small_month(world, tmp_path, "ghcr")
    run = app.split("/")[0]
    planned = plan()
    counted = re.search(r"(\d+) to delete", planned.stdout)
    assert planned.returncode == 0 and counted and int(counted.group(1)) > 0, planned.stdout + planned.stderr
    gh, env = _ghcr(world, tmp_path, run)
    with FaultyProxy(world["host"], [], script=[Fault("405", method="DELETE", times=10**6)]) as proxy, gh:
        def through(*extra: str) -> subprocess.CompletedProcess:
            return invoke(world["project"], "prune", f"{proxy.host}/{app}", "--key", str(tmp_path / "release.pub"),
                          "--policy", str(world["policy"]), "--retention", str(tmp_path / "retention.yaml"),
                          "--ledger", str(tmp_path / "nightlies.yaml"), "--apply", *extra, env=env)

        refused = through()  # the registry's DELETE, as prune does elsewhere
        assert refused.returncode != 0 and "refuses deletes (HTTP 405)" in refused.stderr, refused.stderr
        done = through("--via", "github")
    assert done.returncode == 0, done.stdout + done.stderr
    deletes = [r.path for r in gh.state.requests if r.method == "DELETE"]
    assert len(deletes) == int(counted.group(1)) and re.search(rf"deleted {counted.group(1)}\b", done.stdout)
    assert all(re.fullmatch(rf"/api/v3/orgs/{run}/packages/container/(app|mirror)/versions/\d+", p) for p in deletes)
    assert any("page=2" in r.path for r in gh.state.requests), "the versions were not read past their first page"
    settled = plan()
    assert settled.returncode == 0 and ", 0 to delete" in settled.stdout, settled.stdout
    mine = {**world, "app": app, "mirror": f"{run}/mirror", "pub": tmp_path / "release.pub"}
    for ref in month.releases.values():
        release_whole(mine, ref)


def test_github_and_the_registry_disagreeing_on_tags_stops_the_prune(world, tmp_path):
    """GitHub's versions name a release tag on the oldest candidate that the registry does not list
    (a stale API, or a registry answering per client): two readers disagree on what that digest is,
    so prune deletes nothing and says so in one line."""
    from bakery.dev.github_stand_in import RegistryPackage

    month, app, plan = small_month(world, tmp_path, "ghcr-split")
    oldest = str(month.candidates[1][1].digest)  # [0] is the promoted one

    class Disagreeing(RegistryPackage):
        def versions(self):
            return [(d, tags + ["v9.9.9"] if d == oldest else tags) for d, tags in super().versions()]

    gh, env = _ghcr(world, tmp_path, app.split("/")[0], Disagreeing)
    before = sorted(list_tags(Registry(world["host"]), app))
    with gh:
        refused = plan("--apply", "--via", "github", env=env)
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert refused.returncode != 0 and len(errors) == 1 and "disagree" in errors[0] and "v9.9.9" in errors[0], \
        refused.stderr
    assert not [r for r in gh.state.requests if r.method == "DELETE"]
    assert sorted(list_tags(Registry(world["host"]), app)) == before


def test_a_tag_github_gains_between_the_plan_and_a_delete_stops_the_prune(world, tmp_path):
    """A promote that tags a planned candidate while prune deletes (after the listings agreed, before
    that candidate's turn): GitHub's version is read again before each DELETE, so the candidate and
    its new tag stay and prune stops with one line."""
    from bakery.dev.github_stand_in import RegistryPackage

    month, app, plan = small_month(world, tmp_path, "ghcr-promoted")
    candidates = {str(c.digest) for _, c in month.candidates}

    class PromotedMidway(RegistryPackage):
        promoted = False

        def delete(self, digest):
            super().delete(digest)
            PromotedMidway.promoted = True  # the first delete done: a promote tags every candidate left

        def versions(self):
            return [(d, tags + ["v9.9.9"] if self.promoted and d in candidates else tags)
                    for d, tags in super().versions()]

    gh, env = _ghcr(world, tmp_path, app.split("/")[0], PromotedMidway)
    with gh:
        stopped = plan("--apply", "--via", "github", env=env)
    errors = [line for line in stopped.stderr.splitlines() if line.startswith("error:")]
    assert stopped.returncode != 0 and len(errors) == 1 and "not what prune planned" in errors[0], stopped.stderr
    assert len([r for r in gh.state.requests if r.method == "DELETE"]) == 1
    still = [c for _, c in month.candidates if Registry(world["host"]).manifest_exists(app, c.digest)]
    assert len(still) == len(month.candidates) - 1


def test_a_candidate_built_from_a_release_tag_off_the_line_is_kept(world, tmp_path):
    """A hotfix: a v-tag on a commit of another branch, its candidate built and waiting for its
    release's reviewers. By commit date among HEAD's ancestors it is not a candidate at all (ranked
    oldest, past the newest one kept), so it would be deleted from under its release; the git tag
    keeps it, through a tag of a tag too, for 14 days: one tagged a month ago goes."""
    month, app, plan = small_month(world, tmp_path, "hotfix")
    project = world["project"]
    git = ["git", "-C", str(project), "-c", "user.name=h", "-c", "user.email=h@localhost"]
    head = subprocess.run([*git, "rev-parse", "--abbrev-ref", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    subprocess.run([*git, "checkout", "-q", "-b", f"hotfix-{secrets.token_hex(3)}", "HEAD~3"], check=True)
    store = RegistryStore(Reference(world["host"], app, None, None))
    tags, built = [], {}
    for age in ("now", "a month ago"):
        sha = month_mod._commit(project, 1764547200, f"a hotfix tagged {age}")
        tag, inner = f"v9.{secrets.token_hex(2)}.1", f"inner-{secrets.token_hex(2)}"
        env = {**os.environ, **({"GIT_COMMITTER_DATE": "@" + str(int(time.time()) - 30 * 86400)}
                                if age != "now" else {})}
        subprocess.run([*git, "tag", "-a", "-m", "hotfix", inner], check=True, env=env)
        subprocess.run([*git, "tag", "-a", "-m", "hotfix", tag, inner], check=True, env=env)  # a tag of a tag
        tags += [tag, inner]
        built[age] = (tag, month_mod.image(store, [], f"candidate-{sha}", 1024)[0])
    subprocess.run([*git, "checkout", "-q", head], check=True)
    try:
        planned = plan()
    finally:
        subprocess.run([*git, "tag", "-d", *tags], check=True, capture_output=True)
    assert planned.returncode == 0, planned.stderr
    tag, image = built["now"]
    line = next(line for line in planned.stdout.splitlines() if image.pin.hex[:12] in line)
    assert line.startswith("keep") and f"the build of git tag {tag} " in line, planned.stdout
    _, old = built["a month ago"]
    assert rows(planned.stdout)[old.pin.hex[:12]] == "delete", planned.stdout


@pytest.mark.sweep
def test_prune_killed_at_every_point_leaves_each_release_whole_and_a_rerun_finishes(world, tmp_path):
    """The crash harness (issue 40) over prune --apply: killed at each of its points past the listing
    (each delete, the second listing), on a month of its own each time; after each kill the promoted
    release still verifies (its signature and signed provenance, every blob of it, its kernel artifact
    and its base); run again, prune finishes, and a third run has nothing to delete."""
    (tmp_path / "clean").mkdir()
    _, _, plan = small_month(world, tmp_path / "clean", "sweep-clean")
    trace = tmp_path / "clean-trace"
    listed = plan(env={"BAKERY_CRASH_TRACE": str(trace)})
    assert listed.returncode == 0, listed.stderr
    listing = len(trace.read_text().splitlines())
    trace.unlink()
    assert plan("--apply", env={"BAKERY_CRASH_TRACE": str(trace)}).returncode == 0
    points = len(trace.read_text().splitlines())
    assert points > listing + 10, (listing, points)
    for at in range(listing + 1, points + 1):
        here = tmp_path / f"at-{at}"
        here.mkdir()
        month, app, plan = small_month(world, here, f"sweep-{at}")
        killed = plan("--apply", env={"BAKERY_CRASH_AT": str(at)})
        assert killed.returncode == -9, (at, killed.stdout + killed.stderr)
        mine = {**world, "app": app, "mirror": app.replace("/app", "/mirror"), "pub": here / "release.pub"}
        for ref in month.releases.values():
            release_whole(mine, ref)
        again = plan("--apply")
        assert again.returncode == 0, (at, again.stdout + again.stderr)
        assert ", 0 to delete" in plan().stdout, at


def test_an_image_mirrored_by_digest_keeps_its_signatures(world, tmp_path):
    """`invoke mirror --image REF --to REGISTRY/REPO` copies a signed image by digest, with its
    signatures, and no tag of ours names the copy (ops pull it by digest). Prune there must not take
    its signatures (it would have: their subject was not listed, so not kept); the copy's signature
    and signed provenance still verify after prune --apply."""
    month, app, _ = small_month(world, tmp_path, "mirrored")
    release = month.releases["v0.1.0"]
    copy_repo = app.replace("/app", "/copy")
    copied = invoke(world["project"], "mirror", "--image", str(release), "--to", f"{world['host']}/{copy_repo}")
    assert copied.returncode == 0, copied.stderr
    pruned = invoke(world["project"], "prune", f"{world['host']}/{copy_repo}", "--key", str(tmp_path / "release.pub"),
                    "--policy", str(world["policy"]), "--retention", str(tmp_path / "retention.yaml"), "--ledger",
                    str(tmp_path / "none.yaml"), "--apply")
    assert pruned.returncode == 0, pruned.stdout + pruned.stderr
    assert ", 0 to delete" in pruned.stdout and "(untagged, signed)" in pruned.stdout, pruned.stdout
    tags = list_tags(Registry(world["host"]), copy_repo)
    assert f"sha256-{release.pin.hex}.sig" in tags and f"sha256-{release.pin.hex}.att" in tags, tags
    # the copy still verifies: its signature and its signed provenance, by the release key
    from bakery.release import prune as prune_mod
    from bakery.trust import policy as policy_mod

    rules = policy_mod.load_policy(world["policy"], world["project"], {"release": [tmp_path / "release.pub"]})
    ref = Reference(world["host"], copy_repo, None, release.digest)
    assert prune_mod.verified_provenance(lambda d: (RegistryStore(ref), ref), rules)(release.digest, True)


# -- an OCI layout: what `invoke mirror --image --layout` fills ----------------------------------------

def _layout_files(layout: Path) -> dict[str, bytes]:
    return {str(p.relative_to(layout)): p.read_bytes() for p in sorted(layout.rglob("*")) if p.is_file()}


def _layout_needs(layout: Path) -> set[str]:
    """The blobs a reader of the layout needs, worked out here from the OCI image-layout spec: what
    index.json names, and what each manifest or index names in turn; and, for each cosign
    signature or attestation named, its subject with what it names (a signature must never outlive
    its image)."""
    index = json.loads((layout / "index.json").read_text())
    todo = [m["digest"] for m in index["manifests"]]
    todo += [f"sha256:{m.group(1)}" for e in index["manifests"]
             if (m := re.fullmatch(r"sha256-([0-9a-f]{64})\.(sig|att)",
                                   (e.get("annotations") or {}).get("org.opencontainers.image.ref.name", "")))]
    needed: set[str] = set()
    while todo:
        digest = todo.pop()
        if digest in needed:
            continue
        needed.add(digest)
        path = layout / "blobs" / "sha256" / digest.split(":")[1]
        assert path.is_file(), f"{digest} is needed and gone"
        try:
            doc = json.loads(path.read_bytes())
        except ValueError:
            continue
        if isinstance(doc, dict) and isinstance(doc.get("layers"), list):
            todo += [doc["config"]["digest"], *(layer["digest"] for layer in doc["layers"])]
        elif isinstance(doc, dict) and isinstance(doc.get("manifests"), list):
            todo += [m["digest"] for m in doc["manifests"]]
    return needed


def _names(layout: Path) -> set[str | None]:
    index = json.loads((layout / "index.json").read_text())
    return {(e.get("annotations") or {}).get("org.opencontainers.image.ref.name") for e in index["manifests"]}


def test_a_layout_of_mirrored_images_obeys_the_policy_and_its_garbage_goes(world, tmp_path):
    """Signed images copied into one layout by `invoke mirror --image --layout` (a release by its
    tag, three candidates by theirs, two by digest alone: each named latest in turn, so the first
    is left untagged and signed), and the blobs a killed copy left. prune --layout keeps the release,
    the newest candidate by commit (retention 1), the one under a tag bakery does not write and the
    one only our signatures name, each with its signatures; the other candidates go with
    theirs, in one write of index.json; then every blob no kept manifest reaches is removed. skopeo
    (containers/image's reader) still copies each kept name whole; the release's signed provenance
    still verifies from the layout; a kill after index.json is written leaves every kept image
    whole, and the rerun collects what it left."""
    import fcntl

    month, app, _ = small_month(world, tmp_path, "layout")
    host, layout = world["host"], tmp_path / "layout"
    release = month.releases["v0.1.0"]
    by_digest = [c for _, c in month.candidates[1:3]]  # the second takes `latest` from the first
    sources = [f"{host}/{app}:v0.1.0@{release.digest}", *(f"{host}/{app}@{c.digest}" for c in by_digest)]
    sources += [f"{host}/{app}:candidate-{sha}@{c.digest}" for sha, c in month.candidates[3:]]
    for source in sources:
        copied = invoke(world["project"], "mirror", "--image", source, "--layout", str(layout))
        assert copied.returncode == 0, copied.stderr
    assert {"v0.1.0", "latest"} <= _names(layout)
    orphan = os.urandom(4096)  # a copy killed after a blob, before its manifest
    (layout / "blobs" / "sha256" / hashlib.sha256(orphan).hexdigest()).write_bytes(orphan)

    def plan(*extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return invoke(world["project"], "prune", f"oci:{layout}", "--key", str(tmp_path / "release.pub"),
                      "--policy", str(world["policy"]), "--retention", str(tmp_path / "retention.yaml"), *extra,
                      env=env)

    before = _layout_files(layout)
    dry = plan()
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert _layout_files(layout) == before, "a dry run changed the layout"
    trace = tmp_path / "trace"  # the points a run passes before it writes (what the first wrote is cached now)
    assert plan(env={"BAKERY_CRASH_TRACE": str(trace)}).returncode == 0
    points = len(trace.read_text().splitlines()) if trace.exists() else 0
    newest, gone = month.candidates[-1][1], [c for _, c in month.candidates[3:-1]]
    table = rows(dry.stdout)
    assert {table[c.pin.hex[:12]] for c in gone} == {"delete"}, dry.stdout
    assert {table[c.pin.hex[:12]] for c in (newest, release, *by_digest)} == {"keep"}, dry.stdout
    assert "(untagged, signed)" in dry.stdout, dry.stdout
    with open(layout / "oci-layout", "rb") as held:  # a mirror writing: prune is refused, nothing changes
        fcntl.flock(held, fcntl.LOCK_SH)
        busy = plan("--apply")
    assert busy.returncode != 0 and "being written" in busy.stderr and len(busy.stderr.strip().splitlines()) == 1, \
        busy.stderr
    assert _layout_files(layout) == before
    killed = plan("--apply", env={"BAKERY_CRASH_AT": str(points + 2)})  # past index.json's write and rename
    assert killed.returncode == -9, killed.stdout + killed.stderr
    assert not {f"candidate-{sha}" for sha, _ in month.candidates[3:-1]} & _names(layout), "killed before the write"
    assert (layout / "blobs" / "sha256" / hashlib.sha256(orphan).hexdigest()).exists(), "killed after the collection"
    _layout_needs(layout)  # every kept image whole, with its signatures' subjects
    again = plan("--apply")
    assert again.returncode == 0 and "0 to delete (deleted 0)" in again.stdout, again.stdout + again.stderr
    needed = _layout_needs(layout)
    left = {f"sha256:{p.name}" for p in (layout / "blobs" / "sha256").iterdir()}
    assert left == needed, f"left and not needed: {sorted(left - needed)[:3]}"
    assert hashlib.sha256(orphan).hexdigest() not in {d.split(":")[1] for d in left}
    assert not any(c.pin.hex in " ".join(n for n in _names(layout) if n) or f"sha256:{c.pin.hex}" in left
                   for c in gone)
    assert {f"sha256:{c.pin.hex}" for c in by_digest} <= left
    for name in ("v0.1.0", "latest", f"candidate-{month.candidates[-1][0]}"):
        out = tmp_path / f"copy-{name}"
        copied = subprocess.run(["skopeo", "copy", "--quiet", f"oci:{layout}:{name}", f"dir:{out}"],
                                capture_output=True, text=True)
        assert copied.returncode == 0, copied.stderr
    for sha, _ in month.candidates[3:-1]:
        assert subprocess.run(["skopeo", "inspect", f"oci:{layout}:candidate-{sha}"], capture_output=True).returncode
    from bakery.oci.store import LayoutStore
    from bakery.release import prune as prune_mod
    from bakery.trust import policy as policy_mod

    rules = policy_mod.load_policy(world["policy"], world["project"], {"release": [tmp_path / "release.pub"]})
    ref = Reference("oci-layout", str(layout), None, release.digest)
    assert prune_mod.verified_provenance(lambda d: (LayoutStore(layout), ref), rules)(release.digest, True)


def test_a_layout_naming_two_images_alike_is_refused(tmp_path):
    """Two index.json entries of one name: containers/image takes one, we another; refused."""
    from bakery.errors import IntegrityError
    from bakery.oci.store import REF_NAME, LayoutStore
    from bakery.release import prune as prune_mod

    store = LayoutStore(tmp_path / "l", create=True)
    store.put_manifest("v1.0.0", b'{"schemaVersion":2,"config":{"digest":"sha256:' + b"0" * 64 + b'","size":1},"layers":[]}')
    index = json.loads((tmp_path / "l" / "index.json").read_text())
    other = store.put_manifest(None, b'{"schemaVersion":2,"layers":[]}')
    index["manifests"].append({"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": str(other),
                               "size": 31, "annotations": {REF_NAME: "v1.0.0"}})
    (tmp_path / "l" / "index.json").write_text(json.dumps(index))
    with pytest.raises(IntegrityError, match="names two manifests 'v1.0.0'"):
        prune_mod.layout_inventory(store)


def _blob(store, data: bytes) -> str:
    return str(store.put_blob(data, "application/octet-stream").digest)


def _image(store, name: str | None, layer: bytes) -> str:
    """A small image in the layout (config and one layer), named `name` unless None; its digest."""
    config, layer_digest = _blob(store, b'{"architecture":"amd64","os":"linux"}'), _blob(store, layer)
    body = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config,
                                  "size": 37},
                       "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest,
                                   "size": len(layer)}]}).encode()
    return str(store.put_manifest(name, body))


def test_a_layout_whose_blobs_folder_is_a_link_is_refused_and_nothing_outside_it_goes(tmp_path):
    """Found by review: blobs/ a link to another layout's blobs made the other layout's files
    garbage here, and prune removed them. The folders are opened as this layout's own, never
    through a link: refused, and the other layout's blob is still there."""
    from bakery.errors import IntegrityError
    from bakery.oci.store import LayoutStore

    other = LayoutStore(tmp_path / "other", create=True)
    victim = _blob(other, b"another layout's layer")
    hostile = LayoutStore(tmp_path / "hostile", create=True)
    (tmp_path / "hostile" / "blobs").symlink_to(tmp_path / "other" / "blobs")
    with pytest.raises(IntegrityError, match="blobs is not a folder of its own"):
        hostile.unreachable(set())
    with pytest.raises(IntegrityError, match="blobs is not a folder of its own"):
        hostile.remove_blobs([victim.split(":")[1]])
    assert (tmp_path / "other" / "blobs" / "sha256" / victim.split(":")[1]).is_file()


def test_whatever_a_kept_manifest_names_is_reached_whatever_its_shape(tmp_path):
    """Found by review: only a manifest's config and layers or an index's manifests were followed,
    by the document's shape, so an ORAS artifact manifest's `blobs`, or an index carrying
    `"layers": null`, had what it needs collected. Every descriptor is followed now; what is
    reached is worked out here by hand."""
    from bakery.oci.store import LayoutStore

    store = LayoutStore(tmp_path / "l", create=True)
    oras_blob = _blob(store, b"an ORAS artifact's file")
    oras = store.put_manifest("foreign", json.dumps({
        "mediaType": "application/vnd.oci.artifact.manifest.v1+json", "artifactType": "application/x-thing",
        "blobs": [{"mediaType": "application/octet-stream", "digest": oras_blob, "size": 23}]}).encode())
    child = _image(store, None, b"the index's image's layer")
    index = store.put_manifest("index", json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "layers": None,
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": child, "size": 1}]}).encode())
    garbage = _blob(store, b"what a killed copy left")
    left = store.unreachable({oras, index})
    assert set(left) == {garbage.split(":")[1]}, left


def test_an_index_go_reads_otherwise_than_python_is_refused(tmp_path):
    """Go's decoder (skopeo's, containerd's) matches JSON keys ignoring case, the last one winning;
    Python's takes the exact key. An entry with both `digest` and `Digest` is one image to us and
    another to skopeo (shown here with skopeo itself): refused, so prune cannot judge one image and
    ops run the other."""
    from bakery.errors import IntegrityError
    from bakery.oci.store import LayoutStore
    from bakery.release import prune as prune_mod

    store = LayoutStore(tmp_path / "l", create=True)
    ours, theirs = _image(store, None, b"what python reads"), _image(store, None, b"what go reads")
    raw = ('{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json",'
           f'"digest":"{ours}","size":{(tmp_path / "l/blobs/sha256" / ours[7:]).stat().st_size},'
           '"annotations":{"org.opencontainers.image.ref.name":"app"},'
           f'"Digest":"{theirs}"' '}]}')
    (tmp_path / "l" / "index.json").write_text(raw)
    seen = subprocess.run(["skopeo", "inspect", "--raw", f"oci:{tmp_path / 'l'}:app"], capture_output=True)
    assert seen.returncode == 0 and hashlib.sha256(seen.stdout).hexdigest() == theirs[7:], seen.stderr
    with pytest.raises(IntegrityError, match="twice in different cases"):
        prune_mod.layout_inventory(LayoutStore(tmp_path / "l"))


def test_a_layout_that_cannot_be_locked_or_changed_since_the_plan_is_one_line(tmp_path):
    """A FIFO as oci-layout would have the lock wait forever; an index.json another tool wrote
    since the plan was made is not overwritten."""
    from bakery.errors import EnvironmentProblem, IntegrityError
    from bakery.oci.refs import Digest
    from bakery.oci.store import LayoutStore

    store = LayoutStore(tmp_path / "l", create=True)
    doomed = Digest.parse(_image(store, "candidate-" + "a" * 40, b"layer"))
    planned = store.index_digest()
    _image(store, "written-since", b"another layer")
    with pytest.raises(EnvironmentProblem, match="changed since prune read it"):
        store.drop({doomed}, planned)
    assert "candidate-" + "a" * 40 in store.names()[0]
    (tmp_path / "l" / "oci-layout").unlink()
    os.mkfifo(tmp_path / "l" / "oci-layout")
    with pytest.raises(IntegrityError, match="not a regular file"), store.locked(wait=False):
        pass
