"""Kins of the same name can be told apart on the kins list and the activity pages: each
shows the kin's id, its created date and, for an imported kin, the kin it was imported
from, read in a constant number of queries however many kins and rows a page has."""
import re

import pytest
from django.urls import reverse
from django.utils import timezone

from tests.factories import KinFactory, SessionFactory, TurnFactory
from transfer.models import KinImport

pytestmark = pytest.mark.django_db


@pytest.fixture
def logged_in(client, user, team):
    client.force_login(user)
    return client


def three_adas(team):
    """Three kins named Ada, each with a turn: one made here, one imported from kin #7 of
    another installation, one imported from a document that named no source id."""
    made, imported, unnamed = (KinFactory(team=team, name="Ada") for _ in range(3))
    KinImport.objects.create(team=team, kin=imported, digest="a" * 64, format_version=1, source_kin_id=7)
    KinImport.objects.create(team=team, kin=unnamed, digest="b" * 64, format_version=1, source_kin_id=None)
    for kin in (made, imported, unnamed):
        TurnFactory(session=SessionFactory(kin=kin))
    return made, imported, unnamed


def identities(body: str) -> list[str]:
    return [re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", text)).strip()
            for text in re.findall(r'<span class="kin-identity">(.*?)</span>', body, re.S)]


def identity(kin, suffix=""):
    return f"#{kin.pk} · created {timezone.localtime(kin.created_at):%Y-%m-%d}{suffix}"


def test_kins_list_tells_same_named_kins_apart(logged_in, team):
    made, imported, unnamed = three_adas(team)

    body = logged_in.get(reverse("dashboard:kins")).content.decode()

    assert identities(body) == [
        identity(made), identity(imported, " · imported from kin #7"), identity(unnamed, " · imported"),
    ]


def test_team_activity_rows_tell_same_named_kins_apart(logged_in, team):
    made, imported, unnamed = three_adas(team)

    body = logged_in.get(reverse("dashboard:activity")).content.decode()

    # Newest first: each kin's turn, one row each.
    assert identities(body) == [
        identity(unnamed, " · imported"), identity(imported, " · imported from kin #7"), identity(made),
    ]


def test_kin_activity_page_names_which_ada_it_is(logged_in, team):
    _, imported, _ = three_adas(team)

    body = logged_in.get(reverse("dashboard:kin_activity", args=[imported.pk])).content.decode()

    # Once, above the rows: every row there is this kin's.
    assert identities(body) == [identity(imported, " · imported from kin #7")]


def add_imported_kins(team, count: int, start: int):
    for number in range(start, start + count):
        kin = KinFactory(team=team, name="Ada")
        KinImport.objects.create(team=team, kin=kin, digest=f"{number:064x}", format_version=1, source_kin_id=number)
        TurnFactory(session=SessionFactory(kin=kin))


def test_identities_cost_one_query_per_page(logged_in, team, django_assert_num_queries):
    add_imported_kins(team, 2, start=1)
    pages = {
        # Session, user and team; the kins; their imports.
        reverse("dashboard:kins"): 5,
        # Session, user and team; one query per kind of row (6); the rows' kins' imports.
        reverse("dashboard:activity"): 10,
    }
    for url, queries in pages.items():
        with django_assert_num_queries(queries):
            assert logged_in.get(url).status_code == 200

    add_imported_kins(team, 20, start=3)
    for url, queries in pages.items():
        with django_assert_num_queries(queries):
            body = logged_in.get(url).content.decode()
        assert "imported from kin #22" in body
