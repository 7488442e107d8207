"""The `pyengine` command line: one sub-command per module in this package."""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = ("demo", "serve", "admin", "perf", "pipeline")

# 128 + SIGINT, as shells report a command stopped by Ctrl-C
INTERRUPTED = 130


def main(argv: list[str] | None = None) -> int:
    # The commands are imported here, not with this package: importing the broker takes a second
    # or more, and a Ctrl-C meanwhile (before `serve` handles signals itself) ended in a traceback.
    try:
        modules = {name: importlib.import_module(f"pyengine.cli.{name}") for name in COMMANDS}
        parser = argparse.ArgumentParser(prog="pyengine",
                                         description="Pulsar-compatible transactional streaming engine")
        sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
        for module in modules.values():
            module.add_parser(sub)
        args = parser.parse_args(argv)
        return modules[args.command].run(args) or 0
    except KeyboardInterrupt:
        print("pyengine: interrupted", file=sys.stderr)
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
