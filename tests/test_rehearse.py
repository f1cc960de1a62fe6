"""The release workflow, run end to end under act (`invoke rehearse`), as a v* tag push.

Real: act runs every job of the committed release.yml on this host, with the four actions vendored
at the pinned commits, its artifact server on 127.0.0.1, the local registry with basic auth standing
in for GHCR, a bare repository standing in for GitHub's git hosting. Stand-ins, said where used:
there is no MI300X here, so the smoke job must fail closed; in the rehearsals that go past it, the
smoke job's one MI300X step signs the report the tests use for the MI300X's (tests/test_smoke.py),
with the smoke key the job holds.

Slow (a rehearsal is minutes on 2 cores): marked `rehearsal`; .ci/run runs them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from bakery.dev import act_jobs, rehearsal_stage, rehearse, rehearse_nightly, runner
from bakery.oci.refs import Reference
from bakery.oci.registry import Registry
from bakery.trust import policy, provenance
from support import ROOT, invoke

pytestmark = pytest.mark.rehearsal

COSIGN = ROOT / ".tools" / "bin" / "cosign"


@pytest.fixture(scope="session")
def rehearsals(tmp_path_factory, registry):
    """One folder for every rehearsal of the session (they share the fixture lock and wheels)."""
    return tmp_path_factory.mktemp("rehearsals")


def run(rehearsals, name: str, **kwargs) -> act_jobs.Outcome:
    outcome = rehearse.release(ROOT, rehearsals / name, log=lambda m: None, **kwargs)
    print(f"\n{name}\n{outcome.table()}")
    return outcome


def job_log(outcome: act_jobs.Outcome, job: str) -> str:
    lines = []
    for line in outcome.log.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("jobID") == job:
            lines.append(entry.get("msg", ""))
    return "\n".join(lines)


def registry_env(outcome: act_jobs.Outcome) -> dict:
    host, user, password = outcome.extra["stage"].registry
    return {"BAKERY_REGISTRY_HOSTS": host, "BAKERY_REGISTRY_USER": user, "BAKERY_REGISTRY_PASSWORD": password}


def tag_digest(outcome: act_jobs.Outcome, tag: str) -> str | None:
    """What the rehearsal registry's image repository says `tag` is, or None."""
    from bakery.errors import NotFound

    stage = outcome.extra["stage"]
    with rehearsal_stage.scoped_environ(**registry_env(outcome)):
        try:
            return str(Registry(stage.registry[0]).get_manifest(Reference.parse(f"{stage.image_repo}:{tag}"))[2])
        except NotFound:
            return None


def assert_stopped_at(outcome: act_jobs.Outcome, job: str) -> None:
    """`job` failed, every job before it in the chain succeeded, nothing after it ran, no tag moved."""
    order = list(rehearse.RELEASE_JOBS)
    results = {name: j.result for name, j in outcome.jobs.items()}
    assert results[job] == "failure", outcome.table()
    for name in order[:order.index(job)]:
        assert results[name] == "success", outcome.table()
    for name in order[order.index(job) + 1:]:
        assert results[name] != "success", outcome.table()
    assert tag_digest(outcome, rehearse.TAG) is None  # nothing promoted


# -- no MI300X here: no runner takes the smoke job, and the run is cancelled ------------------------

@pytest.fixture(scope="module")
def no_mi300x(rehearsals):
    return run(rehearsals, "no-mi300x")


def test_without_an_mi300x_runner_the_release_is_cancelled_and_nothing_is_promoted(no_mi300x):
    """GitHub would keep the smoke job queued for 24 hours; mi300x-runner says so after
    MI300X_WAIT_MINUTES and cancels the run (the GitHub stand-in is asked to)."""
    assert [no_mi300x.result(j) for j in ("build", "sign", "rebuild", "attest-rebuild")] == ["success"] * 4, \
        no_mi300x.table()
    assert_stopped_at(no_mi300x, "mi300x-runner")
    watch = job_log(no_mi300x, "mi300x-runner")
    assert "no runner took 'smoke on MI300X' within 1 minutes of its being queued" in watch
    assert "::error title=No runner took smoke on MI300X::" in watch
    assert no_mi300x.extra["github"].cancelled == [no_mi300x.extra["run_id"]]
    assert no_mi300x.result("smoke") != "success"
    # the build job's output is the candidate it pushed; no release tag was written for it
    assert f"::set-output:: image={no_mi300x.image}" in job_log(no_mi300x, "build")


def test_the_rebuild_matched_and_every_job_ran_as_the_runner_within_its_budget(no_mi300x):
    """The independent rebuild from the provenance gave the same digest; each job ran as the hosted
    runner's user (root only through sudo), installed bubblewrap itself (the runner has none, and
    its apt lists need an update), wrote the toolchain's files on /mnt, and kept within a hosted
    runner's disks and its timeout."""
    assert f"reproduced {no_mi300x.image}" in job_log(no_mi300x, "rebuild")
    for name in ("build", "rebuild"):
        job = no_mi300x.jobs[name]
        assert runner.UID in job.usage.users and job.usage.peak["/mnt"] > 1 << 30, no_mi300x.table()
        assert "Unpacking bubblewrap" in job_log(no_mi300x, name) or name == "rebuild"
        assert "cache: /mnt/bakery/cache" in job_log(no_mi300x, name)
    assert all(0 not in j.usage.users for n, j in no_mi300x.jobs.items() if n in ("sign", "attest-rebuild")), \
        no_mi300x.table()
    assert no_mi300x.over_budget() == [], no_mi300x.table()


def test_each_artifact_went_up_at_the_first_attempt(no_mi300x):
    """act's artifact server answered the first listing of a run without artifacts with a panic
    (a 502 through the proxy), and upload-artifact retried four times, 28 s, before its upload
    went through: a run's folder is made before act starts."""
    log = no_mi300x.log.read_text()
    assert "Artifact build-record has been successfully uploaded" in log
    assert "http: panic serving" not in log and "Attempt 1 of 5 failed" not in log


# -- past the MI300X, with the stand-in: attach, attest the rebuild, promote ----------------------------

@pytest.fixture(scope="module")
def promoted(rehearsals):
    return run(rehearsals, "stand-in", smoke="stand-in")


def test_the_smoke_job_verified_the_candidate_before_running_it(promoted):
    """Signed, and rebuilt to the same bytes by the rebuilder (one required), before the MI300X step."""
    smoke = job_log(promoted, "smoke")
    assert "verified " + promoted.image in smoke and "ok   built from a clean checkout" in smoke
    assert "ok: the smoke key in BAKERY_SMOKE_SIGNING_KEY is" in smoke


def test_the_stand_in_changes_one_step_of_the_smoke_job_and_nothing_else(promoted):
    repo = promoted.extra["stage"].repo
    status = subprocess.run(["git", "-C", str(repo), "status", "--porcelain"], capture_output=True, text=True).stdout
    assert status.split() == ["M", ".github/workflows/smoke.yml"]  # only act's copy; the tag has the committed one
    committed = yaml.safe_load(subprocess.run(["git", "-C", str(repo), "show", "HEAD:.github/workflows/smoke.yml"],
                                              capture_output=True, text=True, check=True).stdout)
    ran = yaml.safe_load((repo / ".github" / "workflows" / "smoke.yml").read_text())
    ran["on"] = ran.pop("on", None)
    committed["on"] = committed.pop(True)
    smoke_ran, smoke_committed = ran["jobs"].pop("smoke"), committed["jobs"].pop("smoke")
    assert ran == committed
    assert len(smoke_ran["steps"]) == len(smoke_committed["steps"])
    changed = [i for i, (a, b) in enumerate(zip(smoke_ran["steps"], smoke_committed["steps"], strict=True)) if a != b]
    assert [smoke_committed["steps"][i]["name"] for i in changed] == [rehearse.SMOKE_STEP]
    assert "STAND-IN" in smoke_ran["steps"][changed[0]]["name"]
    smoke_ran.pop("steps"), smoke_committed.pop("steps")
    assert smoke_ran == smoke_committed  # same runner, environment, needs, permissions


def test_with_the_stand_in_every_job_passes_and_the_tag_names_the_candidate(promoted):
    assert all(j.result == "success" for j in promoted.jobs.values()), promoted.table()
    assert tag_digest(promoted, rehearse.TAG) == promoted.image.split("@")[1]
    assert "(match)" in job_log(promoted, "attest-rebuild")


def cosign(outcome, *args) -> subprocess.CompletedProcess:
    """cosign, logged in to the rehearsal registry (a Docker config of its own, as ops would have)."""
    import base64

    host, user, password = outcome.extra["stage"].registry
    config = outcome.work / "cosign-docker"
    config.mkdir(exist_ok=True)
    (config / "config.json").write_text(json.dumps(
        {"auths": {host: {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}}}))
    return subprocess.run([str(COSIGN), *args, "--insecure-ignore-tlog=true", "--allow-http-registry"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "DOCKER_CONFIG": str(config)})


def test_the_promoted_tag_passes_cosign_with_each_roles_key(promoted):
    stage = promoted.extra["stage"]
    tagged = f"{stage.image_repo}:{rehearse.TAG}"
    pub = {role: str(stage.keys / f"{role}.pub") for role in ("release", "smoke", "rebuilder")}
    assert cosign(promoted, "verify", "--key", pub["release"], tagged).returncode == 0
    for predicate, role in policy.SIGNED_BY.items():
        good = cosign(promoted, "verify-attestation", "--key", pub[role], "--type", predicate, tagged)
        assert good.returncode == 0, (predicate, good.stderr)
    # and each statement only with its own role's key: the smoke key vouches for no provenance
    wrong = cosign(promoted, "verify-attestation", "--key", pub["smoke"], "--type", provenance.SLSA_PREDICATE, tagged)
    assert wrong.returncode != 0


def test_the_promoted_tag_passes_invoke_verify_with_smoke_and_one_rebuild(promoted):
    stage = promoted.extra["stage"]
    keys = ["--key", str(stage.keys / "release.pub"), "--smoke-key", str(stage.keys / "smoke.pub"),
            "--rebuilder-key", str(stage.keys / "rebuilder.pub")]
    tagged = f"{stage.image_repo}:{rehearse.TAG}"
    digest = tag_digest(promoted, rehearse.TAG)
    ref = f"{stage.image_repo}@{digest}"
    # from a checkout of the released revision, as ops verify
    done = invoke(stage.repo, "verify", ref, *keys, "--require-smoke", "--require-rebuilds", "1",
                  env=registry_env(promoted))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "smoke" in done.stdout and "rebuil" in done.stdout
    # two rebuilds are more than were attested: the same check can fail
    more = invoke(stage.repo, "verify", ref, *keys, "--require-smoke", "--require-rebuilds", "2",
                  env=registry_env(promoted))
    assert more.returncode == 5, more.stdout
    assert tagged  # the tag was checked above; verify takes the digest


def test_the_promoted_digest_passes_the_node_policy_on_podman(promoted, tmp_path):
    from support import NODE_FLAGS, PODMAN, podman_node

    stage = promoted.extra["stage"]
    host, user, password = stage.registry
    node = podman_node()
    etc = tmp_path / "containers"
    written = invoke(stage.repo, "policy", "--containers", str(etc), "--key", str(stage.keys / "release.pub"))
    assert written.returncode == 0, written.stderr
    (etc / "registries.conf.d").mkdir()
    (etc / "registries.conf.d" / "50-rehearsal.conf").write_text(
        f'[[registry]]\nlocation = "{host}"\ninsecure = true\n')
    digest = tag_digest(promoted, rehearse.TAG)
    ours, other = f"{stage.image_repo}@{digest}", f"{host}/dsv4-mi300x/unsigned@{stage.base.digest}"
    mounts = [f"{etc / name}:/etc/containers/{name}:ro" for name in
              ("policy.json", "registries.d/bakery.yaml", "bakery-keys", "registries.conf.d/50-rehearsal.conf")]
    script = (f"{PODMAN} pull -q --creds {user}:{password} {ours} >/dev/null 2>&1; echo \"ours $?\"; "
              f"{PODMAN} run --rm -q --network host --cgroups disabled --entrypoint /usr/local/bin/bakery-selfcheck "
              f"{ours} >/dev/null 2>&1; echo \"run $?\"")
    done = subprocess.run(["docker", "run", "--rm", *NODE_FLAGS, *[a for m in mounts for a in ("-v", m)],
                           node, "sh", "-c", script], capture_output=True, text=True, timeout=900)
    assert "ours 0" in done.stdout and "run 0" in done.stdout, done.stdout + done.stderr
    assert other  # the node's refusals of other digests are tests/test_nodes.py's


# -- keyless: each role signs as its own workflow's identity, no key given at all ---------------------------
# Stand-ins, besides the MI300X's: Sigstore is @sigstore/mock's Fulcio and Rekor on loopback (its log
# holds one leaf per entry, its Fulcio does not check the token's signature); the GitHub stand-in gives
# each job that asks the OIDC token GitHub would, naming the workflow the job is defined in, and only to
# a job with `id-token: write`; it learns which job asks from the asking process's own environment,
# which a step could change (GitHub's runtime token cannot be forged).

@pytest.fixture(scope="module")
def keyless(rehearsals):
    return run(rehearsals, "keyless", smoke="stand-in", signing="keyless")


def test_a_keyless_release_runs_every_job_and_each_role_signs_as_its_workflow(keyless):
    assert all(j.result == "success" for j in keyless.jobs.values()), keyless.table()
    assert tag_digest(keyless, rehearse.TAG) == keyless.image.split("@")[1]
    # the three tokens given: one per signing job, each naming its own role's workflow at the tag
    minted = sorted(keyless.extra["github"].minted)
    assert minted == sorted(f"{rehearsal_stage.REPOSITORY}/.github/workflows/{w}@refs/tags/{rehearse.TAG}"
                            for w in ("build-and-sign.yml", "rebuild.yml", "smoke.yml")), minted
    assert "keycheck" not in job_log(keyless, "sign")  # no key was given to check


def test_a_keyless_release_verifies_by_identity_with_invoke_verify_and_cosign3(keyless):
    stage = keyless.extra["stage"]
    ref = f"{stage.image_repo}@{tag_digest(keyless, rehearse.TAG)}"
    done = invoke(stage.repo, "verify", ref, "--require-smoke", "--require-rebuilds", "1", env=registry_env(keyless))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "(read: 1 bundle(s) via the fallback tag" in done.stdout  # keyless writes bundles only, no .sig tag
    assert "a passing MI300X acceptance gate signed by a smoke" in done.stdout
    assert "rebuilt to this digest by 1 of 1 required rebuilder" in done.stdout
    trust = stage.repo / "provenance" / "sigstore-trusted-root.json"
    import base64

    host, user, password = stage.registry
    config = keyless.work / "cosign3-docker"
    config.mkdir(exist_ok=True)
    (config / "config.json").write_text(json.dumps(
        {"auths": {host: {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}}}))

    def cosign3(workflow: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(ROOT / ".tools" / "bin" / "cosign3"), *args, "--trusted-root", str(trust),
                               "--certificate-identity", f"https://github.com/{rehearsal_stage.REPOSITORY}/.github/"
                               f"workflows/{workflow}@refs/tags/{rehearse.TAG}", "--certificate-oidc-issuer",
                               "https://token.actions.githubusercontent.com", "--allow-http-registry", ref],
                              capture_output=True, text=True, timeout=120, env={**os.environ, "DOCKER_CONFIG": str(config)})

    assert cosign3("build-and-sign.yml", "verify").returncode == 0
    # each statement type by its own role's workflow, and not by another's
    for workflow, kind, ok in (("build-and-sign.yml", "slsaprovenance1", True), ("smoke.yml", "slsaprovenance1", False),
                               ("smoke.yml", "https://in-toto.io/attestation/test-result/v0.1", True),
                               ("build-and-sign.yml", "https://in-toto.io/attestation/test-result/v0.1", False)):
        done = cosign3(workflow, "verify-attestation", "--type", kind)
        assert (done.returncode == 0) == ok, (workflow, kind, done.stderr[-500:])
    # what cosign 3's plain `verify` does not tell apart (docs/ops.md says so): any bundle on the
    # digest signed by the identity given passes it, here the smoke workflow's test result
    assert cosign3("smoke.yml", "verify").returncode == 0


# -- failure drills: each stops the release at the right job, nothing promoted ----------------------------

@pytest.mark.parametrize("drill, stops_at, says", [
    ("broken-proof", "build", "overlay 'cpu-kv-transfer-fence': its proof says BROKEN"),
    ("unsigned-kernels", "build", "is signed by 0 of 1 required release key(s)"),
    ("smoke-failed", "smoke", "FAILED"),
    ("rebuild-mismatch", "attest-rebuild", "(other bytes)"),
    ("foreign-revision", "build", "which is not on main: refused"),
    ("dirty-checkout", "build", "has changes (below): refused"),
])
def test_drill_stops_the_release(rehearsals, drill, stops_at, says):
    outcome = run(rehearsals, drill, drill=drill)
    assert_stopped_at(outcome, stops_at)
    assert says in job_log(outcome, stops_at), job_log(outcome, stops_at)[-3000:]


def test_an_unknown_drill_is_one_line_and_exit_2(tmp_path):
    done = subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(ROOT), "rehearse", "--drill", "nope",
                           "--work", str(tmp_path / "w")], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2 and done.stderr.strip().startswith("error: --drill nope: known drills:")
    assert not (tmp_path / "w").exists()


# -- the nightly workflow, as its schedule fires --------------------------------------------------------
# The GitHub API is the stand-in of bakery/github_stand_in.py: it records what gh asked for.

@pytest.fixture(scope="module")
def nightly_carried(rehearsals):
    outcome = rehearse_nightly.nightly(ROOT, rehearsals / "nightly", log=lambda m: None)
    print(f"\nnightly\n{outcome.table()}")
    return outcome


def origin_file(outcome, branch: str, path: str) -> str:
    return rehearsal_stage.git("show", f"{branch}:{path}", cwd=outcome.extra["stage"].origin)


def test_the_nightly_mirrors_both_carries_and_proves_and_proposes_one_pull_request(nightly_carried):
    n = nightly_carried
    assert [n.result(j) for j in ("track", "prune", "bump", "propose")] == ["success"] * 4, n.table()
    assert n.result("porting") != "success"
    # prune applied, with environment prune's token, on the mirror and the (empty) image repository:
    # both nightlies kept, as the pin and the newest, each the ledger's; nothing deleted
    pruned = job_log(n, "prune")
    assert "2 manifests: 2 kept, 0 to delete (deleted 0)" in pruned, pruned[-3000:]
    assert "the pinned base (image/base.yaml)" in pruned and "nightly 1 of the 14 newest" in pruned
    newest = n.extra["tags"]["nightly-b"]
    branch = f"nightly/{newest.split(':')[1][:12]}"
    assert sorted(n.extra["branches"]) == sorted(["main", branch])
    # the branch moves the pin to the mirror's copy of 0.27.0 and records both nightlies
    pin = yaml.safe_load(origin_file(n, branch, "image/base.yaml"))
    assert pin["image"] == f"{n.extra['upstream']}@{newest}" and pin["mirror"] == n.extra["vars"]["NIGHTLY_MIRROR"]
    ledger = yaml.safe_load(origin_file(n, branch, "image/nightlies.yaml"))
    assert {e["digest"] for e in ledger["nightlies"]} == set(n.extra["tags"].values())
    changed = rehearsal_stage.git("diff", "--name-only", "main", branch, cwd=n.extra["stage"].origin).split()
    assert {"image/base.yaml", "image/nightlies.yaml", "overlays/overlays.lock"} <= set(changed)
    assert all(p.startswith(("image/base.yaml", "image/nightlies.yaml", "overlays/")) for p in changed)
    # one pull request, from that branch, its body the bump's report, asked with the job's token
    github = n.extra["github"]
    assert len(github.pulls) == 1, github.pulls
    pull = github.pulls[0]
    assert pull["headRefName"] == branch and pull["baseRefName"] == "main"
    assert pull["title"] == f"nightly: move the pin to {branch} (overlays carried and proven)"
    assert "carried and proven" in pull["body"] and "| cpu-kv-transfer-fence |" in pull["body"]
    assert not re.search(r"(?i)\b(close[sd]?|fix(e[sd])?|resolve[sd]?)\s+#\d", pull["body"])  # no issue closed on merge
    assert not re.search(r"(?<!\\)<[A-Za-z!/]", pull["body"])  # the base's text reaches it escaped: no raw HTML
    password = n.extra["stage"].registry[2]
    assert github.requests and all(r.authorization == f"token {password}" for r in github.requests)
    assert not github.issues


@pytest.fixture(scope="module")
def nightly_porting(rehearsals):
    outcome = rehearse_nightly.nightly(ROOT, rehearsals / "needs-porting", log=lambda m: None, porting=True)
    print(f"\nneeds-porting\n{outcome.table()}")
    return outcome


def test_a_nightly_that_needs_porting_offers_the_ledger_and_opens_one_issue(nightly_porting):
    n = nightly_porting
    assert all(j.result == "success" for j in n.jobs.values()), n.table()
    assert sorted(n.extra["branches"]) == ["main", "nightly/ledger"]
    changed = rehearsal_stage.git("diff", "--name-only", "main", "nightly/ledger", cwd=n.extra["stage"].origin).split()
    assert changed == ["image/nightlies.yaml"]  # the pin and the overlays as they were
    github = n.extra["github"]
    assert [p["title"] for p in github.pulls] == ["nightly: record the nightlies kept in the mirror"]
    assert len(github.issues) == 1, github.issues
    issue = github.issues[0]
    assert issue["title"] == "nightly: overlays need porting" and issue["labelNames"] == ["nightly-porting"]
    assert "sparse-mla-prefill-bh64" in issue["body"] and "porting-kits" in issue["body"]
    assert any(r.path.endswith("/labels") and r.body.get("name") == "nightly-porting" for r in github.requests)
    # it looked for an open porting issue before opening one
    searched = [i for i, r in enumerate(github.requests) if "IssueSearch" in r.body.get("query", "")]
    created = [i for i, r in enumerate(github.requests) if "createIssue" in r.body.get("query", "")]
    assert searched and created and searched[0] < created[0]
