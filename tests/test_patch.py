"""The unified-diff applier: exact or nothing; offsets only reported. Checked against GNU patch."""

from __future__ import annotations

import subprocess

import pytest

from bakery.errors import InputError
from bakery.inputs.patch import PatchConflict, apply, parse, unified_diff

OLD = b"".join(b"line %d\n" % i for i in range(1, 21))
NEW = OLD.replace(b"line 5\n", b"line five\n").replace(b"line 15\n", b"line 15\nadded\n")


def test_round_trip_with_our_diff_and_gnu_patch(tmp_path):
    diff = unified_diff(OLD, NEW, "pkg/mod.py")
    result, worst = apply(parse(diff, "t"), OLD)
    assert result == NEW and worst == 0
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_bytes(OLD)
    subprocess.run(["patch", "-p1", "-s", "--fuzz=0"], input=diff, cwd=tmp_path, check=True)
    assert (tmp_path / "pkg" / "mod.py").read_bytes() == NEW  # GNU patch agrees


def test_moved_code_is_a_conflict_unless_offsets_are_allowed():
    diff = parse(unified_diff(OLD, NEW, "m.py"), "t")
    shifted = b"# new header\n# two\n" + OLD
    with pytest.raises(PatchConflict) as e:
        apply(diff, shifted)
    assert e.value.offset == 2
    result, worst = apply(diff, shifted, allow_offset=True)
    assert result == b"# new header\n# two\n" + NEW and worst == 2


def test_changed_context_is_a_conflict_everywhere():
    diff = parse(unified_diff(OLD, NEW, "m.py"), "t")
    with pytest.raises(PatchConflict) as e:
        apply(diff, OLD.replace(b"line 4\n", b"line four\n"), allow_offset=True)
    assert e.value.offset is None


def test_no_newline_at_end_of_file():
    diff = b"--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+c\n\\ No newline at end of file\n"
    assert apply(parse(diff, "t"), b"a\nb")[0] == b"a\nc"


def test_new_file_from_dev_null():
    diff = b"--- /dev/null\n+++ b/pkg/new.py\n@@ -0,0 +1,2 @@\n+x = 1\n+y = 2\n"
    p = parse(diff, "t")
    assert p.old_path == "/dev/null" and apply(p, b"")[0] == b"x = 1\ny = 2\n"


@pytest.mark.parametrize("data, message", [
    (unified_diff(OLD, NEW, "m.py").replace(b"\n", b"\r\n"), "CRLF"),
    (b"diff --git a/x.so b/x.so\nGIT binary patch\nliteral 4\nabc\n", "binary"),
    (b"Binary files a/x.so and b/x.so differ\n", "binary"),
    (unified_diff(OLD, NEW, "a.py") + unified_diff(OLD, NEW, "b.py"), "more than one file"),
    (b"just text\n", "no unified diff header"),
    (b"--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n a\n-b\n", "truncated"),
])
def test_bad_patches(data, message):
    with pytest.raises(InputError, match=message):
        parse(data, "p.patch")


def test_an_offset_is_taken_only_where_the_hunk_fits_one_place():
    """Moved code whose context now appears twice: the nearest fit is a guess, not a port. Written
    from the rule, against GNU patch's habit of taking the nearest: both places must be refused."""
    block = b"".join(b"line %d\n" % i for i in range(2, 9))  # what the first hunk finds: lines 2..8
    diff = parse(unified_diff(OLD, NEW, "m.py"), "t")
    twice = b"# header\n" + OLD.replace(b"line 1\n", b"line 1\n" + block + b"gap\n", 1)
    with pytest.raises(PatchConflict) as e:
        apply(diff, twice, allow_offset=True)
    assert e.value.places == 2 and "fits 2 places elsewhere" in str(e.value)
    once = b"# header\n" + OLD  # the control: one place, the same distance
    assert apply(diff, once, allow_offset=True)[1] == 1
