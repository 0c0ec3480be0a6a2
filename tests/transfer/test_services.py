"""Export and import of a kin (transfer.selectors, transfer.services): the round trip keeps
every row and reference, the import is idempotent per document and team, the imported rows
are found by memory and history search, and the vectors are made again by re-embedding."""
import copy
import json
import uuid

import pytest

from consolidation.models import ConsolidationRun, ExperienceVersion, Fact
from kinsite.llm.providers import provider_override
from kinsite.models import Kin, PromptTemplate
from memories.models import Memory, MemoryChange, MemoryVector
from memories.search.selectors import memory_search
from sessions_app.models import Event, MessageCount, Session, Summary, Turn
from sessions_app.selectors import history_search
from tests.support.scripted_model import ScriptedProvider, hashed_bag_of_words
from tests.transfer.conftest import normalise, table_counts
from transfer.models import KinImport
from transfer.selectors import kin_export_document
from transfer.services import DocumentInvalid, kin_import


@pytest.fixture(autouse=True)
def private_cache(settings):
    # A private cache keeps tests independent of anything cached through Django's cache.
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                                   "LOCATION": f"transfer-tests-{uuid.uuid4()}"}}


def as_json(document: dict) -> dict:
    """The document as a client receives it (through JSON)."""
    return json.loads(json.dumps(document))


def test_export_import_export_gives_the_same_document_apart_from_ids(full_kin, other_team):
    first = as_json(kin_export_document(kin=full_kin, include_sessions=True))
    result = kin_import(team=other_team, document=first)
    second = as_json(kin_export_document(kin=result.kin, include_sessions=True))

    assert result.created and result.kin.team == other_team and result.kin.pk != full_kin.pk
    assert normalise(second) == normalise(first)
    # Something of every kind travelled, and the ids really are new.
    for key in ("prompt_templates", "memories", "memory_changes", "facts", "consolidation_runs",
                "experience_versions", "sessions", "events", "turns", "summaries"):
        assert second[key], key
    assert {row["id"] for row in second["memories"]}.isdisjoint({row["id"] for row in first["memories"]})


def test_without_sessions_the_document_leaves_them_out_and_round_trips(full_kin, other_team):
    first = as_json(kin_export_document(kin=full_kin))
    assert first["includes_sessions"] is False
    assert (first["sessions"], first["events"], first["turns"], first["summaries"]) == ([], [], [], [])
    kin = kin_import(team=other_team, document=first).kin
    assert not Session.objects.filter(kin=kin).exists()
    assert normalise(as_json(kin_export_document(kin=kin))) == normalise(first)


def test_the_document_holds_the_kins_rows_only(full_kin):
    document = kin_export_document(kin=full_kin, include_sessions=True)
    contents = {row["content"] for row in document["memories"]}
    assert "The office closes at six" not in contents  # the team's shared memory
    assert [run["status"] for run in document["consolidation_runs"]] == ["applied"]  # not the rejected attempt
    # Ids of rows a document does not carry (introspection runs) are null in event data.
    end = next(event for event in document["events"] if event["kind"] == "introspection_end")
    assert end["data"]["run"] is None
    assert "embedding_model" not in document["memories"][0] and "vector" not in document["memories"][0]


def test_import_rewrites_every_reference_to_the_new_rows(full_kin, other_team):
    document = as_json(kin_export_document(kin=full_kin, include_sessions=True))
    kin = kin_import(team=other_team, document=document).kin

    old, new = Memory.objects.filter(kin=kin).order_by("pk")
    assert (old.status, old.superseded_by_id, new.content) == ("superseded", new.pk,
                                                                "Maria prefers green tea with lemon")
    assert set(MemoryChange.objects.filter(memory__kin=kin).values_list("memory_id", flat=True)) == {old.pk, new.pk}
    assert MemoryChange.objects.filter(memory=old, action="supersede").get().reason == "newer fact"
    template = PromptTemplate.objects.get(kin=kin, is_active=True)
    assert template.team == other_team
    run = ConsolidationRun.objects.get(kin=kin)
    fact_old, fact_new, pending = Fact.objects.filter(kin=kin).order_by("pk")
    assert (fact_old.memory_id, fact_new.memory_id, pending.memory_id) == (old.pk, new.pk, None)
    assert run.processed_fact_ids == [fact_old.pk, fact_new.pk] and run.superseded_fact_ids == [fact_old.pk]
    assert (fact_old.consolidated_by_run_id, fact_old.superseded_by_run_id, pending.is_consolidated) == (
        run.pk, run.pk, False)
    assert run.template_id == template.pk
    version = ExperienceVersion.objects.get(kin=kin, version=1)
    assert (version.run_id, run.experience_version_id) == (run.pk, version.pk)

    first, second = Session.objects.filter(kin=kin).order_by("pk")
    hello = Event.objects.get(session=first, external_id="ext-1")
    command_message = Event.objects.get(session=first, content="/new Soup")
    command = Event.objects.get(session=first, kind="command")
    assert command.data == {"command": "new", "reply_to": command_message.pk, "introspection_run_id": None,
                            "new_session_id": second.pk}
    assert Event.objects.get(session=second, kind="command").data == {
        "command": "new", "previous_session_id": first.pk, "command_event_id": command_message.pk}
    turn = Turn.objects.get(session=first)
    assert turn.user_message_id == hello.pk and turn.reply.content == "Noted: zucchini soup."
    assert {event.data["turn"] for event in Event.objects.filter(session=first, kind__in=["tool_call", "tool_result"])
            } == {turn.pk}
    end = Event.objects.get(session=first, kind="introspection_end")
    assert (end.data["first_event_id"], end.data["last_event_id"]) == (hello.pk, turn.reply_id)
    assert end.data["memories"] == [{"id": new.pk, "action": "created"}]
    older, newer = Summary.objects.filter(session=first).order_by("pk")
    assert (newer.previous_id, newer.first_event_id, newer.last_event_id, newer.seen_through_id) == (
        older.pk, hello.pk, command_message.pk, command_message.pk)


def test_import_keeps_the_times_of_the_history(full_kin, other_team):
    document = as_json(kin_export_document(kin=full_kin, include_sessions=True))
    kin = kin_import(team=other_team, document=document).kin
    source = Memory.objects.filter(kin=full_kin).order_by("pk").first()
    copied = Memory.objects.filter(kin=kin).order_by("pk").first()
    assert (copied.created_at, copied.updated_at) == (source.created_at, source.updated_at)
    assert Kin.objects.get(pk=kin.pk).created_at == full_kin.created_at
    assert list(Event.objects.filter(session__kin=kin).order_by("pk").values_list("created_at", flat=True)) == list(
        Event.objects.filter(session__kin=full_kin).order_by("pk").values_list("created_at", flat=True))


def test_imported_memories_and_messages_are_found_by_search(full_kin, other_team):
    document = as_json(kin_export_document(kin=full_kin, include_sessions=True))
    kin = kin_import(team=other_team, document=document).kin

    hits = memory_search(team=other_team, kin=kin, query="green tea lemon")
    assert [hit.memory.content for hit in hits][:1] == ["Maria prefers green tea with lemon"]
    assert hits[0].memory.kin_id == kin.pk
    found = history_search(kin=kin, query="zucchini soup", limit=5)
    assert found and {event.session.kin_id for event in found} == {kin.pk}
    assert "zucchini" in found[0].content
    # The message counts (kept by triggers) follow the imported messages too.
    assert sum(MessageCount.objects.filter(session__kin=kin).values_list("message_count", flat=True)) == (
        Event.objects.filter(session__kin=kin, kind="message").count())


def test_the_same_document_twice_gives_the_kin_of_the_first_import(full_kin, other_team):
    document = as_json(kin_export_document(kin=full_kin, include_sessions=True))
    first = kin_import(team=other_team, document=document)
    counts = table_counts()
    again = kin_import(team=other_team, document=copy.deepcopy(document))

    assert (first.created, again.created, again.kin.pk) == (True, False, first.kin.pk)
    assert table_counts() == counts
    assert KinImport.objects.get(team=other_team).kin == first.kin


def test_another_team_or_a_changed_document_imports_anew(full_kin, team, other_team):
    document = as_json(kin_export_document(kin=full_kin))
    kin_a = kin_import(team=other_team, document=document).kin
    kin_b = kin_import(team=team, document=document).kin
    changed = {**document, "kin": {**document["kin"], "name": "Renamed"}}
    kin_c = kin_import(team=other_team, document=changed).kin
    assert len({kin_a.pk, kin_b.pk, kin_c.pk}) == 3 and kin_c.name == "Renamed"


def test_deleting_the_imported_kin_lets_the_document_be_imported_again(full_kin, other_team):
    document = as_json(kin_export_document(kin=full_kin))
    first = kin_import(team=other_team, document=document).kin
    first.delete()
    second = kin_import(team=other_team, document=document)
    assert second.created and second.kin.pk != first.pk


def test_a_bad_reference_deep_in_the_document_writes_nothing(full_kin, other_team):
    document = as_json(kin_export_document(kin=full_kin, include_sessions=True))
    document["summaries"][1]["previous"] = 999_999
    counts = table_counts()
    with pytest.raises(DocumentInvalid) as caught:
        kin_import(team=other_team, document=document)
    assert caught.value.details["errors"] == [
        {"path": "summaries[1].previous", "message": "999999 is not the id of a row in summaries"}]
    assert table_counts() == counts


def test_imported_memories_get_vectors_when_an_embedding_model_is_configured(
        full_kin, other_team, django_capture_on_commit_callbacks):
    class Embedder(ScriptedProvider):
        def vector(self, text):
            return hashed_bag_of_words(text)

    embedder = Embedder()
    embedder.embedding_model = "embed-test"
    document = as_json(kin_export_document(kin=full_kin))
    with provider_override(embedder), django_capture_on_commit_callbacks(execute=True):
        kin = kin_import(team=other_team, document=document).kin
    active = Memory.objects.get(kin=kin, status="active")
    assert MemoryVector.objects.filter(memory=active).exists()
    assert active.embedding_model != ""


def test_a_turn_in_flight_at_export_is_imported_as_failed_not_run_again(full_kin, other_team):
    Turn.objects.filter(session__kin=full_kin).update(status=Turn.Status.PENDING, finished_at=None)
    document = as_json(kin_export_document(kin=full_kin, include_sessions=True))
    assert document["turns"][0]["status"] == "pending"
    kin = kin_import(team=other_team, document=document).kin
    turn = Turn.objects.get(session__kin=kin)
    assert turn.status == Turn.Status.FAILED and "still in progress" in turn.error
    assert turn.finished_at is not None
