"""Where a launch-bound call's time goes, relay against native: one zoo inference or a
few decoding steps, under torch.profiler, per call of the workload.

Each side (its own process; the native side never imports torch_fallback,
pytorch/pytorch#161129) profiles --calls calls after warm-up and reports per call:
  runtime   the CUDA runtime calls (launches, copies, synchronizations, events): a call
            relay adds shows here (CUDA only)
  kernels   the GPU kernels, count and ms: another kernel choice shows here (CUDA only)
  ops       host time per aten op (self CPU time)
  fallback  relay only: its calls per op, and which were boxed (torch_fallback.metrics)

    python benchmarks/launch_profile.py --device cuda --workload resnet bert decode
    python benchmarks/launch_profile.py --device cpu --workload decode --json p.json
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

import harness
import training_workloads as workloads
import zoo_bench

TOP = 10


def workload(name: str, device: str):
    """A call of the named workload (a zoo model's float32 inference, or decoding 8 new
    tokens with the training bench's small Llama) and its synchronize."""
    import torch

    on_gpu = device == "cuda" or (device == "relay" and torch.cuda.is_available())
    sync = torch.cuda.synchronize if on_gpu else harness.no_sync
    if name == "decode":
        torch.manual_seed(0)
        model = workloads.decoder("llama").to(device)
        prompt = torch.randint(0, workloads.DECODE["vocab"], (1, 8)).to(device)

        def call() -> None:
            with torch.no_grad():
                model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8,
                               min_new_tokens=8, do_sample=False, pad_token_id=0,
                               eos_token_id=workloads.DECODE["eos"])  # fmt: skip

        return call, sync
    model, case = zoo_bench.load_zoo().make_case(name, 1)
    model = model.to(device=device, dtype=torch.float32).eval()  # the zoo's is float64
    inputs = zoo_bench.moved(case["eval"], device, torch.float32)

    def forward() -> None:
        with torch.no_grad():
            model(**inputs)

    return forward, sync


def profile_side(args: argparse.Namespace) -> dict:
    from torch.profiler import ProfilerActivity, profile

    device = args.device
    if args.side == "relay":
        import torch_fallback
        import torch_fallback.relay

        torch_fallback.set_target(args.device)
        torch_fallback.relay.set_home(args.device)
        device = "relay"
    activities = [ProfilerActivity.CPU]
    if args.device == "cuda":
        activities.append(ProfilerActivity.CUDA)
    report = {}
    for name in args.workload:
        call, sync = workload(name, device)
        for _ in range(3):
            call()
        sync()
        if args.side == "relay":
            torch_fallback.reset_metrics()
        with profile(activities=activities) as prof:
            for _ in range(args.calls):
                call()
            sync()
        runtime, kernels, kernel_us, ops = Counter(), Counter(), Counter(), Counter()
        for event in prof.events():
            kind = str(event.device_type).rsplit(".", 1)[-1]
            if kind in ("CUDA", "PrivateUse1"):  # relay's GPU work is reported as its own
                kernels[event.name] += 1
                kernel_us[event.name] += event.device_time
            elif event.name.startswith(("cuda", "cu")) and not event.name.startswith("cuda::"):
                runtime[event.name] += 1
            elif event.name.startswith("aten::"):
                ops[event.name] += event.self_cpu_time_total
        per_call = args.calls
        entry = {
            "runtime": {k: v / per_call for k, v in runtime.most_common()},
            "kernels": {
                k: [v / per_call, kernel_us[k] / per_call / 1e3] for k, v in kernels.most_common()
            },
            "ops_ms": {k: v / per_call / 1e3 for k, v in ops.most_common()},
        }
        if args.side == "relay":
            metrics = torch_fallback.metrics()
            entry["fallback"] = {
                op: [m.calls / per_call, (m.calls - m.calls_unboxed) / per_call]
                for op, m in metrics.items()
            }
        report[name] = entry
    return report


def render(native: dict, relay: dict, meta: dict) -> str:
    host = f"{meta.get('cpu_model')}; {meta.get('gpu')}; torch {meta.get('torch')}"
    lines = [f"{host}; figures per call of the workload"]
    for name, ours in relay.items():
        theirs = native[name]
        lines += ["", f"== {name}"]
        for key, title in (("runtime", "CUDA runtime calls"), ("ops_ms", "aten self CPU ms")):
            lines.append(f"{title:<56} {'native':>9} {'relay':>9}")
            mine, base = ours[key], theirs[key]
            names = sorted(
                set(base) | set(mine), key=lambda n: -abs(mine.get(n, 0) - base.get(n, 0))
            )
            for op in names[:TOP]:
                lines.append(f"  {op[:54]:<54} {base.get(op, 0):9.3f} {mine.get(op, 0):9.3f}")
        count = [sum(v[0] for v in side["kernels"].values()) for side in (theirs, ours)]
        ms = [sum(v[1] for v in side["kernels"].values()) for side in (theirs, ours)]
        lines.append(
            f"GPU kernels: native {count[0]:.1f} ({ms[0]:.3f} ms), "
            f"relay {count[1]:.1f} ({ms[1]:.3f} ms)"
        )
        count_of = [{k: v[0] for k, v in side["kernels"].items()} for side in (theirs, ours)]
        differing = [k for k in set(count_of[0]) | set(count_of[1])
                     if count_of[0].get(k, 0) != count_of[1].get(k, 0)]  # fmt: skip
        for kernel in sorted(differing)[:TOP]:
            counts = [side.get(kernel, 0) for side in count_of]
            lines.append(f"  {kernel[:54]:<54} {counts[0]:9.1f} {counts[1]:9.1f}")
        fallback = ours.get("fallback", {})
        calls = sum(v[0] for v in fallback.values())
        boxed = {op: v[1] for op, v in fallback.items() if v[1]}
        lines.append(f"fallback calls {calls:.1f}, boxed: {boxed or 'none'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument(
        "--workload", nargs="+", default=["resnet", "bert", "decode"],
        help="zoo model names, and 'decode'",
    )  # fmt: skip
    parser.add_argument("--calls", type=int, default=20, help="calls profiled per workload")
    parser.add_argument("--side", choices=("native", "relay"), help=argparse.SUPPRESS)
    harness.add_output_options(parser, raw=False)
    args = parser.parse_args(argv)
    if args.side:
        harness.emit(profile_side(args))
        return 0
    forwarded = list(argv if argv is not None else sys.argv[1:])
    native = harness.run_side(__file__, "native", forwarded)
    relay = harness.run_side(__file__, "relay", forwarded)
    import torch

    meta = {**harness.host_info(torch), "torch": torch.__version__}
    document = {"meta": meta, "native": native, "relay": relay}
    harness.write_outputs(args, document, render(native, relay, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
