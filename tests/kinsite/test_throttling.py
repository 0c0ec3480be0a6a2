"""Per-token rate limits on the chat and job endpoints (SPEC §13): the N+1th request in a
window answers 429 in the SPEC §11 shape with Retry-After; other tokens and other
endpoints are unaffected."""
from types import SimpleNamespace

import pytest
from django.core.cache import cache
from rest_framework.test import APIClient

from kinsite.api.throttles import TokenRateThrottle
from kinsite.services import api_token_issue

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def clean_throttle_state():
    # The counters live in the cache (Redis in the PostgreSQL pass), which outlives a test.
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def rates(settings):
    settings.API_THROTTLE_RATES = {"chat": "3/min", "jobs": "2/min"}
    return settings.API_THROTTLE_RATES


@pytest.fixture
def clock(monkeypatch):
    """The throttle's clock, moved by hand."""
    now = [1_000_000.0]
    monkeypatch.setattr(TokenRateThrottle, "timer", lambda self: now[0])
    return now


def token_client(team, name="second") -> APIClient:
    _, raw = api_token_issue(team=team, name=name)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def chat(client, session, *, is_async=False):
    url = f"/api/v1/sessions/{session.pk}/messages/" + ("?async=1" if is_async else "")
    return client.post(url, {"content": "Hello there.", "sender": "Maria"}, format="json")


def assert_throttled(response, scope: str, limit: str) -> int:
    assert response.status_code == 429
    error = response.json()["error"]
    assert error["code"] == "throttled"
    assert f"{scope} requests with this token ({limit})" in error["message"]
    retry_after = int(response["Retry-After"])
    assert 1 <= retry_after <= 60
    assert f"{retry_after} second" in error["message"]
    return retry_after


def test_chat_post_over_the_limit_answers_429_with_retry_after(api_client, chat_session, rates, clock):
    # Sync and async posts draw on one allowance.
    assert chat(api_client, chat_session).status_code == 201
    assert chat(api_client, chat_session, is_async=True).status_code == 202
    assert chat(api_client, chat_session).status_code == 201
    clock[0] += 20
    assert assert_throttled(chat(api_client, chat_session), "chat", "3/min") == 40
    assert assert_throttled(chat(api_client, chat_session, is_async=True), "chat", "3/min") == 40
    # The refused posts stored nothing.
    messages = api_client.get(f"/api/v1/sessions/{chat_session.pk}/messages/").json()["results"]
    assert [m["role"] for m in messages].count("user") == 3


def test_window_passes_and_chat_is_allowed_again(api_client, chat_session, rates, clock):
    for _ in range(3):
        assert chat(api_client, chat_session).status_code == 201
    assert chat(api_client, chat_session).status_code == 429
    clock[0] += 61
    assert chat(api_client, chat_session).status_code == 201


def test_second_token_has_its_own_allowance(api_client, team, chat_session, rates, clock):
    for _ in range(3):
        assert chat(api_client, chat_session).status_code == 201
    assert chat(api_client, chat_session).status_code == 429
    # Same team, same session, another token: not affected.
    assert chat(token_client(team), chat_session).status_code == 201


def test_other_endpoints_are_not_throttled(api_client, kin, chat_session, rates, clock):
    for _ in range(3):
        assert chat(api_client, chat_session).status_code == 201
    assert chat(api_client, chat_session).status_code == 429
    session_url = f"/api/v1/sessions/{chat_session.pk}"
    for _ in range(5):  # more than either limit
        assert api_client.get(f"{session_url}/messages/").status_code == 200  # GET on the chat view itself
        assert api_client.get(f"{session_url}/prompt/?message=hi").status_code == 200
        assert api_client.get(f"/api/v1/kins/{kin.pk}/").status_code == 200
    imported = api_client.post(
        f"{session_url}/messages/import/", {"messages": [{"content": "Imported.", "sender": "Maria"}]}, format="json"
    )
    assert imported.status_code == 201
    # The job endpoints have their own allowance.
    assert api_client.post(f"{session_url}/checkpoint/").status_code == 202


def test_checkpoint_and_consolidate_share_the_jobs_allowance(api_client, kin, chat_session, rates, clock):
    assert api_client.post(f"/api/v1/sessions/{chat_session.pk}/checkpoint/").status_code == 202
    assert api_client.post(f"/api/v1/kins/{kin.pk}/consolidate/", {}, format="json").status_code != 429
    assert_throttled(api_client.post(f"/api/v1/sessions/{chat_session.pk}/checkpoint/"), "jobs", "2/min")
    assert_throttled(api_client.post(f"/api/v1/kins/{kin.pk}/consolidate/", {}, format="json"), "jobs", "2/min")
    # ... and not the chat allowance.
    assert chat(api_client, chat_session).status_code == 201


def test_unauthenticated_request_is_401_not_429(anon_client, chat_session, rates):
    for _ in range(5):
        assert chat(anon_client, chat_session).status_code == 401


def test_empty_rate_means_no_limit(api_client, chat_session, settings):
    settings.API_THROTTLE_RATES = {"chat": "", "jobs": "1/min"}
    for _ in range(5):
        assert chat(api_client, chat_session).status_code == 201


def test_default_rates_come_from_settings():
    from django.conf import settings

    assert set(settings.API_THROTTLE_RATES) == {"chat", "jobs", "workflow_runs", "events"}
    for rate in settings.API_THROTTLE_RATES.values():
        TokenRateThrottle().parse_rate(rate)  # a valid "N/period"


def follow_turn(client, turn):
    return client.get(f"/api/v1/turns/{turn.pk}/events/", HTTP_ACCEPT="text/event-stream")


@pytest.mark.usefixtures("empty_turn_events")
def test_following_a_turn_over_its_rate_answers_429_and_other_reads_do_not(api_client, team, chat_session,
                                                                            settings, clock):
    # A finished turn answers its events at once, so each request is one whole stream.
    settings.API_THROTTLE_RATES = {"chat": "", "events": "3/min"}
    turn = chat(api_client, chat_session).json()["turn"]
    turn = SimpleNamespace(pk=turn["id"])
    for _ in range(3):
        response = follow_turn(api_client, turn)
        assert response.status_code == 200 and response["Content-Type"].startswith("text/event-stream")
        b"".join(response.streaming_content)
    assert assert_throttled(follow_turn(api_client, turn), "events", "3/min") == 60
    # The turn as JSON and the session's messages are reads of their own, not limited.
    for _ in range(5):
        assert api_client.get(f"/api/v1/turns/{turn.pk}/").status_code == 200
        assert api_client.get(f"/api/v1/sessions/{chat_session.pk}/messages/").status_code == 200
    # Another token has its own allowance; the window passes.
    assert follow_turn(token_client(team), turn).status_code == 200
    clock[0] += 61
    assert follow_turn(api_client, turn).status_code == 200


def test_the_schema_documents_429_on_the_events_read_only():
    from tests.abuse.support import api_schema

    paths = api_schema()["paths"]
    assert "429" in paths["/api/v1/turns/{turn_id}/events/"]["get"]["responses"]
    assert "429" not in paths["/api/v1/turns/{turn_id}/"]["get"]["responses"]
    assert "429" not in paths["/api/v1/sessions/{session_id}/messages/"]["get"]["responses"]
    assert "429" in paths["/api/v1/sessions/{session_id}/messages/"]["post"]["responses"]
