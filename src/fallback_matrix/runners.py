"""Runners run a cell's job: ``docker`` in the cell's build image, ``local`` with a host Python.

Docker: the repository and the wheelhouse are mounted read-only; a named volume
(or a host directory, $FALLBACK_MATRIX_DOCKER_CACHE) keeps the caches (venvs, build
dirs, ccache) across containers; the artifacts are copied out when the container
ends. With a host directory the job runs as that directory's owner, so it can
write there whoever created it (a hosted runner's user is uid 1001, the image's
1000). Containers carry a label, so leftovers can be found (``python -m
fallback_matrix clean``), and are removed whatever happens: success, failure, Ctrl-C.
The image's tag hashes its build context and build args: an unchanged image is
found by tag and never rebuilt.
"""

from __future__ import annotations

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
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Literal, NamedTuple, Protocol

from .job import Job
from .matrix import CellError, RunnerUnavailableError
from .report import Reporter, run_process

if TYPE_CHECKING:
    from docker.types import Mount

    from docker import DockerClient

RunnerChoice = Literal["docker", "local", "auto"]
LABEL = "org.torch-fallback.matrix"
CELL_LABEL = "org.torch-fallback.matrix.cell"
CACHE_VOLUME = "torch-fallback-matrix-cache"
DOCKER_CACHE_ENV = "FALLBACK_MATRIX_DOCKER_CACHE"  # a host directory instead of the volume
IMAGE_UID = 1000  # the image's user (docker/Dockerfile)
IMAGE_REPOSITORY = "torch-fallback-build"
# Where the job sees things in the container; the job file goes to /tmp before it starts.
REPO, WHEELHOUSE, CACHE, WORK, ARTIFACTS = "/src", "/wheelhouse", "/cache", "/tmp/cell-work", "/out"
JOB_FILE = "/tmp/fallback-matrix-job.json"
NO_DAEMON_HINT = (
    "Start the Docker daemon (sudo systemctl start docker, or sudo dockerd), or use --runner local."
)

# nox logs at debug level; the SDK's HTTP chatter would drown the cell's own log.
for _chatty in ("urllib3", "docker"):
    logging.getLogger(_chatty).setLevel(logging.WARNING)


class Runner(Protocol):
    name: str

    def run(self, job: Job, log: Reporter) -> tuple[int, str]:
        """Run ``job`` (host paths) to its end: its exit status, and where it ran."""
        ...


class EngineStatus(NamedTuple):
    available: bool
    detail: str


# --- choosing -----------------------------------------------------------------------------------


def connect_docker(timeout: int = 900) -> DockerClient:
    """A client of a daemon that answers (image builds can be silent for minutes)."""
    try:
        import docker
    except ImportError:
        raise RunnerUnavailableError(
            "the docker Python package is not installed: pip install docker (nox installs it "
            "for the noxfile), or use --runner local"
        ) from None
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
    except docker.errors.DockerException as error:
        reason = str(error).splitlines()[0][:300]
        raise RunnerUnavailableError(
            f"no Docker daemon answers ({reason}). {NO_DAEMON_HINT}"
        ) from None
    return client


def engine_status() -> EngineStatus:
    """Whether a daemon answers, without raising."""
    try:
        client = connect_docker(timeout=5)
    except RunnerUnavailableError as error:
        return EngineStatus(False, str(error))
    version = client.version().get("Version", "?")
    client.close()
    return EngineStatus(True, f"Docker engine {version} answers")


def choose_runner(
    choice: RunnerChoice, status: Callable[[], EngineStatus] = engine_status
) -> tuple[Runner, str]:
    """The runner ``choice`` means here, and why; "docker" raises when no daemon answers."""
    if choice == "local":
        return LocalRunner(), "asked for --runner local"
    if choice == "docker":
        return DockerRunner(connect_docker()), "asked for --runner docker"
    engine = status()
    if engine.available:
        return DockerRunner(), f"auto: {engine.detail}"
    return LocalRunner(), "auto: no Docker daemon answers"


# --- local ---------------------------------------------------------------------------------------


def _python_version(executable: str) -> str | None:
    probe = "import sys; print('%d.%d' % sys.version_info[:2])"
    try:
        result = subprocess.run([executable, "-c", probe], capture_output=True, text=True)
    except OSError:
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def find_python(
    version: str,
    which: Callable[[str], str | None] = shutil.which,
    purpose: str = "the local runner needs it for this cell; or use --runner docker",
) -> str:
    """An interpreter of ``version`` ("3.11"): this one, pythonX.Y on PATH, or pyenv's."""
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    if running == version:
        return sys.executable
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    installed = sorted(pyenv.glob(f"{version}.*/bin/python{version}"), reverse=True)
    for candidate in [which(f"python{version}"), *map(str, installed)]:
        if candidate and _python_version(candidate) == version:
            return candidate
    raise RunnerUnavailableError(
        f"no Python {version} here (this is Python {running}; none on PATH as python{version} "
        f"or under {pyenv}): install Python {version} ({purpose})"
    )


class LocalRunner:
    """The job with a host Python; its venvs, build dir and ccache in the job's cache."""

    name = "local"

    def run(self, job: Job, log: Reporter) -> tuple[int, str]:
        python = find_python(job.python)
        shutil.rmtree(job.work, ignore_errors=True)
        Path(job.work).mkdir(parents=True)
        job_file = Path(job.work) / "job.json"
        job_file.write_text(job.to_json(), encoding="utf-8")
        if job.gpus:
            log.warn("--gpus has no effect with the local runner: the job sees the host's GPUs")
        source = Path(job.repo) / "src"  # where `python -m` finds fallback_matrix.job
        log.say(f"runner local: {python} -m fallback_matrix.job in {source} (cache {job.cache})")
        status = run_process([python, "-m", "fallback_matrix.job", job_file], log.line, cwd=source)
        return status, f"local Python {python}"


# --- docker --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImagePlan:
    context: Path
    dockerfile: str
    build_args: Mapping[str, str]
    tag: str


def plan_image(repo: Path, job: Job) -> ImagePlan:
    """The image a cell runs in: the Dockerfile's directory is the build context."""
    dockerfile = repo / job.dockerfile
    if not dockerfile.is_file():
        raise CellError(f"cell {job.cell}: Dockerfile {dockerfile} not found (matrix.yaml image)")
    context, build_args = dockerfile.parent, {"BASE_IMAGE": job.base_image}
    digest = hashlib.sha256()
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        digest.update(path.relative_to(context).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    digest.update(json.dumps(build_args, sort_keys=True).encode())
    tag = f"{IMAGE_REPOSITORY}:{digest.hexdigest()[:12]}"
    return ImagePlan(context, dockerfile.name, build_args, tag)


def ensure_image(client: DockerClient, plan: ImagePlan, log: Reporter) -> str:
    """The image's tag, built now only when no image has this tag yet."""
    import docker

    try:
        client.images.get(plan.tag)
        log.say(f"image {plan.tag}: reusing it (Dockerfile and build args unchanged)")
        return plan.tag
    except docker.errors.ImageNotFound:
        pass
    log.say(f"image {plan.tag}: building {plan.context / plan.dockerfile} with {plan.build_args}")
    failed = f"cell {log.cell}: building image {plan.tag} failed"
    try:
        for chunk in client.api.build(
            path=str(plan.context),
            dockerfile=plan.dockerfile,
            tag=plan.tag,
            buildargs=dict(plan.build_args),
            labels={LABEL: "image"},
            rm=True,
            forcerm=True,
            decode=True,
        ):
            for line in str(chunk.get("stream", "")).splitlines():
                log.line(line)
            if "error" in chunk:
                raise CellError(f"{failed}: {str(chunk['error']).strip()}; log: {log.path}")
    except docker.errors.APIError as error:
        raise CellError(f"{failed}: {error}; log: {log.path}") from None
    log.say(f"image {plan.tag}: built")
    return plan.tag


@dataclass(frozen=True)
class ContainerPlan:
    """Everything about the container of one job; made without touching the engine."""

    job: Job  # as the container sees it
    image: str
    name: str
    mounts: list[Mount]
    environment: dict[str, str]
    user: str | None = None  # uid:gid the job runs as; None: the image's user
    command: list[str] = field(
        default_factory=lambda: ["python3", "-m", "fallback_matrix.job", JOB_FILE]
    )

    @property
    def network(self) -> str:
        """Offline (the wheelhouse), unless it installs from a package index on this host."""
        return "host" if self.job.index_url else "none"


def cache_user(cache: str, stat: Callable[[str], os.stat_result] = os.stat) -> str | None:
    """The uid:gid to run as for ``cache``: the owner's when it is a host directory.

    A named volume (no leading /) takes the image user's ownership; so does a host
    directory owned by root, which ``prepare_cache_dir`` hands to that user instead.
    """
    if cache[:1] != "/" or (info := stat(cache)).st_uid == 0:
        return None
    return f"{info.st_uid}:{info.st_gid}"


def prepare_cache_dir(cache: str) -> None:
    """Create a host cache directory; one owned by root goes to the image's user."""
    path = Path(cache)
    path.mkdir(parents=True, exist_ok=True)
    if path.stat().st_uid == 0 and os.geteuid() == 0:
        os.chown(path, IMAGE_UID, IMAGE_UID)


def plan_container(
    job: Job,
    image: str,
    *,
    volume: str = CACHE_VOLUME,
    environ: Mapping[str, str] | None = None,
    suffix: str | None = None,
    user: str | None = None,
) -> ContainerPlan:
    from docker.types import Mount

    wheel = job.prebuilt_wheel  # a wheel staged under the repository
    if wheel:
        wheel = f"{REPO}/{Path(wheel).relative_to(job.repo).as_posix()}"
    inside = dataclasses.replace(
        job,
        repo=REPO,
        wheelhouse=WHEELHOUSE,
        cache=CACHE,
        work=WORK,
        artifacts=ARTIFACTS,
        prebuilt_wheel=wheel,
    )
    environment = {"PYTHONUNBUFFERED": "1", "HOME": "/tmp"}
    if environ and environ.get("CI"):
        environment["CI"] = environ["CI"]
    return ContainerPlan(
        job=inside,
        image=image,
        name=f"fallback-matrix-{job.cell}-{suffix or uuid.uuid4().hex[:8]}",
        mounts=[
            Mount(REPO, job.repo, type="bind", read_only=True),
            Mount(WHEELHOUSE, job.wheelhouse, type="bind", read_only=True),
            Mount(CACHE, volume, type="bind" if volume[:1] == "/" else "volume"),
        ],
        environment=environment,
        user=user,
    )


def tar_one_file(path: str, text: str) -> bytes:
    """A tar holding one file, to put into the container before it starts."""
    payload, buffer = text.encode(), io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo(PurePosixPath(path).name)
        info.size, info.mode = len(payload), 0o644
        archive.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


def extract_archive(chunks: Iterable[bytes], destination: Path) -> list[str]:
    """Unpack a get_archive stream of a directory into ``destination``, dropping its top folder."""
    extracted = []
    destination.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks)), mode="r") as archive:
        for member in archive.getmembers():
            parts = PurePosixPath(member.name).parts[1:]
            if parts and member.isfile():
                member.name = str(PurePosixPath(*parts))
                archive.extract(member, destination, filter="data")
                extracted.append(member.name)
    return extracted


def lines_of(chunks: Iterable[bytes]) -> Iterator[str]:
    """Split a stream of byte chunks into text lines."""
    pending = ""
    for chunk in chunks:
        *complete, pending = (pending + chunk.decode("utf-8", errors="replace")).split("\n")
        yield from complete
    if pending:
        yield pending


def run_container(client: DockerClient, plan: ContainerPlan, log: Reporter, artifacts: Path) -> int:
    """Run the planned container to its end; always remove it. Returns its exit status."""
    import docker

    gpus = plan.job.gpus or plan.job.gpu
    container = client.containers.create(
        image=plan.image,
        command=plan.command,
        name=plan.name,
        labels={LABEL: "1", CELL_LABEL: plan.job.cell},
        environment=plan.environment,
        mounts=plan.mounts,
        network_mode=plan.network,
        device_requests=[docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
        if gpus
        else None,
        working_dir=f"{REPO}/src",  # where python -m finds fallback_matrix
        user=plan.user or "",
    )
    try:
        log.say(f"container {plan.name} from image {plan.image}")
        container.put_archive(
            str(PurePosixPath(JOB_FILE).parent), tar_one_file(JOB_FILE, plan.job.to_json())
        )
        try:
            container.start()
        except docker.errors.APIError as error:
            if gpus and "gpu" in str(error).lower():
                raise RunnerUnavailableError(
                    f"cell {plan.job.cell}: Docker cannot give the container a GPU "
                    f"({error.explanation}). Install the NVIDIA Container Toolkit on this "
                    "machine, or run on a GPU runner"
                ) from None
            raise
        for line in lines_of(container.logs(stream=True, follow=True)):
            log.line(line)
        status = int(container.wait().get("StatusCode", 1))
        try:
            stream, _ = container.get_archive(ARTIFACTS)
            copied = extract_archive(stream, artifacts)
            log.say(f"artifacts: {', '.join(sorted(copied)) or 'none'} -> {artifacts}")
        except docker.errors.NotFound:
            log.warn(f"the container has no {ARTIFACTS}; no artifacts copied")
        return status
    finally:
        try:
            container.remove(force=True)
        except docker.errors.DockerException as error:
            log.warn(f"could not remove container {plan.name}: {error}; `clean` removes leftovers")


class DockerRunner:
    """The job (python -m fallback_matrix.job) inside the cell's build image."""

    name = "docker"

    def __init__(self, client: DockerClient | None = None, volume: str | None = None) -> None:
        self._client = client
        self.volume = volume or os.environ.get(DOCKER_CACHE_ENV) or CACHE_VOLUME

    def run(self, job: Job, log: Reporter) -> tuple[int, str]:
        client = self._client = self._client or connect_docker()
        if self.volume[:1] == "/":
            prepare_cache_dir(self.volume)
        image = ensure_image(client, plan_image(Path(job.repo), job), log)
        user = cache_user(self.volume)
        plan = plan_container(job, image, volume=self.volume, environ=os.environ, user=user)
        status = run_container(client, plan, log, Path(job.artifacts))
        return status, f"container {plan.name}, image {image}"
