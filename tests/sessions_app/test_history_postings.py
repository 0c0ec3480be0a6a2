"""History search postings (PostgreSQL, migration 0018): kept right by the event table's
triggers on every write, edit and removal of a message, filled in for existing messages
by the migration, and never making two writers into one session wait for each other."""
import threading

import pytest
from django.db import connection, transaction
from django.db.migrations.executor import MigrationExecutor

from sessions_app.models import Event, Session
from tests.factories import MessageFactory, SessionFactory, ToolCallFactory

pytestmark = pytest.mark.postgres


def postings(event) -> dict[str, tuple]:
    """lexeme -> (session_id, kin_id, tf, doc_length) of the message's postings."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT lexeme, session_id, kin_id, tf, doc_length FROM sessions_app_searchposting"
                       " WHERE event_id = %s", [event.pk])
        return {lexeme: rest for lexeme, *rest in cursor.fetchall()}


def impacts(session, lexeme) -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT event_id FROM sessions_app_searchposting WHERE session_id = %s AND lexeme = %s"
                       " ORDER BY impact DESC", [session.pk, lexeme])
        return [event_id for (event_id,) in cursor.fetchall()]


def test_message_gets_one_posting_per_lexeme_with_sender_matches_counting_half(chat_session):
    message = MessageFactory(session=chat_session, sender="Harbour", content="harbours of the harbour town")

    found = postings(message)

    session, kin = chat_session.pk, chat_session.kin_id
    # 'harbour' twice in the content and once as the sender (half); 'the' and 'of' are stop words.
    assert found == {"harbour": [session, kin, 2.5, 2], "town": [session, kin, 1.0, 2]}


def test_shorter_message_has_the_higher_impact_for_the_same_term(chat_session):
    long = MessageFactory(session=chat_session, content="zeppelin over the grey northern sea at dawn")
    short = MessageFactory(session=chat_session, content="zeppelin")

    assert impacts(chat_session, "zeppelin") == [short.pk, long.pk]


def test_events_that_are_not_messages_get_no_postings(chat_session):
    call = ToolCallFactory(session=chat_session)
    Event.objects.create(session=chat_session, kind=Event.Kind.COMMAND, content="zeppelin")

    assert postings(call) == {}
    assert impacts(chat_session, "zeppelin") == []


def test_bulk_insert_indexes_every_message(chat_session):
    Event.objects.bulk_create([Event(session=chat_session, content=f"zeppelin number {i}") for i in range(50)])

    assert len(impacts(chat_session, "zeppelin")) == 50


def test_edit_of_content_or_sender_replaces_the_postings(chat_session):
    message = MessageFactory(session=chat_session, sender="Maria", content="the zeppelin flew")

    Event.objects.filter(pk=message.pk).update(content="a balloon rose")
    assert set(postings(message)) == {"balloon", "rose", "maria"}
    Event.objects.filter(pk=message.pk).update(sender="Tom")
    assert set(postings(message)) == {"balloon", "rose", "tom"}


def test_edit_of_other_fields_keeps_the_postings(chat_session):
    message = MessageFactory(session=chat_session, content="the zeppelin flew")
    before = postings(message)

    Event.objects.filter(pk=message.pk).update(token_count=99, data={"redacted": False})

    assert postings(message) == before


def test_message_turned_into_another_kind_and_back(chat_session):
    message = MessageFactory(session=chat_session, content="the zeppelin flew")

    Event.objects.filter(pk=message.pk).update(kind=Event.Kind.COMMAND)
    assert postings(message) == {}
    Event.objects.filter(pk=message.pk).update(kind=Event.Kind.MESSAGE)
    assert "zeppelin" in postings(message)


def test_message_moved_to_another_session_moves_its_postings(chat_session):
    message = MessageFactory(session=chat_session, content="the zeppelin flew")
    other = SessionFactory()

    Event.objects.filter(pk=message.pk).update(session=other)

    assert impacts(chat_session, "zeppelin") == [] and impacts(other, "zeppelin") == [message.pk]
    assert postings(message)["zeppelin"][1] == other.kin_id


def test_session_moved_to_another_kin_moves_its_postings(chat_session):
    message = MessageFactory(session=chat_session, content="the zeppelin flew")
    new_kin = SessionFactory().kin

    Session.objects.filter(pk=chat_session.pk).update(kin=new_kin)

    assert postings(message)["zeppelin"][1] == new_kin.pk


def test_deleted_message_and_deleted_session_leave_no_postings(chat_session):
    first = MessageFactory(session=chat_session, content="the zeppelin flew")
    second = MessageFactory(session=chat_session, content="the zeppelin landed")

    first.delete()
    assert postings(first) == {} and impacts(chat_session, "zeppelin") == [second.pk]
    chat_session.delete()
    assert postings(second) == {}


@pytest.mark.django_db(transaction=True)
def test_two_writers_into_one_session_never_wait_for_each_other(chat_session):
    """A writer holds its transaction open after inserting a message; another inserts
    into the same session meanwhile, and must not wait for the first to commit (the
    postings are insert-only: no shared counter row to lock). Different senders, since
    MessageCount (migration 0008) keeps one counter row per session and sender."""
    first_written, second_done = threading.Event(), threading.Event()
    errors = []

    def write(sender, before=None, after=None):
        try:
            with transaction.atomic():
                if before is not None:
                    assert before.wait(10)
                with connection.cursor() as cursor:
                    # A wait on the other writer's locks fails fast instead of hanging.
                    cursor.execute("SET LOCAL lock_timeout = '3s'")
                Event.objects.create(session_id=chat_session.pk, sender=sender, content="the zeppelin flew")
                if after is not None:
                    after.set()
                    assert second_done.wait(10)
            if before is not None:
                second_done.set()
        except Exception as error:  # noqa: BLE001 - reported by the test below
            errors.append(error)
            second_done.set()
        finally:
            connection.close()

    first = threading.Thread(target=write, args=("Ann",), kwargs={"after": first_written})
    second = threading.Thread(target=write, args=("Bob",), kwargs={"before": first_written})
    first.start()
    second.start()
    first.join(20)
    second.join(20)

    assert errors == []
    assert len(impacts(chat_session, "zeppelin")) == 2


@pytest.mark.django_db(transaction=True)
def test_migration_fills_in_existing_messages_and_its_reversal_drops_the_table(chat_session):
    before = [("sessions_app", "0017_field_labels")]
    try:
        MessageFactory(session=chat_session, content="the zeppelin flew")
        MigrationExecutor(connection).migrate(before)
        with connection.cursor() as cursor:
            assert "sessions_app_searchposting" not in connection.introspection.table_names(cursor)
        # Written while the table does not exist: only the migration can index it.
        message = MessageFactory(session=chat_session, sender="Tom", content="harbour lights")
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())

    assert postings(message) == {"harbour": [chat_session.pk, chat_session.kin_id, 1.0, 3],
                                 "light": [chat_session.pk, chat_session.kin_id, 1.0, 3],
                                 "tom": [chat_session.pk, chat_session.kin_id, 0.5, 3]}
    assert len(impacts(chat_session, "zeppelin")) == 1
