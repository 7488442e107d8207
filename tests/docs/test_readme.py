"""The README's examples run as written (a stale example is a bug)."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from pyengine.testing import ServeProcess

ROOT = Path(__file__).resolve().parents[2]


def readme_example(name: str, language: str = "python") -> str:
    text = (ROOT / "README.md").read_text()
    match = re.search(rf"<!-- readme-example: {name} -->\s*```{language}\n(.*?)```", text, re.S)
    assert match, f"README example {name!r} not found"
    return match.group(1)


def run_example(name: str, *, broker: ServeProcess | None = None) -> subprocess.CompletedProcess[str]:
    """Run a README example as a script; with `broker`, pointed at it instead of port 6650."""
    code = readme_example(name)
    if broker is not None:
        assert "pulsar://127.0.0.1:6650" in code
        code = code.replace("pulsar://127.0.0.1:6650", broker.url)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_the_quickstart_main_job_is_pyengine_serve_on_ports_6650_and_8080():
    makefile = (ROOT / "Makefile").read_text()
    run = re.search(r"^run:.*\n\t(.*)$", makefile, re.M)
    assert run is not None
    assert run[1] == "$(VENV)/bin/pyengine serve --data-dir ./data --port 6650 --http-port 8080"


def test_client_transaction_example_prints_both_orders(broker: ServeProcess):
    for _ in range(2):          # the second run gets its own two, the first run's were acknowledged
        result = run_example("client-transaction", broker=broker)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "[b'order-1', b'order-2']"
    stats = broker.admin("GET", "/admin/v2/persistent/public/default/orders/stats")
    assert stats["subscriptions"]["audit"]["msgBacklog"] == 0


def test_official_client_example_prints_the_greeting(broker: ServeProcess):
    result = run_example("official-client", broker=broker)
    assert result.returncode == 0, result.stderr
    printed = [line for line in result.stdout.splitlines() if " INFO " not in line]   # the C++ client's log
    assert printed == ["b'hello'"]


def test_embedded_example_runs_and_prints_the_transformed_messages():
    result = run_example("embedded")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[b'ORDER-0', b'ORDER-1', b'ORDER-2']"


def test_scalable_topic_examples_run_as_shown(broker: ServeProcess):
    """The admin commands, in order (a split, then the merge of its children), then the client
    snippet (an `async with` block, run inside a coroutine) on the topic they made: a send
    answers (segment id, message id), as its comment says."""
    env = {**os.environ, "PYENGINE_ADMIN_URL": broker.http_url}
    for line in readme_example("scalable-admin", "sh").splitlines():
        args = shlex.split(line, comments=True)
        assert args[:2] == ["pyengine", "admin"], line
        result = subprocess.run([sys.executable, "-m", "pyengine", *args[1:]], cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, (line, result.stderr)
    metadata = broker.admin("GET", "/admin/v2/scalable/public/default/orders")
    active = sorted(s["segmentId"] for s in metadata["segments"].values() if s["state"] == "ACTIVE")
    assert active == [1, 2, 3, 6]       # 0 split into 4 and 5, merged back into 6

    snippet = readme_example("scalable-client").replace("pulsar://127.0.0.1:6650", broker.url)
    code = ("import asyncio\nfrom pyengine.client import Client\n\n\nasync def main():\n"
            + "".join(f"    {line}\n" for line in snippet.splitlines())
            + "        print(await producer.send(b'more', key='customer-7'))\n"
            + "        print(type(stream).__name__, type(queue).__name__)\n\n\nasyncio.run(main())\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    sent, types = result.stdout.strip().splitlines()[-2:]
    assert re.fullmatch(r"\(\d+, MessageId\(.*\)\)", sent), sent
    assert types == "StreamConsumer QueueConsumer"
