"""Release helpers: the wheels PyPI gets, and a rehearsal of the publish against a local index.

``collect_dist`` copies the wheel of each ``pypi: true`` cell into ``dist/`` and
refuses anything PyPI would reject or users should not get: a local version
label, a non-manylinux tag, a version other than the tag's.

``LocalIndex`` is a pypiserver on 127.0.0.1 in a temporary directory: ``twine
upload`` puts the built wheels there, and a fresh container installs
torch-fallback from it (``python -m fallback_matrix publish-local``).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from packaging.utils import parse_wheel_filename

from .cells import Cell
from .errors import MatrixError
from .report import Reporter
from .report import run as run_streaming


def cell_wheel(artifacts: Path, cell: str) -> Path:
    """The one torch_fallback wheel a cell left in ``artifacts/<cell>/``."""
    wheels = sorted((artifacts / cell).glob("torch_fallback-*.whl"))
    if len(wheels) != 1:
        found = ", ".join(w.name for w in wheels) or "none"
        raise MatrixError(
            f"expected one torch_fallback wheel in {artifacts / cell}/, found {found}: "
            f"run the cell first (nox -s build-{cell})"
        )
    return wheels[0]


def collect_dist(artifacts: Path, cells: Sequence[Cell], out: Path, tag: str | None) -> list[Path]:
    """Copy the PyPI cells' wheels to ``out`` after checking them; the copied paths."""
    problems, wheels = [], []
    for cell in cells:
        if not cell.pypi:
            problems.append(f"cell {cell.name} is not marked pypi: true in matrix.yaml")
            continue
        wheel = cell_wheel(artifacts, cell.name)
        _, version, _, tags = parse_wheel_filename(wheel.name)
        platforms = {t.platform for t in tags}
        if version.local is not None:
            problems.append(f"{wheel.name}: local version label +{version.local} (PyPI rejects it)")
        if tag and str(version) != tag.removeprefix("v"):
            problems.append(f"{wheel.name}: version {version} is not the tag's {tag}")
        if not all(platform.startswith("manylinux") for platform in platforms):
            problems.append(f"{wheel.name}: not a manylinux wheel (auditwheel repair it)")
        wheels.append(wheel)
    if problems:
        raise MatrixError("not publishing: " + "; ".join(problems))
    out.mkdir(parents=True, exist_ok=True)
    copied = []
    for wheel in wheels:
        shutil.copy2(wheel, out / wheel.name)
        copied.append(out / wheel.name)
    return copied


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class LocalIndex:
    """A pypiserver serving ``directory`` on 127.0.0.1, uploads allowed without a password."""

    def __init__(self, tools: Path, directory: Path, log: Reporter) -> None:
        self.tools, self.directory, self.log = tools, directory, log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LocalIndex:
        self.directory.mkdir(parents=True, exist_ok=True)
        server = self.tools / "pypi-server"
        if not server.is_file():
            raise MatrixError(f"{server} not found: pip install pypiserver (nox -s publish-local)")
        command = [str(server), "run", "-p", str(self.port), "-i", "127.0.0.1"]
        command += ["-a", ".", "-P", ".", "--disable-fallback", str(self.directory)]
        self.log.say(f"local index: {' '.join(command)}")
        self._process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/simple/", timeout=2):
                    self.log.say(f"local index: answering at {self.url}/simple/")
                    return self
            except (urllib.error.URLError, OSError):
                if self._process.poll() is not None:
                    break
                time.sleep(0.3)
        self.__exit__(None, None, None)
        raise MatrixError(f"pypiserver did not answer at {self.url} within 30 s")

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)
            self._process = None

    def upload(self, wheels: Sequence[Path]) -> None:
        command = [str(self.tools / "twine"), "upload", "--non-interactive"]
        command += ["--repository-url", f"{self.url}/", "-u", "ci", "-p", "ci"]
        command += [str(wheel) for wheel in wheels]
        self.log.say(f"twine upload of {len(wheels)} wheel(s) to {self.url}/")
        status = run_streaming(command, self.log.line)
        if status != 0:
            raise MatrixError(f"twine upload to {self.url} failed (exit {status}); see above")
        listing = urllib.request.urlopen(f"{self.url}/simple/torch-fallback/", timeout=5)
        names = sorted(
            line.split(">")[1].split("<")[0]
            for line in listing.read().decode().splitlines()
            if "<a " in line
        )
        self.log.say(f"local index now serves: {', '.join(names)}")
