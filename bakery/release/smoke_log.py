"""The service's start, judged from its log as plain code: the healthy sequence in the order the
production deployment logs it, the lines that fail a start at once, and the watcher that follows a
log stream against both and a deadline (tested on recorded vLLM logs)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import SmokeFailure

# The healthy start, in order, as the production deployment logs it; the DSpark line only with speculation.
HEALTH = [
    ("model loaded", re.compile(r"Model loading took [\d.]+ GiB")),
    ("DSpark draft loaded", re.compile(r"DSpark draft model loaded: \d+ params")),
    ("GPU KV cache sized", re.compile(r"GPU KV cache size: [\d,]+ tokens")),
    ("max concurrency", re.compile(r"Maximum concurrency for [\d,]+ tokens per request: [\d.]+x")),
    ("CPU-KV mmap created", re.compile(r"Created mmap file /dev/shm/vllm_offload_\S*\.mmap")),
    ("graph capture started", re.compile(r"Capturing CUDA graphs \([^)]*\bFULL\)")),
    ("graph capture finished", re.compile(r"Graph capturing finished .*took [\d.]+ GiB")),
    ("startup complete", re.compile(r"Application startup complete")),
]
FAILURES = [
    ("HSA error", re.compile(r"HSA_STATUS_ERROR\w*")),
    ("out of memory", re.compile(r"out of memory|OutOfMemoryError|\bOOM\b", re.I)),
    ("Python traceback", re.compile(r"Traceback \(most recent call last\)")),
    ("HTTP 5xx", re.compile(r'"\s*(?:GET|POST|PUT|DELETE) \S+ HTTP/[\d.]+"\s+5\d\d\b')),
]
BENIGN = [re.compile(r"not found tuned config.*will use default config")]  # AITER, informational


@dataclass
class LogWatcher:
    """Feed it log lines; it knows whether the start is healthy, still going, or failed."""

    speculative: bool
    deadline_s: float
    clock: Callable[[], float] = time.monotonic
    started: float = field(default=0.0)
    seen: list = field(default_factory=list)  # (signal, seconds after start, line)

    def __post_init__(self):
        self.started = self.clock()
        self.expected = [(n, r) for n, r in HEALTH if self.speculative or n != "DSpark draft loaded"]

    @property
    def waiting_for(self) -> str | None:
        return self.expected[len(self.seen)][0] if len(self.seen) < len(self.expected) else None

    @property
    def healthy(self) -> bool:
        return self.waiting_for is None

    def feed(self, line: str) -> None:
        if any(b.search(line) for b in BENIGN):
            return
        for name, pattern in FAILURES:
            if pattern.search(line):
                raise SmokeFailure(f"{name} while waiting for {self.waiting_for or 'nothing'}: {line.strip()[:300]}")
        for i, (name, pattern) in enumerate(self.expected):
            if pattern.search(line):
                if i < len(self.seen):
                    return  # a repeat (graph capture logs per size): fine
                if i > len(self.seen):
                    raise SmokeFailure(f"health signal '{name}' came before '{self.waiting_for}': the start "
                                       f"is not the healthy sequence")
                self.seen.append((name, round(self.clock() - self.started, 1), line.strip()))
                return

    def check_deadline(self) -> None:
        if not self.healthy and self.clock() - self.started > self.deadline_s:
            raise SmokeFailure(f"not healthy after {self.deadline_s:.0f}s: still waiting for '{self.waiting_for}'")
