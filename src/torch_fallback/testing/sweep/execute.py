"""Running one phase of one (op, dtype) on one device: a record per sample.

A record holds the error the op raised, or the op's outputs, EVERY tensor argument after
the op (to catch mutations a fallback loses), the gradients (grad phase) and whether an
in-place variant returned its self. The reference side also classifies each sample's
determinism by running it again with the same seed and with another seed.
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten

from . import samples as S


def _differentiable(tensor) -> bool:
    return (
        isinstance(tensor, torch.Tensor)
        and tensor.requires_grad
        and (tensor.is_floating_point() or tensor.is_complex())
    )


def cotangent(shape, dtype: torch.dtype, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, dtype=dtype, generator=generator)


def run_sample(
    op,
    sample,
    placement,
    phase: str,
    device: str,
    seed: int,
    perturb: str | None = None,
    rng_seed: int | None = None,
) -> dict:
    """seed: the sample's seed (the cotangents derive from it); rng_seed: what the global
    generators are seeded with before the op (default: seed). perturb: None, or which
    values read back to perturb: "all", "outputs", "arguments" (after the op) or "grads"."""
    side = torch.device(device).type
    memo: dict = {}
    args, kwargs = S.transfer(sample, placement, device, memo)
    torch.manual_seed(seed if rng_seed is None else rng_seed)
    record: dict = {}
    try:
        if phase == "inplace":
            out = op.inplace_variant(*args, **kwargs)
            record["identity"] = out is args[0]
        else:
            out = op(*args, **kwargs)
        if phase == "grad":
            out = sample.output_process_fn_grad(out)
            inputs = [t for key, t in memo.items() if key != "pinned" and _differentiable(t)]
            outputs = [t for t in tree_flatten(out)[0] if _differentiable(t)]
            if not inputs or not outputs:
                return {"not_differentiable": True}
            loss = 0
            for index, value in enumerate(outputs):
                ct = cotangent(value.shape, value.dtype, seed + index).to(value.device)
                term = (value * ct).sum()
                loss = loss + (term.real if term.is_complex() else term)
            grads = torch.autograd.grad(loss, inputs, allow_unused=True)
            record["grads"] = S.fetch(list(grads), side, perturb in ("all", "grads"))
    except Exception as error:
        return {"error": S.first_line(error)}
    record["out"] = S.drop_undefined_values(
        op.name, S.fetch(out, side, perturb in ("all", "outputs"))
    )
    pinned = memo.get("pinned", set())
    record["args"] = S.fetch((args, kwargs), side, perturb in ("all", "arguments"), pinned)
    return record


def _same(first: dict, second: dict) -> bool:
    """Bit-for-bit equality of two records of the same sample (NaNs equal)."""
    from .check import compare_leaves

    if ("error" in first) != ("error" in second):
        return False
    for part in ("out", "args", "grads"):
        if compare_leaves(first.get(part, []), second.get(part, []), "exact", True, "x"):
            return False
    return True


def determinism(op, sample, placement, phase: str, device: str, seed: int, first: dict) -> str:
    """ "undefined" (uninitialized memory), "nondeterministic" (differs under the same seed),
    "random" (depends on the seed) or "deterministic"."""
    if op.name in S.UNDEFINED_VALUES:
        return "undefined"
    if "error" in first or first.get("not_differentiable"):
        return "deterministic"
    again = run_sample(op, sample, placement, phase, device, seed)
    if not _same(first, again):
        return "nondeterministic"
    other = run_sample(op, sample, placement, phase, device, seed, rng_seed=seed + 1)
    return "deterministic" if _same(first, other) else "random"


def run_phase(
    op,
    entry: str,
    dtype: str,
    phase: str,
    device: str,
    limit: int,
    progress,
    classify: bool = False,
    perturb: str | None = None,
) -> dict:
    """Every sample's record for this phase; classify: the reference side's determinism."""
    samples = S.make_samples(op, entry, dtype, phase, limit)
    records = []
    for index, (sample, placement) in enumerate(samples):
        progress(index)
        seed = S.seed_for(entry, dtype, phase, str(index))
        record = run_sample(op, sample, placement, phase, device, seed, perturb)
        record["fingerprint"] = S.fingerprint(sample, placement)
        if classify:
            record["determinism"] = determinism(op, sample, placement, phase, device, seed, record)
        records.append(record)
    return {"records": records}
