"""The package's import graph: no cycle among the modules' top-level imports, every module
imports in a fresh process (in sorted and in reversed order), and the light entry points import
nothing heavy (ray, sglang, transformer_engine, megatron.core, transformers, matplotlib)."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PKG = ROOT / "megatron_dapo"


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict:
    return {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _top_level_imports(tree: ast.Module):
    """Import statements executed when the module is imported: module level, also inside
    module-level ``try`` / ``if`` / ``with`` (not ``if TYPE_CHECKING``), never in a function or class."""
    todo = list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            test = ast.unparse(node.test)
            if "TYPE_CHECKING" not in test:
                todo[:0] = node.body + node.orelse
        elif isinstance(node, ast.Try):
            todo[:0] = node.body + node.orelse + node.finalbody + [h for x in node.handlers for h in x.body]
        elif isinstance(node, ast.With):
            todo[:0] = node.body


def _all_imports(tree: ast.Module):
    """Every import statement of the module: module level and call time (inside functions and
    methods), except those under ``if TYPE_CHECKING`` (never executed)."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for b in node.body for n in ast.walk(b))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in skip:
            yield node


def import_graph(call_time: bool = False) -> dict:
    """``module -> {project modules its top-level imports load}`` (``from P import name`` loads
    ``P`` and, when ``P.name`` is a module, that too); with ``call_time`` also the imports inside
    functions, which run later but are edges of the design all the same."""
    mods = _modules()
    graph = {}
    statements = _all_imports if call_time else _top_level_imports
    for name, path in mods.items():
        is_pkg = path.name == "__init__.py"
        base = name.split(".") if is_pkg else name.split(".")[:-1]
        deps = set()
        for node in statements(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
                subs = []
            else:
                if node.level:
                    anchor = base[: len(base) - (node.level - 1)]
                    target = ".".join(anchor + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                targets = [target]
                subs = [f"{target}.{a.name}" for a in node.names]
            for t in targets + subs:
                if t in mods and t != name:
                    deps.add(t)
        graph[name] = deps
    return graph


def _cycles(graph: dict) -> list:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_check_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_inside_the_package():
    graph = import_graph()
    assert len(graph) > 50 and graph["megatron_dapo.config.validate"] >= {"megatron_dapo.config.schema"}
    cycles = _cycles(graph)
    # a package's __init__ re-exporting its submodules is no cycle unless a submodule imports
    # the package back; every component found is a real cycle of top-level imports
    assert cycles == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_no_import_cycle_even_through_call_time_imports():
    """A call-time import hides a cycle from the interpreter, not from the design (#39: three were
    hidden so: config <-> errors, rollout.engines <-> rollout.payload, training.dapo_step <->
    training.setup); the shared piece moves down to where both sides can take it."""
    graph = import_graph(call_time=True)
    assert graph["megatron_dapo.launch.placement"] >= {"megatron_dapo.errors"}
    cycles = _cycles(graph)
    assert cycles == [], "import cycles (call-time imports included): " + "; ".join(" <-> ".join(c) for c in cycles)


def design_layers() -> dict:
    """``package -> layer`` from the table of docs/design.md, "Layers"."""
    import re

    text = (ROOT / "docs" / "design.md").read_text()
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    layers = {}
    for m in re.finditer(r"^\| (\d+) \| ([^|]+) \|", section, re.M):
        for pkg in re.findall(r"`(\w+)`", m.group(2)):
            layers[pkg] = int(m.group(1))
    return layers


def _package(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def layer_violations(graph: dict, layers: dict) -> list:
    """Imports of another package that is not on a lower layer (``""``: the package's own
    ``__init__``, which any module may import)."""
    out = []
    for mod, deps in sorted(graph.items()):
        a = _package(mod)
        for dep in sorted(deps):
            b = _package(dep)
            if not b or a == b:
                continue
            if not a:  # the package's own __init__: imported by every module, so layer 0 only
                if layers[b] != 0:
                    out.append(f"{mod} (the package's __init__) imports {dep} (layer {layers[b]}, not 0)")
                continue
            if layers[b] >= layers[a]:
                out.append(f"{mod} (layer {layers[a]}) imports {dep} (layer {layers[b]})")
    return out


def test_the_layer_check_finds_an_upward_import():
    layers = {"a": 0, "b": 1}
    assert layer_violations({"megatron_dapo.a.x": {"megatron_dapo.b.y"}, "megatron_dapo.b.y": set()}, layers) == [
        "megatron_dapo.a.x (layer 0) imports megatron_dapo.b.y (layer 1)"
    ]
    assert layer_violations({"megatron_dapo.b.y": {"megatron_dapo.a.x"}, "megatron_dapo.a.x": set()}, layers) == []
    assert layer_violations({"megatron_dapo": {"megatron_dapo.a"}}, layers) == []
    assert layer_violations({"megatron_dapo": {"megatron_dapo.b.y"}}, layers) == [
        "megatron_dapo (the package's __init__) imports megatron_dapo.b.y (layer 1, not 0)"
    ]


def test_packages_keep_the_layers_of_docs_design():
    layers = design_layers()
    packages = {_package(m) for m in _modules()} - {""}
    assert packages == set(layers), (
        f"packages without a layer in docs/design.md: {sorted(packages - set(layers))}; "
        f"layers naming no package: {sorted(set(layers) - packages)}"
    )
    bad = layer_violations(import_graph(call_time=True), layers)
    assert not bad, "imports against the layers of docs/design.md:\n" + "\n".join(bad)


MAX_LINES = 800


#: Where production code lives: the package, the command-line tools, the benchmarks, the examples.
PRODUCTION_DIRS = ("megatron_dapo", "tools", "benchmarks", "examples", "scripts")


def test_no_production_file_past_800_lines():
    files = sorted(p for d in PRODUCTION_DIRS for p in (ROOT / d).rglob("*.py"))
    assert any(p.is_relative_to(PKG) for p in files) and any(p.parent.name == "benchmarks" for p in files)
    long = {str(p.relative_to(ROOT)): n for p in files if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"files past {MAX_LINES} lines (split them by concern): {long}"


def _importable() -> list:
    """Every module that imports on this (CPU) machine: the GPU-only engine adapter imports sglang lazily too."""
    return sorted(m for m in _modules() if not m.endswith("__main__"))


@pytest.mark.parametrize("order", ["sorted", "reversed"])
def test_every_module_imports_in_a_fresh_process(order):
    mods = _importable() if order == "sorted" else _importable()[::-1]
    code = f"import importlib, sys\nfor m in {mods!r}:\n    importlib.import_module(m)\nprint(len(sys.modules))\n"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


HEAVY = ("ray", "sglang", "transformer_engine", "megatron.core", "transformers", "matplotlib")


@pytest.mark.parametrize(
    "entry,allowed",
    [
        ("megatron_dapo", ()),
        ("megatron_dapo.config", ()),
        ("megatron_dapo.reward", ()),
        ("megatron_dapo.rollout.engines", ()),
        ("megatron_dapo.config.registries", ()),
        ("megatron_dapo.diagnostics", ()),
        ("megatron_dapo.train", ()),
    ],
)
def test_entry_points_import_nothing_heavy(entry, allowed):
    code = f"import sys, {entry}\nprint(sorted(m for m in {HEAVY!r} if m in sys.modules and m not in {allowed!r}))\n"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "[]", f"import {entry} imported {r.stdout.strip()}"
