"""The README's examples run as written (a stale example is a bug)."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def readme_example(name: str) -> str:
    text = (ROOT / "README.md").read_text()
    match = re.search(rf"<!-- readme-example: {name} -->\s*```python\n(.*?)```", text, re.S)
    assert match, f"README example {name!r} not found"
    return match.group(1)


def test_embedded_example_runs_and_prints_the_transformed_messages():
    result = subprocess.run([sys.executable, "-c", readme_example("embedded")], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[b'ORDER-0', b'ORDER-1', b'ORDER-2']"
