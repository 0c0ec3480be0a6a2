"""Kins live on the ground floor (issue 15): beside Team in kinsite, so every app may depend
on them while the apps import each other one way. That one-way rule itself is import-linter's
`layers` contract (pyproject.toml), which scripts/test runs with `lint-imports`."""


def test_kins_live_beside_teams():
    from kinsite.models import Kin, Team

    assert Kin._meta.app_label == "kinsite"
    assert Kin._meta.get_field("team").related_model is Team
    assert Kin._meta.db_table == "sessions_app_kin"  # the table kept its name
