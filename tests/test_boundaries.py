"""Issue 28's corpus: hostile input that reached a sink or a push, each with its honest control.

- bad METADATA in the base (no Name:, a non-ASCII one) used to crash the build after the image
  and its tag were pushed; now one line, exit 5, and no tag;
- a record whose SBOM or provenance a registry could not serve back is refused before the push;
- someone else's text is inert in each sink (terminal, Markdown, JSON), checked against rules
  written from the issue's description, not from the code.
"""

from __future__ import annotations

import json
import re
import shutil
import unicodedata
import uuid
from pathlib import Path

import pytest
import requests

from bakery import untrusted
from bakery.bake import pipeline as build
from bakery.errors import IntegrityError
from bakery.oci.refs import Reference
from support import invoke, last_line
from test_errors import one_clear_line
from test_overlays import docker_base

DIST = "/usr/local/lib/python3.12/dist-packages"


def tags(registry: str, repository: str) -> list[str]:
    resp = requests.get(f"http://{registry}/v2/{repository}/tags/list", timeout=10)
    return [] if resp.status_code == 404 else (resp.json().get("tags") or [])


def lock_to(project: Path, fixture_lock: str, base: Reference) -> None:
    """The fixture's lock re-pointed at a changed base (its overlaid files are untouched)."""
    lock = json.loads(fixture_lock)
    lock["base"] = str(base)
    (project / "overlays" / "overlays.lock").write_text(json.dumps(lock))


@pytest.mark.parametrize("name, metadata, said", [
    ("no-name", r"Metadata-Version: 2.1\nVersion: 1.0\n", "has Name: none"),
    ("non-ascii", r"Metadata-Version: 2.1\nName: \303\251vil\nVersion: 1.0\n", "has Name: "),
])
def test_bad_metadata_is_one_line_and_nothing_is_pushed(name, metadata, said, project, registry, fixture_base,
                                                         fixture_lock, tmp_path):
    """The lock is re-pointed at the changed base (its overlaid files are untouched), so the build
    gets as far as it would for a real nightly with one odd distribution in it."""
    bad = docker_base(registry, f"metadata-{name}", fixture_base,
                      [f"mkdir -p {DIST}/evil-1.0.dist-info && printf '{metadata}' > {DIST}/evil-1.0.dist-info/METADATA"],
                      tmp_path)
    lock_to(project, fixture_lock, bad)
    repo = f"boundaries/metadata-{name}-{uuid.uuid4().hex[:12]}"
    line = one_clear_line(invoke(project, "build", "--base", str(bad), "--push", f"{registry}/{repo}:candidate"))
    assert f"evil-1.0.dist-info/METADATA {said}" in line and "refused" in line, line
    assert tags(registry, repo) == []
    assert not (project / "out" / "build-record.json").exists()


def test_a_dist_info_folder_with_a_terminal_escape_in_its_name_is_refused(project, registry, fixture_base,
                                                                          fixture_lock, tmp_path):
    """Its METADATA is well formed; only the folder's name is hostile, and the record and SBOM would
    carry that path as the distribution's metadata."""
    bad = docker_base(registry, "metadata-path", fixture_base,
                      [f"d={DIST}/$(printf 'e\\033]0;owned\\007vil-1.0.dist-info') && mkdir -p \"$d\" && "
                       f"printf 'Metadata-Version: 2.1\\nName: evil\\nVersion: 1.0\\n' > \"$d/METADATA\""], tmp_path)
    lock_to(project, fixture_lock, bad)
    repo = f"boundaries/metadata-path-{uuid.uuid4().hex[:12]}"
    done = invoke(project, "build", "--base", str(bad), "--push", f"{registry}/{repo}:candidate")
    line = one_clear_line(done)
    assert "e\\x1b]0;owned\\x07vil-1.0.dist-info/METADATA is no dist-info folder" in line and "refused" in line, line
    assert "\x1b" not in done.stderr and "\x07" not in done.stderr
    assert tags(registry, repo) == []


def test_the_same_base_without_the_odd_distribution_builds_and_pushes(project, registry, fixture_base, fixture_lock,
                                                                      tmp_path):
    """The control: a well-formed extra distribution is named in the record, and the tag is there."""
    good = docker_base(registry, "metadata-good", fixture_base,
                       [f"mkdir -p {DIST}/fine-1.0.dist-info && printf 'Metadata-Version: 2.1\\nName: fine\\n"
                        f"Version: 1.0\\n' > {DIST}/fine-1.0.dist-info/METADATA"], tmp_path)
    lock_to(project, fixture_lock, good)
    done = invoke(project, "build", "--base", str(good), "--push", f"{registry}/boundaries/metadata-good:candidate")
    assert done.returncode == 0, done.stderr
    assert "candidate" in tags(registry, "boundaries/metadata-good")
    record = json.loads((project / "out" / "build-record.json").read_text())
    assert {"name": "fine", "version": "1.0"}.items() <= next(
        d for d in record["base"]["python_distributions"] if d["name"] == "fine").items()
    assert last_line(done).startswith(f"{registry}/boundaries/metadata-good@sha256:")


def record_with_reason(reason: str):
    """A real build's record (tests/data) with its first proven overlay's proof reason set to `reason`."""
    from bakery.trust.record import BuildRecord

    doc = json.loads((Path(__file__).parent / "data" / "build-record.json").read_text())
    next(o for o in doc["overlays"] if o["proof"] and "reason" in o["proof"])["proof"]["reason"] = reason
    return BuildRecord.from_json(doc)


def test_a_record_too_big_to_serve_back_signed_is_refused_before_the_push():
    subject = Reference.parse("r.example/img@sha256:" + "a" * 64)
    build.check_attestable(record_with_reason("fine"), subject)  # the control: small, made whole
    with pytest.raises(IntegrityError, match="past the 4194304 a registry serves back: nothing pushed"):
        build.check_attestable(record_with_reason("x" * (5 << 20)), subject)


def test_the_statements_checked_before_the_push_are_made_from_the_record_attest_will_read(tmp_path):
    """PyYAML reads a double-quoted "\\uD83D\\uDE00" as two code points; the record on disk joins
    them into one character, which `invoke attest` reads and signs. The check before the push reads
    the record the same way, so it takes what attest will sign (it refused the pair once, when it
    made the statements from the record in memory)."""
    from bakery.trust import attestations, record as record_file

    subject = Reference.parse("r.example/img@sha256:" + "a" * 64)
    paired = record_with_reason("made by \ud83d\ude00")
    build.check_attestable(paired, subject)
    record_file.write(tmp_path / "record.json", paired)
    signed = attestations.statements(subject, record_file.read(tmp_path / "record.json"))
    assert any("made by \U0001f600" in body.decode() for body in signed.values())
    assert record_file.read_back(paired) == record_file.read(tmp_path / "record.json")  # what the check reads


# -- someone else's text, per sink -------------------------------------------------------------------

HOSTILE_TEXT = [
    "ok\x1b[2K\x1b[1Aerror: hidden\rall good",  # erase the line, move up, overwrite
    "right\u202eto-left\u2066isolate\u2069",  # bidirectional overrides reorder what is shown
    "fixes #1, closes https://github.com/dsv4-mi300x/bakery/issues/2, resolves dsv4-mi300x/bakery#3",
    "Fixes: www.github.com/o/r/issues/4 cc @maintainer",
    "<img src=x onerror=alert(1)> | table | break\n\nnew paragraph",
    "\x00nul \x7fdel \x85nel \u2028ls",
    "zero\u200bwidth \u2060joined \ufeffbom \U000e0041tag \u061calm \udcffsurrogate",
    "closes GH-12 and gh-7",
]
# GitHub's closing keywords and references, written from its documentation's description
CLOSING = re.compile(r"(?i)\b(close[sd]?|fix(e[sd])?|resolve[sd]?)\b\W+(https?://\S+/issues/\d+|[\w.-]+/[\w.-]+#\d+|"
                     r"#\d+|gh-\d+|www\.\S+/issues/\d+)")
MENTION = re.compile(r"(?<![\w`])@[A-Za-z0-9-]+")


def acts_on_a_terminal(text: str) -> list[str]:
    """Characters a terminal acts on, that reorder a line or that do not show: controls (Cc),
    format characters (Cf: bidi marks and overrides, zero-width, tags), lone surrogates (Cs), line
    and paragraph separators. The one format character allowed is the word joiner that breaks a
    Markdown reference (untrusted.WORD_JOINER)."""
    return [c for c in text if (unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp")
                                and c != untrusted.WORD_JOINER)]


@pytest.mark.parametrize("text", HOSTILE_TEXT)
def test_each_sink_gets_inert_text(text):
    for sink in untrusted.SINKS:
        shown = untrusted.safe(text, sink, limit=1000)
        assert not acts_on_a_terminal(shown), (sink, shown)
    markdown = untrusted.safe(text, "markdown", limit=1000)
    assert not CLOSING.search(markdown) and not MENTION.search(markdown), markdown
    assert "<" not in markdown.replace("\\<", ""), markdown
    assert json.loads(json.dumps(untrusted.safe(text, "json"))) == untrusted.safe(text, "json")


@pytest.mark.parametrize("text", HOSTILE_TEXT)
def test_each_hostile_text_acts_when_raw(text):
    """The control: every text above does something raw (moves the cursor, reorders, closes an
    issue, mentions someone, or is HTML)."""
    assert acts_on_a_terminal(text) or CLOSING.search(text) or MENTION.search(text) or "<" in text


def test_a_long_text_is_capped_and_says_how_much_was_cut():
    shown = untrusted.safe("x" * (1 << 20), "json", limit=400)
    assert len(shown) < 450 and shown.endswith(f"... ({(1 << 20) - 400} more characters)")


def test_an_image_file_from_outside_the_project_is_refused(tmp_path):
    """image.yaml's files[].src: the shipped one loads (the control); an absolute path, a '..' or a
    link out of image/ would bake a file of the building host."""
    from bakery.errors import InputError
    from bakery.inputs import image
    from support import ROOT

    spec = tmp_path / "image"
    shutil.copytree(ROOT / "image", spec)
    original = (spec / "image.yaml").read_text()
    assert image.load_spec(spec / "image.yaml").files  # the control
    named = re.search(r"src: (\S+)", original)
    assert named, original
    src = named.group(1)
    secret = tmp_path / "host-secret"
    secret.write_text("BAKERY_KEY_PASSWORD=hunter2")
    (spec / "link").symlink_to(secret)
    for bad in (str(secret), "../host-secret", "link"):
        (spec / "image.yaml").write_text(original.replace(f"src: {src}", f"src: {bad}", 1))
        with pytest.raises(InputError, match="is not a file inside"):
            image.load_spec(spec / "image.yaml")


# -- bounds ------------------------------------------------------------------------------------------

def test_a_signature_manifest_with_too_many_layers_is_refused():
    from bakery.trust import verify

    layer = {"mediaType": "application/vnd.dev.cosign.simplesigning.v1+json", "digest": "sha256:" + "a" * 64,
             "size": 1}
    config = {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": "sha256:" + "b" * 64, "size": 2}
    assert len(verify._layers(json.dumps({"config": config, "layers": [layer] * 3}).encode(), "sig")) == 3  # control
    with pytest.raises(IntegrityError, match="lists 257 layers, past the 256"):
        verify._layers(json.dumps({"config": config, "layers": [layer] * 257}).encode(), "sig")


def test_a_kept_file_past_its_cap_is_refused_before_it_is_read():
    """A METADATA (kept on the first pass) whose header claims 1 GiB: refused on the size alone."""
    from bakery.base import layercache, scan
    from bakery.oci.tarscan import Member, TarError

    read = []
    keep = re.compile(r".*METADATA")

    class Reader:
        def read_data(self, member):
            read.append(member)
            return b"x"

    def take(size):
        layer = scan._Layer(set(), keep, layercache.Staged.__new__(layercache.Staged), None)
        layer.take(Member("m/METADATA", b"0", size, 0o644, ""), Reader())

    with pytest.raises(TarError, match="past the 268435456"):
        take(1 << 30)
    assert read == []


class Trickle:
    """A registry stand-in serving one blob a byte at a time (delay seconds apart)."""

    def __init__(self, blob: bytes, delay: float):
        import http.server
        import threading

        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):  # noqa: N802 (http.server's names)
                import time

                self.send_response(200)
                self.send_header("Content-Length", str(len(blob)))
                self.end_headers()
                for i in range(len(blob)):
                    self.wfile.write(blob[i:i + 1])
                    self.wfile.flush()
                    time.sleep(outer.delay)

        self.delay = delay
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.host = f"127.0.0.1:{self.server.server_address[1]}"


@pytest.mark.slow
def test_a_transfer_slower_than_its_deadline_is_given_up(monkeypatch):
    """Each read gets a byte before its timeout, so only the pace stops it, mid-way (it once ended
    only after the whole blob had come: each read waited for a megabyte). Resuming is off here: one
    transfer's deadline is what is timed."""
    import time

    from bakery.errors import TransientError
    from bakery.oci import registry as registry_mod, transport
    from bakery.oci.refs import Descriptor

    monkeypatch.setattr(registry_mod, "RESUMES", 0)

    blob = b"x" * 40
    desc = Descriptor.of("application/octet-stream", blob)
    monkeypatch.setenv(transport.GRACE_ENV, "0.5")
    monkeypatch.setenv(transport.MIN_RATE_ENV, str(1 << 20))
    fast = Trickle(blob, 0.0)
    assert registry_mod.Registry(fast.host).fetch_blob("r", desc) == blob  # the control
    slow = Trickle(blob, 0.05)  # 2 s for the blob: past 0.5 s and 40 bytes at 1 MiB/s
    began = time.monotonic()
    with pytest.raises(TransientError, match="too slow"):
        registry_mod.Registry(slow.host).fetch_blob("r", desc)
    assert time.monotonic() - began < 1.5, "given up only after the whole blob came"
    fast.server.shutdown()
    slow.server.shutdown()


def test_a_build_that_fails_at_its_last_check_has_pushed_nothing(project, registry, fixture_base, toolchain,
                                                                 monkeypatch):
    """The last thing that can fail before a push (the SBOM and provenance made from the record)
    fails here: neither the image's tag nor the kernel artifact's is in the registry. Before, the
    kernel artifact was pushed as soon as it was compiled."""
    from bakery.bake.options import Options
    from bakery.bake.pipeline import build as run

    def fails(rec, subject):
        raise IntegrityError("the record cannot give its SBOM (made to fail here)")

    honest = build.check_attestable
    monkeypatch.setattr(build, "check_attestable", fails)
    repo = f"boundaries/last-check-{uuid.uuid4().hex[:12]}"  # the registry outlives a test run
    with pytest.raises(IntegrityError, match="made to fail here"):
        run(Options(project, str(fixture_base), f"{registry}/{repo}:candidate"), log=lambda m: None)
    assert tags(registry, repo) == []
    monkeypatch.setattr(build, "check_attestable", honest)
    ref, _ = run(Options(project, str(fixture_base), f"{registry}/{repo}:candidate"), log=lambda m: None)  # control
    assert "candidate" in tags(registry, repo) and any(t.startswith("kernels-") for t in tags(registry, repo))


def test_every_control_format_surrogate_and_separator_character_is_escaped():
    """Not a sample: every code point Unicode calls a control, format, surrogate, line or paragraph
    separator is shown escaped in every sink (a word joiner the Markdown sink adds itself aside)."""
    found = [chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) in ("Cc", "Cf", "Cs", "Zl", "Zp")]
    assert len(found) > 2000  # the control: they exist, surrogates alone are 2048
    for sink in untrusted.SINKS:
        shown = untrusted.safe("".join(found), sink, limit=len(found) + 1)
        assert not acts_on_a_terminal(shown), (sink, acts_on_a_terminal(shown)[:5])


def test_a_base_manifest_with_too_many_layers_is_refused_before_any_is_read(registry, fixture_base):
    """Each layer of a base is streamed and indexed: a manifest listing 1,001 (the same one, 1,001
    times; its config's diff_ids to match) is refused at once. The control: the fixture resolves."""
    from bakery.base import spec as base_mod
    from bakery.oci.refs import Descriptor, Reference
    from bakery.oci.registry import Registry

    reg = Registry(registry)
    honest = base_mod.resolve(reg, fixture_base, "linux/amd64")  # the control
    config = honest.config
    config["rootfs"]["diff_ids"] = config["rootfs"]["diff_ids"][:1] * 1001
    cfg = json.dumps(config).encode()
    cfg_desc = Descriptor.of(honest.config_descriptor.media_type, cfg)
    repo = fixture_base.repository
    reg.upload_blob(repo, cfg_desc, lambda: iter([cfg]))
    manifest = json.loads(honest.manifest_bytes)
    manifest["config"], manifest["layers"] = cfg_desc.to_json(), manifest["layers"][:1] * 1001
    digest = reg.put_manifest(repo, "many-layers", json.dumps(manifest).encode(), honest.manifest_media_type)
    with pytest.raises(IntegrityError, match="lists 1001 layers, past the 1000"):
        base_mod.resolve(reg, Reference(registry, repo, None, digest), "linux/amd64")


def test_rebase_s_table_shows_a_base_s_file_names_inert():
    """`invoke rebase` names where a moved target's namesakes lie in the new base: the base chose
    those names."""
    from types import SimpleNamespace

    from bakery.cli import render

    row = SimpleNamespace(overlay=SimpleNamespace(id="cpu-kv-transfer-fence", baked=True), status="target moved",
                          detail="a file of its name is at /x/\x1b[2Kgpu_worker.py\n::error::forged")
    table = render.rebased(SimpleNamespace(rows=[row]))
    assert "\x1b" not in table and "\\x1b[2Kgpu_worker.py\\x0a::error::forged" in table
    assert len(table.splitlines()) == 2  # the header and the row: no line of the base's
