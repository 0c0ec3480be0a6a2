"""One writer format for every source_ref (kinsite.actors): each writer stores
"<kind>:<value>", the services refuse any other text, the demo data follows it, and
migration memories.0013 rewrites the two older shapes (the API's bare token prefix,
the demo's "create_demo")."""
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from consolidation.models import Fact
from consolidation.services import fact_record
from kinsite.actors import writer_ref_parse
from kinsite.models import ApiToken
from memories import services
from memories.models import Memory, MemoryChange

API = "/api/v1/"


@pytest.mark.django_db
def test_an_api_memory_names_its_token_as_the_mcp_and_fact_writers_do(api_client, kin):
    token = ApiToken.objects.get(name="test")

    body = {"content": "Reports go out on Fridays.", "category": "fact"}
    response = api_client.post(f"{API}kins/{kin.pk}/memories/", body, format="json")

    assert response.status_code == 201
    assert response.json()["source_ref"] == f"token:{token.prefix}"
    memory = Memory.objects.get()
    assert memory.source_ref == memory.changes.get().actor == f"token:{token.prefix}"


@pytest.mark.django_db
@pytest.mark.parametrize("text", ["ks_ab12cd", "create_demo", "kin:4", "token:", "token: ", "somebody:else"])
def test_the_services_refuse_a_source_ref_in_no_writer_format(team, kin, text):
    with pytest.raises(ValueError, match="<kind>:<value>"):
        services.memory_add(team=team, kin=kin, content="Anything", actor=services.Actor("test"), source_ref=text)
    with pytest.raises(ValueError, match="<kind>:<value>"):
        fact_record(kin=kin, statement="Anything", source=Fact.Source.API, source_ref=text)

    assert (Memory.objects.count(), MemoryChange.objects.count(), Fact.objects.count()) == (0, 0, 0)


@pytest.mark.django_db
def test_every_source_ref_of_the_demo_data_is_a_writer_reference(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        call_command("create_demo", stdout=StringIO())

    refs = [*Memory.objects.values_list("source_ref", flat=True), *Fact.objects.values_list("source_ref", flat=True)]
    assert refs and all(ref == "" or writer_ref_parse(ref) is not None for ref in refs)
    assert "command:create_demo" in refs


# --- migration 0013 ----------------------------------------------------------------------------

BEFORE = [("memories", "0012_memory_term_counts")]


def _migrate(targets):
    MigrationExecutor(connection).migrate(targets)


@pytest.mark.django_db(transaction=True)
def test_migration_0013_rewrites_the_older_shapes_and_back(team, kin):
    _migrate(BEFORE)
    try:
        old = MigrationExecutor(connection)._create_project_state(with_applied_migrations=True).apps
        OldMemory = old.get_model("memories", "Memory")
        rows = {
            ("api", "ks_ab12cd"): "token:ks_ab12cd",
            ("admin", "create_demo"): "command:create_demo",
            ("turn", "event:12"): "event:12",
            ("api", ""): "",
        }
        ids = {}
        for number, (source, ref) in enumerate(rows):
            ids[(source, ref)] = OldMemory.objects.create(team_id=team.pk, kin_id=kin.pk, content=f"memory {number}",
                                                          source=source, source_ref=ref).pk
        _migrate([("memories", "0013_source_ref_writer_format")])
        assert {key: Memory.objects.get(pk=pk).source_ref for key, pk in ids.items()} == rows

        _migrate(BEFORE)
        back = {key: OldMemory.objects.get(pk=pk).source_ref for key, pk in ids.items()}
        assert back == {key: key[1] for key in rows}
    finally:
        _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())
