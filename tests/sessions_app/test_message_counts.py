"""MessageCount rows are kept by database triggers (migration 0008): after any write of
messages they equal a GROUP BY over the session's messages, on both databases."""
from datetime import timedelta

from django.db.models import Count, Max
from django.utils import timezone

from sessions_app.models import Event, MessageCount
from sessions_app.services import ImportItem, messages_import
from tests.factories import SessionFactory


def truth(session) -> set[tuple]:
    rows = (
        Event.objects.filter(session=session, kind=Event.Kind.MESSAGE)
        .values("role", "sender", "platform")
        .annotate(count=Count("id"), last_at=Max("created_at"))
        .order_by()
    )
    return {(r["role"], r["sender"], r["platform"], r["count"], r["last_at"]) for r in rows}


def counters(session) -> set[tuple]:
    return set(MessageCount.objects.filter(session=session).values_list(
        "role", "sender", "platform", "message_count", "last_at"))


def message(session, *, sender="Ana", platform="web", role="user", kind="message", at=None, **fields):
    return Event.objects.create(session=session, kind=kind, role=role, sender=sender, platform=platform,
                                content=fields.pop("content", "hello"), created_at=at or timezone.now(), **fields)


def test_counts_follow_inserts_of_every_kind_of_writer(chat_session):
    start = timezone.now() - timedelta(days=1)
    message(chat_session, at=start)
    message(chat_session, at=start + timedelta(minutes=5))
    message(chat_session, sender="Bo", platform="slack", at=start + timedelta(minutes=1))
    message(chat_session, role="assistant", sender="Kin", at=start + timedelta(minutes=2))
    # Not messages: never counted.
    message(chat_session, kind="tool_call", role="assistant", sender="Kin")
    message(chat_session, kind="command", content="/checkpoint")
    assert counters(chat_session) == truth(chat_session) == {
        ("user", "Ana", "web", 2, start + timedelta(minutes=5)),
        ("user", "Bo", "slack", 1, start + timedelta(minutes=1)),
        ("assistant", "Kin", "web", 1, start + timedelta(minutes=2)),
    }


def test_an_import_counts_only_the_rows_the_database_kept(chat_session):
    start = timezone.now() - timedelta(hours=3)
    items = [ImportItem(content=f"m{i}", sender="Ana" if i % 2 else "Bo", external_id=f"x{i}",
                        created_at=start + timedelta(seconds=i)) for i in range(40)]
    assert messages_import(session=chat_session, items=items).created == 40
    # Re-importing skips everything; a concurrent duplicate that only the unique
    # constraint drops (ignore_conflicts) is not counted either.
    assert messages_import(session=chat_session, items=items).created == 0
    Event.objects.bulk_create(
        [Event(session=chat_session, content="dup", sender="Ana", external_id="x1", created_at=timezone.now())],
        ignore_conflicts=True,
    )
    assert counters(chat_session) == truth(chat_session)
    assert sum(row[3] for row in counters(chat_session)) == 40


def test_deletes_and_updates_keep_counts_and_newest_times(chat_session):
    start = timezone.now() - timedelta(hours=1)
    first = message(chat_session, at=start)
    newest = message(chat_session, at=start + timedelta(minutes=10))
    bo = message(chat_session, sender="Bo", at=start + timedelta(minutes=3))
    newest.delete()  # the newest time goes back to the one before
    assert counters(chat_session) == truth(chat_session) == {
        ("user", "Ana", "web", 1, start), ("user", "Bo", "web", 1, start + timedelta(minutes=3))}

    Event.objects.filter(pk=bo.pk).update(sender="Ana", platform="web")  # Bo's only message moves to Ana
    assert counters(chat_session) == truth(chat_session) == {("user", "Ana", "web", 2, start + timedelta(minutes=3))}

    Event.objects.filter(pk=first.pk).update(kind=Event.Kind.COMMAND)  # no longer a message
    Event.objects.filter(session=chat_session, kind=Event.Kind.MESSAGE).delete()
    assert counters(chat_session) == truth(chat_session) == set()


def test_sessions_are_counted_apart_and_deleting_one_leaves_the_other(chat_session):
    other = SessionFactory(kin=chat_session.kin)
    message(chat_session)
    message(other)
    message(other)
    chat_session.delete()
    assert not MessageCount.objects.filter(session_id=chat_session.pk).exists()
    assert counters(other) == truth(other) == {("user", "Ana", "web", 2, Event.objects.filter(session=other)
                                                  .latest("created_at").created_at)}
