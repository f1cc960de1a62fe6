"""The ledger of smoke results this machine has seen, so an older PASSED cannot replace a FAILED.

The smoke job writes it after a run; verify reads and adds to it. It lives apart from the smoke
run (release/) because verification (trust/) needs it and must not import the run.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import EnvironmentProblem


def ledger_path() -> Path:
    """Kept apart from the caches (a release job empties those): BAKERY_SMOKE_LEDGER, else
    ~/.local/state/bakery/smoke-ledger.json."""
    import os

    default = Path.home() / ".local" / "state" / "bakery" / "smoke-ledger.json"
    return Path(os.environ.get("BAKERY_SMOKE_LEDGER", default))


def _ledger() -> dict:
    try:
        doc = json.loads(ledger_path().read_text())
        if not isinstance(doc, dict) or not isinstance(doc.get("results"), dict) or not isinstance(doc.get("runs"), int):
            raise ValueError("not a ledger")
        return doc
    except FileNotFoundError:
        return {"runs": 0, "results": {}}
    except ValueError as e:
        raise EnvironmentProblem(f"the smoke ledger {ledger_path()} is unreadable ({e}): it guards against replayed "
                                 f"results, so it is not replaced; move it aside if you know why") from None


def _write_ledger(doc: dict) -> None:
    """A ledger this machine cannot write only forgets: it warns, and verification goes on."""
    import sys

    from ..oci.layer import write_blob

    try:
        write_blob(ledger_path(), json.dumps(doc, indent=1, sort_keys=True).encode())
    except EnvironmentProblem as e:
        print(f"warning: {e}: a replayed older smoke result goes unnoticed here", file=sys.stderr)


def next_run() -> int:
    """This runner's next run number: it only grows (a result carries it, signed)."""
    doc = _ledger()
    doc["runs"] += 1
    _write_ledger(doc)
    return doc["runs"]


def remember(digest: str, spec_sha256: str, result: object, finished: str, run: int | None) -> None:
    """Keep one result seen for (digest, spec): the smoke job after a run, verify after reading one."""
    doc = _ledger()
    seen = doc["results"].setdefault(f"{digest} {spec_sha256}", [])
    entry = {"result": str(result)[:16], "finished": str(finished)[:32], "run": run}
    if entry not in seen:
        seen.append(entry)
        del seen[:-64]  # the newest are what decide
        _write_ledger(doc)


def later_failure(digest: str, spec_sha256: str, finished: str, run: int | None) -> dict | None:
    """A FAILED this machine has seen for the same digest and spec, finished after this result (or
    at the same second with a higher run number): a PASSED older than it was replayed."""
    for entry in _ledger()["results"].get(f"{digest} {spec_sha256}", []):
        if entry["result"] == "FAILED" and (entry["finished"], entry["run"] or 0) > (str(finished), run or 0):
            return entry
    return None
