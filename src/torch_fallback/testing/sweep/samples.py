"""OpInfo lookup, deterministic samples, moving them to a device and reading results back.

Samples are always generated on the CPU from a seed derived from (entry, dtype, phase), so
the reference worker and the test worker, two separate processes, build identical samples;
a fingerprint of each sample travels with the reference results to prove it.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import random
import zlib

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "complex64": torch.complex64,
    "int64": torch.int64,
    "bool": torch.bool,
}
PHASES = ("forward", "grad", "inplace")

# Ops whose results are uninitialized memory (or partly so): only metadata is comparable.
UNDEFINED_VALUES = (
    "empty",
    "new_empty",
    "new_empty_strided",
    "empty_strided",
    "empty_like",
    "empty_permuted",
    "resize_",
    "resize_as_",
)

# Outputs (by index among the flattened outputs) whose values are not comparable: the
# attention kernels' philox seed and offset, uninitialized memory without dropout and the
# generator's state with it.
UNDEFINED_OUTPUTS = {
    "torch.ops.aten._flash_attention_forward": (2, 3),
    "torch.ops.aten._efficient_attention_forward": (2, 3),
}


def drop_undefined_values(op_name: str, leaves: list[dict]) -> list[dict]:
    """``leaves`` (fetched outputs) without the values of outputs that are uninitialized
    memory; their metadata is still compared."""
    undefined = UNDEFINED_OUTPUTS.get(op_name, ())
    return [
        {key: value for key, value in leaf.items() if key != "value"} if i in undefined else leaf
        for i, leaf in enumerate(leaves)
    ]


# Plain values a result may hold besides tensors; anything else is kept as its repr.
PLAIN = (int, float, bool, complex, str, type(None))


def entry_name(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


@functools.cache
def op_index() -> dict:
    from torch.testing._internal.common_methods_invocations import op_db

    return {entry_name(op): op for op in op_db}


def list_tasks(reference: str, ops: list[str] | None, dtypes: list[str], phases: list[str]):
    """(entry, dtype, phase) triples: every OpInfo entry and dtype it supports on the
    reference device; grad only in float64 for ops with autograd; inplace where a variant
    exists."""
    tasks = []
    for name, op in op_index().items():
        if ops and name not in ops and op.name not in ops:
            continue
        supported = op.supported_dtypes(reference)
        for dtype_name in dtypes:
            if DTYPES[dtype_name] not in supported:
                continue
            if "forward" in phases:
                tasks.append((name, dtype_name, "forward"))
            if (
                "grad" in phases
                and dtype_name == "float64"
                and op.supports_autograd
                and torch.float64 in op.supported_backward_dtypes(reference)
            ):
                tasks.append((name, dtype_name, "grad"))
            if "inplace" in phases and op.inplace_variant is not None:
                tasks.append((name, dtype_name, "inplace"))
    return tasks


def seed_for(*parts: str) -> int:
    return zlib.crc32("/".join(parts).encode())


def reseed(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    try:
        import numpy

        numpy.random.seed(seed % 2**32)
    except ImportError:
        pass


def _generate(op, device: str, dtype: torch.dtype, requires_grad: bool, limit: int) -> list:
    from torch.testing._internal.opinfo.core import OpInfo

    if type(op).sample_inputs is OpInfo.sample_inputs:
        # What OpInfo.sample_inputs does, without its per-call crawl of the Python stack.
        generator = op.sample_inputs_func(op, device, dtype, requires_grad)
    else:
        generator = op.sample_inputs(device, dtype, requires_grad=requires_grad)
    return list(itertools.islice(generator, limit))


def make_samples(op, entry: str, dtype: str, phase: str, limit: int) -> list[tuple]:
    """Up to limit (sample, placement) pairs generated on the CPU. placement: for each tensor
    leaf, whether the OpInfo puts it on the device under test (some arguments stay on the
    CPU by design, e.g. tensor_split's indices); learnt by generating the samples again on
    the meta device, or None (every tensor moves) where that fails."""
    seed = seed_for(entry, dtype, phase)
    dtype_ = torch.float64 if phase == "grad" else DTYPES[dtype]
    reseed(seed)
    samples = _generate(op, "cpu", dtype_, phase == "grad", limit)
    try:
        reseed(seed)
        probes = _generate(op, "meta", dtype_, phase == "grad", limit)
    except Exception:
        probes = []
    return [
        (sample, _placement(sample, probes[index]) if index < len(probes) else None)
        for index, sample in enumerate(samples)
    ]


def _leaves(sample) -> tuple[list, object]:
    return tree_flatten((sample.input, list(sample.args), dict(sample.kwargs)))


def _placement(sample, probe) -> list[bool] | None:
    leaves, spec = _leaves(sample)
    probe_leaves, probe_spec = _leaves(probe)
    if spec != probe_spec:
        return None
    placement = []
    for leaf, other in zip(leaves, probe_leaves, strict=True):
        if isinstance(leaf, torch.Tensor) != isinstance(other, torch.Tensor):
            return None
        placement.append(isinstance(other, torch.Tensor) and other.device.type == "meta")
    return placement


def fingerprint(sample, placement) -> str:
    """A digest of the sample's tensors (values, shapes, dtypes) and plain values."""
    digest = hashlib.sha1()
    leaves, _ = _leaves(sample)
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            digest.update(f"{leaf.dtype}{tuple(leaf.shape)}{leaf.requires_grad}".encode())
            if leaf.layout == torch.strided and not leaf.is_quantized:
                dense = leaf.detach().resolve_conj().resolve_neg().contiguous()
                digest.update(
                    dense.view(-1).view(torch.uint8).numpy().tobytes() if dense.numel() else b""
                )
        else:
            digest.update(repr(leaf).encode())
    digest.update(repr(placement).encode())
    return digest.hexdigest()


def transfer(sample, placement, device: str, memo: dict) -> tuple[tuple, dict]:
    """(args, kwargs) of the sample on device: every tensor the OpInfo would put on the
    device is copied there (keeping requires_grad, one copy per distinct tensor so aliasing
    arguments stay aliased), the others are cloned on the CPU; CPU device arguments point at
    device, as if the sample had been generated there."""
    leaves, spec = _leaves(sample)
    placement = placement or [True] * len(leaves)
    moved = []
    for leaf, on_device in zip(leaves, placement, strict=True):
        if isinstance(leaf, torch.Tensor):
            if id(leaf) not in memo:
                source = leaf.detach()
                target = device if on_device else "cpu"
                copy = source.clone() if target == "cpu" else source.to(target)
                if leaf.requires_grad:
                    copy.requires_grad_(True)
                memo[id(leaf)] = copy
                if not on_device:
                    memo.setdefault("pinned", set()).add(id(copy))
            moved.append(memo[id(leaf)])
        elif isinstance(leaf, torch.device) and leaf.type == "cpu":
            moved.append(torch.device(device))
        elif isinstance(leaf, str) and leaf == "cpu":
            moved.append(device)
        else:
            moved.append(leaf)
    value, args, kwargs = tree_unflatten(moved, spec)
    return (value, *args), kwargs


def perturb(value: torch.Tensor) -> torch.Tensor:
    if value.dtype == torch.bool:
        return ~value
    if value.is_floating_point() or value.is_complex():
        return value + 1 + value.abs()
    return value + 1


def fetch_tensor(tensor: torch.Tensor, device: str, perturbed: bool, pinned=()) -> dict:
    """A tensor's metadata and its values as a dense CPU tensor. device: the device this side
    runs on (relay, or the reference device); a tensor there is recorded as on "device"."""
    leaf = {
        "device": "device"
        if tensor.device.type == device and id(tensor) not in pinned
        else tensor.device.type,
        "dtype": str(tensor.dtype),
        "shape": tuple(tensor.shape),
        "layout": str(tensor.layout),
        "quantized": tensor.is_quantized,
        "nested": tensor.is_nested,
    }
    try:
        value = tensor.detach()
        if value.is_quantized:
            if value.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
                leaf["qparams"] = (value.q_scale(), value.q_zero_point())
            value = value.dequantize()
        if value.is_nested:
            value = value.to_padded_tensor(0.0)
        elif value.layout != torch.strided:
            value = value.to_dense()
        value = value.cpu().resolve_conj().resolve_neg().clone()
        leaf["value"] = perturb(value) if perturbed else value
    except Exception as error:
        leaf["fetch_error"] = first_line(error)
    return leaf


def fetch(tree, device: str, perturbed: bool = False, pinned=()) -> list:
    """Flatten a result (or the arguments after the op) into picklable leaves; device
    arguments naming this side's device are recorded as "device", as are tensors there
    except those pinned (ids of arguments the OpInfo keeps on the CPU)."""
    leaves, _ = tree_flatten(tree)
    out = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            out.append(fetch_tensor(leaf, device, perturbed, pinned))
        elif isinstance(leaf, torch.device):
            out.append({"plain": "device" if leaf.type == device else str(leaf)})
        elif isinstance(leaf, str) and leaf == device:
            out.append({"plain": "device"})
        elif isinstance(leaf, PLAIN):
            if perturbed and isinstance(leaf, (int, float, complex)) and not isinstance(leaf, bool):
                leaf = leaf + 1
            out.append({"plain": leaf})
        else:
            out.append({"plain": "<callable>" if callable(leaf) else repr(leaf)})
    return out


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:400]


def tolerances(op, dtype: torch.dtype, reference: str) -> tuple[float, float] | None:
    """(rtol, atol) from the OpInfo's tolerance overrides for consistency tests on the
    reference device, or None for torch.testing's per-dtype defaults."""
    from torch.testing._internal.common_device_type import toleranceOverride

    names = {
        "test_noncontiguous_samples",
        "test_compare_cpu",
        "test_variant_consistency_eager",
        "test_out",
        None,
    }
    best = (0.0, 0.0)
    for info in getattr(op, "decorators", ()):
        if getattr(info, "cls_name", None) not in ("TestCommon", None):
            continue
        if getattr(info, "test_name", None) not in names:
            continue
        if getattr(info, "device_type", None) not in (None, reference):
            continue
        for decorator in getattr(info, "decorators", ()):
            if isinstance(decorator, toleranceOverride) and dtype in decorator.d:
                tol = decorator.d[dtype]
                best = (max(tol.rtol, best[0]), max(tol.atol, best[1]))
    return best if best != (0.0, 0.0) else None
