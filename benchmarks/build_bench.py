"""What a matrix run costs, cold and warm: `nox -s build-cpu` with each runner.

Runs in a scratch clone of this repository, so the working tree is untouched:

    python benchmarks/build_bench.py --json build.json

Scenarios, in order: docker-cold (caches removed first: image, cache volume,
wheelhouses), docker-warm (nothing changed), docker-touch (one C++ file edited),
then the same three for the local runner. For each: wall time, the cell's step
times, whether the image was built, how many translation units ninja compiled
and how many of those ccache served. WARNING: docker-cold removes this
machine's fallback-matrix images and cache volume. --json writes every scenario's
figures and the host.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness

REPO = Path(__file__).resolve().parents[1]
CELL = "cpu"
TOUCHED = Path("src/torch_fallback/csrc/metrics.cpp")


def run_cell(clone: Path, runner: str) -> dict:
    start = time.perf_counter()
    completed = subprocess.run(
        ["nox", "-s", f"build-{CELL}", "--", "--runner", runner],
        cwd=clone,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - start
    artifacts = clone / "artifacts" / CELL
    log = (artifacts / "cell.log").read_text() if (artifacts / "cell.log").exists() else ""
    status = (
        json.loads((artifacts / "result.json").read_text())
        if (artifacts / "result.json").exists()
        else {}
    )
    hits = re.search(r"Hits:\s+(\d+)\s*/\s*(\d+)", log)
    return {
        "ok": completed.returncode == 0,
        "seconds": round(seconds, 1),
        "steps": {step["name"]: step["seconds"] for step in status.get("steps", [])},
        "image_built": bool(re.search(r"image \S+: built", log)),
        "wheelhouse_filled": "wheelhouse: complete at" in log,
        "translation_units_compiled": len(re.findall(r"^\s*\[\d+/\d+\] .*c\+\+ ", log, re.M)),
        "ccache_hits": int(hits.group(1)) if hits else None,
        "ccache_calls": int(hits.group(2)) if hits else None,
        "tail": "" if completed.returncode == 0 else (completed.stdout + completed.stderr)[-2000:],
    }


def touch_one_file(clone: Path) -> None:
    path = clone / TOUCHED
    path.write_text(path.read_text() + f"\n// edited by build_bench at {time.time()}\n")


def clean_caches(clone: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "fallback_matrix", "clean", "--caches"],
        cwd=clone,
        env={"PYTHONPATH": str(clone / "src"), "PATH": "/usr/bin:/bin"},
        check=False,
        capture_output=True,
    )
    shutil.rmtree(clone / ".cache", ignore_errors=True)


def render(results: dict[str, dict]) -> str:
    head = (
        f"{'scenario':<14} {'ok':<3} {'wall s':>7} {'image':>6} {'wheels':>6} {'env s':>6} "
        f"{'build s':>8} {'tests s':>8} {'TUs':>4} {'ccache':>8}"
    )
    lines = [head, "-" * len(head)]
    for name, r in results.items():
        steps = r["steps"]
        hits = f"{r['ccache_hits']}/{r['ccache_calls']}" if r["ccache_calls"] is not None else "-"
        lines.append(
            f"{name:<14} {'yes' if r['ok'] else 'NO':<3} {r['seconds']:>7.1f} "
            f"{'built' if r['image_built'] else '-':>6} "
            f"{'filled' if r['wheelhouse_filled'] else '-':>6} {steps.get('environment', 0):>6.1f} "
            f"{steps.get('build', 0):>8.1f} {steps.get('tests', 0):>8.1f} "
            f"{r['translation_units_compiled']:>4} {hits:>8}"
        )
    for runner in ("docker", "local"):
        cold, warm = results.get(f"{runner}-cold"), results.get(f"{runner}-warm")
        if cold and warm and cold["seconds"]:
            lines.append(f"{runner}: warm/cold = {warm['seconds'] / cold['seconds']:.0%}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runners", nargs="*", default=["docker", "local"])
    harness.add_output_options(parser, raw=False)
    args = parser.parse_args(argv)

    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="build-bench-") as scratch:
        clone = Path(scratch) / "repo"
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
        # nox installs the noxfile's own dependencies once; keep that out of the timings.
        subprocess.run(["nox", "-l"], cwd=clone, check=True, capture_output=True)
        for runner in args.runners:
            clean_caches(clone)
            for scenario in ("cold", "warm", "touch"):
                if scenario == "touch":
                    touch_one_file(clone)
                results[f"{runner}-{scenario}"] = run_cell(clone, runner)
                print(
                    f"{runner}-{scenario}: {results[f'{runner}-{scenario}']['seconds']} s",
                    flush=True,
                )
    harness.write_outputs(args, {**results, "host": harness.host_info()}, render(results))
    return 0 if all(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
