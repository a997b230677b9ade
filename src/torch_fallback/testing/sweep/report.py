"""Pass rates per phase and dtype, the categorized failure list, and the JSON document.

A task is one (entry, dtype, phase); an entry is one (entry, dtype): it passes when every
phase that ran passed, fails when any failed, and is skipped when no phase ran (the dtype
is unsupported in eager too, the op has no samples, ...). Rates leave skips out.

The JSON document holds the summary and every failed task; every task only when asked
(raw): thousands of passes say no more than the summary's counts.
"""

from __future__ import annotations

import collections
import json

from .check import SEVERITY
from .samples import DTYPES, PHASES


def entries(results: list[dict]) -> dict:
    """(entry, dtype) -> "pass" | "fail" | "skip"."""
    out: dict = {}
    for r in results:
        key = (r["entry"], r["dtype"])
        status = out.get(key, "skip")
        if r["status"] == "fail" or status == "fail":
            out[key] = "fail"
        elif r["status"] == "pass" or status == "pass":
            out[key] = "pass"
        else:
            out[key] = "skip"
    return out


def _rate(passed: int, failed: int) -> str:
    ran = passed + failed
    return f"{passed}/{ran} {passed / ran:6.1%}" if ran else "-"


def summarize(results: list[dict], meta: dict) -> dict:
    by_entry = entries(results)
    table = {}
    for dtype in [*DTYPES, "all"]:
        row = {}
        for phase in PHASES:
            counts = collections.Counter(
                r["status"] for r in results if r["phase"] == phase and dtype in ("all", r["dtype"])
            )
            row[phase] = {"pass": counts["pass"], "fail": counts["fail"], "skip": counts["skip"]}
        counts = collections.Counter(s for (_, d), s in by_entry.items() if dtype in ("all", d))
        row["entries"] = {"pass": counts["pass"], "fail": counts["fail"], "skip": counts["skip"]}
        table[dtype] = row
    failures = [r for r in results if r["status"] == "fail"]
    classes = collections.Counter(r["class"] for r in failures)
    categories: dict = {}
    for r in sorted(failures, key=lambda r: (-SEVERITY[r["class"]], r["entry"], r["dtype"])):
        key = f"{r['class']}/{r['category']}"
        slot = categories.setdefault(key, {"tasks": 0, "example": _line(r)})
        slot["tasks"] += 1
    skips = collections.Counter(r.get("category") for r in results if r["status"] == "skip")
    overall = table["all"]["entries"]
    ran = overall["pass"] + overall["fail"]
    return {
        **meta,
        "tasks": len(results),
        "entries": len(by_entry),
        "entries_passed": overall["pass"],
        "entries_failed": overall["fail"],
        "entries_skipped": overall["skip"],
        "entry_pass_rate": overall["pass"] / ran if ran else 0.0,
        "failure_classes": dict(classes),
        "failure_categories": categories,
        "skip_categories": dict(skips),
        "table": table,
    }


def _line(r: dict) -> str:
    sample = f" sample {r['sample']}" if r.get("sample") is not None else ""
    return f"{r['entry']} {r['dtype']} {r['phase']}{sample}: {r.get('detail') or ''}"[:240]


def render(summary: dict, results: list[dict]) -> str:
    mode = "self-test (reference stands in for relay)" if summary["self_test"] else "relay"
    if summary["perturb"]:
        mode += f", values perturbed ({summary['perturb']})"
    lines = [
        f"OpInfo sweep ({mode}): target={summary['target']} home={summary['home']} "
        f"reference={summary['reference']} eager, torch={summary['torch']}, "
        f"samples<={summary['samples']}",
        f"(op, dtype) entries: {summary['entries']}  passed: {summary['entries_passed']}  "
        f"failed: {summary['entries_failed']}  skipped: {summary['entries_skipped']}  "
        f"pass rate: {summary['entry_pass_rate']:.2%}",
        "failures by class: "
        + (
            ", ".join(
                f"{k} {v}"
                for k, v in sorted(
                    summary["failure_classes"].items(), key=lambda kv: -SEVERITY[kv[0]]
                )
            )
            or "none"
        ),
        "",
        "pass/ran per phase and dtype (skips left out):",
        f"{'dtype':<10} " + " ".join(f"{p:>18}" for p in [*PHASES, "entries"]),
    ]
    for dtype, row in summary["table"].items():
        cells = [_rate(row[p]["pass"], row[p]["fail"]) for p in [*PHASES, "entries"]]
        lines.append(f"{dtype:<10} " + " ".join(f"{c:>18}" for c in cells))
    if summary["failure_categories"]:
        lines += ["", f"{'failure class/category':<36} {'tasks':>5}  example"]
        for key, slot in summary["failure_categories"].items():
            lines.append(f"{key:<36} {slot['tasks']:>5}  {slot['example']}")
    if summary["skip_categories"]:
        lines += [
            "",
            "skipped (not failures): "
            + ", ".join(f"{k} {v}" for k, v in sorted(summary["skip_categories"].items())),
        ]
    failures = sorted(
        (r for r in results if r["status"] == "fail"),
        key=lambda r: (-SEVERITY[r["class"]], r["category"], r["entry"]),
    )
    if failures:
        lines += ["", "every failure (class/category  entry dtype phase sample: detail):"]
        lines += [f"  {r['class'] + '/' + r['category']:<36} {_line(r)}" for r in failures]
    lines += ["", f"{summary['seconds']} s"]
    return "\n".join(lines)


def document(summary: dict, results: list[dict], raw: bool = False) -> dict:
    """The JSON document: the summary, every failed task and, with raw, every task."""
    out = {"summary": summary, "failures": [r for r in results if r["status"] == "fail"]}
    if raw:
        out["tasks"] = results
    return out


def dumps(value, width: int = 100) -> str:
    """JSON indented by one, with a task (an object in a list) or anything that fits in
    `width` columns on one line."""

    def render(value, indent: int, in_list: bool) -> str:
        flat = json.dumps(value, default=str)
        task = in_list and isinstance(value, dict)
        if not isinstance(value, (dict, list)) or not value or task or indent + len(flat) <= width:
            return flat
        pad = " " * (indent + 1)
        if isinstance(value, dict):
            items = [
                f"{pad}{json.dumps(str(k))}: {render(v, indent + 1, False)}"
                for k, v in value.items()
            ]
            return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
        items = [pad + render(v, indent + 1, True) for v in value]
        return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"

    return render(value, 0, False) + "\n"
