"""The committed pulsar_api_pb2.py / .pyi must be exactly what scripts/gen-proto produces now.

Fails when someone edits pulsar_api.proto (or the generated files) without regenerating.
"""

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GEN = ROOT / "scripts" / "gen-proto"
PACKAGE = Path("pyengine") / "protocol"
GENERATED = ["pulsar_api_pb2.py", "pulsar_api_pb2.pyi"]


def test_gen_proto_is_an_executable_script() -> None:
    assert GEN.is_file()
    assert os.access(GEN, os.X_OK)


def test_committed_generated_files_match_a_fresh_generation(tmp_path: Path) -> None:
    result = subprocess.run([str(GEN), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"scripts/gen-proto failed:\n{result.stdout}\n{result.stderr}"
    for name in GENERATED:
        fresh = (tmp_path / PACKAGE / name).read_bytes()
        committed = (ROOT / PACKAGE / name).read_bytes()
        assert fresh, f"gen-proto produced an empty {name}"
        assert committed == fresh, (
            f"{PACKAGE / name} is stale: run scripts/gen-proto and commit the result"
        )
