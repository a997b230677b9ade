"""Wheelhouses: every wheel a cell installs, downloaded on the host for offline installs. Named
after what it holds (cells that install the same share one); filled aside, renamed when complete.
torch comes from the variant's index with none of the machine's pip configuration (a find-links
folder must not swap the build), unless that index does not answer."""

import hashlib
import json
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import tomllib
from packaging.utils import parse_wheel_filename

from .errors import CellError
from .job import GROUPS, PIP_WITH_GROUPS, WHEELHOUSE_MANIFEST
from .matrix import Cell
from .report import Reporter, run_process, without_pip_config
from .runners import find_python

# pip does not widen --platform to older glibc versions by itself: list every
# manylinux tag the images' glibc (Debian bookworm: 2.36) accepts, newest first.
PLATFORMS = (
    *(f"manylinux_2_{minor}_x86_64" for minor in range(36, 4, -1)),
    *("manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"),
)
MANIFEST_NAME = WHEELHOUSE_MANIFEST  # the job keys the environments it makes by it


def probe_index(url: str, timeout: float = 3.0) -> str | None:
    """Why ``url`` does not answer for torch's page (one HEAD request, no retries), or None."""
    if url.startswith("file:"):
        return None if Path(urlparse(url).path).is_dir() else "no such directory"
    page = url.rstrip("/") + "/torch/"
    request = urllib.request.Request(page, method="HEAD", headers={"User-Agent": "fallback-matrix"})
    try:
        urllib.request.urlopen(request, timeout=timeout).close()
    except urllib.error.HTTPError as error:
        return f"HTTP {error.code} for {page}"
    except OSError as error:  # URLError, timeouts
        return str(getattr(error, "reason", error)) or repr(error)
    return None


def dependency_groups(pyproject: Path) -> str:
    """pyproject's [dependency-groups] as canonical JSON, a part of a wheelhouse's key (pip
    says so when a group a cell installs is missing)."""
    try:
        groups = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("dependency-groups")
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise CellError(f"{pyproject} cannot be read: {error}") from None
    return json.dumps(groups, sort_keys=True)


def wheelhouse_key(cell: Cell, groups: str) -> str:
    """A hash of what the wheelhouse of ``cell`` holds (``groups``: dependency_groups)."""
    content = {"python": cell.python, "torch": cell.torch_requirement, "groups": groups}
    content_json = json.dumps(content | {"platforms": sorted(PLATFORMS)}, sort_keys=True)
    return hashlib.sha256(content_json.encode()).hexdigest()[:12]


def wheelhouse_name(cell: Cell, groups: str) -> str:
    """torch-2.14.1-py3.11-<key>: what it holds, so cells that install the same share it."""
    return f"torch-{cell.torch.replace('+', '-')}-py{cell.python}-{wheelhouse_key(cell, groups)}"


def wheelhouse_path(cell: Cell, pyproject: Path, cache: Path) -> Path:
    """Where the wheelhouse of ``cell`` lies in the host's cache, filled or not."""
    return cache / "wheelhouse" / wheelhouse_name(cell, dependency_groups(pyproject))


def download_python(version: str, cache_root: Path, log: Reporter) -> str:
    """A venv of Python ``version`` with pip >= 25.1 (``--group``) for a cell's pip download:
    pip evaluates markers (``python_version < "3.11"``) for the Python it runs on."""
    venv = cache_root / "pip" / f"py{version}"
    python = venv / "bin" / "python"
    if not (venv / ".complete").is_file():
        interpreter = find_python(version, purpose="pip downloads a cell's wheels with it")
        log.say(f"wheelhouse: a venv of {interpreter} with {PIP_WITH_GROUPS} at {venv}")
        for command in (
            [interpreter, "-m", "venv", "--clear", str(venv)],
            [str(python), "-m", "pip", "install", "--progress-bar", "off", PIP_WITH_GROUPS],
        ):
            if run_process(command, log.line) != 0:
                raise CellError(f"{' '.join(command)} failed; see above")
        (venv / ".complete").write_text(interpreter + "\n", encoding="utf-8")
    return str(python)


def ensure_wheelhouse(cell: Cell, pyproject: Path, cache: Path, log: Reporter) -> Path:
    """The complete wheelhouse of ``cell``, filled now unless an earlier fill completed."""
    groups = dependency_groups(pyproject)
    final = wheelhouse_path(cell, pyproject, cache)
    if (final / MANIFEST_NAME).is_file():
        log.say(f"wheelhouse: reusing {final} ({len(list(final.glob('*.whl')))} wheels)")
        return final
    torch, index_url = cell.torch_requirement, cell.index.url
    python = download_python(cell.python, cache, log)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".partial", dir=final.parent))
    pip = [python, "-m", "pip", "download", "--progress-bar", "off", "--only-binary=:all:"]
    pip += ["--python-version", cell.python, "--implementation", "cp", "--dest", str(staging)]
    pip += [option for platform in PLATFORMS for option in ("--platform", platform)]
    try:
        if (unreachable := probe_index(index_url)) is None:
            log.say(f"wheelhouse: {torch} from {index_url} (no pip configuration)")
            command = [*pip, "--index-url", index_url, torch]
            status = run_process(command, log.line, env=without_pip_config(os.environ))
        else:
            log.say(f"index {index_url} unreachable ({unreachable}); using pip's own configuration")
            status = run_process([*pip, torch], log.line)
        if status != 0:
            raise CellError(
                f"cell {cell.name}: pip download of {torch} failed (exit {status}); see above. "
                "Check the index, or set it with --index-url VARIANT=URL"
            )
        log.say(f"wheelhouse: got {downloaded_torch(cell, staging)}")
        group_options = [f"--group={pyproject}:{name}" for name in GROUPS]
        if (status := run_process([*pip, PIP_WITH_GROUPS, *group_options], log.line)) != 0:
            raise CellError(f"cell {cell.name}: pip download of the groups failed; see above")
        manifest = {"python": cell.python, "torch": torch, "groups": json.loads(groups)}
        manifest |= {"torch_index": "pip configuration" if unreachable else index_url}
        manifest["wheels"] = sorted(path.name for path in staging.glob("*.whl"))
        (staging / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
        staging.chmod(0o755)  # mkdtemp makes it 0700; the container user must read it
        if (final / MANIFEST_NAME).is_file():
            log.say(f"wheelhouse: another run completed {final} meanwhile; using it")
            return final
        shutil.rmtree(final, ignore_errors=True)  # an incomplete directory
        os.rename(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.say(f"wheelhouse: complete at {final}")
    return final


def downloaded_torch(cell: Cell, staging: Path) -> str:
    """The one torch wheel pip downloaded (for ``torch==PIN``: the release pinned), checked to
    be of the cell's variant: a CUDA cell's pin without a label also matches ``+cpu``."""
    found = sorted(path.name for path in staging.glob("torch-*.whl"))
    if len(found) != 1:
        raise CellError(f"cell {cell.name}: pip downloaded {found}, not one torch wheel")
    if cell.variant == "cuda" and (parse_wheel_filename(found[0])[1].local or "").startswith("cpu"):
        raise CellError(
            f"cell {cell.name}: pip downloaded {found[0]}, a CPU-only build, for a CUDA cell: a "
            "find-links folder or index of this machine offers it first. Point the cuda "
            "variant at an index with CUDA builds (--index-url cuda=URL)"
        )
    return found[0]
