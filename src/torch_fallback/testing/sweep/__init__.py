"""The strict OpInfo sweep: every op_db entry through relay, compared with eager.

Modules, in the order data flows through them:

- ``samples``: op lookup, deterministic sample generation, moving samples to a device,
  reading results back to the CPU (optionally perturbed).
- ``execute``: one phase (forward, grad, inplace) of one (op, dtype) on one device: the
  per-sample records both sides produce.
- ``check``: comparing relay's records with the reference's, and naming each failure.
- ``worker``: the long-lived worker processes (reference and test roles).
- ``pool``: the scheduler that feeds the workers, restarts them after a crash and enforces
  the per-task timeout.
- ``report``: pass rates per phase and dtype, the categorized failure list, JSON.

- ``cli``: the command line, ``python -m torch_fallback.testing.sweep`` (or, from a
  checkout, ``python benchmarks/opinfo_sweep.py``).

Only the test workers import ``torch_fallback.relay``: the sweep's own modules import the
torch_fallback package, which registers no device, so the reference workers run plain eager
(a registered PrivateUse1 device breaks native CUDA autograd, pytorch/pytorch#161129).
"""
