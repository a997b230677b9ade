"""Command line: python -m torch_fallback info [--json]."""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_fallback")
    commands = parser.add_subparsers(dest="command", required=True)
    info = commands.add_parser(
        "info", help="torch variant, CUDA, and which library defines the c10::cuda symbols"
    )
    info.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = parser.parse_args(argv)

    from . import diagnostics

    collected = diagnostics.collect()
    if args.json:
        print(json.dumps(collected.as_dict(), indent=2))
    else:
        print(diagnostics.render(collected))
    return 0


if __name__ == "__main__":
    sys.exit(main())
