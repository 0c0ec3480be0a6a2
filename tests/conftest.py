"""Fixtures shared by the whole suite."""
import pytest
from django.db import connection
from rest_framework.test import APIClient

from kinsite.services import api_token_issue
from tests.factories import KinFactory, MembershipFactory, SessionFactory, TeamFactory, UserFactory


def pytest_collection_modifyitems(config, items):
    # Vendor-specific tests run in the pass of their database (README: the suite runs twice).
    from django.conf import settings

    engine = settings.DATABASES["default"]["ENGINE"]
    vendor = "postgresql" if "postgresql" in engine else "sqlite"
    for item in items:
        if "postgres" in item.keywords and vendor != "postgresql":
            item.add_marker(pytest.mark.skip(reason="PostgreSQL pass only"))
        if "sqlite" in item.keywords and vendor != "sqlite":
            item.add_marker(pytest.mark.skip(reason="SQLite pass only"))


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    # PBKDF2's deliberate slowness costs ~0.3 s per user; tests need no such strength.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def db_vendor(db):
    return connection.vendor


@pytest.fixture
def user(db):
    return UserFactory()


@pytest.fixture
def team(db, user):
    team = TeamFactory()
    MembershipFactory(team=team, user=user, role="owner")
    return team


@pytest.fixture
def other_team(db):
    return TeamFactory()


@pytest.fixture
def kin(team):
    return KinFactory(team=team)


@pytest.fixture
def chat_session(kin):
    return SessionFactory(kin=kin)


@pytest.fixture
def api_client(team, user):
    """An API client authenticated with a bearer token of `team`."""
    _, raw = api_token_issue(team=team, name="test", user=user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


@pytest.fixture
def anon_client():
    return APIClient()
