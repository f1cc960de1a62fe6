"""invoke keygen, attest, attach, verify, promote, reproduce, attest-rebuild: signing an image,
proving it is ours, and rebuilding it independently."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InputError, NotFound, NotReproduced, RegistryError
from ..project import Project
from ..trust.policy import signature_formats
from .trust_flags import check_signer, load_policy, role_keys, signer_for

if TYPE_CHECKING:  # the commands import these when they run
    from ..oci.refs import Digest, Reference
    from ..release.reproduce import Plan
    from ..trust.verify import Report


def keygen(out: str, role: str) -> tuple[Path, Path]:
    from ..trust import keys

    return keys.generate(Path(out), role)


def attest(project: Path, image: str, record: str | None, key: str | None, layout: str | None, keyless: bool = False,
           trust_config: str | None = None):
    """(the image, what was written: signature, attestations, kernels, verdicts)."""
    from ..oci import store
    from ..oci.refs import Reference
    from ..trust import attest as attest_mod, record as record_mod

    ref = Reference.parse_pinned(image, "image")
    rec = record_mod.read(Path(record) if record else Project(project).out / "build-record.json")
    where = store.open_store(ref, Path(layout) if layout else None)
    with where.locked():  # a layout's: prune is refused meanwhile
        written = attest_mod.attest(where, ref, rec, signer_for("release", keyless, trust_config, key),
                                    sign_kernels=not layout, formats=signature_formats(project))
    return ref, written


def may_attach(kind: str, role: str, envelope: str) -> None:
    """Only a statement type the role signs is attached: a smoke key cannot put provenance beside
    (or in place of) the release key's."""
    from ..trust import policy

    if policy.SIGNED_BY.get(kind) != role:
        raise InputError(f"envelope {envelope} holds a statement of type {kind}, which the {role} role does not "
                         f"sign: not attached (it would stand beside, or in place of, another role's)")


def attach(project: Path, image: str, envelope: str, key: str | None, role: str, policy: str | None = None):
    """(the image, the statement type, the digest of what is now attached). A DSSE envelope must verify
    with --key; a keyless bundle (`smoke --attest --keyless --envelope`) by the role's identity in the
    policy, offline from its trusted root, and is attached as a bundle only."""
    from ..oci import store
    from ..oci.refs import Reference
    from ..trust import attest as attest_mod, bundle, keys, sign, verify as verify_mod

    ref = Reference.parse_pinned(image, "image")
    try:
        data = Path(envelope).read_bytes()
    except OSError as e:
        raise InputError(f"cannot read --envelope {envelope}: {e.strerror}") from None
    keyless = bundle.is_keyless(data)
    if keyless and key:
        raise InputError(f"--envelope {envelope} is a keyless bundle: the role's identity in the policy vouches for "
                         f"it, not --key: give no --key")
    kind = attest_mod.statement_of(data, ref, f"envelope {envelope}").predicate_type
    may_attach(kind, role, envelope)
    what = f"envelope {envelope} ({kind}, a {role} statement)"
    if keyless:
        verify_mod.keyless_payload(data, role, load_policy(project, policy, role_keys()), what)
        return ref, kind, attest_mod.attach_bundle(store.RegistryStore(ref), ref, kind, data)
    if not key:
        raise InputError(f"--envelope {envelope} is signed by a key: give --key, the {role} role's public key")
    sign.open_envelope(data, keys.load_public(Path(key)), what)
    return ref, kind, attest_mod.attach_envelopes(store.RegistryStore(ref), ref, {kind: data},
                                                  signature_formats(project))


@dataclass(frozen=True)
class Verified:
    """A verification's report about one digest; check() raises unless every check held."""
    ref: Reference
    report: Report

    def check(self) -> None:
        from ..trust import verify as verify_mod

        verify_mod.require(self.report)


def verify(project: Path, image: str, key=None, smoke_key=None, policy=None, layout=None, require_smoke=False,
           skip_blobs=False, rebuilder_key=None, require_rebuilds=0, log=lambda m: None, as_of=None) -> Verified:
    """IMAGE by digest, or by tag (resolved here, and said in the log); as_of: verify's, for an
    earlier release taken as a reference."""
    from ..oci import store
    from ..oci.refs import Digest, Reference
    from ..trust import verify as verify_mod

    ref = Reference.parse(image)
    where = store.open_store(ref, Path(layout) if layout else None)
    if ref.digest is None:
        body = where.manifest(ref.tag or "latest")
        if body is None:
            raise NotFound(f"{image} not found")
        ref = ref.with_digest(Digest.of(body))
        log(f"{image} is {ref.digest}")
    rules = load_policy(project, policy, role_keys(key, smoke_key, rebuilder_key or []))
    return Verified(ref, verify_mod.verify(where, ref, rules, require_smoke, not skip_blobs, int(require_rebuilds),
                                           as_of=as_of))


def promote(project: Path, image: str, tag: str, key=None, smoke_key=None, policy=None, rebuilder_key=None,
            require_rebuilds=0, smoke_run=None) -> str:
    """Tag the digest, only once it verifies with a passing smoke attestation: REPO:TAG -> DIGEST."""
    from ..oci import store
    from ..oci.refs import Reference, check_tag
    from ..trust import verify as verify_mod

    check_tag(tag, "--tag")  # before verify: a tag the registry would refuse fails now, not after every check
    ref = Reference.parse_pinned(image, "image")
    where = store.RegistryStore(ref)
    rules = load_policy(project, policy, role_keys(key, smoke_key, rebuilder_key or []))
    report = verify_mod.verify(where, ref, rules, require_smoke=True, blobs=False, require_rebuilds=int(require_rebuilds),
                               smoke_run=smoke_run)
    verify_mod.require(report)
    body = where.manifest(str(ref.digest))
    if body is None:  # verified a moment ago: deleted since
        raise NotFound(f"{image} not found")
    where.put_manifest(tag, body)
    return f"{ref.name}:{tag} -> {ref.digest}"


@dataclass(frozen=True)
class Reproduced:
    ref: Reference
    plan: Plan
    digest: Digest  # what the rebuild gave
    diffs: list = field(default_factory=list)
    work: Path | None = None
    attested_as: str | None = None  # the rebuilder's keyid, with --attest

    @property
    def matches(self) -> bool:
        return self.digest == self.ref.digest

    def check(self) -> None:
        if not self.matches:
            raise NotReproduced(f"not reproduced: {self.ref.digest} was released, the rebuild of "
                                f"{self.plan.revision[:12]} gives {self.digest} (the rebuild is in {self.work})")


def reproduce(project: Path, image: str, release_key=None, policy=None, toolchain=None, workdir=None, attest=False,
              key=None, outcome=None, log=lambda m: None) -> Reproduced:
    import os
    import shutil
    import tempfile
    from contextlib import ExitStack

    from .. import files
    from ..oci import store
    from ..oci.refs import Reference
    from ..release import reproduce as rep
    from ..trust import attest as attest_mod, provenance

    ref = Reference.parse_pinned(image, "image")
    where = store.open_store(ref, None)
    rules = load_policy(project, policy, role_keys(release_key, None))
    plan = rep.plan(rep.signed_provenance(where, ref, rules))
    with ExitStack() as stack:
        # our own temporary folder is locked while we run: the next run removes one a kill left
        work = Path(workdir) if workdir else \
            stack.enter_context(files.staging_dir(Path(tempfile.gettempdir()) / "bakery-reproduce"))
        stack.enter_context(rep.claimed(work))
        digest = None
        try:
            # the revision's code runs with none of our secrets
            layout = rep.rebuild(plan, work, toolchain, log, named=None if workdir else work.parent)
            digest, manifest = rep.rebuilt_digest(layout)
            diffs = [] if digest == ref.digest else \
                rep.differences(where, where.manifest(str(ref.digest)), store.LayoutStore(layout), manifest)
        finally:
            if not workdir and digest in (None, ref.digest):
                shutil.rmtree(work, ignore_errors=True)
        if not workdir and digest != ref.digest:  # other bytes: kept to be looked at, under a lasting name
            kept = Path(tempfile.mkdtemp(prefix="bakery-reproduce-"))
            os.replace(work, kept)
            work = kept
    if outcome:
        rep.write_outcome(Path(outcome), ref, manifest, diffs)
    attested_as = None
    if attest:  # the key is read only now, after the revision's code has finished
        signer = signer_for("rebuilder", key=key)  # keyless is attest-rebuild's, in a job that runs no build
        attest_mod.attach(where, ref, {provenance.REBUILD_PREDICATE: rep.statement(ref, plan, digest, diffs)}, signer,
                          signature_formats(project))
        attested_as = signer.keyid
    return Reproduced(ref, plan, digest, diffs, work, attested_as)


def attest_rebuild(project: Path, image: str, outcome: str, release_key=None, policy=None, key=None, keyless=False,
                   trust_config=None):
    """(the image, the digest the rebuild gave): signed as this rebuilder (a key, or --keyless this job's
    workflow identity), recomputed from the manifest."""
    from ..oci import store
    from ..oci.refs import Digest, Reference
    from ..release import reproduce as rep
    from ..trust import attest as attest_mod, provenance

    check_signer(keyless, key)
    ref = Reference.parse_pinned(image, "image")
    where = store.open_store(ref, None)
    rules = load_policy(project, policy, role_keys(release_key, None))
    plan = rep.plan(rep.signed_provenance(where, ref, rules))  # from the signed provenance, not the file
    manifest, diffs = rep.read_outcome(Path(outcome), ref)
    digest = Digest.of(manifest)  # the file's claim of a match counts for nothing: the bytes decide
    attest_mod.attach(where, ref, {provenance.REBUILD_PREDICATE: rep.statement(ref, plan, digest, diffs)},
                      signer_for("rebuilder", keyless, trust_config, key), signature_formats(project))
    return ref, digest


def preflight(project: Path, repository: str | None, api: str | None, shown=print) -> list:
    """Every gap between what a release needs and this checkout and its GitHub repository (REPO as
    owner/name; default: the origin remote's), as release.github.Gap lines; [] when it is ready.
    Where GitHub cannot be asked (no token, no network, a token refused), the checkout's own gaps
    are shown first, each a `missing:` line, then the error about the API is raised."""
    import sys

    from ..errors import BakeryError
    from ..release import github

    settings, gaps = github.checkout_gaps(project)
    try:
        return gaps + github.github_gaps(github.GitHub(api=api), repository or origin_repository(project), settings)
    except BakeryError:
        for gap in gaps:  # seen without the API: named, not hidden behind its one line
            shown(f"missing: {gap}")
        sys.stdout.flush()  # before that line (on stderr), where both go to one file
        raise


def origin_repository(project: Path) -> str:
    """owner/name of the checkout's origin on GitHub."""
    import re
    import subprocess

    url = subprocess.run(["git", "-C", str(project), "remote", "get-url", "origin"], capture_output=True,
                         text=True).stdout.strip()
    found = re.fullmatch(r"(?:https://github\.com/|git@github\.com:)([\w.-]+/[\w.-]+?)(?:\.git)?/?", url)
    if not found:
        raise InputError(f"the origin remote ({url or 'none'}) is not a GitHub repository: give --repository OWNER/NAME")
    return found.group(1)


def await_runner(job: str, minutes: float, log) -> str:
    """In a release run: wait until the job named `job` has started on a runner (see
    release.github.await_runner); this run and repository from the runner's environment."""
    import os

    from ..release import github

    run_id, repository = os.environ.get("GITHUB_RUN_ID"), os.environ.get("GITHUB_REPOSITORY")
    if not run_id or not repository:
        raise InputError("await-runner watches a job of the workflow run it is part of: GITHUB_RUN_ID and "
                         "GITHUB_REPOSITORY are not set (it runs in a workflow)")
    poll = float(os.environ.get("BAKERY_POLL_SECONDS", "30"))
    return github.await_runner(github.GitHub(), repository, run_id, job, float(minutes), log=log, poll=poll)


@dataclass(frozen=True)
class Pruned:
    decisions: list
    reclaimable: int  # bytes, once the registry collects garbage (a layout's: collected by prune)
    deleted: int | None  # None: a dry run
    layout: bool = False


def prune(project: Path, repository: str, key=None, policy=None, retention=None, ledger=None, apply=False,
          via: str = "auto", log=lambda m: None) -> Pruned:
    """The retention policy on REGISTRY/REPO (and on the ledger's mirror), or on an OCI layout
    (oci:DIR, as skopeo names one): what is kept and why, what is deleted; deleted only with apply.
    via: how deletes reach a repository, "registry" (its DELETE), "github" (GitHub's package-versions
    API, as GHCR needs) or "auto" (github for ghcr.io)."""
    from ..base.spec import load_spec
    from ..oci.refs import Reference
    from ..oci.registry import Registry
    from ..oci.store import RegistryStore
    from ..release import prune as prune_mod
    from ..release.track.ledger import load_ledger

    place = Project(project)
    kept = prune_mod.Retention.load(Path(retention) if retention else place.retention)
    if repository.startswith("oci:"):
        return _prune_layout(project, Path(repository.removeprefix("oci:")), kept,
                             load_policy(project, policy, role_keys(key, None)), apply, log)
    repo = Reference.parse(repository)
    if repo.tag or repo.digest:
        raise InputError(f"prune takes a repository, REGISTRY/REPO, not an image: {repository}")
    if via not in VIA:
        raise InputError(f"--via is one of {', '.join(VIA)}, not {via!r}")
    ledger_path = Path(ledger) if ledger else place.ledger
    nightlies = load_ledger(ledger_path) if ledger_path.exists() else None
    mirror = Reference.parse(nightlies.mirror) if nightlies else None
    if mirror and mirror.repository == repo.repository:
        raise InputError(f"the ledger's mirror {nightlies.mirror if nightlies else ''} is the image repository: "
                         f"keep the nightlies in a repository of their own")
    registries = {repo.repository: Registry(repo.registry)}
    if mirror:
        registries[mirror.repository] = Registry(mirror.registry)
    rules = load_policy(project, policy, role_keys(key, None))
    log(f"listing {repository}" + (f" and the mirror {mirror.name}" if mirror else ""))
    image = prune_mod.inventory(registries[repo.repository], repo.repository)
    mirrored = prune_mod.inventory(registries[mirror.repository], mirror.repository, mirror=True) if mirror else []

    def store_of(digest):
        ref = Reference(repo.registry, repo.repository, None, digest)
        return RegistryStore(ref), ref

    pinned = load_spec(place.base_yaml).image.pin if place.base_yaml.exists() else None
    # each v* git tag's commit: a release built from a tag off HEAD's line (a hotfix) keeps its candidate
    tagged = _release_tags(project, prune_mod.TAG_GRACE_DAYS)
    roots = prune_mod.roots(image, mirrored, mirror.repository if mirror else None, kept,
                            prune_mod.verified_provenance(store_of, rules), _commit_time(project, log), nightlies,
                            pinned, tagged)
    decisions = prune_mod.decide(image + mirrored, roots)
    deleted = None
    if apply:  # a tag added since the listing (a promote) would go with its digest: nothing, then
        listed = [(repo.repository, image), *([(mirror.repository, mirrored)] if mirror else [])]
        for repository, stored in listed:
            prune_mod.unchanged(registries[repository], repository, stored)
        deleters = {repository: _deleter(registries[repository], repository, stored, via)
                    for repository, stored in listed}
        deleted = prune_mod.apply(deleters, decisions, log)
    return Pruned(decisions, prune_mod.reclaimable(decisions), deleted)


def _prune_layout(project: Path, path: Path, kept, rules, apply: bool, log) -> Pruned:
    """The policy on an OCI layout (what `invoke mirror --image --layout` fills): its named entries
    judged as a repository's tags, then every blob no kept manifest reaches collected, as a registry's
    garbage collection would. index.json loses the deleted entries in one write, so a kill leaves
    either the old plan or the new one, and a rerun collects what a kill left behind."""
    from ..oci.refs import Reference
    from ..oci.store import LayoutStore
    from ..release import prune as prune_mod

    store = LayoutStore(path)
    with store.locked(wait=False):
        planned = store.index_digest()
        image = prune_mod.layout_inventory(store)

        def store_of(digest):
            return store, Reference("oci-layout", str(path), None, digest)

        roots = prune_mod.roots(image, [], None, kept, prune_mod.verified_provenance(store_of, rules),
                                _commit_time(project, log), None, None, _release_tags(project, prune_mod.TAG_GRACE_DAYS))
        decisions = prune_mod.decide(image, roots)
        gone = {d.stored.digest for d in decisions if not d.keep}
        garbage = store.unreachable({d.stored.digest for d in decisions if d.keep} | store.names()[1])
        if not apply:
            return Pruned(decisions, sum(garbage.values()), None, layout=True)
        store.drop(gone, planned)  # one atomic write (its crash points: a kill before it or after it)
        log(f"{path}/index.json: {len(gone)} manifests no longer named")
        store.remove_blobs(sorted(garbage), log)
        return Pruned(decisions, sum(garbage.values()), len(gone), layout=True)


def _commit_time(project: Path, log):
    """commit_time(sha) -> its commit's epoch seconds; None (ranked oldest) for a commit outside
    this checkout's own history: one pushed to some branch, dated in the future, must not crowd
    the released line's candidates out."""
    import subprocess

    def commit_time(sha: str) -> int | None:
        merged = subprocess.run(["git", "-C", str(project), "merge-base", "--is-ancestor", sha, "HEAD"],
                                capture_output=True, text=True)
        shown = subprocess.run(["git", "-C", str(project), "log", "-1", "--format=%ct", sha, "--"],
                               capture_output=True, text=True)
        if merged.returncode != 0 or shown.returncode != 0 or not shown.stdout.strip().isdigit():
            log(f"candidate-{sha}: not a commit of this checkout's history (HEAD's ancestors): ranked oldest")
            return None
        return int(shown.stdout.strip())

    return commit_time


def _release_tags(project: Path, days: int) -> dict[str, str]:
    """{commit: its v* git tag} for the tags made in the last `days` (a release still running; one
    older has been promoted or given up), each peeled to the commit it names, however many tag
    objects deep. A git that fails is an error: without the tags a hotfix's candidate would go."""
    import subprocess
    import time

    git = ["git", "-C", str(project)]
    listed = subprocess.run([*git, "for-each-ref", "--format=%(creatordate:unix) %(refname)", "refs/tags/v*"],
                            capture_output=True, text=True)
    if listed.returncode != 0:
        raise InputError(f"git cannot list {project}'s tags ({listed.stderr.strip()[:200]}): prune needs them to "
                         f"keep a running release's candidate")
    recent = [ref for when, ref in (line.split(" ", 1) for line in listed.stdout.splitlines() if " " in line)
              if when.isdigit() and time.time() - int(when) < days * 86400]
    peeled = subprocess.run([*git, "cat-file", "--batch-check=%(objectname) %(objecttype)"],
                            input="".join(f"{ref}^{{commit}}\n" for ref in recent), capture_output=True, text=True)
    if peeled.returncode != 0:
        raise InputError(f"git cannot read {project}'s tags ({peeled.stderr.strip()[:200]})")
    return {line.split()[0]: ref.removeprefix("refs/tags/")
            for ref, line in zip(recent, peeled.stdout.splitlines(), strict=True) if line.endswith(" commit")}


VIA = ("auto", "registry", "github")
GHCR = "ghcr.io"


def _deleter(registry, repository: str, stored, via: str):
    """What deletes in REPOSITORY: the registry itself, or GitHub's package versions (GHCR), which
    must list what the registry listed, tag for tag, before anything is deleted."""
    from ..release import github, prune as prune_mod

    if via == "registry" or (via == "auto" and registry.name != GHCR):
        return registry
    versions = github.PackageVersions(github.GitHub(), registry.name, repository)
    problems = prune_mod.disagreements(stored, {d: tags for d, (_, tags) in versions.versions().items()})
    if problems:
        raise RegistryError(f"GitHub's package versions and {registry.name}/{repository}'s listing disagree "
                            f"({len(problems)}; first: {problems[0]}): nothing deleted")
    return versions
