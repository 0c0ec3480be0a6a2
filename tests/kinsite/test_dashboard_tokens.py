"""API tokens in the dashboard: issued once, usable at once, revocable after a confirmation,
team-scoped, owners/admins only."""
import pytest
from django.urls import reverse
from django.utils import timezone
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
    assert reverse("dashboard:token_revoke", args=[token.pk]) not in page.content.decode()
    assert client.post(reverse("dashboard:tokens"), {"name": "mine"}).status_code == 403
    assert client.get(reverse("dashboard:token_revoke", args=[token.pk])).status_code == 403
    assert client.post(reverse("dashboard:token_revoke", args=[token.pk])).status_code == 403
    assert ApiToken.objects.count() == 1
    assert api_status(raw) == 200


def test_other_teams_tokens_are_invisible_and_answer_404(client, user, team, other_team):
    theirs, raw = api_token_issue(team=other_team, name="their-secret-token")
    client.force_login(user)
    assert "their-secret-token" not in client.get(reverse("dashboard:tokens")).content.decode()
    assert client.get(reverse("dashboard:token_revoke", args=[theirs.pk])).status_code == 404
    assert client.post(reverse("dashboard:token_revoke", args=[theirs.pk])).status_code == 404
    theirs.refresh_from_db()
    assert theirs.revoked_at is None


def test_revoke_asks_first_naming_the_token_and_changes_nothing(client, user, team):
    token, raw = api_token_issue(team=team, name="support-bot", user=user)
    token.last_used_at = token.created_at
    token.save(update_fields=["last_used_at"])
    client.force_login(user)
    listing = client.get(reverse("dashboard:tokens")).content.decode()
    # The list links to the confirmation; it holds no form that revokes at once.
    revoke_url = reverse("dashboard:token_revoke", args=[token.pk])
    assert f'href="{revoke_url}"' in listing
    assert f'action="{revoke_url}"' not in listing

    page = client.get(revoke_url)

    assert page.status_code == 200
    html = page.content.decode()
    stamp = f"{timezone.localtime(token.created_at):%Y-%m-%d %H:%M}"  # created and last used
    assert "support-bot" in html and f"{token.prefix}…" in html and html.count(stamp) == 2
    assert f'<form method="post" action="{revoke_url}">' in html and "csrfmiddlewaretoken" in html
    assert f'href="{reverse("dashboard:tokens")}">Cancel</a>' in html
    token.refresh_from_db()
    assert token.revoked_at is None
    assert api_status(raw) == 200


def test_confirmed_revoke_says_so_on_the_token_list(client, user, team):
    token, raw = api_token_issue(team=team, name="support-bot", user=user)
    client.force_login(user)

    response = client.post(reverse("dashboard:token_revoke", args=[token.pk]), follow=True)

    assert response.redirect_chain == [(reverse("dashboard:tokens"), 302)]
    assert "The token “support-bot” is revoked" in response.content.decode()
    assert api_status(raw) == 401


def test_revoking_twice_is_harmless_and_says_so(client, user, team):
    token, raw = api_token_issue(team=team, name="old", user=user)
    client.force_login(user)
    client.post(reverse("dashboard:token_revoke", args=[token.pk]))
    token.refresh_from_db()
    first_revoked_at = token.revoked_at

    again = client.post(reverse("dashboard:token_revoke", args=[token.pk]), follow=True)

    assert again.status_code == 200
    assert "The token “old” was already revoked; nothing changed." in again.content.decode()
    token.refresh_from_db()
    assert token.revoked_at == first_revoked_at
    page = client.get(reverse("dashboard:token_revoke", args=[token.pk])).content.decode()
    assert "already revoked" in page and "<form" not in page.split("<main>")[1]


def test_token_names_are_escaped_on_the_confirmation_and_in_the_message(client, user, team):
    token, _ = api_token_issue(team=team, name="<b>bold</b>", user=user)
    client.force_login(user)
    page = client.get(reverse("dashboard:token_revoke", args=[token.pk])).content.decode()
    done = client.post(reverse("dashboard:token_revoke", args=[token.pk]), follow=True).content.decode()
    for html in (page, done):
        assert "<b>bold</b>" not in html and "&lt;b&gt;bold&lt;/b&gt;" in html
