"""Tasks: parse arguments, call one bakery function, turn bakery errors into one line and an exit code."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import traceback
from pathlib import Path

from invoke import Exit, task

PROJECT = Path(__file__).resolve().parent
# invoke turns writing .pyc off for the whole run (for this file's sake), so bakery's modules were
# compiled from source on every command; keep the interpreter's own setting (-B, PYTHONDONTWRITEBYTECODE)
sys.dont_write_bytecode = sys.dont_write_bytecode and sys.flags.dont_write_bytecode
FIXTURE_SPEC = PROJECT / "tests" / "fixture" / "fixture.yaml"


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _role_keys(release: str | None, smoke: str | None) -> dict:
    return {"release": [Path(release)] if release else [], "smoke": [Path(smoke)] if smoke else []}


def _load_policy(policy: str | None, keys: dict):
    """The verification policy (default: provenance/policy.yaml) with keys given on the command line."""
    from bakery.trust import provenance

    return provenance.load_policy(Path(policy) if policy else PROJECT / "provenance" / "policy.yaml", PROJECT, keys)


def reports_errors(fn):
    """Only here do errors become exit codes: one line on stderr, no traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from bakery.errors import BakeryError

        if any(v in ("--help", "-h") for v in list(args[1:]) + list(kwargs.values())):
            # `invoke TASK --help`: invoke hands a flag after a task with a positional argument to
            # that argument; show the task's help instead of running it with "--help" as its value
            import subprocess

            subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(PROJECT), "--help",
                            fn.__name__.replace("_", "-")])
            raise Exit(code=0)
        try:
            return fn(*args, **kwargs)
        except BakeryError as e:  # it may quote the base's text: shown inert (no escape sequence hides it)
            from bakery.untrusted import safe

            raise Exit(f"error: {safe(e, limit=8000, lines=True)}", code=e.exit_code) from None
        except KeyboardInterrupt:
            raise Exit("interrupted; nothing was tagged", code=130) from None
        except Exit:
            raise
        except Exception as e:  # a library's error, or a bug of ours: still one line
            from bakery.errors import foreign

            mapped = foreign(e)
            if mapped is not None:
                from bakery.untrusted import safe

                raise Exit(f"error: {safe(mapped, limit=8000, lines=True)}", code=mapped.exit_code) from None
            if os.environ.get("BAKERY_DEBUG"):  # BAKERY_DEBUG=1 shows the traceback
                raise
            where = traceback.extract_tb(e.__traceback__)[-1]
            raise Exit(f"error: internal error {type(e).__name__}: {str(e)[:300]} (at {Path(where.filename).name}:"
                       f"{where.lineno}); please report it with the command you ran, or rerun with BAKERY_DEBUG=1",
                       code=1) from None

    return wrapper


@task(help={"base": "base image REF@sha256:DIGEST, overriding image/base.yaml",
            "push": "push to REGISTRY/REPO[:TAG]",
            "layout": "also write an OCI image layout directory (air-gapped hand-off)",
            "out": "directory for blobs and build-record.json (default: out/)",
            "lock": "overlays lock to verify against (default: overlays/overlays.lock)",
            "toolchain": "image to compile hip/ in (default: BAKERY_TOOLCHAIN, else the base itself)",
            "key": "a release public key PEM: a kernel artifact or proof verdict in the push target is used only "
                   "if release keys (this and the policy's) signed it",
            "policy": "policy naming the release keys (default: provenance/policy.yaml)",
            "recompile": "compile hip/ here, never taking the push target's kernel artifact",
            "reprove": "run every overlay proof here, whatever this machine's cache or the push target holds"})
@reports_errors
def build(c, base=None, push=None, layout=None, out=None, lock=None, toolchain=None, key=None, policy=None,
          recompile=False, reprove=False):
    """Build the derived image; print its REPO@sha256:DIGEST as the last line."""
    from bakery.build.pipeline import Options, build as run

    ref, rec = run(Options(PROJECT, base, push, Path(layout) if layout else None,
                           Path(out) if out else None, Path(lock) if lock else None, toolchain,
                           (Path(key),) if key else (), Path(policy) if policy else None, recompile,
                           reprove=reprove), log=_log)
    _log(f"build record: {(Path(out) if out else PROJECT / 'out') / 'build-record.json'}")
    print(ref)


@task(help={"to": "destination REGISTRY/REPO[:TAG]",
            "base": "source REF@sha256:DIGEST (default: image/base.yaml)",
            "image": "copy this signed image of ours (REF@sha256:DIGEST) with its .sig and .att instead of the base",
            "layout": "with --image: write into this OCI layout directory instead of a registry"})
@reports_errors
def mirror(c, to=None, base=None, image=None, layout=None):
    """Copy the pinned base (or a signed image, with its signatures) by digest; print the mirrored REF@DIGEST."""
    from bakery.base import spec as base_mod
    from bakery.oci import mirror as mirror_mod, store
    from bakery.errors import InputError
    from bakery.oci.refs import Reference

    if image:
        ref = Reference.parse_pinned(image, "--image")
        if layout:
            dest, where = store.LayoutStore(Path(layout), create=True), ref
        elif to:
            target = Reference.parse(to)
            dest, where = store.RegistryStore(target), Reference(target.registry, target.repository, None, ref.digest)
        else:
            raise InputError("--image needs --to REGISTRY/REPO or --layout DIR")
        _log(f"mirroring {ref} with its signature and attestations to {layout or where.name}")
        tag = "latest" if layout else Reference.parse(to).tag
        mirror_mod.copy_signed(store.RegistryStore(ref), ref, dest, tag, log=_log)
        print(f"{layout}:{ref.digest}" if layout else where)
        return
    if not to:
        raise InputError("give --to REGISTRY/REPO (where to keep the pinned base)")
    spec = base_mod.load_spec(PROJECT / "image" / "base.yaml", base)
    dest = Reference.parse(to)
    _log(f"mirroring {spec.image} to {dest.name}")
    print(mirror_mod.copy(spec.image, dest, log=_log))


@task(help={"registry": "registry host:port to push the fixture to (default: the local stack's)",
            "vllm": "vLLM release to build it from: 0.26.0 (default) or 0.27.0, the nightly's two neighbours"})
@reports_errors
def fixture(c, registry=None, vllm="0.26.0"):
    """Build the fixture base (Debian + vLLM + AITER sources) with Docker, push it, print REF@DIGEST."""
    from bakery.dev import fixture as fixture_mod, stack
    from bakery.errors import InputError

    spec = FIXTURE_SPEC if vllm == "0.26.0" else FIXTURE_SPEC.with_name(f"fixture-vllm-{vllm}.yaml")
    if not spec.is_file():
        raise InputError(f"--vllm {vllm}: no fixture spec for it; known: 0.26.0, "
                         + ", ".join(p.stem.removeprefix("fixture-vllm-") for p in spec.parent.glob("fixture-vllm-*.yaml")))
    registry = registry or stack.up()
    print(fixture_mod.build(spec, registry, log=_log))


@task
@reports_errors
def stack(c):
    """Start the local Docker engine and registry (127.0.0.1:5000) if they are not running."""
    from bakery.dev import stack as stack_mod

    print(stack_mod.up())


@task
@reports_errors
def demo(c):
    """Stack up, fixture base, build + push, docker pull + run the result; print its digest."""
    import docker

    from bakery.dev import fixture as fixture_mod, stack as stack_mod
    from bakery.build.pipeline import Options, build as run, lock as lock_overlays

    registry = stack_mod.up()
    base = fixture_mod.build(FIXTURE_SPEC, registry, log=_log)
    _log(f"fixture base: {base}")
    # the fixture's digest is this machine's own: lock the overlays against it, beside the build
    demo_lock = PROJECT / "out" / "demo-overlays.lock"
    lock_overlays(Options(PROJECT, str(base), lock=demo_lock), log=_log)
    # the fixture has no ROCm: compile hip/ in the stand-in toolchain
    tools = fixture_mod.toolchain(PROJECT / "hip" / "toolchain", FIXTURE_SPEC, log=_log)
    ref, _ = run(Options(PROJECT, str(base), f"{registry}/demo/dsv4-flash-mi300x:latest", lock=demo_lock,
                         toolchain=tools), log=_log)
    _log(f"docker pull {ref}")
    client = docker.from_env()
    client.images.pull(str(ref))
    out = client.containers.run(str(ref), entrypoint=["/usr/local/bin/bakery-selfcheck"], remove=True,
                                stdout=True, stderr=True)
    _log(out.decode().strip())
    print(ref)


@task(help={"k": "only tests matching this pytest -k expression", "x": "stop at the first failure",
            "rehearsal": "also run the workflow rehearsals under act (tests/test_rehearse.py: minutes each; CI runs them)"})
def test(c, k=None, x=False, rehearsal=False):
    """Run the test suite against the real engine and registry (started if need be)."""
    args = [sys.executable, "-m", "pytest", "-ra", "tests"]
    if not rehearsal:
        args += ["-m", "not rehearsal"]
    if k:
        args += ["-k", k]
    if x:
        args.append("-x")
    os.chdir(PROJECT)
    result = c.run(" ".join(f"'{a}'" for a in args), pty=False, warn=True)
    raise Exit(code=result.exited)


@task(help={"base": "base image REF@sha256:DIGEST, overriding image/base.yaml",
            "lock": "lock file to write (default: overlays/overlays.lock)"})
@reports_errors
def lock(c, base=None, lock=None):
    """Apply every required overlay to the base exactly, prove the result, and write overlays.lock (base and result sha256)."""
    from bakery.build.pipeline import Options, lock as run

    document = run(Options(PROJECT, base, lock=Path(lock) if lock else None), log=_log)
    for entry in document["overlays"]:
        _log(f"  {entry['id']:<45} base {(entry['base_sha256'] or 'new file')[:12]}  "
             f"result {entry['result_sha256'][:12]}")
    print(Path(lock) if lock else PROJECT / "overlays" / "overlays.lock")


@task(help={"base": "base image REF@sha256:DIGEST, overriding image/base.yaml",
            "device": "cpu (default: Triton's interpreter) or cuda (the proofs' Triton kernels compiled for the GPU "
                      "torch sees, CUDA or ROCm)",
            "kit": "a porting kit (out/rebase/OVERLAY-ID, from `invoke rebase`): prove its edited ours.py instead"})
@reports_errors
def prove(c, base=None, device="cpu", kit=None):
    """Run each overlay's behavioural proof on the base's stock target and on the overlaid one."""
    import dataclasses

    from bakery.build.pipeline import Options
    from bakery.proofs.runner import DEVICES, FIXED
    from bakery.release.rebase import prove_base, prove_kit

    if kit:
        verdict = prove_kit(PROJECT, Path(kit))
        print(f"ours.py: {verdict.verdict} ({verdict.reason})")
        if verdict.verdict != FIXED:
            raise Exit("error: ours.py is not proven FIXED: edit it and run prove.sh again", code=5)
        return
    if device not in DEVICES:
        raise Exit(f"error: --device {device}: say cpu or cuda", code=2)
    rows = prove_base(Options(PROJECT, base, device=device), log=_log)
    width = max(len(r.overlay.id) for r in rows)
    checks = max(len(r.overlay.proof.script.name) if r.overlay.proof.script else 8 for r in rows) + len(device) + 3
    print(f"{'overlay':<{width}}  {'stock':<13} {'overlaid':<13} {'check':<{checks}} {'seconds':>7}  detail")
    for r in rows:
        over = r.overlaid.verdict if r.overlaid else "(audit)"
        ran_on = r.stock.measured.get("ran_on", device)  # the fence's model and SwiGLU's torch run on the CPU
        check = f"{r.overlay.proof.script.name} ({ran_on})" if r.overlay.proof.script else "hardware"
        if r.overlay.proof.script is None:  # marked: only the hardware can judge it
            r = dataclasses.replace(r, stock=dataclasses.replace(r.stock, verdict="hardware-only"))
            over = "hardware-only"
        seconds = r.stock.seconds + (r.overlaid.seconds if r.overlaid else 0)
        detail = r.overlay.proof.hardware if r.overlay.proof.script is None else \
            (r.overlaid.reason if r.overlaid else r.stock.reason)
        print(f"{r.overlay.id:<{width}}  {r.stock.verdict:<13} {over:<13} {check:<{checks}} {seconds:>7.1f}  {detail}")
    bad = [r.overlay.id for r in rows if not r.ok]
    if bad:
        raise Exit(f"error: not proven (a required overlay must be BROKEN on stock and FIXED overlaid): "
                   f"{', '.join(bad)}", code=5)


@task(help={"base": "the new base REF@sha256:DIGEST (the nightly you are moving to)",
            "lock": "lock file to write (default: overlays/overlays.lock)",
            "out": "where overlays that need porting by hand are written (default: out/, as out/rebase/ID/)"})
@reports_errors
def rebase(c, base, lock=None, out=None):
    """Nightly bump: carry each overlay to a new base and prove it there; re-lock only if all are proven."""
    from bakery.build.pipeline import Options
    from bakery.release.rebase import rebase as run

    rows, ok = run(Options(PROJECT, base, lock=Path(lock) if lock else None, out=Path(out) if out else None),
                   log=_log)
    width = max(len(r.overlay.id) for r in rows)
    print(f"{'overlay':<{width}}  {'status':<34} {'required':<8}  detail")
    for r in rows:
        print(f"{r.overlay.id:<{width}}  {r.status:<34} {'yes' if r.overlay.baked else 'no':<8}  {r.detail}")
    if not ok:
        raise Exit("error: not every required overlay is carried and proven on the new base; lock, patches and "
                   "overlays.yaml left unchanged. Port the ones marked `needs porting` (see their folder) and run "
                   "again", code=2)
    print(f"lock written for {base}: now set image: in image/base.yaml to it and commit overlays/ and the lock")


LEDGER = PROJECT / "image" / "nightlies.yaml"


@task(help={"from_": "the upstream REGISTRY/REPO whose nightlies to keep, e.g. docker.io/vllm/vllm-openai-rocm",
            "mirror": "your REGISTRY/REPO they are copied to, by digest",
            "tags": "only upstream tags matching this glob (default: *)",
            "ledger": "the ledger (default: image/nightlies.yaml)",
            "no_bump": "only mirror and record; try nothing (the workflow's credentialed job)",
            "report": "where bump writes its Markdown report (default: out/track/report.md)",
            "list_": "print the ledger, newest first, with what each nightly would need; change nothing"})
@reports_errors
def track(c, from_=None, mirror=None, tags="*", ledger=None, no_bump=False, report=None, list_=False):
    """Keep every upstream nightly (mirror by digest, record in image/nightlies.yaml), then `invoke bump`.
    Exit 0: nothing new; 10: bumped and proven (base.yaml, overlays/, ledger changed); 11: needs porting."""
    from bakery.base import spec as base_mod
    from bakery.release import track as run

    ledger_path = Path(ledger) if ledger else LEDGER
    if list_:
        pinned = base_mod.load_spec(PROJECT / "image" / "base.yaml").image.digest
        for line in run.listing(run.load_ledger(ledger_path), pinned) or ["(the ledger is empty)"]:
            print(line)
        return
    if not (from_ and mirror):
        raise Exit("error: name the upstream and your mirror: invoke track --from REGISTRY/REPO --mirror "
                   "REGISTRY/REPO (or --list to print the ledger)", code=2)
    platform = base_mod.load_spec(PROJECT / "image" / "base.yaml").platform
    kept, changed = run.track(PROJECT, from_, mirror, tags, ledger_path, platform, log=_log)
    print(f"{ledger_path}: {len(kept.nightlies)} nightlies kept" + ("" if changed else " (unchanged)"))
    if not no_bump:
        bump(c, ledger=str(ledger_path), report=report)


@task(help={"ledger": "the ledger (default: image/nightlies.yaml)",
            "nightly": "try this kept nightly (sha256:DIGEST, as `invoke track --list` shows) instead of the newest "
                       "untried: bisect, or re-try after porting",
            "report": "where to write the Markdown report (default: out/track/report.md)",
            "out": "where porting kits go (default: out/, as out/rebase/ID/)"})
@reports_errors
def bump(c, ledger=None, nightly=None, report=None, out=None):
    """The nightly bump: rebase onto the newest kept nightly not yet tried, with proofs, read from the mirror.
    Exit 0: nothing new; 10: carried and proven (base.yaml, overlays/ and the ledger changed); 11: needs porting."""
    from bakery.release import track as run

    out_dir = Path(out) if out else PROJECT / "out"
    result = run.bump(PROJECT, Path(ledger) if ledger else LEDGER, out_dir, nightly, log=_log)
    if result is None:
        print("nothing new: every kept nightly newer than the pin has been tried")
        return
    report_path = Path(report) if report else PROJECT / "out" / "track" / "report.md"
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(run.report(result, out_dir / "rebase"))
    n = result.nightly
    if result.carried:
        print(f"bumped to {n.label()} {n.digest} (vLLM {n.vllm}): every overlay carried and proven; review and "
              f"commit image/base.yaml, overlays/ and {LEDGER.relative_to(PROJECT)}; report: {report_path}")
    else:
        print(f"{n.label()} {n.digest} (vLLM {n.vllm}) needs porting; pin, lock and patches unchanged; kits in "
              f"{out_dir / 'rebase'}; report: {report_path}")
    raise Exit(code=result.code)


@task(help={"out": "directory for ROLE.key (encrypted) and ROLE.pub (default: .)",
            "role": "release (signs the image, its SBOM and provenance; default) or smoke (signs the MI300X result)"})
@reports_errors
def keygen(c, out=".", role="release"):
    """Make an ECDSA P-256 key pair for one role; the private key is encrypted with BAKERY_KEY_PASSWORD."""
    from bakery.trust import keys

    key, pub = keys.generate(Path(out), role)
    _log(f"private key (encrypted): {key}")
    print(pub)


@task(help={"image": "the image REGISTRY/REPO@sha256:DIGEST to sign",
            "record": "its build record (default: out/build-record.json)",
            "key": "encrypted private key file (default: BAKERY_SIGNING_KEY from the environment)",
            "layout": "attest inside this OCI layout directory instead of a registry"})
@reports_errors
def attest(c, image, record=None, key=None, layout=None):
    """Sign IMAGE@DIGEST and attach its SBOM (SPDX 2.3) and SLSA provenance; idempotent."""
    from bakery.trust import attest as attest_mod, keys, sign
    from bakery.build import record as record_mod
    from bakery.oci import store
    from bakery.oci.refs import Reference

    ref = Reference.parse_pinned(image, "image")
    rec = record_mod.read(Path(record) if record else PROJECT / "out" / "build-record.json")
    signer = sign.Signer(keys.load_private(Path(key) if key else None))
    written = attest_mod.attest(store.open_store(ref, Path(layout) if layout else None), ref, rec, signer,
                                sign_kernels=not layout)
    _log(f"signature   {store.signature_tag(ref.digest, 'sig')} -> {written['signature']}")
    _log(f"attestations {store.signature_tag(ref.digest, 'att')} -> {written['attestations']}")
    if written.get("kernels"):
        _log(f"kernel artifact {written['kernels']['artifact']} signed -> {written['kernels']['signature']}")
    for v in written.get("verdicts") or []:
        _log(f"proof verdict {v['artifact']} signed -> {v['signature']}")
    print(ref)


@task(help={"image": "the image REGISTRY/REPO@sha256:DIGEST the statement is about",
            "envelope": "a signed DSSE envelope (e.g. from `invoke smoke --attest --envelope FILE`)",
            "key": "the public key of ROLE (e.g. smoke.pub): the envelope must verify with it",
            "role": "the role the envelope comes from (default smoke): only statement types that role signs are "
                    "attached"})
@reports_errors
def attach(c, image, envelope, key, role="smoke"):
    """Attach a signed attestation (made on another machine) to IMAGE@DIGEST, after checking its signature."""
    from bakery.trust import attest as attest_mod, keys, provenance, sign
    from bakery.oci import store
    from bakery.errors import InputError
    from bakery.oci.refs import Reference

    ref = Reference.parse_pinned(image, "image")
    try:
        data = Path(envelope).read_bytes()
    except OSError as e:
        raise InputError(f"cannot read --envelope {envelope}: {e.strerror}") from None
    kind, _ = attest_mod.statement_of(data, ref, f"envelope {envelope}")
    if provenance.SIGNED_BY.get(kind) != role:
        raise InputError(f"envelope {envelope} holds a statement of type {kind}, which the {role} role does not "
                         f"sign: not attached (it would stand beside, or in place of, another role's)")
    sign.open_envelope(data, keys.load_public(Path(key)), f"envelope {envelope} ({kind}, a {role} statement)")
    digest = attest_mod.attach_envelopes(store.RegistryStore(ref), ref, {kind: data})
    _log(f"{kind} attached: {store.signature_tag(ref.digest, 'att')} -> {digest}")
    print(ref)


@task(help={"containers": "an empty or new directory: policy.json, registries.d/ and the release keys are written "
                          "there, to install as /etc/containers on a podman or CRI-O node",
            "policy": "verification policy (default: provenance/policy.yaml)",
            "key": "a release public key PEM, added to the policy's roles.release keys (repeatable)",
            "mirror": "MIRROR_HOST/REPO=ORIGINAL_HOST/REPO: a mirror of an allowed repository that nodes pull from, "
                      "signatures copied with it (repeatable)",
            "accept": "HOST/NAMESPACE/NAME of another image the nodes may pull unsigned (the pause image, the proxy, "
                      "a device plugin; repeatable): everything else not ours is refused"},
      iterable=["key", "mirror", "accept"])
@reports_errors
def policy(c, containers, policy=None, key=None, mirror=None, accept=None):
    """Write the node policy that makes podman/CRI-O pull our repositories only when the release keys signed them."""
    from bakery.release import deploy as nodes

    rules = _load_policy(policy, {"release": [Path(k) for k in key or []]})
    files = nodes.containers_policy(rules, nodes.parse_mirrors(mirror or []), accept=tuple(accept or ()))
    nodes.write_tree(Path(containers), files)
    for name in sorted(files):
        _log(f"  {name}")
    unchecked = nodes.unenforced(rules)
    if unchecked:
        _log(f"note: nodes check the release signature only, not {unchecked}: run `invoke verify` (or `invoke "
             f"deploy`, which does) on a digest before nodes may pull it")
    print(Path(containers) / "policy.json")


@task(help={"image": "the release REGISTRY/REPO@sha256:DIGEST to run",
            "proxy_image": "the Caddy image, by digest (CADDY@sha256:DIGEST)",
            "hostname": "the proxy's HTTPS name (name or name:port)",
            "allow": "a source CIDR the proxy admits (repeatable; everyone else gets 403)",
            "email": "ACME contact address (not needed with --internal-tls)",
            "internal_tls": "certificate from Caddy's own CA (a private name, no ACME)",
            "compose": "write DIR/.env and DIR/Caddyfile, then docker compose up -d (IMAGE verified first, smoke "
                       "required, as for --k8s)",
            "snapshot": "the model snapshot directory on the host or nodes, mounted read-only",
            "compose_file": "with --compose: the compose file (default: image/compose.yaml)",
            "k8s": "write Kubernetes manifests for --replicas single-MI300X nodes into DIR (new or empty)",
            "replicas": "with --k8s: how many MI300X nodes (one GPU each)",
            "key": "release public key for verify", "smoke_key": "smoke public key for verify",
            "rebuilder_key": "a rebuilder public key for verify (repeatable): the policy asks for its rebuilds",
            "policy": "verification policy (default: provenance/policy.yaml)"},
      iterable=["allow", "rebuilder_key"])
@reports_errors
def deploy(c, image, proxy_image, hostname, allow=None, email=None, internal_tls=False, compose=None, snapshot=None,
           compose_file=None, k8s=None, replicas=1, key=None, smoke_key=None, policy=None, rebuilder_key=None):
    """Run one verified digest behind the seed's proxy: --compose (this host) or --k8s (a fleet manifest)."""
    import yaml

    from bakery.release import deploy as nodes
    from bakery.oci.refs import Reference

    if bool(compose) == bool(k8s):
        raise Exit("error: say where: --compose DIR (this host) or --k8s DIR (manifests), one of them", code=2)
    if not snapshot:
        raise Exit("error: --snapshot DIR: the model snapshot's path on the nodes (mounted read-only)", code=2)
    image_ref = Reference.parse_pinned(image, "--image")  # one digest runs, never what a tag points to
    proxy_ref = Reference.parse_pinned(proxy_image, "--proxy-image")
    spec = yaml.safe_load(Path(compose_file or PROJECT / "image" / "compose.yaml").read_text())
    caddy = nodes.caddyfile(hostname, email, allow or [], "inference:8000", internal_tls)  # bad input: before anything
    verify(c, str(image_ref), key=key, smoke_key=smoke_key, policy=policy, require_smoke=True,
           rebuilder_key=rebuilder_key)  # exits on failure; the policy's require_rebuilds holds here too
    if k8s:
        files = nodes.k8s_manifests(str(image_ref), str(proxy_ref), int(replicas), spec, snapshot, hostname, email,
                                    allow or [], internal_tls)
        nodes.write_tree(Path(k8s), files)
        print(Path(k8s))
        return
    out = Path(compose).resolve()
    settings = {"BAKERY_IMAGE": str(image_ref), "BAKERY_PROXY_IMAGE": str(proxy_ref), "MODEL_SNAPSHOT": snapshot,
                "BAKERY_DEPLOY_DIR": str(out)}
    nodes.write_tree(out, {".env": "".join(f"{k}={v}\n" for k, v in settings.items()).encode(), "Caddyfile": caddy})
    # the verified values, also in the environment: compose lets an exported variable beat the env file
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_")} | settings
    up = subprocess.run([*_compose_command(), "--project-directory", str(out), "--env-file", str(out / ".env"),
                         "-f", str(Path(compose_file or PROJECT / "image" / "compose.yaml").resolve()), "up", "-d"],
                        env=env)
    if up.returncode != 0:
        raise Exit(f"error: docker compose up failed (exit {up.returncode}); {out} holds what it was given", code=1)
    print(out)


def _compose_command() -> list[str]:
    """Docker's compose plugin, else a docker-compose binary (this repository's .tools/ one last)."""
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return [shutil.which("docker-compose") or str(PROJECT / ".tools" / "bin" / "docker-compose")]


@task(help={"image": "REGISTRY/REPO@sha256:DIGEST (or :TAG, resolved and reported)",
            "key": "a release public key PEM (release.pub), added to the policy's roles.release keys",
            "smoke_key": "a smoke public key PEM (smoke.pub), added to the policy's roles.smoke keys",
            "policy": "verification policy (default: provenance/policy.yaml)",
            "layout": "verify an OCI layout directory (offline) instead of a registry",
            "require_smoke": "also demand a passing MI300X smoke attestation",
            "rebuilder_key": "a rebuilder public key PEM, added to the policy's roles.rebuilder keys (repeatable)",
            "require_rebuilds": "demand that this many distinct rebuilder keys attest a rebuild giving this digest",
            "skip_blobs": "do not download and hash every layer (faster, weaker)"},
      iterable=["rebuilder_key"])
@reports_errors
def verify(c, image, key=None, smoke_key=None, policy=None, layout=None, require_smoke=False, skip_blobs=False,
           rebuilder_key=None, require_rebuilds=0):
    """For ops: prove IMAGE is ours, what is in it and how it was made; exit 0 only if all checks hold."""
    from bakery.oci import store
    from bakery.trust import verify as verify_mod
    from bakery.oci.refs import Reference

    ref = Reference.parse(image)
    where = store.open_store(ref, Path(layout) if layout else None)
    if ref.digest is None:
        body = where.manifest(ref.tag or "latest")
        if body is None:
            raise Exit(f"error: {image} not found", code=3)
        from bakery.oci.refs import Digest

        ref = ref.with_digest(Digest.of(body))
        _log(f"{image} is {ref.digest}")
    pol = _load_policy(policy, {**_role_keys(key, smoke_key), "rebuilder": [Path(k) for k in rebuilder_key or []]})
    from bakery.untrusted import safe

    report = verify_mod.verify(where, ref, pol, require_smoke, not skip_blobs, int(require_rebuilds))
    for ok, what in report.checks:  # a check may quote what a registry writer chose: shown inert
        print(f"{'ok  ' if ok else 'FAIL'} {safe(what, limit=2000)}")
    for k, v in report.summary.items():
        print(f"{k}: {safe(', '.join(map(str, v)) if isinstance(v, list) else v, limit=2000)}")
    verify_mod.require(report)
    print(f"verified {ref}")


@task(help={"image": "the released REGISTRY/REPO@sha256:DIGEST to rebuild",
            "release_key": "a release public key PEM: the provenance is read only once its signature holds",
            "policy": "verification policy (default: provenance/policy.yaml)",
            "toolchain": "compile hip/ in this image (default: the one the provenance names)",
            "workdir": "where to clone and build (default: a new temporary folder, kept only when the rebuild "
                       "gives other bytes)",
            "attest": "sign the outcome (match or not) onto IMAGE as this rebuilder, with --key",
            "key": "with --attest: this rebuilder's encrypted private key (default: BAKERY_REBUILDER_SIGNING_KEY)",
            "outcome": "write what the rebuild gave (its manifest, the differences) to this file, for "
                       "`invoke attest-rebuild` in a job that holds the key and runs no build"})
@reports_errors
def reproduce(c, image, release_key=None, policy=None, toolchain=None, workdir=None, attest=False, key=None,
              outcome=None):
    """Rebuild IMAGE from its signed provenance here, from nothing; exit 0 only if the digest is the same."""
    import tempfile

    from bakery.trust import attest as attest_mod, keys, provenance, sign
    from bakery.release import reproduce as rep
    from bakery.oci import store
    from bakery.oci.refs import Reference

    ref = Reference.parse_pinned(image, "image")
    where = store.open_store(ref, None)
    rules = _load_policy(policy, _role_keys(release_key, None))
    plan = rep.plan(rep.signed_provenance(where, ref, rules))
    work = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="bakery-reproduce-"))
    digest = None
    try:
        layout = rep.rebuild(plan, work, toolchain, _log)  # the revision's code runs with none of our secrets
        digest, manifest = rep.rebuilt_digest(layout)
        diffs = [] if digest == ref.digest else \
            rep.differences(where, where.manifest(str(ref.digest)), store.LayoutStore(layout), manifest)
    finally:
        if not workdir and digest in (None, ref.digest):
            import shutil  # a temporary folder is kept only to show a rebuild that gave other bytes

            shutil.rmtree(work, ignore_errors=True)
    if outcome:
        rep.write_outcome(Path(outcome), ref, manifest, diffs)
    if attest:  # the key is read only now, after the revision's code has finished
        signer = sign.Signer(keys.load_private(Path(key) if key else None, keys.REBUILDER_KEY_ENV))
        attest_mod.attach(where, ref, {provenance.REBUILD_PREDICATE: rep.statement(ref, plan, digest, diffs)}, signer)
        _log(f"attested the rebuild ({'match' if digest == ref.digest else 'other bytes'}) as rebuilder "
             f"{signer.keyid[:12]}")
    if digest == ref.digest:
        print(f"reproduced {ref}: the rebuild of {plan.repository}@{plan.revision[:12]} is byte-identical")
        return
    from bakery.untrusted import safe

    for d in diffs:  # the paths are the rebuilt revision's to choose: shown inert
        print(f"layer {d['layer']} differs: original {safe(d['original'])}, rebuilt {safe(d['rebuilt'])}")
        for f in d["files"]:
            print(f"  {safe(f['path'])}: original {safe(f['original'] or '(absent)')}, "
                  f"rebuilt {safe(f['rebuilt'] or '(absent)')}")
    raise Exit(f"error: not reproduced: {ref.digest} was released, the rebuild of {plan.revision[:12]} gives "
               f"{digest} (the rebuild is in {work})", code=5)


@task(help={"image": "the released REGISTRY/REPO@sha256:DIGEST that was rebuilt",
            "outcome": "the file `invoke reproduce --outcome` wrote",
            "release_key": "a release public key PEM (the provenance is re-read and checked here)",
            "policy": "verification policy (default: provenance/policy.yaml)",
            "key": "this rebuilder's encrypted private key (default: BAKERY_REBUILDER_SIGNING_KEY)"})
@reports_errors
def attest_rebuild(c, image, outcome, release_key=None, policy=None, key=None):
    """Sign a rebuild's outcome as a rebuilder where no build runs; the match is recomputed from the manifest."""
    from bakery.trust import attest as attest_mod, keys, provenance, sign
    from bakery.release import reproduce as rep
    from bakery.oci import store
    from bakery.oci.refs import Digest, Reference

    ref = Reference.parse_pinned(image, "image")
    where = store.open_store(ref, None)
    rules = _load_policy(policy, _role_keys(release_key, None))
    plan = rep.plan(rep.signed_provenance(where, ref, rules))  # from the signed provenance, not the file
    manifest, diffs = rep.read_outcome(Path(outcome), ref)
    digest = Digest.of(manifest)  # the file's claim of a match counts for nothing: the bytes decide
    signer = sign.Signer(keys.load_private(Path(key) if key else None, keys.REBUILDER_KEY_ENV))
    attest_mod.attach(where, ref, {provenance.REBUILD_PREDICATE: rep.statement(ref, plan, digest, diffs)}, signer)
    print(f"attested: the rebuild of {ref.digest} gave {digest} ({'match' if digest == ref.digest else 'other bytes'})")


@task(help={"image": "REGISTRY/REPO@sha256:DIGEST to smoke-test",
            "model_dir": "the model snapshot directory (.../snapshots/<revision>), mounted read-only",
            "port": "host port for the API on 127.0.0.1 (default 8000)",
            "report": "where to write the JSON report (default: out/smoke-report.json)",
            "record": "record the regression outputs (first run on MI300X) instead of comparing",
            "attest": "sign the report onto the digest with the smoke key (--key or BAKERY_SMOKE_SIGNING_KEY)",
            "key": "encrypted smoke private key file for --attest (smoke.key)",
            "envelope": "with --attest: write the signed envelope to this file instead of pushing it (a job "
                        "without push rights hands it to `invoke attach`)"})
@reports_errors
def smoke(c, image, model_dir, port=8000, report=None, record=False, attest=False, key=None, envelope=None):
    """MI300X smoke gate: production launch, ordered health lines, API checks, VRAM; JSON report."""
    import hashlib
    import json as json_mod

    from bakery.trust import keys, sign, smoke_ledger
    from bakery.release import smoke as smoke_mod
    from bakery.oci import store
    from bakery.oci.refs import Reference

    ref = Reference.parse_pinned(image, "image")
    if record and attest:
        from bakery.errors import InputError

        raise InputError("--record and --attest together: a recording run is not a verdict; record, review and "
                         "commit the outputs in provenance/smoke.yaml, then run again with --attest")
    spec_path = PROJECT / "provenance" / "smoke.yaml"
    spec = smoke_mod.load_spec(spec_path)
    result = smoke_mod.run(str(ref), spec, Path(model_dir), int(port), record, log=_log)
    smoke_ledger.remember(str(ref.digest), hashlib.sha256(spec_path.read_bytes()).hexdigest(), result["result"],
                       result["finished"], result["run"])  # a later verify here refuses an older PASSED
    out = Path(report) if report else PROJECT / "out" / "smoke-report.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json_mod.dumps(result, indent=2, sort_keys=True))
    _log(f"report: {out}")
    if attest:
        signer = sign.Signer(keys.load_private(Path(key) if key else None, keys.SMOKE_KEY_ENV))
        if envelope:
            from bakery.oci.layer import write_blob

            write_blob(Path(envelope), sign.envelope(signer, smoke_mod.statement(ref, result, spec_path.read_bytes())))
            _log(f"smoke attestation ({result['result']}) signed into {envelope}: attach it with `invoke attach`")
        else:
            smoke_mod.attach_report(store.RegistryStore(ref), ref, result, spec_path.read_bytes(), signer)
            _log(f"smoke attestation ({result['result']}) attached to {ref}")
    print(f"{result['result']} {ref} ({result['regression_compared']} regression outputs compared)")
    if result["result"] == "RECORDED":
        _log("recorded the regression outputs in the report: copy them into provenance/smoke.yaml as expected:, "
             "review, commit, and run again for a verdict")
        return
    if result["result"] != "PASSED":
        raise Exit(f"error: smoke failed: {', '.join(result['failed'])}"
                   + (f" ({result['failure']})" if result.get("failure") else ""), code=7)


@task(help={"image": "the smoke-tested REGISTRY/REPO@sha256:DIGEST",
            "tag": "the release tag to point at it (e.g. v1.2.0)",
            "key": "a release public key PEM (added to the policy's)",
            "smoke_key": "a smoke public key PEM (added to the policy's)",
            "policy": "verification policy (default: provenance/policy.yaml)",
            "rebuilder_key": "a rebuilder public key PEM, added to the policy's roles.rebuilder keys (repeatable)",
            "require_rebuilds": "demand that this many distinct rebuilder keys attest a rebuild giving this digest",
            "smoke_run": "demand a smoke result from this workflow run (REPO#RUN_ID; the release workflow passes its "
                         "own, so a result of an earlier run put back is refused)"},
      iterable=["rebuilder_key"])
@reports_errors
def promote(c, image, tag, key=None, smoke_key=None, policy=None, rebuilder_key=None, require_rebuilds=0,
            smoke_run=None):
    """Tag a digest for release, only if it verifies with a passing MI300X smoke attestation."""
    from bakery.oci import store
    from bakery.trust import verify as verify_mod
    from bakery.oci.refs import Reference

    ref = Reference.parse_pinned(image, "image")
    where = store.RegistryStore(ref)
    pol = _load_policy(policy, {**_role_keys(key, smoke_key), "rebuilder": [Path(k) for k in rebuilder_key or []]})
    report = verify_mod.verify(where, ref, pol, require_smoke=True, blobs=False, require_rebuilds=int(require_rebuilds),
                               smoke_run=smoke_run)
    verify_mod.require(report)
    where.put_manifest(tag, where.manifest(str(ref.digest)))
    print(f"{ref.name}:{tag} -> {ref.digest}")


def _kernel_trust(key, policy, registry):
    """None, or what a kernel artifact must carry (release-key signature) to be used instead of compiling."""
    from bakery.build.pipeline import Options

    return Options(PROJECT, keys=(Path(key),) if key else (), policy=Path(policy) if policy else None) \
        .kernel_trust(registry)


@task(help={"base": "base image REF@sha256:DIGEST (default: image/base.yaml)",
            "path": "where Docker keeps images (default: /var/lib/docker, else /)",
            "unless_cached_in": "REGISTRY/REPO: if it holds this recipe's kernel artifact, signed by a release key, "
                                "nothing will be pulled",
            "key": "a release public key PEM (beside the policy's) to check that artifact's signature with",
            "policy": "policy naming the release keys (default: provenance/policy.yaml)"})
@reports_errors
def disk(c, base=None, path=None, unless_cached_in=None, key=None, policy=None):
    """Check, before pulling, that the disk holds the base for compiling; print needed and free GiB."""
    from bakery.base import spec as base_mod
    from bakery.inputs import hip
    from bakery.errors import IntegrityError, NotFound
    from bakery.oci.refs import Reference
    from bakery.oci.registry import Registry
    from bakery.engine import docker_client

    spec = base_mod.load_spec(PROJECT / "image" / "base.yaml", base)
    if unless_cached_in:
        where = Reference.parse(unless_cached_in)
        registry = Registry(where.registry)
        trust = _kernel_trust(key, policy, registry)
        tools = os.environ.get("BAKERY_TOOLCHAIN") or str(spec.source)
        tag = hip.artifact_tag(hip.load(PROJECT / "hip").key(hip.toolchain_identity(docker_client, tools)))
        try:
            _, _, digest = registry.get_manifest(Reference(where.registry, where.repository, tag))
            if trust is None:
                raise IntegrityError("no release key in the policy to check its signature with")
            trust(Reference(where.registry, where.repository, tag, digest))
            print(f"ok: {where.name}:{tag[:20]}... holds the kernels, signed by a release key; the base will not "
                  f"be pulled")
            return
        except NotFound:
            _log(f"{where.name} has no kernel artifact for this recipe and toolchain: the build will compile")
        except IntegrityError as e:
            _log(f"{where.name} has a kernel artifact for this recipe that will not be used ({e}): the build will "
                 f"compile (with --recompile) or refuse it")
    image = base_mod.resolve(Registry(spec.source.registry), spec.source, spec.platform)
    where = Path(path) if path else next(p for p in (Path("/var/lib/docker"), Path("/")) if p.exists())
    needed, free = base_mod.disk_check(image, where)
    print(f"ok: {spec.image} needs about {needed / 2**30:.1f} GiB at {where}; {free / 2**30:.1f} GiB free")


@task
@reports_errors
def toolchain(c):
    """Build the stand-in HIP toolchain image (Debian clang-19, ROCm device libs, CPU torch); print its tag."""
    from bakery.dev import fixture as fixture_mod

    print(fixture_mod.toolchain(PROJECT / "hip" / "toolchain", FIXTURE_SPEC, log=_log))


@task(help={"toolchain": "image to compile in (default: BAKERY_TOOLCHAIN, else the pinned base)",
            "verify": "compile again here, ignoring every cache, and prove the cached outputs byte-identical",
            "registry": "REGISTRY/REPO holding the kernel artifact (kernels-<key>): fetch it (if a release key "
                        "signed it), or push it there",
            "key": "a release public key PEM (beside the policy's) to check the artifact's signature with",
            "policy": "policy naming the release keys (default: provenance/policy.yaml)"})
@reports_errors
def compile(c, toolchain=None, verify=False, registry=None, key=None, policy=None):
    """Compile hip/ for gfx942 in the toolchain image, check the device code, print each output's sha256."""
    import hashlib

    from bakery.base import spec as base_mod
    from bakery.inputs import hip
    from bakery.build.pipeline import _cache_dir
    from bakery.oci.refs import Reference
    from bakery.oci.registry import Registry

    tools = toolchain or os.environ.get("BAKERY_TOOLCHAIN") or \
        str(base_mod.load_spec(PROJECT / "image" / "base.yaml").source)
    recipe = hip.load(PROJECT / "hip")
    where = Reference.parse(registry) if registry else None
    remote = (Registry(where.registry), where.repository) if where else None
    trust = _kernel_trust(key, policy, remote[0]) if remote else None
    if verify:
        for name, sha in hip.verify_outputs(recipe, tools, _cache_dir() / "hip", _log, remote, trust):
            print(f"{sha}  {name}  byte-identical when compiled again")
        return
    compiled = hip.compile_recipe(recipe, tools, _cache_dir() / "hip", log=_log, remote=remote, trust=trust)
    _log(f"kernels {compiled.origin}" + (f"; artifact {compiled.artifact}" if compiled.artifact else ""))
    for a in compiled.artifacts:
        _log(f"  {a.name}: {a.arch}, kernels {', '.join(a.code_objects[0]['kernels'])}; {a.toolchain}")
        print(f"{hashlib.sha256(a.data).hexdigest()}  {a.dest}")


@task(help={"workflow": "release (default: a v* tag push) or nightly (a schedule)",
            "drill": "release: broken-proof, unsigned-kernels, smoke-failed, rebuild-mismatch, foreign-revision or "
                     "dirty-checkout (each must stop the release); nightly: needs-porting",
            "smoke_stand_in": "release: the smoke job's MI300X step signs the tests' stand-in report (there is no "
                              "MI300X here), so attach-smoke and promote run",
            "work": "folder for the rehearsal's clone, keys, logs and artifacts (default: out/rehearsal)"})
@reports_errors
def rehearse(c, workflow="release", drill=None, smoke_stand_in=False, work=None):
    """Run a workflow end to end on this machine under act, against the local registry; print the job table."""
    from bakery.dev import rehearse as rehearse_mod
    from bakery.errors import InputError

    where = Path(work) if work else PROJECT / "out" / "rehearsal"
    if workflow == "release":
        name = drill or ("stand-in" if smoke_stand_in else "no-mi300x")
        outcome = rehearse_mod.release(PROJECT, where / name, _log,
                                       smoke="stand-in" if smoke_stand_in else "none", drill=drill)
        # no MI300X here: without the stand-in the release must stop at smoke
        surprises = outcome.surprises(rehearse_mod.DRILLS[drill][0] if drill else None if smoke_stand_in else "smoke")
    elif workflow == "nightly":
        if drill not in (None, "needs-porting"):
            raise InputError(f"--drill {drill}: the nightly workflow's is needs-porting")
        outcome = rehearse_mod.nightly(PROJECT, where / (drill or "nightly"), _log, porting=drill == "needs-porting")
        surprises = outcome.surprises(None, () if drill else ("porting",))
    else:
        raise InputError(f"--workflow {workflow}: release or nightly")
    print(outcome.table())
    if outcome.image:
        print(f"candidate: {outcome.image}")
    if surprises:
        raise Exit(f"error: the rehearsal did not end as it must ({'; '.join(surprises)}); act's log: {outcome.log}",
                   code=1)
    _log(f"rehearsed as expected; act's log: {outcome.log}")
