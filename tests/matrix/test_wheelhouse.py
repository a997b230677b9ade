"""Wheelhouses: keyed by what they install, filled atomically, reused; pip is faked."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from fallback_matrix import matrix, wheelhouse
from fallback_matrix.errors import CellError
from fallback_matrix.matrix import Cell, ImageSpec, IndexUrl
from fallback_matrix.wheelhouse import (
    MANIFEST_NAME,
    dependency_groups,
    ensure_wheelhouse,
    wheelhouse_key,
    wheelhouse_name,
)

GROUPS = '{"build": ["setuptools>=69"], "test": ["pytest>=8"]}'
INDEX = "https://download.pytorch.org/whl/cpu"


def make_cell(name: str, torch: str, variant: str = "cpu", python: str = "3.11") -> Cell:
    return Cell(
        name=name,
        variant=variant,
        torch=torch,
        cuda="13" if variant == "cuda" else None,
        python=python,
        index=IndexUrl(INDEX, "matrix.yaml"),
        image=ImageSpec(dockerfile="docker/Dockerfile", base="python:3.11-slim-bookworm"),
        tests=matrix.TestSelection(paths=["tests/extension"], markers="not requires_cuda"),
        runner_labels=("ubuntu-24.04",),
        selections=("pr", "main"),
    )


CPU = make_cell("cpu", "2.13.0+cpu")


def write_pyproject(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    groups = '[dependency-groups]\nbuild = ["setuptools>=69"]\ntest = ["pytest>=8"]\n'
    (directory / "pyproject.toml").write_text(groups)
    return directory / "pyproject.toml"


class FakePip:
    """Records each `pip download` (run_process) and drops wheels into --dest, like pip would."""

    def __init__(
        self,
        torch_wheel: str = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
        fail_on: int | None = None,
        interrupt_on: int | None = None,
    ) -> None:
        self.calls: list[list[str]] = []
        self.envs: list[dict[str, str] | None] = []
        self.torch_wheel = torch_wheel
        self.fail_on = fail_on
        self.interrupt_on = interrupt_on

    def __call__(
        self, args: Sequence[str], sink: object, env: Mapping[str, str] | None = None
    ) -> int:
        self.calls.append(list(args))
        self.envs.append(dict(env) if env is not None else None)
        dest = Path(args[list(args).index("--dest") + 1])
        number = len(self.calls)
        if number == self.interrupt_on:
            (dest / "half-written.whl").write_bytes(b"partial")
            raise KeyboardInterrupt
        if number == self.fail_on:
            return 1
        if any(arg.startswith("torch==") for arg in args):
            (dest / self.torch_wheel).write_bytes(b"wheel")
        else:
            (dest / "pytest-9.0.0-py3-none-any.whl").write_bytes(b"wheel")
        return 0


def output_of(reporter: Any) -> str:
    """What the user saw on the terminal."""
    return str(reporter.stream.getvalue())


def reachable(url: str) -> str | None:
    return None


def unreachable(url: str) -> str | None:
    return "Could not resolve host"


@pytest.fixture
def fill(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cell_log: Any) -> Any:
    """Fill a wheelhouse under tmp_path with a fake pip (and index probe) in place of the real."""

    def fill(pip: FakePip, probe: Any = unreachable, cell: Cell = CPU) -> Path:
        monkeypatch.setattr(wheelhouse, "run_process", pip)
        monkeypatch.setattr(wheelhouse, "probe_index", probe)
        monkeypatch.setattr(wheelhouse, "download_python", lambda *args: "python3")
        pyproject = write_pyproject(tmp_path / "repo")
        return ensure_wheelhouse(cell, pyproject, tmp_path / "cache", cell_log)

    return fill


def test_key_is_stable_and_ignores_where_the_project_lies(tmp_path: Path) -> None:
    here, elsewhere = write_pyproject(tmp_path / "a"), write_pyproject(tmp_path / "b" / "c")
    assert dependency_groups(here) == dependency_groups(elsewhere) == GROUPS
    assert wheelhouse_key(CPU, GROUPS) == wheelhouse_key(CPU.model_copy(), GROUPS)
    assert wheelhouse_name(CPU, GROUPS) == f"torch-2.13.0-cpu-py3.11-{wheelhouse_key(CPU, GROUPS)}"


def test_cells_that_install_the_same_share_one_wheelhouse() -> None:
    """A build cell and the GPU cell testing its wheel: one directory, one CI cache entry."""
    build = make_cell("cuda", "2.14.1", "cuda")
    gpu = make_cell("cuda-gpu", "2.14.1", "cuda").model_copy(update={"gpu": True})
    assert wheelhouse_name(build, GROUPS) == wheelhouse_name(gpu, GROUPS)
    other = make_cell("cuda", "2.13.0", "cuda")
    assert wheelhouse_name(other, GROUPS) != wheelhouse_name(build, GROUPS)


@pytest.mark.parametrize(
    ("changed", "groups"),
    [
        (make_cell("cpu", "2.13.0+cpu", python="3.12"), GROUPS),
        (make_cell("cpu", "2.13.1+cpu"), GROUPS),
        (CPU, GROUPS.replace(">=8", ">=9")),
    ],
)
def test_key_changes_with_what_is_installed(changed: Cell, groups: str) -> None:
    assert wheelhouse_key(changed, groups) != wheelhouse_key(CPU, GROUPS)


def test_fill_downloads_for_the_cell_platform_and_completes(tmp_path: Path, fill: Any) -> None:
    pip = FakePip()
    path = fill(pip)
    assert path == tmp_path / "cache" / "wheelhouse" / wheelhouse_name(CPU, GROUPS)
    assert (path / MANIFEST_NAME).is_file()
    assert (path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").is_file()
    assert path.stat().st_mode & 0o777 == 0o755  # readable by the container's user
    torch_call, groups_call = pip.calls
    assert torch_call[-1] == "torch==2.13.0+cpu"
    # pip resolves the dependency groups itself (and the pip that installs them in a cell)
    pyproject = tmp_path / "repo" / "pyproject.toml"
    assert groups_call[-4:] == [
        "pip>=25.1",
        f"--group={pyproject}:build",
        f"--group={pyproject}:test",
        f"--group={pyproject}:models",
    ]
    for call in pip.calls:
        assert "--only-binary=:all:" in call
        assert call[call.index("--python-version") + 1] == "3.11"
        assert "manylinux_2_28_x86_64" in call and "manylinux_2_27_x86_64" in call


def test_unreachable_index_falls_back_to_pip_configuration_in_one_line(
    fill: Any, reporter: Any
) -> None:
    pip = FakePip()
    fill(pip, probe=unreachable)
    assert "--index-url" not in pip.calls[0]
    lines = [line for line in output_of(reporter).splitlines() if " unreachable (" in line]
    assert len(lines) == 1
    assert INDEX in lines[0] and "pip's own configuration" in lines[0]


def test_reachable_index_is_used_for_torch_only(fill: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_FIND_LINKS", "/opt/wheels")
    monkeypatch.setenv("PIP_CERT", "/etc/ssl/certs/bundle.crt")
    pip = FakePip()
    fill(pip, probe=reachable)
    torch_call, groups_call = pip.calls
    assert torch_call[torch_call.index("--index-url") + 1] == INDEX
    assert "--index-url" not in groups_call
    # no find-links folder or constraint file of the machine may swap torch's build:
    # torch is downloaded with no pip configuration at all, but the CA bundle
    torch_env, groups_env = pip.envs
    assert torch_env is not None and torch_env["PIP_CONFIG_FILE"] == os.devnull
    assert {key for key in torch_env if key.startswith("PIP_")} == {"PIP_CONFIG_FILE", "PIP_CERT"}
    assert torch_env["PIP_CERT"] == "/etc/ssl/certs/bundle.crt"
    assert groups_env is None  # the groups come through pip's own configuration


def test_a_cpu_only_torch_for_a_cuda_cell_is_refused(tmp_path: Path, fill: Any) -> None:
    pip = FakePip(torch_wheel="torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")
    with pytest.raises(CellError, match=r"CPU-only build, for a CUDA cell"):
        fill(pip, cell=make_cell("cuda-213", "2.13.0", "cuda"))
    assert list((tmp_path / "cache" / "wheelhouse").iterdir()) == []


def test_a_complete_wheelhouse_is_reused_without_pip(fill: Any) -> None:
    first = fill(FakePip())
    again = FakePip()
    assert fill(again) == first
    assert again.calls == []


@pytest.mark.parametrize("pip", [FakePip(fail_on=2), FakePip(fail_on=1)])
def test_a_failed_fill_leaves_nothing_to_trust(tmp_path: Path, fill: Any, pip: FakePip) -> None:
    with pytest.raises(CellError, match="cell cpu: pip download"):
        fill(pip)
    assert list((tmp_path / "cache" / "wheelhouse").iterdir()) == []


def test_an_interrupted_fill_leaves_nothing_and_is_redone(tmp_path: Path, fill: Any) -> None:
    with pytest.raises(KeyboardInterrupt):
        fill(FakePip(interrupt_on=2))
    assert list((tmp_path / "cache" / "wheelhouse").iterdir()) == []
    retry = FakePip()
    path = fill(retry)
    assert len(retry.calls) == 2
    assert not (path / "half-written.whl").exists()


def test_a_directory_without_manifest_is_not_trusted(tmp_path: Path, fill: Any) -> None:
    stale = tmp_path / "cache" / "wheelhouse" / wheelhouse_name(CPU, GROUPS)
    stale.mkdir(parents=True)
    (stale / "junk.whl").write_bytes(b"")
    pip = FakePip()
    path = fill(pip)
    assert len(pip.calls) == 2
    assert not (path / "junk.whl").exists()


def test_a_pin_without_local_version_accepts_the_build_pip_chose(fill: Any) -> None:
    pip = FakePip(torch_wheel="torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl")
    path = fill(pip, cell=make_cell("cuda", "2.14.1", "cuda"))
    assert path.name.startswith("torch-2.14.1-py3.11-")


def test_wheels_are_downloaded_by_the_cells_own_python(
    tmp_path: Path, cell_log: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pip evaluates dependency markers (tomli; python_version < "3.11") for the Python it
    runs on: a Python 3.10 cell's wheelhouse is filled by a Python 3.10 pip (>= 25.1)."""
    commands: list[list[str]] = []

    def fake_run(command: Any, sink: Any, **kwargs: Any) -> int:
        commands.append([str(part) for part in command])
        if "venv" in command:
            Path(command[-1]).mkdir(parents=True)
        return 0

    monkeypatch.setattr(wheelhouse, "find_python", lambda version, **kwargs: f"/opt/py{version}")
    monkeypatch.setattr(wheelhouse, "run_process", fake_run)
    python = wheelhouse.download_python("3.10", tmp_path, cell_log)
    assert python == str(tmp_path / "pip" / "py3.10" / "bin" / "python")
    assert commands == [
        ["/opt/py3.10", "-m", "venv", "--clear", str(tmp_path / "pip" / "py3.10")],
        [python, "-m", "pip", "install", "--progress-bar", "off", "pip>=25.1"],
    ]
    assert wheelhouse.download_python("3.10", tmp_path, cell_log) == python  # kept
    assert len(commands) == 2
