"""Bounded caches: the cap, least recently used first, entries in use kept, the report."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fallback_matrix import running
from fallback_matrix.cache import (
    CAP_ENV,
    cache_root,
    disk_usage,
    in_use,
    in_use_file,
    last_used,
    parse_cap,
    prune,
    scan,
)
from fallback_matrix.errors import CapError, MatrixError, StepFailed
from fallback_matrix.job import Job, base_env, prune_envs
from fallback_matrix.report import Reporter

MB = 10**6
DAY = 86_400.0


def make_store(
    store: Path, sizes: dict[str, int], now: float = 1_700_000_000.0
) -> Callable[[Path], int]:
    """Entries of ``store`` named as ``sizes``' keys, the first used longest ago (a day apart);
    a fake size function answering ``sizes``."""
    for age, name in enumerate(reversed(list(sizes))):
        entry = store / name
        (entry / "lib").mkdir(parents=True)
        stamp = now - age * DAY
        os.utime(entry, (stamp, stamp))
    return lambda path: sizes[path.name]


# --- the cap -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("20GB", 20 * 10**9),
        ("20G", 20 * 10**9),
        ("500 MB", 500 * MB),
        ("1.5GiB", int(1.5 * 2**30)),
        ("4096", 4096),
        ("0", 0),
        ("off", None),
        ("None", None),
    ],
)
def test_a_cap_is_read_with_or_without_a_unit(text: str, size: int | None) -> None:
    assert parse_cap(text) == size


@pytest.mark.parametrize("text", ["twenty", "20XB", "-1G", "", "GB", "inf"])
def test_a_wrong_cap_says_how_to_write_one(text: str) -> None:
    with pytest.raises(CapError, match=rf"not a size.*20GB.*\${CAP_ENV} or --cache-cap"):
        parse_cap(text)


def test_the_option_wins_over_the_variable_which_wins_over_the_default() -> None:
    assert running.cache_cap("1G", {CAP_ENV: "2G"}) == 10**9
    assert running.cache_cap(None, {CAP_ENV: "2G"}) == 2 * 10**9
    assert running.cache_cap(None, {}) == 20 * 10**9
    assert running.cache_cap(None, {CAP_ENV: "off"}) is None
    with pytest.raises(MatrixError, match="not a size"):
        running.cache_cap(None, {CAP_ENV: "lots"})


# --- pruning -------------------------------------------------------------------------------------


def test_the_cache_is_the_users_so_every_clone_shares_it(tmp_path: Path) -> None:
    assert cache_root({"HOME": str(tmp_path)}) == tmp_path / ".cache" / "fallback-matrix"
    xdg = {"HOME": "/nowhere", "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    assert cache_root(xdg) == tmp_path / "xdg" / "fallback-matrix"
    chosen = {**xdg, "FALLBACK_MATRIX_CACHE": str(tmp_path / "mine")}
    assert cache_root(chosen) == tmp_path / "mine"


def test_least_recently_used_entries_go_first_until_the_store_fits(tmp_path: Path) -> None:
    store = tmp_path / "envs"
    size = make_store(
        store, {"oldest": 300 * MB, "old": 200 * MB, "new": 400 * MB, "newest": 100 * MB}
    )
    pruned = prune(store, 600 * MB, what="environments", size=size)
    assert [entry.name for entry in pruned.removed] == ["oldest", "old"]
    assert sorted(path.name for path in store.iterdir() if path.is_dir()) == ["new", "newest"]
    assert (pruned.before, pruned.freed, pruned.after) == (1000 * MB, 500 * MB, 500 * MB)
    lines = pruned.lines()
    assert lines[0].startswith(
        f"cache of environments {store}: pruned oldest (300.0 MB, last used "
    )
    assert lines[1].startswith(f"cache of environments {store}: pruned old (200.0 MB")
    cap = "the cap of 600.0 MB ($FALLBACK_MATRIX_CACHE_CAP, --cache-cap)"
    assert lines[2].endswith(f"freed 500.0 MB; 500.0 MB left, {cap}")


def test_a_store_under_its_cap_is_left_alone(tmp_path: Path) -> None:
    store = tmp_path / "wheelhouse"
    size = make_store(store, {"a": 1 * MB, "b": 2 * MB})
    pruned = prune(store, 3 * MB, what="wheelhouses", size=size)
    assert not pruned.removed and sorted(p.name for p in store.iterdir() if p.is_dir()) == [
        "a",
        "b",
    ]
    assert pruned.lines() == [
        f"cache of wheelhouses {store}: 3.0 MB in 2 entries, under the cap of 3.0 MB "
        "($FALLBACK_MATRIX_CACHE_CAP, --cache-cap); nothing pruned"
    ]


def test_an_entry_of_this_run_is_kept_and_the_next_one_goes(tmp_path: Path) -> None:
    store = tmp_path / "envs"
    size = make_store(store, {"mine": 500 * MB, "other": 300 * MB, "recent": 100 * MB})
    pruned = prune(store, 600 * MB, keep=[store / "mine"], size=size)
    assert [entry.name for entry in pruned.removed] == ["other"]
    assert (store / "mine").is_dir() and (store / "recent").is_dir()
    assert pruned.after == 600 * MB
    assert not any("still over" in line for line in pruned.lines())


def test_an_entry_another_run_holds_is_never_pruned(tmp_path: Path) -> None:
    store = tmp_path / "envs"
    size = make_store(store, {"held": 500 * MB, "free": 300 * MB, "recent": 100 * MB})
    stamp = last_used(store / "held")
    with in_use(store / "held"):  # another run's shared lock, on a file of its own
        os.utime(in_use_file(store / "held"), (stamp, stamp))  # still the least recently used
        pruned = prune(store, 600 * MB, size=size)
    assert [entry.name for entry in pruned.removed] == ["free"]
    assert [(entry.name, why) for entry, why in pruned.kept] == [("held", "in use by a run")]
    assert (store / "held" / "lib").is_dir()


def test_a_cap_the_entries_in_use_exceed_says_so_and_what_to_do(tmp_path: Path) -> None:
    store = tmp_path / "envs"
    size = make_store(store, {"old": 100 * MB, "mine": 700 * MB})
    pruned = prune(store, 500 * MB, keep=[store / "mine"], size=size)
    assert [entry.name for entry in pruned.removed] == ["old"]
    assert (store / "mine").is_dir() and pruned.after == 700 * MB
    assert "still over the cap; kept mine (in use by this run)" in pruned.lines()[-1]
    assert "never pruned: raise the cap" in pruned.lines()[-1]


def test_a_zero_cap_prunes_everything_but_what_is_in_use(tmp_path: Path) -> None:
    store = tmp_path / "envs"
    size = make_store(store, {"a": 1, "b": 2, "mine": 3})
    pruned = prune(store, 0, keep=[store / "mine"], size=size)
    assert sorted(entry.name for entry in pruned.removed) == ["a", "b"]
    assert [p.name for p in store.iterdir() if p.is_dir()] == ["mine"]


def test_a_use_makes_an_entry_the_most_recently_used(tmp_path: Path) -> None:
    store = tmp_path / "envs"
    size = make_store(store, {"old": 100 * MB, "new": 100 * MB})
    with in_use(store / "old"):  # this run uses it: its in-use file is touched now
        pass
    assert last_used(store / "old") > last_used(store / "new")
    pruned = prune(store, 100 * MB, size=size)
    assert [entry.name for entry in pruned.removed] == ["new"]


def test_fills_and_removals_under_way_are_not_entries(tmp_path: Path) -> None:
    store = tmp_path / "wheelhouse"
    (store / ".torch-x.abc.partial").mkdir(parents=True)  # a wheelhouse being filled
    (store / ".old.pruning" / "lib").mkdir(parents=True)  # an interrupted removal
    (store / "torch-y").mkdir()
    (store / "torch-y.in-use").touch()
    assert [entry.name for entry in scan(store, lambda path: 1)] == ["torch-y"]
    prune(store, 10, size=lambda path: 1)
    assert (store / ".torch-x.abc.partial").is_dir() and not (store / ".old.pruning").exists()


def test_a_missing_store_has_nothing_to_prune(tmp_path: Path) -> None:
    pruned = prune(tmp_path / "absent", 0)
    assert pruned.before == 0 and not pruned.removed


def test_disk_usage_counts_a_hard_linked_file_once(tmp_path: Path) -> None:
    (tmp_path / "venv").mkdir()
    (tmp_path / "venv" / "data").write_bytes(os.urandom(64 * 1024))
    alone = disk_usage(tmp_path / "venv")
    assert alone >= 64 * 1024
    os.link(tmp_path / "venv" / "data", tmp_path / "venv" / "link")
    (tmp_path / "venv" / "python").symlink_to("/usr/bin/python3")
    assert disk_usage(tmp_path / "venv") == alone


# --- where a cell's run prunes -------------------------------------------------------------------


def job_with_cache(tmp_path: Path, cap: int | None) -> Job:
    return Job(
        cell="cpu",
        python="3.11",
        torch="2.13.0+cpu",
        cuda=None,
        test_paths=["tests"],
        test_markers="not requires_cuda",
        gpu=False,
        sources=[],
        repo=str(tmp_path / "repo"),
        wheelhouse=str(tmp_path / "wheelhouse" / "torch-2.13.0-cpu-py3.11-abc"),
        cache=str(tmp_path / "cache"),
        work=str(tmp_path / "work"),
        artifacts=str(tmp_path / "out"),
        cache_cap=cap,
    )


def test_the_job_prunes_other_environments_and_keeps_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = job_with_cache(tmp_path, 100 * 1024)
    base = base_env(job)
    for name in ("cuda-0123", base.name):  # real files: the job measures what they take
        (base.parent / name).mkdir(parents=True)
        (base.parent / name / "torch.so").write_bytes(os.urandom(80 * 1024))
    stamp = time.time() - DAY
    os.utime(base, (stamp - DAY, stamp - DAY))  # this job's environment, the oldest
    os.utime(base.parent / "cuda-0123", (stamp, stamp))
    with in_use(base):
        prune_envs(job, base, Reporter(cell="cpu"))
    assert base.is_dir() and not (base.parent / "cuda-0123").exists()
    output = capsys.readouterr().out
    assert f"cache of environments {base.parent}: pruned cuda-0123 (" in output
    assert "freed " in output


def test_new_dependency_groups_get_a_new_environment(tmp_path: Path) -> None:
    # in a container the wheelhouse's mount point is the same whatever it holds
    job = job_with_cache(tmp_path, None)
    (tmp_path / "repo").mkdir()
    pyproject = tmp_path / "repo" / "pyproject.toml"
    pyproject.write_text('[dependency-groups]\nbuild = ["auditwheel"]\n')
    before = base_env(job)
    pyproject.write_text('[dependency-groups]\nbuild = ["auditwheel", "abi3audit"]\n')
    assert base_env(job) != before
    assert base_env(job).parent == before.parent


def test_a_wheelhouse_holding_other_wheels_gets_a_new_environment(tmp_path: Path) -> None:
    # the manifest of a complete wheelhouse says what it holds, wherever it is mounted
    job = job_with_cache(tmp_path, None)
    manifest = Path(job.wheelhouse) / "wheelhouse.json"
    manifest.parent.mkdir(parents=True)
    manifest.write_text('{"wheels": ["torch-2.13.0+cpu.whl", "pytest-8.whl"]}')
    (tmp_path / "repo").mkdir()
    pyproject = tmp_path / "repo" / "pyproject.toml"
    pyproject.write_text('[dependency-groups]\ntest = ["pytest"]\n')
    before = base_env(job)
    pyproject.write_text('[dependency-groups]\ntest = ["pytest"]\n[tool.ruff]\nline-length = 99\n')
    assert base_env(job) == before  # what the wheelhouse holds is unchanged
    manifest.write_text('{"wheels": ["torch-2.13.0+cpu.whl", "pytest-8.whl", "xdist-3.whl"]}')
    assert base_env(job) != before


def test_cells_that_install_the_same_share_an_environment(tmp_path: Path) -> None:
    # a cell, its cross job and its install from the local index: one environment, not three
    job = job_with_cache(tmp_path, None)
    same = [dataclasses.replace(job, cell=name) for name in ("cross-x-on-cpu", "cpu-from-index")]
    assert {base_env(other) for other in same} == {base_env(job)}
    assert base_env(job).name.startswith("torch-2.13.0-cpu-py")
    other_torch = dataclasses.replace(job, cell="cuda-213", torch="2.13.0")
    assert base_env(other_torch) != base_env(job)


def test_no_cap_prunes_nothing_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = job_with_cache(tmp_path, None)
    base = base_env(job)
    (base.parent / "cuda-0123").mkdir(parents=True)
    prune_envs(job, base, Reporter(cell="cpu"))
    assert (base.parent / "cuda-0123").is_dir()
    assert "cache cap off: cached environments are not pruned" in capsys.readouterr().out


def test_the_job_file_carries_the_cap(tmp_path: Path) -> None:
    job = job_with_cache(tmp_path, 5 * 10**9)
    assert json.loads(job.to_json())["cache_cap"] == 5 * 10**9
    assert Job(**json.loads(job.to_json())) == job


class FakeRunner:
    name = "fake"

    def __init__(self) -> None:
        self.wheelhouses: list[Path] = []

    def run(self, job: Job, log: Reporter) -> tuple[int, str]:
        self.wheelhouses = [p for p in Path(job.wheelhouse).parent.iterdir() if p.is_dir()]
        return 0, "a fake runner"


def test_a_cell_run_prunes_the_wheelhouses_but_its_own(
    repo_root: Path, tmp_path: Path, cpu_cell: Any
) -> None:
    from fallback_matrix.wheelhouse import MANIFEST_NAME, wheelhouse_path

    matrix, cell = cpu_cell
    mine = wheelhouse_path(cell, repo_root / "pyproject.toml", tmp_path / "cache")
    stamp = time.time() - 3 * DAY
    for age, path in enumerate(
        [mine, mine.with_name("torch-2.7.1-py3.10-0ld"), mine.with_name("torch-2.15.0-py3.13-n3w")]
    ):
        path.mkdir(parents=True)
        (path / MANIFEST_NAME).write_text("{}")  # complete: nothing to download
        (path / "torch.whl").write_bytes(os.urandom(64 * 1024))
        os.utime(path, (stamp + age * DAY, stamp + age * DAY))  # this cell's is the oldest
    runner = FakeRunner()
    out = tmp_path / "out" / "cpu"
    result = running.run_cell(matrix, cell, runner, out, Reporter(), cache_cap=150 * 1024)
    assert result["error"] is None
    assert sorted(path.name for path in runner.wheelhouses) == sorted(
        [mine.name, "torch-2.15.0-py3.13-n3w"]
    )
    log = (out / "cell.log").read_text()
    assert "cache of wheelhouses" in log and "pruned torch-2.7.1-py3.10-0ld" in log
    assert "freed " in log


def test_the_job_holds_its_environment_in_use_while_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fcntl

    from fallback_matrix import job as job_module

    job = job_with_cache(tmp_path, 10**9)
    monkeypatch.chdir(tmp_path)  # the job changes into its work directory
    held: list[bool] = []

    def create_envs(job: Job, env: object, report: Reporter) -> Path:
        with in_use_file(base_env(job)).open("a") as pruner:  # what another run's pruner tries
            try:
                fcntl.flock(pruner, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held.append(False)
            except BlockingIOError:
                held.append(True)
        raise StepFailed("stop here")

    monkeypatch.setattr(job_module, "create_envs", create_envs)
    assert job_module.run_steps(job) == StepFailed.exit_code
    assert held == [True]
    with in_use_file(base_env(job)).open("a") as pruner:  # released when the job ends
        fcntl.flock(pruner, fcntl.LOCK_EX | fcntl.LOCK_NB)
