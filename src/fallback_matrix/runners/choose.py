"""Choosing a runner: docker, local, or auto (docker when a daemon answers)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from .base import Runner, RunnerChoice, RunnerName
from .docker_runner import CACHE_VOLUME, DOCKER_CACHE_ENV, DockerRunner
from .engine import EngineStatus, connect_docker, engine_status
from .local import LocalRunner


@dataclass(frozen=True)
class RunnerDecision:
    name: RunnerName
    reason: str


def decide_runner(
    choice: RunnerChoice, status: Callable[[], EngineStatus] = engine_status
) -> RunnerDecision:
    """Which runner ``choice`` means here; "docker" raises when no daemon answers."""
    if choice == "local":
        return RunnerDecision("local", "asked for --runner local")
    if choice == "docker":
        connect_docker()  # raises RunnerUnavailableError with what to do
        return RunnerDecision("docker", "asked for --runner docker")
    engine = status()
    if engine.available:
        return RunnerDecision("docker", f"auto: {engine.detail}")
    return RunnerDecision("local", "auto: no Docker daemon answers")


def make_runner(decision: RunnerDecision) -> Runner:
    if decision.name == "docker":
        volume = os.environ.get(DOCKER_CACHE_ENV) or CACHE_VOLUME
        return DockerRunner(environ=dict(os.environ), volume=volume)
    return LocalRunner()
