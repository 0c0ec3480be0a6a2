"""The MCP server over HTTP, with the mcp SDK's own client, under both servers Kinsite runs on
(WSGI: runserver's; ASGI: production's uvicorn workers): the tool list, a call, and
authentication by the API's Bearer tokens."""
import httpx2
import pytest

from memories.models import Memory
from tests.agent_mcp.conftest import call, with_client

TOOLS = {
    "memory_search", "memory_add", "memory_update", "memory_delete", "history_search", "fact_log",
    "experience_read", "prompt_preview", "lineage_read", "message_post", "session_list", "session_read",
    "workflow_node_types", "workflow_save", "workflow_run",
}


def test_lists_every_tool_with_a_description_and_a_schema(server_url, mcp_token):
    async def work(client):
        return (await client.list_tools()).tools

    tools = {tool.name: tool for tool in with_client(f"{server_url}/mcp/", mcp_token, work)}

    assert set(tools) == TOOLS
    for tool in tools.values():
        assert len(tool.description) > 40, tool.name
        assert tool.input_schema["type"] == "object"
        assert tool.input_schema["additionalProperties"] is False, tool.name  # unknown arguments are refused
    add = tools["memory_add"].input_schema
    assert add["required"] == ["kin_id", "content", "category"]
    assert add["properties"]["category"]["enum"] == ["fact", "preference", "decision", "knowledge"]
    assert add["properties"]["importance"]["anyOf"][0] == {"maximum": 10, "minimum": 1, "type": "integer"}
    assert "ctx" not in add["properties"]  # the caller comes from the token, never from the arguments
    assert set(tools["history_search"].input_schema["properties"]) == {"query", "session_id", "kin_id", "limit"}
    assert tools["lineage_read"].input_schema["required"] == ["workflow_id", "node_id"]


def test_a_call_writes_through_the_services_under_both_servers(server_url, mcp_token, mcp_kin):
    result = call(f"{server_url}/mcp/", mcp_token, "memory_add",
                  {"kin_id": mcp_kin.pk, "content": "Ada prefers tea.", "category": "preference"})

    assert result.is_error is False, result
    memory = Memory.objects.get()
    assert (memory.content, memory.source, memory.kin_id) == ("Ada prefers tea.", "mcp", mcp_kin.pk)
    assert result.structured_content["memory"]["id"] == memory.pk
    assert result.structured_content["created"] is True


def test_the_address_without_a_trailing_slash_works_too(live_server, mcp_token, mcp_kin):
    async def work(client):
        return (await client.list_tools()).tools

    assert {tool.name for tool in with_client(f"{live_server.url}/mcp", mcp_token, work)} == TOOLS


INITIALIZE = {
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.mark.parametrize(
    ("authorization", "code"),
    [
        (None, "not_authenticated"),
        ("Bearer ks_not-a-real-token", "authentication_failed"),
        ("Bearer", "authentication_failed"),
        ("Token abc", "not_authenticated"),
    ],
)
def test_a_request_without_a_valid_token_is_refused_401(server_url, mcp_token, authorization, code):
    headers = dict(HEADERS)
    if authorization is not None:
        headers["Authorization"] = authorization

    response = httpx2.post(f"{server_url}/mcp/", json=INITIALIZE, headers=headers, timeout=10)

    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="api"'
    assert response.json()["error"]["code"] == code


def test_the_sdk_client_cannot_connect_without_a_token_and_nothing_is_written(live_server, mcp_kin):
    async def work(client):
        return await client.call_tool("memory_add", {"kin_id": mcp_kin.pk, "content": "x", "category": "fact"})

    statuses = []
    # The SDK reports a refused connection as a generic error (an MCPError in a task group).
    with pytest.raises(Exception):  # noqa: B017
        with_client(f"{live_server.url}/mcp/", None, work, statuses=statuses)

    assert statuses and set(statuses) == {401}
    assert not Memory.objects.exists()


def test_a_revoked_token_is_refused(live_server, mcp_team):
    from kinsite.services import api_token_issue, api_token_revoke

    token, raw = api_token_issue(team=mcp_team, name="old")
    api_token_revoke(token=token)

    response = httpx2.post(f"{live_server.url}/mcp/", json=INITIALIZE,
                           headers={**HEADERS, "Authorization": f"Bearer {raw}"}, timeout=10)

    assert response.status_code == 401
    assert response.json()["error"] == {"code": "authentication_failed", "message": "Invalid or revoked token.",
                                         "details": {}}


@pytest.mark.parametrize("method", ["GET", "DELETE", "PUT"])
def test_only_post_is_served(server_url, mcp_token, method):
    # Stateless, there is no event stream to open (GET) and no session to end (DELETE): a GET
    # handed to the SDK would be held open for good.
    response = httpx2.request(method, f"{server_url}/mcp/", timeout=10,
                              headers={**HEADERS, "Authorization": f"Bearer {mcp_token}"})

    assert response.status_code == 405
    assert response.headers["Allow"] == "POST"
    assert response.json()["error"]["code"] == "method_not_allowed"


def test_malformed_or_oversized_bodies_are_refused(live_server, mcp_token):
    headers = {**HEADERS, "Authorization": f"Bearer {mcp_token}"}

    malformed = httpx2.post(f"{live_server.url}/mcp/", content=b"{not json", headers=headers, timeout=10)
    oversized = httpx2.post(f"{live_server.url}/mcp/", content=b"x" * (5 * 1024 * 1024), headers=headers, timeout=10)

    assert malformed.status_code == 400
    assert malformed.json()["error"]["code"] == -32700  # JSON-RPC's parse error
    assert oversized.status_code == 413


def test_a_bare_json_rpc_call_without_a_handshake_is_answered(live_server, mcp_token, mcp_kin):
    # Stateless: every POST stands alone, so a plain HTTP client can call a tool directly.
    body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": "memory_search", "arguments": {"kin_id": mcp_kin.pk, "query": "tea"}}}

    response = httpx2.post(f"{live_server.url}/mcp/", json=body, timeout=10,
                           headers={**HEADERS, "Authorization": f"Bearer {mcp_token}"})

    assert response.status_code == 200
    assert response.json()["id"] == 7
    assert response.json()["result"]["structuredContent"] == {"results": []}
