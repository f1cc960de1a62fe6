"""What each stage of `invoke build` returns (bake/pipeline.py runs them in order; bake/record.py
makes the build record of them as they are)."""

from __future__ import annotations

from dataclasses import dataclass

from ..inputs import hip as hip_mod, hip_compile, tuning as tuning_mod
from ..oci.layer import FileEntry
from ..trust.record import Verdict
from .publish import Derived


@dataclass(frozen=True)
class Overlays:
    """Every registered overlay, the required ones applied to the base and proven, and the stale
    bytecode of their targets to delete."""
    registered: list
    applied: list
    stale: list
    proofs: dict  # {overlay id: what its proofs said}
    verdicts: list  # [(overlay id, side, proofs.runner.Verdict)], each side of each proof

    @property
    def files(self) -> tuple[FileEntry, ...]:
        return tuple(FileEntry(a.overlay.target, a.result) for a in self.applied)


@dataclass(frozen=True)
class Kernels:
    """hip/'s recipe for the overlays served, its outputs (cached, signed or compiled here), as files."""
    recipe: hip_mod.Recipe
    compiled: hip_compile.Compiled
    files: tuple[FileEntry, ...]


@dataclass(frozen=True)
class Tables:
    """The tuning stage's value: the tables and their files in the image."""
    tables: list  # tuning_mod's tables
    files: tuple[FileEntry, ...]

    @classmethod
    def of(cls, tables: list) -> Tables:
        return cls(tables, tuple(tuning_mod.files(tables)))


@dataclass(frozen=True)
class Image:
    """The derived image: its layers (written under out/blobs), config and manifest, and the
    annotations both carry."""
    derived: Derived
    layers: list
    notes: dict


@dataclass(frozen=True)
class Verdicts:
    """The proofs' verdicts as the record names them, and the pushes of those proven here."""
    records: tuple[Verdict, ...]
    pushes: list
