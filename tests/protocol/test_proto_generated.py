"""The committed *_pb2.py / .pyi files must be exactly what scripts/gen-proto produces now.

Fails when someone edits a .proto file (or the generated files) without regenerating.
"""

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GEN = ROOT / "scripts" / "gen-proto"
PROTOS = sorted(p.relative_to(ROOT) for p in (ROOT / "pyengine").rglob("*.proto"))
GENERATED = [proto.with_name(proto.stem + suffix) for proto in PROTOS for suffix in ("_pb2.py", "_pb2.pyi")]


def test_gen_proto_is_an_executable_script() -> None:
    assert GEN.is_file()
    assert os.access(GEN, os.X_OK)


def test_committed_generated_files_match_a_fresh_generation(tmp_path: Path) -> None:
    result = subprocess.run([str(GEN), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"scripts/gen-proto failed:\n{result.stdout}\n{result.stderr}"
    assert Path("pyengine/protocol/pulsar_api.proto") in PROTOS
    for name in GENERATED:
        fresh = (tmp_path / name).read_bytes()
        committed = (ROOT / name).read_bytes()
        assert fresh, f"gen-proto produced an empty {name}"
        assert committed == fresh, f"{name} is stale: run scripts/gen-proto and commit the result"
