"""The compiled module, the façade and the hand-written stub describe the same API."""

from __future__ import annotations

import ast
from pathlib import Path

import pyengine_kernels
from pyengine_kernels import _kernels

STUB = Path(pyengine_kernels.__file__).with_name("_kernels.pyi")
# Type aliases and protocols that exist only for type checkers.
STUB_ONLY = {"_ArrowArrayExportable", "Int64Column", "BoolColumn", "AckSet"}


def stub_tree() -> ast.Module:
    return ast.parse(STUB.read_text())


def public(names) -> set[str]:
    return {n for n in names if not n.startswith("_")}


def test_stub_and_package_files_are_installed() -> None:
    assert STUB.is_file()
    assert STUB.with_name("py.typed").is_file()


def test_facade_reexports_everything_compiled() -> None:
    assert set(pyengine_kernels.__all__) == public(dir(_kernels)) | {"__version__"}
    for name in pyengine_kernels.__all__:
        assert getattr(pyengine_kernels, name) is getattr(_kernels, name)


def test_stub_covers_the_module() -> None:
    top = set()
    for node in stub_tree().body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            top.add(node.name)
        elif isinstance(node, ast.Assign):
            top.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            top.add(node.target.id)
    assert public(top - STUB_ONLY) == public(dir(_kernels))


def test_stub_covers_each_class() -> None:
    classes = [n for n in stub_tree().body if isinstance(n, ast.ClassDef) and n.name not in STUB_ONLY]
    assert {c.name for c in classes} == {"Position", "TxnId", "OngoingTxnMap", "AbortedTxnSet"}
    for cls in classes:
        declared = set()
        for node in cls.body:
            if isinstance(node, ast.FunctionDef):
                declared.add(node.name)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                declared.add(node.target.id)
        runtime = getattr(_kernels, cls.name)
        assert public(declared) == public(dir(runtime)), cls.name


def test_classes_claim_the_public_module() -> None:
    for name in ("Position", "TxnId", "OngoingTxnMap", "AbortedTxnSet"):
        assert getattr(_kernels, name).__module__ == "pyengine_kernels"
