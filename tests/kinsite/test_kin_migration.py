"""Kin's move from sessions_app to kinsite (issue 15; kinsite 0005, memories 0004,
consolidation 0003, sessions_app 0013): a database at the old head migrates forward with its
kins, every foreign key to them, the kin permissions given to people and groups and the
admin log; no table or constraint changes; and it migrates back. Each test migrates this
test database back to the old head, writes rows there with the historical models, then
migrates forward again (and always ends at the newest migrations)."""
from contextlib import contextmanager

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from consolidation.models import Fact
from kinsite.models import Kin, LLMCall, PromptTemplate
from memories.models import Memory
from sessions_app.models import Session

pytestmark = pytest.mark.django_db(transaction=True)

# Every app's newest migration before the move.
OLD_HEAD = [
    ("kinsite", "0004_prompt_template"),
    ("sessions_app", "0012_summary_seen_through"),
    ("memories", "0003_memory_search_scope_gin"),
    ("consolidation", "0002_dashboard_source_and_trigger_skipped_runs"),
]
KIN_TABLE = "sessions_app_kin"
# (table, column) of every foreign key to a kin.
KIN_FOREIGN_KEYS = [
    ("sessions_app_kin", "parent_id"),
    ("sessions_app_session", "kin_id"),
    ("memories_memory", "kin_id"),
    ("consolidation_fact", "kin_id"),
    ("consolidation_consolidationrun", "kin_id"),
    ("consolidation_experienceversion", "kin_id"),
    ("kinsite_llmcall", "kin_id"),
    ("kinsite_prompttemplate", "kin_id"),
]


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    ContentType.objects.clear_cache()


def migrate_to_newest():
    migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())


@contextmanager
def at_old_head():
    """The database at the old head; yields the historical models of that state."""
    migrate(OLD_HEAD)
    try:
        yield MigrationExecutor(connection)._create_project_state(with_applied_migrations=True).apps
    finally:
        migrate_to_newest()


def foreign_keys():
    """{(table, column): (referenced table, referenced column)} of the kin foreign keys."""
    found = {}
    with connection.cursor() as cursor:
        for table, column in KIN_FOREIGN_KEYS:
            for constraint in connection.introspection.get_constraints(cursor, table).values():
                if constraint["foreign_key"] and constraint["columns"] == [column]:
                    found[(table, column)] = tuple(constraint["foreign_key"])
    return found


def kin_content_types():
    return set(ContentType.objects.filter(model="kin").values_list("app_label", flat=True))


def test_kins_and_every_foreign_key_to_them_survive_the_move():
    keys_before = foreign_keys()
    assert keys_before == {key: (KIN_TABLE, "id") for key in KIN_FOREIGN_KEYS}
    with at_old_head() as old:
        assert old.get_model("sessions_app", "Kin")._meta.db_table == KIN_TABLE
        team = old.get_model("kinsite", "Team").objects.create(name="Acme", slug="acme")
        kin = old.get_model("sessions_app", "Kin").objects.create(
            team=team, name="Ada", role="Analyst", model="gpt-x", history_token_budget=1234,
            overrides={"introspection": {"enabled": False}},
        )
        child = old.get_model("sessions_app", "Kin").objects.create(
            team=team, name="Ada's helper", parent=kin, spawn_reason="to search",
        )
        session = old.get_model("sessions_app", "Session").objects.create(kin=kin, title="Plans")
        memory = old.get_model("memories", "Memory").objects.create(team=team, kin=kin, content="Likes tea")
        fact = old.get_model("consolidation", "Fact").objects.create(kin=kin, statement="Likes tea", source="api")
        call = old.get_model("kinsite", "LLMCall").objects.create(
            team=team, kin=kin, purpose="kin_turn", provider="scripted", model="gpt-x", status="ok",
        )
        template = old.get_model("kinsite", "PromptTemplate").objects.create(
            team=team, kin=kin, kind="compaction", name="Ada's", body="{transcript}",
        )
        migrate_to_newest()

        moved = Kin.objects.get(pk=kin.pk)
        assert (moved.team_id, moved.name, moved.role, moved.model, moved.history_token_budget, moved.overrides) == (
            team.pk, "Ada", "Analyst", "gpt-x", 1234, {"introspection": {"enabled": False}})
        assert Kin.objects.get(pk=child.pk).parent == moved
        assert Session.objects.get(pk=session.pk).kin == moved
        assert Memory.objects.get(pk=memory.pk).kin == moved
        assert Fact.objects.get(pk=fact.pk).kin == moved
        assert LLMCall.objects.get(pk=call.pk).kin_id == moved.pk
        assert PromptTemplate.objects.get(pk=template.pk).kin == moved
        assert list(moved.sessions.all()) == [Session.objects.get(pk=session.pk)]
        assert list(moved.children.all()) == [Kin.objects.get(pk=child.pk)]
        assert foreign_keys() == keys_before  # no table or constraint was touched
        assert Kin.objects.create(team=moved.team, name="Newcomer").pk > child.pk


def test_kin_permissions_and_admin_log_follow_the_model():
    User = get_user_model()
    with at_old_head() as old:
        # Migrating back moved the content type back (the reverse of sessions_app 0013).
        assert kin_content_types() == {"sessions_app"}
        kin_type = old.get_model("contenttypes", "ContentType").objects.get(app_label="sessions_app", model="kin")
        permissions = old.get_model("auth", "Permission").objects.filter(content_type=kin_type)
        assert set(permissions.values_list("codename", flat=True)) == {
            "add_kin", "change_kin", "delete_kin", "view_kin"}
        team = old.get_model("kinsite", "Team").objects.create(name="Acme", slug="acme")
        kin = old.get_model("sessions_app", "Kin").objects.create(team=team, name="Ada")
        user = old.get_model("auth", "User").objects.create(username="maria", is_staff=True)
        user.user_permissions.add(permissions.get(codename="view_kin"))
        group = old.get_model("auth", "Group").objects.create(name="Kin editors")
        group.permissions.add(permissions.get(codename="change_kin"))
        old.get_model("auth", "User").objects.create(username="ben", is_staff=True).groups.add(group)
        entry = old.get_model("admin", "LogEntry").objects.create(
            user=user, content_type=kin_type, object_id=str(kin.pk), object_repr="Ada", action_flag=2,
        )
        migrate_to_newest()

        assert kin_content_types() == {"kinsite"}
        assert ContentType.objects.get_for_model(Kin).pk == kin_type.pk
        assert User.objects.get(username="maria").has_perm("kinsite.view_kin")
        assert User.objects.get(username="ben").has_perm("kinsite.change_kin")
        assert not User.objects.get(username="ben").has_perm("kinsite.view_kin")
        assert LogEntry.objects.get(pk=entry.pk).get_admin_url() == f"/admin/kinsite/kin/{kin.pk}/change/"


def test_a_content_type_post_migrate_made_already_is_merged_not_duplicated():
    """`migrate kinsite` alone stops between the two halves of the move, and its
    post_migrate creates (kinsite, kin) and its permissions beside (sessions_app, kin)."""
    User = get_user_model()
    with at_old_head() as old:
        content_types = old.get_model("contenttypes", "ContentType").objects
        Permission_ = old.get_model("auth", "Permission")
        old_type = content_types.get(app_label="sessions_app", model="kin")
        new_type = content_types.create(app_label="kinsite", model="kin")
        for codename in ("add_kin", "change_kin", "delete_kin"):  # no view_kin yet: it moves over
            Permission_.objects.create(content_type=new_type, codename=codename, name=f"Can {codename}")
        old_change = Permission_.objects.get(content_type=old_type, codename="change_kin")
        new_change = Permission_.objects.get(content_type=new_type, codename="change_kin")
        team = old.get_model("kinsite", "Team").objects.create(name="Acme", slug="acme")
        kin = old.get_model("sessions_app", "Kin").objects.create(team=team, name="Ada")
        user = old.get_model("auth", "User").objects.create(username="maria", is_staff=True)
        user.user_permissions.add(old_change, Permission_.objects.get(content_type=old_type, codename="view_kin"))
        group = old.get_model("auth", "Group").objects.create(name="Kin editors")
        group.permissions.add(old_change, new_change)  # granted twice: kept once
        entry = old.get_model("admin", "LogEntry").objects.create(
            user=user, content_type=old_type, object_id=str(kin.pk), object_repr="Ada", action_flag=2,
        )
        migrate_to_newest()

        assert kin_content_types() == {"kinsite"}
        assert ContentType.objects.get_for_model(Kin).pk == new_type.pk
        assert sorted(Permission.objects.filter(content_type_id=new_type.pk).values_list("codename", flat=True)) == [
            "add_kin", "change_kin", "delete_kin", "view_kin"]
        maria = User.objects.get(username="maria")
        assert maria.has_perm("kinsite.change_kin") and maria.has_perm("kinsite.view_kin")
        assert list(Group.objects.get(name="Kin editors").permissions.values_list("pk", flat=True)) == [new_change.pk]
        assert LogEntry.objects.get(pk=entry.pk).content_type_id == new_type.pk
