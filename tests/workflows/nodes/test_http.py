"""The `http_json` source: records read at a path, and SSRF (SPEC §13): a team's workflow
never reaches loopback, private, link-local or metadata addresses, however spelled, resolved
or redirected to, unless the operator allows them; every failed fetch reads the same, so
answers cannot map ports. Real servers on 127.0.0.1; any other address is refused by a
connect recorder before a packet leaves (tests.support.outbound)."""
import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.urls import reverse

from tests.sessions_app.test_api_access import assert_api_error
from tests.support.outbound import (
    LocalServer,
    closed_port,
    no_real_dns,  # noqa: F401 (a fixture, used by pytestmark)
    record_connections,
    scripted_dns,
)
from tests.workflows.nodes.support import PEOPLE, run
from workflows.nodes.base import NodeError, RunContext, validate_params
from workflows.nodes.registry import NODE_TYPES, describe

SECRET = {"token": "s3cret-from-the-inside"}


def fetch(url):
    # The run-time guard, on its own: saving already refuses a literal address the policy
    # refuses (test_a_literal_address_is_refused_when_saved), but a node saved earlier, or under
    # a policy an operator has since narrowed, still reaches the fetch.
    return NODE_TYPES["http_json"].run(RunContext(), {"url": url}, [])


def neutral(url, *, seconds=10, max_bytes=5 * 1024 * 1024):
    return (
        f"Could not fetch JSON from {url}: the address is not allowed or not reachable, or the answer was "
        f"an error, too slow, too large or not JSON (limits: {seconds:g} s, {max_bytes} bytes). "
        "The server log has the reason."
    )


def failure(url):
    with pytest.raises(NodeError) as caught:
        fetch(url)
    return str(caught.value)


@pytest.fixture
def server():
    server = LocalServer().start()
    server.json("/secret", SECRET)
    yield server
    server.stop()


@pytest.fixture
def connections(monkeypatch):
    return record_connections(monkeypatch)


# A test that needs a name scripts it; no query leaves (no_real_dns, tests/support/outbound.py).
pytestmark = pytest.mark.usefixtures("no_real_dns")


@pytest.mark.parametrize("host", [
    "127.0.0.1", "localhost", "2130706433", "0x7f.1", "0177.1", "127.1", "017700000001",
    "[::1]", "[::ffff:127.0.0.1]", "[0:0:0:0:0:ffff:7f00:1]", "[64:ff9b::7f00:1]", "[2002:7f00:1::]", "0.0.0.0",
])
def test_loopback_in_any_spelling_is_refused_before_connecting(server, connections, host, caplog):
    url = f"http://{host}:{server.port}/secret"

    with caplog.at_level(logging.WARNING, logger="workflows.nodes.http"):
        assert failure(url) == neutral(url)

    assert server.hits == [] and connections == []
    assert any("refused" in record.getMessage() and url in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize("url", [
    "http://10.0.0.5/", "http://172.16.3.4:8080/", "http://192.168.1.1/admin", "http://100.64.0.1/",
    "http://169.254.169.254/latest/meta-data/iam/", "http://[fd00::1]/", "http://[fe80::1]/", "http://[fd00:ec2::254]/",
    "http://224.0.0.1/", "http://[ff02::1]/", "http://240.0.0.1/", "http://[::ffff:10.0.0.5]/",
    "http://[64:ff9b::a9fe:a9fe]/", "http://[2002:a00:5::]/", "http://[fec0::1]/",
])
def test_private_link_local_and_metadata_addresses_are_refused_without_connecting(connections, url):
    assert failure(url) == neutral(url)
    assert connections == []


def test_names_that_resolve_inside_are_refused_without_connecting(monkeypatch, connections):
    lookups = scripted_dns(monkeypatch, {
        "intranet.example": [["93.184.215.14", "10.1.2.3"]],  # one private answer among public ones is enough
        "metadata.google.internal": [["169.254.169.254"]],
    })

    for url in ["http://intranet.example/", "http://metadata.google.internal/computeMetadata/v1/"]:
        assert failure(url) == neutral(url)

    assert connections == []
    assert lookups == ["intranet.example"]  # the metadata name is refused by name, before any lookup


def test_a_redirect_to_loopback_is_refused(server, monkeypatch, settings, connections):
    # The operator allows one name (files.test, served here); the redirect leads elsewhere on loopback.
    scripted_dns(monkeypatch, {"files.test": [["127.0.0.1"]]})
    settings.WORKFLOW_HTTP_ALLOWED_HOSTS = ["files.test"]
    server.redirect("/hop", f"http://127.0.0.1:{server.port}/secret")
    server.redirect("/hop-private", "http://10.0.0.5/secret", status=307)
    server.redirect("/hop-localhost", f"http://localhost:{server.port}/secret", status=301)

    for path in ["/hop", "/hop-private", "/hop-localhost"]:
        url = f"http://files.test:{server.port}{path}"
        assert failure(url) == neutral(url)

    assert [path for path, _ in server.hits] == ["/hop", "/hop-private", "/hop-localhost"]
    assert connections == [("127.0.0.1", server.port)] * 3


def test_redirects_are_followed_within_the_cap(server, settings):
    settings.WORKFLOW_HTTP_ALLOWED_HOSTS = ["127.0.0.1"]
    server.redirect("/a", "/b")
    server.redirect("/b", f"{server.base}/c", status=308)
    server.redirect("/c", "/secret", status=303)
    server.redirect("/d", "/a")

    assert fetch(f"{server.base}/a") == [SECRET]
    url = f"{server.base}/d"
    assert failure(url) == neutral(url)  # four redirects: one too many


@pytest.mark.parametrize("entries, allow_private", [
    (["127.0.0.1"], False), (["127.0.0.0/8"], False), (["localhost"], False), (["::1", "127.0.0.1/32"], False),
    ([], True),
])
def test_the_operator_can_allow_local_addresses(server, settings, entries, allow_private):
    settings.WORKFLOW_HTTP_ALLOWED_HOSTS = entries
    settings.WORKFLOW_HTTP_ALLOW_PRIVATE = allow_private
    host = "localhost" if entries == ["localhost"] else "127.0.0.1"

    assert fetch(f"http://{host}:{server.port}/secret") == [SECRET]


def test_allow_private_still_refuses_metadata_addresses(settings, connections):
    settings.WORKFLOW_HTTP_ALLOW_PRIVATE = True

    url = "http://169.254.169.254/latest/meta-data/"
    assert failure(url) == neutral(url)
    assert connections == []


def test_a_host_name_is_resolved_once_and_the_checked_address_is_the_one_connected(server, monkeypatch, connections):
    # DNS rebinding: a public answer for the check, loopback for a second lookup at connect time.
    lookups = scripted_dns(monkeypatch, {"rebind.test": [["93.184.215.14"], ["127.0.0.1"]]})

    url = f"http://rebind.test:{server.port}/secret"
    assert failure(url) == neutral(url)  # the recorder refuses the public address; no packet leaves

    assert connections == [("93.184.215.14", server.port)]
    assert server.hits == []
    assert lookups == ["rebind.test"]


def test_a_pinned_fetch_still_names_the_host(server, monkeypatch, settings):
    scripted_dns(monkeypatch, {"api.test": [["127.0.0.1"]]})
    settings.WORKFLOW_HTTP_ALLOWED_HOSTS = ["127.0.0.1"]
    server.echo_host("/who")

    assert fetch(f"http://api.test:{server.port}/who") == [{"host": f"api.test:{server.port}"}]


def test_every_failure_reads_the_same(server, settings):
    def shape(url):
        return failure(url).replace(url, "<url>")

    port = closed_port()
    # No allow-list: an open and a closed port on loopback are both refused, alike.
    refused_open, refused_closed = shape(f"http://127.0.0.1:{server.port}/secret"), shape(f"http://127.0.0.1:{port}/x")

    settings.WORKFLOW_HTTP_ALLOWED_HOSTS = ["127.0.0.1"]
    settings.WORKFLOW_HTTP_TIMEOUT_SECONDS = 0.5
    server.respond("/not-json", body=b"<html>hello</html>")
    server.respond("/deep", body=b"[" * 100_000)
    server.respond("/error", status=500, body=b'{"detail": "stack trace"}')
    server.drip("/slow", every=0.05, for_at_most=3)
    server.respond("/big", body=b"[" + b" " * (10 * 1024 * 1024) + b"]")
    failures = {
        "closed port": shape(f"http://127.0.0.1:{port}/x"),
        "not found": shape(f"{server.base}/missing"),
        "server error": shape(f"{server.base}/error"),
        "not json": shape(f"{server.base}/not-json"),
        "too deep": shape(f"{server.base}/deep"),
        "too slow": shape(f"{server.base}/slow"),
        "too large": shape(f"{server.base}/big"),
    }

    assert refused_open == refused_closed == neutral("<url>")
    assert failures == dict.fromkeys(failures, neutral("<url>", seconds=0.5))


def test_the_body_cap_stops_reading(server, settings):
    settings.WORKFLOW_HTTP_ALLOWED_HOSTS = ["127.0.0.1"]
    settings.WORKFLOW_HTTP_MAX_BYTES = 100
    server.json("/announced", [{"x": "y" * 100}] * 10)
    server.chunked("/unannounced", 1000)
    server.json("/small", [{"x": "y"}])

    for path in ["/announced", "/unannounced"]:
        url = f"{server.base}{path}"
        assert failure(url) == neutral(url, max_bytes=100)
    assert fetch(f"{server.base}/small") == [{"x": "y"}]


def test_the_time_cap_is_a_deadline_for_the_whole_fetch(server, settings):
    # Each byte comes quickly, so only a deadline on the whole answer stops it.
    settings.WORKFLOW_HTTP_ALLOWED_HOSTS = ["127.0.0.1"]
    settings.WORKFLOW_HTTP_TIMEOUT_SECONDS = 1
    server.drip("/slow", every=0.1, for_at_most=4)
    url = f"{server.base}/slow"

    started = time.monotonic()
    message = failure(url)
    elapsed = time.monotonic() - started

    assert message == neutral(url, seconds=1)
    assert elapsed < 2


def test_urls_with_credentials_or_other_schemes_are_refused_when_saved():
    node_type = NODE_TYPES["http_json"]

    assert validate_params(node_type, {"url": "http://user:pw@example.org/data"}) == [
        "'url' must not contain a user name or password."
    ]
    for url in ["file:///etc/passwd", "gopher://example.org/", "http://", "http:///path"]:
        assert validate_params(node_type, {"url": url}) == ["'url' must be an http:// or https:// address."]


# --- what the API and the dashboard show --------------------------------------------------------


@pytest.fixture
def inside_workflow(api_client, server, monkeypatch, django_capture_on_commit_callbacks):
    # A name that resolves inside: saved (no lookup when saving), refused when fetched.
    scripted_dns(monkeypatch, {"inside.example": [["127.0.0.1"]]})
    url = f"http://inside.example:{server.port}/secret"
    document = {
        "name": "Peek inside",
        "nodes": [{"id": "peek", "type": "http_json", "config": {"url": url}},
                  {"id": "table", "type": "table_output"}],
        "edges": [{"source": "peek", "target": "table"}],
    }
    created = api_client.post("/api/v1/workflows/", document, format="json")
    assert created.status_code == 201, created.content
    workflow_id = created.json()["id"]
    with django_capture_on_commit_callbacks(execute=True):
        ran = api_client.post(f"/api/v1/workflows/{workflow_id}/run/")
    assert ran.status_code == 202, ran.content
    return workflow_id, ran.json()["run"], url


def test_the_api_shows_only_the_neutral_error(api_client, server, inside_workflow):
    workflow_id, run, url = inside_workflow

    detail = api_client.get(f"/api/v1/workflows/{workflow_id}/")
    peek = detail.json()["nodes"][0]
    assert (peek["status"], peek["error"]) == ("failed", neutral(url))
    assert detail.json()["last_run"]["error"] == f"peek: {neutral(url)}"
    assert SECRET["token"] not in detail.content.decode()
    assert server.hits == []


def test_the_dashboard_inspector_shows_only_the_neutral_error(client, user, server, inside_workflow):
    workflow_id, _, url = inside_workflow
    client.force_login(user)

    for page in [reverse("dashboard:workflow_detail", args=[workflow_id]),
                 reverse("dashboard:workflow_node", args=[workflow_id, "peek"])]:
        body = client.get(page).content.decode()
        assert neutral(url)[:120] in body
        assert SECRET["token"] not in body and "loopback" not in body
    assert server.hits == []


@pytest.mark.parametrize(("host", "refusal"), [
    ("127.0.0.1", "127.0.0.1 is loopback"), ("2130706433", "127.0.0.1 is loopback"),
    ("0x7f.1", "127.0.0.1 is loopback"), ("localhost", "localhost is loopback"), ("[::1]", "::1 is loopback"),
    ("[::ffff:10.0.0.5]", "::ffff:a00:5 is private (it embeds 10.0.0.5)"), ("192.168.1.1", "192.168.1.1 is private"),
    ("169.254.169.254", "169.254.169.254 is a cloud metadata address"),
    ("metadata.google.internal", "metadata.google.internal is a cloud metadata host name"),
])
def test_a_literal_address_is_refused_when_saved(api_client, connections, host, refusal):
    url = f"http://{host}/latest"
    problems = validate_params(NODE_TYPES["http_json"], {"url": url})
    assert problems == [f"'url' cannot be fetched: {refusal}, which workflows may not reach (an operator can "
                        "allow it with WORKFLOW_HTTP_ALLOWED_HOSTS)."]

    document = {"name": "Inside", "nodes": [{"id": "feed", "type": "http_json", "config": {"url": url}}], "edges": []}
    error = assert_api_error(api_client.post("/api/v1/workflows/", document, format="json"), 400,
                             code="invalid_workflow")
    assert error["details"]["errors"] == [f"node 'feed' (http_json): {problems[0]}"]
    assert connections == []  # judged from the text: no lookup, no connection


def test_what_the_operator_allows_is_saved_and_names_are_judged_when_fetched(settings):
    http_json = NODE_TYPES["http_json"]
    settings.WORKFLOW_HTTP_ALLOWED_HOSTS = ["127.0.0.1", "10.0.0.0/8"]
    assert validate_params(http_json, {"url": "http://127.0.0.1:8080/x"}) == []
    assert validate_params(http_json, {"url": "http://10.2.3.4/x"}) == []
    assert validate_params(http_json, {"url": "http://192.168.1.1/x"}) != []
    settings.WORKFLOW_HTTP_ALLOWED_HOSTS = []
    settings.WORKFLOW_HTTP_ALLOW_PRIVATE = True
    assert validate_params(http_json, {"url": "http://192.168.1.1/x"}) == []
    assert validate_params(http_json, {"url": "http://169.254.169.254/x"}) != []  # metadata still refused
    assert validate_params(http_json, {"url": "http://intranet.example/x"}) == []  # no lookup when saved


def test_the_api_refuses_credentials_in_a_url(api_client):
    document = {"name": "Creds", "nodes": [{"id": "a", "type": "http_json",
                                            "config": {"url": "https://admin:hunter2@example.org/x"}}], "edges": []}

    error = assert_api_error(api_client.post("/api/v1/workflows/", document, format="json"), 400,
                             code="invalid_workflow")
    assert "must not contain a user name or password" in str(error)


# --- reading records (a plain local JSON server, allowed by the test) ----------------------------


class _JSONHandler(BaseHTTPRequestHandler):
    routes: dict = {}

    def do_GET(self):
        status, body = self.routes.get(self.path, (404, b"{}"))
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def json_server():
    handler = type("Handler", (_JSONHandler,), {"routes": {}})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield handler.routes, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_http_json_source_reads_records_at_a_path(json_server, settings):
    # Loopback is refused unless allowed (the tests above); the test server is.
    settings.WORKFLOW_HTTP_ALLOWED_HOSTS = ["127.0.0.1"]
    routes, base = json_server
    routes["/people"] = (200, json.dumps({"data": {"items": PEOPLE[:2]}}).encode())
    config = {"url": f"{base}/people", "path": "data.items"}

    assert run("http_json", config) == PEOPLE[:2]
    assert describe("http_json", config, records_out=2) == (
        f"Fetches JSON from {base}/people at path data.items (2 records out)."
    )


def test_http_json_source_reports_http_errors_and_size_cap(json_server, settings):
    settings.WORKFLOW_HTTP_ALLOWED_HOSTS = ["127.0.0.1"]
    settings.WORKFLOW_HTTP_MAX_BYTES = 100
    routes, base = json_server
    routes["/big"] = (200, json.dumps([{"x": "y" * 100}] * 10).encode())

    # Both read alike, on purpose: the reason goes to the server log only.
    with pytest.raises(NodeError, match=f"Could not fetch JSON from {base}/missing: .* 100 bytes"):
        run("http_json", {"url": f"{base}/missing"})
    with pytest.raises(NodeError, match=f"Could not fetch JSON from {base}/big: .* 100 bytes"):
        run("http_json", {"url": f"{base}/big"})


def test_http_json_source_refuses_non_http_urls():
    assert validate_params(NODE_TYPES["http_json"], {"url": "file:///etc/passwd"}) == [
        "'url' must be an http:// or https:// address."
    ]
