"""A failed turn in the dashboard chat, through Django's test client against the local fake
OpenAI-compatible server: the entry says what failed and what to check, links the turn and its
model calls, hides where the model lives from members (staff, who configure it, see it), and
its Retry (a plain form post, or htmx) answers the stored message once."""
import pytest
from django.urls import reverse

from kinsite.models import LLMCall
from sessions_app.models import Event, Turn

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fake_llm_gateway", "empty_cache")]


@pytest.fixture
def logged_in(client, user, team):
    client.force_login(user)
    return client


def page_url(session):
    return reverse("dashboard:session_detail", args=[session.pk])


def retry_url(turn):
    return reverse("dashboard:session_turn_retry", args=[turn.session_id, turn.pk])


def failed_turn(client, session, fake_llm) -> Turn:
    fake_llm.error(401, "Incorrect API key provided")
    response = client.post(reverse("dashboard:session_post", args=[session.pk]), {"content": "Are you there?"})
    assert response.status_code == 302
    return Turn.objects.get(status="failed")


def test_a_failed_turn_shows_what_failed_what_to_check_and_retry(logged_in, chat_session, fake_llm, settings):
    settings.LLM_BASE_URL = fake_llm.base_url
    turn = failed_turn(logged_in, chat_session, fake_llm)
    call = LLMCall.objects.get(status="error")

    page = logged_in.get(page_url(chat_session)).content.decode()

    assert "The kin could not answer:" in page and "Incorrect API key provided" in page
    assert "<code>…/chat/completions</code>" in page and "<code>fake-model</code>" in page
    assert "Check <code>LLM_BASE_URL</code>, the API key" in page
    assert f'href="{reverse("dashboard:model_call_detail", args=[call.pk])}"' in page
    assert f"GET /api/v1/turns/{turn.pk}/" in page
    assert f'action="{retry_url(turn)}"' in page and ">Retry</button>" in page
    host = fake_llm.base_url.split("://", 1)[1].split("/", 1)[0]
    assert host not in page  # a member (here a team owner) never sees where the model lives


def test_staff_see_the_configured_endpoint(logged_in, user, chat_session, fake_llm, settings):
    settings.LLM_BASE_URL = fake_llm.base_url
    failed_turn(logged_in, chat_session, fake_llm)
    user.is_staff = True
    user.save(update_fields=["is_staff"])

    page = logged_in.get(page_url(chat_session)).content.decode()

    assert f"<code>{fake_llm.base_url}/chat/completions</code>" in page


def test_retry_without_javascript_answers_the_stored_message_once(
    logged_in, chat_session, fake_llm, django_capture_on_commit_callbacks
):
    turn = failed_turn(logged_in, chat_session, fake_llm)
    fake_llm.reply("Yes, I am here.")

    with django_capture_on_commit_callbacks(execute=True):
        response = logged_in.post(retry_url(turn))

    message_id = turn.user_message_id
    assert response.status_code == 302
    assert response["Location"] == f"{page_url(chat_session)}?event={message_id}#event-{message_id}"
    page = logged_in.get(response["Location"]).content.decode()
    assert "Yes, I am here." in page and "could not answer" not in page and ">Retry</button>" not in page
    assert list(Event.objects.filter(session=chat_session).values_list("role", "content")) == [
        ("user", "Are you there?"), ("assistant", "Yes, I am here."),
    ]


@pytest.mark.django_db(transaction=True)  # commits as the server does: eager Celery runs the turn in the request
def test_retry_with_htmx_swaps_in_the_answer_and_a_second_click_changes_nothing(logged_in, chat_session, fake_llm):
    turn = failed_turn(logged_in, chat_session, fake_llm)
    fake_llm.reply("Yes, I am here.")

    response = logged_in.post(retry_url(turn), HTTP_HX_REQUEST="true")
    again = logged_in.post(retry_url(turn), HTTP_HX_REQUEST="true")

    for answer in (response, again):
        assert answer.status_code == 200
        html = answer.content.decode()
        assert f'id="event-{turn.user_message_id}"' in html and "Yes, I am here." in html
        assert "could not answer" not in html and "answering" not in html.lower()
    assert response["HX-Trigger-After-Swap"] == "chat-posted"
    assert Event.objects.filter(session=chat_session, role="user").count() == 1
    assert len(fake_llm.requests_to("chat")) == 2


def test_a_retried_turn_a_worker_has_not_run_yet_polls_until_it_ends(
    logged_in, chat_session, fake_llm, django_capture_on_commit_callbacks
):
    turn = failed_turn(logged_in, chat_session, fake_llm)
    entries_url = reverse("dashboard:session_turn_entries", args=[chat_session.pk, turn.pk])

    with django_capture_on_commit_callbacks(execute=False) as queued:
        pending = logged_in.post(retry_url(turn), HTTP_HX_REQUEST="true").content.decode()
    assert f'hx-get="{entries_url}"' in pending and "The kin is answering" in pending

    fake_llm.error(401, "Incorrect API key provided")  # still wrong: it fails again
    for task in queued:
        task()
    failed = logged_in.get(entries_url, HTTP_HX_REQUEST="true").content.decode()
    assert "Incorrect API key provided" in failed and ">Retry</button>" in failed
    assert "hx-get" not in failed and "answering" not in failed.lower()


def test_another_teams_turn_cannot_be_retried_from_the_dashboard(logged_in, other_team, fake_llm):
    from tests.factories import KinFactory, MessageFactory, SessionFactory, TurnFactory

    theirs = SessionFactory(kin=KinFactory(team=other_team))
    turn = TurnFactory(session=theirs, user_message=MessageFactory(session=theirs), status="failed", error="x")

    assert logged_in.post(retry_url(turn)).status_code == 404
    assert logged_in.get(reverse("dashboard:session_turn_entries", args=[theirs.pk, turn.pk])).status_code == 404
    turn.refresh_from_db()
    assert turn.status == "failed" and fake_llm.requests_to("chat") == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("empty_turn_events")
def test_a_streamed_turn_that_fails_ends_with_its_entry_rendered_with_retry(logged_in, chat_session, fake_llm):
    from tests.sessions_app.test_dashboard_stream import stream

    fake_llm.error(401, "Incorrect API key provided")

    events = stream(logged_in, chat_session, {"content": "Are you there?"})

    assert [event.event for event in events] == ["message", "error"]
    error = events[-1].data
    turn = Turn.objects.get()
    assert error["error"]["details"]["turn"] == turn.pk  # the §11 shape, as before
    html = error["html"]
    assert f'id="event-{turn.user_message_id}"' in html and "Incorrect API key provided" in html
    assert f'action="{retry_url(turn)}"' in html and "csrfmiddlewaretoken" in html
    assert "answering" not in html.lower() and "on its way" not in html


def test_an_archived_sessions_failed_turn_offers_no_retry(logged_in, chat_session, fake_llm):
    from sessions_app.services import session_archive

    turn = failed_turn(logged_in, chat_session, fake_llm)
    session_archive(session=chat_session)

    page = logged_in.get(page_url(chat_session)).content.decode()
    assert "Incorrect API key provided" in page and ">Retry</button>" not in page
    response = logged_in.post(retry_url(turn))
    assert response.status_code == 409 and "archived" in response.content.decode()
    turn.refresh_from_db()
    assert turn.status == "failed"
