"""A kin's per-kin settings are bounded where they are saved (SPEC §13: bad input gets a
clear 4xx): the overrides the code reads (Kin.overrides["introspection"]), the sections
that exist, the size of the whole object and the history token budget, through the API,
the admin and the dashboard, answer 400 / a form error naming the field and the allowed
range, and store nothing. Unknown sections a kin already has are kept, not dropped."""
import json

import pytest
from django.urls import reverse

from kinsite.models import Kin
from sessions_app.overrides import OVERRIDES_MAX_BYTES
from tests.factories import KinFactory, UserFactory
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
    ({"introspection": {"enabled": None}}, "introspection.enabled", "true or false"),
    ({"introspection": {"idle_timeout_minutes": "10"}}, "introspection.idle_timeout_minutes", "0 to 10080"),
    ({"introspection": {"turn_interval": [3]}}, "introspection.turn_interval", "0 to 1000"),
    ({"notes": "hello"}, "notes", "unknown section; the sections are introspection"),
    ({"INTROSPECTION": False}, "INTROSPECTION", "unknown section"),
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
                                   "enabled": False, "model": "m" * 200}}
    response = api_client.post(KINS, {"name": "Ada", "overrides": overrides}, format="json")

    assert response.status_code == 201, response.content
    assert Kin.objects.get().overrides == overrides


@pytest.mark.parametrize(("budget", "allowed"), [(10**12, "2000000"), (-1, "1000"), (999, "1000")])
def test_an_out_of_range_history_budget_answers_400_with_its_range(api_client, kin, budget, allowed):
    response = api_client.patch(f"{KINS}{kin.pk}/", {"history_token_budget": budget}, format="json")

    error = assert_api_error(response, 400)
    assert allowed in str(error["details"]["history_token_budget"]).replace(",", "")
    kin.refresh_from_db()
    assert kin.history_token_budget is None


# --- the whole object: its size and its sections ---------------------------------------------


def compact_size(value) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


OVERSIZED = {
    "many-keys": {f"k{number:05}": number for number in range(50_000)},
    "megabytes": {"notes": "x" * 3_000_000},
    "in-a-known-section": {"introspection": {"model": "m" * 200, **{f"k{n}": 0 for n in range(1_000)}}},
}


@pytest.mark.parametrize("overrides", OVERSIZED.values(), ids=OVERSIZED.keys())
def test_patching_oversized_overrides_answers_400_naming_the_cap_and_changes_nothing(api_client, kin, overrides):
    role = kin.role
    response = api_client.patch(f"{KINS}{kin.pk}/", {"overrides": overrides, "role": "Changed"}, format="json")

    error = assert_api_error(response, 400)
    [message] = error["details"]["overrides"]
    assert "OVERRIDES_MAX_BYTES" in message and f"{OVERRIDES_MAX_BYTES:,}" in message, message
    assert len(response.content) < 2_000  # the answer does not list 50,000 keys
    kin.refresh_from_db()
    assert (kin.overrides, kin.role) == ({}, role)


def test_overrides_of_exactly_the_cap_are_stored_and_one_byte_more_is_not(api_client, team):
    # Only a kept old section can make a valid object this large: the settings alone are small.
    at_cap = {"notes": ""}
    at_cap["notes"] = "é" * ((OVERRIDES_MAX_BYTES - compact_size(at_cap)) // 2)  # two bytes each in UTF-8
    at_cap["notes"] += "x" * (OVERRIDES_MAX_BYTES - compact_size(at_cap))
    assert compact_size(at_cap) == OVERRIDES_MAX_BYTES
    kin = KinFactory(team=team, overrides=at_cap)

    assert api_client.patch(f"{KINS}{kin.pk}/", {"overrides": at_cap}, format="json").status_code == 200
    over = {**at_cap, "introspection": {}}
    assert_api_error(api_client.patch(f"{KINS}{kin.pk}/", {"overrides": over}, format="json"), 400)
    kin.refresh_from_db()
    assert kin.overrides == at_cap


def test_creating_a_kin_with_an_unknown_section_answers_400_naming_it(api_client, team):
    response = api_client.post(KINS, {"name": "Ada", "overrides": {"introspection": {"enabled": True},
                                                                  "tone": "cheerful"}}, format="json")

    error = assert_api_error(response, 400)
    assert error["details"]["overrides"] == ["tone: unknown section; the sections are introspection"]
    assert not Kin.objects.exists()


# --- kins stored before the sections were checked: their unknown sections stay ---------------

OLD_OVERRIDES = {"introspection": {"turn_interval": 7}, "notes": {"owner": "maria", "since": [2024, 5]}}


@pytest.fixture
def old_kin(team):
    return KinFactory(team=team, role="Helper", overrides=OLD_OVERRIDES)


def test_a_patch_may_keep_a_kins_stored_unknown_section_as_it_is(api_client, old_kin):
    overrides = {**OLD_OVERRIDES, "introspection": {"turn_interval": 3}}
    response = api_client.patch(f"{KINS}{old_kin.pk}/", {"overrides": overrides}, format="json")

    assert response.status_code == 200, response.content
    old_kin.refresh_from_db()
    assert old_kin.overrides == overrides


def test_a_patch_of_other_fields_leaves_a_stored_unknown_section_alone(api_client, old_kin):
    response = api_client.patch(f"{KINS}{old_kin.pk}/", {"role": "Reviewer"}, format="json")

    assert response.status_code == 200, response.content
    old_kin.refresh_from_db()
    assert (old_kin.role, old_kin.overrides) == ("Reviewer", OLD_OVERRIDES)


@pytest.mark.parametrize("overrides", [
    {**OLD_OVERRIDES, "notes": {"owner": "mallory", "since": [2024, 5]}},  # a changed value
    {**OLD_OVERRIDES, "notes": {"owner": "maria", "since": [2024, 5.0]}},  # equal in Python, not in JSON
    {**OLD_OVERRIDES, "tone": "cheerful"},  # a new unknown section beside the old one
], ids=["changed", "changed-type", "added"])
def test_a_patch_may_not_change_or_add_unknown_sections(api_client, old_kin, overrides):
    response = api_client.patch(f"{KINS}{old_kin.pk}/", {"overrides": overrides}, format="json")

    error = assert_api_error(response, 400)
    [message] = error["details"]["overrides"]
    assert "unknown section" in message
    old_kin.refresh_from_db()
    assert old_kin.overrides == OLD_OVERRIDES


def test_dropping_a_stored_unknown_section_is_allowed(api_client, old_kin):
    response = api_client.patch(f"{KINS}{old_kin.pk}/", {"overrides": {}}, format="json")

    assert response.status_code == 200, response.content
    old_kin.refresh_from_db()
    assert old_kin.overrides == {}


def test_another_kins_unknown_section_is_not_grandfathered(api_client, old_kin, kin):
    response = api_client.patch(f"{KINS}{kin.pk}/", {"overrides": OLD_OVERRIDES}, format="json")

    assert_api_error(response, 400)
    kin.refresh_from_db()
    assert kin.overrides == {}


def test_the_cap_applies_to_a_stored_oversized_kin_too(api_client, team):
    stored = {"notes": "x" * (OVERRIDES_MAX_BYTES + 1)}
    kin = KinFactory(team=team, overrides=stored)

    response = api_client.patch(f"{KINS}{kin.pk}/", {"overrides": {**stored, "introspection": {"enabled": False}}},
                                format="json")

    assert "OVERRIDES_MAX_BYTES" in assert_api_error(response, 400)["details"]["overrides"][0]
    kin.refresh_from_db()
    assert kin.overrides == stored


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
@pytest.mark.parametrize(("overrides", "message"), [
    (json.dumps({"notes": "x" * 5_000}), "OVERRIDES_MAX_BYTES"),
    (json.dumps({f"k{n}": n for n in range(50_000)}), "OVERRIDES_MAX_BYTES"),
    ('{"tone": "cheerful"}', "tone: unknown section"),
    ('{"introspection": {"enabled": "yes"}}', "introspection.enabled: must be true or false"),
], ids=["megabytes", "many-keys", "unknown-section", "wrong-type"])
def test_the_admin_refuses_oversized_or_unknown_overrides(client, kin, overrides, message):
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    response = client.post(reverse("admin:kinsite_kin_change", args=[kin.pk]),
                           admin_form(kin, overrides=overrides, role="Changed"))

    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert message in str(errors["overrides"]), errors
    kin.refresh_from_db()
    assert kin.overrides == {} and kin.role != "Changed"


@pytest.mark.django_db
def test_the_admin_saves_an_old_kin_keeping_its_unknown_section(client, team):
    kin = KinFactory(team=team, overrides=OLD_OVERRIDES)
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    response = client.post(reverse("admin:kinsite_kin_change", args=[kin.pk]),
                           admin_form(kin, overrides=json.dumps(OLD_OVERRIDES), role="Changed"))

    assert response.status_code == 302, response.context["adminform"].form.errors
    kin.refresh_from_db()
    assert (kin.role, kin.overrides) == ("Changed", OLD_OVERRIDES)


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
    from sessions_app.introspection.converse import introspection_settings
    from sessions_app.introspection.services import introspection_idle_scan
    from tests.factories import KinFactory

    settings.INTROSPECTION = {**settings.INTROSPECTION, "max_tool_calls": 10, "idle_timeout_minutes": 10}
    kin = KinFactory(team=team, overrides={"introspection": {"max_tool_calls": 10**12,
                                                             "idle_timeout_minutes": 10**12, "turn_interval": 4}})

    config = introspection_settings(kin)

    assert (config.max_tool_calls, config.idle_timeout_minutes, config.turn_interval) == (10, 10, 4)
    assert introspection_idle_scan() == []  # the idle scan of every kin still runs
