"""What reading a hostile base's layers costs grows with what they name, not with its square:
counted here (items read, lines run), never timed; bench/bench_bounds.py times the worst cases at
the real bounds. Each count is one that the quadratic ways this code once had would exceed
(a glob stepping through every path before its prefix, each layer checked against each below)."""

from __future__ import annotations

import sys
from unittest import mock

import bakery.base.filesystem as filesystem_mod
from bakery.base.filesystem import BaseFilesystem
from bakery.oci.refs import Descriptor

FILESYSTEM = filesystem_mod.__file__  # as its code objects name it


class CountedPaths(list):
    """A sorted list of paths that counts the items read from it, by index (a bisection) or by
    walking it (an islice from the start walks every item before where it was asked to begin)."""

    def __init__(self, items):
        super().__init__(items)
        self.read = 0

    def __getitem__(self, at):
        self.read += 1
        return super().__getitem__(at)

    def __iter__(self):
        for item in super().__iter__():
            self.read += 1
            yield item


def base_of(indexes: list[dict]) -> BaseFilesystem:
    """A BaseFilesystem over these layer indexes, as the layer cache would give them (no registry)."""
    descs = [Descriptor.of("application/vnd.oci.image.layer.v1.tar", str(n).encode()) for n in range(len(indexes))]
    for n, index in enumerate(indexes):
        index.setdefault("whiteouts", []), index.setdefault("opaque", []), index.setdefault("files", {})
        index["diff_id"] = "sha256:" + f"{n:064x}"
    by_digest = dict(zip((d.digest for d in descs), indexes, strict=True))
    image = mock.Mock(layers=descs, config={"rootfs": {"diff_ids": [i["diff_id"] for i in indexes]}}, ref="hostile",
                      manifest_digest="sha256:" + "f" * 64)
    cache = mock.Mock(index=lambda d: by_digest[d.digest], view=lambda digest: {"paths": {}, "globs": {}})
    return BaseFilesystem(mock.Mock(), image, cache)


def lines_run(call) -> int:
    """How many lines of bakery/base/filesystem.py `call` runs (deterministic for given inputs)."""
    count = 0

    def trace(frame, event, arg):
        nonlocal count
        if frame.f_code.co_filename != FILESYSTEM:
            return None
        if event == "line":
            count += 1
        return trace

    sys.settrace(trace)
    try:
        call()
    finally:
        sys.settrace(None)
    return count


def test_a_glob_reads_only_the_paths_under_its_prefix_in_each_layer():
    """20,000 paths in each of four layers, a pattern under a prefix that sorts last: a bisection
    reads a few dozen items a layer; walking to the prefix would read all 80,000."""
    layers = [{"entries": {f"usr/lib/x{n}/f{i:06d}": ["file", 0, 0o644, ""] for i in range(20_000)} |
               {f"zz/m{n}.py": ["file", 0, 0o644, ""]}} for n in range(4)]
    fs = base_of(layers)
    counted: dict[str, CountedPaths] = {}

    def sorted_paths(desc, index):
        return counted.setdefault(desc.digest, CountedPaths(sorted(index["entries"])))

    with mock.patch.object(fs, "_sorted_paths", sorted_paths):
        assert fs.glob("zz/m*.py") == [f"zz/m{n}.py" for n in range(4)]
    read = sum(c.read for c in counted.values())
    assert 0 < read <= 4 * (2 * 20_001 .bit_length() + 4), read


def test_the_merge_check_runs_in_lines_proportional_to_what_the_layers_name():
    """300 layers of three names each under one folder none of them gives, and 2,000 paths whited out
    by the last: one pass bottom up runs under two dozen lines a name; each layer checked against every
    layer below it would run the loop over the layers below 45,000 times."""
    layers: list[dict] = [{"entries": {f"d/f{n}-{i}": ["file", 0, 0o644, ""] for i in range(3)}} for n in range(300)]
    layers.insert(0, {"entries": {f"w/{i:04d}": ["file", 0, 0o644, ""] for i in range(2000)}})
    layers.append({"entries": {}, "whiteouts": [f"w/{i:04d}" for i in range(2000)]})
    fs = base_of(layers)
    named = sum(len(layer["entries"]) + len(layer["whiteouts"]) for layer in layers)
    ran = lines_run(fs.check_merge)
    assert fs.view["merge_checked"]
    assert ran <= 25 * named, (ran, named)
    # the control: the count grows with the layers' names (twice the names, about twice the lines)
    doubled = [{"entries": {f"d/f{n}-{i}": ["file", 0, 0o644, ""] for i in range(3)}} for n in range(600)]
    assert lines_run(base_of(doubled).check_merge) > 1.5 * lines_run(base_of(doubled[:300]).check_merge)
