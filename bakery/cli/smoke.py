"""invoke smoke: the MI300X gate, its report, and its signed result."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError, SmokeFailure
from ..project import Project
from ..release.smoke_report import SmokeReport


@dataclass(frozen=True)
class Smoked:
    ref: object
    result: SmokeReport
    report: Path  # where it was written
    attested: str | None = None  # "envelope FILE" or "attached"

    def check(self) -> None:
        """RECORDED is no verdict and no failure; anything but PASSED fails the gate (exit 7)."""
        if self.result.result not in ("PASSED", "RECORDED"):
            raise SmokeFailure(f"smoke failed: {', '.join(self.result.verdict.failed)}"
                               + (f" ({self.result.failure})" if self.result.failure else ""))


def smoke(project: Path, image: str, model_dir: str, port=8000, report=None, record=False, attest=False, key=None,
          envelope=None, log=lambda m: None) -> Smoked:
    import hashlib
    import json

    from ..oci import store
    from ..oci.layer import write_blob
    from ..oci.refs import Reference
    from ..release import smoke as smoke_mod, smoke_report, smoke_spec
    from ..trust import keys, sign, smoke_ledger

    ref = Reference.parse_pinned(image, "image")
    if record and attest:
        raise InputError("--record and --attest together: a recording run is not a verdict; record, review and "
                         "commit the outputs in provenance/smoke.yaml, then run again with --attest")
    spec_path = Project(project).smoke_spec
    spec = smoke_spec.load_spec(spec_path)
    result = smoke_mod.run(str(ref), spec, Path(model_dir), int(port), record, log=log)
    smoke_ledger.remember(str(ref.digest), hashlib.sha256(spec_path.read_bytes()).hexdigest(), result.result,
                          result.finished, result.run)  # a later verify here refuses an older PASSED
    out = Path(report) if report else Project(project).out / "smoke-report.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result.to_json(), indent=2, sort_keys=True))
    log(f"report: {out}")
    attested = None
    if attest:
        signer = sign.Signer(keys.load_private(Path(key) if key else None, keys.SMOKE_KEY_ENV))
        if envelope:
            write_blob(Path(envelope), sign.envelope(signer, smoke_report.statement(ref, result.to_json(), spec_path.read_bytes())))
            attested = f"envelope {envelope}"
        else:
            smoke_report.attach_report(store.RegistryStore(ref), ref, result.to_json(), spec_path.read_bytes(), signer)
            attested = "attached"
    return Smoked(ref, result, out, attested)
