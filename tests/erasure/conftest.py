"""A kin holding a person's text in every store an erasure reaches, beside text that is not
theirs, and a way to look for their text in every row of the database."""
import datetime as dt
import struct

import pytest
from django.apps import apps
from django.core import serializers
from django.db import connection

from consolidation.models import ConsolidationRun
from kinsite.models import ApiToken, LLMCall
from memories.models import Memory, MemoryChange
from memories.services import memory_vector_set
from sessions_app.models import Event, Turn
from tests.factories import (
    CompactionRunFactory,
    ConsolidationRunFactory,
    ExperienceVersionFactory,
    FactFactory,
    IntrospectionRunFactory,
    LLMCallFactory,
    MemoryChangeFactory,
    MemoryFactory,
    MessageFactory,
    SessionFactory,
    SummaryFactory,
    ToolCallFactory,
    ToolResultFactory,
    TurnFactory,
)

T0 = dt.datetime(2026, 11, 2, 9, 0, tzinfo=dt.UTC)
# What identifies Zelda's text wherever it is: her name, and what only she said.
HERS = ("zelda", "lark lane", "heron street")
# Text of others that must stay.
KEPT = ("weather is mild", "office closes at six", "deploys happen on fridays", "standup at nine")


def at(minutes: int) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


def build_zelda(kin) -> dict:
    session = SessionFactory(kin=kin, title="Support", description="Zelda's move",
                             working_memory="Zelda Quist is moving soon\nTeam standup at nine")
    hers = MessageFactory(session=session, sender="Zelda Quist", content="My flat is at 12 Lark Lane",
                          created_at=at(1), external_id="z-1")
    turn = TurnFactory(session=session, user_message=hers, status=Turn.Status.DONE)
    call = ToolCallFactory(session=session, created_at=at(1) + dt.timedelta(seconds=2),
                           data={"tool_calls": [{"id": "c1", "name": "memorize", "arguments": '{"content": "flat"}'}],
                                 "turn": turn.pk})
    result = ToolResultFactory(session=session, created_at=at(1) + dt.timedelta(seconds=3),
                               content='{"stored": true}', data={"tool_call_id": "c1", "turn": turn.pk})
    reply = MessageFactory(session=session, sender=kin.name, role=Event.Role.ASSISTANT,
                           content="Noted, 12 Heron Street is close to you.", created_at=at(2))
    Turn.objects.filter(pk=turn.pk).update(reply=reply)
    about = MessageFactory(session=session, sender="Bob", content="ZELDA said she likes hiking", created_at=at(3))
    other = MessageFactory(session=session, sender="Bob", content="The weather is mild today", created_at=at(4))
    summary = SummaryFactory(session=session, first_event=hers, last_event=reply, message_count=2,
                             content="A user gave an address.")
    pending = TurnFactory(session=session, user_message=MessageFactory(
        session=session, sender="Zelda Quist", content="Are you there?", created_at=at(5)))

    named = MemoryFactory(kin=kin, subject="Zelda", content="Lives at 12 Lark Lane", category=Memory.Category.FACT)
    memory_vector_set(memory_id=named.pk, vector=struct.pack("<4f", 0.1, 0.2, 0.3, 0.4))
    derived = MemoryFactory(kin=kin, content="The user lives near a park", source=Memory.Source.INTROSPECTION,
                            source_ref=f"event:{hers.pk}")
    kept = MemoryFactory(kin=kin, content="The office closes at six")
    memory_vector_set(memory_id=kept.pk, vector=struct.pack("<4f", 0.4, 0.3, 0.2, 0.1))
    MemoryChangeFactory(memory=kept, action=MemoryChange.Action.UPDATE,
                        before={"content": "Zelda said the office closes at six"},
                        after={"content": "The office closes at six"}, reason="Zelda asked")
    shared = MemoryFactory(kin=None, team=kin.team, content="Zelda Quist is a customer")

    FactFactory(kin=kin, statement="Zelda Quist prefers email")
    FactFactory(kin=kin, statement="Deploys happen on Fridays")
    ExperienceVersionFactory(kin=kin, version=1,
                             markdown="# Experience\n- Zelda likes hiking\n- Deploys happen on Fridays\n")
    ExperienceVersionFactory(kin=kin, version=2,
                             markdown="# Experience\n- Zelda Quist lives on Lark Lane\n- Deploys happen on Fridays\n")

    IntrospectionRunFactory(session=session, status="done", summary="Stored Zelda's address.",
                            tool_calls=[{"name": "memorize", "arguments": {"content": "Zelda: 12 Lark Lane"},
                                         "result": "ok"}])
    CompactionRunFactory(session=session, status="failed", error="model refused: Zelda Quist")
    ConsolidationRunFactory(kin=kin, status=ConsolidationRun.Status.APPLIED,
                            rendered_prompt="Facts:\n- Zelda Quist prefers email\n- Deploys happen on Fridays",
                            raw_answers=['{"experience": "- Zelda Quist prefers email"}'],
                            summary_of_changes="Added Zelda's preference.")
    LLMCallFactory(team=kin.team, kin=kin, status=LLMCall.Status.ERROR, error="400: bad input near 'Zelda Quist'")
    return {"session": session, "hers": hers, "about": about, "other": other, "turn": turn, "pending": pending,
            "named": named, "derived": derived, "kept": kept, "shared": shared, "summary": summary,
            "tool_events": [call, result], "reply": reply}


@pytest.fixture
def zelda(kin):
    return build_zelda(kin)


def database_text(exclude_apps=("erasure",)) -> str:
    """Every row of every project table (and auth), as lowercase JSON, plus the full-text
    index of messages (SQLite's FTS5 table; PostgreSQL's postings keep lexemes). API tokens
    are left out: a request stamps its token's last use."""
    labels = {"kinsite", "memories", "consolidation", "sessions_app", "workflows", "transfer", "auth"}
    parts = []
    for model in apps.get_models():
        if model._meta.app_label in labels and model._meta.app_label not in exclude_apps and model is not ApiToken:
            parts.append(serializers.serialize("json", model.objects.all()))
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("SELECT sender, content FROM sessions_app_event_fts")
        else:
            cursor.execute("SELECT lexeme FROM sessions_app_searchposting")
        parts.append(repr(cursor.fetchall()))
    return "\n".join(parts).lower()
