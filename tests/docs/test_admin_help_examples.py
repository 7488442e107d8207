"""The examples of `pyengine admin --help` run, in the order shown, against a fresh broker (a
stale example is a bug: a new user copies them one after the other)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pyengine.testing import ServeProcess

ROOT = Path(__file__).resolve().parents[2]

# Examples about a transaction or key the reader has (none on a fresh broker): a 404 there.
NEEDS_A_TRANSACTION = ("transactions get-metadata", "transactions abort", "transactions get-transaction-key")


def admin(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYENGINE_ADMIN_URL": url}
    return subprocess.run([sys.executable, "-m", "pyengine", "admin", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_examples_of_admin_help_run_in_order(broker: ServeProcess):
    shown = admin("--help", url=broker.http_url)
    assert shown.returncode == 0, shown.stderr
    examples = [line.split()[2:] for line in shown.stdout.splitlines() if line.startswith("    pyengine admin ")]
    assert len(examples) > 10
    for args in examples:
        if args[:1] == ["--url"]:
            args = ["--url", broker.http_url, *args[2:]]
        result = admin(*args, url=broker.http_url)
        command = " ".join(args)
        if any(command.startswith(prefix) for prefix in NEEDS_A_TRANSACTION):
            assert result.returncode == 1 and "HTTP 404" in result.stderr, (command, result.stderr)
        else:
            assert result.returncode == 0, (command, result.stdout, result.stderr)
