"""The MCP server's resources over HTTP with the SDK's client: a kin's experience document and
its memories, scoped to the token's team like the tools."""
import json

import pytest
from mcp import MCPError

from tests.agent_mcp.conftest import with_client
from tests.factories import ExperienceVersionFactory, KinFactory, MemoryFactory, TeamFactory


def test_the_resource_templates_are_listed(mcp_url, mcp_token):
    async def work(client):
        return (await client.list_resource_templates()).resource_templates

    templates = {t.uri_template: t for t in with_client(mcp_url, mcp_token, work)}

    assert set(templates) == {"kinsite://kins/{kin_id}/experience", "kinsite://kins/{kin_id}/memories"}
    assert templates["kinsite://kins/{kin_id}/experience"].mime_type == "text/markdown"


def test_a_kins_experience_and_memories_read_as_resources(mcp_url, mcp_token, mcp_kin):
    ExperienceVersionFactory(kin=mcp_kin, version=3, markdown="# Master AI Experience\n- Keep answers short.\n")
    own = MemoryFactory(kin=mcp_kin, content="Ada prefers tea.")
    shared = MemoryFactory(kin=None, team=mcp_kin.team, content="The office closes at six.")
    MemoryFactory(kin=mcp_kin, content="Forgotten.", status="deleted")

    async def work(client):
        return (await client.read_resource(f"kinsite://kins/{mcp_kin.pk}/experience"),
                await client.read_resource(f"kinsite://kins/{mcp_kin.pk}/memories"))

    experience, memories = with_client(mcp_url, mcp_token, work)

    assert experience.contents[0].text == "# Master AI Experience\n- Keep answers short.\n"
    assert experience.contents[0].mime_type == "text/markdown"
    body = json.loads(memories.contents[0].text)
    assert {m["id"] for m in body["memories"]} == {own.pk, shared.pk}
    assert body["truncated"] is False


def test_another_teams_kin_is_not_found_as_a_resource(mcp_url, mcp_token):
    their_kin = KinFactory(team=TeamFactory())
    ExperienceVersionFactory(kin=their_kin, version=1, markdown="# Their secret experience\n")

    async def work(client):
        with pytest.raises(MCPError) as raised:
            await client.read_resource(f"kinsite://kins/{their_kin.pk}/experience")
        return raised.value

    error = with_client(mcp_url, mcp_token, work)

    assert f"Kin {their_kin.pk} not found." in str(error)
    assert "secret" not in str(error)
