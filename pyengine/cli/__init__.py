"""The `pyengine` command line: one sub-command per module in this package."""

from __future__ import annotations

import argparse
import sys

from pyengine.cli import admin, demo, perf, pipeline, serve

COMMANDS = {"demo": demo, "serve": serve, "admin": admin, "perf": perf, "pipeline": pipeline}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pyengine", description="Pulsar-compatible transactional streaming engine")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in COMMANDS.items():
        module.add_parser(sub)
    args = parser.parse_args(argv)
    return COMMANDS[args.command].run(args) or 0


if __name__ == "__main__":
    sys.exit(main())
