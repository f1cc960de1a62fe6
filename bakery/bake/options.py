"""What `invoke build` (and lock, prove, rebase) is asked to do: its flags, as typed values."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from ..oci.refs import Reference
from ..project import Project


@dataclass(frozen=True)
class Options:
    """What `invoke build` (and lock, prove, rebase) was asked: the flags, as typed values."""
    project: Path
    base: str | None = None  # REF@DIGEST overriding image/base.yaml
    push: str | None = None  # REGISTRY/REPO[:TAG]
    layout: Path | None = None
    out: Path | None = None  # where blobs and the record go; default PROJECT/out
    lock: Path | None = None  # overlays lock; default PROJECT/overlays/overlays.lock
    toolchain: str | None = None  # image to compile hip/ in (hip_compile.toolchain_image: its default)
    keys: tuple[Path, ...] = ()  # release public keys, beside the policy's: who may vouch for kernels
    policy: Path | None = None  # default PROJECT/provenance/policy.yaml
    recompile: bool = False  # compile hip/ here even where the registry holds a signed artifact
    reprove: bool = False  # run every proof here, whatever this machine or the registry holds
    device: str = "cpu"  # where `invoke prove` runs the proofs' Triton kernels: cpu (interpreted) or cuda
    base_mirror: str | None = None  # with base: read that digest from this REGISTRY/REPO (a kept nightly)

    @classmethod
    def from_flags(cls, project: Path, *, layout=None, out=None, lock=None, key=None, policy=None, **rest) -> Options:
        """From a task's flags, by name (strings as given; key: one release public key)."""
        as_path = lambda v: Path(v) if v else None  # noqa: E731 (one line, used four times below)
        return cls(project, layout=as_path(layout), out=as_path(out), lock=as_path(lock),
                   keys=(Path(key),) if key else (), policy=as_path(policy), **rest)

    @property
    def out_dir(self) -> Path:
        return self.out or Project(self.project).out

    @property
    def lock_path(self) -> Path:
        return self.lock or Project(self.project).lock

    @property
    def policy_path(self) -> Path:
        return self.policy or Project(self.project).policy

    def push_target(self) -> Reference | None:
        """--push as REGISTRY/REPO[:TAG], parsed once; a digest is refused (it is computed)."""
        target = Reference.parse(self.push) if self.push else None
        if target and target.digest:
            raise InputError(f"--push {self.push!r}: give REGISTRY/REPO[:TAG]; the digest is computed")
        return target
