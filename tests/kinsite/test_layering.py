"""Kins live on the ground floor (issue 15): beside Team in kinsite, so every app may depend
on them while the apps import each other one way. That one-way rule itself is import-linter's
`layers` contract (pyproject.toml), which scripts/test runs with `lint-imports`; its only
exceptions are kinsite's two composition modules, which this mirrors: the project URLconf,
which assembles every app's URLs (issue 28), and create_demo, which builds a whole demo."""
import tomllib
from pathlib import Path

import grimp

APPS = ("memories", "consolidation", "workflows", "sessions_app", "agent_mcp", "transfer", "erasure")
COMPOSITION_MODULES = {"kinsite.urls", "kinsite.management.commands.create_demo"}


def test_kins_live_beside_teams():
    from kinsite.models import Kin, Team

    assert Kin._meta.app_label == "kinsite"
    assert Kin._meta.get_field("team").related_model is Team
    assert Kin._meta.db_table == "sessions_app_kin"  # the table kept its name


def test_only_the_urlconf_and_create_demo_import_an_app_from_kinsite():
    # Imports inside functions count too: grimp reads every import statement of a module.
    graph = grimp.build_graph("kinsite", *APPS, include_external_packages=False, cache_dir=None)
    importers = {
        module for module in graph.modules if module.split(".")[0] == "kinsite"
        and any(target.split(".")[0] in APPS for target in graph.find_modules_directly_imported_by(module))
    }

    assert importers == COMPOSITION_MODULES


def test_the_layers_contract_excepts_only_the_composition_modules():
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    layers = next(c for c in pyproject["tool"]["importlinter"]["contracts"] if c["id"] == "layers")

    assert {rule.split(" -> ")[0] for rule in layers["ignore_imports"]} == COMPOSITION_MODULES
