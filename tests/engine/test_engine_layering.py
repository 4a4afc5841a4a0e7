"""The engine's own import graph (read from the source, imports inside functions included):
modules import only from their own layer or the layers below, never in a cycle, and never
inside a function (a function-level import is how a cycle hides).

Layers, lowest first (docs/engine.md, "Module layout"): core -> primitives -> transforms ->
compiler -> backends -> api -> above (collectives, distributed: they use only the public engine
API).  A module's layer is its first name below ``fedarena.engine`` (``core``, ``compiler``, ...).
"""

from __future__ import annotations

import ast
import pathlib

import fedarena.engine

ENGINE = pathlib.Path(fedarena.engine.__file__).parent
PKG = "fedarena.engine"

LAYERS = [
    ("core", ["core"]),
    ("primitives", ["primitives", "ops", "initializers", "random"]),
    ("transforms", ["transforms"]),
    ("compiler", ["compiler"]),
    ("backends", ["backends"]),
    ("api", ["jit", "backend_selection", "control_flow", "custom", "nn", "models", "optim", "serialization", "inspection", "profiler", "interop", "quantization", "precision", "__init__"]),
    ("above", ["collectives", "distributed", "sharding"]),
]
LEVEL = {m: i for i, (_, mods) in enumerate(LAYERS) for m in mods}


def _unit(module: str) -> str:
    """``fedarena.engine.primitives.random`` -> ``primitives`` (the first name below the package)."""
    rest = module[len(PKG) + 1 :] if module.startswith(PKG + ".") else "__init__"
    return rest.split(".")[0] or "__init__"


def _module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(ENGINE).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join([PKG, *parts])


def _imports(path: pathlib.Path):
    """(imported engine module, line, inside a function?) for every import in the file."""
    tree = ast.parse(path.read_text())
    me = _module_name(path)
    pkg = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    found = []

    def visit(node, in_fn):
        for child in ast.iter_child_nodes(node):
            fn = in_fn or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.ImportFrom):
                if child.level:
                    base = pkg.split(".")
                    base = base[: len(base) - (child.level - 1)]
                    mod = ".".join(base + ([child.module] if child.module else []))
                else:
                    mod = child.module or ""
                if mod.startswith(PKG):
                    targets = [mod] if child.module else [f"{mod}.{a.name}" for a in child.names]
                    if child.module:  # `from .x import y` may import the submodule x.y
                        targets = [f"{mod}.{a.name}" if (ENGINE / pathlib.Path(*f"{mod}.{a.name}"[len(PKG) + 1 :].split("."))).with_suffix(".py").exists() else mod for a in child.names]
                    found.extend((t, child.lineno, fn) for t in targets)
            elif isinstance(child, ast.Import):
                found.extend((a.name, child.lineno, fn) for a in child.names if a.name.startswith(PKG))
            visit(child, fn)

    visit(tree, False)
    return me, found


def _engine_files():
    return [p for p in ENGINE.rglob("*.py") if "__pycache__" not in p.parts]


def test_every_engine_module_has_a_layer():
    units = {_unit(_module_name(p)) for p in _engine_files()}
    assert not sorted(units - set(LEVEL)), "engine modules missing from LAYERS: add them to a layer"


def test_engine_imports_point_down_and_never_hide_in_functions():
    bad, hidden, edges = [], [], {}
    for path in _engine_files():
        me, found = _imports(path)
        src = _unit(me)
        for target, line, in_fn in found:
            dst = _unit(target)
            where = f"{path.relative_to(ENGINE)}:{line} imports {target}"
            if in_fn:
                hidden.append(where)
            if dst == "_native":  # the C extension
                continue
            if LEVEL[dst] > LEVEL[src]:
                bad.append(f"{where} ({LAYERS[LEVEL[src]][0]} -> {LAYERS[LEVEL[dst]][0]})")
            if target != me:
                edges.setdefault(me, set()).add(target)
    assert not bad, "imports pointing up the layers:\n" + "\n".join(bad)
    assert not hidden, "function-level imports of engine modules:\n" + "\n".join(hidden)
    # no cycle between modules (also inside a layer or a package, where the level check cannot see one)
    state: dict = {}

    def dfs(u, stack):
        state[u] = 1
        for v in edges.get(u, ()):
            if state.get(v) == 1:
                raise AssertionError(f"import cycle: {' -> '.join(stack + [u, v])}")
            if v not in state:
                dfs(v, stack + [u])
        state[u] = 2

    for u in list(edges):
        if u not in state:
            dfs(u, [])
