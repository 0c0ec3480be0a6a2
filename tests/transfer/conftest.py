"""A kin with something in every table a kin document carries, and the helpers the
transfer tests share (normalising ids, counting every table's rows)."""
import datetime as dt

import pytest
from django.apps import apps

from consolidation.models import ConsolidationRun, Fact
from kinsite.models import PromptTemplate
from memories.models import Memory, MemoryChange
from sessions_app.models import Event, Turn
from tests.factories import (
    ConsolidationRunFactory,
    ExperienceVersionFactory,
    FactFactory,
    IntrospectionRunFactory,
    MemoryChangeFactory,
    MemoryFactory,
    MessageFactory,
    PromptTemplateFactory,
    SessionFactory,
    SummaryFactory,
    ToolCallFactory,
    ToolResultFactory,
    TurnFactory,
)
from transfer.format import EVENT_DATA_REFS, SECTIONS

T0 = dt.datetime(2026, 3, 2, 9, 15, tzinfo=dt.UTC)


def at(minutes: int) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


def build_full_kin(kin):
    """Rows in every section of a kin document, with references of every kind between them."""
    kin.character = "Careful & <b>brief</b>."
    kin.overrides = {"introspection": {"turn_interval": 3}}
    kin.history_token_budget = 20_000
    kin.save()
    template = PromptTemplateFactory(kin=kin, kind=PromptTemplate.Kind.CONSOLIDATION, name="Kin consolidation")
    PromptTemplateFactory(kin=kin, kind=PromptTemplate.Kind.COMPACTION, name="Old compaction", is_active=False)
    old = MemoryFactory(kin=kin, content="Maria prefers tea", subject="Maria", status=Memory.Status.SUPERSEDED,
                        category=Memory.Category.PREFERENCE, importance=6)
    new = MemoryFactory(kin=kin, content="Maria prefers green tea with lemon", subject="Maria",
                        category=Memory.Category.PREFERENCE, importance=8, retrieval_count=4,
                        last_retrieved_at=at(30), source=Memory.Source.INTROSPECTION,
                        source_ref="introspection_run:12")
    Memory.objects.filter(pk=old.pk).update(superseded_by=new, created_at=at(1), updated_at=at(2))
    Memory.objects.filter(pk=new.pk).update(created_at=at(3), updated_at=at(4))
    MemoryChangeFactory(memory=old, action=MemoryChange.Action.ADD, after={"content": old.content})
    MemoryChangeFactory(memory=old, action=MemoryChange.Action.SUPERSEDE, before={"status": "active"},
                        after={"status": "superseded"}, actor="consolidation_run:7", reason="newer fact")
    MemoryChangeFactory(memory=new, action=MemoryChange.Action.ADD, after={"content": new.content})
    # A memory shared by the team: not the kin's, not exported.
    MemoryFactory(kin=None, team=kin.team, content="The office closes at six")

    fact_old = FactFactory(kin=kin, statement="Maria prefers tea", memory=old, source=Fact.Source.INTROSPECTION)
    fact_new = FactFactory(kin=kin, statement="Maria prefers green tea", memory=new)
    FactFactory(kin=kin, statement="Deploys happen on Fridays")  # pending
    run = ConsolidationRunFactory(kin=kin, status=ConsolidationRun.Status.APPLIED, template=template,
                                  template_source="kin", processed_fact_ids=[fact_old.pk, fact_new.pk],
                                  superseded_fact_ids=[fact_old.pk], summary_of_changes="Tea, updated.",
                                  word_count=12, night=dt.date(2026, 3, 2), trigger=ConsolidationRun.Trigger.NIGHTLY,
                                  started_at=at(40), finished_at=at(41))
    ConsolidationRunFactory(kin=kin, status=ConsolidationRun.Status.REJECTED)  # audit of an attempt: not exported
    version = ExperienceVersionFactory(kin=kin, version=1, run=run, word_count=12,
                                       markdown="# Master AI Experience\n## 1. User Directives & Preferences\n"
                                                "- Maria drinks green tea.\n")
    ExperienceVersionFactory(kin=kin, version=2, run=None, markdown="# Master AI Experience\n- edited by hand\n")
    ConsolidationRun.objects.filter(pk=run.pk).update(experience_version=version)
    Fact.objects.filter(pk__in=[fact_old.pk, fact_new.pk]).update(is_consolidated=True, consolidated_by_run=run)
    Fact.objects.filter(pk=fact_old.pk).update(status=Fact.Status.SUPERSEDED, superseded_by_run=run)

    first = SessionFactory(kin=kin, title="Tea talk", working_memory="Maria: tea", description="About tea",
                           last_activity_at=at(50))
    hello = MessageFactory(session=first, content="Hello, remember that I like zucchini soup", created_at=at(10),
                           external_id="ext-1")
    reply = MessageFactory(session=first, content="Noted: zucchini soup.", role=Event.Role.ASSISTANT,
                           sender=kin.name, created_at=at(11))
    turn = TurnFactory(session=first, user_message=hello, reply=reply, status=Turn.Status.DONE, tool_calls=1)
    ToolCallFactory(session=first, created_at=at(10) + dt.timedelta(seconds=5),
                    data={"tool_calls": [{"id": "call_1", "name": "memorize", "arguments": "{}"}], "turn": turn.pk})
    ToolResultFactory(session=first, created_at=at(10) + dt.timedelta(seconds=6),
                      data={"tool_call_id": "call_1", "name": "memorize", "turn": turn.pk})
    intro_run = IntrospectionRunFactory(session=first, status="done")
    Event.objects.create(session=first, kind=Event.Kind.INTROSPECTION_END, role=Event.Role.SYSTEM,
                         content="Stored 1 memory.", created_at=at(12),
                         data={"run": intro_run.pk, "first_event_id": hello.pk, "last_event_id": reply.pk,
                               "memories": [{"id": new.pk, "action": "created"}]})
    command = MessageFactory(session=first, content="/new Soup", created_at=at(13))
    second = SessionFactory(kin=kin, title="Soup", last_activity_at=at(60))
    Event.objects.create(session=first, kind=Event.Kind.COMMAND, role=Event.Role.SYSTEM, content="Started anew.",
                         created_at=at(13), data={"command": "new", "reply_to": command.pk,
                                                  "introspection_run_id": intro_run.pk, "new_session_id": second.pk})
    Event.objects.create(session=second, kind=Event.Kind.COMMAND, role=Event.Role.SYSTEM, content="Continues.",
                         created_at=at(14), data={"command": "new", "previous_session_id": first.pk,
                                                  "command_event_id": command.pk})
    late = MessageFactory(session=second, content="Pumpkin soup, too", created_at=at(15))
    summary = SummaryFactory(session=first, first_event=hello, last_event=reply, message_count=2,
                             content="Maria likes zucchini soup.")
    SummaryFactory(session=first, first_event=hello, last_event=command, message_count=3, previous=summary,
                   seen_through_id=command.pk, content="Maria likes soups.")
    return {"memory": new, "late": late, "session": first}


@pytest.fixture
def full_kin(kin):
    build_full_kin(kin)
    return kin


def normalise(document: dict) -> dict:
    """The document with every id replaced by its row's position (the same rows in the same
    order get the same numbers whatever their ids) and exported_at dropped."""
    position = {key: {row["id"]: index for index, row in enumerate(document[key])} for key in
                (section.key for section in SECTIONS)}
    out = {key: value for key, value in document.items() if key != "exported_at"}
    out["kin"] = {**document["kin"], "id": 0}
    for section in SECTIONS:
        rows = []
        for row in document[section.key]:
            row = {**row, "id": position[section.key][row["id"]]}
            for name, (target, _nullable) in section.refs.items():
                if row[name] is not None:
                    row[name] = position[target][row[name]]
            for name, target in section.id_lists.items():
                row[name] = [position[target][value] for value in row[name]]
            if section.key == "events":
                data = dict(row["data"])
                for key, target in EVENT_DATA_REFS.items():
                    if data.get(key) is not None:
                        data[key] = position[target][data[key]]
                if data.get("memories"):
                    data["memories"] = [{**item, "id": position["memories"].get(item["id"])}
                                        for item in data["memories"]]
                row["data"] = data
            rows.append(row)
        out[section.key] = rows
    return out


def table_counts() -> dict[str, int]:
    """Rows of every table of the project's apps (and auth), to show an import changed nothing."""
    labels = {"kinsite", "memories", "consolidation", "sessions_app", "workflows", "transfer", "auth"}
    return {
        model._meta.db_table: model.objects.count()
        for model in apps.get_models()
        if model._meta.app_label in labels
    }
