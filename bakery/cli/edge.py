"""The one edge where errors become exit codes: one line on stderr, never a traceback (unless
BAKERY_DEBUG=1). Every task is wrapped in it; the codes themselves are in errors.py."""

from __future__ import annotations

import functools
import gc
import os
import subprocess
import sys
import traceback
from pathlib import Path

from invoke import Exit


def say(message: str) -> None:
    """A task's log line, on stderr. Log lines quote what a registry, a base or an upstream chose
    (a file name, a platform, an error's text): each is shown inert here, where they all pass."""
    from ..untrusted import safe

    print(safe(message, limit=1_000_000, lines=True), file=sys.stderr, flush=True)


def reports_errors_for(project: Path):
    """The decorator for the tasks of the checkout at project."""

    def reports_errors(fn, collect_cycles: bool = True):
        """collect_cycles=False: the task leaves little that only the cyclic collector could free,
        so that collector stays off while it runs (walking what a build imports and makes was a few
        milliseconds of a warm build; tests/test_build.py holds a build to under 64 KiB of it)."""
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            from ..errors import BakeryError

            if any(v in ("--help", "-h") for v in list(args[1:]) + list(kwargs.values())):
                # `invoke TASK --help`: invoke hands a flag after a task with a positional argument to
                # that argument; show the task's help instead of running it with "--help" as its value
                subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(project), "--help",
                                fn.__name__.replace("_", "-")])
                raise Exit(code=0)
            # a command ends when its task does: what exists now (invoke, tasks.py, their imports) and
            # what the task leaves lives until exit, so the cyclic collector need not walk it again
            # during the run or at exit (tens of milliseconds of a warm build)
            gc.freeze()
            collecting = gc.isenabled()
            if not collect_cycles:
                gc.disable()
            try:
                return fn(*args, **kwargs)
            except BakeryError as e:  # it may quote the base's text: shown inert (no escape sequence hides it)
                from ..untrusted import safe

                raise Exit(f"error: {safe(e, limit=8000, lines=True)}", code=e.exit_code) from None
            except KeyboardInterrupt:
                raise Exit("interrupted; nothing was tagged", code=130) from None
            except Exit:
                raise
            except Exception as e:  # a library's error, or a bug of ours: still one line
                from ..errors import foreign

                mapped = foreign(e)
                if mapped is not None:
                    from ..untrusted import safe

                    raise Exit(f"error: {safe(mapped, limit=8000, lines=True)}", code=mapped.exit_code) from None
                if os.environ.get("BAKERY_DEBUG"):  # BAKERY_DEBUG=1 shows the traceback
                    raise
                where = traceback.extract_tb(e.__traceback__)[-1]
                from ..untrusted import safe

                raise Exit(f"error: internal error {type(e).__name__}: {safe(e)} (at {Path(where.filename).name}:"
                           f"{where.lineno}); please report it with the command you ran, or rerun with BAKERY_DEBUG=1",
                           code=1) from None
            finally:
                gc.freeze()
                if collecting:
                    gc.enable()

        return wrapper

    return reports_errors
