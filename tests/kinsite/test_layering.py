"""The apps import each other one way (issue 15): kinsite (teams, kins, the LLM gateway,
prompt templates) → memories → consolidation → sessions_app and workflows. A module imports
nothing of an app above its own, counting the imports inside functions and under
TYPE_CHECKING too. Kinsite's composition modules — the dashboard shell and its URLs, and
create_demo, which builds a whole demo — are the exceptions: they wire every app together."""
import ast
from pathlib import Path

import pytest
from django.conf import settings

BASE = Path(settings.BASE_DIR)
# Each app and the apps above it, which it may not import.
ABOVE = {
    "kinsite": {"memories", "consolidation", "sessions_app", "workflows"},
    "memories": {"consolidation", "sessions_app", "workflows"},
    "consolidation": {"sessions_app", "workflows"},
}
COMPOSITION = {"kinsite/dashboard_urls.py", "kinsite/views.py", "kinsite/management/commands/create_demo.py"}


def imported_apps(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules.add(node.module)
        elif isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
    return {module.split(".")[0] for module in modules}


@pytest.mark.parametrize("app", sorted(ABOVE))
def test_an_app_imports_nothing_of_the_apps_above_it(app):
    upward = {}
    for path in sorted((BASE / app).rglob("*.py")):
        name = path.relative_to(BASE).as_posix()
        if "migrations" in path.parts or name in COMPOSITION:
            continue
        if found := imported_apps(path) & ABOVE[app]:
            upward[name] = sorted(found)
    assert upward == {}


def test_kins_live_beside_teams():
    from kinsite.models import Kin, Team

    assert Kin._meta.app_label == "kinsite"
    assert Kin._meta.get_field("team").related_model is Team
    assert Kin._meta.db_table == "sessions_app_kin"  # the table kept its name
