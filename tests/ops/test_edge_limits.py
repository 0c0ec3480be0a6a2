"""Limits at the edge (docs/deployment.md, "Limits at the edge"): the Procfile's web line, with a short
WEB_READ_TIMEOUT_SECONDS, refuses an oversized request line, header field or header count
and closes a request whose body does not come, and still serves ordinary requests, a body
that trickles in included. Raw sockets, since an HTTP client would not send these. The
server tests run in the PostgreSQL pass (the served process reads the test database)."""
import json
import socket
import time

import httpx
import pytest
from django.conf import settings

from kinsite.services import api_token_issue
from sessions_app.models import Event
from tests.factories import KinFactory, SessionFactory, TeamFactory
from tests.ops.test_deployment import spare_redis_url, stop_all, wait_until
from tests.ops.test_serve_command import REPO, free_port
from tests.ops.test_streams_served import procfile_web, procfile_web_start

STARTUP_SECONDS = 40
READ_TIMEOUT = 2


def exchange(port: int, raw: bytes, *, pieces: list[bytes] = (), pause: float = 0, wait: float = 15):
    """Send `raw`, then each of `pieces` after `pause` seconds; read until the server closes
    or `wait` passes. The answer's bytes and the seconds it took from the last byte sent."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as sock:
        sock.sendall(raw)
        for piece in pieces:
            time.sleep(pause)
            sock.sendall(piece)
        sent = time.monotonic()
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except TimeoutError:
            pytest.fail(f"the server held the connection for {wait} s: {answer[:200]!r}")
        return answer, time.monotonic() - sent


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def head(path: str, *extra: bytes, method: str = "GET") -> bytes:
    return b"\r\n".join([f"{method} {path} HTTP/1.1".encode(), b"Host: localhost", *extra, b"", b""])


@pytest.fixture
def web(transactional_db, tmp_path):
    port = free_port()
    process, log_path = procfile_web_start(
        tmp_path, port=port, REDIS_URL=spare_redis_url() if settings.REDIS_URL else "",
        CELERY_TASK_ALWAYS_EAGER="true", WEB_READ_TIMEOUT_SECONDS=str(READ_TIMEOUT),
    )

    def health():
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(health, seconds=STARTUP_SECONDS, what="the web process", processes={"web": process},
                   logs={"web": log_path})
        yield port
    finally:
        stop_all([process])


@pytest.mark.postgres
def test_oversized_heads_are_refused_and_ordinary_requests_served(web):
    long_line = head("/healthz?q=" + "a" * 20_000)
    answer, _ = exchange(web, long_line)
    assert status(answer) == 414 and b"Request line too long" in answer

    answer, _ = exchange(web, head("/healthz", b"X-Big: " + b"a" * 100_000))
    assert status(answer) == 431 and b"Header field too long" in answer
    # The same header in pieces, as a slow client sends it: refused as well once it is whole.
    big = head("/healthz", b"X-Big: " + b"a" * 100_000)
    answer, _ = exchange(web, big[:40], pieces=[big[40 + n:40 + n + 20_000] for n in range(0, len(big), 20_000)],
                         pause=0.05)
    assert status(answer) == 431

    answer, _ = exchange(web, head("/healthz", *(f"X-Field-{n}: a".encode() for n in range(150))))
    assert status(answer) == 431 and b"Too many header fields" in answer

    # Within the limits: a line and a header field of several KB, and a kept-alive connection.
    answer, _ = exchange(web, head("/healthz?q=" + "a" * 6_000, b"X-Big: " + b"a" * 6_000, b"Connection: close"))
    assert status(answer) == 200
    with httpx.Client(base_url=f"http://127.0.0.1:{web}") as client:
        assert [client.get("/healthz").status_code for _ in range(3)] == [200, 200, 200]


@pytest.mark.postgres
def test_a_body_that_does_not_come_is_cut_off_and_one_that_trickles_in_is_read(web):
    kin = KinFactory(team=TeamFactory())
    session = SessionFactory(kin=kin)
    _, token = api_token_issue(team=kin.team, name="edge")
    path = f"/api/v1/sessions/{session.pk}/messages/import/"

    def post(body: bytes, length: int) -> bytes:
        return head(path, f"Authorization: Bearer {token}".encode(), b"Content-Type: application/json",
                    f"Content-Length: {length}".encode(), b"Connection: close", method="POST") + body

    # Content-Length promises 10,000 bytes, 20 come: 408 once the timeout passes, nothing stored.
    answer, seconds = exchange(web, post(b'{"messages": [{"co', 10_000))
    assert status(answer) == 408, answer
    assert READ_TIMEOUT - 0.5 < seconds < READ_TIMEOUT + 3
    # The head alone, never finished: the same.
    answer, seconds = exchange(web, head(path)[:30])
    assert status(answer) == 408 and seconds < READ_TIMEOUT + 3
    assert not Event.objects.filter(session=session).exists()

    # A body whose pieces come slower than the timeout in all, but each within it: read whole.
    body = json.dumps({"messages": [{"content": "Slowly, but it came.", "sender": "Maria"}]}).encode()
    pieces = [body[n:n + 16] for n in range(16, len(body), 16)]
    answer, _ = exchange(web, post(body[:16], len(body)), pieces=pieces, pause=READ_TIMEOUT / 3)
    assert len(pieces) * READ_TIMEOUT / 3 > READ_TIMEOUT
    assert status(answer) == 201, answer
    assert list(Event.objects.filter(session=session).values_list("content", flat=True)) == ["Slowly, but it came."]


def test_the_read_timeout_and_the_limits_are_set_in_the_production_configuration():
    assert 0 < settings.WEB_READ_TIMEOUT_SECONDS <= 15
    example = (REPO / ".env.example").read_text()
    assert "\nWEB_READ_TIMEOUT_SECONDS=10\n" in example
    line = procfile_web()
    assert "--worker-class kinsite.webworker.KinsiteUvicornWorker" in line
    for flag in ("--limit-request-line 8190", "--limit-request-fields 100", "--limit-request-field_size 8190"):
        assert flag in line
