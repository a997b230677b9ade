"""Build and test one matrix cell where it runs: in its container, or on the host.

Standard library only: inside a container this runs with the image's bare
Python, before anything is installed. The host side (fallback_matrix.runners)
writes a `Job` as JSON and starts ``python3 -m fallback_matrix.cell_job JOB.json``
from the directory holding the package (the repository's src/). Version checks
run in the cell's environment, through ``fallback_matrix.versions``. Steps:

1. environment   a venv holding the pinned torch and the build/test dependency
                 groups (pip install --group), installed offline from the cell's
                 wheelhouse (kept in the cache, keyed by what it holds), plus a
                 fresh venv for this run on top
2. verify torch  the installed torch must be the pinned release and variant
3. sources       the repository copied to a fixed build directory (kept in the
                 cache, so ninja and ccache find their previous work)
4. build         pip wheel --no-build-isolation --no-deps, through ccache; the wheel
                 must pin the torch release it was built against (Requires-Dist)
5. repair        auditwheel repair to a manylinux tag, torch's own libraries
                 excluded (they come with the torch wheel); auditwheel show
6. install       the repaired wheel (or a prebuilt one, or torch-fallback from a
                 package index) into the fresh venv
7. tests         pytest on the repository's tests, from a directory outside the
                 source tree, so the installed wheel is what gets tested
8. example       the third-party backend example built against the installed
                 wheel (pip install --no-build-isolation) and its own tests
9. artifacts     wheel, junit.xml, auditwheel.txt and result.json (the steps, which
                 the host completes with its own record); ccache statistics

Exit status 0 when every step passed, 1 otherwise; the last lines say which
step failed and why.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fallback_matrix.report import Reporter, without_pip_config
from fallback_matrix.report import run as run_streaming

STEPS = (
    "environment",
    "verify torch",
    "sources",
    "build",
    "repair",
    "install",
    "tests",
    "example",
    "artifacts",
)
# The environment variable setup.py reads: build without the local version label (PyPI).
PLAIN_VERSION_ENV = "TORCH_FALLBACK_PLAIN_VERSION"
# torch's own shared libraries, whatever torch/lib holds besides: a wheel never bundles them.
TORCH_LIBRARY_PATTERNS = ("libtorch*.so*", "libc10*.so*", "libshm*.so*")
ENV_COMPLETE_MARKER = ".fallback-matrix-complete"
SOURCES_MANIFEST = ".fallback-matrix-sources.json"
CCACHE_WRAPPERS = Path("/usr/lib/ccache")
PYTEST_NO_TESTS = 5

# The directory holding the fallback_matrix package: cell environments run
# `python -m fallback_matrix.versions` from there.
PACKAGE_PARENT = Path(__file__).resolve().parents[1]
# pip installs dependency groups (--group) since 25.1; a cell's venv gets it from the wheelhouse.
PIP_WITH_GROUPS = "pip>=25.1"


def describe_build(cuda: str | None) -> str:
    """The torch build a cell must end up with, in words."""
    if cuda is None:
        return "a CPU-only build (torch.version.cuda None)"
    return f"a CUDA {cuda} build (torch.version.cuda {cuda}.x)"


@dataclass(frozen=True)
class Job:
    """What the host asks of one cell; every path is as seen where the job runs."""

    cell: str
    torch_requirement: str
    expected_cuda: str | None
    groups: list[str]  # dependency groups of the repository's pyproject.toml
    test_paths: list[str]
    test_markers: str
    allow_empty: bool
    require_gpu: bool
    sources: list[str]
    repo: str
    wheelhouse: str
    cache: str
    work: str
    artifacts: str
    example: str = "examples/third_party_backend"  # built and tested against the wheel
    plain_version: bool = False  # build without the local version label (the PyPI build)
    prebuilt_wheel: str | None = None  # set: install and test this wheel, build nothing
    index_url: str | None = None  # set: install `requirement` from this index, build nothing
    requirement: str | None = None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> Job:
        data = json.loads(text)
        names = {item.name for item in dataclasses.fields(cls)}
        required = {
            item.name
            for item in dataclasses.fields(cls)
            if item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING
        }
        missing = sorted(required - set(data))
        unknown = sorted(set(data) - names)
        if missing or unknown:
            raise ValueError(f"job file: missing keys {missing}, unknown keys {unknown}")
        return cls(**data)

    @property
    def torch_version(self) -> str:
        return self.torch_requirement.removeprefix("torch==")


class StepFailed(Exception):
    """A step failed; the message says what happened and what to do."""


@dataclass
class Layout:
    """Where things live for one job."""

    job: Job
    repo: Path = field(init=False)
    wheelhouse: Path = field(init=False)
    cache: Path = field(init=False)
    work: Path = field(init=False)
    artifacts: Path = field(init=False)

    def __post_init__(self) -> None:
        self.repo = Path(self.job.repo)
        self.wheelhouse = Path(self.job.wheelhouse)
        self.cache = Path(self.job.cache)
        self.work = Path(self.job.work)
        self.artifacts = Path(self.job.artifacts)

    @property
    def build_dir(self) -> Path:
        """Fixed per cell, so compiler command lines (and ccache keys) repeat across runs."""
        return self.cache / "build" / self.job.cell

    @property
    def ccache_dir(self) -> Path:
        return self.cache / "ccache"

    @property
    def run_venv(self) -> Path:
        return self.work / "venv"

    @property
    def dist(self) -> Path:
        return self.work / "dist"

    @property
    def test_cwd(self) -> Path:
        return self.work / "test-cwd"


# --- helpers -------------------------------------------------------------------------------------


def run(command: Sequence[str | Path], env: Mapping[str, str], cwd: Path | None = None) -> int:
    print(f"$ {shlex.join(str(part) for part in command)}", flush=True)
    return run_streaming(command, print, env=env, cwd=cwd)


def must_run(
    command: Sequence[str | Path], env: Mapping[str, str], what: str, cwd: Path | None = None
) -> None:
    status = run(command, env, cwd)
    if status != 0:
        raise StepFailed(f"{what} failed (exit status {status}); its output is above")


def hermetic_env(layout: Layout) -> dict[str, str]:
    """The process environment without any pip configuration of the machine."""
    env = without_pip_config(os.environ)
    env.update(
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_NO_INPUT="1",
        PIP_CACHE_DIR=str(layout.cache / "pip"),
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONUNBUFFERED="1",
    )
    return env


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def site_packages(venv: Path) -> Path:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return venv / "lib" / version / "site-packages"


@contextmanager
def locked(lock_file: Path, what: str, report: Reporter) -> Iterator[None]:
    """Hold an exclusive lock while the block runs.

    Runs of the same cell on one host (another clone, another container on the
    same cache volume) share the build dir and environments: a second run waits
    here instead of rewriting them under the first.
    """
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with lock_file.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            report.say(f"waiting for another run that holds {what} ({lock_file})")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# --- steps ---------------------------------------------------------------------------------------


def env_key(job: Job) -> str:
    """A key for the cached environment: the interpreter and what the env holds."""
    content = {
        "python": sys.version,
        "base_prefix": sys.base_prefix,
        "torch": job.torch_requirement,
        "groups": job.groups,
        "wheelhouse": Path(job.wheelhouse).name,
    }
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]


def ensure_base_env(layout: Layout, env: Mapping[str, str], report: Reporter) -> Path:
    """The cached venv with torch and the groups, created now if no complete one exists."""
    base = layout.cache / "envs" / f"{layout.job.cell}-{env_key(layout.job)}"
    with locked(base.with_name(base.name + ".lock"), "the environment", report):
        return _ensure_base_env(layout, base, env, report)


def _ensure_base_env(layout: Layout, base: Path, env: Mapping[str, str], report: Reporter) -> Path:
    job = layout.job
    if (base / ENV_COMPLETE_MARKER).is_file():
        report.say(f"reusing environment {base} (same interpreter and wheelhouse)")
        return base
    if base.exists():
        report.say(f"removing incomplete environment {base}")
        shutil.rmtree(base)
    report.say(f"creating environment {base} from {layout.wheelhouse}")
    must_run([sys.executable, "-m", "venv", base], env, "creating the venv")
    offline = ["-m", "pip", "install", "--progress-bar", "off", "--no-index", "--find-links"]
    offline.append(str(layout.wheelhouse))
    must_run([venv_python(base), *offline, PIP_WITH_GROUPS], env, f"installing {PIP_WITH_GROUPS}")
    groups = [f"--group={layout.repo / 'pyproject.toml'}:{group}" for group in job.groups]
    must_run(
        [venv_python(base), *offline, job.torch_requirement, *groups],
        env,
        f"installing {job.torch_requirement} and the groups {', '.join(job.groups)}",
    )
    (base / ENV_COMPLETE_MARKER).write_text(job.to_json(), encoding="utf-8")
    return base


def create_run_venv(layout: Layout, base: Path, env: Mapping[str, str], report: Reporter) -> Path:
    """A fresh venv for this run that sees the base env's packages through a .pth file."""
    venv = layout.run_venv
    if venv.exists():
        shutil.rmtree(venv)
    must_run([sys.executable, "-m", "venv", "--without-pip", venv], env, "creating the run venv")
    (site_packages(venv) / "_fallback_matrix_base.pth").write_text(
        f"{site_packages(base)}\n", encoding="utf-8"
    )
    report.say(f"fresh venv {venv} on top of {base}")
    return venv


def in_env(venv: Path, env: Mapping[str, str], *args: str) -> dict[str, Any]:
    """``python -m fallback_matrix.versions ARGS`` in ``venv``: its JSON answer."""
    result = subprocess.run(
        [str(venv_python(venv)), "-m", "fallback_matrix.versions", *args],
        env=dict(env),
        cwd=PACKAGE_PARENT,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        print(result.stdout + result.stderr, flush=True)
        raise StepFailed(f"checking {args[0]} in {venv} failed; see the error above")
    answer: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return answer


def verify_torch(
    layout: Layout, venv: Path, env: Mapping[str, str], report: Reporter
) -> dict[str, Any]:
    job = layout.job
    info = in_env(venv, env, "torch", job.torch_version, job.expected_cuda or "-")
    version, cuda = str(info["version"]), info["cuda"]
    report.say(f"torch {version}, torch.version.cuda={cuda!r}, from {info['file']}")
    if not info["matches"]:
        raise StepFailed(
            f"cell {job.cell}: WRONG TORCH: wanted torch {job.torch_version}, "
            f"{describe_build(job.expected_cuda)}; "
            f"got torch {version} with torch.version.cuda={cuda!r}. The wheelhouse "
            f"{layout.wheelhouse} holds the wrong build: delete it and run again, or check "
            "the variant's index (matrix.yaml variants, --index-url)"
        )
    return info


def sync_sources(layout: Layout, report: Reporter) -> None:
    """Copy the listed files into the build dir, keeping mtimes; remove files no longer listed."""
    job, dest = layout.job, layout.build_dir
    dest.mkdir(parents=True, exist_ok=True)
    manifest = dest / SOURCES_MANIFEST
    previous = (
        set(json.loads(manifest.read_text(encoding="utf-8"))) if manifest.is_file() else set()
    )
    copied = 0
    for relative in job.sources:
        source, target = layout.repo / relative, dest / relative
        try:
            wanted = source.stat()
        except FileNotFoundError:
            continue
        try:
            have = target.stat()
            same = have.st_size == wanted.st_size and have.st_mtime_ns == wanted.st_mtime_ns
        except FileNotFoundError:
            same = False
        if not same:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.unlink(missing_ok=True)
            shutil.copy2(source, target)
            target.chmod(target.stat().st_mode | 0o200)
            copied += 1
    removed = previous - set(job.sources)
    for relative in removed:
        (dest / relative).unlink(missing_ok=True)
    manifest.write_text(json.dumps(sorted(job.sources)), encoding="utf-8")
    # setuptools never empties its staging dirs: stale files there would end up in the wheel.
    for stale in [*dest.glob("build/lib*"), *dest.glob("build/bdist*")]:
        shutil.rmtree(stale, ignore_errors=True)
    report.say(
        f"{dest}: {copied} file(s) copied, {len(job.sources) - copied} unchanged, "
        f"{len(removed)} removed; build/ kept for ninja"
    )


def build_env(
    layout: Layout, base: Path, env: Mapping[str, str], report: Reporter
) -> dict[str, str]:
    """PATH with ccache's compiler wrappers and the venvs' tools (ninja) first; ccache settings."""
    path = [str(layout.run_venv / "bin"), str(base / "bin"), env.get("PATH", os.defpath)]
    build = dict(env)
    if shutil.which("ccache", path=env.get("PATH")):
        if CCACHE_WRAPPERS.is_dir():
            path.insert(0, str(CCACHE_WRAPPERS))
        layout.ccache_dir.mkdir(parents=True, exist_ok=True)
        build.update(
            CCACHE_DIR=str(layout.ccache_dir),
            CCACHE_BASEDIR=str(layout.build_dir),
            CCACHE_NOHASHDIR="1",
        )
        build.setdefault("CCACHE_MAXSIZE", "5G")
        report.say(f"ccache on: {CCACHE_WRAPPERS} first on PATH, CCACHE_DIR={layout.ccache_dir}")
    else:
        report.say("ccache not found: builds are not cached (apt-get install ccache)")
    build["PATH"] = os.pathsep.join(path)
    build.setdefault("MAX_JOBS", str(os.cpu_count() or 1))
    return build


def build_wheel(layout: Layout, env: Mapping[str, str]) -> Path:
    if layout.dist.exists():
        shutil.rmtree(layout.dist)
    if shutil.which("ccache", path=env.get("PATH")) and "CCACHE_DIR" in env:
        run(["ccache", "-z"], env)  # the statistics printed at the end are this build's
    must_run(
        [
            venv_python(layout.run_venv),
            "-m",
            "pip",
            "wheel",
            "--no-build-isolation",
            "--no-deps",
            "--no-index",
            "-v",
            "-w",
            layout.dist,
            layout.build_dir,
        ],
        env,
        "building the wheel",
    )
    wheels = sorted(layout.dist.glob("*.whl"))
    if len(wheels) != 1:
        raise StepFailed(f"expected one wheel in {layout.dist}, found {[w.name for w in wheels]}")
    return wheels[0]


def check_torch_pin(layout: Layout, wheel: Path, torch_version: str, env: Mapping[str, str]) -> str:
    """The wheel must require exactly the torch release it was built against."""
    answer = in_env(layout.run_venv, env, "wheel", str(wheel), torch_version)
    if not answer["matches"]:
        pins = answer["pins"] or "no torch requirement"
        raise StepFailed(
            f"{wheel.name} declares {pins}, but it was built against torch {torch_version} "
            f"and only loads under that release: its metadata must say Requires-Dist: "
            f"{answer['wanted']} (setup.py, distribution_metadata)"
        )
    return str(answer["wanted"])


def repair_wheel(
    layout: Layout, wheel: Path, torch_libraries: Sequence[str], env: Mapping[str, str]
) -> tuple[Path, str]:
    """auditwheel repair to the most compatible manylinux tag; torch's own libraries excluded.

    torch's libraries come with the torch wheel the user installs (and this wheel
    pins): bundling copies of them would load a second libtorch. Returns the
    repaired wheel and what ``auditwheel show`` says about it.
    """
    out = layout.work / "repaired"
    if out.exists():
        shutil.rmtree(out)
    excludes = sorted({*TORCH_LIBRARY_PATTERNS, *torch_libraries})
    must_run(
        [
            venv_python(layout.run_venv),
            "-m",
            "auditwheel",
            "repair",
            *(f"--exclude={name}" for name in excludes),
            "--wheel-dir",
            out,
            wheel,
        ],
        env,
        "auditwheel repair",
    )
    repaired = sorted(out.glob("*.whl"))
    if len(repaired) != 1:
        raise StepFailed(f"auditwheel repair left {[w.name for w in repaired]} in {out}")
    show = subprocess.run(
        [str(venv_python(layout.run_venv)), "-m", "auditwheel", "show", str(repaired[0])],
        env=dict(env),
        capture_output=True,
        text=True,
        check=False,
    )
    report = (
        f"auditwheel repair, excluding {', '.join(excludes)}: {repaired[0].name}\n"
        "(auditwheel show cannot see those exclusions: it calls the unbundled torch "
        "libraries unresolved, hence linux_x86_64; the symbol versions below set the tag)\n"
        + (show.stdout + show.stderr).strip()
    )
    print(report, flush=True)
    if show.returncode != 0 or "manylinux" not in repaired[0].name:
        raise StepFailed(f"auditwheel show failed on {repaired[0].name}; see above")
    return repaired[0], report


def platform_tag(wheel: Path) -> str:
    """torch_fallback-0.1.0-cp311-cp311-manylinux_2_35_x86_64.whl -> manylinux_2_35_x86_64."""
    return wheel.name.removesuffix(".whl").split("-")[-1]


def install_wheel(
    layout: Layout, wheel: Path | None, env: Mapping[str, str], report: Reporter
) -> None:
    """Install ``wheel``, or (wheel None) the job's requirement from its package index."""
    job = layout.job
    if wheel is not None:
        source = ["--no-index", "--no-deps", "--force-reinstall", str(wheel)]
        what = f"installing {wheel.name}"
    else:
        assert job.index_url and job.requirement
        source = [
            "--index-url",
            job.index_url,
            "--find-links",
            str(layout.wheelhouse),
            "--no-cache-dir",
            str(job.requirement),
        ]
        what = f"installing {job.requirement} from {job.index_url}"
        report.say(f"{what}; its dependencies from the environment and the wheelhouse")
    must_run(
        [venv_python(layout.run_venv), "-m", "pip", "install", "--progress-bar", "off", *source],
        env,
        what,
    )
    layout.test_cwd.mkdir(parents=True, exist_ok=True)
    probe = "import importlib.util; print(importlib.util.find_spec('torch_fallback').origin)"
    result = subprocess.run(
        [str(venv_python(layout.run_venv)), "-c", probe],
        env=dict(env),
        cwd=layout.test_cwd,
        capture_output=True,
        text=True,
        check=False,
    )
    origin = result.stdout.strip()
    if result.returncode != 0 or not origin.startswith(str(layout.run_venv)):
        raise StepFailed(
            f"torch_fallback resolves to {origin or result.stderr.strip()!r}, not to the wheel "
            f"installed in {layout.run_venv}"
        )
    report.say(f"tests will import torch_fallback from {origin}")


def run_tests(layout: Layout, env: Mapping[str, str], report: Reporter) -> None:
    job = layout.job
    test_env = dict(env)
    if job.require_gpu:
        test_env["TORCH_FALLBACK_REQUIRE_GPU"] = "1"
    paths = [layout.repo / path for path in job.test_paths]
    missing = [str(path) for path in paths if not path.exists()]
    if missing:
        raise StepFailed(
            f"test paths missing from the repository: {', '.join(missing)} "
            "(matrix.yaml tests.paths)"
        )
    layout.artifacts.mkdir(parents=True, exist_ok=True)
    status = run(
        [
            venv_python(layout.run_venv),
            "-m",
            "pytest",
            *paths,
            "-m",
            job.test_markers,
            "--rootdir",
            layout.repo,
            "-p",
            "no:cacheprovider",
            "--junitxml",
            layout.artifacts / "junit.xml",
            "-o",
            f"junit_suite_name={job.cell}",
        ],
        test_env,
        cwd=layout.test_cwd,
    )
    if status == 0:
        return
    if status == PYTEST_NO_TESTS:
        if job.allow_empty:
            report.say(
                f"no test selected by -m {job.test_markers!r}: "
                "allowed for this cell (tests.allow_empty)"
            )
            return
        raise StepFailed(
            f"no test selected by -m {job.test_markers!r} in {', '.join(job.test_paths)}; "
            "if that is "
            "intended, set tests.allow_empty: true for this cell in matrix.yaml"
        )
    raise StepFailed(f"pytest failed (exit status {status}); see the failures above and junit.xml")


def run_example(layout: Layout, env: Mapping[str, str], report: Reporter) -> None:
    """Build the third-party example backend against the installed wheel; run its tests."""
    job = layout.job
    source = layout.repo / job.example
    if not (source / "pyproject.toml").is_file() and not (source / "setup.py").is_file():
        raise StepFailed(
            f"{job.example} is missing from this checkout (no pyproject.toml or setup.py in "
            f"{source}): every cell builds that example backend against the installed "
            "torch-fallback wheel and runs its tests. Restore the directory from the "
            "repository; a cell never skips it"
        )
    build = layout.work / "example"
    if build.exists():
        shutil.rmtree(build)
    shutil.copytree(source, build, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    must_run(
        [
            venv_python(layout.run_venv),
            "-m",
            "pip",
            "install",
            "--progress-bar",
            "off",
            "--no-build-isolation",
            "--no-index",
            "--find-links",
            layout.wheelhouse,
            build,
        ],
        env,
        f"pip install --no-build-isolation {job.example}",
    )
    tests = build / "tests"
    if not tests.is_dir():
        raise StepFailed(f"{job.example} has no tests/ directory; the cell runs its tests")
    results = layout.artifacts / "example"
    results.mkdir(parents=True, exist_ok=True)
    status = run(
        [
            venv_python(layout.run_venv),
            "-m",
            "pytest",
            tests,
            "--rootdir",
            build,
            "-p",
            "no:cacheprovider",
            "--junitxml",
            results / "junit.xml",
            "-o",
            f"junit_suite_name={job.cell}/example",
        ],
        env,
        cwd=layout.test_cwd,
    )
    if status != 0:
        raise StepFailed(
            f"the tests of {job.example} failed (pytest exit status {status}); see above"
        )
    report.say(f"{job.example}: built against the installed wheel, tests passed")


def ccache_stats(env: Mapping[str, str]) -> None:
    if shutil.which("ccache", path=env.get("PATH")) and "CCACHE_DIR" in env:
        run(["ccache", "-s"], env)


# --- main ----------------------------------------------------------------------------------------


def execute(job: Job) -> int:
    layout = Layout(job)
    report = Reporter(cell=job.cell)
    status: dict[str, object] = {"cell": job.cell, "result": "failed", "steps": report.steps}
    env = hermetic_env(layout)
    build = env
    layout.work.mkdir(parents=True, exist_ok=True)
    layout.artifacts.mkdir(parents=True, exist_ok=True)
    os.chdir(layout.work)  # started from the (read-only) package source; work elsewhere
    wheel: Path | None = None
    try:
        with report.step("environment", STEPS):
            base = ensure_base_env(layout, env, report)
            venv = create_run_venv(layout, base, env, report)
        with report.step("verify torch", STEPS):
            torch_info = verify_torch(layout, venv, env, report)
            libraries = list(torch_info.pop("libraries", None) or [])
            torch_info.pop("matches", None)
            status["torch"] = torch_info
        build = build_env(layout, base, env, report)
        if job.prebuilt_wheel:
            wheel = Path(job.prebuilt_wheel)
            report.say(f"testing the prebuilt wheel {wheel}: steps sources to repair skipped")
        elif job.index_url:
            report.say(f"installing {job.requirement} from {job.index_url}: no build")
        else:
            if job.plain_version:
                build[PLAIN_VERSION_ENV] = "1"
            build_lock = layout.build_dir.with_name(layout.build_dir.name + ".lock")
            with locked(build_lock, "the build dir", report):
                with report.step("sources", STEPS):
                    sync_sources(layout, report)
                with report.step("build", STEPS):
                    built = build_wheel(layout, build)
                    status["requires"] = check_torch_pin(
                        layout, built, str(torch_info["version"]), build
                    )
                    report.say(f"{built.name}: Requires-Dist: {status['requires']}")
            with report.step("repair", STEPS):
                wheel, shown = repair_wheel(layout, built, libraries, build)
                (layout.artifacts / "auditwheel.txt").write_text(shown + "\n", encoding="utf-8")
                status["platform"] = platform_tag(wheel)
        with report.step("install", STEPS):
            install_wheel(layout, wheel, env, report)
        with report.step("tests", STEPS):
            run_tests(layout, env, report)
        with report.step("example", STEPS):
            run_example(layout, build, report)
        with report.step("artifacts", STEPS):
            if wheel is not None:
                shutil.copy2(wheel, layout.artifacts / wheel.name)
                status["wheel"] = wheel.name
                report.say(f"{wheel.name} -> {layout.artifacts}")
            ccache_stats(build)
        status["result"] = "passed"
    except StepFailed as error:
        failed = next((s["name"] for s in report.steps if s["status"] == "failed"), "?")
        status["failed_step"] = failed
        status["error"] = str(error)
        ccache_stats(build)
        print(f"\n!!! [{job.cell}] FAILED at step {failed}: {error}", flush=True)
    finally:
        status["seconds"] = round(time.monotonic() - report.started, 1)
        (layout.artifacts / "result.json").write_text(
            json.dumps(status, indent=2) + "\n", encoding="utf-8"
        )
    if status["result"] == "passed":
        print(f"\n=== [{job.cell}] all steps passed in {report.elapsed()}", flush=True)
        return 0
    return 1


def main(argv: Sequence[str]) -> int:
    if len(argv) != 1:
        print(
            "usage: python -m fallback_matrix.cell_job JOB.json   (written by fallback_matrix)",
            file=sys.stderr,
        )
        return 2
    try:
        job = Job.from_json(Path(argv[0]).read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError) as error:
        print(f"cell_job: cannot read the job file {argv[0]}: {error}", file=sys.stderr)
        return 2
    print(
        f"cell {job.cell}: python {sysconfig.get_python_version()} at {sys.executable}", flush=True
    )
    return execute(job)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
