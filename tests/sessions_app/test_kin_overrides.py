"""A kin's per-kin settings are bounded where they are saved (SPEC §13: bad input gets a
clear 4xx): the overrides the code reads (Kin.overrides["introspection"]) and the history
token budget, through the API and the admin, answer 400 / a form error naming the field
and the allowed range, and store nothing."""
import pytest
from django.urls import reverse

from kinsite.models import Kin
from tests.factories import UserFactory
from tests.sessions_app.test_api_access import assert_api_error

KINS = "/api/v1/kins/"

BAD_OVERRIDES = [
    ({"introspection": {"max_tool_calls": 10**12}}, "introspection.max_tool_calls", "0 to 100"),
    ({"introspection": {"max_tool_calls": -1}}, "introspection.max_tool_calls", "0 to 100"),
    ({"introspection": {"max_tool_calls": 2.5}}, "introspection.max_tool_calls", "0 to 100"),
    ({"introspection": {"max_tool_calls": True}}, "introspection.max_tool_calls", "0 to 100"),
    ({"introspection": {"turn_interval": 10**9}}, "introspection.turn_interval", "0 to 1000"),
    ({"introspection": {"turn_interval": "often"}}, "introspection.turn_interval", "0 to 1000"),
    ({"introspection": {"idle_timeout_minutes": 10**7}}, "introspection.idle_timeout_minutes", "0 to 10080"),
    ({"introspection": {"enabled": "yes"}}, "introspection.enabled", "true or false"),
    ({"introspection": {"model": "m" * 201}}, "introspection.model", "200 characters"),
    ({"introspection": {"model": 7}}, "introspection.model", "200 characters"),
    ({"introspection": {"turn_intervall": 3}}, "introspection.turn_intervall", "turn_interval"),
    ({"introspection": "off"}, "introspection", "object"),
]


@pytest.mark.parametrize(("overrides", "path", "allowed"), BAD_OVERRIDES, ids=lambda v: str(v)[:40])
def test_creating_a_kin_with_out_of_range_overrides_answers_400(api_client, team, overrides, path, allowed):
    response = api_client.post(KINS, {"name": "Ada", "overrides": overrides}, format="json")

    error = assert_api_error(response, 400)
    [message] = error["details"]["overrides"]
    assert message.startswith(f"{path}:") and allowed in message, message
    assert not Kin.objects.exists()


@pytest.mark.parametrize(("overrides", "path", "allowed"), BAD_OVERRIDES[:3], ids=lambda v: str(v)[:40])
def test_patching_a_kin_with_out_of_range_overrides_answers_400(api_client, kin, overrides, path, allowed):
    response = api_client.patch(f"{KINS}{kin.pk}/", {"overrides": overrides}, format="json")

    error = assert_api_error(response, 400)
    assert path in error["details"]["overrides"][0]
    kin.refresh_from_db()
    assert kin.overrides == {}


def test_overrides_at_the_bounds_are_stored(api_client, team):
    overrides = {"introspection": {"max_tool_calls": 100, "turn_interval": 0, "idle_timeout_minutes": 10080,
                                   "enabled": False, "model": "small-model"}, "notes": {"anything": [1, 2]}}
    response = api_client.post(KINS, {"name": "Ada", "overrides": overrides}, format="json")

    assert response.status_code == 201, response.content
    assert Kin.objects.get().overrides == overrides


def test_a_huge_history_budget_answers_400_with_its_range(api_client, kin):
    response = api_client.patch(f"{KINS}{kin.pk}/", {"history_token_budget": 10**12}, format="json")

    error = assert_api_error(response, 400)
    assert "2000000" in str(error["details"]["history_token_budget"]).replace(",", "")


# --- the admin ---------------------------------------------------------------------------


def admin_form(kin, **changes):
    data = {"name": kin.name, "role": kin.role, "character": "", "expertise": "", "model": "",
            "history_token_budget": "", "parent": "", "spawn_reason": "", "overrides": "{}", "team": kin.team_id}
    data.update(changes)
    return data


@pytest.mark.django_db
@pytest.mark.parametrize(("changes", "field", "allowed"), [
    ({"overrides": '{"introspection": {"max_tool_calls": 1000000000000}}'}, "overrides", "0 to 100"),
    ({"overrides": '{"introspection": {"idle_timeout_minutes": -5}}'}, "overrides", "0 to 10080"),
    ({"history_token_budget": "1000000000"}, "history_token_budget", "2000000"),
    ({"history_token_budget": "10"}, "history_token_budget", "1000"),
], ids=["max_tool_calls", "idle_timeout", "budget-high", "budget-low"])
def test_the_admin_refuses_out_of_range_kin_settings(client, kin, changes, field, allowed):
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    response = client.post(reverse("admin:kinsite_kin_change", args=[kin.pk]), admin_form(kin, **changes))

    assert response.status_code == 200  # the form again, with its errors
    errors = response.context["adminform"].form.errors
    assert allowed in str(errors[field]).replace(",", ""), errors
    kin.refresh_from_db()
    assert kin.overrides == {} and kin.history_token_budget is None


@pytest.mark.django_db
def test_the_admin_saves_overrides_in_range(client, kin):
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    response = client.post(reverse("admin:kinsite_kin_change", args=[kin.pk]),
                           admin_form(kin, overrides='{"introspection": {"turn_interval": 3}}',
                                      history_token_budget="20000"))

    assert response.status_code == 302, response.context["adminform"].form.errors
    kin.refresh_from_db()
    assert kin.overrides == {"introspection": {"turn_interval": 3}} and kin.history_token_budget == 20000


# --- rows stored before the bounds were checked -------------------------------------------


@pytest.mark.django_db
def test_stored_out_of_range_overrides_are_ignored_when_read(team, settings):
    from sessions_app.introspection import introspection_idle_scan, introspection_settings
    from tests.factories import KinFactory

    settings.INTROSPECTION = {**settings.INTROSPECTION, "max_tool_calls": 10, "idle_timeout_minutes": 10}
    kin = KinFactory(team=team, overrides={"introspection": {"max_tool_calls": 10**12,
                                                             "idle_timeout_minutes": 10**12, "turn_interval": 4}})

    config = introspection_settings(kin)

    assert (config.max_tool_calls, config.idle_timeout_minutes, config.turn_interval) == (10, 10, 4)
    assert introspection_idle_scan() == []  # the idle scan of every kin still runs
