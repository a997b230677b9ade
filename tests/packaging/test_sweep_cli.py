"""The OpInfo sweep says what is missing instead of a worker's traceback.

PyTorch's OpInfo database imports expecttest and numpy, which torch itself does not
need: a sweep without them stops before it starts a worker, naming what to install.
A worker that dies as it starts (an import that fails there) ends the sweep with its
exit and the last lines of its log.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SWEEP = [sys.executable, "-m", "torch_fallback.testing.sweep", "--ops", "add", "--quiet"]


def test_a_missing_opinfo_dependency_is_named_with_the_command_to_install_it(monkeypatch, capsys):
    from torch_fallback.testing.sweep import cli

    real = cli.importlib.util.find_spec
    monkeypatch.setattr(
        cli.importlib.util, "find_spec", lambda name: None if name == "expecttest" else real(name)
    )
    assert cli.main(["--ops", "add"], prog="sweep") == 2
    err = capsys.readouterr().err
    assert "needs expecttest" in err and "pip install expecttest" in err, err


def test_a_worker_that_dies_at_start_ends_the_sweep_with_its_log(tmp_path: Path):
    # A module that shadows expecttest and fails to import: found, so the check before
    # the workers start passes, and the reference worker dies importing op_db.
    (tmp_path / "expecttest.py").write_text("raise ImportError('expecttest is broken here')\n")
    env = {"PYTHONPATH": f"{tmp_path}:{':'.join(sys.path)}", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(SWEEP, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "worker died at start: exit status 1" in done.stderr
    assert "expecttest is broken here" in done.stderr
    assert "Traceback" not in done.stderr
