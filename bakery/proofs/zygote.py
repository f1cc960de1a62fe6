"""Inside one proof sandbox: load what every proof loads once, then run each proof in a process
forked from here, side by side.

`zygote.py PLAN`: PLAN is a JSON list of [script, [target, ...], [read, ...]] (the script's path as
the sandbox sees it, the files' names beside PLAN), the proofs of one base's bytes. torch and numpy
are imported here once; each proof then runs as `script TARGET... -- READS...` would, in a child
forked before anything of the base's code is read, so no proof sees what another left behind and
the order does not matter. Each child's stdout and stderr are files without a name that only it
and this process hold; once it exits, this process prints one JSON line for it, in plan order:
{"proof": i, "exit": code, "stdout": tail, "stderr": tail}. Nothing the base's code prints reaches
this process's stdout: the children's fd 1 and 2 are their own files, and this process is not
dumpable (its /proc entries are root's), so no child can open its fds.

Runs in the sandbox with the sandbox's Python, so it imports nothing of bakery.
"""

import ctypes
import json
import os
import runpy
import sys
import tempfile
import traceback

# bytes of a proof's stdout and stderr kept: its verdict lines are a few hundred bytes, and of stderr
# the host reads the last line; each proof's line, escaped (at most 6 characters a byte), must fit
# the 1 MiB of stdout the host keeps beside the others' (16 proofs)
TAIL = {"stdout": 8 << 10, "stderr": 2 << 10}


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
    # every proof's output files made before any proof runs: where /tmp has no O_TMPFILE, tempfile
    # names one for an instant, and no base code may be running then to open it
    files = [(_unnamed(), _unnamed()) for _ in plan]
    runs: list[tuple[int, int, int]] = []
    for index, (script, targets, reads) in enumerate(plan):
        others = [fd for i, pair in enumerate(files) if i != index for fd in pair]
        runs.append(_start(index, script, targets, reads, files[index], others))
    for index, (pid, out, err) in enumerate(runs):
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        print(json.dumps({"proof": index, "exit": code, "stdout": _tail(out, TAIL["stdout"]),
                          "stderr": _tail(err, TAIL["stderr"])}), flush=True)


def _preload() -> None:
    """What every proof imports and most of its start costs (torch: about a second), once. Not
    Triton: a proof picks how Triton loads (interpreted, or compiling for a GPU) before it imports
    it, and Triton's import is a tenth of torch's."""
    try:
        import numpy  # noqa: F401
        import torch  # noqa: F401
    except Exception:  # a proof that needs what failed here fails on its own, with its own error
        traceback.print_exc()


def _start(index: int, script: str, targets: list[str], reads: list[str], output: tuple[int, int],
           others: list[int]) -> tuple[int, int, int]:
    """(pid, its stdout, its stderr) of a child that runs one proof script and exits. Its stdout and
    stderr are files without a name (only this process and the child hold them; no other proof can
    open them by a path or through /proc): as when the proof was the sandbox's own process, writing
    past the sandbox's file limit fails (EFBIG), and what its targets leave running, holding them,
    keeps nobody waiting."""
    out, err = output
    pid = os.fork()
    if pid:
        return pid, out, err
    code = 1
    try:
        for fd in others:  # no child holds another's output
            os.close(fd)
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.close(out)
        os.close(err)
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


def _unnamed() -> int:
    """A file without a name, open for reading and writing (O_TMPFILE where /tmp has it, else made
    and unlinked at once, by tempfile)."""
    with tempfile.TemporaryFile() as f:
        return os.dup(f.fileno())


def _tail(fd: int, limit: int) -> str:
    """The last `limit` bytes written to one of a proof's files, as text."""
    size = os.fstat(fd).st_size
    data = os.pread(fd, limit, max(0, size - limit))
    os.close(fd)
    return data.decode("utf-8", "replace")


if __name__ == "__main__":
    main()
