"""The pinned base, opened: its filesystem read through the layer cache, and what the build, rebase,
track and bench read of it (its files, what an audit probe sees, its Python distributions)."""

from __future__ import annotations

import email.parser
import glob
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .. import untrusted
from ..base import inventory, spec as base_mod
from ..base.filesystem import BaseFilesystem
from ..base.layercache import LayerCache
from ..base.scan import normalize
from ..errors import BakeryError, IntegrityError
from ..inputs import overlays as overlays_mod
from ..oci.registry import Registry
from ..project import Project
from ..proofs.runner import BaseFiles
from ..trust.record import Distribution

DIST_INFO = "usr/local/lib/python3*/dist-packages/*.dist-info/METADATA"
DIST_RECORD = DIST_INFO.removesuffix("METADATA") + "RECORD"  # which files each distribution installed


@dataclass(frozen=True)
class OpenBase:
    """The base opened to derive from: its spec, registry, resolved image and merged files."""
    spec: base_mod.BaseSpec
    registry: Registry
    image: base_mod.Image
    fs: BaseFilesystem
    overlays: list | None = None  # overlays.yaml as loaded when the base was opened; None if it did not load


def registered_overlays(project: Path) -> list | None:
    """overlays.yaml loaded, or None when it does not load: whoever needs it reports why."""
    try:
        return overlays_mod.load(Project(project).overlays_yaml)
    except BakeryError:
        return None


def needed_files(project: Path, registered: list | None = None) -> tuple[str, ...]:
    """Every base file a build or rebase reads (as patterns): dist-info, overlay targets, what the
    proofs and probes read. Kept on a layer's first pass, so no layer is streamed twice."""
    registered = registered if registered is not None else registered_overlays(project)
    always = (DIST_INFO, DIST_RECORD) + inventory.PATTERNS
    if registered is None:
        return always
    paths = {o.target for o in registered} | {r for o in registered if o.proof for r in o.proof.reads} | \
        {c["path"] for o in registered for c in o.probe}
    return always + tuple(sorted(glob.escape(p.lstrip("/")) for p in paths))


def open_base(project: Path, override: str | None, log=print, mirror: str | None = None) -> OpenBase:
    """Resolve the pinned base (or --base, read from mirror when given) and open its filesystem
    through the layer cache; layers not yet indexed are streamed now, concurrently, once each."""
    spec = base_mod.load_spec(Project(project).base_yaml, override, mirror)
    registry = Registry(spec.source.registry)
    log(f"resolving base {spec.source}")
    image = base_mod.without_triggers(base_mod.resolve(registry, spec.source, spec.platform))
    registered = registered_overlays(project)  # loaded once: its checks are not free
    fs = BaseFilesystem(registry, image, LayerCache(), keep=needed_files(project, registered))
    fs.prefetch()
    fs.check_layers()
    fs.check_merge()  # what we read of it is what every engine unpacks, or the base is refused
    return OpenBase(spec, registry, image, fs, registered)


def base_files(base: OpenBase, paths) -> BaseFiles:
    """{image path: bytes} of the base's regular files (None where absent or not a regular file),
    naming the base: its proofs share a sandbox, keyed by it."""
    return BaseFiles(str(base.image.manifest_digest), regular_files(base.fs, paths))


def regular_files(fs: BaseFilesystem, paths) -> dict:
    """{path as given: bytes} of the regular files at those paths (None where absent or not one)."""
    paths = sorted(set(paths))
    found = fs.read(paths) if paths else {}
    return {p: (f.data if f is not None and f.kind in ("file", "hardlink") else None)
            for p, f in ((p, found.get(normalize(p))) for p in paths)}


def probe_files(fs: BaseFilesystem, paths) -> dict:
    """{path as given: what an audit probe reads there}: a regular file's bytes; None where nothing is,
    nor anything Python would import as that module instead; else what is there, described (a link or
    a folder at the path or above it, the module in another form), which no probe takes for the file
    or for its absence: the code could be reached through it."""
    paths = sorted(set(paths))
    found = fs.read(paths) if paths else {}
    above = {p: [str(a) for a in PurePosixPath(normalize(p)).parents if str(a) != "."] for p in paths}
    kinds = fs.kinds({a for folders in above.values() for a in folders})
    out: dict[str, bytes | str | None] = {}
    for p in paths:
        f = found.get(normalize(p))
        through = next(((a, k[0]) for a in above[p] if (k := kinds.get(a)) and k[0] != "dir"), None)
        if through:
            out[p] = f"under a {through[1]} (/{untrusted.safe(through[0])})"
        elif f is not None:
            out[p] = f.data if f.kind in ("file", "hardlink") else f"a {f.kind}"
        else:
            other = [q for pattern in overlays_mod.stand_in_patterns(p) for q in fs.glob(pattern)]
            other += [q for q, kind in fs.kinds(overlays_mod.package_shadows([p])).items() if kind]
            out[p] = f"the module as /{untrusted.safe(sorted(other)[0])}" if other else None
    return out


DIST_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,198}[A-Za-z0-9])?")  # PEP 508's, capped
# where DIST_INFO's * may lead: a plain name per folder (a vendored dist-info lies deeper, setuptools/_vendor/)
DIST_INFO_PATH = re.compile(r"usr/local/lib/python3\.[0-9]{1,3}/dist-packages/(?:[A-Za-z0-9_][A-Za-z0-9._+-]{0,250}/){0,16}"
                            r"[A-Za-z0-9][A-Za-z0-9._+-]{0,250}\.dist-info/METADATA")
DIST_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+!_-]{0,127}")  # PEP 440's characters and legacy ones
METADATA_LIMIT = 4 << 20  # a METADATA file is kilobytes: its headers are all we parse


def python_distributions(fs: BaseFilesystem) -> list[Distribution]:
    """Name and version of each Python distribution installed in the base, from its dist-info. They
    go into the SBOM and the signed record: a missing, non-ASCII or odd one refuses the base in one
    line, before anything is pushed."""
    found = fs.read(fs.glob(DIST_INFO), limit=METADATA_LIMIT)  # past it: its size, its bytes never held
    dists = []
    for path, f in sorted(found.items()):
        if not DIST_INFO_PATH.fullmatch(path):  # the glob's * takes any character, and the path is signed
            raise IntegrityError(f"the base's /{untrusted.safe(path)} is no dist-info folder's METADATA an installer "
                                 f"writes (folders named with letters, digits and ._+-): the base is refused (its SBOM "
                                 f"would name that path)")
        if f and f.kind in ("file", "hardlink") and f.size > METADATA_LIMIT:
            raise IntegrityError(f"the base's /{untrusted.safe(path)} is {f.size} bytes, past "
                                 f"{METADATA_LIMIT}: not a METADATA file; refused")
        if f and f.data:
            meta = email.parser.BytesParser().parsebytes(f.data, headersonly=True)
            who, fields = supplier(meta, path), {}
            for field, pattern in (("Name", DIST_NAME), ("Version", DIST_VERSION)):
                value = meta.get(field)
                if not isinstance(value, str) or not pattern.fullmatch(value):
                    said = "none" if value is None else repr(untrusted.safe(value, limit=80))
                    raise IntegrityError(f"the base's /{untrusted.safe(path)} has {field}: {said}, not a distribution "
                                         f"{field.lower()}: the base is refused (its SBOM could not name it)")
                fields[field.lower()] = value
            assert f.sha256 is not None  # a regular file read with its bytes
            dists.append(Distribution(fields["name"], fields["version"], "/" + path, f.sha256, who))
    return dists


def supplier(meta, path: str) -> str | None:
    """Who a METADATA says supplies the distribution: its Author, else its Maintainer, else the name
    (or address) of the first Author-email or Maintainer-email; None where it names no one."""
    for field in ("Author", "Maintainer", "Author-email", "Maintainer-email"):
        value = meta.get(field)
        if isinstance(value, str) and value.strip():
            value = " ".join(value.split())
            if field.endswith("email"):
                first = value.split(",")[0].strip()
                value = first.split("<")[0].strip().strip('"') or first.strip("<>")
            if len(value) > 200 or not value.isprintable():
                raise IntegrityError(f"the base's /{untrusted.safe(path)} has an {field} that is not one printable "
                                     f"line of at most 200 characters: the base is refused (its SBOM names it)")
            return value
    return None
