"""hip/ compiled for its arch inside a toolchain image, reproducibly: over the toolchain's own files
(taken out of its image once, never run in an engine), in the sandbox (sources read-only, no network,
limits, /out watched), or through the broker inside a rebuild. compile_recipe is the one way in: this
machine's cache, else a signed kernel artifact, else a compile here."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import broker_client
from ..errors import EnvironmentProblem, IntegrityError
from ..files import atomic_dir, staging_dir
from ..oci.refs import Reference
from ..project import cache_dir
from .device_code import check_device_code
from .hip import NO_TOOLCHAIN, Artifact, Recipe, Toolchain, script
from .hip_outputs import expected_outputs, outputs_ok, read_accepted, recorded_outputs, same_outputs, take_outputs
from .kernel_artifact import fetch_artifact, kernels, push_artifact


def toolchain_image(given: str | None, base: Reference) -> Reference:
    """The image hip/ compiles over: the one given, else BAKERY_TOOLCHAIN, else the base; pinned by
    digest (a tag could move under a rebuild), or refused here, once."""
    return Reference.parse_pinned(given or os.environ.get("BAKERY_TOOLCHAIN") or str(base), "toolchain image")


LOG_LIMIT = 1 << 20  # what of the compiler's output is read back


def toolchain_files(toolchain: Reference, selection, cache: Path, log=print):
    """The toolchain image's files the recipe's selection takes, as a folder in this machine's cache
    (base/extract.py): streamed once from its registry, never pulled into an engine."""
    from ..base import extract, spec as base_mod
    from ..base.filesystem import BaseFilesystem
    from ..base.layercache import LayerCache
    from ..oci.registry import Registry

    registry = Registry(toolchain.registry)
    image = base_mod.resolve(registry, toolchain, "linux/amd64")
    return extract.toolchain_root(BaseFilesystem(registry, image, LayerCache()), selection, cache, log)


OUT_LIMIT = 2 << 30  # what a compile may write under /out (its outputs are tens of MiB; each file is capped at 1 GiB)
OUT_ENTRIES = 10_000  # names under /out, counted as the watch walks them


def run_compile(files, src: Path, shell: str, out: Path, stop=None) -> tuple[int, str]:
    """Run `shell` over the toolchain's own files (`files`, an extract.Root) in the sandbox: the
    sources at /src read-only, `out` at /out, no network, uid 65534, the compile's limits;
    (exit status, the tail of what it printed). Past the time limit: -1; stopped by `stop`: -9;
    stopped for what it writes to the host's disk (`_overdrawn`): -9 too, and it says why."""
    import threading

    from .. import sandbox

    stopping, finished, why = threading.Event(), threading.Event(), []

    def watch() -> None:  # /out is the one host folder it writes: the host's disk, polled
        while not finished.wait(0.25):
            if stop is not None and stop.is_set():
                stopping.set()
                continue
            try:
                said = _overdrawn(out)
            except BaseException as e:  # noqa: BLE001 (a watch that fails must stop the run, not let it go on unwatched)
                said = f"its /out could not be measured ({type(e).__name__})"
            if said:
                why.append(said)
                stopping.set()
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        done = sandbox.run(["/bin/sh", "-c", shell], [], None, sandbox.COMPILE, env={**files.env, "HOME": "/tmp"},
                           root=files.path, mounts=(sandbox.Mount("/src", src), sandbox.Mount("/out", out, True)),
                           stop=stopping)
    except subprocess.TimeoutExpired:
        return -1, f"(stopped after {sandbox.COMPILE.seconds:.0f} s)"
    finally:
        finished.set()
        watcher.join()
    if why:
        return -9, f"(stopped: {why[0]})"
    return done.returncode, (done.stdout + done.stderr)[-LOG_LIMIT:].strip()


def _overdrawn(folder: Path) -> str | None:
    """Why a compile writing under `folder` must stop, or None: its filesystem is down to what must
    stay free (which counts files unlinked while open, too), or the files under it take more than
    OUT_LIMIT or are more than OUT_ENTRIES names; a tree the walk cannot read whole counts as over."""
    from ..base.extract import RESERVE

    if shutil.disk_usage(folder).free < RESERVE:
        return f"the disk under /out is down to {RESERVE >> 30} GiB free"
    unreadable: list[OSError]
    total, seen, unreadable = 0, 0, []
    for here, dirs, names in os.walk(folder, onerror=unreadable.append):
        for name in dirs + names:
            seen += 1
            if seen > OUT_ENTRIES:
                return f"it made more than {OUT_ENTRIES:,} names under /out"
            try:
                total += os.lstat(os.path.join(here, name)).st_blocks * 512
            except FileNotFoundError:
                continue  # gone since it was listed
            except OSError as e:  # a name past what a path may be, say
                unreadable.append(e)
                break
        if unreadable or total > OUT_LIMIT:
            break
    if unreadable:
        return f"under /out it made what cannot be read ({type(unreadable[0]).__name__})"
    if total > OUT_LIMIT:
        return f"it wrote more than {OUT_LIMIT >> 20:,} MiB under /out, the host's disk"
    return None


def run_toolchain(recipe: Recipe, toolchain: Reference, shell: str, out: Path, log=print) -> None:
    """Compile: run_compile here, or through the broker in a rebuild's sandbox; its failure in one line."""
    if os.environ.get(broker_client.SOCKET_ENV):
        status, logs = broker_client.compile_outside(str(toolchain), shell, out)
    else:
        files = toolchain_files(toolchain, recipe.toolchain, cache_dir(create=True) / "toolchains", log)
        status, logs = run_compile(files, recipe.root, shell, out)
    if status == NO_TOOLCHAIN:
        raise EnvironmentProblem(f"toolchain image {toolchain} has no HIP compiler ({logs.splitlines()[-1]}): "
                                 f"compile in the ROCm base, or build the stand-in with `invoke toolchain`")
    if status != 0:
        raise EnvironmentProblem(f"compiling hip/ failed (exit {status}); nothing was baked. Compiler said:\n"
                                 + "\n".join(logs.splitlines()[-25:]))


@dataclass(frozen=True)
class Compiled:
    """A recipe's outputs and where they came from: this machine's cache, a signed artifact, or a compile."""
    artifacts: list
    key: str  # recipe, sources and toolchain
    origin: str  # "cache" (this machine's), "registry" (the artifact) or "compiled"
    artifact: Reference | None  # the OCI artifact holding these outputs, when a registry was given
    push: Callable[[], object] | None = None  # with defer_push: pushes the artifact (nothing to push: None)

    def record(self) -> dict:
        return {"key": self.key, "origin": self.origin, "artifact": str(self.artifact) if self.artifact else None}


def compile_recipe(recipe: Recipe, toolchain: Reference, cache: Path, log=print, remote=None, trust=None,
                   recompile: bool = False, defer_push: bool = False) -> Compiled:
    """The recipe's outputs for this toolchain: from this machine's cache, else from the artifact in
    `remote` (a RegistryStore: the build's push target) when `trust(ref)` accepts its signature
    (release keys; None: no key to check with, so compile), else compiled over `toolchain`'s own
    files in the sandbox (sources read-only, no network). The compiled outputs are pushed to the
    remote, unsigned: `invoke attest` signs the artifact the build record names."""
    key = recipe.key(str(toolchain.pin))  # the toolchain by content
    out = cache / key[:24]
    cache.mkdir(parents=True, exist_ok=True)
    origin, artifact, accepted = "cache", None, None
    if not outputs_ok(out) and remote is not None and not recompile:
        if trust is None:
            log("no release key in the policy to check a kernel artifact's signature with: compiling here")
        else:
            fetched = fetch_artifact(remote, key, out, trust, expected_outputs(recipe))
            if fetched is not None:
                artifact, accepted = fetched
        if artifact is not None:
            origin = "registry"
            log(f"kernels for this recipe and toolchain from {artifact} (signed by a release key): not compiled "
                f"here, the base not pulled")
    if accepted is None and not outputs_ok(out):
        origin = "compiled"
        accepted = _compile(recipe, toolchain, out, log)
    if accepted is None:
        accepted = recorded_outputs(out)
    # from here on `out` is read against `accepted`, the bytes the origin vouches for: another run may
    # put another whole entry in its place meanwhile (atomic_dir replaces one that differs)
    push = None
    if remote is not None and artifact is None:
        if defer_push:  # the build pushes it once everything that can fail has run
            artifact = kernels(key, out, accepted).at(remote)
            push = functools.partial(push_artifact, remote, key, out, accepted)
        else:
            artifact = push_artifact(remote, key, out, accepted)
    return Compiled(_artifacts(recipe, out, str(toolchain), accepted), key, origin, artifact, push)


def _compile(recipe: Recipe, toolchain: Reference, out: Path, log) -> dict[str, str]:
    """{name: sha256} of the outputs compiled, which `out` holds as it is left (or held, when
    another run finished the same bytes first)."""
    # through the broker, the compile writes on the broker's disk, which it watches itself
    here = not os.environ.get(broker_client.SOCKET_ENV)
    if here:
        room_to_compile(out.parent)
    try:
        made: dict = {}
        with atomic_dir(out, keep=same_outputs(made)) as tmp:  # two compiles at once: the first one's stays
            log(f"compiling hip/ for {recipe.arch} in {toolchain}")
            scratch = tmp / ".out"
            scratch.mkdir()
            run_toolchain(recipe, toolchain, script(recipe), scratch, log)
            outputs = take_outputs(scratch, expected_outputs(recipe), tmp)
            made.update(outputs)
            shutil.rmtree(scratch)
            (tmp / "done.json").write_text(json.dumps({"toolchain_image": str(toolchain.pin), "sha256": outputs}))
    except EnvironmentProblem:
        if here:  # stopped by the watch, or the compiler's own write failed, as the disk filled: say so
            room_to_compile(out.parent)
        raise
    return made


def room_to_compile(folder: Path, elsewhere: str = "set BAKERY_CACHE to a larger disk") -> None:
    """The compile's /out lies under `folder` and is stopped once its disk is down to RESERVE
    (_overdrawn): with less free, one line naming the folder, not the compiler's log about /out."""
    from ..base.extract import RESERVE

    free = shutil.disk_usage(folder).free
    if free < RESERVE:
        raise EnvironmentProblem(f"the disk is full at {folder}: {free / 2**20:.0f} MiB free, and a compile of hip/ "
                                 f"writes there only while {RESERVE >> 30} GiB stay free; free space, or "
                                 f"{elsewhere}") from None


def _artifacts(recipe: Recipe, out: Path, toolchain: str, accepted: dict[str, str]) -> list[Artifact]:
    """The outputs in `out` as artifacts, each read once, as `accepted` names it, and checked for its
    device code; `toolchain` is the pinned reference they were compiled in (or compiled for, where
    the registry gave them)."""
    compiler = read_accepted(out, "toolchain.txt", accepted).decode().strip()
    artifacts = []
    for ext in recipe.extensions:
        data = read_accepted(out, f"{ext.name}.so", accepted)
        objects = check_device_code(data, recipe.arch, list(ext.kernels))
        sources = tuple({"path": f"hip/{s}", "sha256": hashlib.sha256((recipe.root / s).read_bytes()).hexdigest()}
                        for s in ext.sources)
        schema = read_accepted(out, f"{ext.name}.schema", accepted).decode()
        artifacts.append(Artifact(ext.name, ext.dest, data, recipe.arch, Toolchain(compiler, toolchain),
                                  sources, schema, tuple(objects), ext.serves))
    return artifacts


def verify_outputs(recipe: Recipe, toolchain: Reference, cache: Path, log=print, remote=None,
                   trust=None) -> list[tuple[str, str]]:
    """`invoke compile --verify`: compile again here, ignoring every cache, and prove the cached (or
    registry) outputs byte-identical; returns (file, sha256) pairs, raises IntegrityError if not."""
    compiled = compile_recipe(recipe, toolchain, cache, log, remote, trust)
    cached = cache / compiled.key[:24]
    with staging_dir(cache / f"verify-{compiled.key[:24]}") as scratch:  # its own: two verifies at once
        try:
            fresh = scratch / "out"
            _compile(recipe, toolchain, fresh, log)
            want = json.loads((cached / "done.json").read_text())["sha256"]
            got = json.loads((fresh / "done.json").read_text())["sha256"]
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    differ = sorted(n for n in set(want) | set(got) if want.get(n) != got.get(n))
    if differ:
        raise IntegrityError(f"recompiling gives other bytes for {', '.join(differ)} than the "
                             f"{compiled.origin} outputs{' ' + str(compiled.artifact) if compiled.artifact else ''}: "
                             f"do not use them; rebuild without that cache")
    return sorted(want.items())
