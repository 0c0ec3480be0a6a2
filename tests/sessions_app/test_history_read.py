"""The read behind a prompt's history (sessions_app.prompt.reads._history_entries): the newest
history events after the compaction boundary that the budget could need, cut by their
stored token counts before any row is read whole."""
from datetime import timedelta

import pytest
from django.utils import timezone

from sessions_app.models import Event
from sessions_app.prompt import reads
from sessions_app.prompt.reads import Boundary
from tests.factories import MessageFactory, SessionFactory, ToolCallFactory, ToolResultFactory, TurnFactory

START = timezone.now() - timedelta(days=1)


def message(session, minute: int, tokens: int = 100, **kwargs):
    return MessageFactory(session=session, content=f"minute {minute}", token_count=tokens,
                          created_at=START + timedelta(minutes=minute), **kwargs)


def read_ids(session, *, budget: int, summary: Boundary | None = None, turn_id: int | None = None) -> list[int]:
    return list(reads._history_entries(session.pk, summary, budget, turn_id))


def test_a_turn_reads_no_message_posted_after_its_own(chat_session):
    """Async posts queued behind the turn (pending turns) are not its history, wherever
    they were stored; events of turns that ran since are."""
    first, mine, later, reply, latest = (message(chat_session, minute) for minute in range(5))
    own = TurnFactory(session=chat_session, user_message=mine, status="running")
    TurnFactory(session=chat_session, user_message=later, status="pending")
    TurnFactory(session=chat_session, user_message=latest, status="pending")

    assert read_ids(chat_session, budget=10_000, turn_id=own.pk) == [first.pk, mine.pk, reply.pk]
    assert read_ids(chat_session, budget=150, turn_id=own.pk) == [mine.pk, reply.pk]
    assert read_ids(chat_session, budget=10_000) == [first.pk, mine.pk, later.pk, reply.pk, latest.pk]


def test_keeps_every_event_whose_newer_events_fit_and_so_the_one_that_overflows(chat_session):
    events = [message(chat_session, minute) for minute in range(10)]

    # Newer events of the 4th newest: 300 tokens, within 350; of the 5th newest: 400.
    assert read_ids(chat_session, budget=350) == [e.pk for e in events[-4:]]
    assert read_ids(chat_session, budget=400) == [e.pk for e in events[-5:]]
    assert read_ids(chat_session, budget=0) == [events[-1].pk]
    assert read_ids(chat_session, budget=10_000) == [e.pk for e in events]


def test_other_event_kinds_are_neither_read_nor_counted(chat_session):
    older, newer = message(chat_session, 0), message(chat_session, 2)
    Event.objects.create(session=chat_session, kind=Event.Kind.COMMAND, content="/checkpoint", token_count=5_000,
                         created_at=START + timedelta(minutes=1))

    assert read_ids(chat_session, budget=150) == [older.pk, newer.pk]


def test_tool_events_are_read_with_their_data(chat_session):
    message(chat_session, 0)
    ToolCallFactory(session=chat_session, token_count=20, created_at=START + timedelta(minutes=1),
                    data={"tool_calls": [{"id": "c1", "name": "memory_recall", "arguments": "{}"}]})
    result = ToolResultFactory(session=chat_session, content="[]", token_count=5,
                               created_at=START + timedelta(minutes=2), data={"tool_call_id": "c1"})

    entries = list(reads._history_entries(chat_session.pk, None, 10_000).values())

    assert [entry.item.kind for entry in entries] == ["message", "tool_call", "tool_result"]
    assert entries[1].item.tool_call_ids == ("c1",) and entries[1].event.data["tool_calls"][0]["id"] == "c1"
    assert entries[2].message == {"role": "tool", "tool_call_id": "c1", "content": "[]"}
    assert entries[2].event.pk == result.pk and entries[0].event.data == {}


def test_nothing_up_to_the_compaction_boundary_is_read(chat_session):
    events = [message(chat_session, minute) for minute in range(6)]
    summary = Boundary(content="earlier", last_event_id=events[2].pk, last_at=events[2].created_at, message_count=3)

    assert read_ids(chat_session, budget=10_000, summary=summary) == [e.pk for e in events[3:]]


def test_events_of_the_same_time_are_ordered_by_id(chat_session):
    first = message(chat_session, 0)
    same = [message(chat_session, 5) for _ in range(3)]

    assert read_ids(chat_session, budget=150) == [same[1].pk, same[2].pk]
    assert read_ids(chat_session, budget=10_000) == [first.pk, *[e.pk for e in same]]


def test_the_read_is_bounded_whatever_the_budget(chat_session, monkeypatch):
    events = [message(chat_session, minute, tokens=0) for minute in range(8)]
    monkeypatch.setattr(reads, "HISTORY_MAX_EVENTS", 5)

    assert read_ids(chat_session, budget=10_000) == [e.pk for e in events[-5:]]


def test_other_sessions_are_not_read(chat_session, kin):
    mine = message(chat_session, 0)
    message(SessionFactory(kin=kin), 1)

    assert read_ids(chat_session, budget=10_000) == [mine.pk]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)  # VACUUM cannot run inside the test's transaction
@pytest.mark.parametrize("for_turn", [False, True], ids=["preview", "turn"])
def test_the_cut_is_made_from_the_token_index_alone(chat_session, for_turn):
    """On PostgreSQL the token sums come from an index-only scan of event_history_tokens
    (once the table is vacuumed, as autovacuum keeps a live one), and the rows read whole
    are the events within the cut, not the whole window; for a turn too, whose later
    posts are left out by their ids."""
    from django.db import connection

    # Other sessions' events, as in any real table: with a table of one session only, PostgreSQL
    # rightly scans it whole for a turn's cut (its later posts' filter shifts the estimates).
    other = SessionFactory(kin=chat_session.kin)
    Event.objects.bulk_create([Event(session=other, content="x", token_count=100) for _ in range(5_000)])
    events = [message(chat_session, minute) for minute in range(300)]
    turn_id = None
    if for_turn:
        turn_id = TurnFactory(session=chat_session, user_message=events[-4], status="running").pk
        for later in events[-3:]:
            TurnFactory(session=chat_session, user_message=later, status="pending")
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE sessions_app_event")
    captured = []

    def capture(execute, sql, params, many, ctx):
        captured.append((sql, params))
        return execute(sql, params, many, ctx)

    with connection.execute_wrapper(capture):
        assert len(read_ids(chat_session, budget=1_000, turn_id=turn_id)) == 11
    [(sql, params)] = captured
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
        plan = cursor.fetchone()[0][0]["Plan"]

    def scans(node):
        if node.get("Relation Name") == "sessions_app_event":
            yield node
        for child in node.get("Plans", ()):
            yield from scans(child)

    event_scans = list(scans(plan))
    index_only = [node for node in event_scans if node["Node Type"] == "Index Only Scan"]
    assert [node["Index Name"] for node in index_only] == ["event_history_tokens"], event_scans
    assert index_only[0]["Heap Fetches"] == 0
    assert all(node["Actual Rows"] <= 11 for node in event_scans if node not in index_only), event_scans
