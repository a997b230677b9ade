"""Strict OpInfo sweep: every op_db entry through relay, compared with eager.

The sweep is the package torch_fallback.testing.sweep, which ships in the wheel
(`python -m torch_fallback.testing.sweep` is the same command line; its cli.py says
what is checked and how); this script runs it from a checkout.

    python benchmarks/opinfo_sweep.py --target cpu --home cpu --json opinfo-cpu.json
    python benchmarks/opinfo_sweep.py --self-test --ops add,sin --perturb
"""

from __future__ import annotations

import sys

from torch_fallback.testing.sweep.cli import main

if __name__ == "__main__":
    sys.exit(main())
