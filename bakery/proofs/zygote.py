"""Inside one proof sandbox: load what every proof loads once, then run each proof in a process
forked from here, side by side.

`zygote.py PLAN`: PLAN is a JSON list of [script, [target, ...], [read, ...]] (the script's path as
the sandbox sees it, the files' names beside PLAN), the proofs of one base's bytes. torch and numpy
are imported here once; each proof then runs as `script TARGET... -- READS...` would, in a child
forked before anything of the base's code is read, so no proof sees what another left behind and
the order does not matter. Each child's stdout and stderr are pipes only this process holds; it
prints one JSON line per proof, in plan order: {"proof": i, "exit": code, "stdout": tail, "stderr":
tail}. Nothing the base's code prints reaches this process's stdout: the children's fd 1 and 2 are
their own pipes, and this process is not dumpable (its /proc entries are root's), so no child can
open its fds.

Runs in the sandbox with the sandbox's Python, so it imports nothing of bakery.
"""

import ctypes
import json
import os
import runpy
import selectors
import sys
import time
import traceback

# bytes of a proof's stdout and stderr kept: its verdict lines are a few hundred bytes, and of stderr
# the host reads the last line; each proof's line, escaped (at most 6 characters a byte), must fit
# the 1 MiB of stdout the host keeps beside the others' (16 proofs)
TAIL = {"stdout": 8 << 10, "stderr": 2 << 10}
AFTER_EXIT = 2.0  # seconds a proof's pipes are still read once it exited


def main() -> None:
    with open(sys.argv[1]) as f:
        plan = json.load(f)
    folder = os.path.dirname(os.path.abspath(sys.argv[1]))  # the files are named beside the plan, wherever it is
    plan = [(script, [os.path.join(folder, t) for t in targets], [os.path.join(folder, r) for r in reads])
            for script, targets, reads in plan]
    if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE 0, before any child exists
        sys.exit(f"zygote: cannot make itself non-dumpable (errno {ctypes.get_errno()}): no proof runs")
    _preload()
    sys.stdout.flush()
    sys.stderr.flush()
    runs: list[tuple[int, int, int]] = []
    for index, (script, targets, reads) in enumerate(plan):
        runs.append(_start(index, script, targets, reads, [fd for _, out, err in runs for fd in (out, err)]))
    tails, codes = _read_all(runs)
    for index, (pid, out, err) in enumerate(runs):
        print(json.dumps({"proof": index, "exit": codes[pid], "stdout": tails[out].decode("utf-8", "replace"),
                          "stderr": tails[err].decode("utf-8", "replace")}), flush=True)


def _preload() -> None:
    """What every proof imports and most of its start costs (torch: about a second), once. Not
    Triton: a proof picks how Triton loads (interpreted, or compiling for a GPU) before it imports
    it, and Triton's import is a tenth of torch's."""
    try:
        import numpy  # noqa: F401
        import torch  # noqa: F401
    except Exception:  # a proof that needs what failed here fails on its own, with its own error
        traceback.print_exc()


def _start(index: int, script: str, targets: list[str], reads: list[str], others: list[int]) -> tuple[int, int, int]:
    """(pid, stdout read end, stderr read end) of a child that runs one proof script and exits."""
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    pid = os.fork()
    if pid:
        os.close(out_write)
        os.close(err_write)
        return pid, out_read, err_read
    code = 1
    try:
        for fd in (*others, out_read, err_read):  # no child holds another's pipe
            os.close(fd)
        os.dup2(out_write, 1)
        os.dup2(err_write, 2)
        os.close(out_write)
        os.close(err_write)
        import tempfile

        # its temporary files apart (tidiness: the uid is the same)
        os.environ["TMPDIR"] = tempfile.tempdir = tempfile.mkdtemp(prefix=f"proof-{index}-")
        sys.path.insert(0, os.path.dirname(script))  # its `import _proof`, as when it runs as a script
        sys.argv = [script, *targets, "--", *reads]
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as e:
        if isinstance(e.code, int):
            code = e.code
        elif e.code is not None:
            print(e.code, file=sys.stderr)
        else:
            code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _read_all(runs: list[tuple[int, int, int]]) -> tuple[dict[int, bytes], dict[int, int]]:
    """({fd: what was read}, {pid: exit code}): every pipe read at once (a child blocked
    on a full pipe would never exit), until each proof has exited and its pipes are drained, or
    AFTER_EXIT seconds past its exit (the last TAIL bytes of each kept): what its targets' code left running may hold a pipe open,
    and as when each proof had a sandbox of its own, that does not keep the others waiting."""
    kept = {fd: bytearray() for _, out, err in runs for fd in (out, err)}
    limit = {fd: TAIL[name] for _, out, err in runs for fd, name in ((out, "stdout"), (err, "stderr"))}
    codes: dict[int, int] = {}
    exited: dict[int, float] = {}
    owner = {fd: pid for pid, out, err in runs for fd in (out, err)}
    with selectors.DefaultSelector() as watch:
        for fd in kept:
            watch.register(fd, selectors.EVENT_READ)
        while watch.get_map():
            for key, _ in watch.select(timeout=0.25):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    watch.unregister(key.fd)
                    os.close(key.fd)
                    continue
                kept[key.fd] += chunk
                del kept[key.fd][:-limit[key.fd]]
            for pid, _, _ in runs:
                if pid not in codes:
                    done, status = os.waitpid(pid, os.WNOHANG)
                    if done:
                        codes[pid], exited[pid] = os.waitstatus_to_exitcode(status), time.monotonic()
            for fd in [k.fd for k in watch.get_map().values() if time.monotonic() - exited.get(owner[k.fd], 1e18) > AFTER_EXIT]:
                watch.unregister(fd)
                os.close(fd)
    for pid, _, _ in runs:
        if pid not in codes:
            codes[pid] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return {fd: bytes(data) for fd, data in kept.items()}, codes


if __name__ == "__main__":
    main()
