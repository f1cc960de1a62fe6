"""The stack ops run today, rendered from a build record: the pinned base, unchanged, with each file
our layers bake bind-mounted read-only at its path, as the seed deployment's compose mounts its
overlays, and the service started with the image's environment and `vllm serve` arguments. The
acceptance gate serves it as the reference of a first release: the baked image must serve the same
bytes as the hand-mounted stack it replaces.

What a bind mount cannot do, it does not: the base files our layers delete (stale bytecode, say)
stay in the stack, as they stayed in the seed's."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path, PurePosixPath

from ..errors import InputError, IntegrityError
from ..trust.record import BuildRecord

LIMIT = 1 << 30  # one baked file (a kernel bundle is megabytes)


def mounted_files(record: BuildRecord) -> list[tuple[str, str]]:
    """(path in the image, sha256) of each regular file our layers hold; the self-check and entrypoint
    of the derived image are ours, not the seed's, and are left out."""
    ours = {"/usr/local/bin/bakery-entrypoint", "/usr/local/bin/bakery-selfcheck", "/etc/bakery/manifest.json"}
    seen: dict[str, str] = {}
    for f in record.files:  # a later layer's file replaces an earlier one at the same path
        path = "/" + f.path.lstrip("/")
        if path not in ours:
            seen[path] = f.sha256
    return sorted(seen.items())


def stage(container_archive, record: BuildRecord, dest: Path) -> dict[str, str]:
    """Write each mounted file, read from the candidate (container_archive(path) -> tar bytes, as
    Docker's get_archive gives them), into dest; each is checked against the record's sha256.
    Returns {host path: path in the image}."""
    out = {}
    for i, (path, sha256) in enumerate(mounted_files(record)):
        data = _one_file(container_archive(path), PurePosixPath(path).name, path)
        if hashlib.sha256(data).hexdigest() != sha256:
            raise IntegrityError(f"{path} in the candidate is not the bytes its build record names (sha256:{sha256})")
        host = dest / f"{i:03d}-{PurePosixPath(path).name}"
        host.write_bytes(data)
        host.chmod(0o444)
        out[str(host)] = path
    return out


def _one_file(archive: bytes, name: str, path: str) -> bytes:
    """The one regular file named `name` of a tar stream of one path; anything else is refused."""
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
            members = tar.getmembers()
            if len(members) != 1 or not members[0].isreg() or members[0].name != name or members[0].size > LIMIT:
                raise IntegrityError(f"{path} in the candidate is not one regular file")
            f = tar.extractfile(members[0])
            assert f is not None  # a regular member has a file object
            return f.read()
    except tarfile.TarError as e:
        raise IntegrityError(f"{path}: Docker's archive of it is not a tar stream: {e}") from None


def bounded(chunks, limit: int = LIMIT + (1 << 20)) -> bytes:
    """Docker's archive of one path, read up to a file's limit and its tar headers: a path that
    names a folder (/usr) is refused before gigabytes are held."""
    out, size = [], 0
    for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise IntegrityError(f"Docker's archive of a baked file is over {limit} bytes: not one file")
        out.append(chunk)
    return b"".join(out)


def launch(base: str, env: list[str], staged: dict[str, str], model_options: dict) -> dict:
    """docker run settings of the seed-style stack, over the candidate's (model_options: the
    production launch of smoke.launch_options, with the path's command): the base instead of our image,
    `vllm serve` behind a clean-up of stale CPU-KV files as its entrypoint (what the seed's
    vllm-entrypoint.sh does, and ours), the candidate's environment (env: its config's KEY=VALUE
    list), and each staged file mounted read-only."""
    if "@sha256:" not in base:
        raise InputError(f"the seed-style stack runs a pinned base, not {base}")
    volumes = dict(model_options.get("volumes", {}))
    volumes.update({host: {"bind": path, "mode": "ro"} for host, path in staged.items()})
    clean = "find /dev/shm -maxdepth 1 -type f -name 'vllm_offload_*.mmap' -delete; exec vllm serve \"$@\""
    return {**model_options, "image": base, "entrypoint": ["/bin/sh", "-c", clean, "vllm-serve"],
            "environment": list(env), "volumes": volumes}
