"""python -m torch_fallback.testing.sweep: the sweep's command line (cli.py)."""

import sys

from .cli import main

sys.exit(main(prog="python -m torch_fallback.testing.sweep"))
