"""What the zoo does with each model on one device, and the eager reference process.

``run_case`` moves a model to a device and records its eval outputs, greedy
``generate()`` ids (KV cache on) and STEPS AdamW steps (losses, then every
parameter and buffer), all copied to the CPU. The reference runs eagerly in a
child process that never imports torch_fallback (``python zoo_runner.py IN OUT``):
a registered PrivateUse1 backend breaks CUDA autograd in PyTorch itself
(pytorch/pytorch#161129). One child serves every model of a test session's target.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
import zoo

STEPS = 2


def _to(value: Any, device: str) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {key: _to(item, device) for key, item in value.items()}
    return value


def _cpu(value: torch.Tensor) -> torch.Tensor:
    return value.detach().to("cpu", copy=True)


def _tensors(output: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor of a model output (ModelOutput, tuple, KV cache aside) by its path."""
    found: dict[str, torch.Tensor] = {}
    if isinstance(output, torch.Tensor):
        found[prefix or "output"] = _cpu(output)
    elif isinstance(output, dict):  # ModelOutput is an OrderedDict
        for key, item in output.items():
            if key != "past_key_values":
                found |= _tensors(item, f"{prefix}{key}.")
    elif isinstance(output, (list, tuple)):
        for index, item in enumerate(output):
            found |= _tensors(item, f"{prefix}{index}.")
    return {key.rstrip("."): value for key, value in found.items()}


def tied_groups(model: torch.nn.Module) -> list[list[str]]:
    """The parameter names that share one Parameter object, for groups of two or more."""
    by_object: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        by_object.setdefault(id(param), []).append(name)
    return sorted(names for names in by_object.values() if len(names) > 1)


def run_inference(
    name: str, model: torch.nn.Module, case: dict[str, Any], device: str
) -> dict[str, Any]:
    """The eval outputs and, for a model that generates, its greedy ``generate()`` ids of
    ``model`` (on ``device`` already), under torch.no_grad; results on the CPU."""
    results: dict[str, Any] = {}
    model.eval()
    with torch.no_grad():
        results["eval"] = _tensors(model(**_to(case["eval"], device)))
        if zoo.BY_NAME[name].generates:
            prompt = _to(case["prompt"], device)
            ids = model.generate(
                **prompt,
                max_new_tokens=zoo.NEW_TOKENS,
                min_new_tokens=zoo.NEW_TOKENS,
                do_sample=False,
                use_cache=True,
                num_beams=1,
            )
            results["generate"] = _cpu(ids)
    return results


def run_case(
    name: str, model: torch.nn.Module, case: dict[str, Any], device: str
) -> dict[str, Any]:
    """The zoo's three uses of ``model`` on ``device``; results on the CPU."""
    model.to(device)
    results: dict[str, Any] = {"tied": tied_groups(model)}
    results |= run_inference(name, model, case, device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for batch in case["batches"]:
        optimizer.zero_grad()
        loss = model(**_to(batch, device)).loss
        loss.backward()
        optimizer.step()
        losses.append(_cpu(loss))
    results["losses"] = losses
    results["parameters"] = {n: _cpu(p) for n, p in model.named_parameters()}
    results["buffers"] = {n: _cpu(b) for n, b in model.named_buffers()}
    results["devices"] = sorted({t.device.type for t in [*model.parameters(), *model.buffers()]})
    results["torch_fallback_imported"] = "torch_fallback" in sys.modules
    return results


def run_references(
    requests: dict[str, tuple[torch.nn.Module, dict[str, Any]]], device: str, workdir: Path
) -> dict[str, dict[str, Any]]:
    """Eager results of every (model, case) of ``requests`` on ``device``, in one child process
    that never imports torch_fallback; a model whose reference fails maps to its error text."""
    request, result = workdir / f"zoo-{device}-in.pt", workdir / f"zoo-{device}-out.pt"
    states = {name: (model.state_dict(), case) for name, (model, case) in requests.items()}
    torch.save({"device": device, "cases": states}, request)
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    completed = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), str(request), str(result)],
        capture_output=True,
        text=True,
        env=env,
        cwd=workdir,
        timeout=1800,
    )
    if completed.returncode != 0:
        raise AssertionError(
            f"the eager zoo reference on {device} exited with {completed.returncode}:\n"
            f"{completed.stderr[-4000:]}"
        )
    references: dict[str, dict[str, Any]] = torch.load(result, weights_only=False)
    return references


def _main(request: str, result: str) -> None:
    payload = torch.load(request, weights_only=False)
    device, references = payload["device"], {}
    for name, (state, case) in payload["cases"].items():
        torch.manual_seed(0)
        model = zoo.build(zoo.BY_NAME[name])
        model.load_state_dict(state)
        try:
            references[name] = run_case(name, model, case, device)
        except Exception as error:  # the test reports it beside relay's outcome
            references[name] = {"error": f"{type(error).__name__}: {error}"}
    torch.save(references, result)


if __name__ == "__main__":
    _main(*sys.argv[1:])
