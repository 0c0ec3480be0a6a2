"""API tokens in the dashboard: issued once, usable at once, revocable, team-scoped, owners/admins only."""
import pytest
from django.urls import reverse
from rest_framework.test import APIClient

from kinsite.models import ApiToken
from kinsite.services import api_token_issue
from tests.factories import MembershipFactory, UserFactory

pytestmark = pytest.mark.django_db


def api_status(raw: str) -> int:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client.get("/api/v1/kins/").status_code


def test_owner_issues_a_token_shown_once_that_works_on_the_api(client, user, team):
    client.force_login(user)
    response = client.post(reverse("dashboard:tokens"), {"name": "support-bot"})
    assert response.status_code == 200
    raw = response.context["new_token"]["raw"]
    assert raw in response.content.decode()
    token = ApiToken.objects.get(team=team, name="support-bot")
    assert token.digest != raw and raw not in token.digest
    assert api_status(raw) == 200
    # The raw value is not shown again on the next visit.
    assert raw not in client.get(reverse("dashboard:tokens")).content.decode()


def test_blank_token_name_is_refused_and_nothing_is_created(client, user, team):
    client.force_login(user)
    response = client.post(reverse("dashboard:tokens"), {"name": "   "})
    assert response.status_code == 400
    assert ApiToken.objects.count() == 0


def test_revoked_token_is_refused_by_the_api(client, user, team):
    token, raw = api_token_issue(team=team, name="old", user=user)
    client.force_login(user)
    response = client.post(reverse("dashboard:token_revoke", args=[token.pk]))
    assert response.status_code == 302
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert api_status(raw) == 401


def test_members_can_list_but_not_issue_or_revoke(client, team):
    member = UserFactory()
    MembershipFactory(team=team, user=member, role="member")
    token, raw = api_token_issue(team=team, name="shared")
    client.force_login(member)
    page = client.get(reverse("dashboard:tokens"))
    assert page.status_code == 200 and "shared" in page.content.decode()
    assert client.post(reverse("dashboard:tokens"), {"name": "mine"}).status_code == 403
    assert client.post(reverse("dashboard:token_revoke", args=[token.pk])).status_code == 403
    assert ApiToken.objects.count() == 1
    assert api_status(raw) == 200


def test_other_teams_tokens_are_invisible_and_answer_404(client, user, team, other_team):
    theirs, raw = api_token_issue(team=other_team, name="their-secret-token")
    client.force_login(user)
    assert "their-secret-token" not in client.get(reverse("dashboard:tokens")).content.decode()
    assert client.post(reverse("dashboard:token_revoke", args=[theirs.pk])).status_code == 404
    theirs.refresh_from_db()
    assert theirs.revoked_at is None
