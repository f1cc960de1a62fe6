"""Test-only: stop a command dead at a chosen step, so a test can check that running it again
finishes the job (tests/test_crash.py).

A point is a step that leaves a trace another run could see: a file or folder about to take, or
having taken, its name in a cache or out/, and a registry's answer to a request (a blob, a manifest
or a tag may now exist there). BAKERY_CRASH_TRACE=FILE appends one line per point (its number and
what it was); BAKERY_CRASH_AT=N sends SIGKILL at the N-th: no handler, no `finally`, as a preempted
runner or the OOM killer stops a process. The command's process group goes with it when the
command leads one (a compile's sandbox ends too, as on a runner that is taken away). With neither
variable set, a point costs two environment lookups.
"""

from __future__ import annotations

import os
import signal
import threading

TRACE, AT = "BAKERY_CRASH_TRACE", "BAKERY_CRASH_AT"

_lock = threading.Lock()
_count = 0


def reached(what: str) -> None:
    """Count this point; write it to the trace; die here if it is the chosen one."""
    global _count
    trace, at = os.environ.get(TRACE), os.environ.get(AT)
    if not trace and not at:
        return
    with _lock:  # uploads run in threads: each point gets one number
        _count += 1
        if trace:
            line = f"{_count}\t{' '.join(what.split())}\n".encode()
            fd = os.open(trace, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
        if at and at.isdigit() and int(at) == _count:
            if os.getpgrp() == os.getpid():
                os.killpg(os.getpid(), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)
