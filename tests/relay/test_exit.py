"""A script that ran a relay backward must exit cleanly, every time.

relay's autograd device thread could release the last reference to a graph
while the interpreter was finalizing, and the process then aborted after its
output ("terminate called without an active exception", SIGABRT) in some of the
runs. Each run is a short script executed as ``__main__`` of its own process,
which then exits through the interpreter's normal finalization.

A fresh interpreter spends ~2.5 s of CPU importing torch, so the runs are
forked from one launcher process that has imported torch and torch_fallback and
run nothing else (no relay op, no autograd thread): each child executes its
script in ``__main__``'s namespace, as ``python script.py`` would, and exits
with ``sys.exit(0)``, i.e. through ``Py_FinalizeEx`` with the script's
globals still alive, which is the window where the abort happened.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

RUNS = 50
TIMEOUT_S = 300

SCRIPTS = {
    "backward": (
        """
        import torch
        import torch_fallback.relay

        x = torch.ones(2, device="relay", requires_grad=True)
        (x * 2).sum().backward()
        print(x.grad)
        """,
        "tensor([2., 2.], device='relay:0')",
    ),
    "linear": (
        """
        import torch
        import torch_fallback.relay

        layer = torch.nn.Linear(3, 2).to("relay")
        layer(torch.ones(4, 3, device="relay")).sum().backward()
        print(layer.weight.grad.cpu().tolist(), layer.bias.grad.cpu().tolist())
        """,
        "[[4.0, 4.0, 4.0], [4.0, 4.0, 4.0]] [4.0, 4.0]",
    ),
    "thread": (
        """
        import threading

        import torch
        import torch_fallback.relay

        x = torch.ones(2, device="relay", requires_grad=True)

        def step():
            (x * 3).sum().backward()

        worker = threading.Thread(target=step)
        worker.start()
        worker.join()
        print(x.grad)
        """,
        "tensor([3., 3.], device='relay:0')",
    ),
}

# Scripts that turn autograd's multithreading off (per thread), after or beside a
# backward on relay's device thread: relay's drain at exit must still go through the
# device thread. Forked children do not show their abort, so these run in fresh
# interpreters.
CALLING_THREAD_SCRIPTS = {
    # Turned off on the exiting thread after a backward ran on the device thread.
    "calling_thread_after": (
        """
        import torch
        import torch_fallback.relay

        x = torch.ones(2, device="relay", requires_grad=True)
        (x * 4).sum().backward()
        torch.autograd.set_multithreading_enabled(False)
        print(x.grad)
        """,
        "tensor([4., 4.], device='relay:0')",
    ),
    # The calling-thread advice for the main thread, with a worker thread's backward
    # (multithreading is per thread) on the device thread.
    "calling_thread_worker": (
        """
        import threading

        import torch
        import torch_fallback.relay

        torch.autograd.set_multithreading_enabled(False)
        x = torch.ones(2, device="relay", requires_grad=True)
        worker = threading.Thread(target=lambda: (x * 5).sum().backward())
        worker.start()
        worker.join()
        print(x.grad)
        """,
        "tensor([5., 5.], device='relay:0')",
    ),
}
FRESH_RUNS = 10
FRESH_PARALLEL = 2  # more at once abort less often

# Proves the launcher sees an abort during interpreter finalization.
CONTROL = (
    """
    import atexit
    import os

    print("done")
    atexit.register(os.abort)
    """,
    "done",
)

LAUNCHER = """
import json
import os
import sys

import torch
import torch_fallback.relay

jobs_file, parallel = sys.argv[1], int(sys.argv[2])
jobs = json.loads(open(jobs_file).read())
running, statuses = {}, {}


def reap():
    pid, status = os.wait()
    statuses[running.pop(pid)] = os.waitstatus_to_exitcode(status)


sys.stdout.flush()
sys.stderr.flush()
for job in jobs:
    while len(running) >= parallel:
        reap()
    pid = os.fork()
    if pid == 0:
        for fd, path in ((1, job["stdout"]), (2, job["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        with open(job["script"]) as source:
            code = compile(source.read(), job["script"], "exec")
        del jobs, running, statuses
        exec(code, sys.modules["__main__"].__dict__)
        sys.exit(0)
    running[pid] = job["id"]
while running:
    reap()
with open(jobs_file + ".status", "w") as out:
    json.dump(statuses, out)
"""


def placement_env(placement) -> dict[str, str]:
    """This environment, with relay's target and home those of `placement`."""
    return {
        **os.environ,
        "TORCH_FALLBACK_TARGET": placement.target,
        "TORCH_FALLBACK_RELAY_HOME": placement.home,
    }


def _describe(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


def test_relay_backward_scripts_always_exit_cleanly(placement, tmp_path):
    scripts = {**SCRIPTS, "control": CONTROL}
    for name, (code, _) in scripts.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(code))
    variants = ["control"] + [list(SCRIPTS)[i % len(SCRIPTS)] for i in range(RUNS)]
    jobs = [
        {
            "id": str(index),
            "script": str(tmp_path / f"{variant}.py"),
            "stdout": str(tmp_path / f"{index}.out"),
            "stderr": str(tmp_path / f"{index}.err"),
        }
        for index, variant in enumerate(variants)
    ]
    jobs_file = tmp_path / "jobs.json"
    jobs_file.write_text(json.dumps(jobs))
    env = placement_env(placement)
    parallel = max(2, min(8, os.cpu_count() or 2))
    launcher = subprocess.run(
        [sys.executable, "-c", LAUNCHER, str(jobs_file), str(parallel)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=TIMEOUT_S,
    )
    assert launcher.returncode == 0, f"the launcher failed:\n{launcher.stderr[-4000:]}"
    statuses = json.loads((tmp_path / "jobs.json.status").read_text())

    def outcome(index: int) -> tuple[int, str, str]:
        stdout = (tmp_path / f"{index}.out").read_text().strip()
        stderr = (tmp_path / f"{index}.err").read_text().strip()
        return statuses[str(index)], stdout, stderr

    control = outcome(0)
    assert control[:2] == (-signal.SIGABRT, "done"), f"control run not seen as aborted: {control}"

    failures = []
    for index, variant in enumerate(variants[1:], start=1):
        returncode, stdout, stderr = outcome(index)
        expected = SCRIPTS[variant][1]
        if returncode == 0 and stdout == expected:
            continue
        tail = " | ".join(stderr.splitlines()[-3:])
        failures.append(
            f"{variant}: {_describe(returncode)}, stdout {stdout!r} (expected {expected!r}), "
            f"stderr: {tail!r}"
        )
    per_variant = {
        name: sum(1 for failure in failures if failure.startswith(f"{name}:")) for name in SCRIPTS
    }
    assert not failures, (
        f"{len(failures)}/{RUNS} relay-backward scripts ({placement}) failed "
        f"({len(failures) / RUNS:.0%}; by variant {per_variant}):\n" + "\n".join(failures[:10])
    )


@pytest.mark.parametrize("name", CALLING_THREAD_SCRIPTS)
def test_scripts_that_turn_multithreading_off_exit_cleanly(placement, name, tmp_path):
    code, expected = CALLING_THREAD_SCRIPTS[name]
    script = tmp_path / f"{name}.py"
    script.write_text(textwrap.dedent(code))
    env = placement_env(placement)

    def run_once() -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, str(script)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=tmp_path,
        )

    failures = []
    for _ in range(FRESH_RUNS // FRESH_PARALLEL):
        for run in [run_once() for _ in range(FRESH_PARALLEL)]:
            stdout, stderr = run.communicate(timeout=TIMEOUT_S)
            if run.returncode != 0 or stdout.strip() != expected:
                tail = " | ".join(stderr.splitlines()[-3:])
                failures.append(f"{_describe(run.returncode)}, stdout {stdout.strip()!r}: {tail!r}")
    assert not failures, f"{len(failures)}/{FRESH_RUNS} runs of {name} failed:\n" + "\n".join(
        failures
    )
