"""Tasks: parse arguments, call one bakery function, turn bakery errors into one line and an exit code."""

from __future__ import annotations

import sys
from pathlib import Path

from invoke import Exit, task

PROJECT = Path(__file__).resolve().parent
# invoke turns writing .pyc off for the whole run (for this file's sake), so bakery's modules were
# compiled from source on every command; keep the interpreter's own setting (-B, PYTHONDONTWRITEBYTECODE)
sys.dont_write_bytecode = sys.dont_write_bytecode and bool(sys.flags.dont_write_bytecode)

from bakery.cli import flags  # noqa: E402  (after the line above: bakery's .pyc are written)
from bakery.cli.edge import reports_errors_for, say as _log  # noqa: E402  (after it too, as flags)

reports_errors = reports_errors_for(PROJECT)  # only there do errors become exit codes


def bakery_task(help=None, collect_cycles=True, **options):
    """An invoke task whose bakery errors become one line and an exit code."""
    return lambda body: task(help=help, **options)(reports_errors(body, collect_cycles))


def _verified(verified) -> None:
    """Print a verification's checks, then fail unless all held (verify, and deploy before it runs)."""
    from bakery.cli import render

    print(render.verified(verified))
    verified.check()
    print(f"verified {verified.ref}")


def _shown(logged, printed) -> None:
    """Progress lines to stderr, then the result to stdout (its last line is what scripts read)."""
    for line in logged:
        _log(line)
    print(printed)


def _bumped(bumped) -> None:
    """Print a bump's outcome and exit with its code (0 nothing new, 10 bumped, 11 needs porting)."""
    from bakery.cli import render

    print(render.bumped(bumped))
    raise Exit(code=bumped.exit_code)


@bakery_task(flags.BUILD, collect_cycles=False)
def build(c, base=None, push=None, layout=None, out=None, lock=None, toolchain=None, key=None, policy=None,
          recompile=False, reprove=False):
    """Build the derived image; print its REPO@sha256:DIGEST as the last line."""
    from bakery.bake.options import Options
    from bakery.cli import build as cmd

    ref, record = cmd.build(Options.from_flags(PROJECT, base=base, push=push, layout=layout, out=out, lock=lock,
                                               toolchain=toolchain, key=key, policy=policy, recompile=recompile,
                                               reprove=reprove), log=_log)
    _shown([f"build record: {record}"], ref)


@bakery_task(flags.MIRROR)
def mirror(c, to=None, base=None, image=None, layout=None):
    """Copy the pinned base (or a signed image, with its signatures) by digest; print the mirrored REF@DIGEST."""
    from bakery.cli import build as cmd

    print(cmd.mirror(PROJECT, to, base, image, layout, log=_log))


@bakery_task(flags.FIXTURE)
def fixture(c, registry=None, vllm="0.26.0"):
    """Build the fixture base (Debian + vLLM + AITER sources) with Docker, push it, print REF@DIGEST."""
    from bakery.cli import build as cmd

    print(cmd.fixture(PROJECT, registry, vllm, log=_log))


@bakery_task()
def stack(c):
    """Start the local Docker engine and registry (127.0.0.1:5000) if they are not running."""
    from bakery.dev import stack as stack_mod

    print(stack_mod.up())


@bakery_task()
def demo(c):
    """Stack up, fixture base, build + push, docker pull + run the result; print its digest."""
    from bakery.cli import build as cmd

    print(cmd.demo(PROJECT, log=_log))


@task(help=flags.TEST)
def test(c, k=None, x=False, rehearsal=False, fast=False, sweep=False):
    """Check the code with ruff and mypy, then run the test suite against the real engine and registry."""
    from bakery.cli import dev as cmd

    if not k and (failed := cmd.check(PROJECT)):  # -k picks tests to run: the checks are for the whole suite
        raise Exit(failed, code=1)
    raise Exit(code=cmd.run_suite(PROJECT, k, x, rehearsal, fast, sweep))


@bakery_task(flags.LOCK)
def lock(c, base=None, lock=None):
    """Apply every required overlay to the base exactly, prove the result, and write overlays.lock (base and result sha256)."""
    from bakery.bake.options import Options
    from bakery.cli import build as cmd, render

    document, path = cmd.lock(Options.from_flags(PROJECT, base=base, lock=lock), log=_log)
    _shown(render.lock_entries(document), path)


@bakery_task(flags.PROVE)
def prove(c, base=None, device="cpu", kit=None):
    """Run each overlay's behavioural proof on the base's stock target and on the overlaid one."""
    from bakery.cli import proofs as cmd, render

    proven = cmd.prove(PROJECT, base, device, kit, log=_log)
    print(render.proven(proven))
    proven.check()


@bakery_task(flags.REBASE)
def rebase(c, base, lock=None, out=None):
    """Nightly bump: carry each overlay to a new base and prove it there; re-lock only if all are proven."""
    from bakery.cli import proofs as cmd, render

    rebased = cmd.rebase(PROJECT, base, lock, out, log=_log)
    print(render.rebased(rebased))
    rebased.check()
    print(render.rebased_next(rebased))


@bakery_task(flags.PRUNE)
def prune(c, repository, key=None, policy=None, retention=None, ledger=None, apply=False, via="auto"):
    """Keep every release and what it needs, the newest candidates and nightlies; delete the rest bakery wrote."""
    from bakery.cli import release as cmd, render

    print(render.lines(render.pruned(cmd.prune(PROJECT, repository, key, policy, retention, ledger, apply, via,
                                               log=_log))))


@bakery_task(flags.TRACK)
def track(c, from_=None, mirror=None, tags="*", ledger=None, no_bump=False, report=None, list_=False):
    """Keep every upstream nightly (mirror by digest, record in image/nightlies.yaml), then `invoke bump`.
    Exit 0: nothing new; 10: bumped and proven (base.yaml, overlays/, ledger changed); 11: needs porting."""
    from bakery.cli import render, track as cmd

    if list_:
        print(render.lines(cmd.listing(PROJECT, ledger) or ["(the ledger is empty)"]))
        return
    tracked = cmd.track(PROJECT, from_, mirror, tags, ledger, log=_log)
    print(render.tracked(tracked))
    if not no_bump:
        _bumped(cmd.bump(PROJECT, ledger=str(tracked.ledger), report=report, log=_log))


@bakery_task(flags.BUMP)
def bump(c, ledger=None, nightly=None, report=None, out=None):
    """The nightly bump: rebase onto the newest kept nightly not yet tried, with proofs, read from the mirror.
    Exit 0: nothing new; 10: carried and proven (base.yaml, overlays/ and the ledger changed); 11: needs porting."""
    from bakery.cli import track as cmd

    _bumped(cmd.bump(PROJECT, ledger, nightly, report, out, log=_log))


@bakery_task(flags.KEYGEN)
def keygen(c, out=".", role="release"):
    """Make an ECDSA P-256 key pair for one role; the private key is encrypted with BAKERY_KEY_PASSWORD."""
    from bakery.cli import release as cmd

    key, pub = cmd.keygen(out, role)
    _shown([f"private key (encrypted): {key}"], pub)


@bakery_task(flags.KEYCHECK)
def keycheck(c, role, public):
    """Check that the role's secret key (its variable, as a signing job holds it) is the one PUBLIC names."""
    from bakery.trust import keys

    print(f"ok: the {role} key in {keys.ENV_OF_ROLE.get(role, '?')} is {keys.matches(role, Path(public))[:16]}, the key "
          f"{public} names")


@bakery_task(flags.CHECK_TAG)
def check_tag(c, tag):
    """Check that TAG is one promote can write (the registry's grammar): the build job refuses it before any approval."""
    from bakery.oci.refs import check_tag as check

    print(f"ok: {check(tag)} is a tag promote can write")


@bakery_task(flags.PREFLIGHT)
def preflight(c, repository=None, api=None):
    """Before the first tag: one line for each thing a release still lacks, and what to do; exit 0 only when none."""
    from bakery.cli import release as cmd
    from bakery.release.github import NOT_READY

    gaps = cmd.preflight(PROJECT, repository, api)
    print("\n".join([f"missing: {gap}" for gap in gaps] or ["ready: nothing a release needs is missing"]))
    if gaps:
        raise Exit(f"{len(gaps)} thing(s) a release needs are missing (above)", code=NOT_READY)


@bakery_task(flags.AWAIT_RUNNER)
def await_runner(c, job, minutes="30"):
    """In a release run: fail, and cancel the run, when no runner takes JOB within MINUTES of its being queued."""
    from bakery.cli import release as cmd
    from bakery.errors import BakeryError
    from bakery.untrusted import safe

    try:
        cmd.await_runner(job, minutes, log=_log)
    except BakeryError as e:  # an annotation on the run's page too, besides the error line
        print(f"::error title=No runner took {safe(job, limit=60)}::{safe(e, limit=600)}")
        raise


@bakery_task(flags.ATTEST)
def attest(c, image, record=None, key=None, layout=None, keyless=False, trust_config=None):
    """Sign IMAGE@DIGEST and attach its SBOM (SPDX 2.3) and SLSA provenance; idempotent."""
    from bakery.cli import release as cmd, render

    ref, written = cmd.attest(PROJECT, image, record, key, layout, keyless, trust_config)
    _shown(render.attested(ref, written), ref)


@bakery_task(flags.ATTACH)
def attach(c, image, envelope, key=None, role="smoke", policy=None):
    """Attach a signed attestation (made on another machine) to IMAGE@DIGEST, after checking its signature."""
    from bakery.cli import release as cmd, render

    ref, kind, digest = cmd.attach(PROJECT, image, envelope, key, role, policy)
    _shown([render.attached(ref, kind, digest)], ref)


@bakery_task(flags.POLICY, iterable=["key", "mirror", "accept", "smoke_key", "rebuilder_key"])
def policy(c, containers=None, k8s=None, policy=None, key=None, smoke_key=None, rebuilder_key=None, mirror=None,
           accept=None):
    """Write the node policy (--containers: podman/CRI-O pull our repositories only as the release keys signed
    them) or the admission policies (--k8s: policy-controller and Kyverno also ask for the smoke result and rebuild)."""
    from bakery.cli import deploy as cmd, render

    written = cmd.policy(PROJECT, containers, policy, key, mirror, accept, k8s, smoke_key, rebuilder_key)
    _shown(render.node_policy(written), written.path)


@bakery_task(flags.DEPLOY, iterable=["allow", "rebuilder_key"])
def deploy(c, image, proxy_image, hostname, allow=None, email=None, internal_tls=False, compose=None, snapshot=None,
           compose_file=None, k8s=None, replicas=1, key=None, smoke_key=None, policy=None, rebuilder_key=None):
    """Run one verified digest behind the seed's proxy: --compose (this host) or --k8s (a fleet manifest)."""
    from bakery.cli import deploy as cmd, release

    plan = cmd.plan(PROJECT, image, proxy_image, hostname, allow, email, internal_tls, compose, snapshot,
                    compose_file, k8s, replicas)  # bad input: before anything is asked of a registry
    _verified(release.verify(PROJECT, plan.image, key=key, smoke_key=smoke_key, policy=policy, require_smoke=True,
                             rebuilder_key=rebuilder_key, log=_log))  # the policy's require_rebuilds holds here too
    print(cmd.deploy(PROJECT, plan))


@bakery_task(flags.VERIFY, iterable=["rebuilder_key"])
def verify(c, image, key=None, smoke_key=None, policy=None, layout=None, require_smoke=False, skip_blobs=False,
           rebuilder_key=None, require_rebuilds=0):
    """For ops: prove IMAGE is ours, what is in it and how it was made; exit 0 only if all checks hold."""
    from bakery.cli import release as cmd

    _verified(cmd.verify(PROJECT, image, key, smoke_key, policy, layout, require_smoke, skip_blobs, rebuilder_key,
                         require_rebuilds, log=_log))


@bakery_task(flags.REPRODUCE)
def reproduce(c, image, release_key=None, policy=None, toolchain=None, workdir=None, attest=False, key=None,
              outcome=None):
    """Rebuild IMAGE from its signed provenance here, from nothing; exit 0 only if the digest is the same."""
    from bakery.cli import release as cmd, render

    reproduced = cmd.reproduce(PROJECT, image, release_key, policy, toolchain, workdir, attest, key, outcome, log=_log)
    _shown([line for line in [render.reproduced_attestation(reproduced)] if line], render.reproduced(reproduced))
    reproduced.check()


@bakery_task(flags.ATTEST_REBUILD)
def attest_rebuild(c, image, outcome, release_key=None, policy=None, key=None, keyless=False, trust_config=None):
    """Sign a rebuild's outcome as a rebuilder where no build runs; the match is recomputed from the manifest."""
    from bakery.cli import release as cmd, render

    print(render.rebuild_attested(*cmd.attest_rebuild(PROJECT, image, outcome, release_key, policy, key, keyless,
                                                      trust_config)))


@bakery_task(flags.SMOKE, iterable=["endpoint", "reference_endpoint"])
def smoke(c, image, model_dir=None, port=8000, report=None, reference=None, record=None, endpoint=None,
          reference_endpoint=None, approvals=None, bench_client=None, tokenizer=None, bfcl=None, attest=False, key=None,
          envelope=None, release_key=None, smoke_key=None, not_promoted=None, keyless=False, trust_config=None):
    """MI300X acceptance gate: A/B against a reference on both paths, needles, tool calls, speed; signed JSON report."""
    from bakery.cli import render, smoke as cmd

    smoked = cmd.smoke(PROJECT, image, model_dir, port, report, reference, record, endpoint, reference_endpoint,
                       approvals, bench_client, tokenizer, bfcl, attest, key, envelope, release_key, smoke_key,
                       not_promoted, keyless, trust_config, log=_log)
    _shown(render.smoked_log(smoked), render.smoked(smoked))
    smoked.check()


@bakery_task(flags.PROMOTE, iterable=["rebuilder_key"])
def promote(c, image, tag, key=None, smoke_key=None, policy=None, rebuilder_key=None, require_rebuilds=0,
            smoke_run=None):
    """Tag a digest for release, only if it verifies with a passing MI300X smoke attestation."""
    from bakery.cli import release as cmd

    print(cmd.promote(PROJECT, image, tag, key, smoke_key, policy, rebuilder_key, require_rebuilds, smoke_run))


@bakery_task(flags.DISK)
def disk(c, base=None, toolchain=None, unless_cached_in=None, key=None, policy=None):
    """Check that BAKERY_CACHE's disk holds the toolchain's files a compile needs; print needed and free GiB."""
    from bakery.cli import build as cmd, render

    print(render.disk(cmd.disk(PROJECT, base, toolchain, unless_cached_in, key, policy, log=_log)))


@bakery_task(flags.TOOLCHAIN)
def toolchain(c, registry=None):
    """Build the stand-in HIP toolchain image (Debian clang-19, ROCm device libs, CPU torch), push it; print REF@DIGEST."""
    from bakery.cli import build as cmd

    print(cmd.toolchain(PROJECT, registry, log=_log))


@bakery_task(flags.COMPILE)
def compile(c, toolchain=None, verify=False, registry=None, key=None, policy=None):
    """Compile hip/ for gfx942 in the toolchain image, check the device code, print each output's sha256."""
    from bakery.cli import build as cmd, render

    _shown(*render.compiled(cmd.compile(PROJECT, toolchain, verify, registry, key, policy, log=_log)))


@bakery_task(flags.REHEARSE)
def rehearse(c, workflow="release", drill=None, smoke_stand_in=False, work=None, keyless=False):
    """Run a workflow end to end on this machine under act, against the local registry; print the job table."""
    from bakery.cli import dev as cmd, render

    rehearsed = cmd.rehearse(PROJECT, workflow, drill, smoke_stand_in, work, keyless, log=_log)
    print(render.rehearsed(rehearsed))
    rehearsed.check()
    _log(f"rehearsed as expected; act's log: {rehearsed.outcome.log}")
