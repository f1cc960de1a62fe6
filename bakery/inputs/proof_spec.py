"""overlays.yaml's `proof:` entry: how an overlay is proven. Part of the checked-in inputs, so the
overlay registry can load it without importing the proof runner (prove.py), which runs it."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..errors import InputError

HELPER = "_proof.py"  # shared by every proof script: part of each proof's code


@dataclass(frozen=True)
class ProofSpec:
    """How an overlay is proven: a script run on its target (plus other files of the same base it
    reads, and files of this project it imports), or, where only hardware can tell, the reason no
    proof runs here."""
    script: Path | None
    reads: tuple[str, ...] = ()
    hardware: str | None = None
    uses: tuple[Path, ...] = ()  # project files the proof executes besides itself and the helper

    @property
    def code(self) -> tuple[Path, ...]:
        """Every file of ours the proof executes: the sandbox shows it nothing else of the project."""
        return (self.script, self.script.parent / HELPER) + self.uses if self.script else ()

    @property
    def code_sha256(self) -> str | None:
        if self.script is None:
            return None
        h = hashlib.sha256()
        for path in self.code:
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        return h.hexdigest()


def load_spec(entry: dict | None, folder: Path, where: str) -> ProofSpec | None:
    """overlays.yaml's `proof:` value: {script, reads, uses} or {hardware: reason}."""
    if entry is None:
        return None
    unknown = set(entry) - {"script", "reads", "uses", "hardware"}
    if unknown or ("script" in entry) == ("hardware" in entry):
        raise InputError(f"{where}: proof must be {{script: proofs/NAME.py, reads: [IMAGE PATHS], uses: [PROJECT "
                         f"FILES IT IMPORTS]}} or {{hardware: WHY NO PROOF CAN RUN HERE}}")
    if "hardware" in entry:
        return ProofSpec(None, (), str(entry["hardware"]))
    script = (folder / entry["script"]).resolve()
    if ".." in PurePosixPath(entry["script"]).parts or not script.is_file():
        raise InputError(f"{where}: proof script {entry['script']!r} is not a file inside {folder}")
    reads = tuple(entry.get("reads") or ())
    if any(not r.startswith("/") for r in reads):
        raise InputError(f"{where}: proof reads must be absolute image paths")
    project = folder.resolve().parent
    uses = tuple((project / u).resolve() for u in entry.get("uses") or ())
    if any(".." in PurePosixPath(u).parts or not (project / u).is_file() for u in entry.get("uses") or ()):
        raise InputError(f"{where}: proof uses must be files of this project, given from its root")
    return ProofSpec(script, reads, None, uses)
