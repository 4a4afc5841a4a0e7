"""The layering of docs/architecture.md: imports inside fedarena point down only (checked on the source, AST level)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fedarena"

ALLOWED = {
    "platform": set(),
    "engine": set(),
    "envs": set(),
    # DP-SGD trains engine models, and its experiment kind writes a run folder (issue 6)
    "privacy": {"engine", "platform"},
    "rl": {"engine", "envs", "platform"},
    # evasion attacks, adversarial training and their experiment kind (issue 23)
    "robustness": {"engine", "platform"},
    "marl": {"rl", "envs", "engine", "platform"},
    "federated": {"privacy", "engine", "envs", "platform"},
    # the training board reads run folders (platform); its profile recorder runs engine.profile (issue 22)
    "board": {"engine", "platform"},
}
# The `fedarena board` subcommand: the CLI is the top of the stack (experiments -> platform.cli) and starts the
# board's server inside cmd_board, at call time only (test_platform_imports_no_higher_layer_at_import_time).
EXCEPTIONS = {("platform/cli.py", "board")}


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "fedarena" and len(parts) > 1 and parts[1] in ALLOWED:
                found.add(parts[1])
    return found


def test_imports_point_down_only():
    violations = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if len(rel.parts) < 2:
            continue  # fedarena/__init__.py, __main__.py
        layer = rel.parts[0]
        for target in sorted(_imports(path) - {layer} - ALLOWED[layer]):
            if (rel.as_posix(), target) not in EXCEPTIONS:
                violations.append(f"{rel} imports fedarena.{target}")
    assert not violations, "layering violations:\n" + "\n".join(violations)


def test_platform_imports_no_higher_layer_at_import_time():
    code = (
        "import sys, fedarena.platform.cli, fedarena.platform.runs, fedarena.platform.registry, fedarena.platform.report;"
        "from fedarena.platform.registry import list_kinds; list_kinds();"
        # fedarena.npz (bounded .npz reading, numpy only) sits below every layer: checkpoints and parameter files
        "bad = [m for m in sys.modules if m.startswith('fedarena.') and not m.startswith('fedarena.platform')"
        " and m != 'fedarena.npz'];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
