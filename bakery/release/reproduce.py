"""`invoke reproduce IMAGE@DIGEST`: rebuild a released digest from its signed provenance, on this
machine, trusting none of the original builder's outputs, and say whether the bytes are the same.

The provenance is opened only once its signature by the release keys holds. From it: the source
repository and revision, the pinned base, SOURCE_DATE_EPOCH and the toolchain the kernels were
compiled in. The revision is cloned into a fresh folder and built there with an empty cache,
compiling hip/ itself (never fetching the kernel artifact), into an OCI layout. Same manifest
digest: reproduced. Otherwise each differing layer is read on both sides and the files that
differ are named with both sha256. Plan and compare are pure; clone, build and read are I/O.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .. import broker_client, sandbox, untrusted
from ..errors import EnvironmentProblem, InputError, IntegrityError, malformed
from ..inputs.hip import Toolchain
from ..oci.refs import Descriptor, Digest, Reference
from ..trust import provenance
from ..trust.statement import Statement
from . import broker

OUTCOME_SCHEMA = "https://github.com/dsv4-mi300x/bakery/rebuild-outcome/v1"


@dataclass(frozen=True)
class Plan:
    """What the signed provenance says the digest was built from."""
    repository: str
    revision: str
    dirty: bool
    base: str
    epoch: int
    toolchain: str | None  # the image the kernels were compiled in: REF@sha256:DIGEST (or, recorded before, its digest)


def plan(prov: provenance.Provenance) -> Plan:
    with malformed("the signed provenance"):
        toolchains = {Toolchain.parse(b.annotations["toolchain"]).image for b in prov.byproducts
                      if "toolchain" in b.annotations}
        if len(toolchains) > 1:
            raise InputError(f"the provenance names {len(toolchains)} toolchains; a rebuild needs one")
        if prov.repository is None or prov.revision is None or prov.base is None or prov.source_date_epoch is None:
            raise IntegrityError("the signed provenance lacks its source, base or sourceDateEpoch")
        found = Plan(prov.repository, prov.revision, prov.dirty is not False, prov.base, prov.source_date_epoch,
                     next(iter(toolchains), None))
    if not re.fullmatch(r"[0-9a-f]{40}", found.revision):
        raise IntegrityError(f"the provenance's revision {found.revision[:60]!r} is not a git commit id")
    if found.toolchain and not (re.fullmatch(r"sha256:[0-9a-f]{64}", found.toolchain) or "@sha256:" in found.toolchain):
        raise IntegrityError(f"the provenance's toolchain {found.toolchain[:80]!r} is not pinned by content "
                             f"(REF@sha256:...): give --toolchain to choose the compiler yourself")
    return found


def toolchain_ref(p: Plan) -> str | None:
    """Where a fresh machine reads the toolchain's files from. Recorded as the pinned reference the
    build read it from; a record of an earlier build may name its digest alone, which is the base's
    when the release compiled in the ROCm base: then the base's reference names it."""
    if p.toolchain and "@" not in p.toolchain and p.base.endswith("@" + p.toolchain):
        return p.base
    return p.toolchain


def signed_provenance(store, ref: Reference, policy) -> provenance.Provenance:
    """The SLSA provenance of ref, once the image signature and the statement's signature hold and
    what it says passes the policy (an allowed source repository and builder, the pinned base, a
    clean checkout unless the policy allows dirty): what it names is cloned and run here."""
    from ..trust import verify

    report = verify.Report()
    verify._signature(store, ref, policy, report)
    found = verify._attestations(store, ref, policy, report)
    if provenance.SLSA_PREDICATE in found:
        verify._provenance(found[provenance.SLSA_PREDICATE], store.manifest(str(ref.digest)) or b"{}", policy, report)
    if report.failures:
        raise IntegrityError(f"{ref}: {report.failures[0]}: its provenance cannot be trusted to rebuild from")
    if provenance.SLSA_PREDICATE not in found:
        raise IntegrityError(f"{ref}: no signed SLSA provenance to rebuild from")
    return found[provenance.SLSA_PREDICATE]


FULL_DISK = ("No space left on device", "Disk quota exceeded")  # strerror of ENOSPC and EDQUOT


def _git(*args: str, writes: Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    """git's output; its failure as one line, naming the folder it `writes` when the disk filled (git's
    last line then is often another process's complaint, e.g. fetch-pack's "invalid index-pack output").
    A revision's git runs through _revision_git, which gives it its isolated `env`."""
    # errors="replace": the server's sideband text is any bytes; one that is not UTF-8 is no crash
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, errors="replace", env=env)
    if done.returncode != 0:
        command = next(a for a in args if not a.startswith("-") and "=" not in a)  # past the -c NAME=VALUE
        said = done.stderr.strip().splitlines() or ["failed"]
        # the server's words (the revision's repository, named by the provenance being checked) say
        # nothing of our disk: its `remote:` lines, its `fatal: remote error:` (an ERR packet), and every
        # line after the first of them, which may be more of its text: git keeps the line breaks in it,
        # and splitlines() breaks lines at \x1c, \x85, \u2028 ... too, which git passes through
        heard = next((i for i, line in enumerate(said) if line.startswith(("remote:", "fatal: remote error:"))),
                     len(said))
        full = next((why for why in FULL_DISK for line in said[:heard] if why in line), None)
        if full:
            raise EnvironmentProblem(f"the disk is full at {writes} (git {command}: {full}): free space there, or "
                                     f"give --workdir (or TMPDIR) on a larger disk")
        last = said[-1]
        if not last.startswith("fatal: remote error:") and any(line.startswith("fatal: remote error:")
                                                               for line in said):
            last = f"remote: {last}"  # more of the ERR packet's text: git died on it, and wrote nothing after
        raise EnvironmentProblem(f"git {command}: {untrusted.safe(last, limit=300)}")
    return done.stdout.strip()


# Every git run on a revision (ours, outside the sandbox) reads no configuration but its own command
# line and the clone's .git/config, which git writes and the remote does not: no system file (where
# `git lfs install --system`, run by Debian's git-lfs package and on GitHub's runners, defines the lfs
# filter that a committed .gitattributes and .lfsconfig turn into requests to any URL), no global file
# or home (hooks, fsmonitor, credential helpers, url.*.insteadOf, core.autocrlf, ~/.netrc). On top,
# should a configuration still come through: filters, hooks and fsmonitor off, no helper, and only
# the protocols a fetch of the provenance's repository needs (https; file: a local path or file://).
GIT_PROTOCOLS = ("file", "https")
GIT_OPTIONS = ("-c", "protocol.allow=never", *(a for p in GIT_PROTOCOLS for a in ("-c", f"protocol.{p}.allow=always")),
               "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-c", "credential.helper=",
               "-c", "filter.lfs.smudge=", "-c", "filter.lfs.clean=", "-c", "filter.lfs.process=",
               "-c", "filter.lfs.required=false")


def git_env(config: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a revision's git: ours (PATH, LANG, proxies) less every GIT_* variable
    (GIT_CONFIG_PARAMETERS, GIT_CONFIG_COUNT, GIT_SSH_COMMAND, GIT_TEMPLATE_DIR, ... would each bring
    configuration or commands back) and the askpass programs; no system or global configuration, and
    a HOME (and XDG_CONFIG_HOME) under which nothing is or can be: /dev/null. config: settings of
    ours for it (GIT_CONFIG_COUNT and its pairs: in the environment, which only this user can read,
    not on the command line, which /proc shows everyone)."""
    kept = {name: value for name, value in os.environ.items()
            if not name.startswith("GIT_") and name not in ("SSH_ASKPASS", "XDG_CONFIG_HOME")}
    pairs = sorted((config or {}).items())
    given = {f"GIT_CONFIG_{what}_{i}": text for i, (key, value) in enumerate(pairs)
             for what, text in (("KEY", key), ("VALUE", value))}
    return {**kept, "HOME": os.devnull, "XDG_CONFIG_HOME": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0", "GIT_LFS_SKIP_SMUDGE": "1",
            "GIT_ALLOW_PROTOCOL": ":".join(GIT_PROTOCOLS), **({"GIT_CONFIG_COUNT": str(len(pairs))} if pairs else {}),
            **given}


def _revision_git(*args: str, writes: Path, cwd: Path | None = None, config: dict[str, str] | None = None) -> str:
    """_git, run on a revision's bytes: isolated (GIT_OPTIONS, git_env(config)); it fetches and checks
    out and runs nothing the revision names."""
    return _git(*GIT_OPTIONS, *args, writes=writes, cwd=cwd, env=git_env(config))


def host_rewrite(url: str) -> tuple[str, str] | None:
    """(base, prefix) of this host's own git configuration's url.<base>.insteadOf rule that git would
    apply to url (the longest prefix), or None: a mirror the operator set. The revision's git reads no
    configuration, so the rule is handed to it in its environment: git then clones from the mirror
    and keeps the original address (a token in the mirror's is never written into the clone, which
    the sandbox reads). The commit's id still names the bytes, wherever they come from."""
    # this host's system and global files (no repository's: from /), as the operator's git reads them
    done = subprocess.run(["git", "config", "-z", "--get-regexp", r"^url\..*\.insteadof$"], capture_output=True,
                          cwd="/")
    best = None
    for record in done.stdout.decode(errors="replace").split("\0") if done.returncode == 0 else []:
        key, _, prefix = record.partition("\n")  # -z: the key, a line break, the value
        base = key[len("url."):-len(".insteadof")]
        if prefix and base and url.startswith(prefix) and (best is None or len(prefix) > len(best[1])):
            best = (base, prefix)
    return best


def mirror_config(base: str, prefix: str) -> dict[str, str]:
    """The revision's git's settings for this host's mirror rule: url.<base>.insteadOf, with any
    user:password taken out of the mirror's address into an Authorization header (http.<base>.
    extraHeader). git names the rewritten address on its remote helper's command line
    (`git remote-https origin URL`), which any local user reads in /proc for the whole fetch; the
    header stays in the environment, which only this user can read."""
    import base64
    import urllib.parse

    try:
        parts = urllib.parse.urlsplit(base)
    except ValueError as e:
        raise InputError(f"this host's git mirror rule url.<base>.insteadOf names a base that is not a URL ({e}): "
                         f"fix it in the git configuration") from None
    if parts.username is None and parts.password is None:
        return {f"url.{base}.insteadOf": prefix}
    bare = urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    pair = urllib.parse.unquote_to_bytes(parts.username or "") + b":" + urllib.parse.unquote_to_bytes(parts.password or "")
    # git copies an extra header to whatever host a redirect moves the fetch to: none is followed
    return {f"url.{bare}.insteadOf": prefix,
            f"http.{bare}.extraHeader": "Authorization: Basic " + base64.b64encode(pair).decode(),
            f"http.{bare}.followRedirects": "false"}


WORKDIR_MARK = ".bakery-rebuild"  # in a --workdir: a rebuild made it, and one holds its lock while it runs


@contextmanager
def claimed(workdir: Path):
    """workdir held for one rebuild: locked against a second run at once, and what a stopped run left
    there (its source/ and build/, killed or failed) removed so this one starts from nothing (git would
    not clone into them). A folder holding anything a rebuild did not make is refused, never cleared."""
    import fcntl

    from ..files import remove_tree

    try:
        workdir.mkdir(parents=True, exist_ok=True)
        mark = workdir / WORKDIR_MARK
        others = sorted(set(os.listdir(workdir)) - {WORKDIR_MARK})
        if others and not mark.is_file():
            raise InputError(f"{workdir} holds {others[0]!r} and was not made by a rebuild: give a new or empty "
                             f"--workdir (a rebuild removes what an earlier one left there)")
        held = os.open(mark, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as e:
        raise EnvironmentProblem(f"{workdir}: {e.strerror}: give another --workdir") from None
    try:
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise EnvironmentProblem(f"another reproduce is rebuilding in {workdir}: wait for it, or give another "
                                     f"--workdir") from None
        for left in (workdir / "source", workdir / "build"):
            try:
                if left.is_symlink() or left.is_file():
                    left.unlink()  # removed, never followed
                elif left.exists():
                    remove_tree(left)  # through the 0500 folders a rebuild may leave, for any user
            except OSError as e:
                raise EnvironmentProblem(f"{left}, left by an earlier rebuild, cannot be removed ({e.strerror or e}): "
                                         f"remove it, or give another --workdir") from None
        yield workdir
    finally:
        os.close(held)


def rebuild(p: Plan, workdir: Path, toolchain: str | None, log, named: Path | None = None) -> Path:
    """The OCI layout of the revision built here from nothing: a fresh clone, an empty cache, the
    kernels compiled (the artifact the original used is never fetched). The revision's code is
    what a rebuilder exists to distrust: it runs in the sandbox (no key, password, credential,
    Docker socket or network; uid 65534 of its own namespaces; limits), and reaches the base and
    the compiler only through the broker (broker.py). git, ours, clones it out here, in a workdir the
    caller holds (claimed()). `named`: the
    folder a full disk's error names (a temporary workdir is gone by then: its TMPDIR)."""
    source = workdir / "source"
    log(f"cloning {p.repository} at {p.revision[:12]}")
    rewrite = host_rewrite(p.repository)
    mirror = mirror_config(*rewrite) if rewrite else None  # a token may be in its address
    if rewrite:
        log("cloning it from this host's mirror (its url.*.insteadOf)")
    _revision_git("clone", "-q", "--no-checkout", "--", p.repository, str(source), writes=named or workdir,
                  config=mirror)
    _revision_git("-c", "core.symlinks=true", "checkout", "-q", "--detach", p.revision, cwd=source,
                  writes=named or workdir)
    _readable_by_all(source)  # as root, the build runs as the host's uid 65534, whatever the umask
    hip_dir = source / "hip"
    if hip_dir.is_symlink() or not hip_dir.is_dir():  # docker would bind where a link points: the host
        raise IntegrityError(f"{p.revision[:12]}'s hip/ is not a folder of the checkout (a link?): not compiled")
    build = workdir / "build"
    # each bound on its own, so the code inside cannot swap one for a link; the layout and the
    # record go in `output` (the layout is written beside itself, then renamed into place)
    writable = [build / name for name in ("output", "cache", "tmp", "broker")]
    for folder in writable:
        folder.mkdir(parents=True, exist_ok=True)
    layout = build / "output" / "layout"
    tools = toolchain or toolchain_ref(p)
    if tools and "@" in tools:  # as the build inside names it when it asks the broker to compile
        tools = str(Reference.parse_pinned(tools, "toolchain image"))
    base = Reference.parse_pinned(p.base, "the provenance's base")
    grant = broker.Grant(base.registry, base.repository, tools, hip_dir)
    argv = [sys.executable, "-m", "invoke", "--search-root", str(source), "build", "--base", p.base,
            "--layout", str(layout), "--out", str(build / "output" / "out"), "--recompile"] \
        + (["--toolchain", tools] if tools else [])
    log(f"building {p.revision[:12]} in the sandbox with an empty cache (SOURCE_DATE_EPOCH={p.epoch})")
    problems: list[str] = []  # this machine's, met by the broker
    with broker.serve(build / "broker", grant, problems) as socket_path:
        env = {"SOURCE_DATE_EPOCH": str(p.epoch), "BAKERY_CACHE": str(build / "cache"), "TMPDIR": str(build / "tmp"),
               broker_client.SOCKET_ENV: str(socket_path),
               # the checkout is ours (root's, when root), read by another uid: git asks to be told
               "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": str(source)}
        try:
            done = sandbox.run(argv, [source], None, sandbox.REBUILD, env=env, writable=writable)
        except subprocess.TimeoutExpired:
            raise EnvironmentProblem(f"the rebuild ran past {sandbox.REBUILD.seconds:.0f} s: stopped") from None
        finally:
            disarm(build)
    if done.returncode != 0 and problems:
        raise EnvironmentProblem(problems[0])
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise EnvironmentProblem(f"the rebuild failed (exit {done.returncode}): {said[:500]}")
    plain_tree(layout)  # the revision's code made it: nothing of it, itself included, is read through a link
    return layout


def _readable_by_all(root: Path) -> None:
    """Our clone, made readable by others (folders o+rx, files o+r); links are left alone."""
    import stat

    for folder, dirs, files in os.walk(root, followlinks=False):
        for name in [*dirs, *files, "."]:
            path = os.path.join(folder, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISDIR(mode):
                os.chmod(path, stat.S_IMODE(mode) | 0o055)
            elif stat.S_ISREG(mode):
                os.chmod(path, stat.S_IMODE(mode) | 0o044)


def plain_tree(root: Path) -> None:
    """root and every entry under it a folder or a regular file, each listed: a link (to a host
    file or a store named by digest), a FIFO (a read that never ends), a device or a folder we
    cannot list would make us read what the sandboxed code chose. Checked once its code has ended:
    nothing inside is alive to swap them after."""
    import stat

    def refuse(what: str):
        raise IntegrityError(f"the rebuilt layout holds {what[:200]!r}, which is not a folder or a regular file we "
                             f"can read: refused (the rebuilt revision is hostile)")

    try:
        if not stat.S_ISDIR(os.lstat(root).st_mode):
            refuse(".")
    except FileNotFoundError:
        raise IntegrityError("the rebuild ended well but wrote no layout: refused") from None

    def unlistable(error: OSError):
        refuse(os.path.relpath(error.filename or str(root), root))

    for folder, dirs, files in os.walk(root, followlinks=False, onerror=unlistable):
        for name in dirs + files:
            mode = os.lstat(os.path.join(folder, name)).st_mode
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                refuse(os.path.relpath(os.path.join(folder, name), root))


def disarm(build: Path) -> None:
    """Clear set-user-ID and set-group-ID bits the sandboxed code set on what it wrote (run by
    root, its files are root's: a setuid-root binary left in the kept work folder)."""
    import stat

    for folder, _dirs, files in os.walk(build, followlinks=False):
        for name in files:
            path = os.path.join(folder, name)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue  # a link or a FIFO: no bit to clear, and plain_tree refuses it where it matters
            try:
                mode = os.fstat(fd).st_mode
                if stat.S_ISREG(mode) and mode & (stat.S_ISUID | stat.S_ISGID):
                    os.fchmod(fd, stat.S_IMODE(mode) & ~(stat.S_ISUID | stat.S_ISGID))
            finally:
                os.close(fd)


def _files(store, desc: Descriptor, budget: list[int] | None = None) -> dict[str, str]:
    """{path as the layer names it: what it is} for every entry of one layer: a regular file's
    sha256, else its kind and target; its mode too when not 0644/0755. Read by tarscan, streamed,
    as the engine would unpack it (either side may be hostile: the original's registry, the
    rebuilt revision). budget: [bytes] a whole comparison's layers may still unpack to, charged."""
    from ..base.scan import ENTRIES_LIMIT, NAMES_LIMIT, decompressed  # a layer compared is no larger than one indexed
    from ..oci.tarscan import HAS_DATA, TarError, TarReader

    files, names = {}, 0
    limit = min(unpacked_limit(desc), budget[0]) if budget is not None else unpacked_limit(desc)
    chunks = _Chunks(store.stream(desc))
    # the size a manifest claims is checked only at the blob's end: the cap grows with the compressed
    # bytes actually read (32 times them, the floor at least), never past the claimed size's cap
    stream = _Capped(decompressed(desc.media_type, io.BufferedReader(chunks, 1 << 20)), limit,
                     lambda: max(UNPACKED_FLOOR, UNPACKED_RATIO * chunks.read_so_far))
    reader = TarReader(stream)
    try:
        for member in reader:
            if member.type in HAS_DATA:
                h = hashlib.sha256()
                for chunk in reader.data(member):
                    h.update(chunk)
                what = h.hexdigest()
            else:
                kind = "link" if member.type in (b"1", b"2") else "entry"
                what = f"{kind} {member.type!r} {member.linkname}"
            if member.mode not in (0o644, 0o755):
                what += f" (mode {member.mode:o})"
            files[member.name] = what
            names += len(member.name) + len(what)
            if len(files) > ENTRIES_LIMIT or names > NAMES_LIMIT:
                raise TarError(f"more than {ENTRIES_LIMIT} entries or {NAMES_LIMIT} characters of names")
    except TarError as e:
        raise IntegrityError(f"layer {desc.digest} cannot be compared ({e}): refused") from None
    except _TooLarge:
        if budget is not None and limit == budget[0] < unpacked_limit(desc):
            raise IntegrityError(f"the rebuilt layers unpack to more than the original's layers may (layer "
                                 f"{desc.digest} reached it): not compared, refused") from None
        raise IntegrityError(f"layer {desc.digest} unpacks to more than {limit:,} bytes from {desc.size:,} "
                             f"compressed (a layer may unpack to {UNPACKED_RATIO} times its size, at least "
                             f"{UNPACKED_FLOOR >> 20} MiB, at most {UNPACKED_LIMIT >> 30} GiB): not compared, "
                             f"refused") from None
    finally:
        if budget is not None:
            budget[0] -= stream.given
    return files


# What a layer compared may unpack to. This runs outside the rebuild's sandbox and its time limit,
# on layers either side may have made: a gzip of zeros unpacks 1,000 times its size, one of 64 MiB
# to 64 GiB, minutes of gunzip and sha256. Image layers compress 2 to 5 times (text and binaries);
# 32 times allows a layer of mostly zeros, the floor any small layer, the ceiling a ROCm base's
# largest layer (about 10 GiB unpacked) several times over.
UNPACKED_RATIO = 32
UNPACKED_FLOOR = 1 << 30
UNPACKED_LIMIT = 64 << 30


def unpacked_limit(desc: Descriptor) -> int:
    return min(max(desc.size * UNPACKED_RATIO, UNPACKED_FLOOR), UNPACKED_LIMIT)


class _TooLarge(Exception):
    """A layer that unpacks past unpacked_limit."""


class _Capped:
    """A stream that gives at most `limit` bytes, then raises _TooLarge (before handing on more)."""

    def __init__(self, stream, limit: int, allowed=None):
        self.stream, self.limit, self.given = stream, limit, 0
        self.allowed = allowed or (lambda: limit)  # what may be given by now (of what was read)

    def read(self, n: int) -> bytes:
        data = self.stream.read(min(n, self.limit + 1 - self.given))
        self.given += len(data)
        if self.given > min(self.limit, self.allowed()):
            raise _TooLarge()
        return data



class _Chunks(io.RawIOBase):
    """A file over an iterator of byte chunks (a blob as the store streams it, digest-checked)."""

    def __init__(self, chunks):
        self.chunks, self.rest, self.read_so_far = iter(chunks), b"", 0

    def readable(self) -> bool:
        return True

    def readinto(self, out) -> int:
        while not self.rest:
            piece = next(self.chunks, None)
            if piece is None:
                return 0
            self.rest = piece
            self.read_so_far += len(piece)
        n = min(len(out), len(self.rest))
        out[:n], self.rest = self.rest[:n], self.rest[n:]
        return n


# What a comparison lists: the rebuilt layers past the original's count by more than EXTRA_LAYERS
# are named, not unpacked (a hostile revision's manifest may list one small layer 25,000 times), and
# each differing layer names its first FILES_LISTED differing files and counts the rest
EXTRA_LAYERS = 4
FILES_LISTED = 1000


def differences(original, original_manifest: bytes, rebuilt, rebuilt_manifest: bytes) -> list[dict]:
    """Per differing layer: its index, both digests, and the files that differ (path, both sha256;
    None where a side lacks the file). The config is compared too (it holds the diff_ids). The
    rebuilt side is the revision's own making: its layers together may unpack to no more than the
    original's may, each distinct layer is unpacked once, and past the original's count by more than
    EXTRA_LAYERS they are named only."""
    a, b = json.loads(original_manifest), json.loads(rebuilt_manifest)
    out: list[dict] = []
    layers_a, layers_b = a.get("layers", []), b.get("layers", [])
    budget = [sum(unpacked_limit(Descriptor.from_json(d)) for d in layers_a) or UNPACKED_FLOOR]
    seen: dict[str, int] = {}  # a rebuilt layer's digest: the index it was compared at
    for i in range(min(max(len(layers_a), len(layers_b)), len(layers_a) + EXTRA_LAYERS)):
        da = Descriptor.from_json(layers_a[i]) if i < len(layers_a) else None
        db = Descriptor.from_json(layers_b[i]) if i < len(layers_b) else None
        if da and db and da.digest == db.digest:
            continue
        row: dict = {"layer": i, "original": str(da.digest) if da else None, "rebuilt": str(db.digest) if db else None}
        if db and str(db.digest) in seen:
            out.append({**row, "files": [], "same_as_layer": seen[str(db.digest)]})
            continue
        if db:
            seen[str(db.digest)] = i
        fa = _files(original, da) if da else {}
        fb = _files(rebuilt, db, budget) if db else {}
        changed = [{"path": path, "original": fa.get(path), "rebuilt": fb.get(path)}
                   for path in sorted(set(fa) | set(fb)) if fa.get(path) != fb.get(path)]
        out.append({**row, "files": changed[:FILES_LISTED]}
                   | ({"more_files": len(changed) - FILES_LISTED} if len(changed) > FILES_LISTED else {}))
    if len(layers_b) > len(layers_a) + EXTRA_LAYERS:
        out.append({"layer": f"{len(layers_a) + EXTRA_LAYERS}..", "original": None,
                    "rebuilt": f"{len(layers_b) - len(layers_a) - EXTRA_LAYERS} more layers, not unpacked",
                    "files": []})
    if a.get("config", {}).get("digest") != b.get("config", {}).get("digest") and not out:
        out.append({"layer": "config", "original": a["config"]["digest"], "rebuilt": b["config"]["digest"], "files": []})
    if not out and original_manifest != rebuilt_manifest:  # the same layers and config, another manifest
        out.append({"layer": "manifest", "original": str(Digest.of(original_manifest)),
                    "rebuilt": str(Digest.of(rebuilt_manifest)), "files": []})
    return out


def rebuilt_digest(layout: Path) -> tuple[Digest, bytes]:
    """The rebuilt manifest's digest, as its bytes hash (the layout's index only points at it)."""
    from ..oci.store import LayoutStore

    store = LayoutStore(layout)
    with malformed("the rebuilt layout's index.json"):
        (entry,) = json.loads(store._read_document(layout / "index.json", "the rebuilt layout's"))["manifests"]
        digest = Digest.parse(entry["digest"])
    body = store._read_document(layout / "blobs" / "sha256" / digest.hex, "the rebuilt layout's manifest")
    if Digest.of(body) != digest:
        raise IntegrityError(f"the rebuilt layout's manifest does not hash to {digest}")
    return digest, body


def statement(ref: Reference, p: Plan, result: Digest, diffs: list[dict]) -> bytes:
    """The rebuilder's in-toto statement about ref: what was rebuilt, from which revision and
    inputs, on what machine, what it gave, and whether that is ref's digest."""
    import platform

    from .. import __version__

    predicate = {"rebuilt": {"source": {"repository": p.repository, "revision": p.revision}, "base": p.base,
                             "sourceDateEpoch": p.epoch, "toolchain": p.toolchain},
                 "builder": {"host": platform.node(), "system": platform.platform(), "bakery": __version__},
                 "result": str(result), "match": result == ref.digest,
                 "differences": [{"layer": d["layer"], "files": [f["path"] for f in d["files"]]} for d in diffs]}
    return Statement.about(ref, provenance.REBUILD_PREDICATE, predicate).raw


def write_outcome(path: Path, ref: Reference, manifest: bytes, diffs: list[dict]) -> None:
    """What a rebuild gave, for a signer elsewhere: the rebuilt manifest itself (the signer hashes
    it) and the differences (shown, never trusted)."""
    import base64

    from ..oci.layer import write_blob

    write_blob(path, json.dumps({"schema": OUTCOME_SCHEMA, "image": str(ref),
                                 "manifest": base64.b64encode(manifest).decode(),
                                 "differences": diffs}, indent=1).encode())


def read_outcome(path: Path, ref: Reference) -> tuple[bytes, list[dict]]:
    import base64

    from ..schema import load_json

    doc = load_json(path, OUTCOME_SCHEMA, "rebuild outcome", "run `invoke reproduce --outcome FILE` first")
    with malformed(f"rebuild outcome {path}", InputError):
        if doc["image"] != str(ref):
            raise ValueError(f"it is about {doc['image']}, not {ref}")
        return base64.b64decode(doc["manifest"], validate=True), list(doc["differences"])
