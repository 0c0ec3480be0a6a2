"""The workflows modules import each other in one direction only: no loop, counting the
imports inside functions too (they are loops all the same, only deferred)."""
import ast
from pathlib import Path

import workflows

ROOT = Path(workflows.__file__).parent


def _module_name(path: Path) -> str:
    parts = ["workflows", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in ROOT.rglob("*.py") if "migrations" not in p.parts}
    graph = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("workflows"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    targets.add(full if full in modules else node.module)
            elif isinstance(node, ast.Import):
                targets.update(a.name for a in node.names if a.name.startswith("workflows"))
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def _a_loop(graph: dict[str, set[str]]) -> list[str]:
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(module: str) -> list[str]:
        state[module] = "open"
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state and (loop := visit(target)):
                return loop
        state[module] = "done"
        path.pop()
        return []

    for module in sorted(graph):
        if module not in state and (loop := visit(module)):
            return loop
    return []


def test_workflows_modules_have_no_import_loop():
    graph = _imports()

    assert {"workflows.executor", "workflows.selectors", "workflows.services", "workflows.tasks"} <= set(graph)
    assert _a_loop(graph) == []
