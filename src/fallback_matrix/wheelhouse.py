"""Wheelhouses: every wheel a cell installs, downloaded once on the host.

A container then installs offline (``--no-index --find-links``) from a
read-only mount. A wheelhouse lives in ``<cache>/wheelhouse/<name>/``, named
after what it installs (torch, Python and a hash of the rest), never after the
cell: cells that install the same things (a build cell and the GPU cell that
tests its wheel) share one directory, and CI caches it once. It is filled in a
temporary directory and renamed into place only when complete, so an
interrupted fill is never trusted.

torch comes from the variant's index when that answers, with none of the machine's pip
configuration (PIP_CONFIG_FILE=/dev/null): a find-links folder or a
constraint file of the machine must not swap the build the cell pins (a local
``+cpu`` file for a CUDA cell, a cap below the pinned release).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from packaging.version import Version

from .cell_job import PIP_WITH_GROUPS
from .cells import Cell
from .errors import WheelhouseError
from .index_probe import ProbeResult, probe_index
from .project import group_args
from .report import Reporter, without_pip_config
from .report import run as run_streaming
from .versions import torch_matches

# pip does not widen --platform to older glibc versions by itself: list every
# manylinux tag the images' glibc (Debian bookworm: 2.36) accepts, newest first.
TARGET_GLIBC_MINOR = 36
PLATFORMS: tuple[str, ...] = (
    *(f"manylinux_2_{minor}_x86_64" for minor in range(TARGET_GLIBC_MINOR, 4, -1)),
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
)
MANIFEST_NAME = "wheelhouse.json"


class PipDownload(Protocol):
    """Runs ``pip download ARGS`` (in ``env`` when given) and returns its exit status."""

    def __call__(self, args: Sequence[str], env: Mapping[str, str] | None = None) -> int: ...


IndexProbe = Callable[[str], ProbeResult]


@dataclass(frozen=True)
class WheelhouseRequest:
    """What one cell installs: the key of its wheelhouse."""

    cell: str
    python: str
    torch_requirement: str
    groups: str  # the [dependency-groups] table (project.dependency_groups)
    pyproject: Path = field(default=Path("pyproject.toml"), compare=False)
    platforms: tuple[str, ...] = PLATFORMS

    @classmethod
    def for_cell(cls, cell: Cell, groups: str, pyproject: Path) -> WheelhouseRequest:
        return cls(cell.name, cell.python, cell.torch_requirement, groups, pyproject)

    def key(self) -> str:
        content = {
            "python": self.python,
            "torch": self.torch_requirement,
            "groups": self.groups,
            "platforms": sorted(self.platforms),
        }
        digest = hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()
        return digest[:12]

    def dirname(self) -> str:
        """torch-2.14.1-py3.11-<key>: what it holds, so equal requests share it."""
        version = self.torch_requirement.removeprefix("torch==").replace("+", "-")
        return f"torch-{version}-py{self.python}-{self.key()}"


def wheelhouse_path(cache_root: Path, request: WheelhouseRequest) -> Path:
    return cache_root / "wheelhouse" / request.dirname()


def _target_args(request: WheelhouseRequest) -> list[str]:
    args = ["--only-binary=:all:", "--python-version", request.python, "--implementation", "cp"]
    for platform in request.platforms:
        args += ["--platform", platform]
    return args


def torch_wheels(directory: Path) -> list[Path]:
    return sorted(directory.glob("torch-*.whl"))


def wheel_version(wheel: Path) -> str:
    """torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl -> 2.13.0+cpu."""
    return wheel.name.split("-")[1]


def check_torch_wheel(directory: Path, request: WheelhouseRequest) -> Path:
    """The one torch wheel in ``directory``, whose version must match the pin."""
    wanted = request.torch_requirement.removeprefix("torch==")
    found = torch_wheels(directory)
    if len(found) != 1:
        names = ", ".join(path.name for path in found) or "none"
        raise WheelhouseError(
            f"cell {request.cell}: expected exactly one torch wheel for "
            f"{request.torch_requirement} "
            f"in the wheelhouse, found {names}"
        )
    got = wheel_version(found[0])
    if not torch_matches(wanted, got):
        raise WheelhouseError(
            f"cell {request.cell}: pip downloaded {found[0].name} for {request.torch_requirement}: "
            f"wanted version {wanted}, got {got}. Check the index it used (above) and pip's "
            "configuration (pip config list)"
        )
    return found[0]


def check_variant(wheel: Path, request: WheelhouseRequest, variant: str) -> None:
    """A CUDA cell must not get a CPU-only torch (PyPI's CUDA wheels carry no +cpu label)."""
    local = Version(wheel_version(wheel)).local or ""
    if variant == "cuda" and local.startswith("cpu"):
        raise WheelhouseError(
            f"cell {request.cell}: pip downloaded {wheel.name}, a CPU-only build, for a CUDA "
            "cell: a find-links folder or index of this machine offers it first. Point the "
            "cuda variant at an index with CUDA builds (--index-url cuda=URL)"
        )


def pip_cert(environ: Mapping[str, str]) -> str | None:
    """The CA bundle pip is configured with (PIP_CERT, else pip's config), if any."""
    for key in ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"):
        if environ.get(key):
            return environ[key]
    listing = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    )
    for line in listing.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.endswith(".cert") and value.strip("'\""):
            return value.strip("'\"")
    return None


def hermetic_pip(environ: Mapping[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """pip options and environment that ignore every pip configuration but the CA bundle."""
    environ = os.environ if environ is None else environ
    cert = pip_cert(environ)
    return (["--cert", cert] if cert else []), without_pip_config(environ)


def download_python(version: str, cache_root: Path, log: Reporter) -> str:
    """A Python ``version`` with pip >= 25.1 to run pip download for a cell with.

    pip evaluates the environment markers of dependencies (``tomli; python_version <
    "3.11"``) for the Python it runs on, whatever --python-version says: a cell's
    wheels are downloaded by its own Python version, from a venv kept in the cache.
    """
    from .runners.local import find_python

    if version == f"{sys.version_info.major}.{sys.version_info.minor}":
        return sys.executable
    venv = cache_root / "pip" / f"py{version}"
    python = venv / "bin" / "python"
    if not (venv / ".complete").is_file():
        interpreter = find_python(version, purpose="pip downloads a cell's wheels with it")
        log.say(f"wheelhouse: a venv of {interpreter} with {PIP_WITH_GROUPS} at {venv}")
        for command in (
            [interpreter, "-m", "venv", "--clear", str(venv)],
            [str(python), "-m", "pip", "install", "--progress-bar", "off", PIP_WITH_GROUPS],
        ):
            if run_streaming(command, log.line) != 0:
                raise WheelhouseError(f"{' '.join(command)} failed; see above")
        (venv / ".complete").write_text(interpreter + "\n", encoding="utf-8")
    return str(python)


def host_pip_download(log: Reporter, python: str = sys.executable) -> PipDownload:
    """pip download with ``python`` (and pip's configuration here, unless given ``env``)."""

    def download(args: Sequence[str], env: Mapping[str, str] | None = None) -> int:
        command = [python, "-m", "pip", "download", "--progress-bar", "off", *args]
        return run_streaming(command, log.line, env=env)

    return download


def ensure_wheelhouse(
    request: WheelhouseRequest,
    index_url: str,
    cache_root: Path,
    log: Reporter,
    *,
    pip_download: PipDownload | None = None,
    probe: IndexProbe = probe_index,
    variant: str = "cpu",
) -> Path:
    """The complete wheelhouse of ``request``, filled now unless an earlier fill completed."""
    final = wheelhouse_path(cache_root, request)
    if (final / MANIFEST_NAME).is_file():
        count = len(list(final.glob("*.whl")))
        log.say(f"wheelhouse: reusing {final} ({count} wheels)")
        return final
    if pip_download is None:
        pip_download = host_pip_download(log, download_python(request.python, cache_root, log))
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".partial", dir=final.parent))
    try:
        _fill(request, index_url, staging, log, pip_download, probe, variant)
        staging.chmod(0o755)  # mkdtemp makes it 0700; the container user must read it
        if (final / MANIFEST_NAME).is_file():
            log.say(f"wheelhouse: another run completed {final} meanwhile; using it")
            return final
        if final.exists():
            shutil.rmtree(final)  # an incomplete directory from an older layout
        os.rename(staging, final)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    log.say(f"wheelhouse: complete at {final}")
    return final


def _fill(
    request: WheelhouseRequest,
    index_url: str,
    staging: Path,
    log: Reporter,
    pip_download: PipDownload,
    probe: IndexProbe,
    variant: str,
) -> None:
    target = _target_args(request)
    result = probe(index_url)
    env: dict[str, str] | None = None
    if result.reachable:
        log.say(
            f"wheelhouse: {request.torch_requirement} from {index_url} "
            "(no pip configuration of this machine applies to torch)"
        )
        cert_args, env = hermetic_pip()
        index_args = [*cert_args, "--index-url", index_url]
    else:
        log.say(
            f"index {index_url} unreachable ({result.detail}); "
            "using pip's own configuration instead"
        )
        index_args = []
    status = pip_download(
        [*target, *index_args, "--dest", str(staging), request.torch_requirement], env
    )
    if status != 0:
        raise WheelhouseError(
            f"cell {request.cell}: pip download of {request.torch_requirement} failed "
            f"(exit {status}); "
            "see its output above. Check the index, or set it with --index-url VARIANT=URL"
        )
    torch_wheel = check_torch_wheel(staging, request)
    check_variant(torch_wheel, request, variant)
    log.say(f"wheelhouse: got {torch_wheel.name}")
    groups = group_args(request.pyproject)
    log.say(f"wheelhouse: {PIP_WITH_GROUPS} and {' '.join(groups)} from pip's configured index")
    status = pip_download([*target, "--dest", str(staging), PIP_WITH_GROUPS, *groups])
    if status != 0:
        raise WheelhouseError(
            f"cell {request.cell}: pip download of the build/test groups failed (exit {status}); "
            "see its output above"
        )
    manifest = {
        **asdict(request),
        "pyproject": str(request.pyproject),
        "key": request.key(),
        "torch_index": index_url if result.reachable else "pip configuration",
        "torch_wheel": torch_wheel.name,
        "wheels": sorted(path.name for path in staging.glob("*.whl")),
    }
    (staging / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
