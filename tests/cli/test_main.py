"""`python -m pyengine` runs the same command line as the `pyengine` script."""

import subprocess
import sys


def test_python_dash_m_lists_the_commands():
    result = subprocess.run([sys.executable, "-m", "pyengine", "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    for command in ("serve", "admin", "perf", "pipeline"):
        assert command in result.stdout


def test_python_dash_m_refuses_an_unknown_command():
    result = subprocess.run([sys.executable, "-m", "pyengine", "no-such-command"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2
    assert "invalid choice" in result.stderr
