"""Parsing `pyengine serve` flags in tests."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from pyengine.cli import main, serve


def serve_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["serve", *argv])


def assert_refused_before_start(tmp_path: Path, capsys, argv: tuple[str, ...]) -> None:
    """`pyengine serve ARGV` exits with a usage error naming the flag, and makes no data dir."""
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--data-dir", str(tmp_path / "data"), *argv])
    assert exit_info.value.code == 2
    assert argv[0] in capsys.readouterr().err
    assert not (tmp_path / "data").exists()
