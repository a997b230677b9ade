"""Cell expansion is a pure function of the file, the environment and the overrides."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fallback_matrix import running
from fallback_matrix.errors import MatrixError, MatrixFileError
from fallback_matrix.matrix import (
    LoadedMatrix,
    MatrixFile,
    expand_cells,
    load_matrix,
    parse_index_override,
    pick_cells,
)
from fallback_matrix.workflows import python_tests


def expand(data: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    return {cell.name: cell for cell in expand_cells(MatrixFile.model_validate(data), **kwargs)}


def test_defaults_fill_what_a_cell_leaves_out(matrix_data: dict[str, Any]) -> None:
    gpu = expand(matrix_data)["cuda-gpu"]
    assert gpu.python == "3.11"
    assert gpu.image.base == "python:3.11-slim-bookworm"
    assert gpu.tests.paths == ["tests/extension"]
    assert gpu.tests.markers == "requires_cuda"  # the cell's own


def test_pins_and_expected_variants(matrix_data: dict[str, Any]) -> None:
    cells = expand(matrix_data)
    assert cells["cpu"].torch_requirement == "torch==2.13.0+cpu"
    assert cells["cpu"].cuda is None
    assert cells["cuda"].torch_requirement == "torch==2.14.1"
    assert cells["cuda"].cuda == "13"


def test_runner_labels_come_from_the_named_set(matrix_data: dict[str, Any]) -> None:
    cells = expand(matrix_data)
    assert cells["cpu"].runner_labels == ("ubuntu-24.04",)
    assert cells["cuda-gpu"].runner_labels == ("self-hosted", "linux", "x64", "gpu")


def test_pull_requests_get_the_reduced_matrix(matrix_data: dict[str, Any]) -> None:
    cells = expand(matrix_data)
    assert [name for name, cell in cells.items() if "pr" in cell.selections] == ["cpu", "cuda"]
    assert [name for name, cell in cells.items() if "main" in cell.selections] == list(cells)
    assert list(cells) == ["cpu", "cuda", "cuda-gpu"]


def test_index_url_from_the_file_by_default(matrix_data: dict[str, Any]) -> None:
    index = expand(matrix_data)["cpu"].index
    assert index.url == "https://download.pytorch.org/whl/cpu"
    assert "variants.cpu.index_url" in index.source


def test_environment_overrides_the_file(matrix_data: dict[str, Any]) -> None:
    cells = expand(
        matrix_data, environ={"FALLBACK_MATRIX_INDEX_URL_CPU": "https://mirror.example/cpu"}
    )
    assert cells["cpu"].index.url == "https://mirror.example/cpu"
    assert cells["cpu"].index.source == "$FALLBACK_MATRIX_INDEX_URL_CPU"
    assert cells["cuda"].index.url == "https://pypi.org/simple"


def test_command_line_overrides_the_environment(matrix_data: dict[str, Any]) -> None:
    cells = expand(
        matrix_data,
        environ={"FALLBACK_MATRIX_INDEX_URL_CUDA": "https://env.example"},
        overrides={"cuda": "https://cli.example"},
    )
    assert cells["cuda"].index.url == "https://cli.example"
    assert cells["cuda-gpu"].index.url == "https://cli.example"


def test_expansion_does_not_read_the_process_environment(
    matrix_data: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FALLBACK_MATRIX_INDEX_URL_CPU", "https://ignored.example")
    assert expand(matrix_data)["cpu"].index.url == "https://download.pytorch.org/whl/cpu"


def test_expansion_is_deterministic(matrix_data: dict[str, Any]) -> None:
    spec = MatrixFile.model_validate(matrix_data)
    assert expand_cells(spec) == expand_cells(spec)


def test_parse_index_override() -> None:
    assert parse_index_override("cpu=https://x.example/a=b") == ("cpu", "https://x.example/a=b")
    for bad in ("https://x.example", "rocm=https://x", "cpu="):
        with pytest.raises(MatrixError, match="VARIANT=URL"):
            parse_index_override(bad)


def test_pick_cells_keeps_the_order_asked(matrix_data: dict[str, Any]) -> None:
    cells = expand_cells(MatrixFile.model_validate(matrix_data))
    assert [cell.name for cell in pick_cells(cells, ["cuda", "cpu", "cuda"])] == ["cuda", "cpu"]


def test_pick_cells_names_unknown_cells(matrix_data: dict[str, Any]) -> None:
    cells = expand_cells(MatrixFile.model_validate(matrix_data))
    with pytest.raises(
        MatrixError,
        match=r"unknown cell\(s\): rocm\. Cells in matrix\.yaml: cpu, cuda, cuda-gpu",
    ):
        pick_cells(cells, ["cpu", "rocm"])


def test_nox_s_tests_runs_the_tooling_tests_its_markers_select(
    matrix_data: dict[str, Any],
    write_matrix: Callable[[Any], Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`nox -s tests` leaves out what project_tests.tooling_markers deselects (the slow
    Docker tests); `nox -s tooling-tests` runs every tooling test."""
    from fallback_matrix import running
    from fallback_matrix.matrix import load_matrix
    from fallback_matrix.report import Reporter

    matrix_data["project_tests"]["tooling_markers"] = "not slow"
    matrix = load_matrix(write_matrix(matrix_data))
    commands: list[list[str]] = []
    monkeypatch.setattr(
        running.subprocess, "call", lambda command, **_: commands.append(command) or 0
    )
    reporter = Reporter()
    running.run_tooling_tests(matrix, tmp_path, reporter, matrix.spec.project_tests.tooling_markers)
    running.run_tooling_tests(matrix, tmp_path, reporter)
    selected, everything = commands
    assert selected[-2:] == ["-m", "not slow"]
    assert everything[-2] != "-m" and "not slow" not in everything


def test_python_rows_test_the_cells_one_wheel_on_each_other_python(
    matrix_data: dict[str, Any],
) -> None:
    cuda = next(cell for cell in matrix_data["cells"] if cell["name"] == "cuda")
    cuda["also_pythons"] = ["3.10", "3.13"]
    cells = expand(matrix_data)
    rows = {test.name: test for test in python_tests(list(cells.values()))}
    assert list(rows) == ["cuda-on-py310", "cuda-on-py313"]
    row = rows["cuda-on-py313"]
    assert row.source is cells["cuda"]  # whose wheel
    assert row.cell.python == "3.13"
    assert row.cell.image.base == "python:3.13-slim-bookworm"
    assert row.cell.torch == cells["cuda"].torch and row.cell.variant == "cuda"
    assert row.cell.name == "cuda-on-py313"
    assert row.title == "wheel of cuda on Python 3.13"


@pytest.mark.parametrize(
    ("cell_update", "message"),
    [
        ({"also_pythons": ["3.11"]}, "Python 3.11 is listed twice"),
        ({"also_pythons": ["3.12", "3.12"]}, "Python 3.12 is listed twice"),
        ({"also_pythons": [3.12]}, "quote it"),
        ({"image": {"base": "debian:bookworm-slim"}, "also_pythons": ["3.12"]}, "python:X.Y"),
        ({"gpu": True, "also_pythons": ["3.12"]}, "list Pythons there"),
    ],
)
def test_bad_python_rows_are_located_errors(
    write_matrix: Callable[[Any], Path],
    matrix_data: dict[str, Any],
    cell_update: dict[str, Any],
    message: str,
) -> None:
    cuda = next(cell for cell in matrix_data["cells"] if cell["name"] == "cuda")
    cuda.update(cell_update)
    with pytest.raises(MatrixFileError) as caught:
        load_matrix(write_matrix(matrix_data))
    assert "cells[1].also_pythons" in str(caught.value)
    assert message in str(caught.value)


def test_cells_run_their_tests_on_the_workers_the_defaults_or_they_say(
    matrix_data: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert {cell.tests.workers for cell in expand(matrix_data).values()} == {0}  # the default
    matrix_data["defaults"]["tests"]["workers"] = "auto"
    matrix_data["cells"][2]["tests"]["workers"] = 0  # e.g. a GPU cell: one process
    cells = expand(matrix_data)
    assert (cells["cpu"].tests.workers, cells["cuda-gpu"].tests.workers) == ("auto", 0)
    monkeypatch.setattr(running, "source_files", lambda repo: [])
    loaded = LoadedMatrix(tmp_path / "matrix.yaml", MatrixFile.model_validate(matrix_data))
    jobs = {
        name: running.make_job(loaded, cell, tmp_path, tmp_path / "out", wheelhouse="")
        for name, cell in cells.items()
    }
    assert (jobs["cpu"].test_workers, jobs["cuda-gpu"].test_workers) == ("auto", "0")
