"""Run a cell's job in a container of the cell's build image.

The repository and the wheelhouse are mounted read-only; a named volume (or a
host directory, see DOCKER_CACHE_ENV) keeps the caches (venvs, build dirs,
ccache) across containers; the artifacts are copied out of the container when
it ends. With a host directory the job runs as that directory's owner, so it
can write there whoever created it (a hosted runner's user is uid 1001, the
image's user 1000), and what it writes stays the owner's: actions/cache can
save it and the runner can delete it. Containers carry a label so leftovers
can be found (``python -m fallback_matrix clean``) and are removed whatever
happens: success, failure or Ctrl-C.
"""

from __future__ import annotations

import io
import os
import tarfile
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Literal

from ..errors import ImageBuildError, RunnerUnavailableError
from ..image import ImagePlan, plan_image
from ..report import Reporter
from .base import CellWork, RunnerName, RunOutcome
from .engine import connect_docker

if TYPE_CHECKING:
    from docker import DockerClient

LABEL = "org.torch-fallback.matrix"
CELL_LABEL = "org.torch-fallback.matrix.cell"
CACHE_VOLUME = "torch-fallback-matrix-cache"
IMAGE_UID = 1000  # the image's user (docker/Dockerfile)
# An absolute host directory to keep the caches in instead of the volume (CI caches it).
DOCKER_CACHE_ENV = "FALLBACK_MATRIX_DOCKER_CACHE"


@dataclass(frozen=True)
class InContainer:
    """Where the job sees things inside the container."""

    repo: str = "/src"
    wheelhouse: str = "/wheelhouse"
    cache: str = "/cache"
    work: str = "/tmp/cell-work"
    artifacts: str = "/out"
    job_dir: str = "/tmp"
    job_name: str = "fallback-matrix-job.json"

    @property
    def job_file(self) -> str:
        return f"{self.job_dir}/{self.job_name}"

    @property
    def package_parent(self) -> str:
        """Where ``python -m fallback_matrix.cell_job`` finds the package: the mounted src/."""
        return f"{self.repo}/src"


PATHS = InContainer()


@dataclass(frozen=True)
class BindMount:
    source: str
    target: str
    read_only: bool
    kind: Literal["bind", "volume"]


@dataclass(frozen=True)
class ContainerPlan:
    """Everything about the container of one cell; built without touching Docker."""

    cell: str
    image: str
    name: str
    command: list[str]
    mounts: list[BindMount]
    environment: dict[str, str]
    labels: dict[str, str]
    gpus: bool
    job_json: str = field(repr=False)
    user: str | None = None  # uid:gid the job runs as; None: the image's user
    network: str = "none"  # the job installs offline, from the wheelhouse


def cache_user(cache: str, stat: Callable[[str], os.stat_result] = os.stat) -> str | None:
    """The uid:gid to run as for the cache ``cache``: its owner's when it is a host directory.

    A named volume (no leading /) takes the image user's ownership; so does a
    host directory owned by root, which the host side hands to that user instead.
    """
    if cache[:1] != "/":
        return None
    info = stat(cache)
    if info.st_uid == 0:
        return None
    return f"{info.st_uid}:{info.st_gid}"


def prepare_cache_dir(cache: str) -> None:
    """Create a host cache directory; one owned by root goes to the image's user (uid 1000)."""
    path = Path(cache)
    path.mkdir(parents=True, exist_ok=True)
    info = path.stat()
    if info.st_uid == 0 and os.geteuid() == 0:
        os.chown(path, IMAGE_UID, IMAGE_UID)


def plan_container(
    work: CellWork,
    image_tag: str,
    *,
    volume: str = CACHE_VOLUME,
    environ: Mapping[str, str] | None = None,
    suffix: str | None = None,
    user: str | None = None,
) -> ContainerPlan:
    job = work.job(
        repo=PATHS.repo,
        wheelhouse=PATHS.wheelhouse,
        cache=PATHS.cache,
        work=PATHS.work,
        artifacts=PATHS.artifacts,
    )
    environment = {"PYTHONUNBUFFERED": "1", "HOME": "/tmp"}
    if environ and environ.get("CI"):
        environment["CI"] = environ["CI"]
    return ContainerPlan(
        cell=work.cell.name,
        image=image_tag,
        name=f"fallback-matrix-{work.cell.name}-{suffix or uuid.uuid4().hex[:8]}",
        command=["python3", "-m", "fallback_matrix.cell_job", PATHS.job_file],
        mounts=[
            BindMount(str(work.repo), PATHS.repo, read_only=True, kind="bind"),
            BindMount(str(work.wheelhouse), PATHS.wheelhouse, read_only=True, kind="bind"),
            BindMount(
                volume, PATHS.cache, read_only=False, kind="bind" if volume[:1] == "/" else "volume"
            ),
        ],
        environment=environment,
        labels={LABEL: "1", CELL_LABEL: work.cell.name},
        gpus=work.gpus or work.cell.gpu,
        job_json=job.to_json(),
        user=user,
        # offline (the wheelhouse), unless it installs from a package index on this host
        network="host" if work.index_url else "none",
    )


def ensure_image(client: DockerClient, plan: ImagePlan, log: Reporter) -> str:
    """The image's tag, built now only when no image has this tag yet."""
    import docker

    try:
        client.images.get(plan.tag)
    except docker.errors.ImageNotFound:
        pass
    else:
        log.say(f"image {plan.tag}: reusing it (Dockerfile and build args unchanged)")
        return plan.tag
    args = " ".join(f"{key}={value}" for key, value in plan.build_args.items())
    log.say(f"image {plan.tag}: building {plan.context / plan.dockerfile} with {args}")
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
                if line.strip():
                    log.line(line)
            if "error" in chunk:
                raise ImageBuildError(
                    f"cell {log.cell}: building image {plan.tag} failed: "
                    f"{str(chunk['error']).strip()}; "
                    f"log: {log.path}"
                )
    except docker.errors.APIError as error:
        raise ImageBuildError(
            f"cell {log.cell}: building image {plan.tag} failed: {error}; log: {log.path}"
        ) from None
    log.say(f"image {plan.tag}: built")
    return plan.tag


def job_archive(name: str, text: str) -> bytes:
    """A tar holding one file, to put into the container before it starts."""
    payload = text.encode()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo(name)
        info.size = len(payload)
        info.mode = 0o644
        archive.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


def extract_archive(chunks: Iterable[bytes], destination: Path) -> list[str]:
    """Unpack a get_archive stream of a directory into ``destination``, dropping its top folder."""
    archive_bytes = io.BytesIO(b"".join(chunks))
    extracted = []
    destination.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=archive_bytes, mode="r") as archive:
        for member in archive.getmembers():
            parts = PurePosixPath(member.name).parts[1:]
            if not parts or not member.isfile():
                continue
            member.name = str(PurePosixPath(*parts))
            archive.extract(member, destination, filter="data")
            extracted.append(member.name)
    return extracted


def lines_of(chunks: Iterable[bytes]) -> Iterator[str]:
    """Split a stream of byte chunks into text lines."""
    pending = ""
    for chunk in chunks:
        pending += chunk.decode("utf-8", errors="replace")
        *complete, pending = pending.split("\n")
        yield from complete
    if pending:
        yield pending


def _create(client: DockerClient, plan: ContainerPlan) -> Any:
    import docker

    mounts = [
        docker.types.Mount(target=m.target, source=m.source, type=m.kind, read_only=m.read_only)
        for m in plan.mounts
    ]
    device_requests = (
        [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])] if plan.gpus else None
    )
    return client.containers.create(
        image=plan.image,
        command=plan.command,
        name=plan.name,
        labels=plan.labels,
        environment=plan.environment,
        mounts=mounts,
        network_mode=plan.network,
        device_requests=device_requests,
        working_dir=PATHS.package_parent,
        user=plan.user or "",
    )


def execute(client: DockerClient, plan: ContainerPlan, log: Reporter, artifacts: Path) -> int:
    """Run the planned container to its end; always remove it. Returns its exit status."""
    import docker

    container = None
    try:
        container = _create(client, plan)
        log.say(f"container {plan.name} from image {plan.image}")
        container.put_archive(PATHS.job_dir, job_archive(PATHS.job_name, plan.job_json))
        try:
            container.start()
        except docker.errors.APIError as error:
            if plan.gpus and "gpu" in str(error).lower():
                raise RunnerUnavailableError(
                    f"cell {plan.cell}: Docker cannot give the container a GPU "
                    f"({error.explanation}). "
                    "Install the NVIDIA Container Toolkit on this machine, or run on a GPU runner"
                ) from None
            raise
        for line in lines_of(container.logs(stream=True, follow=True)):
            log.line(line)
        status = int(container.wait().get("StatusCode", 1))
        try:
            stream, _ = container.get_archive(PATHS.artifacts)
            copied = extract_archive(stream, artifacts)
            log.say(f"artifacts: {', '.join(sorted(copied)) or 'none'} -> {artifacts}")
        except docker.errors.NotFound:
            log.warn(f"the container has no {PATHS.artifacts}; no artifacts copied")
        return status
    finally:
        if container is not None:
            try:
                container.remove(force=True)
            except docker.errors.DockerException as error:
                log.warn(
                    f"could not remove container {plan.name}: {error}; "
                    "python -m fallback_matrix clean removes leftovers"
                )


class DockerRunner:
    """The job (python -m fallback_matrix.cell_job) inside the cell's build image."""

    name: RunnerName = "docker"

    def __init__(
        self,
        connect: Callable[[], DockerClient] = connect_docker,
        volume: str = CACHE_VOLUME,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._connect = connect
        self._client: DockerClient | None = None
        self.volume = volume
        self.environ = environ or {}

    def client(self) -> DockerClient:
        if self._client is None:
            self._client = self._connect()
        return self._client

    def run(self, work: CellWork, log: Reporter) -> RunOutcome:
        client = self.client()
        if self.volume[:1] == "/":
            prepare_cache_dir(self.volume)
        image = ensure_image(client, plan_image(work.repo, work.cell), log)
        plan = plan_container(
            work, image, volume=self.volume, environ=self.environ, user=cache_user(self.volume)
        )
        status = execute(client, plan, log, work.artifacts)
        return RunOutcome(exit_code=status, where=f"container {plan.name}, image {image}")


def leftover_containers(client: DockerClient) -> list[Any]:
    return list(client.containers.list(all=True, filters={"label": LABEL}))
