"""Each compiled module of core_ext and its hand-written stub describe the same API: type
checkers see only the stub, so a name missing from it is an error in every caller (as
`records.chunk_indices` and `records.ChunkTooLargeError` were)."""

from __future__ import annotations

import ast
import importlib
import inspect
import types
from pathlib import Path

import pytest

MODULES = ["batch", "frames", "poskeys", "records"]


def public(names) -> set[str]:
    return {n for n in names if not n.startswith("_")}


def stub_tree(module: types.ModuleType) -> ast.Module:
    return ast.parse(Path(module.__file__).with_name(module.__name__.rpartition(".")[2] + ".pyi").read_text())


def declared(body) -> dict[str, ast.AST]:
    names: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            names.update((t.id, node) for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
    return names


@pytest.mark.parametrize("name", MODULES)
def test_stub_covers_the_module(name):
    module = importlib.import_module(f"core_ext.{name}")
    runtime = {n for n in public(dir(module)) if not isinstance(getattr(module, n), types.ModuleType)}
    assert public(declared(stub_tree(module).body)) == runtime


@pytest.mark.parametrize("name", MODULES)
def test_stub_functions_take_the_modules_parameters(name):
    module = importlib.import_module(f"core_ext.{name}")
    for stub_name, node in declared(stub_tree(module).body).items():
        if not isinstance(node, ast.FunctionDef) or stub_name.startswith("_"):
            continue
        arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
        want = list(inspect.signature(getattr(module, stub_name)).parameters)
        assert [a.arg for a in arguments] == want, f"{name}.{stub_name}"
