"""Same inputs, same digest: whatever the directory, TMPDIR, umask, TZ or wall-clock time."""

from __future__ import annotations

import json
import time
from pathlib import Path

from support import copy_project, invoke, last_line


def test_same_inputs_same_digest_different_everything_else(fixture_base, fixture_lock, tmp_path):
    a = copy_project(tmp_path / "one" / "checkout", fixture_lock)
    b = copy_project(tmp_path / "two" / "deeper" / "other-name", fixture_lock)
    (tmp_path / "tmp-a").mkdir()
    (tmp_path / "tmp-b").mkdir()
    first = invoke(a, "build", "--base", str(fixture_base),
                   env={"TMPDIR": str(tmp_path / "tmp-a"), "TZ": "UTC"}, umask=0o022)
    time.sleep(1.5)  # a different second on the wall clock
    second = invoke(b, "build", "--base", str(fixture_base),
                    env={"TMPDIR": str(tmp_path / "tmp-b"), "TZ": "Asia/Shanghai", "LC_ALL": "C"}, umask=0o077,
                    cwd=tmp_path)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert last_line(first) == last_line(second)
    assert (a / "out" / "blobs").exists() and sorted(p.name for p in (a / "out" / "blobs" / "sha256").iterdir()) \
        == sorted(p.name for p in (b / "out" / "blobs" / "sha256").iterdir())


def test_one_changed_input_byte_changes_the_digest(project, fixture_base):
    a = project
    before = invoke(a, "build", "--base", str(fixture_base))
    script = a / "image" / "entrypoint.sh"
    script.write_bytes(script.read_bytes().replace(b"set -eu", b"set -eu "))
    after = invoke(a, "build", "--base", str(fixture_base))
    assert before.returncode == after.returncode == 0, after.stderr
    assert last_line(before) != last_line(after)


def test_source_date_epoch_is_the_only_clock(project, fixture_base):
    a = project
    one = invoke(a, "build", "--base", str(fixture_base), env={"SOURCE_DATE_EPOCH": "1700000000"})
    two = invoke(a, "build", "--base", str(fixture_base), env={"SOURCE_DATE_EPOCH": "1700000001"})
    assert last_line(one) != last_line(two)
    bad = invoke(a, "build", "--base", str(fixture_base), env={"SOURCE_DATE_EPOCH": "yesterday"})
    assert bad.returncode == 2 and "SOURCE_DATE_EPOCH" in bad.stderr


def test_a_cold_build_streams_each_base_layer_once_and_gives_the_warm_digest(project, fixture_base, tmp_path):
    """The speed-ups (one concurrent pass over the layers, keeping every file the build will need)
    change no output byte: a build with empty layer and file caches gives the warm build's digest."""
    import os
    import shutil

    warm = invoke(project, "build", "--base", str(fixture_base))
    assert warm.returncode == 0, warm.stderr
    cache = tmp_path / "cache"
    src = Path(os.environ.get("BAKERY_CACHE", Path.home() / ".cache" / "bakery"))
    for keep in ("proofs", "hip"):  # proving and compiling are not what is measured here
        shutil.copytree(src / keep, cache / keep)
    cold = invoke(project, "build", "--base", str(fixture_base), env={"BAKERY_CACHE": str(cache)})
    assert cold.returncode == 0, cold.stderr
    record = json.loads((project / "out" / "build-record.json").read_text())
    assert last_line(cold) == last_line(warm)
    assert record["layer_downloads"] == len(record["base"]["layers"])
