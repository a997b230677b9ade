"""The GitHub workflows generated from matrix.yaml: drift, policies, GPU and cross jobs."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fallback_matrix import cli
from fallback_matrix.errors import EXIT_OK, EXIT_USAGE, MatrixError
from fallback_matrix.matrix import expand_cells, load_matrix
from fallback_matrix.workflows import (
    ACTIONS,
    REGENERATE_COMMAND,
    WORKFLOWS_DIR,
    both,
    check_workflows,
    cross_tests,
    plan_workflows,
)

REQUIREMENTS = '{"build": ["setuptools>=69"], "test": ["pytest>=8"]}'
SHA = re.compile(r"^[\w.-]+/[\w.-]+@[0-9a-f]{40}$")
SETUP_COMMANDS = {"python -m pip install nox"}


def _workflows(text_by_path: dict[str, str]) -> dict[str, dict[str, Any]]:
    """File name -> parsed workflow, of the workflows among generated files."""
    prefix = WORKFLOWS_DIR.as_posix() + "/"
    return {
        path.removeprefix(prefix): yaml.safe_load(text)
        for path, text in text_by_path.items()
        if path.startswith(prefix)
    }


def _steps(workflow: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for job_id, job in workflow["jobs"].items():
        for step in job["steps"]:
            yield job_id, step


@pytest.fixture
def planned(write_matrix: Callable[[Any], Path], matrix_data: dict[str, Any]) -> Any:
    """Workflows of a matrix given as data, in a tmp dir: name -> parsed workflow."""

    def plan(data: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
        matrix = load_matrix(write_matrix(data or matrix_data))
        return _workflows(plan_workflows(matrix, REQUIREMENTS))

    return plan


@pytest.fixture
def committed(repo_root: Path) -> dict[str, dict[str, Any]]:
    """The workflows committed in the repository, parsed."""
    directory = repo_root / WORKFLOWS_DIR
    files = {
        f"{WORKFLOWS_DIR.as_posix()}/{path.name}": path.read_text(encoding="utf-8")
        for path in directory.glob("*.yml")
    }
    assert files, f"no workflows in {directory}; run `{REGENERATE_COMMAND}`"
    return _workflows(files)


# --- drift ---------------------------------------------------------------------------------------


def test_committed_workflows_match_the_matrix(repo_root: Path) -> None:
    matrix = load_matrix(repo_root / "matrix.yaml")
    drift = check_workflows(repo_root, plan_workflows(matrix))
    assert not drift, str(drift)


def test_a_changed_matrix_makes_the_drift_check_fail(
    tmp_path: Path,
    repo_root: Path,
    matrix_data: dict[str, Any],
    write_matrix: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    shutil.copy(repo_root / "pyproject.toml", tmp_path / "pyproject.toml")
    matrix = load_matrix(write_matrix(matrix_data))
    check_workflows(tmp_path, plan_workflows(matrix), fix=True)
    assert not check_workflows(tmp_path, plan_workflows(matrix))
    assert cli.main(["--matrix", str(matrix.file), "workflows", "--check"]) == 0

    matrix_data["cells"][0]["torch"] = "2.13.1+cpu"
    changed = load_matrix(write_matrix(matrix_data))
    drift = check_workflows(tmp_path, plan_workflows(changed))
    assert drift == {
        f"{WORKFLOWS_DIR.as_posix()}/{name}.yml": "differs from matrix.yaml"
        for name in ("matrix-pr", "matrix-main", "release")
    }
    capsys.readouterr()
    assert cli.main(["--matrix", str(changed.file), "workflows", "--check"]) == 1
    message = capsys.readouterr().out
    assert "matrix-pr.yml: differs from matrix.yaml" in message
    assert REGENERATE_COMMAND in message

    assert cli.main(["--matrix", str(changed.file), "workflows"]) == 0
    assert not check_workflows(tmp_path, plan_workflows(changed))


def test_generation_is_deterministic(write_matrix: Any, matrix_data: dict[str, Any]) -> None:
    matrix = load_matrix(write_matrix(matrix_data))
    assert plan_workflows(matrix, REQUIREMENTS) == plan_workflows(matrix, REQUIREMENTS)


def test_stale_generated_files_count_as_drift(
    tmp_path: Path, write_matrix: Any, matrix_data: dict[str, Any]
) -> None:
    planned = plan_workflows(load_matrix(write_matrix(matrix_data)), REQUIREMENTS)
    check_workflows(tmp_path, planned, fix=True)
    old = tmp_path / WORKFLOWS_DIR / "matrix-old.yml"
    old.write_text(next(iter(planned.values())), encoding="utf-8")
    hand_written = tmp_path / WORKFLOWS_DIR / "deploy.yml"
    hand_written.write_text("name: deploy\n", encoding="utf-8")
    assert check_workflows(tmp_path, planned) == {
        f"{WORKFLOWS_DIR.as_posix()}/matrix-old.yml": "no longer generated"
    }
    check_workflows(tmp_path, planned, fix=True)
    assert not old.exists() and hand_written.exists()


# --- policies, on the committed files and on a generated matrix with every kind of job ------------


def _cross_matrix(matrix_data: dict[str, Any]) -> dict[str, Any]:
    """The test matrix plus a CPU cell with the CUDA cells' torch version."""
    matrix_data["cells"].append(
        {"name": "cpu-same", "variant": "cpu", "python": "3.11", "torch": "2.14.1+cpu"}
    )
    return matrix_data


@pytest.fixture(params=["committed", "generated"])
def every_workflow(
    request: pytest.FixtureRequest, planned: Any, matrix_data: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    if request.param == "committed":
        return request.getfixturevalue("committed")
    return planned(_cross_matrix(matrix_data))


def test_every_run_step_is_a_nox_session_or_fallback_matrix(
    every_workflow: dict[str, dict[str, Any]],
) -> None:
    for name, workflow in every_workflow.items():
        for job_id, step in _steps(workflow):
            if "run" not in step:
                continue
            command = step["run"].strip()
            assert "\n" not in command, f"{name} {job_id}: one command per run step"
            allowed = (
                command in SETUP_COMMANDS
                or re.fullmatch(r"nox -s [\w-]+( -- .*)?", command)
                or command.startswith("python -m fallback_matrix ")
            )
            assert allowed, (
                f"{name} job {job_id}: run step {command!r} is neither a nox session nor "
                "python -m fallback_matrix; CI must run what a laptop runs"
            )


def test_every_action_is_pinned_by_a_full_sha_with_its_version(
    every_workflow: dict[str, dict[str, Any]], repo_root: Path
) -> None:
    known = {ref for ref, _ in ACTIONS.values()}
    for name, workflow in every_workflow.items():
        for job_id, step in _steps(workflow):
            if "uses" in step:
                assert SHA.match(step["uses"]), f"{name} {job_id}: {step['uses']} is not pinned"
                assert step["uses"] in known
    for path in (repo_root / WORKFLOWS_DIR).glob("*.yml"):
        for line in path.read_text(encoding="utf-8").splitlines():
            if "uses:" in line:
                assert re.search(r"@[0-9a-f]{40} +# v\d+\.\d+\.\d+$", line), line


def test_least_privilege_and_concurrency(every_workflow: dict[str, dict[str, Any]]) -> None:
    for name, workflow in every_workflow.items():
        assert workflow["permissions"] == {"contents": "read"}
        # a new run cancels an older one only for pull requests: never a push to main
        # (each merge's GPU tests finish) and never a release
        cancel = workflow["concurrency"]["cancel-in-progress"]
        expected = False if name == "release.yml" else "${{ github.event_name == 'pull_request' }}"
        assert cancel == expected, name
        for job_id, job in workflow["jobs"].items():
            if "permissions" in job:  # only the publish job widens them, and only by OIDC
                assert (name, job_id, job["permissions"]) == (
                    "release.yml",
                    "publish",
                    {"id-token": "write"},
                )
        for job_id, step in _steps(workflow):
            if step.get("uses", "").startswith("actions/checkout@"):
                assert step["with"]["persist-credentials"] is False, job_id
            assert "${{" not in step.get("run", ""), f"{job_id}: expression in a run step"


def test_selections_pick_the_trigger_and_the_cells(committed: dict[str, dict[str, Any]]) -> None:
    pr, main = committed["matrix-pr.yml"], committed["matrix-main.yml"]
    # PyYAML reads the key `on` as True (YAML 1.1); GitHub reads it as "on".
    assert "pull_request" in pr.get("on", pr.get(True))
    assert "push" in main.get("on", main.get(True))
    assert "gpu-cuda-gpu" not in pr["jobs"]
    assert {"build-cpu", "build-cuda", "gpu-cuda-gpu", "summary"} <= set(main["jobs"])


def test_build_jobs_run_the_laptop_session_and_upload_the_cell(
    planned: Any, matrix_data: dict[str, Any]
) -> None:
    job = planned()["matrix-main.yml"]["jobs"]["build-cpu"]
    assert job["runs-on"] == ["ubuntu-24.04"]
    runs = [step["run"] for step in job["steps"] if "run" in step]
    assert "nox -s build-cpu -- --runner docker" in runs
    upload = next(
        s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact@")
    )
    assert upload["with"]["path"] == "artifacts/cpu/" and upload["if"] == "always()"
    caches = [s for s in job["steps"] if s.get("uses", "").startswith("actions/cache@")]
    keys = [cache["with"]["key"] for cache in caches]
    assert len(caches) == 2 and all("cpu" in key for key in keys)


def test_cache_keys_change_with_what_the_cell_installs(
    write_matrix: Any, matrix_data: dict[str, Any]
) -> None:
    def keys(requirements: str) -> list[str]:
        matrix = load_matrix(write_matrix(matrix_data))
        job = _workflows(plan_workflows(matrix, requirements))["matrix-pr.yml"]["jobs"]
        return [s["with"]["key"] for s in job["build-cpu"]["steps"] if "key" in s.get("with", {})]

    assert keys(REQUIREMENTS) != keys(REQUIREMENTS.replace('"pytest>=8"', '"pytest>=8", "numpy"'))


def test_gpu_job_takes_labels_from_the_matrix_and_requires_a_gpu(
    planned: Any, matrix_data: dict[str, Any]
) -> None:
    matrix_data["runners"]["gpu"] = ["self-hosted", "linux", "x64", "h200"]
    job = planned(matrix_data)["matrix-main.yml"]["jobs"]["gpu-cuda-gpu"]
    assert job["runs-on"] == ["self-hosted", "linux", "x64", "h200"]
    assert job["env"]["TORCH_FALLBACK_REQUIRE_GPU"] == "1"
    assert job["needs"] == ["build-cuda"]
    download = next(s for s in job["steps"] if "download-artifact" in s.get("uses", ""))
    assert download["with"] == {"name": "cuda", "path": "artifacts/cuda"}
    (command,) = [s["run"] for s in job["steps"] if s.get("run", "").startswith("nox -s test")]
    assert command.startswith("nox -s test-wheel -- cuda-gpu --wheel artifacts/cuda")
    assert "--gpus" in command.split()


def test_gpu_cell_without_a_build_cell_is_an_error(
    write_matrix: Any, matrix_data: dict[str, Any]
) -> None:

    matrix_data["cells"][2]["torch"] = "2.14.0"
    with pytest.raises(MatrixError, match=r"cuda-gpu.*no build cell"):
        plan_workflows(load_matrix(write_matrix(matrix_data)), REQUIREMENTS)


def test_no_cross_job_when_the_versions_differ(planned: Any) -> None:
    for workflow in planned().values():
        assert not [job for job in workflow["jobs"] if job.startswith("cross-")]


def test_the_committed_matrix_has_both_cross_jobs_in_every_cell_workflow(
    committed: dict[str, dict[str, Any]],
) -> None:
    for name in ("matrix-pr.yml", "matrix-main.yml", "release.yml"):
        jobs = committed[name]["jobs"]
        assert "cross-cpu-on-cuda-213" in jobs and "cross-cuda-213-on-cpu" in jobs, name
        assert jobs["cross-cuda-213-on-cpu"]["needs"] == ["build-cuda-213"]


def test_cross_jobs_for_a_cpu_and_cuda_cell_of_the_same_torch_both_ways(
    planned: Any, matrix_data: dict[str, Any]
) -> None:
    workflows = planned(_cross_matrix(matrix_data))
    for name, workflow in workflows.items():
        if name == "checks.yml":
            continue
        crosses = {job_id: job for job_id, job in workflow["jobs"].items() if "cross" in job_id}
        assert list(crosses) == ["cross-cpu-same-on-cuda", "cross-cuda-on-cpu-same"]
        for cross, source in zip(crosses, ["cpu-same", "cuda"], strict=True):
            job = crosses[cross]
            assert job["needs"] == [f"build-{source}"]
            runs = [s["run"] for s in job["steps"] if "run" in s]
            assert f"nox -s {cross} -- --runner docker" in runs
            downloads = [s["with"]["name"] for s in job["steps"] if "download" in s["name"]]
            assert downloads == [source]
            final = "dist" if name == "release.yml" else "summary"
            assert cross in workflow["jobs"][final]["needs"]
        reverse = crosses["cross-cuda-on-cpu-same"]
        assert reverse["name"] == "wheel of cuda on torch of cpu-same"
        caches = [s["with"]["key"] for s in reverse["steps"] if s["name"] == "wheelhouse cache"]
        if name != "release.yml":  # the torch it installs is the cpu cell's
            assert caches == [f"wheelhouse-torch-2.14.1-cpu-py3.11-{caches[0].rsplit('-', 1)[1]}"]


def test_cross_tests_pair_each_cpu_and_cuda_build_of_a_release_both_ways(
    write_matrix: Callable[[Any], Path], matrix_data: dict[str, Any]
) -> None:
    cells = expand_cells(load_matrix(write_matrix(_cross_matrix(matrix_data))).spec)
    crosses = cross_tests(cells)  # cuda-gpu has the same torch, but it builds no wheel
    assert [cross.name for cross in crosses] == ["cross-cpu-same-on-cuda", "cross-cuda-on-cpu-same"]
    forward, reverse = crosses
    assert (forward.source.name, forward.target.name) == ("cpu-same", "cuda")
    assert (reverse.source.name, reverse.target.name) == ("cuda", "cpu-same")
    # the cell a cross test runs: the target's torch under the cross test's name
    assert (reverse.cell.name, reverse.cell.torch, reverse.cell.variant) == (
        "cross-cuda-on-cpu-same",
        "2.14.1+cpu",
        "cpu",
    )


def test_the_committed_matrix_crosses_the_213_builds_both_ways(repo_root: Path) -> None:
    cells = expand_cells(load_matrix(repo_root / "matrix.yaml").spec)
    crosses = {cross.name: cross for cross in cross_tests(cells)}
    assert list(crosses) == ["cross-cpu-on-cuda-213", "cross-cuda-213-on-cpu"]
    # both run what the CUDA-wheel cells run: slow tests stay in the cpu cell
    for cross in crosses.values():
        assert cross.cell.tests.markers == "not requires_cuda and not slow", cross.name
    assert crosses["cross-cuda-213-on-cpu"].cell.torch == "2.13.0+cpu"


@pytest.mark.parametrize(
    ("first", "second", "selected"),
    [
        ("not requires_cuda", "not requires_cuda", "not requires_cuda"),
        ("not requires_cuda", "not requires_cuda and not slow", "not requires_cuda and not slow"),
        ("not slow and not requires_cuda", "not requires_cuda", "not slow and not requires_cuda"),
        ("requires_cuda or slow", "not slow", "(requires_cuda or slow) and (not slow)"),
        ("(a or b)", "(a or b)", "(a or b)"),
    ],
)
def test_a_cross_test_selects_what_both_cells_select(
    first: str, second: str, selected: str
) -> None:
    assert both(first, second) == selected


def test_the_cross_command_tests_the_source_cells_wheel_in_the_target_cell(
    write_matrix: Callable[[Any], Path],
    matrix_data: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    matrix = write_matrix(_cross_matrix(matrix_data))
    artifacts = tmp_path / "artifacts"
    (artifacts / "cuda").mkdir(parents=True)
    (artifacts / "cuda" / "torch_fallback-0.1.0-cp311-cp311-manylinux_2_34_x86_64.whl").touch()
    runs: list[tuple[list[Any], dict[str, Any]]] = []

    def run(context: Any, cells: list[Any], title: str, **options: Any) -> int:
        runs.append((cells, options))
        return EXIT_OK

    monkeypatch.setattr(cli.Context, "run", run)
    arguments = ["--matrix", str(matrix), "cross", "cross-cuda-on-cpu-same"]
    assert cli.main([*arguments, "--artifacts", str(artifacts)]) == EXIT_OK
    ((cell,), options) = runs[0]
    assert (cell.name, cell.torch, cell.tests.markers) == (
        "cross-cuda-on-cpu-same",
        "2.14.1+cpu",
        "not requires_cuda",
    )
    staged = tmp_path / ".cache" / "test-wheel" / "cross-cuda-on-cpu-same"
    assert options["prebuilt_wheel"] == str(
        staged / "torch_fallback-0.1.0-cp311-cp311-manylinux_2_34_x86_64.whl"
    )


def test_an_unknown_cross_test_names_the_ones_there_are(
    write_matrix: Callable[[Any], Path],
    matrix_data: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    matrix = write_matrix(_cross_matrix(matrix_data))
    assert cli.main(["--matrix", str(matrix), "cross", "cross-cpu-on-cuda"]) == EXIT_USAGE
    error = capsys.readouterr().out
    assert "no wheel test 'cross-cpu-on-cuda' in matrix.yaml" in error
    assert "cross-cpu-same-on-cuda, cross-cuda-on-cpu-same" in error


def test_a_cross_test_without_the_source_wheel_says_which_build_makes_it(
    write_matrix: Callable[[Any], Path],
    matrix_data: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    matrix = write_matrix(_cross_matrix(matrix_data))
    arguments = ["--matrix", str(matrix), "cross", "cross-cuda-on-cpu-same"]
    assert cli.main([*arguments, "--artifacts", str(tmp_path / "none")]) == EXIT_USAGE
    assert "nox -s build-cuda puts it in artifacts/cuda/" in capsys.readouterr().out


def test_cross_job_needs_the_same_python(planned: Any, matrix_data: dict[str, Any]) -> None:
    data = _cross_matrix(matrix_data)
    data["cells"][-1]["python"] = "3.12"
    for workflow in planned(data).values():
        assert not [job for job in workflow["jobs"] if job.startswith("cross-")]


def test_summary_job_runs_after_everything_and_renders_the_table(
    committed: dict[str, dict[str, Any]],
) -> None:
    for name in ("matrix-pr.yml", "matrix-main.yml"):
        workflow = committed[name]
        summary = workflow["jobs"]["summary"]
        assert summary["if"] == "always()"
        assert set(summary["needs"]) == set(workflow["jobs"]) - {"summary"}
        assert [s["run"] for s in summary["steps"] if "run" in s][-1] == "nox -s summary"


def test_actionlint_knows_the_custom_labels_of_self_hosted_runners(
    write_matrix: Any, matrix_data: dict[str, Any]
) -> None:
    matrix_data["runners"]["gpu"] = ["self-hosted", "linux", "x64", "gpu", "h200"]
    planned = plan_workflows(load_matrix(write_matrix(matrix_data)), REQUIREMENTS)
    config = yaml.safe_load(planned[".github/actionlint.yaml"])
    assert config == {"self-hosted-runner": {"labels": ["gpu", "h200"]}}


def test_self_hosted_runner_justified_only_where_pull_requests_cannot_reach_it(
    write_matrix: Any, matrix_data: dict[str, Any]
) -> None:
    matrix_data["cells"][2]["selections"] = ["pr", "main"]
    planned = plan_workflows(load_matrix(write_matrix(matrix_data)), REQUIREMENTS)
    assert "zizmor: ignore[self-hosted-runner]" in planned[".github/workflows/matrix-main.yml"]
    assert "zizmor: ignore" not in planned[".github/workflows/matrix-pr.yml"]


def test_test_wheel_maps_the_staged_wheel_to_where_the_job_sees_the_repo(
    tmp_path: Path, write_matrix: Any, matrix_data: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    built = tmp_path / "artifacts" / "cuda"
    built.mkdir(parents=True)
    (built / "torch_fallback-0.1.0-cp311-cp311-linux_x86_64.whl").write_bytes(b"wheel")
    runs: list[dict[str, Any]] = []
    monkeypatch.setattr(
        cli.Context, "run", lambda self, cells, title, **options: runs.append(options) or 0
    )
    matrix = write_matrix(matrix_data)
    assert cli.main(["--matrix", str(matrix), "test-wheel", "cuda", "--wheel", str(built)]) == 0
    (options,) = runs
    wheel = Path(options["prebuilt_wheel"])
    assert wheel.read_bytes() == b"wheel"
    relative = wheel.relative_to(matrix.parent).as_posix()
    assert relative == ".cache/test-wheel/cuda/torch_fallback-0.1.0-cp311-cp311-linux_x86_64.whl"


# --- GitHub's and PyPI's constraints (issue: CI that would pass on GitHub) ------------------------

# The oldest release of each action GitHub still runs (actions/cache before v4.2.0 uses
# the retired cache service) and that is current for its major line here.
ACTION_FLOORS = {
    "actions/checkout": "4.2.2",
    "actions/setup-python": "5.6.0",
    "actions/upload-artifact": "4.6.2",
    "actions/download-artifact": "4.3.0",
    "actions/cache": "4.2.0",
    "pypa/gh-action-pypi-publish": "1.12.4",
}


def test_pinned_actions_are_current(every_workflow: dict[str, dict[str, Any]]) -> None:
    from packaging.version import Version

    versions = dict(ACTIONS.values())
    used = set()
    for name, workflow in every_workflow.items():
        for job_id, step in _steps(workflow):
            if "uses" not in step:
                continue
            repo, version = step["uses"].split("@")[0], versions[step["uses"]]
            used.add(repo)
            assert Version(version) >= Version(ACTION_FLOORS[repo]), (name, job_id, repo)
    assert "actions/cache" in used


def test_checks_workflow_runs_lint_the_tooling_tests_and_the_drift_check(
    committed: dict[str, dict[str, Any]],
) -> None:
    checks = committed["checks.yml"]
    trigger = checks.get("on", checks.get(True))
    assert trigger["pull_request"] == {"branches": ["main"]}
    assert trigger["push"] == {"branches": ["main"]}
    runs = {
        job_id: [s["run"] for s in job["steps"] if "run" in s][-1]
        for job_id, job in checks["jobs"].items()
    }
    assert runs == {
        "lint": "nox -s lint",
        "tooling": "nox -s tooling-tests",
        "drift": "nox -s workflows -- --check",
    }


def test_gpu_job_runs_for_main_only_in_an_environment_with_per_run_caches_and_cleanup(
    committed: dict[str, dict[str, Any]],
) -> None:
    job = committed["matrix-main.yml"]["jobs"]["gpu-cuda-gpu"]
    assert job["if"] == "github.ref == 'refs/heads/main'"
    assert job["environment"] == "gpu"
    test_step = next(s for s in job["steps"] if s.get("run", "").startswith("nox -s test-wheel"))
    run_dir = test_step["env"]["FALLBACK_MATRIX_DOCKER_CACHE"]
    assert run_dir.startswith("${{ runner.temp }}/") and "${{ github.run_id }}" in run_dir
    assert "${{ github.run_attempt }}" in run_dir  # a re-run gets its own directory too
    cleanup = job["steps"][-1]
    assert (cleanup["if"], cleanup["run"]) == ("always()", "nox -s clean -- --caches")
    assert cleanup["env"]["FALLBACK_MATRIX_DOCKER_CACHE"] == run_dir
    for name in ("matrix-pr.yml", "checks.yml", "release.yml"):
        for other in committed[name]["jobs"].values():
            assert "self-hosted" not in other["runs-on"], name


def test_cells_that_install_the_same_share_one_cache_entry(
    committed: dict[str, dict[str, Any]],
) -> None:
    jobs = committed["matrix-main.yml"]["jobs"]

    def wheelhouse(job_id: str) -> tuple[str, str]:
        (step,) = [s for s in jobs[job_id]["steps"] if s.get("name") == "wheelhouse cache"]
        return step["with"]["path"], step["with"]["key"]

    # same path and key: actions/cache stores the CUDA wheelhouse (GBs) once
    assert wheelhouse("gpu-cuda-gpu") == wheelhouse("build-cuda")
    entries = {wheelhouse(job_id) for job_id in jobs if job_id.startswith(("build-", "gpu-"))}
    assert len(entries) == len([j for j in jobs if j.startswith("build-")])


def test_release_builds_tests_and_publishes_with_trusted_publishing(
    committed: dict[str, dict[str, Any]],
) -> None:
    release = committed["release.yml"]
    assert release.get("on", release.get(True)) == {"push": {"tags": ["v*"]}}
    jobs = release["jobs"]
    builds = {job_id for job_id in jobs if job_id not in ("dist", "publish")}
    assert {"build-cpu", "build-cuda", "build-oldest", "build-newest"} <= builds
    assert {"cross-cuda-213-on-cpu", "cuda-on-py310", "cuda-on-py313"} <= builds
    assert set(jobs["dist"]["needs"]) == builds  # every wheel built and tested first
    assert "nox -s dist -- cuda" in [s.get("run") for s in jobs["dist"]["steps"]]
    publish = jobs["publish"]
    assert publish["needs"] == ["dist"]
    assert publish["environment"]["name"] == "pypi"
    assert publish["permissions"] == {"id-token": "write"}
    assert [s["uses"].split("@")[0] for s in publish["steps"]] == [
        "actions/download-artifact",
        "pypa/gh-action-pypi-publish",
    ]
    for job_id, step in _steps(release):  # nothing restored from a cache reaches a release
        assert not step.get("uses", "").startswith("actions/cache@"), job_id


def test_a_release_needs_a_pypi_cell(write_matrix: Any, matrix_data: dict[str, Any]) -> None:

    del matrix_data["cells"][1]["pypi"]
    with pytest.raises(MatrixError, match="no cell has pypi: true"):
        plan_workflows(load_matrix(write_matrix(matrix_data)), REQUIREMENTS)


def test_workflows_hold_no_yaml_anchors(repo_root: Path) -> None:
    for path in (repo_root / WORKFLOWS_DIR).glob("*.yml"):
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"[&*]id\d+", text), f"{path.name}: YAML anchor or alias"


def test_a_cell_job_sets_up_the_cells_python_and_the_toolings(
    committed: dict[str, dict[str, Any]],
) -> None:
    steps = committed["matrix-main.yml"]["jobs"]["build-oldest"]["steps"]
    (setup,) = [s for s in steps if s.get("uses", "").startswith("actions/setup-python@")]
    assert setup["with"]["python-version"].split() == ["3.10", "3.11"]  # 3.11 last: default
