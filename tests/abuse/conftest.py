"""Fixtures of the abuse tests: two seeded teams, a token client of the first, and a model
that always answers (a request that is wrongly accepted must not fail on the model)."""
import pytest
from django.test import Client
from rest_framework.test import APIClient

from kinsite.llm.providers import provider_override
from tests.abuse.support import seed_team
from tests.support.scripted_model import ScriptedProvider


class AlwaysAnswers(ScriptedProvider):
    """A scripted model with an endless script: a short reply, or an empty JSON object in JSON mode."""

    def chat(self, messages, *, json_mode=False, **kwargs):
        self.script = ["{}" if json_mode else "Noted."]
        self.calls.clear()
        return super().chat(messages, json_mode=json_mode, **kwargs)


@pytest.fixture(autouse=True)
def model_always_answers():
    with provider_override(AlwaysAnswers()) as provider:
        yield provider


@pytest.fixture(autouse=True)
def no_rate_limits(settings):
    # The rate limits have their own tests (test_rate_limits.py); here they would only
    # make the outcome depend on how many cases a test sends.
    settings.API_THROTTLE_RATES = {}


@pytest.fixture
def own(team, user):
    return seed_team(team, secret="zanzibar", user=user)


@pytest.fixture
def foreign(other_team):
    return seed_team(other_team, secret="xylophone")


@pytest.fixture(scope="session")
def _shared_api_client():
    # One client for the whole run: a client's first request loads the middleware, and
    # WhiteNoise's scan of the static files makes that cost ~0.2 s, more than a test here.
    return APIClient()


@pytest.fixture
def api(own, _shared_api_client):
    _shared_api_client.credentials(HTTP_AUTHORIZATION=f"Bearer {own.raw_token}")
    yield _shared_api_client
    _shared_api_client.credentials()


@pytest.fixture(scope="session")
def shared_client():
    """A dashboard client for the whole run (see _shared_api_client); log in per test."""
    return Client()


@pytest.fixture
def dashboard(shared_client, user, own):
    """The dashboard, logged in as an owner of the team of `own`."""
    shared_client.cookies.clear()
    shared_client.force_login(user)
    yield shared_client
    shared_client.cookies.clear()
