"""Progress for long transfers, on stderr so stdout stays machine-readable."""

from __future__ import annotations

import sys
import time


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class Progress:
    """Counts bytes; says nothing for transfers that finish within a second."""

    QUIET_FOR = 1.0
    EVERY = 2.0

    def __init__(self, label: str, total: int | None, stream=None):
        self.label, self.total, self.done = label, total, 0
        self.stream = stream or sys.stderr
        self.started = time.monotonic()
        self._last = self.started - self.EVERY  # first line as soon as QUIET_FOR has passed
        self.shown = False

    def update(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.started >= self.QUIET_FOR and now - self._last >= self.EVERY:
            self._last = now
            self._print(now)

    def close(self) -> None:
        if self.shown:
            self._print(time.monotonic(), final=True)

    def _print(self, now: float, final: bool = False) -> None:
        self.shown = True
        rate = self.done / max(now - self.started, 1e-9)
        of = f" of {_human(self.total)}" if self.total else ""
        state = "done" if final else "..."
        print(f"  {self.label}: {_human(self.done)}{of} at {_human(rate)}/s {state}",
              file=self.stream, flush=True)
