"""One error root; each class carries its exit code and a message that says what to do next."""

from contextlib import contextmanager


class BakeryError(Exception):
    """Root of every error the tool reports to a user as one line."""

    exit_code = 1


class InputError(BakeryError):
    """A checked-in input (YAML, reference, file) is malformed or missing."""

    exit_code = 2


class RegistryError(BakeryError):
    """A registry could not be reached or refused a request."""

    exit_code = 3


class TransientError(RegistryError):
    """A registry failed in a way that may pass (5xx, 429, a dropped connection): safe to start over."""


class NotFound(RegistryError):
    """The registry answered 404 for a manifest or blob."""


class AuthError(RegistryError):
    """A registry wants credentials we do not have, or rejected them."""

    exit_code = 4


class IntegrityError(BakeryError):
    """Bytes did not match the digest or size they were addressed by."""

    exit_code = 5


class EnvironmentProblem(BakeryError):
    """The machine lacks something the command needs (engine, tool, disk space)."""

    exit_code = 6


class NotProven(BakeryError):
    """An overlay (or a porting kit's ours.py) is not proven: BROKEN on stock and FIXED overlaid."""

    exit_code = 5


class NotCarried(BakeryError):
    """A rebase could not carry and prove every required overlay: the inputs need porting by hand."""

    exit_code = 2


class NotReproduced(BakeryError):
    """A rebuild from the signed provenance gave other bytes than the released digest."""

    exit_code = 5


class SmokeFailure(BakeryError):
    """The MI300X smoke gate failed: a health line, an API check or the VRAM budget."""

    exit_code = 7


# Not errors: what `invoke bump` and `invoke track` found, as their exit codes (the nightly workflow
# branches on them)
NOTHING_NEW, BUMPED, PORTING = 0, 10, 11


PARSE_ERRORS = (ValueError, KeyError, TypeError, AttributeError, IndexError, UnicodeError, RecursionError)


@contextmanager
def malformed(what: str, error: type = IntegrityError):
    """Reading a document someone else wrote (a registry's manifest, a layer, a cache entry): any
    way it fails to parse becomes one error naming the document, never a traceback."""
    try:
        yield
    except PARSE_ERRORS as e:
        raise error(f"{what} is malformed ({type(e).__name__}: {str(e)[:200]}); it is corrupt or hostile") from None


def foreign(e: BaseException) -> BakeryError | None:
    """A library's exception that reached the edge, as the BakeryError (and exit code) it means."""
    import errno

    try:
        import docker.errors
        if isinstance(e, docker.errors.DockerException):
            return EnvironmentProblem(f"Docker: {getattr(e, 'explanation', None) or e}; is the engine running "
                                      f"(`invoke stack`) and the image name right?")
    except ImportError:
        pass
    import requests
    if isinstance(e, requests.RequestException):
        return TransientError(f"{type(e).__name__}: {str(e)[:300]}; retry")
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return EnvironmentProblem(disk_full(e.filename, e.strerror or "No space left on device"))
    if isinstance(e, PermissionError):
        return EnvironmentProblem(f"permission denied: {e.filename}")
    return None


def disk_full(where, why: str = "No space left on device") -> str:
    """What to say when writing under `where` ran out of space (or quota): the folder, and what to
    do, which depends on whose folder it is (the cache's: BAKERY_CACHE moves it)."""
    import os
    from pathlib import Path

    from .project import cache_dir

    if not where:
        return f"the disk is full ({why}): free space, or set BAKERY_CACHE and --out to a larger disk"
    path = Path(os.path.abspath(where))
    cache = Path(os.path.abspath(cache_dir()))
    advice = "set BAKERY_CACHE to a larger disk" if path == cache or cache in path.parents else \
        "write to a larger disk (--out, --layout)"
    return f"the disk is full at {path} ({why}): free space there, or {advice}"
