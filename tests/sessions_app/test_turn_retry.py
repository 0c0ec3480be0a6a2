"""Retrying a failed chat turn (POST /api/v1/turns/{id}/retry/, sessions_app.turns.turn_retry)
against the real HTTP provider and the local fake OpenAI-compatible server: the stored message
is answered once, a second retry starts no second run, and what cannot be retried says why."""
import pytest

from sessions_app.models import Event, Turn
from sessions_app.turns.services import turn_post, turn_retry
from tests.factories import SessionFactory, TurnFactory
from tests.sessions_app.test_api_access import assert_api_error

pytestmark = pytest.mark.usefixtures("fake_llm_gateway", "empty_cache")


def failed_turn(api_client, chat_session, fake_llm, content="When is the report due?") -> Turn:
    fake_llm.error(401, "bad key")  # not retried by the provider: the turn fails at once
    response = api_client.post(f"/api/v1/sessions/{chat_session.pk}/messages/",
                               {"content": content, "sender": "Maria"}, format="json")
    assert response.status_code == 502, response.content
    return Turn.objects.get(pk=response.json()["error"]["details"]["turn"])


def retry(api_client, turn_id):
    return api_client.post(f"/api/v1/turns/{turn_id}/retry/")


def conversation(session):
    return list(Event.objects.filter(session=session).order_by("created_at", "id").values_list("role", "content"))


def test_a_failed_turn_is_retried_once_with_its_stored_message(
    api_client, chat_session, fake_llm, django_capture_on_commit_callbacks
):
    turn = failed_turn(api_client, chat_session, fake_llm)
    assert turn.status == "failed" and "bad key" in turn.error
    fake_llm.reply("The report is due on Friday.")

    with django_capture_on_commit_callbacks(execute=True):  # eager Celery: the task runs on commit
        response = retry(api_client, turn.pk)

    assert response.status_code == 202, response.content
    body = response.json()["turn"]
    assert body["id"] == turn.pk and body["status"] == "pending" and body["error"] == ""
    assert body["message"]["id"] == turn.user_message_id
    polled = api_client.get(f"/api/v1/turns/{turn.pk}/").json()
    assert polled["status"] == "done" and polled["reply"]["content"] == "The report is due on Friday."
    assert polled["attempts"] == 2  # the failed start and the retry's
    assert conversation(chat_session) == [
        ("user", "When is the report due?"), ("assistant", "The report is due on Friday."),
    ]
    assert Turn.objects.count() == 1
    # The model saw the stored message once, as the one to answer.
    retried_request = fake_llm.requests_to("chat")[-1]
    user_texts = [m["content"] for m in retried_request["messages"] if m["role"] == "user"]
    assert user_texts == ["[Maria] When is the report due?"]


def test_retrying_a_queued_turn_again_starts_no_second_run(
    api_client, chat_session, fake_llm, django_capture_on_commit_callbacks
):
    turn = failed_turn(api_client, chat_session, fake_llm)
    fake_llm.reply("Friday.")

    with django_capture_on_commit_callbacks(execute=False) as queued:
        first = retry(api_client, turn.pk)
        second = retry(api_client, turn.pk)  # a double click, before the worker took the first
    assert first.status_code == second.status_code == 202
    assert first.json()["turn"]["status"] == second.json()["turn"]["status"] == "pending"
    assert len(queued) == 1  # one task sent

    for callback in queued:
        callback()
    turn.refresh_from_db()
    assert turn.status == "done" and turn.reply.content == "Friday."
    assert len(fake_llm.requests_to("chat")) == 2  # the failed call and the retry's
    assert Event.objects.filter(session=chat_session, role="user").count() == 1
    assert Event.objects.filter(session=chat_session, role="assistant").count() == 1


def test_a_done_turn_is_not_retried(api_client, chat_session, fake_llm):
    fake_llm.reply("Hello.")
    done = api_client.post(f"/api/v1/sessions/{chat_session.pk}/messages/", {"content": "Hi"}, format="json")
    turn_id = done.json()["turn"]["id"]

    response = retry(api_client, turn_id)

    assert_api_error(response, 409, "turn_not_failed")
    assert "did not fail" in response.json()["error"]["message"]
    assert len(fake_llm.requests_to("chat")) == 1
    assert Event.objects.filter(session=chat_session).count() == 2


def test_another_teams_turn_answers_404_and_is_left_failed(
    api_client, other_team, fake_llm, django_capture_on_commit_callbacks
):
    from tests.factories import KinFactory

    theirs = SessionFactory(kin=KinFactory(team=other_team))
    fake_llm.error(401, "bad key")
    with django_capture_on_commit_callbacks(execute=True):
        turn = turn_post(session=theirs, content="Hello", is_async=True)
    turn.refresh_from_db()
    assert turn.status == "failed"

    response = retry(api_client, turn.pk)

    assert_api_error(response, 404, "not_found")
    turn.refresh_from_db()
    assert turn.status == "failed" and len(fake_llm.requests_to("chat")) == 1
    assert_api_error(retry(api_client, 999_999), 404, "not_found")


def test_a_turn_of_an_archived_session_is_not_retried(api_client, chat_session, fake_llm):
    from sessions_app.services import session_archive

    turn = failed_turn(api_client, chat_session, fake_llm)
    session_archive(session=chat_session)

    assert_api_error(retry(api_client, turn.pk), 409, "session_archived")
    turn.refresh_from_db()
    assert turn.status == "failed"


def test_a_retried_turn_runs_before_the_turns_posted_after_it(
    chat_session, fake_llm, django_capture_on_commit_callbacks
):
    """Turns of a session answer in post order: the retried turn is the oldest unfinished one,
    so the task of a later queued post answers it first, then the later one."""
    fake_llm.error(401, "bad key")
    with django_capture_on_commit_callbacks(execute=True):
        first = turn_post(session=chat_session, content="First?", sender="Maria", is_async=True)
    with django_capture_on_commit_callbacks(execute=False) as later_task:
        later = turn_post(session=chat_session, content="Second?", sender="Maria", is_async=True)
    with django_capture_on_commit_callbacks(execute=False):
        turn_retry(turn=Turn.objects.select_related("session").get(pk=first.pk))
    fake_llm.reply("To the first.")
    fake_llm.reply("To the second.")

    for callback in later_task:
        callback()  # the later post's task: runs the retried turn first, then sends itself again

    first.refresh_from_db()
    later.refresh_from_db()
    assert first.status == later.status == "done"
    assert (first.reply.content, later.reply.content) == ("To the first.", "To the second.")
    assert first.reply_id < later.reply_id


def test_a_turn_out_of_attempts_runs_once_more_when_retried(
    chat_session, fake_llm, django_capture_on_commit_callbacks
):
    from sessions_app.turns.jobs import TURN_MAX_ATTEMPTS
    from tests.factories import MessageFactory

    message = MessageFactory(session=chat_session, content="Still there?")
    turn = TurnFactory(session=chat_session, user_message=message, status="failed", attempts=TURN_MAX_ATTEMPTS,
                       error="The process running this turn stopped before it finished, 3 times")
    fake_llm.reply("Yes.")

    with django_capture_on_commit_callbacks(execute=True):
        turn_retry(turn=Turn.objects.select_related("session").get(pk=turn.pk))

    turn.refresh_from_db()
    assert turn.status == "done" and turn.reply.content == "Yes." and turn.attempts == TURN_MAX_ATTEMPTS + 1


def test_the_schema_lists_the_retry_endpoint(api_client):
    schema = api_client.get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    operation = schema["paths"]["/api/v1/turns/{turn_id}/retry/"]["post"]
    assert set(operation["responses"]) >= {"202", "409", "503"}
    turn_fields = schema["components"]["schemas"]["Turn"]["properties"]
    assert "attempts" in turn_fields


@pytest.mark.usefixtures("empty_turn_events")
def test_a_follower_of_a_retried_turn_waits_for_the_new_attempt_not_the_failed_ones_end(
    api_client, chat_session, fake_llm, django_capture_on_commit_callbacks
):
    from sessions_app.turns.events import turn_events_read
    from sessions_app.turns.stream import _TurnFollower

    turn = failed_turn(api_client, chat_session, fake_llm)
    with django_capture_on_commit_callbacks(execute=False):
        assert retry(api_client, turn.pk).status_code == 202  # queued; no worker has it yet

    follower = _TurnFollower(turn=turn, done_body=dict, message_body=dict, last_event_id=None)
    follower.take(turn_events_read(turn, after=None, timeout=0))

    assert not follower.ended  # the failed attempt's end is behind the retry's reset
