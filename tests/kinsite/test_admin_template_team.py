"""The prompt template admin's team (issue 26): the add page starts with the user's team (the
dashboard's: first membership) chosen, a superuser in no team starts with none; a template
saved with a kin and no team takes the kin's team; a kin of another team than the one chosen
is refused on the kin field and nothing is saved."""
import re

import pytest
from django.urls import reverse

from kinsite.models import PromptTemplate
from tests.factories import KinFactory, MembershipFactory, TeamFactory, UserFactory

pytestmark = pytest.mark.django_db

BODY = "Keep it under {max_words} words."


def add_url():
    return reverse("admin:kinsite_prompttemplate_add")


def add(client, **fields):
    return client.post(add_url(), {"kind": "consolidation", "name": "Tight", "body": BODY, "is_active": "on",
                                   "team": "", "kin": "", **fields})


def selected_team(page: str) -> str | None:
    """The value of the team select's selected option (None: none marked selected)."""
    select = re.search(r'<select name="team"[^>]*>(.*?)</select>', page, re.S).group(1)
    chosen = re.search(r'<option value="([^"]*)" selected>', select)
    return chosen.group(1) if chosen else None


@pytest.fixture
def superuser_client(client):
    client.force_login(UserFactory(is_staff=True, is_superuser=True))  # in no team
    return client


def test_add_page_starts_with_the_users_team(client, staff, team):
    client.force_login(staff)
    response = client.get(add_url())
    assert response.status_code == 200
    assert selected_team(response.content.decode()) == str(team.pk)


def test_add_page_starts_with_a_superusers_first_team(client, team):
    superuser = UserFactory(is_staff=True, is_superuser=True)
    MembershipFactory(team=team, user=superuser)
    MembershipFactory(team=TeamFactory(), user=superuser)
    client.force_login(superuser)
    assert selected_team(client.get(add_url()).content.decode()) == str(team.pk)


def test_add_page_starts_with_no_team_for_a_superuser_in_no_team(superuser_client, team):
    assert selected_team(superuser_client.get(add_url()).content.decode()) in (None, "")


def test_a_kin_without_a_team_saves_with_the_kins_team(superuser_client):
    kin = KinFactory(team=TeamFactory())
    response = add(superuser_client, kin=kin.pk)
    assert response.status_code == 302
    template = PromptTemplate.objects.get()
    assert (template.team_id, template.kin_id) == (kin.team_id, kin.pk)


def test_staff_saving_a_kin_without_a_team_get_the_kins_team(client, staff, team):
    kin = KinFactory(team=team)
    client.force_login(staff)
    assert add(client, kin=kin.pk).status_code == 302
    assert PromptTemplate.objects.get().team == team


def test_a_kin_of_another_team_is_refused_on_the_kin_field_and_nothing_saved(superuser_client, team):
    other = KinFactory(team=TeamFactory(name="Other team"), name="Bea")
    response = add(superuser_client, team=team.pk, kin=other.pk)
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert list(errors) == ["kin"]
    assert errors["kin"] == [f"Bea belongs to team Other team, not to {team}."]
    assert "Bea belongs to team Other team" in response.content.decode()
    assert not PromptTemplate.objects.exists()


def test_neither_team_nor_kin_asks_for_a_team(superuser_client):
    response = add(superuser_client)
    assert response.status_code == 200
    assert response.context["adminform"].form.errors["team"] == ["Choose a team, or a kin to take the team from."]
    assert not PromptTemplate.objects.exists()
