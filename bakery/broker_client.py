"""Inside a rebuild's sandbox: how the code being rebuilt asks the broker outside (broker.py) for
the base's bytes and the compile. Used by transport.py and hip_compile.py when BAKERY_BROKER_SOCKET is set;
it knows nothing of the server's rules, only the socket.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import socket
from contextlib import contextmanager
from pathlib import Path

from .errors import EnvironmentProblem, IntegrityError

SOCKET_ENV = "BAKERY_BROKER_SOCKET"
OUTPUTS_LIMIT = 256 << 20  # all a compile may hand back, together (the extensions are tens of MiB)


UNIX_NAME_LIMIT = 107  # bytes of a socket's path that AF_UNIX takes (sun_path, less its NUL)


@contextmanager
def unix_name(path: str):
    """A name for the socket at `path` that AF_UNIX takes: itself where short enough, else through an
    open descriptor of its folder (/proc/self/fd/N/NAME), so a long TMPDIR or --workdir still works."""
    if len(os.fsencode(path)) <= UNIX_NAME_LIMIT:
        yield path
        return
    folder = os.open(os.path.dirname(path) or ".", os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{folder}/{os.path.basename(path)}"
    finally:
        os.close(folder)


class UnixConnection(http.client.HTTPConnection):
    """Every request to one Unix socket (the broker's), whatever host it names."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        with unix_name(self.socket_path) as name:
            self.sock.connect(name)


def ask(method: str, path: str, body: dict | None = None, timeout: float = 3600) -> dict:
    """One request to the broker from inside the sandbox; its JSON answer, or the error it gave."""
    conn = UnixConnection(os.environ[SOCKET_ENV], timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
        resp = conn.getresponse()
        said = resp.read(OUTPUTS_LIMIT * 2)
    except OSError as e:
        raise EnvironmentProblem(f"the rebuild's broker did not answer {method} {path}: {e}") from None
    finally:
        conn.close()
    if resp.status != 200:
        raise EnvironmentProblem(f"the rebuild's broker refused {method} {path}: "
                                 f"{said.decode(errors='replace')[:300]}")
    return json.loads(said)


def compile_outside(toolchain: str, shell: str, out: Path) -> tuple[int, str]:
    """hip_compile.run_compile's answer, from the broker: the outputs written into out here, inside."""
    answer = ask("POST", "/bakery/compile", {"toolchain": toolchain, "shell": shell})
    for name, data in answer["files"].items():
        if "/" in name or name in (".", ".."):
            raise IntegrityError(f"the broker handed back an output named {name[:80]!r}")
        (out / name).write_bytes(base64.b64decode(data))
    return int(answer["status"]), str(answer["logs"])
