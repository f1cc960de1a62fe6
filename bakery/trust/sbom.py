"""SPDX 2.3 JSON of a derived image: a view of the build record, deterministic to the byte.

What it names and how scanners match it:
- the image, its base, and the base's OS as a package whose SPDXID starts SPDXRef-OperatingSystem-
  (trivy takes the OS from that prefix and drops every deb without it), containing each dpkg
  package with its purl (pkg:deb/ID/NAME@VERSION?arch=&distro=ID-VERSION_ID&upstream=), its
  sourceInfo "built package from: SOURCE VERSION" (what trivy reads), its Maintainer as supplier and
  the licenses its copyright file states, as SPDX ids (LicenseRef- for a name SPDX has not);
- each Python distribution as pkg:pypi/NAME@VERSION, NAME normalized as PEP 503 and purl say;
- our kernels, overlays, tuning tables and files as packages of our own, with sha256;
- each overlaid file as an SPDX File inside the distribution whose RECORD lists it, FILE_MODIFIED
  from the upstream file, with the patch PATCH_APPLIED, and a comment that its RECORD sha256 no
  longer matches.
A component that names no supplier of its own is supplied by who published what holds it: the
base's registry namespace for what the base holds, this project for what it built.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import dataclass, replace

from .. import untrusted
from ..errors import IntegrityError
from ..inputs.image import rfc3339
from .provenance import SPDX_PREDICATE  # noqa: F401 (re-exported: the SBOM's statement type)
from .record import BuildRecord, DebPackage, OperatingSystem

# Debian's copyright-format short names (DEP-5) and the SPDX ids they mean; a name not here and not
# an SPDX id itself becomes LicenseRef-NAME, declared in hasExtractedLicensingInfos
DEBIAN_TO_SPDX = {
    "apache-2.0": "Apache-2.0", "artistic-2.0": "Artistic-2.0", "bsd-2-clause": "BSD-2-Clause",
    "bsd-3-clause": "BSD-3-Clause", "bsd-4-clause": "BSD-4-Clause", "bsl-1.0": "BSL-1.0", "cc0-1.0": "CC0-1.0",
    "cc-by-4.0": "CC-BY-4.0", "cc-by-sa-4.0": "CC-BY-SA-4.0", "curl": "curl", "expat": "MIT", "mit": "MIT",
    "gfdl-1.2": "GFDL-1.2-only", "gfdl-1.2+": "GFDL-1.2-or-later", "gfdl-1.3": "GFDL-1.3-only",
    "gfdl-1.3+": "GFDL-1.3-or-later", "gpl-1": "GPL-1.0-only", "gpl-1+": "GPL-1.0-or-later",
    "gpl-2": "GPL-2.0-only", "gpl-2+": "GPL-2.0-or-later", "gpl-3": "GPL-3.0-only", "gpl-3+": "GPL-3.0-or-later",
    "isc": "ISC", "lgpl-2": "LGPL-2.0-only", "lgpl-2+": "LGPL-2.0-or-later", "lgpl-2.1": "LGPL-2.1-only",
    "lgpl-2.1+": "LGPL-2.1-or-later", "lgpl-3": "LGPL-3.0-only", "lgpl-3+": "LGPL-3.0-or-later",
    "mpl-1.1": "MPL-1.1", "mpl-2.0": "MPL-2.0", "openssl": "OpenSSL", "psf-2": "PSF-2.0", "python-2.0": "Python-2.0",
    "unlicense": "Unlicense", "x11": "X11", "zlib": "Zlib", "zpl-2.1": "ZPL-2.1",
}
SPDX_IDS = set(DEBIAN_TO_SPDX.values())


def _id(kind: str, name: str) -> str:
    """An SPDXID; where the name had to be changed to fit one, a hash of it keeps two names apart."""
    clean = re.sub(r"[^A-Za-z0-9.-]+", "-", name).strip("-")
    suffix = "" if clean == name else "-" + hashlib.sha256(name.encode()).hexdigest()[:16]
    return f"SPDXRef-{kind}-{clean}{suffix}"


@dataclass(frozen=True)
class Package:
    """An SPDX package as this SBOM writes it (to_json) and verify reads it back (read)."""
    spdx_id: str
    name: str
    version: str | None = None
    sha256: str | None = None
    purpose: str | None = None
    purl: str | None = None
    download: str = "NOASSERTION"
    comment: str | None = None
    supplier: str | None = None
    license_declared: str = "NOASSERTION"
    source_info: str | None = None
    files_analyzed: bool = False

    def to_json(self) -> dict:
        pkg: dict = {"SPDXID": self.spdx_id, "name": self.name, "downloadLocation": self.download,
                     "filesAnalyzed": self.files_analyzed, "licenseConcluded": "NOASSERTION",
                     "licenseDeclared": self.license_declared, "copyrightText": "NOASSERTION"}
        if self.version:
            pkg["versionInfo"] = self.version
        if self.supplier:
            pkg["supplier"] = self.supplier
        if self.sha256:
            pkg["checksums"] = [{"algorithm": "SHA256", "checksumValue": self.sha256}]
        if self.purpose:
            pkg["primaryPackagePurpose"] = self.purpose
        if self.purl:
            pkg["externalRefs"] = [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl",
                                    "referenceLocator": self.purl}]
        if self.comment:
            pkg["comment"] = self.comment
        if self.source_info:
            pkg["sourceInfo"] = self.source_info
        return pkg

    @classmethod
    def read(cls, doc, what: str = "the SBOM") -> Package:
        fields = _Fields(doc, what, "a package")
        return cls(fields.text("SPDXID"), fields.text("name"), fields.optional("versionInfo"), fields.sha256(),
                   fields.optional("primaryPackagePurpose"), fields.purl(), fields.text("downloadLocation"),
                   fields.optional("comment"), fields.optional("supplier"), fields.text("licenseDeclared"),
                   fields.optional("sourceInfo"), fields.flag("filesAnalyzed"))


@dataclass(frozen=True)
class File:
    """An SPDX file (an overlaid one) as this SBOM writes it and verify reads it back."""
    spdx_id: str
    file_name: str
    sha1: str | None
    sha256: str | None
    comment: str | None = None

    def to_json(self) -> dict:
        return {"SPDXID": self.spdx_id, "fileName": self.file_name,
                "checksums": [{"algorithm": "SHA1", "checksumValue": self.sha1},
                              {"algorithm": "SHA256", "checksumValue": self.sha256}],
                "fileTypes": ["SOURCE"], "licenseConcluded": "NOASSERTION", "copyrightText": "NOASSERTION",
                "comment": self.comment}

    @classmethod
    def read(cls, doc, what: str = "the SBOM") -> File:
        fields = _Fields(doc, what, "a file")
        return cls(fields.text("SPDXID"), fields.text("fileName"), fields.sha256("SHA1"), fields.sha256(),
                   fields.optional("comment"))


@dataclass(frozen=True, eq=False)
class Sbom:
    """A signed SBOM as verify reads it back: its packages and files typed, and the document."""
    packages: tuple[Package, ...]
    files: tuple[File, ...]
    document: dict

    @classmethod
    def read(cls, doc, what: str = "the SBOM") -> Sbom:
        if not isinstance(doc, dict) or "packages" not in doc:  # an SBOM names its packages (the image first)
            raise IntegrityError(f"{what}: the document is not an object with packages")
        return cls(tuple(Package.read(p, what) for p in _Fields.rows(doc, "packages", what)),
                   tuple(File.read(f, what) for f in _Fields.rows(doc, "files", what)), doc)

    def packages_of(self, kind: str) -> list[Package]:
        """The packages of one kind of ours (_id's): Python, Artifact, Tuning..."""
        return [p for p in self.packages if p.spdx_id.startswith(f"SPDXRef-{kind}-")]

    def package(self, spdx_id: str) -> Package | None:
        return next((p for p in self.packages if p.spdx_id == spdx_id), None)


class _Fields:
    """One SPDX element's fields, each read as its type or refused."""

    def __init__(self, doc, what: str, element: str) -> None:
        if not isinstance(doc, dict):
            raise IntegrityError(f"{what}: {element} is not an object")
        self.doc, self.what, self.element = doc, what, element

    @staticmethod
    def rows(doc: dict, key: str, what: str) -> list:
        value = doc.get(key, [])
        if not isinstance(value, list):
            raise IntegrityError(f"{what}: {key} is not a list")
        return value

    def text(self, key: str) -> str:
        value = self.doc.get(key)
        if not isinstance(value, str):
            raise IntegrityError(f"{self.what}: {self.element}'s {key} is not a string")
        return value

    def optional(self, key: str) -> str | None:
        return None if self.doc.get(key) is None else self.text(key)

    def flag(self, key: str) -> bool:
        value = self.doc.get(key, False)
        if not isinstance(value, bool):
            raise IntegrityError(f"{self.what}: {self.element}'s {key} is not true or false")
        return value

    def sha256(self, algorithm: str = "SHA256") -> str | None:
        sums = [_Fields(c, self.what, f"{self.element}'s checksum") for c in self.rows(self.doc, "checksums", self.what)]
        return next((c.text("checksumValue") for c in sums if c.text("algorithm") == algorithm), None)

    def purl(self) -> str | None:
        refs = [_Fields(r, self.what, f"{self.element}'s externalRef") for r in self.rows(self.doc, "externalRefs", self.what)]
        return next((r.text("referenceLocator") for r in refs if r.text("referenceType") == "purl"), None)


def _quote(text: str, keep: str = "") -> str:
    """Percent-encoding as purl writes a version or qualifier value (what packageurl-go gives): each
    character but ASCII letters, digits, -._~ and `keep`, as its UTF-8 bytes."""
    return re.sub(f"[^A-Za-z0-9._~{re.escape(keep)}-]", lambda m: "".join(f"%{b:02X}" for b in m[0].encode()), text)


def _oci_purl(name: str, digest: str) -> str:
    registry, _, repo = name.partition("/")
    return f"pkg:oci/{repo.rsplit('/', 1)[-1]}@{digest.replace(':', '%3A')}?repository_url={registry}/{repo}"


def pypi_purl(name: str, version: str) -> str:
    return f"pkg:pypi/{re.sub(r'[-_.]+', '-', name).lower()}@{_quote(version)}"


def deb_purl(os: OperatingSystem, deb: DebPackage) -> str:
    """pkg:deb/ID/NAME@VERSION?arch=ARCH&distro=ID-VERSION_ID[&upstream=SOURCE[@VERSION]]: the source
    is named where it differs from the package, with its version where that differs too."""
    qualifiers = [("arch", deb.arch), ("distro", f"{os.id}-{os.version_id}" if os.version_id else os.id)]
    if deb.source != deb.name or deb.source_version != deb.version:
        upstream = deb.source + ("" if deb.source_version == deb.version else "@" + deb.source_version)
        qualifiers.append(("upstream", upstream))
    return f"pkg:deb/{os.id}/{_quote(deb.name)}@{_quote(deb.version, ':')}?" + \
        "&".join(f"{k}={_quote(v, ':')}" for k, v in qualifiers)


def spdx_license(name: str) -> str:
    """The SPDX id a copyright file's license name means, or LicenseRef-NAME."""
    if name in SPDX_IDS:
        return name
    return DEBIAN_TO_SPDX.get(name.lower()) or "LicenseRef-" + re.sub(r"[^A-Za-z0-9.-]", "-", name)


def declared(names: tuple[str, ...]) -> str:
    """All a package's licenses, ANDed: each file is under one of them (what syft writes too)."""
    return " AND ".join(sorted({spdx_license(n) for n in names})) or "NOASSERTION"


def deb_supplier(maintainer: str | None, fallback: str) -> str:
    """A Maintainer field, `Name <address>`, as SPDX writes a supplier."""
    if not maintainer:
        return fallback
    m = re.fullmatch(r"\s*([^<]*?)\s*<([^<>]*)>\s*", maintainer)
    if not m:
        return f"Organization: {_actor(maintainer)}"
    name, email = _actor(m.group(1)), _actor(m.group(2))
    if not (name or email):
        return fallback
    return f"Organization: {name or email}" + (f" ({email})" if email else "")


def _actor(text: str) -> str:
    """Text as an SPDX actor's name or email: SPDX's readers split at parentheses, so none stay."""
    return " ".join(text.replace("(", " ").replace(")", " ").split())


def proof_summary(proof: dict | None) -> str:
    """One line on how an overlay was proven."""
    if not proof:
        return "no proof recorded"
    if "hardware" in proof:
        return f"no proof runs off the hardware: {proof['hardware']}"
    return (f"proof {proof['script']} (code sha256 {proof['code_sha256']}): stock {proof['stock']}, "
            f"overlaid {proof['overlaid']} ({proof['reason']})")


def predicate(record: BuildRecord, image_name: str) -> dict:
    """The SBOM for the image the record describes; image_name is where it was pushed."""
    digest = str(record.manifest.digest)
    image_id = "SPDXRef-Image"
    base = record.base
    base_digest = str(base.manifest_digest)
    ours = f"Organization: {record.source.repository}"  # what this project built or wrote
    theirs = f"Organization: the publisher of {base.name}"  # what the base holds and names no supplier for
    revision = record.source.revision + ("-dirty" if record.source.dirty else "")
    packages = [
        Package(image_id, image_name, digest, record.manifest.digest.hex, "CONTAINER", _oci_purl(image_name, digest),
                 supplier=ours),
        Package("SPDXRef-Base", base.name, base_digest, base.manifest_digest.hex, "CONTAINER",
                 _oci_purl(base.name, base_digest), supplier=theirs),
    ]
    files: list[File] = []
    # the image holds the base's layers (CONTAINS: what NTIA's checker walks) and derives from it
    rels = [("SPDXRef-DOCUMENT", "DESCRIBES", image_id), (image_id, "CONTAINS", "SPDXRef-Base"),
            (image_id, "DESCENDANT_OF", "SPDXRef-Base")]
    if base.os:
        os_id = _id("OperatingSystem", f"{base.os.id}-{base.os.version_id or 'unversioned'}")
        packages.append(Package(os_id, base.os.id, base.os.version_id or "unversioned", purpose="OPERATING-SYSTEM",
                                 supplier=f"Organization: {_actor(base.os.name)}", comment=f"from the base's {base.os.path}"))
        rels.append(("SPDXRef-Base", "CONTAINS", os_id))
        for deb in base.debian_packages:
            did = _id("Deb", f"{deb.name}-{deb.arch}")
            packages.append(Package(did, deb.name, deb.version, purl=deb_purl(base.os, deb),
                                     supplier=deb_supplier(deb.maintainer, theirs),
                                     license_declared=declared(deb.licenses),
                                     source_info=f"built package from: {deb.source} {deb.source_version}",
                                     comment=f"installed in the base; listed in {deb.status}"))
            rels.append((os_id, "CONTAINS", did))
    dist_ids = {}
    for dist in base.python_distributions:
        pid = dist_ids[dist.name] = _id("Python", dist.name)
        who = _actor(dist.supplier or "")
        packages.append(Package(pid, dist.name, dist.version, purpose="LIBRARY", purl=pypi_purl(dist.name, dist.version),
                                 supplier=f"Organization: {who}" if who else theirs,
                                 comment=f"installed in the base; metadata {dist.metadata}"))
        rels.append(("SPDXRef-Base", "CONTAINS", pid))
    for o in record.overlays:
        up = o.upstream
        upstream_id, patch_id, overlay_id = _id("Upstream", o.id), _id("Patch", o.id), _id("Overlay", o.id)
        packages.append(Package(upstream_id, up["path"], up["ref"], o.base_sha256, "FILE",
                                 download=f"git+{up['repo']}@{up['ref']}#{up['path']}",
                                 supplier=f"Organization: {up['repo']}",
                                 comment="the upstream file as found in the base"))
        if o.patch and o.patch_sha256:  # a build records both or neither
            packages.append(Package(patch_id, o.patch, revision, o.patch_sha256, "FILE", supplier=ours,
                                     comment=f"{o.kind}; {o.reason}"))
            rels.append((patch_id, "PATCH_APPLIED" if o.baked else "PATCH_FOR", upstream_id))
        if o.baked:
            owner = o.owner
            if not owner:
                record_note = "; no RECORD in the base lists it"
            else:
                stock = "the stock file's" if owner["record_sha256"] is not None and \
                    owner["record_sha256"] == o.base_sha256 else \
                    f"not even the stock file's (sha256 {o.base_sha256 or 'none: a new file'})"
                record_note = (f"; the RECORD of {owner['distribution']} {owner['version']} gives sha256 "
                               f"{owner['record_sha256'] or 'none'} for it, {stock}: this file no longer matches it")
            files.append(File(overlay_id, "." + o.target, o.result_sha1, o.result_sha256,
                              f"overlay {o.id} ({o.status}), platforms {', '.join(o.platforms)}; "
                              + proof_summary(o.proof) + record_note))
            rels += [(image_id, "CONTAINS", overlay_id), (overlay_id, "FILE_MODIFIED", upstream_id)]
            if owner and owner["distribution"] in dist_ids:
                rels.append((dist_ids[owner["distribution"]], "CONTAINS", overlay_id))
            if o.patch_sha256:
                rels.append((overlay_id, "GENERATED_FROM", patch_id))
        else:
            rels.append((image_id, "OTHER", upstream_id))
    kernels = record.kernels.artifact
    if kernels:
        packages.append(Package("SPDXRef-KernelArtifact", kernels.name, str(kernels.digest), kernels.pin.hex,
                                 "ARCHIVE", _oci_purl(kernels.name, str(kernels.digest)), supplier=ours,
                                 comment="the OCI artifact of the compiled kernels (kernels-<key>): compiled by this "
                                         "build and pushed, or taken from the registry under a release-key signature"))
    for artifact in record.artifacts:
        aid = _id("Artifact", artifact.name)
        packages.append(Package(aid, artifact.path, revision, artifact.sha256, "FILE", supplier=ours,
                                 comment=f"compiled for {artifact.arch} with {artifact.toolchain}"
                                 + "".join(f"; {s['operator']} serves {s['function']} (overlay {s['overlay']})"
                                           for s in artifact.serves)))
        rels.append((image_id, "CONTAINS", aid))
        if kernels:
            rels.append(("SPDXRef-KernelArtifact", "CONTAINS", aid))
        for src in artifact.sources:
            sid = _id("Source", src.path)
            if not any(p.spdx_id == sid for p in packages):
                packages.append(Package(sid, src.path, revision, src.sha256, "SOURCE", supplier=ours))
            rels.append((aid, "GENERATED_FROM", sid))
    for table in record.tuning:
        tid = _id("Tuning", table.name)
        packages.append(Package(tid, table.path, revision, table.sha256, "FILE", supplier=ours,
                                 comment="AITER tuning table"))
        rels.append((image_id, "CONTAINS", tid))
    described = {o.target for o in record.overlays if o.baked} | {a.path for a in record.artifacts} \
        | {t.path for t in record.tuning}
    for f in record.files:
        if f.path in described:
            continue
        fid = _id("File", f.path)
        purpose = "FILE" if f.path != record.image.entrypoint[0] else "APPLICATION"
        packages.append(Package(fid, f.path, revision, f.sha256, purpose, supplier=ours,
                                 comment="entrypoint" if purpose == "APPLICATION" else None))
        rels.append((image_id, "CONTAINS", fid))
    file_ids = {f.spdx_id for f in files}
    holders = {a for a, t, b in rels if t == "CONTAINS" and b in file_ids}
    # SPDX lets only a package whose files were read contain a File
    packages = [replace(p, files_analyzed=True, comment=(p.comment or "") + "; its files named here are only those "
                        "this build changed") if p.spdx_id in holders else p for p in packages]
    twice = sorted(i for i, n in Counter([p.spdx_id for p in packages] + [f.spdx_id for f in files]).items() if n > 1)
    if twice:  # a reader keyed by SPDXID would keep one of them: the base names two things alike
        raise IntegrityError(f"two of the base's packages would both be {untrusted.safe(twice[0])} in the SBOM (same "
                             f"name and architecture, or a Python distribution installed twice): the base is refused")
    refs = sorted({lic for p in packages for lic in re.findall(r"LicenseRef-[A-Za-z0-9.-]+", p.license_declared)})
    doc = {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": f"{image_name}@{digest}",
        "documentNamespace": f"{record.source.repository}/spdx/{digest.replace(':', '-')}",
        "creationInfo": {"created": rfc3339(record.source.source_date_epoch),
                         "creators": [f"Tool: bakery-{record.tools['bakery']}", ours]},
        "packages": [p.to_json() for p in packages],
        "files": [f.to_json() for f in files],
        "hasExtractedLicensingInfos": [
            {"licenseId": ref, "name": ref.removeprefix("LicenseRef-"),
             "extractedText": f"{ref.removeprefix('LicenseRef-')}: a license name a Debian copyright file of the "
                              f"base states, which SPDX's list has no id for"} for ref in refs],
        "relationships": [{"spdxElementId": a, "relationshipType": t, "relatedSpdxElement": b} for a, t, b in rels],
    }
    return doc
