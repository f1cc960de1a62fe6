"""What a base holds, as scanners name it: its operating system (os-release), its dpkg packages
with the licenses their copyright files state, and which Python distribution owns a file (its
RECORD). Read from the layers through the merged view, never by running base code.

The parsers in the middle are pure; the readers at the edge (`operating_system`, `debian_packages`,
`owners`) take a BaseFilesystem. What they give is JSON-shaped: the build record's types check it
on load. A base whose package data a scanner would read one way and we another is refused in one
line rather than described wrongly.
"""

from __future__ import annotations

import base64
import csv
import posixpath
import re
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import Any

from .. import untrusted
from ..errors import IntegrityError

OS_RELEASE = ("etc/os-release", "usr/lib/os-release")  # os-release(5): the first, else the second
DPKG_STATUS = "var/lib/dpkg/status"
DPKG_STATUS_D = "var/lib/dpkg/status.d/*"  # one file per package, as distroless images write them
COPYRIGHT = "usr/share/doc/*/copyright"
DOC = "usr/share/doc/"
# kept on a layer's first pass (pipeline.needed_files): the SBOM costs no second stream
PATTERNS = OS_RELEASE + (DPKG_STATUS, DPKG_STATUS_D, COPYRIGHT)

OS_RELEASE_LIMIT = 64 << 10
STATUS_LIMIT = 64 << 20  # a status file of 10,000 packages is about 10 MiB
PACKAGES_LIMIT = 50_000
COPYRIGHT_LIMIT = 4 << 20  # past it a copyright file is refused (the largest in the fixture, Debian 12, is 108 KiB)
FIELD_LIMIT = 256
LICENSES_LIMIT = 256  # names one copyright file may state: the most in Debian 12 is a few dozen
# a RECORD is held whole and parsed a row at a time, RECORD_BATCH of them read at once: at most
# 128 MiB of a hostile base's RECORDs in memory (at 64 MiB, 64 at once and parsed into lists, it was
# about 82 bytes a byte). The largest real ones are under 3 MiB: torch's 1.4, amd_aiter's 1.5,
# kubernetes_validate's 2.5.
RECORD_LIMIT = 8 << 20
RECORD_BATCH = 16
BATCH = 64  # files read at once: a hostile base's many large files are never all in memory

OS_ID = re.compile(r"[a-z0-9._-]{1,64}")  # os-release(5): ID and VERSION_ID's characters
OS_VERSION_ID = re.compile(r"[a-zA-Z0-9._~-]{1,64}")
FIELD_NAME = re.compile(r"[!-9;-~]+")
STATUS_D_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9+._:-]{0,127}")  # status.d/PACKAGE[:ARCH]
DEB_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]{0,127}")  # Debian policy 5.6.1 and 5.6.7
DEB_VERSION = re.compile(r"[A-Za-z0-9.+~:-]{1,128}")
DEB_ARCH = re.compile(r"[a-z0-9-]{1,32}")
DEB_SOURCE = re.compile(r"([a-z0-9][a-z0-9+.-]{0,127})(?: \(([A-Za-z0-9.+~:-]{1,128})\))?")
LICENSE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
COMMON_LICENSES = re.compile(r"/usr/share/common-licenses/([A-Za-z0-9][A-Za-z0-9._+-]{0,63})")


def _refuse(path: str, what: str) -> IntegrityError:
    return IntegrityError(f"the base's /{untrusted.safe(path)} {what}: the base is refused (its SBOM could not "
                          f"name it as scanners do)")


def _text(data: bytes, path: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise _refuse(path, "is not UTF-8") from None


def parse_os_release(text: str, path: str) -> dict:
    """ID, VERSION_ID, NAME of an os-release file (shell-style assignments, values maybe quoted)."""
    fields = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        fields[key] = value
    os_id, version = fields.get("ID", "linux"), fields.get("VERSION_ID")
    if not OS_ID.fullmatch(os_id) or (version is not None and not OS_VERSION_ID.fullmatch(version)):
        raise _refuse(path, f"gives ID={untrusted.safe(os_id, limit=70)!r} VERSION_ID="
                            f"{untrusted.safe(version, limit=70)!r}, not what os-release(5) allows")
    name = fields.get("NAME") or os_id
    if len(name) > FIELD_LIMIT or not name.isprintable():
        raise _refuse(path, "gives a NAME that is not one printable line")
    return {"id": os_id, "version_id": version, "name": name, "path": "/" + path}


# the folders the OS and dpkg data lie in: where a base makes one a link (/var/lib/dpkg -> /opt/dpkg,
# /etc -> usr/etc), dpkg, syft and trivy read what lies behind it, and bakery, which follows no link
# in a base, would read nothing there: such a base is refused
DATA_FOLDERS = ("etc", "usr", "usr/lib", "usr/share", "usr/share/doc", "var", "var/lib", "var/lib/dpkg",
                "var/lib/dpkg/status.d")


def _folders_are_folders(fs) -> None:
    for path, found in fs.kinds(DATA_FOLDERS).items():
        if found is not None and found[0] != "dir":
            kind, target = found
            raise _refuse(path, f"is a {kind}" + (f" to {untrusted.safe(target, limit=80)!r}" if kind == "symlink" else "")
                          + ", not a folder: dpkg and the scanners read the OS and its packages through it, and "
                            "bakery follows no link in a base")


def operating_system(fs) -> dict | None:
    """The base's os-release, read as os-release(5) says: /etc's if it is a file, else /usr/lib's.
    /etc's may be a link only to /usr/lib's (as on Debian): a link elsewhere, which the engines'
    readers follow and we do not, is refused, as is a link at a folder above it. None where the base
    has neither."""
    _folders_are_folders(fs)
    found = fs.read(OS_RELEASE, limit=OS_RELEASE_LIMIT)
    etc = found.get(OS_RELEASE[0])
    if etc is not None and etc.kind == "symlink":
        if posixpath.normpath(posixpath.join("/etc", etc.linkname)) != "/" + OS_RELEASE[1]:
            raise _refuse(OS_RELEASE[0], f"is a link to {untrusted.safe(etc.linkname, limit=80)!r}, not to "
                                         f"/{OS_RELEASE[1]}")
        etc = None
    for path, f in ((OS_RELEASE[0], etc), (OS_RELEASE[1], found.get(OS_RELEASE[1]))):
        if f is None:
            continue
        if f.kind not in ("file", "hardlink"):
            raise _refuse(path, f"is a {f.kind}, not a file")
        if f.data is None:
            raise _refuse(path, f"is {f.size} bytes, past {OS_RELEASE_LIMIT}: not an os-release file")
        return parse_os_release(_text(f.data, path), path)
    return None


def stanzas(text: str, path: str) -> list[dict]:
    """The paragraphs of a deb822 file (dpkg's status), each {field name in lower case: value};
    continuation lines are joined with newlines. Field names are case-insensitive (deb822(5)), so a
    name given twice in any case is refused, as is a line of only whitespace (dpkg ends a paragraph
    there, trivy does not)."""
    fields: dict[str, Any]
    out, fields, last = [], {}, None
    for line in text.split("\n"):
        if not line:
            if fields:
                out.append({k: "\n".join(v) for k, v in fields.items()})
            fields, last = {}, None
        elif not line.strip(" \t"):
            raise _refuse(path, "has a line of only whitespace: dpkg's readers would not agree where a package ends")
        elif line[0] in " \t":
            if last is None:
                raise _refuse(path, "has a continuation line before any field")
            fields[last].append(line.strip(" \t"))  # joined once: a long field costs its length, not its square
        else:
            key, sep, value = line.partition(":")
            if not sep or not FIELD_NAME.fullmatch(key):  # deb822(5): US-ASCII, no space or colon
                raise _refuse(path, f"has a line that is no field: {untrusted.safe(line, limit=60)!r}")
            if key.lower() in fields:
                raise _refuse(path, f"gives {untrusted.safe(key, limit=40)} twice in one package: dpkg's readers "
                                    f"would not agree which counts")
            last = key.lower()
            fields[last] = [value.strip(" \t")]
        if len(out) > PACKAGES_LIMIT:
            raise _refuse(path, f"lists more than {PACKAGES_LIMIT:,} packages")
    if fields:
        out.append({k: "\n".join(v) for k, v in fields.items()})
    return out


def _field(fields: dict, key: str, pattern: re.Pattern, path: str) -> str:
    value = fields.get(key.lower(), "")
    if not pattern.fullmatch(value):
        said = repr(untrusted.safe(value, limit=80)) if value else "none"
        raise _refuse(path, f"gives package {untrusted.safe(fields.get('package', '?'), limit=80)} the {key} "
                            f"{said}, which is not a Debian {key.lower()}")
    return value


GONE = ({"deinstall", "purge"}, {"not-installed", "config-files"})  # removed: only config files left, if any


def package(fields: dict, path: str) -> dict | None:
    """One installed package of a status paragraph, or None where dpkg has removed it (its config
    files may remain). A paragraph without a Status is a status.d file's: installed. Any state but
    installed (held or not) is refused (half-installed, unpacked, triggers pending, wanted removed
    but still installed): trivy lists such a package by what is wanted, syft and dpkg by what is on
    disk."""
    status = fields.get("status", "install ok installed").split()
    if len(status) != 3:
        raise _refuse(path, f"gives a Status {untrusted.safe(fields['status'], limit=60)!r}, not WANT FLAG STATE")
    if status[0] in GONE[0] and status[2] in GONE[1]:
        return None
    if status[0] not in ("install", "hold") or status[1:] != ["ok", "installed"]:  # held: installed, kept
        raise _refuse(path, f"gives package {untrusted.safe(fields.get('package', '?'), limit=80)} the Status "
                            f"{' '.join(status)!r}: scanners would not agree whether it is installed")
    name = _field(fields, "Package", DEB_NAME, path)
    version = _field(fields, "Version", DEB_VERSION, path)
    arch = _field(fields, "Architecture", DEB_ARCH, path)
    source, source_version = name, version
    if "source" in fields:
        m = DEB_SOURCE.fullmatch(fields["source"])
        if not m:
            raise _refuse(path, f"gives package {name} the Source {untrusted.safe(fields['source'], limit=80)!r}, "
                                f"not NAME or NAME (VERSION)")
        source, source_version = m.group(1), m.group(2) or version
    maintainer = fields.get("maintainer", "")
    if len(maintainer) > FIELD_LIMIT or not maintainer.isprintable():
        raise _refuse(path, f"gives package {name} a Maintainer that is not one printable line")
    return {"name": name, "version": version, "arch": arch, "source": source, "source_version": source_version,
            "maintainer": maintainer or None, "licenses": [], "status": "/" + path}


def license_names(text: str, path: str = "copyright") -> list[str]:
    """The license short names a copyright file states: each `License:` line of a machine-readable
    one (DEP-5), split at `or`, `and`, `,` and `|`, with any `with ... exception` dropped, and each
    /usr/share/common-licenses/NAME it points to; `none` is no license. Sorted, each once. A
    `License:` line past FIELD_LIMIT is not read (no license expression is that long)."""
    names = set()
    if text.startswith("Format:"):
        for m in re.finditer(r"(?m)^License:[ \t]*(\S[^\n]*)$", text):
            if len(m.group(1)) > FIELD_LIMIT:  # no license expression is that long: not read (bounds the cost)
                continue
            # "X with Y exception", Y of one word or more ("with BINARY LIBRARY-LIKE PACKAGES exception")
            expression = re.sub(r"(?i)\s+with\s+(?:\S+\s+)*?\S+\s+exception\b|\s+with\s+\S+", "", m.group(1))
            for word in re.split(r"(?i)\s+(?:or|and)\s+|\s*[,|]\s*", expression.strip()):
                if LICENSE_NAME.fullmatch(word):
                    names.add(word)
    names |= {m.group(1).rstrip(".") for m in COMMON_LICENSES.finditer(text)}  # a sentence's full stop is not its
    names.discard("none")  # what a paragraph of generated data says: no license
    if len(names) > LICENSES_LIMIT:
        raise _refuse(path, f"states {len(names)} license names, past {LICENSES_LIMIT}")
    return sorted(names)


def _batches(items: list, size: int = BATCH) -> Iterator[list]:
    for at in range(0, len(items), size):
        yield items[at:at + size]


# where str.splitlines breaks a line (what importlib.metadata reads a RECORD by), matched one line
# at a time: a list of a RECORD's lines costs about 50 bytes a line, one of empty lines 50 a byte
BREAKS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"
LINE = re.compile(f"([^{BREAKS}]*)(?:\r\n|[{BREAKS}])|([^{BREAKS}]+)\\Z")


def lines(text: str) -> Iterator[str]:
    """text.splitlines(), one line at a time."""
    for m in LINE.finditer(text):
        yield m[1] if m[1] is not None else m[2]


def debian_packages(fs) -> list[dict]:
    """Every package dpkg has installed in the base (its status file and status.d/), each with the
    license names /usr/share/doc/NAME/copyright states (through a doc folder that links to another
    package's, as libgcc-s1's does). Sorted by name and architecture."""
    _folders_are_folders(fs)
    # status.d/ holds a paragraph file per package and, beside it, NAME.md5sums (not deb822)
    names = [p for p in fs.glob(DPKG_STATUS_D) if "/" not in p[len(DPKG_STATUS_D) - 1:]]
    for p in names:
        if not STATUS_D_NAME.fullmatch(p[len(DPKG_STATUS_D) - 1:]):
            raise _refuse(p, "is not named as a package's status file")
    packages = []
    for batch in _batches([DPKG_STATUS] + sorted(p for p in names if not p.endswith(".md5sums"))):
        for path, f in sorted(fs.read(batch, limit=STATUS_LIMIT).items()):
            if f is None or f.kind == "dir" and path != DPKG_STATUS:
                continue
            if f.kind not in ("file", "hardlink"):  # dpkg and the scanners follow a link; we do not
                raise _refuse(path, f"is a {f.kind}, not a file")
            if f.data is None:
                raise _refuse(path, f"is {f.size} bytes, past {STATUS_LIMIT}")
            packages += [p for p in (package(s, path) for s in stanzas(_text(f.data, path), path)) if p]
            if len(packages) > PACKAGES_LIMIT:
                raise _refuse(path, f"brings the packages dpkg lists past {PACKAGES_LIMIT:,}")
    seen = set()
    for p in packages:
        if (p["name"], p["arch"]) in seen:
            raise _refuse(p["status"][1:], f"lists {p['name']}:{p['arch']} twice: scanners would not agree which "
                                          f"is installed")
        seen.add((p["name"], p["arch"]))
    if not packages:
        return []
    docs = sorted({p["name"] for p in packages})
    linked = {}  # a doc folder that is a link to a sibling: the sibling's copyright tells
    for path, kind in fs.kinds([DOC + name for name in docs]).items():  # no file fetched for this
        if kind is not None and kind[0] == "symlink" and DEB_NAME.fullmatch(kind[1]):
            linked[path.removeprefix(DOC)] = kind[1]
    licenses = {}  # copyright path -> its names
    parsed: dict[str, list[str]] = {}  # each content parsed once, however many names or links lead to it
    for batch in _batches(sorted({DOC + linked.get(name, name) + "/copyright" for name in docs})):
        for path, f in fs.read(batch, limit=COPYRIGHT_LIMIT).items():
            if f is None or f.kind not in ("file", "hardlink"):
                continue
            if f.data is None:
                raise _refuse(path, f"is {f.size} bytes, past {COPYRIGHT_LIMIT}: not a copyright file we read")
            if f.sha256 not in parsed:
                parsed[f.sha256] = license_names(f.data.decode("utf-8", "replace"), path)
            licenses[path] = parsed[f.sha256]
    for p in packages:
        p["licenses"] = licenses.get(DOC + linked.get(p["name"], p["name"]) + "/copyright", [])
    return sorted(packages, key=lambda p: (p["name"], p["arch"]))


def record_hash(line: str) -> str | None:
    """The sha256 a RECORD row gives, in hex (None where it gives none or another algorithm)."""
    algorithm, _, value = line.partition("=")
    if algorithm != "sha256" or not re.fullmatch(r"[A-Za-z0-9_-]{43}", value):
        return None
    return base64.urlsafe_b64decode(value + "=").hex()


def _rows(rows: Iterator[list[str]], path: str) -> Iterator[list[str]]:
    try:
        yield from rows
    except csv.Error as e:
        raise _refuse(path, f"is not a RECORD's CSV ({untrusted.safe(e, limit=80)})") from None


def owners(fs, metadata_paths: list[str], targets: list[str]) -> dict[str, tuple[int, str | None]]:
    """Which distribution's RECORD lists each target (an image path): {target: (its index in
    metadata_paths, the sha256 that RECORD gives for it)}; a target no RECORD lists is left out.
    Every RECORD is read, once, and each row taken as the installer would (relative to its
    site folder, `..` and `./` resolved): a file two distributions claim is refused."""
    wanted = {posixpath.normpath("/" + t.lstrip("/")): t for t in targets}
    records = {str(PurePosixPath(meta.lstrip("/")).parent / "RECORD"): i for i, meta in enumerate(metadata_paths)}
    found: dict[str, tuple[int, str | None]] = {}
    said_by: dict[str, str] = {}
    for batch in _batches(sorted(records), RECORD_BATCH):
        for path, f in fs.read(batch, limit=RECORD_LIMIT).items():
            if f is None or f.kind not in ("file", "hardlink"):
                continue
            if f.data is None:
                raise _refuse(path, f"is {f.size:,} bytes, past {RECORD_LIMIT >> 20} MiB: not a RECORD an installer writes")
            site = "/" + str(PurePosixPath(path).parent.parent)
            rows = csv.reader(lines(f.data.decode("utf-8", "replace")))  # RECORD is CSV (PEP 376)
            for row in _rows(rows, path):
                target = wanted.get(posixpath.normpath(posixpath.join(site, row[0]))) if row and row[0] else None
                if target is None:
                    continue
                if said_by.get(target, path) != path:
                    raise _refuse(path, f"lists /{untrusted.safe(target.lstrip('/'))}, which /{said_by[target]} "
                                        f"lists too: which distribution holds it is not one answer")
                said_by[target] = path
                found.setdefault(target, (records[path], record_hash(row[1]) if len(row) > 1 else None))
    return found
