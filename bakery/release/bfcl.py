"""BFCL, the Berkeley Function-Calling Leaderboard's own harness (`bfcl-eval`), for the acceptance
gate's tool-call stage: a venv of its own, built from requirements/bfcl.txt (hash-pinned, without
the dependencies of BFCL's model handlers), and the two things the gate asks of it through
bfcl_harness.py: the cases as BFCL sends them, and BFCL's verdict on each answer. It is code we
trust as we trust bakery's own dependencies (its process can read the gate's environment, the
smoke key's included), so the gate builds it afresh for each run, as the workflow builds bakery's
venv: one kept on a persistent runner could be changed between runs. The served answers reach it
as JSON data only."""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .. import untrusted
from ..errors import EnvironmentProblem, SmokeFailure

HARNESS = Path(__file__).with_name("bfcl_harness.py")
ANSWER_LIMIT = 64 << 10  # characters of one answer's tool calls handed to the checker


def ensure(project: Path, log=lambda m: None, home: Path | None = None, python: str = sys.executable) -> str:
    """The python of the BFCL venv, built if `home` has none (the gate: a folder of its run; tests
    and the rehearsal: ~/.cache/bakery/bfcl, once per machine), kept by the hash of
    requirements/bfcl.txt and the interpreter."""
    wanted = (project / "requirements" / "bfcl.txt").read_text()
    home = home or Path.home() / ".cache" / "bakery" / "bfcl"
    venv = home / hashlib.sha256((wanted + python).encode()).hexdigest()[:16]
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two runs build it once
        if not (venv / ".complete").exists():
            log(f"building BFCL's harness in {venv} (once per machine)")
            shutil.rmtree(venv, ignore_errors=True)
            try:
                subprocess.run([python, "-m", "venv", str(venv)], check=True, capture_output=True)
                subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                                "--no-deps", "--require-hashes", "-r", str(project / "requirements" / "bfcl.txt")],
                               check=True, capture_output=True)
            except subprocess.CalledProcessError as e:
                said = (e.stderr or b"").decode(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
                raise EnvironmentProblem(f"cannot build BFCL's harness in {venv}: {said[0]}") from None
            (venv / ".complete").write_text("")
    return str(venv / "bin" / "python")


@dataclass(frozen=True)
class Harness:
    python: str  # of a venv with requirements/bfcl.txt

    def _call(self, command: str, asked: dict, timeout: float):
        try:
            done = subprocess.run([self.python, "-I", str(HARNESS), command], input=json.dumps(asked).encode(),
                                  capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise SmokeFailure(f"BFCL's harness ({command}) ran past the quality stage's deadline") from None
        except OSError as e:
            raise SmokeFailure(f"cannot run BFCL's harness ({self.python}): {e}") from None
        if done.returncode != 0:
            said = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
            raise SmokeFailure(f"BFCL's harness ({command}) failed: {untrusted.safe(said[0], limit=200)}")
        try:
            return json.loads(done.stdout)
        except (ValueError, RecursionError):
            raise SmokeFailure(f"BFCL's harness ({command}) answered no JSON") from None

    def cases(self, ids: tuple[str, ...], timeout: float = 120) -> list[dict]:
        """[{id, messages, tools}] of each case, in the order given."""
        return self._call("cases", {"ids": list(ids)}, timeout)

    def score(self, answers: dict[str, list[dict] | None], timeout: float = 120) -> dict[str, dict]:
        """{id: {valid, error_type}}: BFCL's AST checker on each answer's tool calls
        ([{name, arguments}] as served, or None where the answer made no call)."""
        return self._call("score", {"answers": answers}, timeout)


def tool_calls(message) -> list[dict] | None:
    """The tool calls of a chat answer's message as [{name, arguments}] (strings, as served and
    bounded), or None where it made none or their shape is not the API's."""
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    if not isinstance(calls, list) or not calls:
        return None
    out = []
    for call in calls[:64]:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or \
                not isinstance(function.get("arguments"), str):
            return None
        out.append({"name": function["name"][:256], "arguments": function["arguments"][:ANSWER_LIMIT]})
    return out
