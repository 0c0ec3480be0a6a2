"""Django admin: every model is registered and its pages load for staff; audit-like
rows (the LLM call log, the event store) are read-only; tokens are issued once and revoked."""
import re

import pytest
from django.apps import apps
from django.contrib import admin
from django.urls import reverse

from kinsite.models import ApiToken, LLMCall, Team
from kinsite.services import api_token_issue
from tests.factories import LLMCallFactory, MessageFactory, UserFactory

pytestmark = pytest.mark.django_db

OUR_APPS = {"kinsite", "sessions_app", "memories", "consolidation", "workflows"}


@pytest.fixture
def staff_client(client):
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    return client


def our_models():
    return [model for model in apps.get_models() if model._meta.app_label in OUR_APPS]


def test_every_model_is_registered_in_admin():
    missing = [model.__name__ for model in our_models() if not admin.site.is_registered(model)]
    assert missing == []


def test_every_changelist_loads_for_staff(staff_client, chat_session, team):
    MessageFactory(session=chat_session)
    LLMCallFactory(team=team)
    api_token_issue(team=team, name="t")
    for model in our_models():
        url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
        assert staff_client.get(url).status_code == 200, url


def test_llm_call_log_and_events_are_read_only(staff_client, chat_session, team):
    call = LLMCallFactory(team=team)
    event = MessageFactory(session=chat_session)
    assert staff_client.get(reverse("admin:kinsite_llmcall_add")).status_code == 403
    delete_url = reverse("admin:kinsite_llmcall_delete", args=[call.pk])
    assert staff_client.post(delete_url, {"post": "yes"}).status_code == 403
    assert LLMCall.objects.filter(pk=call.pk).exists()
    change_page = staff_client.get(reverse("admin:sessions_app_event_change", args=[event.pk]))
    assert change_page.status_code == 200
    assert 'name="content"' not in change_page.content.decode()


def test_admin_issues_a_token_once_and_revokes_it(staff_client, team):
    response = staff_client.post(
        reverse("admin:kinsite_apitoken_add"), {"team": team.pk, "name": "from-admin"}, follow=True
    )
    assert response.status_code == 200
    raw = re.search(r"(ks_[A-Za-z0-9_\-]+)", response.content.decode()).group(1)
    token = ApiToken.objects.get(name="from-admin")
    assert token.prefix == raw[:10] and raw not in token.digest
    staff_client.post(
        reverse("admin:kinsite_apitoken_changelist"),
        {"action": "revoke", "_selected_action": [token.pk]},
    )
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_non_staff_cannot_open_admin(client, user):
    client.force_login(user)
    response = client.get(reverse("admin:kinsite_llmcall_changelist"))
    assert response.status_code == 302


def test_team_with_an_unknown_time_zone_is_refused(staff_client):
    response = staff_client.post(
        reverse("admin:kinsite_team_add"),
        {"name": "Moon", "slug": "moon", "timezone": "Moon/Base", "memberships-TOTAL_FORMS": 0,
         "memberships-INITIAL_FORMS": 0},
    )
    assert response.status_code == 200
    assert "not an IANA time zone" in response.content.decode()
    assert not Team.objects.filter(slug="moon").exists()


def test_session_page_shows_its_message_counts_read_only(staff_client, chat_session):
    MessageFactory(session=chat_session, sender="Ana Counted", platform="slack")
    MessageFactory(session=chat_session, sender="Ana Counted", platform="slack")
    page = staff_client.get(reverse("admin:sessions_app_session_change", args=[chat_session.pk])).content.decode()
    assert "Ana Counted" in page and "Slack" in page
    assert 'name="message_counts-0-message_count"' not in page  # shown, not editable
    assert staff_client.get(reverse("admin:sessions_app_messagecount_add")).status_code == 403


def test_the_kin_admin_lives_under_kinsite_and_its_old_addresses_redirect_there(staff_client, kin):
    """Kin moved from sessions_app to kinsite (issue 15), and its admin pages with it."""
    change = reverse("admin:kinsite_kin_change", args=[kin.pk])
    assert change == f"/admin/kinsite/kin/{kin.pk}/change/"
    assert staff_client.get(change).status_code == 200
    response = staff_client.get(f"/admin/sessions_app/kin/{kin.pk}/change/")
    assert (response.status_code, response["Location"]) == (302, change)
    response = staff_client.get("/admin/sessions_app/kin/?q=Ada")
    assert (response.status_code, response["Location"]) == (302, "/admin/kinsite/kin/?q=Ada")
