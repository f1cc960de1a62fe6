"""The nightly tracker against the real local registry: an "upstream" repository with tags on the two
fixture bases (vLLM 0.26.0, the pin, and 0.27.0, the next nightly) and a tag that moves between
them; a registry that breaks off its tag list or lies about a digest, through a proxy."""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from bakery.dev.rehearse_nightly import tag_image as put_tag
from bakery.errors import BUMPED, NOTHING_NEW, PORTING
from bakery.oci.refs import Descriptor, Digest, Reference
from bakery.oci.registry import Registry
from bakery.release.track import bump as bump_mod, ledger as ledger_mod, report as report_mod, tracker, upstream
from proxy import FaultyProxy
from support import copy_project, invoke, last_line


@pytest.fixture
def nightlies(registry, fixture_base, fixture_base_027):
    """upstream: nightly-a on 0.26.0 (the pin), nightly-b on 0.27.0 built a day later, latest on 0.26.0."""
    reg = Registry(registry)
    name = f"{registry}/track-{uuid.uuid4().hex[:8]}"
    upstream, kept = Reference.parse(f"{name}/vllm-openai-rocm"), Reference.parse(f"{name}/mirror")
    config = reg.fetch_blob(fixture_base.repository, Descriptor.from_json(json.loads(reg.get_manifest(fixture_base)[0])["config"]))
    later = ledger_mod.parse_time(json.loads(config)["created"]) + timedelta(days=1)
    a = put_tag(reg, fixture_base, upstream.with_tag("nightly-a"))
    b = put_tag(reg, fixture_base_027, upstream.with_tag("nightly-b"), later.strftime("%Y-%m-%dT%H:%M:%SZ"))
    put_tag(reg, fixture_base, upstream.with_tag("latest"))
    return {"registry": reg, "upstream": upstream, "mirror": kept, "a": a, "b": b}


def git(project, *args):
    subprocess.run(["git", "-c", "user.name=test", "-c", "user.email=test@example.invalid", "-C", str(project),
                    *args], check=True, capture_output=True)


@pytest.fixture
def pinned_project(tmp_path, fixture_lock, fixture_base):
    """A checkout pinned to the 0.26.0 fixture (its lock), committed, with no ledger yet."""
    project = copy_project(tmp_path / "project", fixture_lock)
    (project / "image" / "base.yaml").write_text(f"image: {fixture_base}\nplatform: linux/amd64\nmirror: null\n")
    git(project, "add", "-A")
    git(project, "commit", "-qm", "pin the fixture")
    return project


def run_track(project, n, *extra, tags="*"):
    return invoke(project, "track", "--from", n["upstream"].name, "--mirror", n["mirror"].name, "--tags", tags,
                  *extra)


def ledger(project) -> dict:
    return yaml.safe_load((project / "image" / "nightlies.yaml").read_text())


def changed_paths(project) -> set[str]:
    out = subprocess.run(["git", "-C", str(project), "status", "--porcelain", "--untracked-files=all"],
                         capture_output=True, text=True, check=True).stdout
    return {line[3:] for line in out.splitlines() if not line[3:].startswith("out/")}


def test_track_mirrors_all_picks_the_newest_carries_and_proves_then_rests(pinned_project, nightlies):
    project, n = pinned_project, nightlies
    result = run_track(project, n)
    assert result.returncode == BUMPED, result.stdout + result.stderr
    doc = ledger(project)
    entries = {e["digest"]: e for e in doc["nightlies"]}
    assert [e["digest"] for e in doc["nightlies"]] == [str(n["b"]), str(n["a"])]  # newest first
    assert entries[str(n["a"])]["tags"] == ["latest", "nightly-a"] and entries[str(n["b"])]["tags"] == ["nightly-b"]
    assert entries[str(n["a"])]["vllm"] == {"version": "0.26.0", "commit": "ffd46bfab"}
    assert entries[str(n["b"])]["vllm"]["version"] == "0.27.0"
    assert entries[str(n["a"])]["aiter"]["version"] == "0.1.7.post2.dev18"
    for digest in (n["a"], n["b"]):  # kept in the mirror, by digest and by a kept- tag
        assert n["registry"].manifest_exists(n["mirror"].repository, digest)
        assert entries[str(digest)]["mirrored"] == str(n["mirror"].with_digest(digest))
    assert entries[str(n["a"])]["tried"] is None  # the pin itself is not tried again
    tried = entries[str(n["b"])]["tried"]
    assert tried["outcome"] == "carried" and tried["overlays"]["cpu-kv-transfer-fence"] == "ported (exact), proven"
    # the change is base.yaml, overlays/ and the ledger, nothing else
    assert changed_paths(project) <= {"image/base.yaml", "image/nightlies.yaml", "overlays/overlays.lock"} | \
        {p for p in changed_paths(project) if p.startswith("overlays/")}
    assert {"image/base.yaml", "image/nightlies.yaml", "overlays/overlays.lock"} <= changed_paths(project)
    spec = yaml.safe_load((project / "image" / "base.yaml").read_text())
    assert spec["image"] == f"{n['upstream'].name}@{n['b']}" and spec["mirror"] == n["mirror"].name
    report = (project / "out" / "track" / "report.md").read_text()
    assert "carried and proven" in report and "| cpu-kv-transfer-fence | yes | ported (exact), proven |" in report
    assert "stock BROKEN" in report  # each proof's verdict and reason, as it ran
    assert "| dspark-causal-verify-flatten | no (audit) | audit changed: re-check |" in report

    git(project, "add", "-A", "image", "overlays")
    git(project, "commit", "-qm", "bump")
    before = (project / "image" / "nightlies.yaml").read_bytes()
    again = run_track(project, n)
    assert again.returncode == NOTHING_NEW, again.stdout + again.stderr
    assert "nothing new" in last_line(again) and changed_paths(project) == set()
    assert (project / "image" / "nightlies.yaml").read_bytes() == before

    # latest moves to 0.27.0: recorded as moved, not silently replaced; nothing to try
    put_tag(n["registry"], n["upstream"].with_digest(n["b"]), n["upstream"].with_tag("latest"))
    moved = run_track(project, n)
    assert moved.returncode == NOTHING_NEW, moved.stdout + moved.stderr
    entries = {e["digest"]: e for e in ledger(project)["nightlies"]}
    assert entries[str(n["a"])]["tags"] == ["nightly-a"] and entries[str(n["a"])]["moved"] == {"latest": str(n["b"])}
    assert entries[str(n["b"])]["tags"] == ["latest", "nightly-b"]

    listed = invoke(project, "track", "--list")
    assert listed.returncode == 0, listed.stderr
    rows = listed.stdout.splitlines()
    assert "the current pin" in rows[0] and "nightly-b" in rows[0] and "vLLM 0.27.0" in rows[0]
    assert "nightly-a" in rows[1] and "older than the pin" in rows[1]


def test_a_nightly_deleted_upstream_stays_buildable_from_the_mirror(pinned_project, nightlies):
    project, n = pinned_project, nightlies
    assert run_track(project, n, "--no-bump").returncode == 0
    reg = n["registry"]
    # upstream ages the nightly out: its manifest and tag are deleted
    reg.transport.request("DELETE", f"/v2/{n['upstream'].repository}/manifests/{n['b']}", ok=(202,))
    gone = run_track(project, n)
    assert gone.returncode == BUMPED, gone.stdout + gone.stderr
    entry = next(e for e in ledger(project)["nightlies"] if e["digest"] == str(n["b"]))
    assert entry["tags"] == [] and entry["deleted"] == ["nightly-b"] and entry["tried"]["outcome"] == "carried"
    built = invoke(project, "build")  # base.yaml: upstream@digest, read from the mirror
    assert built.returncode == 0, built.stderr
    record = json.loads((project / "out" / "build-record.json").read_text())
    assert record["base"]["pinned"] == f"{n['upstream'].name}@{n['b']}"


def test_needs_porting_changes_only_the_ledger_and_writes_the_kits(pinned_project, nightlies):
    """Without its committed port, the hardware-only BLOCK_H overlay cannot be carried onto 0.27.0
    (no proof runs here, so only bytes a person wrote may carry it): exit 11, the pin, lock and
    patches as they were, the ledger says which overlay, the report names its kit."""
    project = pinned_project
    git(project, "rm", "-rq", "overlays/patches/ports/sparse-mla-prefill-bh64")
    git(project, "commit", "-qm", "no port")
    result = run_track(project, nightlies)
    assert result.returncode == PORTING, result.stdout + result.stderr
    assert changed_paths(project) == {"image/nightlies.yaml"}
    entry = next(e for e in ledger(project)["nightlies"] if e["digest"] == str(nightlies["b"]))
    assert entry["tried"]["outcome"] == "needs porting"
    needing = [k for k, v in entry["tried"]["overlays"].items() if v == "needs porting"]
    assert needing == ["sparse-mla-prefill-bh64"]
    report = (project / "out" / "track" / "report.md").read_text()
    assert "out/rebase/sparse-mla-prefill-bh64/" in report and "need porting" in report
    listed = invoke(project, "track", "--list")
    assert "needs porting: sparse-mla-prefill-bh64" in listed.stdout
    # after a person ports it (here: the port restored), the same nightly is tried again by digest
    git(project, "checkout", "HEAD~1", "--", "overlays/patches/ports/sparse-mla-prefill-bh64")
    again = invoke(project, "bump", "--nightly", str(nightlies["b"]))
    assert again.returncode == BUMPED, again.stdout + again.stderr


def one_line_no_change(project, result, before, *words):
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    line = lines[-1]  # progress above it; the error is one line, last, with no traceback
    assert line.startswith("error: ") and all(w in line for w in words), result.stderr
    assert sum(layer.startswith(("error", "Traceback")) for layer in lines) == 1, result.stderr
    ledger_file = project / "image" / "nightlies.yaml"
    assert (ledger_file.read_bytes() if ledger_file.exists() else None) == before
    assert changed_paths(project) <= ({"image/nightlies.yaml"} if before else set())


def track_through(proxy, project, n):
    return invoke(project, "track", "--from", f"{proxy.host}/{n['upstream'].repository}", "--mirror",
                  n["mirror"].name, "--no-bump")


def test_a_registry_that_breaks_off_or_cuts_its_tag_list_changes_nothing(pinned_project, nightlies, registry):
    n, project = nightlies, pinned_project
    repo = n["upstream"].repository
    first = f"/v2/{repo}/tags/list?n={upstream.PAGE}"
    page = json.dumps({"name": repo, "tags": ["latest"]}).encode()
    json_type = {"Content-Type": "application/json"}
    link = {**json_type, "Link": f'</v2/{repo}/tags/list?last=latest&n={upstream.PAGE}>; rel="next"'}
    # page 2 never comes
    with FaultyProxy(registry, [], overrides={first: (200, link, page),
                                              f"/v2/{repo}/tags/list?last=latest&n={upstream.PAGE}": (404, {}, b"")}) as proxy:
        one_line_no_change(project, track_through(proxy, project, n), None, "tag list", "broke off at page 2")
    # a next page outside the listing: another repository on the same host, or another host
    for target in ("/v2/other/tags/list?n=1", f"http://127.0.0.1:9/v2/{repo}/tags/list?n=1"):
        elsewhere = {**json_type, "Link": f'<{target}>; rel="next"'}
        with FaultyProxy(registry, [], overrides={first: (200, elsewhere, page)}) as proxy:
            one_line_no_change(project, track_through(proxy, project, n), None, "outside the listing")
    # a page that starts the list over: a loop, not a listing
    with FaultyProxy(registry, [], overrides={first: (200, link, page),
                                              f"/v2/{repo}/tags/list?last=latest&n={upstream.PAGE}": (200, link, page)}) as proxy:
        one_line_no_change(project, track_through(proxy, project, n), None, "repeats tags")
    # silently cut: after a full run, one page without a link, known tags missing that still resolve
    with FaultyProxy(registry, []) as proxy:
        assert track_through(proxy, project, n).returncode == 0
        before = (project / "image" / "nightlies.yaml").read_bytes()
        proxy.overrides[first] = (200, json_type, page)
        one_line_no_change(project, track_through(proxy, project, n), before, "omits nightly-", "which still resolves")


def test_a_registry_that_lies_about_a_digest_changes_nothing(pinned_project, nightlies, registry):
    n = nightlies
    lie = f"header:Docker-Content-Digest=sha256:{'0' * 64}"
    with FaultyProxy(registry, [("GET", f"/v2/{n['upstream'].repository}/manifests/nightly-b", lie)] * 8) as proxy:
        result = track_through(proxy, pinned_project, n)
    one_line_no_change(pinned_project, result, None, "lies about the digest", "nightly-b")


def test_tag_pages_are_followed_on_the_real_registry(nightlies):
    """The local registry (distribution) paginates with Link when asked for one tag a page."""
    assert upstream.list_tags(nightlies["registry"], nightlies["upstream"].repository, page=1) == \
        ["latest", "nightly-a", "nightly-b"]


def test_a_tag_that_is_no_nightly_of_ours_is_skipped_not_fatal(pinned_project, nightlies):
    """An arm64 image and one claiming to be built next year sit among the nightlies: each is
    skipped with a line, the rest are kept, and the next run does not take them for a cut list."""
    n = nightlies
    put_tag(n["registry"], n["upstream"].with_digest(n["b"]), n["upstream"].with_tag("nightly-arm"),
            architecture="arm64")
    put_tag(n["registry"], n["upstream"].with_digest(n["b"]), n["upstream"].with_tag("nightly-future"),
            "2027-12-24T00:00:00Z")
    first = run_track(pinned_project, n, "--no-bump")
    assert first.returncode == 0, first.stderr
    assert "nightly-arm: not kept (an image for linux/arm64, not linux/amd64)" in first.stderr
    assert "nightly-future: not kept" in first.stderr and "in the future" in first.stderr
    assert {e["digest"] for e in ledger(pinned_project)["nightlies"]} == {str(n["a"]), str(n["b"])}
    again = run_track(pinned_project, n, "--no-bump")
    assert again.returncode == 0 and "(unchanged)" in again.stdout, again.stderr


def test_an_upstream_platform_reaches_the_log_inert(pinned_project, nightlies):
    """An image whose config names an architecture with a terminal escape and a line that GitHub's
    runner would take as a command: the line that skips it shows both escaped."""
    n = nightlies
    put_tag(n["registry"], n["upstream"].with_digest(n["b"]), n["upstream"].with_tag("nightly-odd"),
            architecture="arm64\x1b]0;owned\x07\n::add-mask::secret")
    done = run_track(pinned_project, n, "--no-bump")
    assert done.returncode == 0, done.stderr
    assert "nightly-odd: not kept (an image for linux/arm64\\x1b]0;owned\\x07\\x0a::add-mask::secret" in done.stderr
    assert "\x1b" not in done.stderr and not any(line.lstrip().startswith("::") for line in done.stderr.splitlines())


def test_bump_never_retires_an_overlay_on_the_base_s_own_word(pinned_project, nightlies, fixture_base, tmp_path):
    """The next nightly's own code proves the Gumbel fix: a person may retire the overlay with
    `invoke rebase`, but an unattended bump must not (a base's code runs inside its own proof and
    could print FIXED). Exit 11, overlays.yaml and the lock as they were, the report says why."""
    from bakery.base import spec as base_mod
    from bakery.base.filesystem import BaseFilesystem
    from bakery.inputs import overlays as overlays_mod, patch as patch_mod
    from support import ROOT, docker

    n, reg = nightlies, nightlies["registry"]
    o = next(o for o in overlays_mod.load(ROOT / "overlays" / "overlays.yaml") if o.id == "independent-draft-gumbel")
    stock = BaseFilesystem(reg, base_mod.resolve(reg, fixture_base, "linux/amd64")).read([o.target])[o.target.lstrip("/")]
    assert stock and stock.data, o.target
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "speculator.py").write_bytes(patch_mod.apply(o.parsed(), stock.data)[0])
    (tmp_path / "ctx" / "Dockerfile").write_text(f"FROM {fixture_base}\nCOPY speculator.py {o.target}\n")
    tag = f"{n['upstream'].name}:nightly-fixed"
    docker("build", "-q", "-t", tag, str(tmp_path / "ctx"))
    docker("push", tag)
    result = run_track(pinned_project, n, tags="nightly-[af]*")  # nightly-b (0.27.0) left out
    assert result.returncode == PORTING, result.stdout + result.stderr
    assert changed_paths(pinned_project) == {"image/nightlies.yaml"}
    entry = next(e for e in ledger(pinned_project)["nightlies"] if "nightly-fixed" in e["tags"])
    assert entry["tried"]["overlays"]["independent-draft-gumbel"] == "fixed-upstream"
    report = (pinned_project / "out" / "track" / "report.md").read_text()
    assert "confirm by hand" in report and "invoke rebase --base" in report


def test_the_report_carries_no_markup_from_the_base():
    """A proof's reason comes from code the base ships: in the pull request's body it may not end
    the table, hide the rest in an HTML comment, mention people or close issues."""
    from types import SimpleNamespace

    hostile = "x | y\r<!-- hidden\n``` Closes #1 @org/team [link](http://e.invalid)"
    nightly = ledger_mod.Nightly(Digest.of(b"n"), None, "2026-12-01T00:00:00Z", ledger_mod.Version("0.27.0", "abcdef0"),
                            ledger_mod.Version(None, None), "reg/m@" + str(Digest.of(b"n")), "2026-12-01T00:00:00Z",
                            ("nightly-b",))
    overlay = SimpleNamespace(id="cpu-kv-transfer-fence", baked=True)
    row = SimpleNamespace(overlay=overlay, status="ported (exact), proven", detail=hostile, carried=True)
    text = report_mod.report(bump_mod.Bump(nightly, "reg/u", [row], True, [hostile, "```"], "reg/u@sha256:" + "0" * 64),
                        Path("out/rebase"))
    table = [line for line in text.splitlines() if line.startswith("| cpu-kv")]
    assert len(table) == 1 and len(re.findall(r"(?<!\\)\|", table[0])) == 5, table
    fence = next(line for line in text.splitlines() if line.startswith("```"))
    assert len(fence) > 3 and text.count("\n" + fence + "\n") == 2  # longer than any run of backticks inside
    outside, log, rest = text.split("\n" + fence + "\n")
    for bad in ("<!--", "Closes #1", "@org", "](http", "\r"):
        assert bad not in outside + rest, bad
    assert "Closes #1" not in log and "@org" not in log and "\r" not in log  # code, but still no links or mentions
    assert upstream.read_versions({upstream.VERSION_FILES["vllm"]: b"__version__ = '1.0<!--x'\n"})["vllm"].version is None


def test_the_next_nightly_is_ours_to_order_not_upstream_s():
    """Which nightly bump tries next: first seen by the tracker, then the config's claim. A config
    claiming an old date cannot hide a nightly first seen after the pin, nor a later claim jump
    one seen with the pin."""
    def entry(name, created, seen, tried=None):
        return ledger_mod.Nightly(Digest.of(name.encode()), None, created, ledger_mod.Version("1", None), ledger_mod.Version("1", None),
                             "m@x", seen, (name,), tried=tried)
    pin = entry("pin", "2026-11-01T00:00:00Z", "2026-11-01T00:00:00Z")
    older_claim = entry("later-seen", "2020-01-01T00:00:00Z", "2026-11-02T00:00:00Z")
    same_run_older = entry("same-run", "2026-10-01T00:00:00Z", "2026-11-01T00:00:00Z")
    tried = entry("tried", "2026-11-03T00:00:00Z", "2026-11-03T00:00:00Z", ledger_mod.Tried("needs porting", {}))
    ledger_ = ledger_mod.Ledger("u", "m", (pin, older_claim, same_run_older, tried))
    assert bump_mod.pending(ledger_, pin.digest) is older_claim
    assert bump_mod.pending(ledger_mod.Ledger("u", "m", (pin, same_run_older, tried)), pin.digest) is None


def test_a_nightly_rolled_back_by_hand_is_not_bumped_again_but_one_a_kill_left_unpinned_is(tmp_path):
    """docs/release.md's rollback pins an older nightly by hand after a carried one: the next nightly
    run must not move the pin back (it did, each night, when every carried nightly newer than the pin
    counted as a bump stopped before its pin). Only the ledger's `pinning` mark, written before the
    checkout changes and cleared once the pin has moved, says a bump was stopped in between."""
    def entry(name, seen, tried=None) -> ledger_mod.Nightly:
        return ledger_mod.Nightly(Digest.of(name.encode()), None, seen, ledger_mod.Version("1", None),
                                  ledger_mod.Version("1", None), "m@x", seen, (name,), tried=tried)
    rolled_back_to = entry("old", "2026-11-01T00:00:00Z")
    rejected = entry("rejected", "2026-11-02T00:00:00Z", ledger_mod.Tried(ledger_mod.CARRIED, {"a": "carried"}))
    assert bump_mod.pending(ledger_mod.Ledger("u", "m", (rolled_back_to, rejected)), rolled_back_to.digest) is None
    assert rejected.tried is not None
    stopped = replace(rejected, tried=replace(rejected.tried, pinning=True))
    ledger_ = ledger_mod.Ledger("u", "m", (rolled_back_to, stopped))
    assert bump_mod.pending(ledger_, rolled_back_to.digest) is stopped
    # stopped after it moved the pin, before the record's mark was cleared: the pin itself is finished
    assert bump_mod.pending(ledger_, stopped.digest) is stopped
    path = tmp_path / "nightlies.yaml"  # the mark survives the file, and is absent once cleared
    ledger_mod.write_ledger(path, ledger_)
    assert "pinning: true" in path.read_text() and ledger_mod.load_ledger(path).find(stopped.digest) == stopped
    ledger_mod.write_ledger(path, ledger_mod.Ledger("u", "m", (rolled_back_to, rejected)))
    assert "pinning:" not in path.read_text()


def test_a_mark_left_by_a_bump_a_newer_nightly_overtook_is_cleared_by_the_next_outcome():
    """Found by review: a bump killed after its mark, then overtaken by a newer nightly's bump (the
    newest goes first), kept its mark for good; rolled back by hand below it, the pin went to that
    nightly the next night, which is what the mark was meant to stop."""
    def entry(name, seen, tried=None) -> ledger_mod.Nightly:
        return ledger_mod.Nightly(Digest.of(name.encode()), None, seen, ledger_mod.Version("1", None),
                                  ledger_mod.Version("1", None), "m@x", seen, (name,), tried=tried)
    old = entry("old", "2026-11-01T00:00:00Z")
    left = entry("left", "2026-11-02T00:00:00Z", ledger_mod.Tried(ledger_mod.CARRIED, {"a": "carried"}, pinning=True))
    newer = entry("newer", "2026-11-03T00:00:00Z")
    ledger_ = ledger_mod.Ledger("u", "m", (old, left, newer))
    assert bump_mod.pending(ledger_, old.digest) is newer  # the newest first: `left` waits behind it
    # `newer` not carried (or carried, its pin not yet moved): the checkout may hold `left`'s lock, so
    # `left` is still finished next (review of the first version of this fix, which cleared it here)
    porting = bump_mod.with_outcome(ledger_, newer, ledger_mod.Tried(ledger_mod.NEEDS_PORTING, {"a": "conflict"}))
    assert bump_mod.pending(porting, old.digest) == left
    before_pin = bump_mod.with_outcome(ledger_, newer, ledger_mod.Tried(ledger_mod.CARRIED, {}, pinning=True))
    assert before_pin.find(left.digest) == left
    pinned = bump_mod.with_outcome(ledger_, newer, ledger_mod.Tried(ledger_mod.CARRIED, {"a": "carried"}), pinned=True)
    left_now = pinned.find(left.digest)
    assert left_now is not None and left_now.tried is not None and not left_now.tried.pinning
    assert left_now.tried.outcome == ledger_mod.CARRIED  # still tried: only the mark goes
    assert bump_mod.pending(pinned, old.digest) is None  # rolled back to `old` by hand: nothing to bump


def test_an_upstream_that_floods_new_nightlies_is_refused_before_copying(pinned_project, nightlies, monkeypatch):
    """More new digests in one run than MAX_NEW: refused with one line before anything is mirrored
    or recorded (a hostile or mistaken upstream cannot fill the mirror and the ledger)."""
    from bakery.errors import InputError

    n = nightlies
    monkeypatch.setattr(tracker, "MAX_NEW", 1)
    with pytest.raises(InputError, match="offers 2 nightlies not yet kept .* more than 1 in one run"):
        tracker.track(pinned_project, n["upstream"].name, n["mirror"].name, "*",
                    pinned_project / "image" / "nightlies.yaml", "linux/amd64", log=lambda m: None)
    assert not (pinned_project / "image" / "nightlies.yaml").exists()
    assert not n["registry"].manifest_exists(n["mirror"].repository, n["b"])


def test_the_listing_names_only_what_needs_porting():
    """An audit record kept by hand (status check-by-hand) is no port to do: `invoke track --list`
    named it beside the overlays that need porting (the filter looked for "by hand")."""
    from bakery.oci.refs import Digest

    pin = ledger_mod.Nightly(Digest.parse("sha256:" + "a" * 64), None, "2026-07-01T00:00:00Z",
                             ledger_mod.Version("0.26.0", None), ledger_mod.Version("0.1.18", None), "m@x",
                             "2026-07-01T00:00:00Z", ("nightly-a",))
    tried = ledger_mod.Tried("needs porting", {"a-port": "needs porting", "b-moved": "target moved",
                                               "c-hand": "check-by-hand", "d-audit": "audit changed: re-check",
                                               "e-carried": "ported (exact), proven"})
    newer = ledger_mod.Nightly(Digest.parse("sha256:" + "b" * 64), None, "2026-07-02T00:00:00Z",
                               ledger_mod.Version("0.27.0", None), ledger_mod.Version("0.1.19", None), "m@y",
                               "2026-07-02T00:00:00Z", ("nightly-b",), tried=tried)
    rows = ledger_mod.listing(ledger_mod.Ledger("up", "m", (newer, pin)), pin.digest)
    assert "needs porting: a-port, b-moved (target moved)  " in rows[0]  # and nothing after them
    assert "the current pin" in rows[1]
