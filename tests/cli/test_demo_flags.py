"""`pyengine demo`: malformed flags are refused as argparse refuses them (exit 2, one line, no
traceback). Found by an audit: `--seed -1` ended in numpy's ValueError traceback, `--rows 5`
exited 1, and `--rows` past the memory in a MemoryError traceback."""

from __future__ import annotations

import pytest

from pyengine.cli import main


@pytest.mark.parametrize(("argv", "message"), [
    (["--seed", "-1"], "argument --seed: -1 is not at least 0"),
    (["--rows", "5"], "argument --rows: 5 is not at least 10"),
])
def test_malformed_flags_exit_2_with_argparse_s_message(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_more_rows_than_memory_is_one_clear_line(monkeypatch):
    def no_memory(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr("pyengine.cli.demo.np.arange", no_memory)
    with pytest.raises(SystemExit, match="not enough memory for --rows 10,000,000,000"):
        main(["demo", "--rows", "10000000000"])


def test_a_small_demo_runs(capsys):
    assert main(["demo", "--rows", "1000", "--seed", "0"]) == 0
    assert "READ_COMMITTED filter" in capsys.readouterr().out
