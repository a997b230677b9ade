"""The OpInfo sweep's checker passes where it must and fails where it must.

In self-test mode the reference device stands in for relay, so every task has to pass;
with values perturbed as they are read back from the device under test, every task whose
values are compared has to fail as wrong values: the outputs (category values), the
arguments after the op (hidden-mutation) or the gradients (grad-values). A checker that
cannot fail proves nothing. The checker runs in this process (fast); one small run of the
command line covers the worker processes and the report.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# Deterministic ops, an op that mutates an argument its schema does not mark as mutable
# (batch norm's running stats) and a tensor-list op. Random ops run in the command-line test:
# their OpInfos save the accelerator's generator state, and this process has imported
# torch_fallback (the reason the sweep keeps eager in processes that never do).
OPS = ["add", "sin", "cat", "nn.functional.batch_norm"]


@pytest.fixture(scope="module")
def sweep():
    from torch_fallback.testing.sweep import samples, worker

    return samples, worker


@pytest.fixture(scope="module")
def tasks(sweep) -> list[tuple[str, str, str]]:
    samples, _ = sweep
    found = samples.list_tasks("cpu", OPS, ["float32", "float64"], list(samples.PHASES))
    assert {phase for _, _, phase in found} == {"forward", "grad", "inplace"}
    return found


def run(sweep, tasks, perturb=None) -> dict:
    _, worker = sweep
    return {task: worker.self_test_inline(task, samples=2, perturb=perturb) for task in tasks}


def test_self_test_passes_everything(sweep, tasks):
    results = run(sweep, tasks)
    failed = {task: r for task, r in results.items() if r["status"] != "pass"}
    assert not failed


@pytest.mark.parametrize(
    ("perturb", "categories"),
    [
        ("all", {"values"}),
        ("outputs", {"values"}),
        ("arguments", {"hidden-mutation", "values"}),  # in place, self is the output
        ("grads", {"grad-values"}),
    ],
)
def test_perturbed_values_fail(sweep, tasks, perturb, categories):
    if perturb == "grads":
        tasks = [task for task in tasks if task[2] == "grad"]
    for task, result in run(sweep, tasks, perturb).items():
        assert result["status"] == "fail", (task, result)
        assert result["class"] == "wrong-values", (task, result)
        assert result["category"] in categories, (task, result)
        if perturb == "arguments" and task[2] != "inplace":
            assert result["category"] == "hidden-mutation", (task, result)


def test_command_line_self_test(tmp_path):
    """Reference and test worker processes, the JSON document and the table; a random op
    (dropout, seeded alike on both sides) passes."""
    out = tmp_path / "sweep.json"
    command = [
        sys.executable, str(BENCHMARKS / "opinfo_sweep.py"), "--self-test", "--quiet",
        "--ops", "sin,nn.functional.dropout", "--dtypes", "float32", "--samples", "3",
        "--json", str(out), "--raw",
    ]  # fmt: skip
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "pass rate: 100.00%" in completed.stdout
    document = json.loads(out.read_text())
    assert document["summary"]["entries_passed"] == document["summary"]["entries"] == 2
    assert {t["phase"] for t in document["tasks"]} == {"forward", "inplace"}


def test_uninitialized_outputs_compare_metadata_only(sweep):
    """The attention kernels' philox seed and offset are uninitialized memory without
    dropout: their values are not compared, their metadata and every other output are."""
    import torch

    samples, _ = sweep
    from torch_fallback.testing.sweep import check

    def leaves(first: float, seed: int) -> list[dict]:
        # output, logsumexp, philox seed and offset, as _flash_attention_forward returns them
        values = [torch.tensor([first]), torch.tensor([0.5]), torch.tensor([seed, seed])]
        return [
            {"device": "cpu", "dtype": str(v.dtype), "shape": list(v.shape), "layout": "strided",
             "quantized": False, "nested": False, "value": v}
            for v in [*values, torch.tensor([seed])]
        ]  # fmt: skip

    name = "torch.ops.aten._flash_attention_forward"
    want = samples.drop_undefined_values(name, leaves(1.0, 7))
    assert check.compare_leaves(want, samples.drop_undefined_values(name, leaves(1.0, 9)),
                                None, True, "values") is None  # fmt: skip
    wrong_first = check.compare_leaves(
        want, samples.drop_undefined_values(name, leaves(2.0, 7)), None, True, "values"
    )
    assert wrong_first is not None and wrong_first[2].startswith("values #0")
    seed_of_another_op = check.compare_leaves(
        samples.drop_undefined_values("add", leaves(1.0, 7)),
        samples.drop_undefined_values("add", leaves(1.0, 9)),
        None,
        True,
        "values",
    )
    assert seed_of_another_op is not None and seed_of_another_op[2].startswith("values #2")
