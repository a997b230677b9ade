"""Connecting to the Docker engine, with errors that say how to get one."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import RunnerUnavailableError

if TYPE_CHECKING:
    from docker import DockerClient

# nox logs at debug level; the SDK's HTTP chatter would drown the cell's own log.
for _chatty in ("urllib3", "docker"):
    logging.getLogger(_chatty).setLevel(logging.WARNING)

PING_TIMEOUT_S = 5
API_TIMEOUT_S = 900  # image builds can be silent for minutes

NO_DAEMON_HINT = (
    "Start the Docker daemon (sudo systemctl start docker, or sudo dockerd), or use --runner local."
)


@dataclass(frozen=True)
class EngineStatus:
    available: bool
    detail: str


def _docker_module() -> Any:
    try:
        import docker
    except ImportError:
        raise RunnerUnavailableError(
            "the docker Python package is not installed: pip install docker (nox installs it "
            "for the noxfile), or use --runner local"
        ) from None
    return docker


def connect_docker() -> DockerClient:
    """A client of a daemon that answers; RunnerUnavailableError otherwise."""
    docker = _docker_module()
    try:
        probe = docker.from_env(timeout=PING_TIMEOUT_S)
        probe.ping()
        version = probe.version().get("Version", "?")
        probe.close()
        client: DockerClient = docker.from_env(timeout=API_TIMEOUT_S)
    except docker.errors.DockerException as error:
        reason = str(error).splitlines()[0][:300]
        raise RunnerUnavailableError(
            f"no Docker daemon answers ({reason}). {NO_DAEMON_HINT}"
        ) from None
    client.fallback_matrix_engine_version = version  # type: ignore[attr-defined]
    return client


def engine_status() -> EngineStatus:
    """Whether a daemon answers, without raising."""
    try:
        client = connect_docker()
    except RunnerUnavailableError as error:
        return EngineStatus(False, str(error))
    version = getattr(client, "fallback_matrix_engine_version", "?")
    client.close()
    return EngineStatus(True, f"Docker engine {version} answers")
