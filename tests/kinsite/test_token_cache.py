"""API tokens are remembered in process memory for a while (kinsite/tokencache.py), so a
request skips the token lookup; a revoked or deleted token still stops working at once."""
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from kinsite import tokencache
from kinsite.models import ApiToken
from kinsite.services import api_token_issue, api_token_revoke

pytestmark = pytest.mark.usefixtures("empty_cache")


@pytest.fixture
def token(team, user):
    token, raw = api_token_issue(team=team, name="cached", user=user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    token.client, token.raw = client, raw
    return token


def get_kins(token):
    return token.client.get("/api/v1/kins/")


def token_reads(token) -> tuple[int, int]:
    """(status, reads of the token table) of one request."""
    with CaptureQueriesContext(connection) as captured:
        response = get_kins(token)
    reads = [q for q in captured.captured_queries if 'FROM "kinsite_apitoken"' in q["sql"]]
    return response.status_code, len(reads)


def test_a_known_token_is_not_looked_up_again(token):
    assert token_reads(token) == (200, 1)
    assert token_reads(token) == (200, 0)


def test_the_raw_token_is_never_a_key(token):
    get_kins(token)
    assert token.raw not in tokencache._entries
    assert token.digest in tokencache._entries


def test_a_revoked_token_is_refused_on_the_next_request(token):
    assert get_kins(token).status_code == 200
    api_token_revoke(token=ApiToken.objects.get(pk=token.pk))
    response = get_kins(token)
    assert response.status_code == 401, response.content


def test_a_deleted_token_is_refused_on_the_next_request(token):
    assert get_kins(token).status_code == 200
    ApiToken.objects.get(pk=token.pk).delete()
    assert get_kins(token).status_code == 401


def test_a_token_of_a_deleted_team_is_refused_on_the_next_request(token, team):
    assert get_kins(token).status_code == 200
    team.delete()
    assert get_kins(token).status_code == 401


def test_a_revocation_in_another_process_is_seen_by_the_next_request(token):
    """Another process revokes the token: its signal clears its own entries, not ours, and
    bumps the shared generation after its commit, which makes ours unusable."""
    assert get_kins(token).status_code == 200
    ApiToken.objects.filter(pk=token.pk).update(revoked_at=timezone.now())  # no signal here
    assert get_kins(token).status_code == 200  # still remembered: nothing said it changed
    tokencache._bump_generation()  # what the revoking process does once committed
    assert get_kins(token).status_code == 401


def test_an_entry_expires_after_its_time(token, monkeypatch):
    """Changes that bypass the signals (a queryset update, raw SQL) are seen once the entry expires."""
    monkeypatch.setattr(tokencache, "TTL_SECONDS", 0.0)
    assert get_kins(token).status_code == 200
    ApiToken.objects.filter(pk=token.pk).update(revoked_at=timezone.now())
    assert get_kins(token).status_code == 401


def test_without_the_shared_generation_nothing_is_remembered(token, monkeypatch):
    """The cache (Redis) not answering: every request reads the token, so no revocation can be missed."""
    monkeypatch.setattr(tokencache, "_generation", lambda: None)
    assert token_reads(token) == (200, 1)
    assert token_reads(token) == (200, 1)


def test_last_use_is_still_written_at_most_once_a_minute(token):
    get_kins(token)
    first = ApiToken.objects.get(pk=token.pk).last_used_at
    assert first is not None
    with CaptureQueriesContext(connection) as captured:
        get_kins(token)
    assert not [q for q in captured.captured_queries if q["sql"].startswith('UPDATE "kinsite_apitoken"')]
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=first - timedelta(minutes=2))
    tokencache._bump_generation()  # the remembered last use is the old one otherwise
    get_kins(token)
    assert ApiToken.objects.get(pk=token.pk).last_used_at > first


def test_each_request_gets_its_own_token_objects(token):
    get_kins(token)
    one, two = tokencache.cached_token(token.digest), tokencache.cached_token(token.digest)
    assert one.pk == two.pk == token.pk and one.team.pk == token.team_id
    assert one is not two and one.team is not two.team
