"""A running Kinsite and the mcp SDK's own streamable-HTTP client talking to it.

Two servers: pytest-django's live_server (Django's threaded WSGI server, as `manage.py
runserver` serves /mcp/) and uvicorn serving kinsite.asgi (as production's gunicorn with
uvicorn workers does). Both need a transactional database: the server threads read what the
test wrote, so it must be committed."""
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import httpx2
import pytest
import uvicorn
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from rest_framework.test import APIClient

from kinsite.services import api_token_issue
from tests.factories import KinFactory, MembershipFactory, SessionFactory, TeamFactory, UserFactory


@pytest.fixture(autouse=True)
def empty_cache_between_tests(empty_cache):
    # Rate-limit windows and session locks live in the cache (Redis in the PostgreSQL pass),
    # which outlives a test while ids repeat.
    yield


@pytest.fixture
def mcp_team(transactional_db):
    team = TeamFactory()
    MembershipFactory(team=team, user=UserFactory(), role="owner")
    return team


@pytest.fixture
def mcp_token(mcp_team) -> str:
    _, raw = api_token_issue(team=mcp_team, name="mcp client")
    return raw


@pytest.fixture
def mcp_kin(mcp_team):
    return KinFactory(team=mcp_team, name="Ada")


@pytest.fixture
def mcp_session(mcp_kin):
    return SessionFactory(kin=mcp_kin)


@pytest.fixture
def mcp_api_client(mcp_token) -> APIClient:
    """The REST API with the same token, to set things up and to compare with."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {mcp_token}")
    return client


@pytest.fixture
def asgi_server(transactional_db):
    """uvicorn serving kinsite.asgi in a thread; yields its base URL."""
    from kinsite.asgi import application

    # uvicorn serves a socket bound here, on a port the kernel picks: no other process (another
    # xdist worker) can take it between choosing it and serving on it.
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(application, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)
    sock.close()


@pytest.fixture(params=["wsgi", "asgi"])
def server_url(request) -> str:
    """Each test using it runs against both servers."""
    if request.param == "wsgi":
        return request.getfixturevalue("live_server").url
    return request.getfixturevalue("asgi_server")


@pytest.fixture
def mcp_url(live_server) -> str:
    return f"{live_server.url}/mcp/"


def with_client(url: str, token: str | None, work: Callable[[Client], Awaitable[Any]],
                statuses: list[int] | None = None) -> Any:
    """Connect the SDK's client to `url` (with `token` as the Bearer token), run `work` with it
    and return what it returns; `statuses` collects the HTTP status of every answer. The event
    loop runs in this thread only while connected, so the test may use the ORM before and
    after (not inside `work`)."""

    async def record(response):
        if statuses is not None:
            statuses.append(response.status_code)

    async def main():
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        http = httpx2.AsyncClient(headers=headers, timeout=30, event_hooks={"response": [record]})
        async with http, Client(streamable_http_client(url, http_client=http)) as client:
            return await work(client)

    return anyio.run(main)


def call(url: str, token: str, tool: str, arguments: dict[str, Any]):
    """One tool call; the CallToolResult."""

    async def work(client: Client):
        return await client.call_tool(tool, arguments)

    return with_client(url, token, work)


def error_text(result) -> str:
    """The text of a tool error (and that it is one)."""
    assert result.is_error is True, result
    return result.content[0].text
