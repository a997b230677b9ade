"""The matrix loader under arbitrary input: a valid matrix or a located error, never a traceback."""

from __future__ import annotations

from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fallback_matrix.errors import MatrixFileError
from fallback_matrix.matrix import load_matrix

# tmp_path is shared by the examples of one test; each example overwrites the file.
FIXTURE_OK = [HealthCheck.function_scoped_fixture]
REPO_MATRIX = Path(__file__).resolve().parents[2] / "matrix.yaml"

scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
)
keys = st.sampled_from(
    [
        "version",
        "defaults",
        "cells",
        "variants",
        "runners",
        "name",
        "variant",
        "torch",
        "python",
        "cuda",
        "gpu",
        "tests",
        "markers",
        "paths",
        "image",
        "index_url",
        "selections",
        "x",
    ]
) | st.text(max_size=6)
documents = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=5),
    max_leaves=25,
)


def assert_valid_or_located(path: Path) -> None:
    try:
        load_matrix(path)
    except MatrixFileError as error:
        message = str(error)
        assert str(path) in message, message
        assert error.problems, message
        assert all(problem.message for problem in error.problems)


@settings(max_examples=300, deadline=None, suppress_health_check=FIXTURE_OK)
@given(document=documents)
def test_arbitrary_yaml_documents(tmp_path: Path, document) -> None:
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(document))
    assert_valid_or_located(path)


@settings(max_examples=200, deadline=None, suppress_health_check=FIXTURE_OK)
@given(data=st.data())
def test_mutations_of_the_real_matrix(tmp_path: Path, data) -> None:
    """Replace one value anywhere in the project's matrix with an arbitrary one."""
    document = yaml.safe_load(REPO_MATRIX.read_text())
    node, path_keys = document, []
    while isinstance(node, (dict, list)) and node:
        key = data.draw(st.sampled_from(list(node) if isinstance(node, dict) else range(len(node))))
        path_keys.append(key)
        if not data.draw(st.booleans()):
            break
        node = node[key]
    parent = document
    for key in path_keys[:-1]:
        parent = parent[key]
    if path_keys:
        parent[path_keys[-1]] = data.draw(documents)
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(document))
    assert_valid_or_located(path)


@settings(max_examples=200, deadline=None, suppress_health_check=FIXTURE_OK)
@given(text=st.text(max_size=200))
def test_arbitrary_text(tmp_path: Path, text: str) -> None:
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    assert_valid_or_located(path)
