"""Fixtures shared by the whole suite."""
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.core.cache import cache
from django.db import connection
from rest_framework.test import APIClient
from whitenoise.middleware import WhiteNoiseMiddleware

from kinsite.llm.openai_client import OpenAICompatibleProvider
from kinsite.llm.providers import provider_override
from kinsite.services import api_token_issue
from sessions_app.turns import events
from tests.factories import KinFactory, MembershipFactory, SessionFactory, TeamFactory, UserFactory
from tests.support.fake_openai import FakeOpenAIServer, fake_openai_server
from tests.support.scripted_model import ScriptedProvider

# The processes tests start (gunicorn, Celery workers, manage.py) inherit this environment;
# with DEBUG off, the settings refuse to start on the built-in development key.
os.environ.setdefault("SECRET_KEY", "kinsite-tests-only-secret-key-not-for-deployments")


TESTS = Path(__file__).resolve().parent
# The slow kinds, marked by where they live (pytest.ini names the markers; scripts/test --fast
# deselects them): the first path that contains a test gives its marker.
SLOW_KINDS = {
    "browser": "browser",
    "ops": "ops",
    "faults": "faults",
    "test_api_fuzz.py": "fuzz",
}


def slow_kind(path: Path) -> str | None:
    try:
        first = path.resolve().relative_to(TESTS).parts[0]
    except ValueError:
        return None
    return SLOW_KINDS.get(first)


def pytest_collection_modifyitems(config, items):
    # Vendor-specific tests run in the pass of their database (docs/contributing.md: the suite runs twice).
    from django.conf import settings

    engine = settings.DATABASES["default"]["ENGINE"]
    vendor = "postgresql" if "postgresql" in engine else "sqlite"
    for item in items:
        kind = slow_kind(item.path)
        if kind is not None:
            item.add_marker(kind)
        if "postgres" in item.keywords and vendor != "postgresql":
            item.add_marker(pytest.mark.skip(reason="PostgreSQL pass only"))
        if "sqlite" in item.keywords and vendor != "sqlite":
            item.add_marker(pytest.mark.skip(reason="SQLite pass only"))


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    # PBKDF2's deliberate slowness costs ~0.3 s per user; tests need no such strength.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def endpoint_embeddings(settings):
    # The suite's fake embedders (ScriptedProvider, tests/memories/embedders.py) stand where an
    # endpoint would; the local model's own tests set EMBEDDINGS="local" (tests/memories/test_local_embedder.py).
    settings.EMBEDDINGS = "endpoint"


@pytest.fixture(autouse=True, scope="session")
def static_files_listed_once() -> Iterator[None]:
    """Every test client loads the middleware afresh, and WhiteNoise's then lists every static
    file through the finders (some 200 files, ~75 ms): the same list for every test with the
    same static settings, so it is made once per process (the files' entries are shared: they are read only)."""
    listed: dict[tuple, dict] = {}
    list_files = WhiteNoiseMiddleware.add_files_from_finders

    def add_files_from_finders(self):
        key = (self.static_prefix, self.max_age, self.allow_all_origins, self.charset, self.index_file,
               repr(settings.STATICFILES_DIRS), repr(settings.STATICFILES_FINDERS), repr(settings.INSTALLED_APPS),
               *(repr(getattr(settings, name, None)) for name in (
                   "WHITENOISE_MIMETYPES", "WHITENOISE_ADD_HEADERS_FUNCTION", "WHITENOISE_IMMUTABLE_FILE_TEST")))
        if key not in listed:
            before = dict(self.files)
            list_files(self)
            listed[key] = {url: static for url, static in self.files.items() if before.get(url) is not static}
        self.files.update(listed[key])

    WhiteNoiseMiddleware.add_files_from_finders = add_files_from_finders
    yield
    WhiteNoiseMiddleware.add_files_from_finders = list_files


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


@pytest.fixture
def empty_cache():
    """Queued markers, locks and turn event streams of earlier tests must not name this test's
    rows (ids repeat). Not autouse: the modules that need it say
    `pytestmark = pytest.mark.usefixtures("empty_cache")`."""
    cache.clear()
    events._memory.clear()  # the SQLite pass's event streams (with Redis, the cache's database holds them)
    yield
    cache.clear()
    events._memory.clear()


@pytest.fixture
def empty_turn_events():
    """No turn events of earlier tests (or of an earlier run, in Redis): turn ids repeat, and a
    follower reading another test's events for its turn id would see its deltas and end.
    Not autouse: the modules that stream turns say `pytest.mark.usefixtures("empty_turn_events")`."""
    def empty():
        events._memory.clear()
        if settings.REDIS_URL:
            client = events._redis_client(settings.REDIS_URL)
            for key in client.scan_iter(match=events.STREAM_KEY.format(stream="*")):
                client.delete(key)

    empty()
    yield
    empty()


# --- the LLM, faked (SPEC §10: tests never touch the network) --------------------------------


@pytest.fixture
def model() -> Iterator[ScriptedProvider]:
    """The scripted fake model every gateway call goes to (introspection, compaction,
    consolidation, chat turns)."""
    provider = ScriptedProvider()
    with provider_override(provider):
        yield provider


@pytest.fixture
def fake_llm() -> Iterator[FakeOpenAIServer]:
    """A running fake OpenAI-compatible server."""
    yield from fake_openai_server()


@pytest.fixture
def fake_llm_provider(fake_llm: FakeOpenAIServer) -> Iterator[OpenAICompatibleProvider]:
    """The real HTTP provider against the fake server, with limits small enough for fast tests."""
    provider = OpenAICompatibleProvider(
        base_url=fake_llm.base_url,
        api_key="test-key",
        model="fake-model",
        embedding_model="fake-embedding",
        timeout=0.3,
        max_retries=2,
        backoff=0.01,
    )
    yield provider
    provider.close()


@pytest.fixture
def fake_llm_gateway(fake_llm_provider: OpenAICompatibleProvider) -> Iterator[OpenAICompatibleProvider]:
    """Every gateway call (chat turns, memory embeddings, compaction) goes to the fake server."""
    with provider_override(fake_llm_provider) as provider:
        yield provider
