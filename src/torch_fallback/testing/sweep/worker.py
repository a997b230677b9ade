"""The worker processes: long-lived, one task at a time, over a multiprocessing pipe.

Two roles. A *reference* worker never imports torch_fallback.relay: it runs eager on the
reference device and saves its records (torch.save) to a file. A *test* worker runs the
same samples on relay (or, in self-test mode, on the reference device again, also without
torch_fallback.relay), loads the reference file and compares. Keeping the reference in its
own process is required on CUDA: registering a PrivateUse1 backend breaks CUDA autograd in
PyTorch itself (pytorch/pytorch#161129). This package's import loads the torch_fallback
library, which registers no device and changes nothing in torch.

Messages to a worker: ("list", kwargs), ("ref", task, path), ("test", task, path), None.
From a worker: ("ready", info), ("progress", sample_index), ("done", payload).
"""

from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass


@dataclass(frozen=True)
class Config:
    reference: str  # "cpu" or "cuda": eager's device, and the fallback target
    target: str
    home: str
    samples: int
    self_test: bool
    perturb: str | None  # None, "all", "outputs", "arguments" or "grads"


def main(conn, role: str, config: Config, log_path: str) -> None:
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    warnings.filterwarnings("ignore")

    import torch

    torch.set_num_threads(1)
    info = {"torch": str(torch.__version__), "role": role}
    device = config.reference
    if role == "test" and not config.self_test:
        import torch_fallback
        import torch_fallback.relay

        torch_fallback.set_target(config.target)
        torch_fallback.relay.set_home(config.home)
        device = "relay"
        info["torch_fallback"] = getattr(torch_fallback, "__version__", "unknown")
    else:
        assert "torch_fallback.relay" not in sys.modules, "eager's worker imported relay"
    if config.reference == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        info["gpu"] = torch.cuda.get_device_name(0)
    from . import samples as S

    S.op_index()
    conn.send(("ready", info))
    parent = os.getppid()
    while True:
        while not conn.poll(5.0):
            if os.getppid() != parent:
                return  # the sweep was killed: do not linger
        message = conn.recv()
        if message is None:
            return
        kind, *rest = message
        if kind == "list":
            conn.send(("done", S.list_tasks(config.reference, **rest[0])))
        elif kind == "ref":
            conn.send(("done", reference_task(conn, config, *rest)))
        else:
            conn.send(("done", test_task(conn, config, device, *rest)))


def reference_task(conn, config: Config, task, path: str) -> dict:
    import torch

    from . import execute
    from . import samples as S

    entry, dtype, phase = task
    op = S.op_index()[entry]

    def progress(index: int) -> None:
        conn.send(("progress", index))

    try:
        result = execute.run_phase(
            op, entry, dtype, phase, config.reference, config.samples, progress, classify=True
        )
    except Exception as error:
        return {"status": "skip", "category": "sample-error", "detail": S.first_line(error)}
    if not result["records"]:
        return {"status": "skip", "category": "no-samples", "detail": None}
    try:
        torch.save(result, path)
    except Exception as error:
        return {"status": "skip", "category": "harness-error", "detail": S.first_line(error)}
    return {"status": "ready", "samples": len(result["records"])}


def test_task(conn, config: Config, device: str, task, path: str) -> dict:
    """Run the task on the device under test and compare; an exception of the sweep itself
    is reported as a harness-error failure (so it is seen), not as a crash."""
    from . import samples as S

    try:
        return _test_task(conn, config, device, task, path)
    except Exception as error:
        return {
            "status": "fail",
            "class": "error",
            "category": "harness-error",
            "detail": S.first_line(error),
        }


def _test_task(conn, config: Config, device: str, task, path: str) -> dict:
    import torch

    from . import execute
    from . import samples as S

    entry, dtype, phase = task
    expected = torch.load(path, weights_only=False)["records"]
    os.unlink(path)

    def progress(index: int) -> None:
        conn.send(("progress", index))

    op = S.op_index()[entry]
    actual = execute.run_phase(
        op, entry, dtype, phase, device, config.samples, progress, perturb=config.perturb
    )["records"]
    return judge(task, expected, actual, config.reference)


def judge(task, expected: list, actual: list, reference: str) -> dict:
    """The task's result from the reference's records and the device under test's."""
    import torch

    from . import check
    from . import samples as S

    entry, dtype, phase = task
    op = S.op_index()[entry]
    tol = S.tolerances(op, torch.float64 if phase == "grad" else S.DTYPES[dtype], reference)
    failures, notes, compared, eager_errors, constant = [], set(), 0, 0, 0
    for index, (want, got) in enumerate(zip(expected, actual, strict=False)):
        if want["fingerprint"] != got["fingerprint"]:
            notes.add("sample-mismatch")
            continue
        compared += 1
        eager_errors += "error" in want
        constant += bool(want.get("not_differentiable"))
        nondeterministic = getattr(op, "has_nondeterministic_output", False)  # newer torch only
        outcome = check.compare_record(want, got, phase, tol, nondeterministic)
        if outcome is None:
            continue
        if outcome[0] == "pass":
            notes.add(outcome[1])
        else:
            failures.append(
                {"class": outcome[0], "category": outcome[1], "detail": outcome[2], "sample": index}
            )
    base = {"samples": len(expected), "notes": sorted(notes)}
    if failures:
        worst = max(failures, key=lambda f: check.SEVERITY[f["class"]])
        categories = sorted({f["category"] for f in failures})
        return {**base, "status": "fail", **worst, "categories": categories}
    if compared == 0:
        return {**base, "status": "skip", "category": "sample-mismatch", "detail": None}
    if eager_errors == compared:
        first_error = next(w["error"] for w in expected if "error" in w)
        return {**base, "status": "skip", "category": "eager-unsupported", "detail": first_error}
    if constant and constant + eager_errors == compared:
        return {**base, "status": "skip", "category": "not-differentiable", "detail": None}
    return {**base, "status": "pass"}


def self_test_inline(task, reference: str = "cpu", samples: int = 4, perturb=None) -> dict:
    """One task of the self-test in this process, no workers: the checker on its own."""
    from . import execute
    from . import samples as S

    entry, dtype, phase = task
    op = S.op_index()[entry]

    def run(**kwargs) -> list:
        return execute.run_phase(
            op, entry, dtype, phase, reference, samples, lambda _: None, **kwargs
        )["records"]

    return judge(task, run(classify=True), run(perturb=perturb), reference)
