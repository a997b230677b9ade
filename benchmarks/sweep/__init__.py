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

``benchmarks/opinfo_sweep.py`` is the command line.
"""
