"""Comparing the device under test with the reference, and naming every failure.

Failure classes, most severe first: crash, timeout, wrong-values (values, hidden-mutation,
grad-values, device, metadata, missing-error, inplace-identity), error (the op raised on
relay where eager did not; the category comes from the message). A task whose samples all
raise in eager too is skipped (eager-unsupported), not failed.
"""

from __future__ import annotations

import torch

SEVERITY = {"crash": 4, "timeout": 3, "wrong-values": 2, "error": 1}

# Error categories, most specific first: (category, test on the error message).
ERROR_CATEGORIES = [
    ("view-return", lambda m: "returns a view of its input" in m),
    ("nested", lambda m: "nested" in m.lower()),
    ("sparse", lambda m: "sparse" in m.lower()),
    ("quantized", lambda m: "quantiz" in m.lower() or "qint" in m.lower()),
    ("zero-tensor", lambda m: "ZeroTensor" in m or "zerotensor" in m.lower()),
    (
        "no-kernel-on-target",
        lambda m: (
            "has no CUDA kernel" in m
            or "DispatchStub: missing" in m
            or ("Could not run" in m and ("'CPU' backend" in m or "'CUDA' backend" in m))
        ),
    ),
    ("no-relay-kernel", lambda m: "Could not run" in m and ("PrivateUse1" in m or "relay" in m)),
    ("cuda-only-python-op", lambda m: "CUDAGuardImpl initialized with non-CUDA" in m),
    (
        "mixed-devices",
        lambda m: (
            "together with relay tensors" in m
            or "same device" in m
            or "Expected all tensors to be on the same" in m
        ),
    ),
    ("cpu-only-argument", lambda m: "to be on cpu" in m.lower() or "on CPU" in m),
    ("storage-or-data-ptr", lambda m: "data_ptr" in m or "storage" in m.lower()),
    ("dtype-not-implemented", lambda m: "not implemented for" in m),
    ("inplace-resize-refused", lambda m: "would change the shape of its in-place argument" in m),
    ("device-module-incomplete", lambda m: "module 'torch_fallback.relay' has no attribute" in m),
    ("internal-assert", lambda m: "INTERNAL ASSERT" in m),
]


def categorize(message: str) -> str:
    for name, matches in ERROR_CATEGORIES:
        if matches(message):
            return name
    return "other:" + message.split(":", 1)[0]


def default_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    return {
        torch.float16: (1e-3, 1e-5),
        torch.bfloat16: (1.6e-2, 1e-5),
        torch.float32: (1.3e-6, 1e-5),
        torch.complex64: (1.3e-6, 1e-5),
        torch.float64: (1e-7, 1e-7),
        torch.complex128: (1e-7, 1e-7),
    }.get(dtype, (0.0, 0.0))


def _describe(leaf: dict) -> str:
    if "plain" in leaf:
        return repr(leaf["plain"])
    quantized = " quantized" if leaf["quantized"] else ""
    return f"{leaf['device']} {leaf['dtype']}{quantized} {leaf['layout']} {list(leaf['shape'])}"


def compare_leaves(expected: list, actual: list, tol, values: bool, category: str):
    """None when actual matches expected, else (class, category, detail). tol: None for
    per-dtype defaults, (rtol, atol) for at least those, or "exact"; values=False checks
    metadata only."""
    if len(expected) != len(actual):
        return ("wrong-values", "metadata", f"{len(actual)} leaves, eager has {len(expected)}")
    for index, (want, got) in enumerate(zip(expected, actual, strict=True)):
        where = f"{category} #{index}"
        if ("plain" in want) != ("plain" in got):
            return (
                "wrong-values",
                "metadata",
                f"{where}: {_describe(got)}, eager {_describe(want)}",
            )
        if "plain" in want:
            if values and not _plain_equal(want["plain"], got["plain"], tol):
                return ("wrong-values", category, f"{where}: {got['plain']!r} != {want['plain']!r}")
            continue
        if want["device"] != got["device"]:
            return (
                "wrong-values",
                "device",
                f"{where}: on {got['device']}, eager's on {want['device']}",
            )
        for key in ("dtype", "shape", "layout", "quantized", "nested"):
            if want[key] != got[key]:
                return ("wrong-values", "metadata", f"{where}: {key} {got[key]}, eager {want[key]}")
        if "fetch_error" in got and "fetch_error" not in want:
            return (
                "error",
                categorize(got["fetch_error"]),
                f"{where}: reading the result back: {got['fetch_error']}",
            )
        if not values or "value" not in want or "value" not in got:
            continue
        if want.get("qparams") != got.get("qparams"):
            return (
                "wrong-values",
                "metadata",
                f"{where}: qparams {got.get('qparams')}, eager {want.get('qparams')}",
            )
        rtol, atol = default_tolerance(want["value"].dtype)
        if tol == "exact":
            rtol, atol = 0.0, 0.0
        elif tol is not None:
            rtol, atol = max(rtol, tol[0]), max(atol, tol[1])
        try:
            torch.testing.assert_close(
                got["value"],
                want["value"],
                rtol=rtol,
                atol=atol,
                equal_nan=True,
                check_device=False,
                check_stride=False,
            )
        except AssertionError as error:
            lines = [line.strip() for line in str(error).splitlines() if line.strip()]
            return ("wrong-values", category, f"{where}: " + " ".join(lines[:3])[:300])
    return None


def _plain_equal(want, got, tol) -> bool:
    if isinstance(want, float) and isinstance(got, float):
        if want != want and got != got:
            return True
        rtol, atol = (0.0, 0.0) if tol == "exact" else tol or (1.3e-6, 1e-5)
        return abs(want - got) <= atol + rtol * abs(want)
    return want == got


def compare_record(expected: dict, actual: dict, phase: str, tol, lenient: bool = False):
    """None when the sample passes, ("pass", note, detail) for a classified pass, else a
    failure (class, category, detail). lenient: the OpInfo says the op's output is
    nondeterministic, so values that differ with matching metadata are a classified pass."""
    if "error" in expected:
        if "error" in actual:
            return None
        return (
            "wrong-values",
            "missing-error",
            f"eager raised, relay did not: {expected['error']}",
        )
    if "error" in actual:
        return ("error", categorize(actual["error"]), actual["error"])
    if expected.get("not_differentiable") or actual.get("not_differentiable"):
        if expected.get("not_differentiable") != actual.get("not_differentiable"):
            return ("wrong-values", "metadata", "differentiable on one side only")
        return None
    kind = expected.get("determinism", "deterministic")
    values = kind in ("deterministic", "random")
    parts = [("out", "values"), ("args", "hidden-mutation")]
    if phase == "grad":
        parts.append(("grads", "grad-values"))
    for part, category in parts:
        failure = compare_leaves(
            expected.get(part, []), actual.get(part, []), tol, values, category
        )
        if (
            failure is not None
            and (kind == "random" or lenient)
            and failure[0] == "wrong-values"
            and compare_leaves(expected.get(part, []), actual.get(part, []), tol, False, category)
            is None
        ):
            return (
                "pass",
                f"{'random' if kind == 'random' else 'nondeterministic'}-metadata-only",
                failure[2],
            )
        if failure is not None:
            return failure
    if phase == "inplace" and expected.get("identity") and not actual.get("identity"):
        return ("wrong-values", "inplace-identity", "the in-place variant did not return self")
    if kind != "deterministic":
        return ("pass", f"{kind}-metadata-only" if not values else kind, None)
    return None
