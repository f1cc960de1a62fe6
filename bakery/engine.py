"""The Docker engine this machine talks to: one client, one error when none answers."""

from __future__ import annotations

from .errors import EnvironmentProblem


def docker_client(timeout: int = 900):
    """A Docker SDK client for the running engine, or one clear error."""
    import docker

    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
        return client
    except Exception as e:  # the SDK raises several unrelated types for "no engine"
        raise EnvironmentProblem(f"no Docker engine answers ({type(e).__name__}): start one with "
                                 f"`invoke stack` or `dockerd &`") from None
