"""The model zoo on relay against eager on the fallback's target, in float64.

For each model and placement: the weights tied in the model stay tied on relay,
the eval outputs, greedy generate() ids, AdamW losses, parameters and buffers
equal eager's. The CUDA-wheel cells run zoo.CORE; the CPU cell, ``nox -s models`` and
the GPU run all.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
import zoo
from zoo_runner import STEPS, run_case, run_references

import torch_fallback.relay  # noqa: F401  (registers the relay device)

RTOL, ATOL = 1e-7, 1e-9

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning"),
    # one pytest-xdist worker runs them all (--dist loadgroup): the references are made once
    pytest.mark.xdist_group("zoo"),
]

References = Callable[[str, str], dict[str, Any]]


def _param(name: str) -> Any:
    return pytest.param(name, id=name, marks=() if name in zoo.CORE else pytest.mark.slow)


@pytest.fixture(scope="session")
def references(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """Eager results by (model, target), made for every model of the session at the first ask
    of each target: one reference process per target."""
    made: dict[str, dict[str, dict[str, Any]]] = {}

    def wanted() -> list[str]:
        names = {
            item.callspec.params.get("name")
            for item in request.session.items
            if item.path.name == "test_zoo.py" and hasattr(item, "callspec")
        }
        return sorted(names & zoo.BY_NAME.keys())

    def get(name: str, target: str) -> dict[str, Any]:
        if target not in made:
            cases = {n: zoo.make_case(n, STEPS) for n in wanted()}
            made[target] = run_references(cases, target, tmp_path_factory.mktemp(f"zoo-{target}"))
        return made[target][name]

    return get


def assert_matches(name: str, got: dict[str, Any], expected: dict[str, Any], where: str) -> None:
    assert "error" not in expected, f"{name}: eager itself failed on the target: {expected}"
    assert got["devices"] == ["relay"], f"{where}: tensors left relay: {got['devices']}"
    assert got["tied"] == expected["tied"], f"{where}: tied weights differ from eager's"
    mismatches: list[str] = []

    def check(what: str, actual: torch.Tensor, reference: torch.Tensor) -> None:
        try:
            torch.testing.assert_close(actual, reference, rtol=RTOL, atol=ATOL)
        except AssertionError as error:
            mismatches.append(f"{what}: {str(error).strip().splitlines()[0]}")

    if "generate" in expected:
        assert torch.equal(got["generate"], expected["generate"]), (
            f"{where}: generate() ids {got['generate'].tolist()} != {expected['generate'].tolist()}"
        )
    for step, (loss, reference) in enumerate(zip(got["losses"], expected["losses"], strict=True)):
        check(f"loss of step {step + 1}", loss, reference)
    for kind in ("eval", "parameters", "buffers"):
        assert got[kind].keys() == expected[kind].keys(), f"{where}: {kind} names differ"
        for key, reference in expected[kind].items():
            check(f"{kind} {key}", got[kind][key], reference)
    shown = "\n".join(mismatches[:20])
    assert not mismatches, f"{where}: {len(mismatches)} mismatches:\n{shown}"


@pytest.mark.parametrize("name", [_param(entry.name) for entry in zoo.ZOO])
def test_model_trains_and_generates_as_eager(name: str, placement, references: References):
    model, case = zoo.make_case(name, STEPS)
    got = run_case(name, copy.deepcopy(model), case, "relay")
    where = f"{name} on relay ({placement}) against eager on {placement.target}"
    assert_matches(name, got, references(name, placement.target), where)


def test_the_zoo_covers_every_family_the_checks_need():
    families = {entry.family for entry in zoo.ZOO}
    assert families == {"encoder", "decoder", "seq2seq", "vision", "audio", "multimodal"}
    assert len(zoo.ZOO) >= 25
    assert set(zoo.CORE) <= zoo.BY_NAME.keys()
