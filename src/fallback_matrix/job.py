"""The job of one cell, in its container or on the host: ``python3 -m fallback_matrix.job JSON``
on a bare Python, this package and the wheelhouse's packaging wheel on its PYTHONPATH.
"""

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from packaging.metadata import Metadata
from packaging.version import Version

from fallback_matrix.cache import in_use, prune
from fallback_matrix.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, StepFailed
from fallback_matrix.report import RESULT_FILE, Reporter, run_process, without_pip_config

STEPS = (
    *("environment", "verify torch", "sources", "build", "repair", "install", "tests"),
    *("example", "artifacts"),
)
GROUPS = ("build", "test", "models")  # the dependency groups of pyproject.toml a cell installs
PIP_WITH_GROUPS = "pip>=25.1"  # pip installs dependency groups (--group) since 25.1
PLAIN_VERSION_ENV = "TORCH_FALLBACK_PLAIN_VERSION"  # setup.py: no local version label (PyPI)
TORCH_LIBRARY_PATTERNS = ("libtorch*.so*", "libc10*.so*", "libshm*.so*")
CCACHE_WRAPPERS = Path("/usr/lib/ccache")
PYTEST_NO_TESTS = 5
WHEELHOUSE_MANIFEST = "wheelhouse.json"  # what a complete wheelhouse holds (wheelhouse.py)
XDIST_DISTRIBUTION = "loadgroup"
TORCH_PROBE = "import json,torch as t; print(json.dumps((t.__version__,t.version.cuda,t.__file__)))"
Command = Sequence[str | Path]


@dataclass(frozen=True)
class Job:
    """What the host asks of one cell, as JSON; paths are as seen where the job runs."""

    cell: str
    python: str
    torch: str  # the pinned version, e.g. "2.13.0+cpu"
    cuda: str | None  # the CUDA major torch.version.cuda must have; None: a CPU-only build
    test_paths: list[str]
    test_markers: str
    gpu: bool  # the tests need a GPU: TORCH_FALLBACK_REQUIRE_GPU=1, a missing one fails them
    sources: list[str]
    repo: str
    wheelhouse: str
    cache: str
    work: str
    artifacts: str
    dockerfile: str = "docker/Dockerfile"
    base_image: str = "python:3.11-slim-bookworm"
    gpus: bool = False  # pass the host's GPUs into the container
    example: str = "examples/third_party_backend"
    pypi: bool = False  # the build PyPI gets: no local version label
    prebuilt_wheel: str | None = None  # set: install and test this wheel, build nothing
    index_url: str | None = None  # set: install `requirement` from this index, build nothing
    requirement: str | None = None
    cache_cap: int | None = None  # bytes the cached environments may take; None: no pruning
    test_workers: str = "0"  # pytest-xdist's -n: "auto", a number; "0": no xdist

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @property
    def build_dir(self) -> Path:
        """Fixed per cell, so compiler command lines (and ccache keys) repeat across runs."""
        return Path(self.cache) / "build" / self.cell

    @property
    def run_venv(self) -> Path:
        return Path(self.work) / "venv"

    @property
    def test_cwd(self) -> Path:
        return Path(self.work) / "test-cwd"

    def venv(self, *args: str | Path) -> list[str | Path]:  # a command of the run venv's Python
        return [self.run_venv / "bin" / "python", *args]

    def pip(self, command: str, *args: str | Path) -> list[str | Path]:
        return self.venv("-m", "pip", command, "--progress-bar", "off", *args)


def run(command: Command, env: Mapping[str, str], cwd: Path | None = None) -> int:
    print(f"$ {' '.join(map(str, command))}", flush=True)
    return run_process(command, print, env=env, cwd=cwd)


def must_run(command: Command, env: Mapping[str, str], what: str) -> None:
    if (status := run(command, env)) != 0:
        raise StepFailed(f"{what} failed (exit status {status}); its output is above")


def capture(command: Command, **popen: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, **popen)


@contextmanager
def locked(lock_file: Path, what: str, report: Reporter) -> Iterator[None]:
    """Hold an exclusive lock: a second run of the same cell on this cache waits here."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with lock_file.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            report.say(f"waiting for another run that holds {what} ({lock_file})")
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield  # closing the file releases the lock


def site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"


def base_env(job: Job) -> Path:
    """The cached base venv of ``job``: named after its torch, its Python and a hash of what
    it holds, not after its cell, so that the cells which install the same (a cell, its cross
    job and its install from the release rehearsal's index) share one."""
    content = {"python": sys.version, "base_prefix": sys.base_prefix, "groups": list(GROUPS)}
    content |= {"torch": f"torch=={job.torch}", "wheelhouse": wheelhouse_identity(job)}
    key = hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    return Path(job.cache) / "envs" / f"torch-{job.torch.replace('+', '-')}-py{python}-{key}"


def wheelhouse_identity(job: Job) -> str:
    """What the job's wheelhouse holds: a hash of its manifest (the torch wheel, the
    dependency groups, every wheel's name), which a container's mount point does not say;
    without one, its name and the hash of the dependency groups' pyproject.toml."""
    manifest = Path(job.wheelhouse) / WHEELHOUSE_MANIFEST
    if manifest.is_file():
        return "manifest " + hashlib.sha256(manifest.read_bytes()).hexdigest()
    pyproject = Path(job.repo) / "pyproject.toml"
    text = pyproject.read_bytes() if pyproject.is_file() else b""
    return f"{Path(job.wheelhouse).name} {hashlib.sha256(text).hexdigest()}"


def create_envs(job: Job, env: Mapping[str, str], report: Reporter) -> Path:
    """The base venv with torch and the groups, cached by interpreter and wheelhouse; on top,
    a fresh run venv that sees its packages through a .pth file. Returns the base."""
    base = base_env(job)
    marker = base / ".fallback-matrix-complete"
    with locked(base.with_name(base.name + ".lock"), "the environment", report):
        if marker.is_file():
            report.say(f"reusing environment {base} (same interpreter and wheelhouse)")
        else:
            shutil.rmtree(base, ignore_errors=True)
            report.say(f"creating environment {base} from {job.wheelhouse}")
            must_run([sys.executable, "-m", "venv", base], env, "creating the venv")
            pip: list[str | Path] = [base / "bin" / "python", "-m", "pip", "install"]
            pip += ["--progress-bar", "off", "--no-index", "--find-links", job.wheelhouse]
            must_run([*pip, PIP_WITH_GROUPS], env, f"installing {PIP_WITH_GROUPS}")
            groups = [f"--group={job.repo}/pyproject.toml:{group}" for group in GROUPS]
            must_run([*pip, f"torch=={job.torch}", *groups], env, "installing torch and groups")
            marker.write_text(job.to_json(), encoding="utf-8")
    shutil.rmtree(job.run_venv, ignore_errors=True)
    must_run([sys.executable, "-m", "venv", "--without-pip", job.run_venv], env, "the run venv")
    pth = site_packages(job.run_venv) / "_fallback_matrix_base.pth"
    pth.write_text(f"{site_packages(base)}\n", encoding="utf-8")
    report.say(f"fresh venv {job.run_venv} on top of {base}")
    return base


def prune_envs(job: Job, base: Path, report: Reporter) -> None:
    """Keep the cached environments under the job's cap, least recently used pruned first;
    ``base``, this job's, is kept. A problem here is reported, never a failed step."""
    if job.cache_cap is None:
        report.say("cache cap off: cached environments are not pruned")
        return
    try:
        pruned = prune(base.parent, job.cache_cap, keep=[base], what="environments")
    except OSError as error:
        report.say(f"warning: pruning the environments in {base.parent} failed: {error}")
        return
    for line in pruned.lines():
        report.say(line)


def verify_torch(job: Job, env: Mapping[str, str], report: Reporter) -> dict[str, Any]:
    result = capture(job.venv("-c", TORCH_PROBE), env=env)
    if result.returncode != 0:
        raise StepFailed(f"torch does not import in {job.run_venv}:\n{result.stderr.strip()}")
    version, cuda, file = json.loads(result.stdout.strip().splitlines()[-1])
    report.say(f"torch {version}, torch.version.cuda={cuda!r}, from {file}")
    if not torch_matches(job.torch, version) or job.cuda != (cuda and str(Version(cuda).major)):
        build = f"a CUDA {job.cuda} build" if job.cuda else "a CPU-only build"
        raise StepFailed(
            f"cell {job.cell}: WRONG TORCH: wanted torch {job.torch}, {build}; got torch "
            f"{version} with torch.version.cuda={cuda!r}. The wheelhouse "
            f"{job.wheelhouse} holds the wrong build: delete it and run again, or check the "
            "variant's index (matrix.yaml variants, --index-url)"
        )
    libraries = sorted(name for name in os.listdir(Path(file).parent / "lib") if ".so" in name)
    return {"version": version, "cuda": cuda, "file": file, "libraries": libraries}


def sync_sources(job: Job, report: Reporter) -> None:
    """Copy the listed files into the build dir, keeping mtimes; remove files no longer listed."""
    dest, copied = job.build_dir, 0
    manifest = dest / ".fallback-matrix-sources.json"
    previous = set(json.loads(manifest.read_text(encoding="utf-8")) if manifest.is_file() else [])
    for relative in job.sources:
        source, target = Path(job.repo) / relative, dest / relative
        if not source.is_file():
            continue
        wanted, have = source.stat(), target.stat() if target.is_file() else None
        if have and (have.st_size, have.st_mtime_ns) == (wanted.st_size, wanted.st_mtime_ns):
            continue
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
    unchanged = len(job.sources) - copied
    report.say(f"{dest}: {copied} file(s) copied, {unchanged} unchanged, {len(removed)} removed")


def build_env(job: Job, base: Path, env: Mapping[str, str], report: Reporter) -> dict[str, str]:
    """PATH with ccache's compiler wrappers and the venvs' tools (ninja) first; ccache settings."""
    path = [str(job.run_venv / "bin"), str(base / "bin"), env.get("PATH", os.defpath)]
    build = dict(env, MAX_JOBS=env.get("MAX_JOBS", str(os.cpu_count() or 1)))
    if job.pypi:
        build[PLAIN_VERSION_ENV] = "1"
    if shutil.which("ccache", path=env.get("PATH")):
        ccache = Path(job.cache) / "ccache"
        build |= {"CCACHE_DIR": str(ccache), "CCACHE_BASEDIR": str(job.build_dir)}
        build |= {"CCACHE_NOHASHDIR": "1", "CCACHE_MAXSIZE": env.get("CCACHE_MAXSIZE", "5G")}
        if CCACHE_WRAPPERS.is_dir():
            path.insert(0, str(CCACHE_WRAPPERS))
        report.say(f"ccache on: {CCACHE_WRAPPERS} first on PATH, CCACHE_DIR={ccache}")
    else:
        report.say("ccache not found: builds are not cached (apt-get install ccache)")
    return build | {"PATH": os.pathsep.join(path)}


def one_wheel(directory: Path, what: str) -> Path:
    wheels = sorted(directory.glob("*.whl"))
    if len(wheels) != 1:
        raise StepFailed(f"{what} left {[w.name for w in wheels]} in {directory}, not one wheel")
    return wheels[0]


def build_wheel(job: Job, torch_version: str, env: Mapping[str, str]) -> tuple[Path, str]:
    """pip wheel of the build dir; it must pin exactly the torch release it was built against."""
    dist = Path(job.work) / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    if "CCACHE_DIR" in env:
        run(["ccache", "-z"], env)  # the statistics printed at the end are this build's
    wheel = job.pip("wheel", "--no-build-isolation", "--no-deps", "--no-index", "-v", "-w", dist)
    must_run([*wheel, job.build_dir], env, "building the wheel")
    built = one_wheel(dist, "pip wheel")
    pins, wanted = torch_pins(built), f"=={Version(torch_version).public}"
    if pins != [wanted]:
        raise StepFailed(
            f"{built.name} declares {pins or 'no torch requirement'}, but it was built against "
            f"torch {torch_version} and only loads under that release: its metadata must say "
            f"Requires-Dist: torch{wanted} (setup.py, distribution_metadata)"
        )
    return built, f"torch{wanted}"


def repair_wheel(
    job: Job, wheel: Path, torch_libraries: Sequence[str], env: Mapping[str, str]
) -> tuple[Path, str]:
    """auditwheel repair to a manylinux tag, torch's own libraries excluded (the torch wheel
    provides them: bundled copies would load a second libtorch); and auditwheel show."""
    out = Path(job.work) / "repaired"
    shutil.rmtree(out, ignore_errors=True)
    excludes = sorted({*TORCH_LIBRARY_PATTERNS, *torch_libraries})
    auditwheel = job.venv("-m", "auditwheel")
    options = [f"--exclude={name}" for name in excludes]
    must_run([*auditwheel, "repair", *options, "--wheel-dir", out, wheel], env, "auditwheel repair")
    repaired = one_wheel(out, "auditwheel repair")
    show = capture([*auditwheel, "show", repaired], env=env)
    shown = (
        f"auditwheel repair, excluding {', '.join(excludes)}: {repaired.name}\n"
        "(auditwheel show cannot see those exclusions: it calls the unbundled torch "
        "libraries unresolved, hence linux_x86_64; the symbol versions below set the tag)\n"
        + (show.stdout + show.stderr).strip()
    )
    print(shown, flush=True)
    if show.returncode != 0 or "manylinux" not in repaired.name:
        raise StepFailed(f"auditwheel show failed on {repaired.name}; see above")
    return repaired, shown + "\n" + audit_stable_abi(job, repaired, env)


def audit_stable_abi(job: Job, wheel: Path, env: Mapping[str, str]) -> str:
    """abi3audit: every extension of the wheel uses only the stable ABI its tag claims
    (cp310-abi3: one wheel for every CPython from 3.10 on)."""
    if "-abi3-" not in wheel.name:
        raise StepFailed(
            f"{wheel.name} is not tagged abi3: setup.py builds every extension with "
            "py_limited_api=True and tags the wheel through bdist_wheel's py_limited_api"
        )
    audit = capture(job.venv("-m", "abi3audit", "--strict", "--verbose", wheel), env=env)
    report = f"abi3audit --strict {wheel.name}\n" + (audit.stdout + audit.stderr).strip()
    print(report, flush=True)
    if audit.returncode != 0:
        raise StepFailed(
            f"abi3audit found symbols outside the stable ABI in {wheel.name}; see above"
        )
    return report


def install_wheel(job: Job, wheel: Path | None, env: Mapping[str, str], report: Reporter) -> None:
    """Install ``wheel``, or (wheel None) the job's requirement from its package index."""
    if wheel is not None:
        source: list[str | Path] = ["--no-index", "--no-deps", "--force-reinstall", wheel]
        what = f"installing {wheel.name}"
    else:
        source = ["--index-url", str(job.index_url), "--find-links", job.wheelhouse]
        source += ["--no-cache-dir", str(job.requirement)]
        what = f"installing {job.requirement} from {job.index_url}"
        report.say(f"{what}; its dependencies from the environment and the wheelhouse")
    must_run(job.pip("install", *source), env, what)
    job.test_cwd.mkdir(parents=True, exist_ok=True)
    probe = "import importlib.util; print(importlib.util.find_spec('torch_fallback').origin)"
    result = capture(job.venv("-c", probe), env=env, cwd=job.test_cwd)
    origin = result.stdout.strip()
    if result.returncode != 0 or not origin.startswith(str(job.run_venv)):
        raise StepFailed(
            f"torch_fallback resolves to {origin or result.stderr.strip()!r}, not to the wheel "
            f"installed in {job.run_venv}"
        )
    report.say(f"tests will import torch_fallback from {origin}")


def pytest_command(
    python: Command, paths: Sequence[Path], root: Path, junit: Path, name: str
) -> list[str | Path]:
    """pytest on ``paths`` without a cache in the (read-only) repository, with a JUnit report."""
    junit.parent.mkdir(parents=True, exist_ok=True)
    options: list[str | Path] = ["--rootdir", root, "-p", "no:cacheprovider", "--junitxml", junit]
    return [*python, "-m", "pytest", *paths, *options, "-o", f"junit_suite_name={name}"]


def xdist_options(workers: str) -> list[str]:
    """pytest-xdist's options for ``workers`` ("0": none, the tests run in the pytest process).
    Each test goes to the next free worker, but the tests of an xdist_group share one
    (--dist loadgroup): the model zoo's make their references once."""
    return [] if workers == "0" else ["-n", workers, "--dist", XDIST_DISTRIBUTION]


def run_tests(job: Job, env: Mapping[str, str]) -> None:
    paths = [Path(job.repo) / path for path in job.test_paths]
    if missing := [str(path) for path in paths if not path.exists()]:
        raise StepFailed(f"test paths missing: {', '.join(missing)} (matrix.yaml tests.paths)")
    junit = Path(job.artifacts) / "junit.xml"
    command = pytest_command(job.venv(), paths, Path(job.repo), junit, job.cell)
    command += ["-m", job.test_markers, *xdist_options(job.test_workers)]
    test_env = dict(env, TORCH_FALLBACK_REQUIRE_GPU="1") if job.gpu else dict(env)
    status = run(command, test_env, cwd=job.test_cwd)
    if status == PYTEST_NO_TESTS:
        raise StepFailed(
            f"no test selected by -m {job.test_markers!r} in {', '.join(job.test_paths)}: "
            "check the cell's tests.markers in matrix.yaml"
        )
    if status != 0:
        raise StepFailed(f"pytest failed (exit status {status}); see the failures above, junit.xml")


def run_example(job: Job, env: Mapping[str, str], report: Reporter) -> None:
    """Build the third-party example backend against the installed wheel; run its tests."""
    source = Path(job.repo) / job.example
    if not (source / "pyproject.toml").is_file() and not (source / "setup.py").is_file():
        raise StepFailed(
            f"{job.example} is missing from this checkout (no pyproject.toml or setup.py in "
            f"{source}): every cell builds that example backend against the installed "
            "torch-fallback wheel and runs its tests. Restore the directory from the "
            "repository; a cell never skips it"
        )
    build = Path(job.work) / "example"  # a copy: the repository is read-only in a container
    shutil.rmtree(build, ignore_errors=True)
    shutil.copytree(source, build, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    pip = job.pip("install", "--no-build-isolation", "--no-index", "--find-links", job.wheelhouse)
    must_run([*pip, build], env, f"pip install --no-build-isolation {job.example}")
    if not (build / "tests").is_dir():
        raise StepFailed(f"{job.example} has no tests/ directory; the cell runs its tests")
    junit = Path(job.artifacts) / "example" / "junit.xml"
    command = pytest_command(job.venv(), [build / "tests"], build, junit, f"{job.cell}/example")
    if (status := run(command, env, cwd=job.test_cwd)) != 0:
        raise StepFailed(f"the tests of {job.example} failed (pytest exit status {status})")
    report.say(f"{job.example}: built against the installed wheel, tests passed")


def run_steps(job: Job) -> int:
    """Every step of ``job``; result.json records them. 0 when all passed, else 1."""
    report = Reporter(cell=job.cell)
    result: dict[str, Any] = {"cell": job.cell, "result": "failed", "steps": report.steps}
    env = without_pip_config(os.environ) | {"PIP_NO_INPUT": "1", "PYTHONUNBUFFERED": "1"}
    env |= {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)  # the job's own: the cell's tools must not see this package
    env["PIP_CACHE_DIR"] = f"{job.cache}/pip"
    build, artifacts, wheel = env, Path(job.artifacts), None
    Path(job.work).mkdir(parents=True, exist_ok=True)
    artifacts.mkdir(parents=True, exist_ok=True)
    os.chdir(job.work)
    held = ExitStack()  # the environment this job uses, kept from pruning until it ends
    try:
        with report.step("environment", STEPS):
            held.enter_context(in_use(base_env(job)))
            base = create_envs(job, env, report)
            prune_envs(job, base, report)
        with report.step("verify torch", STEPS):
            result["torch"] = torch = verify_torch(job, env, report)
            libraries = torch.pop("libraries")
        build = build_env(job, base, env, report)
        if job.prebuilt_wheel:
            wheel = Path(job.prebuilt_wheel)
            report.say(f"testing the prebuilt wheel {wheel}: steps sources to repair skipped")
        elif job.index_url:
            report.say(f"installing {job.requirement} from {job.index_url}: no build")
        else:
            with locked(job.build_dir.with_suffix(".lock"), "the build dir", report):
                with report.step("sources", STEPS):
                    sync_sources(job, report)
                with report.step("build", STEPS):
                    built, result["requires"] = build_wheel(job, torch["version"], build)
                    report.say(f"{built.name}: Requires-Dist: {result['requires']}")
            with report.step("repair", STEPS):
                wheel, shown = repair_wheel(job, built, libraries, build)
                (artifacts / "auditwheel.txt").write_text(shown + "\n", encoding="utf-8")
                result["platform"] = wheel.name.removesuffix(".whl").split("-")[-1]
        with report.step("install", STEPS):
            install_wheel(job, wheel, env, report)
        with report.step("tests", STEPS):
            run_tests(job, env)
        with report.step("example", STEPS):
            run_example(job, build, report)
        with report.step("artifacts", STEPS):
            if wheel is not None:
                shutil.copy2(wheel, artifacts / wheel.name)
                result["wheel"] = wheel.name
                report.say(f"{wheel.name} -> {artifacts}")
        result["result"] = "passed"
        print(f"\n=== [{job.cell}] all steps passed in {report.elapsed()}", flush=True)
    except StepFailed as error:
        result["failed_step"] = next(s["name"] for s in report.steps if s["status"] == "failed")
        result["error"] = str(error)
        print(f"\n!!! [{job.cell}] FAILED at step {result['failed_step']}: {error}", flush=True)
    finally:
        held.close()
        if "CCACHE_DIR" in build:
            run(["ccache", "-s"], build)
        result["seconds"] = round(time.monotonic() - report.started, 1)
        (artifacts / RESULT_FILE).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return EXIT_OK if result["result"] == "passed" else EXIT_FAILED


def torch_matches(pin: str, version: str) -> bool:
    """Whether torch ``version`` is the pin: exactly when the pin has a label, else its release."""
    wanted, got = Version(pin), Version(version)
    return got == wanted if wanted.local is not None else got.public == wanted.public


def torch_pins(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        name = next((n for n in archive.namelist() if n.endswith(".dist-info/METADATA")), "")
        metadata = Metadata.from_email(archive.read(name) if name else b"", validate=False)
    return [str(r.specifier) for r in metadata.requires_dist or [] if r.name == "torch"]


def main(argv: Sequence[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m fallback_matrix.job JOB_JSON")
        return EXIT_USAGE
    try:
        job = Job(**json.loads(argv[0]))
    except (ValueError, TypeError) as error:  # TypeError: a missing or unknown key
        print(f"cannot read the job {argv[0][:200]}: {error}", file=sys.stderr)
        return EXIT_USAGE
    print(f"cell {job.cell}: python {sys.version.split()[0]} at {sys.executable}", flush=True)
    return run_steps(job)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
