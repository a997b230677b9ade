"""Per-component instruction counts from a callgrind output file (for overhead_profile.py).

The file is read directly, not through callgrind_annotate: its caller -> callee
records give the inclusive cost of each call, so a component's cost can be taken
as what its functions cost when entered from outside the component, and
components nested in one another are counted once.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

# A component: (key, parent key, description, regular expressions of function names).
Component = tuple[str, str | None, str, list[str]]


def parse_callgrind(path: Path) -> tuple[int, dict[str, int], dict[tuple[str, str], int]]:
    """Total Ir, self Ir per function, inclusive Ir per (caller, callee) edge."""
    names: dict[str, str] = {}
    self_cost: dict[str, int] = defaultdict(int)
    edges: dict[tuple[str, str], int] = defaultdict(int)
    fn = callee = ""
    pending_call = False
    total = 0
    name_line = re.compile(r"^(c?fn)=(?:\((\d+)\))?\s*(.*)$")
    for line in path.read_text(errors="replace").splitlines():
        match = name_line.match(line)
        if match:
            kind, ident, name = match.groups()
            if ident is not None:
                name = names.setdefault(ident, name) if name else names.get(ident, ident)
            if kind == "fn":
                fn = name
            else:
                callee = name
        elif line.startswith("calls="):
            pending_call = True
        elif line[:1].isdigit() or line[:1] in "+-*":
            parts = line.split()
            cost = int(parts[1]) if len(parts) > 1 else 0
            if pending_call:
                edges[(fn, callee)] += cost
                pending_call = False
            else:
                self_cost[fn] += cost
        elif line.startswith(("summary:", "totals:")):
            total = max(total, int(line.split()[1]))
    return total, self_cost, edges


def entered_cost(patterns: list[str], edges: dict) -> tuple[int, list[str]]:
    """Ir of the calls into functions matching `patterns` from functions that do not."""
    functions = {f for edge in edges for f in edge}
    regexes = [re.compile(p) for p in patterns]
    matched = {f for f in functions if any(r.search(f) for r in regexes)}
    cost = sum(c for (caller, callee), c in edges.items()
               if callee in matched and caller not in matched)  # fmt: skip
    return cost, sorted(matched)


def component_tree(total: int, edges: dict, calls: int, components: list[Component]) -> list:
    """Rows with inclusive and exclusive Ir per call; the root "python" is the whole loop.

    exclusive = inclusive minus the inclusive costs of the components directly inside
    (through absent ones), so the exclusive costs add up to the total.
    """
    rows = [{"key": "python", "parent": None, "what": "Python interpreter (the loop, the call)",
             "inclusive": total / calls, "functions": []}]  # fmt: skip
    for key, parent, what, patterns in components:
        cost, found = entered_cost(patterns, edges)
        rows.append({"key": key, "parent": parent, "what": what, "inclusive": cost / calls,
                     "functions": found})  # fmt: skip
    by_key = {row["key"]: row for row in rows}

    def nested(key: str) -> float:
        children = [r for r in rows if r["parent"] == key]
        return sum(r["inclusive"] if r["inclusive"] else nested(r["key"]) for r in children)

    for row in rows:
        row["exclusive"] = row["inclusive"] - nested(row["key"]) if row["inclusive"] else 0.0
        row["depth"] = by_key[row["parent"]]["depth"] + 1 if row["parent"] else 0
    return rows
