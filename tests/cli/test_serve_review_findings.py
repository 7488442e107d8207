"""Findings of the review of `pyengine serve` as an operator runs it (flags, start-up, signals)."""

from __future__ import annotations

import pytest

from tests.cli.serve_flags import serve_args


@pytest.mark.parametrize("host", ["", " "])
def test_an_empty_host_is_refused_before_anything_starts(capsys, host: str) -> None:
    """`--host ""` (a script's unset variable) was taken: the broker listened on every interface
    and announced `pulsar://:PORT` and `http://:PORT` in its ready line, and handed the same
    host-less URLs to clients in HTTP lookups: URLs no client can connect to. (Parsed only: the
    flags once taken started a broker.)"""
    with pytest.raises(SystemExit) as exit_info:
        serve_args("--data-dir", "data", "--host", host)
    assert exit_info.value.code == 2
    assert "--host: an empty address" in capsys.readouterr().err


def test_an_empty_data_dir_is_refused_before_anything_starts(capsys) -> None:
    """`--data-dir ""` (a script's unset variable) was taken as the current directory: the
    broker created its LMDB environment wherever it was started from."""
    with pytest.raises(SystemExit) as exit_info:
        serve_args("--data-dir", "")
    assert exit_info.value.code == 2
    assert "--data-dir: an empty path" in capsys.readouterr().err
