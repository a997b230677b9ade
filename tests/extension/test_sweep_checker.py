"""The OpInfo sweep's checker passes where it must and fails where it must.

benchmarks/opinfo_sweep.py --self-test runs the reference device in place of relay, so
every entry has to pass; with --perturb the values read back from the device under test
are perturbed, so every entry whose values are compared has to fail as wrong values: the
outputs (category values), the arguments after the op (hidden-mutation) or the gradients
(grad-values). A checker that cannot fail proves nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SWEEP = Path(__file__).resolve().parents[2] / "benchmarks" / "opinfo_sweep.py"
# Deterministic ops with finite outputs, an op that mutates an argument its schema does not
# mark as mutable (batch norm's running stats), a tensor-list op and a random op.
OPS = "add,sin,cat,nn.functional.batch_norm,nn.functional.dropout"
MODES = {"self-test": [], "perturb": ["--perturb"], "arguments": ["--perturb", "arguments"]}


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory) -> dict[str, dict]:
    """Run the three sweeps side by side; their JSON documents by mode."""
    folder = tmp_path_factory.mktemp("sweep")
    running = {}
    for mode, extra in MODES.items():
        command = [sys.executable, str(SWEEP), "--self-test", "--ops", OPS, "--dtypes",
                   "float32,float64", "--samples", "2", "--quiet", "--timeout", "60",
                   "--json", str(folder / f"{mode}.json"), *extra]  # fmt: skip
        running[mode] = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    documents = {}
    for mode, process in running.items():
        output, _ = process.communicate(timeout=300)
        assert process.returncode == 0, output
        documents[mode] = json.loads((folder / f"{mode}.json").read_text())
    return documents


def test_self_test_passes_everything(sweeps):
    summary, tasks = sweeps["self-test"]["summary"], sweeps["self-test"]["tasks"]
    assert summary["entries_failed"] == 0, [t for t in tasks if t["status"] == "fail"]
    assert summary["entries_passed"] == summary["entries"] == 10
    phases = {(t["phase"], t["status"]) for t in tasks}
    assert {("forward", "pass"), ("grad", "pass"), ("inplace", "pass")} <= phases
    # dropout's outputs depend on the seed: classified, and still passing.
    dropout = [t for t in tasks if t["entry"] == "nn.functional.dropout"]
    assert any("random" in note for t in dropout for note in t.get("notes", []))


def test_perturbed_values_fail_as_wrong_values(sweeps):
    tasks = sweeps["perturb"]["tasks"]
    checked = [t for t in tasks if t["entry"] != "nn.functional.dropout"]
    assert checked
    for task in checked:
        assert task["status"] == "fail", task
        assert task["class"] == "wrong-values", task
        assert task["category"] in ("values", "grad-values"), task
    assert sweeps["perturb"]["summary"]["failure_classes"]["wrong-values"] >= len(checked)


def test_perturbed_arguments_fail_as_hidden_mutations(sweeps):
    tasks = [t for t in sweeps["arguments"]["tasks"] if t["entry"] != "nn.functional.dropout"]
    assert tasks
    for task in tasks:
        if task["phase"] == "inplace":
            # self is the output: its perturbed value fails as the op's value.
            assert task["category"] in ("values", "hidden-mutation"), task
        else:
            assert task["category"] == "hidden-mutation", task
