"""No module of the project imports itself back through other modules (issue 15): no import
loop, counting the imports inside functions and under TYPE_CHECKING (a deferred loop is a
loop all the same). import-linter's contracts (pyproject.toml, run by scripts/test) keep the
apps' layers and the siblings of each package acyclic; this looks at single modules across
the whole project, composition modules included, and at a package and its own children."""
import grimp

PACKAGES = ("kinsite", "memories", "consolidation", "workflows", "sessions_app", "agent_mcp", "transfer", "erasure")


def _graph() -> dict[str, set[str]]:
    graph = grimp.build_graph(*PACKAGES, include_external_packages=False, cache_dir=None)
    return {module: graph.find_modules_directly_imported_by(module) - {module} for module in graph.modules}


def _a_loop(graph: dict[str, set[str]]) -> list[str]:
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(module: str) -> list[str]:
        state[module] = "open"
        path.append(module)
        for target in sorted(graph.get(module, ())):
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


def test_the_loop_finder_finds_a_loop_and_only_a_loop():
    assert _a_loop({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _a_loop({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_no_module_imports_itself_back():
    graph = _graph()

    assert {"kinsite.jobs", "memories.services", "workflows.executor", "consolidation.services"} <= set(graph)
    assert "kinsite.models" in graph["kinsite.admin_mixins"]  # imported only inside its functions
    assert _a_loop(graph) == []
