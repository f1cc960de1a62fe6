"""invoke smoke: the MI300X acceptance gate, its report, and its signed result."""

from __future__ import annotations

import re
import shlex
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .. import untrusted
from ..errors import EnvironmentProblem, InputError, SmokeFailure
from ..project import Project
from ..release.smoke_report import Reference as GateReference, SmokeReport
from ..trust.policy import signature_formats
from .trust_flags import check_signer, signer_for


@dataclass(frozen=True)
class Smoked:
    ref: object
    result: SmokeReport
    report: Path  # where it was written
    attested: str | None = None  # "envelope FILE" or "attached"
    summary: Path | None = None  # the run's summary page it wrote to ($GITHUB_STEP_SUMMARY)

    def check(self) -> None:
        """Anything but PASSED fails the gate (exit 7), naming the first failed check."""
        if self.result.result != "PASSED":
            failed = self.result.failed
            raise SmokeFailure(f"smoke failed: {', '.join(c.name for c in failed)}"
                               + (f" ({failed[0].detail})" if failed else ""))


def _base_of(image: str) -> str | None:
    """The base digest an image of ours names in its manifest (None where it names none)."""
    import json

    from ..oci import store
    from ..oci.refs import Reference

    ref = Reference.parse(image)
    body = store.RegistryStore(ref).manifest(str(ref.digest) if ref.digest else ref.tag or "latest")
    if body is None:
        raise InputError(f"{image} not found")
    base = json.loads(body).get("annotations", {}).get("org.opencontainers.image.base.digest")
    return base if isinstance(base, str) else None


def _reference(project: Path, candidate, reference: str | None, record: str | None, launching: bool, log,
               release_key: str | None = None, smoke_key: str | None = None, not_promoted: str | None = None):
    """(what the candidate is compared with, whether it has the candidate's base, the build record
    for a seed-style stack). A promoted reference is verified as verify does, smoke result required."""
    from ..trust import record as record_mod

    if reference is None:
        if launching:
            raise InputError("say what the candidate is compared with: --reference last-promoted (the newest "
                             "release tag git has merged into HEAD, else the seed-style stack), REPO:TAG, "
                             "or seed-stack (the first release: the base with our files mounted, from the build "
                             "record)")
        return GateReference("endpoint", None, None), True, None
    tag = None
    if reference == "last-promoted":
        reference, tag = _last_promoted(project, candidate, log, release_tags(not_promoted or ""))
    if reference == "seed-stack":
        rec = record_mod.read(Path(record) if record else Project(project).out / "build-record.json")
        if rec.manifest.digest != candidate.digest:
            raise InputError(f"the build record is of {rec.manifest.digest}, not the candidate {candidate.digest}: "
                             f"pass --record of the build that made it")
        base = str(rec.base.pinned.with_digest(rec.base.manifest_digest))
        if launching and _base_of(str(candidate)) != str(rec.base.manifest_digest):
            # the record is a file handed between jobs: the base it names must be the one the
            # candidate's own manifest names, or the "reference" could be any image
            raise InputError(f"the build record's base {rec.base.manifest_digest} is not the base the candidate's "
                             f"manifest names: pass --record of the build that made {candidate.digest}")
        return GateReference("seed-stack", base, str(rec.base.manifest_digest)), True, rec
    from ..oci.refs import Reference
    from . import release

    named = Reference.parse(reference)
    if tag is None and named.digest is None:
        if not named.tag or release_order(named.tag) is None:
            raise InputError(f"--reference {untrusted.safe(reference, limit=120)}: name a release by its release "
                             f"tag (REPO:v1.2.3, held to git's tag of that name) or its digest (REPO@sha256:...)")
        tag = named.tag  # a release named by its tag by hand: held to git's tag of that name, as last-promoted's is
    verified = release.verify(project, reference, key=release_key, smoke_key=smoke_key, require_smoke=True, log=log,
                              as_of=_committed_at(project, tag))
    from ..trust import verify as verify_mod

    verify_mod.require(verified.report)
    promoted = str(verified.ref)
    theirs, mine = _base_of(promoted), _base_of(str(candidate))
    return GateReference("promoted", promoted, theirs), theirs is not None and theirs == mine, None


def release_order(tag: str) -> tuple | None:
    """A promoted release's tag (v1.2.3, v1.2.3-rc1, v2026.12) as it sorts among releases: by its
    numbers, a pre-release (a suffix) before the release itself; None for any other tag."""
    # no leading zeros: v01.10.0 would be v1.10.0 spelled otherwise, a second tag of the same number
    m = re.fullmatch(r"v((?:0|[1-9][0-9]*)(?:\.(?:0|[1-9][0-9]*))*)(?:-([0-9A-Za-z.-]+))?", tag)
    if not m:
        return None
    return tuple(int(n) for n in m.group(1).split(".")), m.group(2) is None, m.group(2) or ""


def _git(project: Path, *args: str):
    """git in the checkout the gate runs from (ours: its history and tags name the releases); bytes
    out, as a committed file's sha256 needs them."""
    import subprocess

    return subprocess.run(["git", "-C", str(project), *args], capture_output=True)


def _committed_at(project: Path, tag: str | None):
    """For verify's as_of: the policy with the base (image/base.yaml) and smoke spec
    (provenance/smoke.yaml) committed at the revision an earlier release was built from, which must
    be in this checkout's history (HEAD or one of its ancestors: a release of this line) and,
    where the reference came by its release tag, the commit that git tag names (a registry tag moved
    onto another release is refused)."""
    import dataclasses
    import hashlib

    from ..base.spec import load_spec
    from ..trust.policy import SMOKE_SPEC

    def git(*args: str):
        return _git(project, *args)

    def as_of(policy, revision):
        if not isinstance(revision, str) or not re.fullmatch(r"[0-9a-f]{40}", revision):
            raise InputError(f"the reference's provenance names revision {str(revision)[:60]!r}, not a commit")
        ancestor = git("merge-base", "--is-ancestor", revision, "HEAD").returncode
        if ancestor == 1:
            raise InputError(f"the reference was built from {revision[:12]}, which is not in this checkout's "
                             f"history: not an earlier release of this line")
        if ancestor != 0:
            raise InputError(f"the reference was built from {revision[:12]}, which this checkout does not have "
                             f"(a shallow clone? check out with fetch-depth: 0)")
        if tag is not None:
            tagged = git("rev-parse", "--verify", "--quiet", f"refs/tags/{tag}^{{commit}}").stdout.decode().strip()
            if tagged != revision:
                raise InputError(f"the registry's {tag} was built from {revision[:12]}, but this checkout's git tag "
                                 f"{tag} is " + (f"{tagged[:12]}" if tagged else "absent")
                                 + ": the registry tag was moved, or the git tags were not fetched")
        files = {}
        for path in ("image/base.yaml", SMOKE_SPEC):
            shown = git("show", f"{revision}:{path}")
            if shown.returncode != 0:
                raise InputError(f"the reference's revision {revision[:12]} has no {path}")
            files[path] = shown.stdout
        with tempfile.TemporaryDirectory() as folder:
            (Path(folder) / "base.yaml").write_bytes(files["image/base.yaml"])
            base = str(load_spec(Path(folder) / "base.yaml").image)
        return dataclasses.replace(policy, base=base, smoke_spec=hashlib.sha256(files[SMOKE_SPEC]).hexdigest())
    return as_of


def release_tags(text: str) -> frozenset[str]:
    """--not-promoted: release tags, by spaces or commas, each as a release tag is spelled."""
    tags = frozenset(t for t in re.split(r"[\s,]+", text) if t)
    wrong = sorted(t for t in tags if release_order(t) is None)
    if wrong:
        raise InputError(f"--not-promoted {untrusted.safe(wrong[0], limit=60)!r} is not a release tag (v1.2.3, "
                         f"v1.2.3-rc1)")
    return tags


def _in_order(tag: str, tags: list[str], commit: dict[str, str], git) -> None:
    """Release numbers follow history: no release of a lower number on a commit after `tag`'s (a
    v9.0.0 tagged on an old release's commit would else be every later gate's reference)."""
    for lower in tags:
        if (release_order(lower) or ()) < (release_order(tag) or ()) and commit[lower] != commit[tag] and \
                git("merge-base", "--is-ancestor", commit[tag], commit[lower], check=False) == 0:
            raise InputError(f"git's release tags are out of order: {tag} is on {commit[tag][:12]}, before "
                             f"{lower}'s {commit[lower][:12]} in history; which release is the last cannot be told: "
                             f"name the reference (--reference REPO:TAG)")


def _last_promoted(project: Path, candidate, log, not_promoted: frozenset[str] = frozenset()) -> tuple[str, str | None]:
    """The last release before the candidate, as (REPO@DIGEST, its tag): the newest release tag in
    git (`v1.2.3` by its numbers; the tags the ruleset protects) merged into HEAD and not at HEAD (the
    candidate's own), resolved once in the candidate's repository (the tag may move meanwhile).
    Chosen from git, not from the registry's listing: anyone who may push could else hide a release
    by putting the candidate under its tag. A git release tag with no registry tag (its release never
    promoted, or the tag deleted) is refused, as is one whose registry tag is the candidate, unless
    `not_promoted` lists it (a repository admin's word that its release failed): then it is passed
    over, said in the log.
    Seed-stack where git has no earlier release tag (the first release). It is then verified as any
    reference is, as of its own revision (_committed_at)."""
    from ..errors import NotFound
    from ..oci.registry import Registry

    def git(*args: str, check: bool = True):
        done = _git(project, *args)
        if not check:
            return done.returncode
        if done.returncode != 0:
            raise InputError(f"cannot read the release tags of {project}: git {args[0]}: "
                             f"{untrusted.safe(done.stderr.decode(errors='replace').strip(), limit=200)}")
        return done.stdout.decode(errors="replace").split()

    head = git("rev-parse", "HEAD")[0]
    tags = [t for t in git("tag", "--merged", "HEAD", "--list", "v*") if release_order(t) is not None]
    commit = {t: git("rev-parse", f"refs/tags/{t}^{{commit}}")[0] for t in tags}
    registry = Registry(candidate.registry)
    for tag in sorted(tags, key=lambda t: release_order(t) or (), reverse=True):
        if commit[tag] == head:
            continue  # the candidate's own tag
        _in_order(tag, tags, commit, git)
        if tag in not_promoted:
            log(f"git's {tag} passed over: --not-promoted says its release was never promoted")
            continue
        ref = candidate.with_tag(tag)
        try:
            _, _, digest = registry.get_manifest(ref)
        except NotFound:
            # never promoted (its release failed), or deleted: which, the registry cannot say, and
            # passing over it would let whoever may delete tags pick an older reference
            raise InputError(f"git's release tag {tag} has no tag in {candidate.registry}/{candidate.repository}: "
                             f"its release was never promoted, or the tag was deleted; if it was never promoted, "
                             f"say so with --not-promoted {tag} (in the release workflow, the repository variable "
                             f"BAKERY_NOT_PROMOTED), else put the tag back") from None
        if digest == candidate.digest:
            raise InputError(f"the registry's {tag}, an earlier release in git, is the candidate {candidate.digest} "
                             f"itself: the tag was moved; point it back at its release, or name the reference "
                             f"(--reference)")
        log(f"the reference: {ref} ({digest}), the last promoted release")
        return str(ref.with_digest(digest)), tag
    log("no earlier release tag in git before HEAD: the reference is the seed-style stack (the first release)")
    return "seed-stack", None


def _bench(client_image: str, model_dir: str | None, bench_client: str | None, tokenizer: str | None, spec,
           work: Path):
    """How `vllm bench serve` runs: by default the client of client_image (the reference's: vLLM's own,
    not the candidate's, which would measure itself), by docker run, the snapshot mounted for its
    tokenizer, no capability, its container named and labelled to be removed whatever happens; or the
    command given."""
    from ..release.gate import BenchClient

    results = work / "bench"
    results.mkdir()
    if bench_client:
        if not tokenizer:
            raise InputError("--bench-client needs --tokenizer DIR (the tokenizer that client loads)")
        return BenchClient(tuple(shlex.split(bench_client)), tokenizer, results, str(results))
    if not model_dir:
        raise InputError("the speed stage runs vLLM's own `vllm bench serve`, which reads the model's "
                         "tokenizer: pass --model-dir SNAPSHOT (or --bench-client CMD --tokenizer DIR)")
    # host network: the server listens on the host's loopback (or is an endpoint elsewhere)
    return BenchClient(("docker", "run", "--rm", "--name", "{name}", "--label", "bakery.smoke=1", "--cap-drop", "ALL",
                        "--network", "host", "-v", f"{Path(model_dir).resolve()}:{spec.model_mount}:ro", "-v",
                        f"{results}:/bench", "--entrypoint", "vllm", client_image, "bench", "serve"),
                       spec.model_mount, results, "/bench")


def image_config(client, image: str) -> dict:
    """The image's config as this host's engine has it, pulled by digest first where it has it not
    (containers.create does not pull)."""
    import docker

    try:
        return client.images.get(image).attrs["Config"] or {}
    except docker.errors.ImageNotFound:
        client.images.pull(image)
        return client.images.get(image).attrs["Config"] or {}


def _launches(spec, candidate: str, reference: GateReference, rec, model_dir: str, port: int, work: Path) -> dict:
    """docker run settings of each server the gate starts: (side, path) -> Launch."""
    import docker

    from ..release import seed_stack, smoke as smoke_mod

    client = docker.from_env()
    snapshot = Path(model_dir)

    def command(image: str) -> list[str]:
        return list(image_config(client, image).get("Cmd") or [])

    config = image_config(client, candidate)  # pulled by digest if this host has it not
    staged: dict[str, str] = {}
    if reference.kind == "seed-stack":
        holder = client.containers.create(candidate, entrypoint=["/bin/true"])
        try:
            staged = seed_stack.stage(lambda p: seed_stack.bounded(holder.get_archive(p)[0]), rec, work)
        finally:
            holder.remove(force=True)
    out = {}
    for path in spec.paths:
        base = smoke_mod.launch_options(candidate, spec, snapshot, port)
        out[("candidate", path)] = smoke_mod.Launch({**base, "command": smoke_mod.path_command(command(candidate),
                                                                                                  path)})
        if reference.kind == "seed-stack":
            assert reference.image is not None
            # the candidate's own command and environment: the record is a file handed between jobs
            out[("reference", path)] = smoke_mod.Launch(seed_stack.launch(reference.image, config.get("Env") or [],
                                                                          staged, {**base, "command": smoke_mod.path_command(
                                                                              command(candidate), path)}))
        else:
            assert reference.image is not None
            out[("reference", path)] = smoke_mod.Launch({**smoke_mod.launch_options(reference.image, spec, snapshot,
                                                                                     port),
                                                         "command": smoke_mod.path_command(command(reference.image),
                                                                                           path)})
    return out


def smoke(project: Path, image: str, model_dir: str | None = None, port=8000, report=None, reference=None,
          record=None, endpoint=(), reference_endpoint=(), approvals=None, bench_client=None, tokenizer=None,
          bfcl=None, attest=False, key=None, envelope=None, release_key=None, smoke_key=None, not_promoted=None,
          keyless=False, trust_config=None, log=lambda m: None) -> Smoked:
    import hashlib
    import json
    import os

    from ..oci import store
    from ..oci.layer import write_blob
    from ..oci.refs import Reference
    from ..release import ab, bfcl as bfcl_mod, smoke as smoke_mod, smoke_report, smoke_spec, step_summary
    from ..trust import sign, smoke_ledger

    ref = Reference.parse_pinned(image, "image")
    check_signer(keyless, key, attest)
    spec_path = Project(project).smoke_spec
    spec = smoke_spec.load_spec(spec_path)
    mine = smoke_mod.parse_endpoints(endpoint or (), spec.paths, "--endpoint")
    theirs = smoke_mod.parse_endpoints(reference_endpoint or (), spec.paths, "--reference-endpoint")
    launching = not mine or not theirs
    if launching:
        reason = smoke_mod.mi300x_present()
        if reason:
            raise EnvironmentProblem(reason + " (or run the gate against servers started elsewhere: "
                                              "--endpoint PATH=URL and --reference-endpoint PATH=URL)")
        if not model_dir:
            raise InputError("--model-dir SNAPSHOT is needed to launch the servers")
        if model_dir and Path(model_dir).name != spec.revision:
            raise InputError(f"model snapshot {model_dir} is not revision {spec.revision}: pass "
                             f".../snapshots/{spec.revision}")
    approval_file = Path(approvals) if approvals else Project(project).root / "provenance" / "smoke-approvals.yaml"
    approved = ab.load_approvals(approval_file) if approvals or approval_file.exists() else None
    gate_reference, same_base, rec = _reference(project, ref, reference, record, launching, log, release_key,
                                                smoke_key, not_promoted)
    with tempfile.TemporaryDirectory(prefix="bakery-smoke-") as tmp:
        work = Path(tmp)
        bench = _bench(gate_reference.image or str(ref), model_dir, bench_client, tokenizer, spec, work)
        # made for this run, hash-pinned: a venv kept on a persistent runner could be changed between runs
        harness = bfcl_mod.Harness(bfcl or bfcl_mod.ensure(Project(project).root, log, work / "bfcl"))
        launches = _launches(spec, str(ref), gate_reference, rec, str(model_dir), int(port), work) if launching else {}
        servers = {**launches, **{("candidate", p): e for p, e in mine.items()},
                   **{("reference", p): e for p, e in theirs.items()}}
        log(f"the gate: {len(spec.paths)} paths x (reference, candidate), budget {spec.budget_total_s // 60} minutes; "
            f"reference: {gate_reference.kind}" + (f" {gate_reference.image}" if gate_reference.image else ""))
        result = smoke_mod.run(str(ref), spec, servers, gate_reference, same_base, approved, bench, harness,
                               log=log)
    smoke_ledger.remember(str(ref.digest), hashlib.sha256(spec_path.read_bytes()).hexdigest(), result.result,
                          result.finished, result.run)  # a later verify here refuses an older PASSED
    out = Path(report) if report else Project(project).out / "smoke-report.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result.to_json(), indent=2, sort_keys=True))
    log(f"report: {out}")
    page = os.environ.get("GITHUB_STEP_SUMMARY")
    if page:
        with open(page, "a", encoding="utf-8") as f:
            f.write(step_summary.smoke(result.to_json()))
    attested = None
    if attest:  # the key is decrypted once the servers are gone, not for the hours they run
        # keyless: the token is asked for now, not hours ago (GitHub's expire in minutes)
        signer = signer_for("smoke", keyless, trust_config, key)
        statement = smoke_report.statement(ref, result.to_json(), spec_path.read_bytes())
        if envelope:
            signed = signer.bundle(statement) if keyless else sign.envelope(signer, statement)
            write_blob(Path(envelope), signed)
            attested = f"envelope {envelope}"
        else:
            smoke_report.attach_report(store.RegistryStore(ref), ref, result.to_json(), spec_path.read_bytes(), signer,
                                       signature_formats(project))
            attested = "attached"
    return Smoked(ref, result, out, attested, Path(page) if page else None)
