"""What a release publishes: the PyPI cells' wheels, checked for what PyPI and users need."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from fallback_matrix import cli, release
from fallback_matrix.errors import EXIT_OK, EXIT_USAGE, MatrixError
from fallback_matrix.matrix import MatrixFile, expand_cells
from fallback_matrix.release import collect_dist

PLAIN = "torch_fallback-0.1.0-cp311-cp311-manylinux_2_34_x86_64.whl"


def cells(matrix_data: dict[str, Any]) -> dict[str, Any]:
    return {cell.name: cell for cell in expand_cells(MatrixFile.model_validate(matrix_data))}


def put(artifacts: Path, cell: str, name: str) -> None:
    (artifacts / cell).mkdir(parents=True, exist_ok=True)
    (artifacts / cell / name).write_bytes(b"wheel")


def test_the_pypi_cells_wheels_go_to_dist(tmp_path: Path, matrix_data: dict[str, Any]) -> None:
    put(tmp_path / "artifacts", "cuda", PLAIN)
    copied = collect_dist(
        tmp_path / "artifacts", [cells(matrix_data)["cuda"]], tmp_path / "dist", "v0.1.0"
    )
    assert [path.name for path in copied] == [PLAIN]
    assert (tmp_path / "dist" / PLAIN).read_bytes() == b"wheel"


@pytest.mark.parametrize(
    ("wheel", "tag", "message"),
    [
        (
            "torch_fallback-0.1.0+pt2141cu130-cp311-cp311-manylinux_2_34_x86_64.whl",
            None,
            r"local version label \+pt2141cu130 \(PyPI rejects it\)",
        ),
        (PLAIN, "v0.2.0", "version 0.1.0 is not the tag's v0.2.0"),
        (
            "torch_fallback-0.1.0-cp311-cp311-linux_x86_64.whl",
            None,
            "not a manylinux wheel",
        ),
    ],
)
def test_what_pypi_or_users_would_reject_is_not_published(
    tmp_path: Path, matrix_data: dict[str, Any], wheel: str, tag: str | None, message: str
) -> None:
    put(tmp_path / "artifacts", "cuda", wheel)
    with pytest.raises(MatrixError, match=message):
        collect_dist(tmp_path / "artifacts", [cells(matrix_data)["cuda"]], tmp_path / "dist", tag)
    assert not (tmp_path / "dist").exists()


def test_only_cells_marked_pypi_are_published(tmp_path: Path, matrix_data: dict[str, Any]) -> None:
    put(tmp_path / "artifacts", "cpu", PLAIN)
    with pytest.raises(MatrixError, match="cpu is not marked pypi: true"):
        collect_dist(tmp_path / "artifacts", [cells(matrix_data)["cpu"]], tmp_path / "dist", None)


def test_dist_command_reads_the_tag_from_github(
    tmp_path: Path, write_matrix: Any, matrix_data: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    matrix = write_matrix(matrix_data)
    put(tmp_path / "artifacts", "cuda", PLAIN)
    monkeypatch.setattr(release, "build_sdist", fake_sdist("0.1.0"))
    args = ["--matrix", str(matrix), "dist", "cuda", "--artifacts", str(tmp_path / "artifacts")]
    args += ["--out", str(tmp_path / "dist")]
    monkeypatch.setenv("GITHUB_REF_NAME", "v0.9.0")
    assert cli.main(args) == EXIT_USAGE  # 0.1.0 is not v0.9.0
    monkeypatch.setenv("GITHUB_REF_NAME", "v0.1.0")
    assert cli.main(args) == EXIT_OK
    assert (tmp_path / "dist" / PLAIN).is_file()
    assert (tmp_path / "dist" / "torch_fallback-0.1.0.tar.gz").is_file()


def fake_sdist(version: str) -> Any:
    def build(root: Path, out: Path, log: Any) -> Path:
        out.mkdir(parents=True, exist_ok=True)
        sdist = out / f"torch_fallback-{version}.tar.gz"
        sdist.write_bytes(b"sdist")
        return sdist

    return build


def test_an_sdist_of_another_version_than_the_tag_is_not_published(
    tmp_path: Path, write_matrix: Any, matrix_data: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    put(tmp_path / "artifacts", "cuda", PLAIN)
    monkeypatch.setattr(release, "build_sdist", fake_sdist("0.2.0"))
    args = ["--matrix", str(write_matrix(matrix_data)), "dist", "cuda", "--tag", "v0.1.0"]
    args += ["--artifacts", str(tmp_path / "artifacts"), "--out", str(tmp_path / "dist")]
    assert cli.main(args) == EXIT_USAGE


def test_a_wheel_built_without_torch_stops_at_once_saying_what_to_do(
    repo_root: Path, tmp_path: Path
) -> None:
    # pip's build isolation hides the installed torch: setup.py must say so before compiling
    hidden = tmp_path / "hidden" / "torch"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError(\"No module named 'torch'\")\n")
    env = {**os.environ, "PYTHONPATH": str(hidden.parent)}
    command = [sys.executable, "setup.py", "bdist_wheel"]
    done = subprocess.run(command, cwd=repo_root, env=env, capture_output=True, text=True)
    assert done.returncode != 0
    assert "pip install --no-build-isolation torch-fallback" in done.stderr
    assert "building" not in done.stdout  # nothing was compiled


@pytest.mark.slow
def test_the_sdist_holds_the_sources_and_builds_without_torch(
    repo_root: Path, tmp_path: Path, reporter: Any
) -> None:
    sdist = release.build_sdist(repo_root, tmp_path, reporter)
    with tarfile.open(sdist) as archive:
        names = {
            Path(name).relative_to(sdist.name.removesuffix(".tar.gz")).as_posix()
            for name in archive.getnames()
        }
    for required in (
        "setup.py",
        "pyproject.toml",
        "src/torch_fallback/csrc/boxed_call.cpp",
        "src/torch_fallback/relay/csrc/relay.h",
        "src/torch_fallback/include/torch_fallback/python_module.h",
        "src/torch_fallback/share/cmake/torch_fallback/torch_fallbackConfig.cmake",
        "src/torch_fallback/share/cmake/torch_fallback/torch_fallbackConfigVersion.cmake",
    ):
        assert required in names, required
    assert not [name for name in names if name.endswith(".so")]


def test_a_cell_without_its_wheel_says_to_build_it(
    tmp_path: Path, matrix_data: dict[str, Any]
) -> None:
    with pytest.raises(MatrixError, match=r"nox -s build-cuda"):
        collect_dist(tmp_path / "artifacts", [cells(matrix_data)["cuda"]], tmp_path / "dist", None)


def test_the_rehearsal_installs_a_python_row_under_its_own_name(
    matrix_data: dict[str, Any],
) -> None:
    from types import SimpleNamespace

    from fallback_matrix.release import install_target

    cuda = next(cell for cell in matrix_data["cells"] if cell["name"] == "cuda")
    cuda["also_pythons"] = ["3.12"]
    by_name = cells(matrix_data)
    context = SimpleNamespace(cells=list(by_name.values()), cell=lambda name: by_name[name])
    into, source = install_target(context, "cuda-on-py312")
    assert (into.name, into.python, into.torch) == ("cuda-on-py312", "3.12", "2.14.1")
    assert source.name == "cuda"
    into, source = install_target(context, "cpu")
    assert into.name == source.name == "cpu"


def test_the_rehearsal_tests_its_installs_with_the_publish_local_selection(
    matrix_data: dict[str, Any],
) -> None:
    cpu = cells(matrix_data)["cpu"]
    own = release.rehearsal_cell(MatrixFile.model_validate(matrix_data), cpu)
    assert own.name == "cpu-from-index" and own.tests == cpu.tests  # no section: its own
    selection = {"paths": ["tests/packaging"], "markers": "not slow", "workers": "auto"}
    matrix_data["publish_local"] = {"tests": selection}
    into = release.rehearsal_cell(MatrixFile.model_validate(matrix_data), cpu)
    assert into.name == "cpu-from-index"
    assert into.tests.paths == ["tests/packaging"] and into.tests.workers == "auto"
    # of those, what the cell selects: no GPU test where the cell has no GPU
    assert into.tests.markers == "not requires_cuda and not slow"
