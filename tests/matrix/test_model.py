"""matrix.yaml validation: a valid file loads; every malformed one names file, line and key path."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fallback_matrix import cli
from fallback_matrix.errors import EXIT_USAGE, MatrixFileError
from fallback_matrix.matrix import format_key_path, load_matrix


def problems_of(path: Path) -> str:
    with pytest.raises(MatrixFileError) as caught:
        load_matrix(path)
    return str(caught.value)


def test_the_repository_matrix_is_valid(repo_root: Path) -> None:
    loaded = load_matrix(repo_root / "matrix.yaml")
    names = [cell.name for cell in loaded.spec.cells]
    assert {"cpu", "cuda"} <= set(names)
    assert loaded.root == repo_root


def test_a_valid_matrix_loads(
    write_matrix: Callable[[Any], Path], matrix_data: dict[str, Any]
) -> None:
    loaded = load_matrix(write_matrix(matrix_data))
    assert [cell.name for cell in loaded.spec.cells] == ["cpu", "cuda", "cuda-gpu"]
    assert loaded.spec.runners["gpu"] == ["self-hosted", "linux", "x64", "gpu"]


@pytest.mark.parametrize(
    ("path", "text"),
    [
        (("cells", 1, "torch"), "cells[1].torch"),
        (("defaults", "image", "base"), "defaults.image.base"),
        ((), ""),
    ],
)
def test_key_paths_are_written_like_code(path: tuple[str | int, ...], text: str) -> None:
    assert format_key_path(path) == text


def test_unknown_variant(write_matrix: Callable[[Any], Path], matrix_data: dict[str, Any]) -> None:
    matrix_data["cells"][1]["variant"] = "rocm"
    message = problems_of(write_matrix(matrix_data))
    assert "matrix.yaml" in message
    assert "cells[1].variant" in message
    assert "'cpu' or 'cuda'" in message and "'rocm'" in message


def test_variant_without_settings(
    write_matrix: Callable[[Any], Path], matrix_data: dict[str, Any]
) -> None:
    del matrix_data["variants"]["cuda"]
    message = problems_of(write_matrix(matrix_data))
    assert "cells[1].variant: unknown variant 'cuda'" in message
    assert "keys of `variants`" in message


def test_duplicate_cell_name(
    write_matrix: Callable[[Any], Path], matrix_data: dict[str, Any]
) -> None:
    matrix_data["cells"][2]["name"] = "cpu"
    message = problems_of(write_matrix(matrix_data))
    assert "cells[2].name: duplicate cell name 'cpu' (first used by cells[0])" in message


def test_missing_key(write_matrix: Callable[[Any], Path], matrix_data: dict[str, Any]) -> None:
    del matrix_data["cells"][0]["torch"]
    message = problems_of(write_matrix(matrix_data))
    assert "cells[0].torch: missing key" in message
    assert "torch version to pin" in message


def test_wrong_type_says_to_quote_numbers(
    write_matrix: Callable[[Any], Path], matrix_data: dict[str, Any]
) -> None:
    matrix_data["defaults"]["python"] = 3.1
    message = problems_of(write_matrix(matrix_data))
    assert "defaults.python: expected a string, got the number 3.1: quote it" in message


def test_wrong_type_of_a_list(
    write_matrix: Callable[[Any], Path], matrix_data: dict[str, Any]
) -> None:
    matrix_data["defaults"]["tests"]["paths"] = "tests/extension"
    message = problems_of(write_matrix(matrix_data))
    assert "defaults.tests.paths" in message and "valid list" in message


def test_unknown_key_suggests_the_near_one(
    write_matrix: Callable[[Any], Path], matrix_data: dict[str, Any]
) -> None:
    matrix_data["cells"][0]["tourch"] = "2.13.0"
    message = problems_of(write_matrix(matrix_data))
    assert "cells[0].tourch: unknown key 'tourch'" in message
    assert "did you mean 'torch'?" in message


def test_cuda_cell_needs_its_cuda_major(
    write_matrix: Callable[[Any], Path], matrix_data: dict[str, Any]
) -> None:
    del matrix_data["cells"][1]["cuda"]
    assert "cells[1].cuda: missing key; a cuda cell must say" in problems_of(
        write_matrix(matrix_data)
    )


def test_cpu_cell_must_not_expect_cuda(
    write_matrix: Callable[[Any], Path], matrix_data: dict[str, Any]
) -> None:
    matrix_data["cells"][0]["cuda"] = "12"
    assert "cells[0].cuda: a cpu cell expects torch.version.cuda to be None" in problems_of(
        write_matrix(matrix_data)
    )


def test_gpu_cell_must_be_cuda(
    write_matrix: Callable[[Any], Path], matrix_data: dict[str, Any]
) -> None:
    matrix_data["cells"][0]["gpu"] = True
    assert "cells[0].gpu: gpu: true needs variant cuda" in problems_of(write_matrix(matrix_data))


def test_unknown_runner(write_matrix: Callable[[Any], Path], matrix_data: dict[str, Any]) -> None:
    matrix_data["cells"][2]["runner"] = "h100"
    assert "cells[2].runner: unknown runner 'h100'" in problems_of(write_matrix(matrix_data))


def test_unknown_selection(
    write_matrix: Callable[[Any], Path], matrix_data: dict[str, Any]
) -> None:
    matrix_data["cells"][2]["selections"] = ["nightly"]
    assert "cells[2].selections[0]: expected 'pr' or 'main'" in problems_of(
        write_matrix(matrix_data)
    )


def test_bad_cell_name(write_matrix: Callable[[Any], Path], matrix_data: dict[str, Any]) -> None:
    matrix_data["cells"][0]["name"] = "CPU build"
    assert "cells[0].name: expected a cell name" in problems_of(write_matrix(matrix_data))


def test_problems_carry_line_numbers(
    write_matrix: Callable[[Any], Path], matrix_data: dict[str, Any]
) -> None:
    matrix_data["cells"][1]["torch"] = 2.14
    path = write_matrix(matrix_data)
    line = next(
        number
        for number, text in enumerate(path.read_text().splitlines(), start=1)
        if "torch: 2.14" in text
    )
    assert f"matrix.yaml:{line}: cells[1].torch" in problems_of(path)


def test_all_problems_are_reported_at_once(
    write_matrix: Callable[[Any], Path], matrix_data: dict[str, Any]
) -> None:
    del matrix_data["cells"][0]["torch"]
    matrix_data["cells"][1]["variant"] = "rocm"
    message = problems_of(write_matrix(matrix_data))
    assert "2 problem(s)" in message


def test_malformed_yaml_names_the_line(write_matrix: Callable[[Any], Path]) -> None:
    path = write_matrix("version: 1\ncells:\n  - name: cpu\n   variant: [cpu\n")
    message = problems_of(path)
    assert "matrix.yaml:4" in message and "invalid YAML" in message


@pytest.mark.parametrize("word", ["-_", "._", "+_"])
def test_a_word_yaml_takes_for_a_number_it_cannot_read_is_a_problem(
    write_matrix: Callable[[Any], Path], word: str
) -> None:
    # ruamel.yaml resolves these as numbers, then fails to convert them.
    message = problems_of(write_matrix(f"version: {word}\n"))
    assert "a value YAML cannot read" in message and "quote" in message


def test_duplicate_yaml_keys_are_refused(write_matrix: Callable[[Any], Path]) -> None:
    message = problems_of(write_matrix("version: 1\nversion: 1\n"))
    assert "matrix.yaml:2" in message and 'duplicate key "version"' in message


@pytest.mark.parametrize("text", ["", "- a\n- b\n", "just text\n"])
def test_top_level_must_be_a_mapping(write_matrix: Callable[[Any], Path], text: str) -> None:
    assert "expected a mapping" in problems_of(write_matrix(text))


def test_missing_file(tmp_path: Path) -> None:
    assert "file not found" in problems_of(tmp_path / "nothing.yaml")


def test_cli_prints_the_problem_not_a_traceback(
    write_matrix: Callable[[Any], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_matrix("version: [1\n")
    status = cli.main(["--matrix", str(path), "list"])
    output = capsys.readouterr()
    assert status == EXIT_USAGE
    assert "invalid YAML" in output.out + output.err
    assert "Traceback" not in output.out + output.err


def test_pypi_cells_build_and_at_most_one_per_python(
    write_matrix: Callable[[Any], Path], matrix_data: dict[str, Any]
) -> None:
    matrix_data["cells"][2]["pypi"] = True  # the GPU cell builds nothing
    matrix_data["cells"].append(
        {"name": "cuda-2", "variant": "cuda", "torch": "2.13.0", "cuda": "13", "pypi": True}
    )
    with pytest.raises(MatrixFileError) as caught:
        load_matrix(write_matrix(matrix_data))
    message = str(caught.value)
    assert "cells[2].pypi: pypi: true marks a cell that builds the wheel PyPI gets" in message
    assert "cells[3].pypi: a second pypi: true cell for Python 3.11 (first: cuda;" in message


@pytest.mark.parametrize("workers", [-1, "many", 2.5, True])
def test_bad_workers_are_one_located_error(
    write_matrix: Callable[[Any], Path], matrix_data: dict[str, Any], workers: Any
) -> None:
    matrix_data["cells"][2]["tests"]["workers"] = workers
    message = problems_of(write_matrix(matrix_data))
    assert "(1 problem(s))" in message
    assert 'cells[2].tests.workers: expected "auto" or a number, 0 or more' in message
    assert f"got {workers!r}" in message
