"""Runners run a cell's job: ``docker`` in the cell's build image, ``local`` with a host Python.

Docker: repository and wheelhouse mounted read-only, caches in a named volume or a host directory
($FALLBACK_MATRIX_DOCKER_CACHE: the job runs as its owner), artifacts copied out at the end;
labelled containers (``clean`` finds leftovers), always removed; images tagged by a hash.
"""

import dataclasses
import hashlib
import io
import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

from docker.types import DeviceRequest, Mount

import docker
from docker import DockerClient

from .errors import CellError, DockerUnavailableError, GpuUnavailableError, MatrixError
from .job import Job
from .report import Reporter, run_process

RunnerChoice = Literal["docker", "local", "auto"]
LABEL = "org.torch-fallback.matrix"
CELL_LABEL = "org.torch-fallback.matrix.cell"
CACHE_VOLUME = "torch-fallback-matrix-cache"
DOCKER_CACHE_ENV = "FALLBACK_MATRIX_DOCKER_CACHE"  # a host directory instead of the volume
IMAGE_UID = 1000  # the image's user (docker/Dockerfile)
# Where the job sees things in the container
REPO, WHEELHOUSE, CACHE, WORK, ARTIFACTS = "/src", "/wheelhouse", "/cache", "/tmp/cell-work", "/out"

# nox logs at debug level; the SDK's HTTP chatter would drown the cell's own log.
for _chatty in ("urllib3", "docker"):
    logging.getLogger(_chatty).setLevel(logging.WARNING)


def connect_docker(timeout: int = 900) -> DockerClient:
    """A client of a daemon that answers (image builds can be silent for minutes)."""
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
    except docker.errors.DockerException as error:
        raise DockerUnavailableError(
            f"no Docker daemon answers ({str(error).splitlines()[0][:300]}). Start the Docker "
            "daemon (sudo systemctl start docker, or sudo dockerd), or use --runner local."
        ) from None
    return client


def docker_problem() -> str | None:
    """Why no Docker daemon answers (a probe of a few seconds); None when one does."""
    try:
        connect_docker(timeout=5).close()
    except DockerUnavailableError as error:
        return str(error)
    return None


def find_python(version: str, purpose: str = "for the local runner; or use --runner docker") -> str:
    """An interpreter of ``version`` ("3.11"): this one, pythonX.Y on PATH, or pyenv's."""
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    if running == version:
        return sys.executable
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    installed = sorted(pyenv.glob(f"{version}.*/bin/python{version}"), reverse=True)
    probe = "import sys; print('%d.%d' % sys.version_info[:2])"
    for candidate in filter(None, [shutil.which(f"python{version}"), *map(str, installed)]):
        result = subprocess.run([candidate, "-c", probe], capture_output=True, text=True)
        if result.stdout.strip() == version:
            return candidate
    raise MatrixError(
        f"no Python {version} here (this is Python {running}; none on PATH as python{version} "
        f"or under {pyenv}): install Python {version} ({purpose})"
    )


def job_pythonpath(job: Job, repo: str, wheelhouse: str) -> str:
    """The job's PYTHONPATH (``repo``, ``wheelhouse``: where it sees them): this package, and
    the wheelhouse's packaging wheel, pure Python that imports from the zip."""
    wheels = sorted(Path(job.wheelhouse).glob("packaging-*.whl"))
    if not wheels:
        raise CellError(f"cell {job.cell}: {job.wheelhouse} holds no packaging wheel (test group)")
    return f"{repo}/src{os.pathsep}{wheelhouse}/{wheels[-1].name}"


class LocalRunner:
    """The job with a host Python; its venvs, build dir and ccache in the job's cache."""

    name = "local"

    def run(self, job: Job, log: Reporter) -> tuple[int, str]:
        python = find_python(job.python)
        shutil.rmtree(job.work, ignore_errors=True)
        if job.gpus:
            log.say("warning: --gpus has no effect with the local runner: the job sees the GPUs")
        env = dict(os.environ, PYTHONPATH=job_pythonpath(job, job.repo, job.wheelhouse))
        log.say(f"runner local: {python} -m fallback_matrix.job (cache {job.cache})")
        command = [python, "-m", "fallback_matrix.job", job.to_json()]
        status = run_process(command, log.line, env=env)
        return status, f"local Python {python}"


def plan_image(repo: Path, job: Job) -> dict[str, Any]:
    """The image a cell runs in, as the arguments of ``client.api.build`` (its tag hashes them):
    the Dockerfile's directory is the build context."""
    dockerfile = repo / job.dockerfile
    if not dockerfile.is_file():
        raise CellError(f"cell {job.cell}: Dockerfile {dockerfile} not found (matrix.yaml image)")
    context, build_args = dockerfile.parent, {"BASE_IMAGE": job.base_image}
    digest = hashlib.sha256()
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        digest.update(path.relative_to(context).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    digest.update(json.dumps(build_args, sort_keys=True).encode())
    labels, tag = {LABEL: "image"}, f"torch-fallback-build:{digest.hexdigest()[:12]}"
    build = {"path": str(context), "dockerfile": dockerfile.name, "buildargs": build_args}
    return build | {"tag": tag, "labels": labels, "rm": True, "forcerm": True}


def ensure_image(client: DockerClient, build: Mapping[str, Any], log: Reporter) -> str:
    """The image's tag, built now only when no image has this tag yet."""
    tag: str = build["tag"]
    try:
        client.images.get(tag)
        log.say(f"image {tag}: reusing it (Dockerfile and build args unchanged)")
        return tag
    except docker.errors.ImageNotFound:
        dockerfile = Path(build["path"]) / build["dockerfile"]
        log.say(f"image {tag}: building {dockerfile} with {build['buildargs']}")
    failed = f"cell {log.cell}: building image {tag} failed"
    try:
        for chunk in client.api.build(**build, decode=True):
            for line in str(chunk.get("stream", "")).splitlines():
                log.line(line)
            if "error" in chunk:
                raise CellError(f"{failed}: {str(chunk['error']).strip()}; log: {log.path}")
    except docker.errors.APIError as error:
        raise CellError(f"{failed}: {error}; log: {log.path}") from None
    log.say(f"image {tag}: built")
    return tag


def container_user(
    cache: str, repo: str, stat: Callable[[str], os.stat_result] = os.stat
) -> str | None:
    """The uid:gid the job runs as: the owner's of ``cache`` if a host directory not root's
    (``DockerRunner`` gives those to the image's user), else None: the image's user."""
    owner = stat(cache) if cache[:1] == "/" else None
    user = f"{owner.st_uid}:{owner.st_gid}" if owner and owner.st_uid != 0 else None
    uid = owner.st_uid if owner and user else IMAGE_UID
    info = stat(repo)
    if uid != info.st_uid and info.st_mode & 0o005 != 0o005:
        raise MatrixError(
            f"the checkout {repo} (mode {info.st_mode & 0o777:o}, owner uid {info.st_uid}) "
            f"cannot be read by the cell's container, which runs as uid {uid}. Make it readable "
            f"(chmod o+rx {repo}, as git clone leaves a checkout), or use --runner local"
        )
    return user


def plan_container(
    job: Job, image: str, *, volume: str = CACHE_VOLUME, user: str | None = None
) -> tuple[Job, dict[str, Any]]:
    """The job as the container sees it, and the arguments of ``containers.create``."""
    inside = dataclasses.replace(
        job, repo=REPO, wheelhouse=WHEELHOUSE, cache=CACHE, work=WORK, artifacts=ARTIFACTS
    )
    if job.prebuilt_wheel:  # a wheel staged under the repository
        staged = Path(job.prebuilt_wheel).relative_to(job.repo).as_posix()
        inside = dataclasses.replace(inside, prebuilt_wheel=f"{REPO}/{staged}")
    environment = {"PYTHONUNBUFFERED": "1", "HOME": "/tmp"}  # a uid without a passwd entry
    environment["PYTHONPATH"] = job_pythonpath(job, REPO, WHEELHOUSE)
    if ci := os.environ.get("CI"):
        environment["CI"] = ci
    gpus = [DeviceRequest(count=-1, capabilities=[["gpu"]])] if job.gpus or job.gpu else None
    return inside, {
        "image": image,
        "command": ["python3", "-m", "fallback_matrix.job", inside.to_json()],
        "name": f"fallback-matrix-{job.cell}-{uuid.uuid4().hex[:8]}",
        "labels": {LABEL: "1", CELL_LABEL: job.cell},
        "environment": environment,
        "mounts": [
            Mount(REPO, job.repo, type="bind", read_only=True),
            Mount(WHEELHOUSE, job.wheelhouse, type="bind", read_only=True),
            Mount(CACHE, volume, type="bind" if volume[:1] == "/" else "volume"),
        ],
        # offline (the wheelhouse), unless it installs from a package index on this host
        "network_mode": "host" if job.index_url else "none",
        "device_requests": gpus,
        "user": user or "",
    }


def extract_archive(chunks: Iterable[bytes], destination: Path) -> list[str]:
    """Unpack a get_archive stream of a directory into ``destination``, dropping its top folder."""
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as archive:
        files = [member for member in archive if member.isfile()]
        for member in files:
            member.name = member.name.split("/", 1)[1]
        archive.extractall(destination, members=files, filter="data")
    return [member.name for member in files]


def lines_of(chunks: Iterable[bytes]) -> Iterator[str]:
    pending = ""
    for chunk in chunks:
        *complete, pending = (pending + chunk.decode("utf-8", errors="replace")).split("\n")
        yield from complete
    if pending:
        yield pending


def run_container(
    client: DockerClient, job: Job, create: Mapping[str, Any], log: Reporter, artifacts: Path
) -> int:
    """Run the planned container to its end; always remove it. Returns its exit status."""
    container = client.containers.create(**create)
    try:
        log.say(f"container {create['name']} from image {create['image']}")
        try:
            container.start()
        except docker.errors.APIError as error:
            if create["device_requests"] and "gpu" in str(error).lower():
                raise GpuUnavailableError(
                    f"cell {job.cell}: Docker cannot give the container a GPU "
                    f"({error.explanation}). Install the NVIDIA Container Toolkit on this "
                    "machine, or run on a GPU runner"
                ) from None
            raise
        for line in lines_of(container.logs(stream=True, follow=True)):
            log.line(line)
        status = int(container.wait().get("StatusCode", 1))
        try:
            copied = extract_archive(container.get_archive(ARTIFACTS)[0], artifacts)
            log.say(f"artifacts: {', '.join(sorted(copied)) or 'none'} -> {artifacts}")
        except docker.errors.NotFound:
            log.say(f"warning: the container has no {ARTIFACTS}; no artifacts copied")
        return status
    finally:
        try:
            container.remove(force=True)
        except docker.errors.DockerException as error:
            log.say(f"warning: could not remove {create['name']}: {error}; `clean` removes it")


class DockerRunner:
    """The job (python -m fallback_matrix.job) inside the cell's build image."""

    name = "docker"

    def __init__(self, client: DockerClient | None = None) -> None:
        self.client = client
        self.volume = os.environ.get(DOCKER_CACHE_ENV) or CACHE_VOLUME

    def run(self, job: Job, log: Reporter) -> tuple[int, str]:
        client = self.client = self.client or connect_docker()
        if self.volume[:1] == "/":  # a host directory: one owned by root goes to the image user
            Path(self.volume).mkdir(parents=True, exist_ok=True)
            if Path(self.volume).stat().st_uid == 0 and os.geteuid() == 0:
                os.chown(self.volume, IMAGE_UID, IMAGE_UID)
        image = ensure_image(client, plan_image(Path(job.repo), job), log)
        user = container_user(self.volume, job.repo)
        inside, create = plan_container(job, image, volume=self.volume, user=user)
        status = run_container(client, inside, create, log, Path(job.artifacts))
        return status, f"container {create['name']}, image {image}"


# Where a job runs: ``run`` runs it (host paths) to its end, for its exit status and where it ran.
Runner = LocalRunner | DockerRunner


def choose_runner(choice: RunnerChoice) -> tuple[Runner, str]:
    """The runner ``choice`` means here, and why; "docker" raises when no daemon answers."""
    if choice == "local":
        return LocalRunner(), "asked for --runner local"
    if choice == "docker":
        return DockerRunner(connect_docker()), "asked for --runner docker"
    if docker_problem() is None:
        return DockerRunner(), "auto: a Docker daemon answers"
    return LocalRunner(), "auto: no Docker daemon answers"
