"""Where things are: the checked-in inputs of a project checkout, and this machine's caches.

Every default path has its home here, so a moved file is one edit and a task, a test and a rebuild
all mean the same file by the same name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Project:
    """A checkout: each property is one checked-in input (ARCHITECTURE.md: one folder, one kind)."""

    root: Path

    @property
    def base_yaml(self) -> Path:
        return self.root / "image" / "base.yaml"

    @property
    def image_yaml(self) -> Path:
        return self.root / "image" / "image.yaml"

    @property
    def compose_yaml(self) -> Path:
        return self.root / "image" / "compose.yaml"

    @property
    def ledger(self) -> Path:
        return self.root / "image" / "nightlies.yaml"

    @property
    def overlays_yaml(self) -> Path:
        return self.root / "overlays" / "overlays.yaml"

    @property
    def lock(self) -> Path:
        return self.root / "overlays" / "overlays.lock"

    @property
    def policy(self) -> Path:
        return self.root / "provenance" / "policy.yaml"

    @property
    def retention(self) -> Path:
        return self.root / "provenance" / "retention.yaml"

    @property
    def smoke_spec(self) -> Path:
        return self.root / "provenance" / "smoke.yaml"

    @property
    def tuning(self) -> Path:
        return self.root / "tuning"

    @property
    def hip(self) -> Path:
        return self.root / "hip"

    @property
    def out(self) -> Path:
        """Build outputs (records, reports, blobs), never checked in."""
        return self.root / "out"


def cache_dir(kind: str = "", create: bool = False) -> Path:
    """BAKERY_CACHE (default ~/.cache/bakery), or one kind of cache inside it; created only for a
    writer (create=True): a reader of a cache must not make one appear."""
    root = Path(os.environ.get("BAKERY_CACHE", Path.home() / ".cache" / "bakery"))
    path = root / kind if kind else root
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path
