"""invoke build, lock, compile, disk, mirror, fixture, toolchain, demo: making the image and what it
is made from."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..bake.options import Options
from ..errors import InputError, IntegrityError, NotFound
from ..project import Project, cache_dir
from .trust_flags import kernel_trust

FIXTURE_SPEC = Path("tests") / "fixture" / "fixture.yaml"  # in the checkout: the stand-in base's spec


def build(o: Options, log) -> tuple[str, Path]:
    """(REPO@sha256:DIGEST, the build record's path)."""
    from ..bake.pipeline import build as run

    ref, _ = run(o, log=log)
    return str(ref), o.out_dir / "build-record.json"


def lock(o: Options, log):
    """(the Lock written, its path)."""
    from ..bake.pipeline import lock as run

    return run(o, log=log), o.lock_path


def mirror(project: Path, to: str | None, base: str | None, image: str | None, layout: str | None, log) -> str:
    """The pinned base (or, with image, one of our signed images with its signatures) copied by
    digest; what was written, as REF@DIGEST (or LAYOUT:DIGEST)."""
    from ..base import spec as base_mod
    from ..oci import mirror as mirror_mod, store
    from ..oci.refs import Reference

    if image:
        ref = Reference.parse_pinned(image, "--image")
        dest_store: store.LayoutStore | store.RegistryStore
        tag: str | None  # --to REGISTRY/REPO:TAG tags the copy
        if layout:  # named by the source's tag where it has one (v1.2.0: prune judges it as a release)
            dest_store, where, tag = store.LayoutStore(Path(layout), create=True), ref, ref.tag or "latest"
        elif to:
            target = Reference.parse(to)
            dest_store, where = store.RegistryStore(target), Reference(target.registry, target.repository, None,
                                                                       ref.digest)
            tag = target.tag
        else:
            raise InputError("--image needs --to REGISTRY/REPO or --layout DIR")
        log(f"mirroring {ref} with its signature and attestations to {layout or where.name}")
        with dest_store.locked():
            mirror_mod.copy_signed(store.RegistryStore(ref), ref, dest_store, tag, log=log)
        return f"{layout}:{ref.digest}" if layout else str(where)
    if not to:
        raise InputError("give --to REGISTRY/REPO (where to keep the pinned base)")
    spec = base_mod.load_spec(Project(project).base_yaml, base)
    dest = Reference.parse(to)
    log(f"mirroring {spec.image} to {dest.name}")
    return str(mirror_mod.copy(spec.image, dest, log=log))


def fixture_spec(project: Path, vllm: str) -> Path:
    """The fixture spec built from this vLLM release; the known ones named when there is none."""
    default = project / FIXTURE_SPEC
    spec = default if vllm == "0.26.0" else default.with_name(f"fixture-vllm-{vllm}.yaml")
    if not spec.is_file():
        raise InputError(f"--vllm {vllm}: no fixture spec for it; known: 0.26.0, "
                         + ", ".join(p.stem.removeprefix("fixture-vllm-") for p in default.parent.glob("fixture-vllm-*.yaml")))
    return spec


def fixture(project: Path, registry: str | None, vllm: str, log) -> str:
    from ..dev import fixture as fixture_mod, stack

    spec = fixture_spec(project, vllm)
    return str(fixture_mod.build(spec, registry or stack.up(), log=log))


def toolchain(project: Path, registry: str | None, log) -> str:
    from ..dev import fixture as fixture_mod, stack

    return fixture_mod.toolchain(Project(project).hip / "toolchain", project / FIXTURE_SPEC, registry or stack.up(),
                                 log=log)


def demo(project: Path, log) -> str:
    """Stack up, fixture base, lock, build + push, docker pull, the image's self-check: its REF@DIGEST."""
    import docker

    from ..bake.pipeline import build as run, lock as lock_overlays
    from ..dev import fixture as fixture_mod, stack as stack_mod

    registry = stack_mod.up()
    base = fixture_mod.build(project / FIXTURE_SPEC, registry, log=log)
    log(f"fixture base: {base}")
    # the fixture's digest is this machine's own: lock the overlays against it, beside the build
    demo_lock = Project(project).out / "demo-overlays.lock"
    lock_overlays(Options(project, str(base), lock=demo_lock), log=log)
    # the fixture has no ROCm: compile hip/ over the stand-in toolchain's files
    tools = toolchain(project, registry, log)
    ref, _ = run(Options(project, str(base), f"{registry}/demo/dsv4-flash-mi300x:latest", lock=demo_lock,
                         toolchain=tools), log=log)
    log(f"docker pull {ref}")
    client = docker.from_env()
    client.images.pull(str(ref))
    out = client.containers.run(str(ref), entrypoint=["/usr/local/bin/bakery-selfcheck"], remove=True,
                                stdout=True, stderr=True)
    log(out.decode().strip())
    return str(ref)


@dataclass(frozen=True)
class Compiled:
    """What `invoke compile` has to say: each output's sha256 and where it goes in the image, and
    whether it was compiled again to check (verify) or compiled/taken (with the kernels' origin)."""
    outputs: tuple[tuple[str, str], ...]  # (sha256, name or image path)
    verified: bool
    origin: str = ""
    artifact: str | None = None
    artifacts: tuple = ()


def compile(project: Path, toolchain: str | None, verify: bool, registry: str | None, key: str | None,
            policy: str | None, log) -> Compiled:
    import hashlib

    from ..base import spec as base_mod
    from ..inputs import hip, hip_compile
    from ..oci.refs import Reference
    from ..oci.store import RegistryStore

    tools = hip_compile.toolchain_image(toolchain, base_mod.load_spec(Project(project).base_yaml).source)
    recipe = hip.load(Project(project).hip)
    where = Reference.parse(registry) if registry else None
    remote = RegistryStore(Reference(where.registry, where.repository)) if where else None
    trust = kernel_trust(project, key, policy, remote.registry) if remote else None
    if verify:
        return Compiled(tuple((sha, name) for name, sha in
                              hip_compile.verify_outputs(recipe, tools, cache_dir(create=True) / "hip", log, remote,
                                                         trust)), True)
    compiled = hip_compile.compile_recipe(recipe, tools, cache_dir(create=True) / "hip", log=log, remote=remote,
                                          trust=trust)
    return Compiled(tuple((hashlib.sha256(a.data).hexdigest(), a.dest) for a in compiled.artifacts), False,
                    compiled.origin, str(compiled.artifact) if compiled.artifact else None, tuple(compiled.artifacts))


@dataclass(frozen=True)
class Disk:
    """`invoke disk`: either the signed kernels make compiling unnecessary (cached), or the
    toolchain's files, taken out of its layers to compile over, need `needed` bytes (`how` says
    how that is known) where `free` are."""
    cached: tuple[str, str] | None = None  # (REPO, TAG) of the signed kernel artifact
    toolchain: str = ""
    where: Path | None = None
    needed: int = 0
    how: str = ""
    free: int = 0


def kernels_cached(project: Path, spec, unless_cached_in: str, key: str | None, policy: str | None,
                   log) -> tuple[str, str] | None:
    """(REPO, TAG) of a kernel artifact for this recipe that a release key signed, or None (said
    why in the log): a build that finds one never pulls the base to compile."""
    from ..inputs import hip, hip_compile, kernel_artifact
    from ..oci import artifact
    from ..oci.refs import Reference
    from ..oci.store import RegistryStore

    where = Reference.parse(unless_cached_in)
    store = RegistryStore(Reference(where.registry, where.repository))
    trust = kernel_trust(project, key, policy, store.registry)
    tools = hip_compile.toolchain_image(None, spec.source)
    tag = kernel_artifact.artifact_tag(hip.load(Project(project).hip).key(str(tools.pin)))

    def signed(ref: Reference) -> None:
        if trust is None:
            raise IntegrityError("no release key in the policy to check its signature with")
        trust(ref)

    try:
        taken = artifact.take(store, tag, signed)
    except NotFound:  # a part of it gone (its signature's blobs)
        taken = None
    except IntegrityError as e:
        log(f"{where.name} has a kernel artifact for this recipe that will not be used ({e}): the build will "
            f"compile (with --recompile) or refuse it")
        return None
    if taken is None:
        log(f"{where.name} has no kernel artifact for this recipe and toolchain: the build will compile")
        return None
    return where.name, tag


def disk(project: Path, base: str | None, toolchain: str | None, unless_cached_in: str | None, key: str | None,
         policy: str | None, log) -> Disk:
    """Is there room to take the toolchain's files out of its layers (where BAKERY_CACHE is), unless
    a signed kernel artifact makes the compile unnecessary? EnvironmentProblem (exit 6) if not."""
    from ..base import extract, spec as base_mod
    from ..base.filesystem import BaseFilesystem
    from ..base.layercache import LayerCache
    from ..inputs import hip, hip_compile
    from ..oci.registry import Registry

    spec = base_mod.load_spec(Project(project).base_yaml, base)
    if unless_cached_in:
        cached = kernels_cached(project, spec, unless_cached_in, key, policy, log)
        if cached:
            return Disk(cached=cached)
    tools = hip_compile.toolchain_image(toolchain, spec.source)
    registry = Registry(tools.registry)
    fs = BaseFilesystem(registry, base_mod.resolve(registry, tools, "linux/amd64"), LayerCache())
    where = cache_dir("toolchains")
    needed, how = extract.space_needed(fs, hip.load(Project(project).hip).toolchain, where)
    return Disk(toolchain=str(tools), where=where, needed=needed, how=how, free=extract.check_space(needed, where, how))
