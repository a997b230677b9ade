"""The job: stdlib and packaging only; strict about its job file, torch variant and sources."""

from __future__ import annotations

import ast
import dataclasses
import fcntl
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from fallback_matrix import cache, errors, report
from fallback_matrix import job as job_module
from fallback_matrix.errors import EXIT_USAGE, StepFailed
from fallback_matrix.job import (
    Job,
    locked,
    run_tests,
    sync_sources,
    torch_pins,
    verify_torch,
)
from fallback_matrix.report import Reporter

JOB = Job(
    cell="cpu",
    python="3.11",
    torch="2.13.0+cpu",
    cuda=None,
    test_paths=["tests"],
    test_markers="not requires_cuda",
    gpu=False,
    sources=[],
    repo="/src",
    wheelhouse="/wheelhouse",
    cache="/cache",
    work="/work",
    artifacts="/out",
)


@pytest.mark.parametrize("module", [job_module, report, cache, errors])
def test_what_a_cell_runs_first_needs_only_the_standard_library(module: Any) -> None:
    """The job starts on an image's bare Python: it and the reporter, cache pruning and errors
    it shares with the host import nothing else but packaging (from the wheelhouse's wheel, on
    its PYTHONPATH)."""
    tree = ast.parse(Path(module.__file__).read_text())
    imported = set()
    for node in tree.body:  # the module's own imports; a function may import from the cell
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "the job runs as python -m: absolute imports"
            imported.add(node.module or "")
    third_party = {name for name in imported if name.split(".")[0] not in sys.stdlib_module_names}
    allowed = {
        "__future__",
        "fallback_matrix.report",
        "fallback_matrix.cache",
        "fallback_matrix.errors",
    }
    allowed |= {"packaging.metadata", "packaging.version"}
    assert third_party - allowed == set()


def test_job_round_trips_through_json() -> None:
    assert Job(**json.loads(JOB.to_json())) == JOB


def test_job_file_with_wrong_keys_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = json.loads(JOB.to_json())
    data["colour"] = "blue"
    assert job_module.main([json.dumps(data)]) == EXIT_USAGE
    assert "cannot read the job" in (error := capsys.readouterr().err) and "colour" in error
    del data["colour"], data["cell"]
    assert job_module.main([json.dumps(data)]) == EXIT_USAGE
    assert "'cell'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("job_changes", "version", "cuda", "ok"),
    [
        ({}, "2.13.0+cpu", None, True),
        ({}, "2.13.0+cpu", "13.0", False),
        ({}, "2.13.0", None, False),
        (
            {"torch": "2.14.1", "cuda": "13"},
            "2.14.1+cu130",
            "13.0",
            True,
        ),
        ({"torch": "2.14.1", "cuda": "13"}, "2.14.1+cpu", None, False),
        (
            {"torch": "2.14.1", "cuda": "13"},
            "2.14.1+cu128",
            "12.8",
            False,
        ),
        (
            {"torch": "2.14.1", "cuda": "13"},
            "2.14.0+cu130",
            "13.0",
            False,
        ),
    ],
)
def test_torch_variant_check(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    job_changes: dict[str, Any],
    version: str,
    cuda: str | None,
    ok: bool,
) -> None:
    job = dataclasses.replace(JOB, **job_changes)
    torch_file = tmp_path / "torch" / "__init__.py"
    (torch_file.parent / "lib").mkdir(parents=True)
    (torch_file.parent / "lib" / "libc10.so").touch()
    answer = json.dumps([version, cuda, str(torch_file)])
    probe = subprocess.CompletedProcess([], 0, stdout=f"noise\n{answer}\n", stderr="")
    monkeypatch.setattr(job_module, "capture", lambda *args, **kwargs: probe)
    if ok:
        info = verify_torch(job, {}, Reporter(cell="cpu"))
        assert info == {"version": version, "cuda": cuda, "file": str(torch_file)} | {
            "libraries": ["libc10.so"]
        }
    else:
        with pytest.raises(StepFailed, match="WRONG TORCH"):
            verify_torch(job, {}, Reporter(cell="cpu"))


def job_for(tmp_path: Path, sources: list[str]) -> Job:
    repo = tmp_path / "repo"
    return dataclasses.replace(
        JOB,
        sources=sources,
        repo=str(repo),
        cache=str(tmp_path / "cache"),
        work=str(tmp_path / "work"),
        artifacts=str(tmp_path / "out"),
    )


def test_sources_are_copied_kept_and_removed(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "setup.py").write_text("setup()")
    (repo / "src" / "a.cpp").write_text("int a;")
    (repo / "src" / "gone.cpp").write_text("int g;")
    job = job_for(tmp_path, ["setup.py", "src/a.cpp", "src/gone.cpp"])
    sync_sources(job, Reporter(cell="cpu"))
    build = job.build_dir
    assert build == tmp_path / "cache" / "build" / "cpu"
    assert (build / "src" / "a.cpp").read_text() == "int a;"
    assert (
        os.stat(build / "src" / "a.cpp").st_mtime_ns == os.stat(repo / "src" / "a.cpp").st_mtime_ns
    )

    (build / "build" / "temp.linux").mkdir(parents=True)
    (build / "build" / "temp.linux" / "a.o").write_text("object")
    (build / "build" / "lib.linux" / "pkg").mkdir(parents=True)
    (build / "build" / "lib.linux" / "pkg" / "stale.py").write_text("")
    (build / "generated.json").write_text("{}")
    (repo / "src" / "gone.cpp").unlink()
    shrunk = dataclasses.replace(job, sources=["setup.py", "src/a.cpp"])
    sync_sources(shrunk, Reporter(cell="cpu"))
    assert not (build / "src" / "gone.cpp").exists()  # removed from the repository
    assert (build / "build" / "temp.linux" / "a.o").exists()  # ninja's objects stay
    assert not (build / "build" / "lib.linux").exists()  # setuptools staging never goes stale
    assert (build / "generated.json").exists()  # never listed, so never deleted


def test_unchanged_sources_are_not_rewritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.cpp").write_text("int a;")
    job = job_for(tmp_path, ["a.cpp"])
    sync_sources(job, Reporter(cell="cpu"))
    sync_sources(job, Reporter(cell="cpu"))
    assert "0 file(s) copied, 1 unchanged" in capsys.readouterr().out


def test_no_tests_collected_fails_the_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "repo" / "tests").mkdir(parents=True)
    monkeypatch.setattr(job_module, "run", lambda *args, **kwargs: job_module.PYTEST_NO_TESTS)
    with pytest.raises(StepFailed, match=r"no test selected by -m 'not requires_cuda'.*markers"):
        run_tests(job_for(tmp_path, []), {})


def test_failing_tests_fail_the_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "repo" / "tests").mkdir(parents=True)
    monkeypatch.setattr(job_module, "run", lambda *args, **kwargs: 1)
    with pytest.raises(StepFailed, match="pytest failed"):
        run_tests(job_for(tmp_path, []), {})


def test_gpu_cells_make_a_missing_gpu_fail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "repo" / "tests").mkdir(parents=True)
    seen: dict[str, str] = {}
    monkeypatch.setattr(job_module, "run", lambda command, env, cwd=None: seen.update(env) or 0)
    job = job_for(tmp_path, [])
    run_tests(dataclasses.replace(job, gpu=True), {})
    assert seen["TORCH_FALLBACK_REQUIRE_GPU"] == "1"


def test_tests_run_outside_the_source_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "repo" / "tests").mkdir(parents=True)
    calls: list[tuple[list[Any], Path | None]] = []
    monkeypatch.setattr(
        job_module, "run", lambda command, env, cwd=None: calls.append((list(command), cwd)) or 0
    )
    job = job_for(tmp_path, [])
    run_tests(job, {})
    command, cwd = calls[0]
    assert cwd == job.test_cwd and not str(cwd).startswith(str(Path(job.repo)))
    assert "-p" in command and "no:cacheprovider" in command
    assert command[command.index("--junitxml") + 1] == Path(job.artifacts) / "junit.xml"
    assert command[command.index("-m", 3) + 1] == "not requires_cuda"


def test_a_second_run_waits_for_the_lock(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock_file = tmp_path / "build" / "cpu.lock"
    lock_file.parent.mkdir()
    order: list[str] = []
    with lock_file.open("a") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)

        def second_run() -> None:
            with locked(lock_file, "the build dir", Reporter(cell="cpu")):
                order.append("second run")

        thread = threading.Thread(target=second_run)
        thread.start()
        thread.join(timeout=0.5)
        assert thread.is_alive(), "the second run must wait while the first holds the lock"
        order.append("first run done")
        fcntl.flock(holder, fcntl.LOCK_UN)
    thread.join(timeout=5)
    assert order == ["first run done", "second run"]
    assert "waiting for another run that holds the build dir" in capsys.readouterr().out


# --- the distributable wheel: torch pin, auditwheel, the third-party example ----------------------


def make_wheel(path: Path, requires: list[str]) -> Path:
    import zipfile

    with zipfile.ZipFile(path, "w") as archive:
        metadata = "Metadata-Version: 2.1\nName: torch-fallback\nVersion: 0.1.0\n"
        metadata += "".join(f"Requires-Dist: {line}\n" for line in requires)
        archive.writestr("torch_fallback-0.1.0.dist-info/METADATA", metadata)
    return path


@pytest.mark.parametrize(
    ("requires", "ok"),
    [
        (["torch==2.13.0"], True),
        (["torch>=2.6"], False),  # the old claim: any torch since 2.6
        (["torch==2.14.1"], False),  # another release than the one built against
        (["torchvision==0.28.0"], False),  # no torch requirement at all
        ([], False),
    ],
)
def test_the_wheel_must_pin_the_torch_it_was_built_against(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, requires: list[str], ok: bool
) -> None:
    wheel = make_wheel(tmp_path / "torch_fallback-0.1.0-cp311-cp311-linux_x86_64.whl", requires)
    assert (torch_pins(wheel) == ["==2.13.0"]) is ok
    # the job asks the cell's environment (here: this Python) through fallback_matrix.job
    job = job_for(tmp_path, [])
    (job.run_venv / "bin").mkdir(parents=True)
    (job.run_venv / "bin" / "python").symlink_to(sys.executable)

    def pip_wheel(command: list[Any], env: Any, what: str) -> None:  # "builds" the wheel above
        dist = Path(command[command.index("-w") + 1])
        dist.mkdir()
        shutil.copy(wheel, dist)

    monkeypatch.setattr(job_module, "must_run", pip_wheel)
    monkeypatch.delenv("CCACHE_DIR", raising=False)  # no ccache statistics to reset
    if ok:
        built, requires_dist = job_module.build_wheel(job, "2.13.0+cpu", os.environ)
        assert (built.name, requires_dist) == (wheel.name, "torch==2.13.0")
    else:
        with pytest.raises(StepFailed, match=r"must say Requires-Dist: torch==2\.13\.0"):
            job_module.build_wheel(job, "2.13.0+cpu", os.environ)


def test_repair_excludes_torchs_own_libraries_and_keeps_the_manylinux_wheel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    job = job_for(tmp_path, [])
    commands: list[list[str]] = []

    def fake_must_run(command: Any, env: Any, what: str, cwd: Any = None) -> None:
        commands.append([str(part) for part in command])
        out = Path(commands[-1][commands[-1].index("--wheel-dir") + 1])
        out.mkdir(parents=True)
        (out / "torch_fallback-0.1.0-cp310-abi3-manylinux_2_34_x86_64.whl").write_bytes(b"")

    def fake_show(command: Any, **kwargs: Any) -> Any:
        if "abi3audit" in [str(part) for part in command]:
            return subprocess.CompletedProcess(command, 0, "no ABI violations found", "")
        return subprocess.CompletedProcess(command, 0, "is consistent with manylinux_2_34", "")

    import subprocess

    monkeypatch.setattr(job_module, "must_run", fake_must_run)
    monkeypatch.setattr(job_module.subprocess, "run", fake_show)
    built = tmp_path / "torch_fallback-0.1.0-cp310-abi3-linux_x86_64.whl"
    wheel, shown = job_module.repair_wheel(
        job, built, ["libtorch_cpu.so", "libgomp-a34b3233.so.1"], {}
    )
    (command,) = commands
    excludes = {part.removeprefix("--exclude=") for part in command if "--exclude=" in part}
    assert {"libtorch*.so*", "libc10*.so*", "libtorch_cpu.so", "libgomp-a34b3233.so.1"} <= excludes
    assert command[-1] == str(built)
    assert wheel.name.endswith("-manylinux_2_34_x86_64.whl")
    assert "manylinux_2_34" in shown and "manylinux_2_34" in capsys.readouterr().out
    assert "abi3audit --strict" in shown and "no ABI violations found" in shown


@pytest.mark.parametrize(
    ("name", "audit_status", "message"),
    [
        ("torch_fallback-0.1.0-cp311-cp311-manylinux_2_34_x86_64.whl", 0, "is not tagged abi3"),
        ("torch_fallback-0.1.0-cp310-abi3-manylinux_2_34_x86_64.whl", 1, "outside the stable ABI"),
    ],
)
def test_a_wheel_off_the_stable_abi_fails_the_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, audit_status: int, message: str
) -> None:
    job = job_for(tmp_path, [])
    audited: list[str] = []

    def fake_audit(command: Any, **kwargs: Any) -> Any:
        audited.append(str(command[-1]))
        return subprocess.CompletedProcess(command, audit_status, "", "PyObject_GetBuffer: 3.11+")

    monkeypatch.setattr(job_module.subprocess, "run", fake_audit)
    with pytest.raises(StepFailed, match=message):
        job_module.audit_stable_abi(job, tmp_path / name, {})
    assert audited == ([] if "cp311" in name else [str(tmp_path / name)])


def test_a_missing_example_fails_the_step_saying_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    with pytest.raises(StepFailed, match=r"examples/third_party_backend is missing.*never skips"):
        job_module.run_example(job_for(tmp_path, []), {}, Reporter(cell="cpu"))


def test_the_example_is_built_against_the_installed_wheel_and_tested(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    example = tmp_path / "repo" / "examples" / "third_party_backend"
    (example / "tests").mkdir(parents=True)
    (example / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    calls: list[list[str]] = []
    monkeypatch.setattr(
        job_module,
        "must_run",
        lambda command, env, what, cwd=None: calls.append([str(p) for p in command]),
    )
    monkeypatch.setattr(
        job_module,
        "run",
        lambda command, env, cwd=None: calls.append([str(p) for p in command]) or 0,
    )
    job = job_for(tmp_path, [])
    job_module.run_example(job, {}, Reporter(cell="cpu"))
    install, tests = calls
    assert install[install.index("install") + 1 :][:2] == ["--progress-bar", "off"]
    assert "--no-build-isolation" in install and "--no-index" in install
    # built from a copy (the repository is read-only in a container), into the run venv
    assert install[-1] == str(Path(job.work) / "example")
    assert install[0] == str(job.run_venv / "bin" / "python")
    assert tests[tests.index("pytest") + 1] == str(Path(job.work) / "example" / "tests")
    assert tests[tests.index("--junitxml") + 1] == str(
        Path(job.artifacts) / "example" / "junit.xml"
    )

    monkeypatch.setattr(job_module, "run", lambda command, env, cwd=None: 1)
    with pytest.raises(StepFailed, match="the tests of examples/third_party_backend failed"):
        job_module.run_example(job, {}, Reporter(cell="cpu"))


def test_install_from_an_index_takes_dependencies_from_the_wheelhouse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(
        job_module,
        "must_run",
        lambda command, env, what, cwd=None: calls.append([str(p) for p in command]),
    )
    job = job_for(tmp_path, [])
    job = dataclasses.replace(
        job, index_url="http://127.0.0.1:8080/simple/", requirement="torch-fallback==0.1.0"
    )
    (job.run_venv / "bin").mkdir(parents=True)
    (job.run_venv / "bin" / "python").symlink_to(sys.executable)
    with pytest.raises(StepFailed, match="torch_fallback resolves to"):  # nothing really installed
        job_module.install_wheel(job, None, dict(os.environ), Reporter(cell="cpu"))
    (install,) = calls
    assert install[install.index("--index-url") + 1] == "http://127.0.0.1:8080/simple/"
    assert install[install.index("--find-links") + 1] == job.wheelhouse
    assert install[-1] == "torch-fallback==0.1.0"


@pytest.mark.parametrize(
    ("workers", "options"),
    [
        ("auto", ["-n", "auto", "--dist", "loadgroup"]),
        ("2", ["-n", "2", "--dist", "loadgroup"]),
        ("0", []),  # no xdist: the tests run in the pytest process
    ],
)
def test_the_cells_tests_run_on_the_workers_it_asks_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: str, options: list[str]
) -> None:
    (tmp_path / "repo" / "tests").mkdir(parents=True)
    calls: list[list[Any]] = []
    monkeypatch.setattr(
        job_module, "run", lambda command, env, cwd=None: calls.append(list(command)) or 0
    )
    run_tests(dataclasses.replace(job_for(tmp_path, []), test_workers=workers), {})
    command = calls[0]
    assert command[command.index("-m", 3) + 1] == "not requires_cuda"
    xdist = command[command.index("-n") :] if "-n" in command else []
    assert xdist == options
