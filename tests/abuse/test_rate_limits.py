"""Rate limits as an abuse guard (SPEC §13: chat endpoints are rate-limited per token).
tests/kinsite/test_throttling.py covers the limits themselves (sync and async share one
allowance per token, Retry-After, windows, other tokens and endpoints); this adds what a
flooding client tries: bad bodies count and are refused before they are read, another
session does not buy a fresh allowance, and every 429 has the §11 shape."""
import pytest
from django.core.cache import cache

from tests.abuse.support import api_operations, api_schema, assert_api_error, assert_unchanged, snapshot
from tests.factories import SessionFactory

CHAT_PATH = "/api/v1/sessions/{session_id}/messages/"


@pytest.fixture(autouse=True)
def clean_throttle_state():
    cache.clear()  # the counters live in the cache (Redis in the PostgreSQL pass)
    yield
    cache.clear()


@pytest.fixture
def rates(settings):
    settings.API_THROTTLE_RATES = {"chat": "3/min", "jobs": "2/min"}


def chat(api, session, body=None, *, is_async=False, raw: bytes | None = None):
    url = CHAT_PATH.format(session_id=session.pk) + ("?async=1" if is_async else "")
    if raw is not None:
        return api.generic("POST", url, raw, content_type="application/json")
    return api.post(url, body or {"content": "Hello there.", "sender": "Maria"}, format="json")


def assert_throttled(response):
    error = assert_api_error(response, 429, code="throttled")
    assert int(response["Retry-After"]) >= 1
    assert "chat requests with this token" in error["message"]


def test_bad_bodies_count_against_the_allowance_and_the_next_post_is_refused(api, own, rates):
    for raw in (b"[" * 100_000, b'{"content": ', b'{"content": "a\\u0000b"}'):
        assert chat(api, own.session, raw=raw).status_code == 400
    before = snapshot()

    assert_throttled(chat(api, own.session))
    assert_throttled(chat(api, own.session, is_async=True))
    assert_unchanged(before)


def test_a_throttled_client_is_refused_before_its_body_is_read(api, own, rates, settings):
    for _ in range(3):
        assert chat(api, own.session).status_code == 201
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1_000
    before = snapshot()
    # Malformed, too deep, too large: all 429, none parsed.
    for raw in (b'{"content": ', b"[" * 100_000, b'{"content": "' + b"x" * 5_000 + b'"}'):
        assert_throttled(chat(api, own.session, raw=raw))
    assert_unchanged(before)


def test_another_session_does_not_get_a_fresh_allowance(api, own, rates):
    other_session = SessionFactory(kin=own.kin)
    for session in (own.session, other_session, own.session):
        assert chat(api, session).status_code == 201
    before = snapshot()
    assert_throttled(chat(api, other_session))
    assert_unchanged(before)


def test_the_schema_documents_429_on_the_chat_post():
    assert ("POST", CHAT_PATH) in {(o.method, o.path) for o in api_operations()}
    responses = api_schema()["paths"][CHAT_PATH]["post"]["responses"]
    assert "429" in responses
    assert responses["429"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
