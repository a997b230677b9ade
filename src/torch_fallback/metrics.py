"""Per-op metrics of the fallback: calls per target, time, bytes moved."""

from __future__ import annotations

from dataclasses import dataclass

from ._extension import ops


@dataclass(frozen=True)
class OpMetrics:
    calls_cpu: int
    calls_cuda: int
    errors: int
    time_ns: int
    bytes_to_target: int
    bytes_from_target: int
    calls_unboxed: int  # of the calls, those an unboxed kernel served (DirectKernel)

    @property
    def calls(self) -> int:
        return self.calls_cpu + self.calls_cuda


def metrics() -> dict[str, OpMetrics]:
    """A snapshot, keyed by op name ("aten::add.Tensor")."""
    names, values = ops.metrics()  # values: per op, one value per field, in field order
    fields = ops.metrics_fields()
    rows = [values[start : start + len(fields)] for start in range(0, len(values), len(fields))]
    return {
        op: OpMetrics(**dict(zip(fields, row, strict=True)))
        for op, row in zip(names, rows, strict=True)
    }


def reset_metrics() -> None:
    ops.reset_metrics()


def metrics_report(snapshot: dict[str, OpMetrics] | None = None) -> str:
    """A readable table, the most time-consuming ops first."""
    snapshot = metrics() if snapshot is None else snapshot
    header = ("op", "cpu", "cuda", "errors", "ms", "MB to target", "MB back")
    rows = [
        (
            op,
            str(m.calls_cpu),
            str(m.calls_cuda),
            str(m.errors),
            f"{m.time_ns / 1e6:.3f}",
            f"{m.bytes_to_target / 1e6:.3f}",
            f"{m.bytes_from_target / 1e6:.3f}",
        )
        for op, m in sorted(snapshot.items(), key=lambda item: -item[1].time_ns)
    ]
    if not rows:
        return "no op has gone through the fallback"
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


__all__ = ["OpMetrics", "metrics", "metrics_report", "reset_metrics"]
