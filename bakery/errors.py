"""One error root; each class carries its exit code and a message that says what to do next."""


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
