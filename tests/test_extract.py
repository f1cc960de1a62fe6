"""Reading base files out of real images, checked against what Docker itself shows in a container."""

from __future__ import annotations

import functools
import gzip
import io
import json
import os
import subprocess
import tarfile
import time
from collections.abc import Sequence

import pytest

from bakery.base import spec as base_mod
from bakery.base.filesystem import BaseFilesystem
from bakery.base.layercache import LayerCache
from bakery.oci.refs import Descriptor, Reference
from bakery.oci.registry import OCI_MANIFEST, Registry
from support import docker

SITE = "usr/local/lib/python3.12/dist-packages"
WORKER = f"{SITE}/vllm/v1/kv_offload/cpu/gpu_worker.py"


def tar_layer(entries: Sequence[tuple[str, bytes | None]]) -> bytes:
    """A test-made layer; None content means a directory."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in entries:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture(scope="module")
def whiteout_image(registry, fixture_base):
    """The fixture plus two layers exercising whiteouts and an opaque directory, pushed to the registry.

    The layers are made here with tarfile; Docker then pulls the image and is the judge of what a
    container sees.
    """
    reg = Registry(registry)
    base = base_mod.resolve(reg, fixture_base, "linux/amd64")
    cpu = f"{SITE}/vllm/v1/kv_offload/cpu"
    layer1 = tar_layer([(f"{SITE}/vllm/.wh.version.py", b""),  # delete a file
                        (f"{cpu}/.wh..wh..opq", b""),  # hide everything below cpu/ ...
                        (f"{cpu}/only_new.py", b"NEW = True\n"),  # ... except what this layer adds
                        (f"{SITE}/vllm/envs.py", b"REPLACED = 1\n")])  # replace a file
    layer2 = tar_layer([(f"{SITE}/vllm/envs.py", b"REPLACED = 2\n")])  # replace the replacement
    repo = "test/whiteouts"
    config = base.config
    layers = list(base.layers)
    for raw in (layer1, layer2):
        blob = gzip.compress(raw, mtime=0)
        desc = Descriptor.of("application/vnd.oci.image.layer.v1.tar+gzip", blob)
        reg.upload_blob(repo, desc, functools.partial(iter, [blob]))
        layers.append(desc)
        config["rootfs"]["diff_ids"].append(str(Descriptor.of("", raw).digest))
    for d in base.layers:
        reg.mount_blob(repo, d.digest, base.ref.repository)
    cfg = json.dumps(config).encode()
    cfg_desc = Descriptor.of("application/vnd.oci.image.config.v1+json", cfg)
    reg.upload_blob(repo, cfg_desc, lambda: iter([cfg]))
    manifest = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": cfg_desc.to_json(),
                           "layers": [Descriptor(
                               "application/vnd.oci.image.layer.v1.tar+gzip", d.digest, d.size).to_json()
                               for d in layers]}).encode()
    digest = reg.put_manifest(repo, "latest", manifest, OCI_MANIFEST)
    return Reference(registry, repo, None, digest)


def in_container(ref: Reference, paths: list[str]) -> dict[str, str | None]:
    """What Docker's own container filesystem holds at each path (None: absent)."""
    docker("pull", "-q", str(ref))
    script = "; ".join(f'if [ -f "/{p}" ]; then echo "{p}=$(sha256sum < "/{p}" | cut -c1-64)"; '
                       f'else echo "{p}=-"; fi' for p in paths)
    out = docker("run", "--rm", "--entrypoint", "/bin/sh", str(ref), "-c", script).stdout
    found = dict(line.split("=", 1) for line in out.splitlines())
    return {p: (None if found[p] == "-" else found[p]) for p in paths}


def test_whiteouts_and_opaque_dirs_match_docker(registry, whiteout_image, tmp_path):
    paths = [f"{SITE}/vllm/version.py", WORKER, f"{SITE}/vllm/v1/kv_offload/cpu/only_new.py",
             f"{SITE}/vllm/envs.py", f"{SITE}/vllm/__init__.py", "etc/debian_version"]
    reg = Registry(registry)
    image = base_mod.resolve(reg, whiteout_image, "linux/amd64")
    ours = BaseFilesystem(reg, image, LayerCache(tmp_path)).read(paths)
    truth = in_container(whiteout_image, paths)
    assert truth[WORKER] is None and truth[f"{SITE}/vllm/envs.py"] is not None  # the case is real
    assert {p: (f.sha256 if f else None) for p, f in ours.items()} == truth
    envs = ours[f"{SITE}/vllm/envs.py"]
    assert envs and envs.data == b"REPLACED = 2\n"


def test_rm_in_a_docker_build_is_honoured(registry, fixture_base, tmp_path):
    """Whiteouts as Docker's own builder writes them (RUN rm / rm -rf + mkdir)."""
    (tmp_path / "Dockerfile").write_text(
        f"FROM {fixture_base}\n"
        f"RUN rm /{WORKER} && rm -rf /{SITE}/aiter/configs && mkdir /{SITE}/aiter/configs "
        f"&& echo tuned > /{SITE}/aiter/configs/only.csv\n")
    tag = f"{registry}/test/docker-rm:latest"
    docker("build", "-q", "-t", tag, str(tmp_path))
    push = docker("push", tag).stdout
    digest = [w for w in push.split() if w.startswith("sha256:")][0]
    ref = Reference.parse(f"{registry}/test/docker-rm@{digest}")
    paths = [WORKER, f"{SITE}/aiter/configs/only.csv", f"{SITE}/aiter/configs/a8w8_tuned_gemm.csv",
             f"{SITE}/vllm/v1/kv_offload/cpu/spec.py"]
    reg = Registry(registry)
    ours = BaseFilesystem(reg, base_mod.resolve(reg, ref, "linux/amd64"), LayerCache(tmp_path / "c")).read(paths)
    assert {p: (f.sha256 if f else None) for p, f in ours.items()} == in_container(ref, paths)


def test_zstd_layers(registry, fixture_base, tmp_path):
    """skopeo recompresses the fixture with zstd; the same files come out."""
    dest = f"{registry}/test/zstd-{time.time_ns()}:latest"
    # skopeo's blob-info cache would reuse the gzip blobs it knows the registry has: start it empty
    env = {**os.environ, "HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "xdg")}
    for cache in ("/var/lib/containers/cache/blob-info-cache-v1.boltdb",):
        if os.path.exists(cache):
            os.unlink(cache)
    subprocess.run(["skopeo", "copy", "-q", "--format", "oci", "--dest-compress-format", "zstd",
                    "--src-tls-verify=false", "--dest-tls-verify=false",
                    f"docker://{fixture_base}", f"docker://{dest}"], check=True, capture_output=True, env=env)
    reg = Registry(registry)
    zimage = base_mod.resolve(reg, Reference.parse(dest), "linux/amd64")
    assert all("zstd" in d.media_type for d in zimage.layers)
    gimage = base_mod.resolve(reg, fixture_base, "linux/amd64")
    a = BaseFilesystem(reg, zimage, LayerCache(tmp_path / "z")).read([WORKER])[WORKER]
    b = BaseFilesystem(reg, gimage, LayerCache(tmp_path / "g")).read([WORKER])[WORKER]
    assert a and b and a.data and a.data == b.data and b"wait_stream" in a.data


def test_warm_cache_downloads_nothing(registry, fixture_base, tmp_path):
    reg = Registry(registry)
    image = base_mod.resolve(reg, fixture_base, "linux/amd64")
    cold = BaseFilesystem(reg, image, LayerCache(tmp_path))
    first = cold.read([WORKER, "etc/os-release"])
    assert cold.cache.downloads > 0
    warm = BaseFilesystem(reg, image, LayerCache(tmp_path))
    assert warm.read([WORKER, "etc/os-release"]) == first
    assert warm.glob(f"{SITE}/*.dist-info/METADATA")
    assert warm.cache.downloads == 0
    # a file not asked for before: only its layer is streamed again
    warm.read([f"{SITE}/vllm/envs.py"])
    assert warm.cache.downloads == 1


def test_what_a_build_resolved_once_needs_no_layer_index_again(registry, fixture_base, tmp_path):
    """A production base's layer indexes hold hundreds of thousands of entries: a warm build must
    answer the paths and globs it asked before from the image's view, without them."""
    reg = Registry(registry)
    image = base_mod.resolve(reg, fixture_base, "linux/amd64")
    pattern = f"{SITE}/*.dist-info/METADATA"
    cold = BaseFilesystem(reg, image, LayerCache(tmp_path))
    first, dists = cold.read([WORKER, "etc/os-release", "no/such/file"]), cold.glob(pattern)
    assert first["no/such/file"] is None and dists
    for index in (tmp_path / "layers").iterdir():
        index.unlink()
    warm = BaseFilesystem(reg, image, LayerCache(tmp_path))
    assert warm.read([WORKER, "etc/os-release", "no/such/file"]) == first and warm.glob(pattern) == dists
    assert warm.cache.downloads == 0 and not any((tmp_path / "layers").iterdir())


def test_a_view_of_the_wrong_shape_is_dropped_even_with_a_matching_checksum(registry, fixture_base, tmp_path,
                                                                             capsys):
    import hashlib
    import json

    reg = Registry(registry)
    image = base_mod.resolve(reg, fixture_base, "linux/amd64")
    first = BaseFilesystem(reg, image, LayerCache(tmp_path)).read([WORKER])
    path = tmp_path / "views" / f"{image.manifest_digest.hex}.json"
    header, _, body = path.read_bytes().partition(b"\n")
    view = json.loads(body)
    view["paths"][WORKER] = view["paths"][WORKER][:5]
    body = json.dumps(view).encode()
    meta = {**json.loads(header), "sha256": hashlib.sha256(body).hexdigest()}
    path.write_bytes(json.dumps(meta).encode() + b"\n" + body)
    assert BaseFilesystem(reg, image, LayerCache(tmp_path)).read([WORKER]) == first
    assert "dropped a corrupt cache entry, image view" in capsys.readouterr().err


def test_symlinks_are_reported_as_such(registry, fixture_base, tmp_path):
    reg = Registry(registry)
    fs = BaseFilesystem(reg, base_mod.resolve(reg, fixture_base, "linux/amd64"), LayerCache(tmp_path))
    found = fs.read(["usr/bin/python3", "bin"])
    python, bin_ = found["usr/bin/python3"], found["bin"]
    assert python and python.kind == "symlink"
    assert bin_ and bin_.kind == "symlink"  # bookworm's merged /usr


class _Blob:
    """A registry serving one blob in small pieces, its digest checked at the end as stream_blob
    checks it (`lie`: the check fails, as for bytes corrupted on the way)."""

    def __init__(self, blob: bytes, piece: int = 1000, lie: bool = False):
        self.blob, self.piece, self.lie = blob, piece, lie

    def stream_blob(self, repo, desc, label=None):
        from bakery.oci.registry import check_digest
        for i in range(0, len(self.blob), self.piece):
            yield self.blob[i:i + self.piece]
        check_digest(desc, "0" * 64 if self.lie else desc.digest.hex, len(self.blob), "test")


def test_layer_streams_decode_as_gzipfile_reads_them_and_a_bad_digest_is_named_first(tmp_path):
    """The diff_id is the sha256 of the whole tar stream (end padding included), whatever the pieces:
    gzip members one after another with zero padding after a member, multi-frame zstd, plain tar.
    A stream cut short, zeros before the first member, or trailing garbage is refused; where the
    digest is wrong too, that is what the error names."""
    import hashlib

    import pytest
    import zstandard

    from bakery.base.scan import scan_layer
    from bakery.errors import IntegrityError

    raw = tar_layer([(f"d/f{i}", os.urandom(i * 300)) for i in range(40)] + [("d/x", b"wanted")])
    diff_id = f"sha256:{hashlib.sha256(raw).hexdigest()}"
    gz = "application/vnd.oci.image.layer.v1.tar+gzip"
    cut = [raw[:700], raw[700:9000], raw[9000:]]

    def scan(blob, media_type=gz, **kw):
        return scan_layer(_Blob(blob, **kw), "r", Descriptor.of(media_type, blob), {"d/x"}, LayerCache(tmp_path))

    multi = gzip.compress(cut[0]) + b"\0" * 5 + gzip.compress(cut[1]) + gzip.compress(b"") + \
        gzip.compress(cut[2]) + b"\0" * 700
    zstd = b"".join(zstandard.ZstdCompressor().compress(c) for c in cut)
    for blob, media_type in ((gzip.compress(raw), gz), (multi, gz), (raw, "application/vnd.oci.image.layer.v1.tar"),
                             (zstd, "application/vnd.oci.image.layer.v1.tar+zstd")):
        for piece in (61, 4096, 1 << 20):
            index, found, _ = scan(blob, media_type, piece=piece)
            assert index["diff_id"] == diff_id and len(index["entries"]) == 41 and set(found) == {"d/x"}
    for bad in (gzip.compress(raw)[:-9], b"\0\0" + gzip.compress(raw), gzip.compress(raw) + b"junk"):
        with pytest.raises(IntegrityError, match="is not a readable"):
            scan(bad)
        with pytest.raises(IntegrityError, match="does not match its descriptor"):
            scan(bad, lie=True)


def test_a_big_member_is_skipped_without_copying_and_a_cut_one_is_refused():
    """TarReader drops a big member's data through the pipeline stream's skip(): the members
    after it are still found where tarfile finds them, and a stream cut inside it is an error."""
    from bakery.base.scan import _Pieces
    from bakery.oci.tarscan import TarError, TarReader

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, size in (("big.bin", (3 << 20) + 7), ("after", 5), ("big2.bin", 2 << 20), ("last", 0)):
            info = tarfile.TarInfo(name)
            info.size = size
            tar.addfile(info, io.BytesIO(os.urandom(size)))
    data = buf.getvalue()

    def pieces(blob: bytes, size: int):
        parts = iter([blob[i:i + size] for i in range(0, len(blob), size)])
        return _Pieces(lambda: next(parts, b""))

    want = [(m.name, m.size) for m in tarfile.open(fileobj=io.BytesIO(data))]
    for size in (1000, 1 << 20, 5 << 20):
        stream = pieces(data, size)
        assert hasattr(stream, "skip")
        assert [(m.name, m.size) for m in TarReader(stream)] == want
    with pytest.raises(TarError, match="unexpected end of data"):
        list(TarReader(pieces(data[:2 << 20], 1 << 16)))
