"""The MCP server's tools as clients see them (names, descriptions, schemas derived from the
annotated signatures), each a thin wrapper running its agent_mcp.tools function.

The caller is never an argument: agent_mcp.views puts the token's principal in the ASGI scope,
which reaches each tool through its Context (`_caller`), so a tool acts only for that team.
"""

import json
import logging
import math
from collections.abc import Callable
from typing import Annotated, Any, Literal

from asgiref.sync import sync_to_async
from django.conf import settings
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from pydantic import Field
from rest_framework.exceptions import Throttled, ValidationError

from agent_mcp import tools
from consolidation.models import Fact
from consolidation.services import STATEMENT_MAX_CHARS
from kinsite.api.auth import TokenPrincipal
from kinsite.api.errors import OUTAGE_ERRORS
from kinsite.errors import KinsiteError
from memories.api.serializers import MEMORY_CONTENT_MAX_CHARS, REASON_MAX_CHARS
from memories.models import Memory
from sessions_app.models import Event
from workflows.api.serializers import LINEAGE_MAX_CHARS_LIMIT

logger = logging.getLogger(__name__)

# The ASGI scope key agent_mcp.views stores the authenticated TokenPrincipal under.
SCOPE_CALLER_KEY = "kinsite.caller"

INSTRUCTIONS = (
    "Kinsite keeps durable context for AI agents (kins): long-term memories, chat sessions and their "
    "history, a fact ledger consolidated nightly into an experience document, and data-workflow lineage. "
    "Ids (kin_id, session_id, workflow_id, memory_id) are the ones the Kinsite API and dashboard show. "
    "Search memories before answering from memory; add what is worth keeping."
)


class KinsiteMCPServer(MCPServer):
    """The SDK's server, refusing arguments a tool does not take: the SDK's validation ignores
    unknown keys, so an agent's typo ("importnce") would be dropped silently."""

    async def list_tools(self):
        tools = await super().list_tools()
        for tool in tools:
            tool.input_schema = {**tool.input_schema, "additionalProperties": False}
        return tools

    async def call_tool(self, name, arguments, context=None):
        tool = self._tool_manager.get_tool(name)  # the SDK's own lookup (an unknown tool: its error)
        if tool is not None:
            allowed = list(tool.parameters.get("properties", {}))
            unknown = sorted(set(arguments) - set(allowed))
            if unknown:
                # Worded as the SDK words a failed validation, so clients see one kind of error.
                raise ToolError(f"Error executing tool {name}: unknown argument(s): {', '.join(unknown)}; "
                                f"allowed: {', '.join(allowed)}.")
        return await super().call_tool(name, arguments, context)


mcp_server = KinsiteMCPServer(name="kinsite", title="Kinsite", instructions=INSTRUCTIONS)


def _caller(ctx: Context) -> TokenPrincipal:
    return ctx.request_context.request.scope[SCOPE_CALLER_KEY]


def _validation_text(detail, prefix: str = "") -> str:
    """DRF's error detail (dict of field → messages, or a list) as one line per problem."""
    if isinstance(detail, dict):
        parts = [_validation_text(value, f"{prefix}{'' if name == 'non_field_errors' else name}")
                 for name, value in detail.items()]
        return " ".join(parts)
    if isinstance(detail, list):
        return " ".join(_validation_text(item, prefix) for item in detail)
    return f"{prefix}: {detail}" if prefix else str(detail)


async def _run(ctx: Context, tool: Callable[..., dict[str, Any]], *, error: type[Exception] = ToolError,
               **arguments) -> dict[str, Any]:
    """Run an agent_mcp.tools function for the calling token in Django's sync thread (one ORM
    connection per request, as in a sync view). Anticipated failures become `error` with a
    message for the client (ToolError: an isError result; ResourceError: a JSON-RPC error);
    anything else is a bug the SDK logs and answers generically."""
    caller = _caller(ctx)
    try:
        return await sync_to_async(tool, thread_sensitive=True)(caller, **arguments)
    except KinsiteError as exc:
        # Every problem, as the API's error.details.errors lists them (the message names the first).
        problems = exc.details.get("errors")
        if isinstance(problems, list) and len(problems) > 1:
            raise error(f"{exc.message} Problems: {'; '.join(map(str, problems))}") from exc
        raise error(exc.message) from exc
    except ValidationError as exc:
        raise error(f"Invalid arguments: {_validation_text(exc.detail)}") from exc
    except Throttled as exc:
        wait = f" Try again in {math.ceil(exc.wait)} s." if exc.wait else ""
        raise error(f"{exc.detail}{wait}") from exc
    except OUTAGE_ERRORS as exc:
        logger.warning("Redis is unreachable during MCP call %s: %s", tool.__name__, exc)
        raise error("A backing service (Redis) is unreachable; try again shortly.") from exc


# --- argument types: the schema a client sees ------------------------------------------------------

KinId = Annotated[int, Field(ge=1, description="The kin's id (as in /api/v1/kins/{id}/).")]
SessionId = Annotated[int, Field(ge=1, description="The chat session's id (as in /api/v1/sessions/{id}/).")]
MemoryId = Annotated[int, Field(ge=1, description="The memory's id, as memory_search or memory_add return it.")]
WorkflowId = Annotated[int, Field(ge=1, description="The workflow's id (as in /api/v1/workflows/{id}/).")]
MemoryCategory = Literal[tuple(Memory.Category.values)]
FactCategory = Literal[tuple(Fact.Category.values)]
Platform = Literal[tuple(Event.Platform.values)]
Limit = Annotated[int | None, Field(ge=1, le=settings.SEARCH_MAX_LIMIT, description="How many results at most.")]
Query = Annotated[str, Field(min_length=1, max_length=settings.SEARCH_MAX_QUERY_CHARS,
                             description="What to look for, in plain words (search operators are ignored).")]
Importance = Annotated[int | None, Field(ge=1, le=10, description="1 = trivia, 5 = useful (default), "
                                                                  "10 = must never be forgotten.")]
Subject = Annotated[str | None, Field(max_length=200, description="Who or what it is about, e.g. a person or project.")]
Reason = Annotated[str | None, Field(max_length=REASON_MAX_CHARS,
                                     description="Why, in a few words (kept in the memory's change log).")]
Sender = Annotated[str | None, Field(max_length=200, description="Who is writing (one line), e.g. 'Maria'.")]


# --- tools ---------------------------------------------------------------------------------------


@mcp_server.tool()
async def memory_search(
    kin_id: KinId,
    query: Query,
    ctx: Context,
    limit: Limit = None,
    category: Annotated[MemoryCategory | None, Field(description="Only memories of this category.")] = None,
) -> dict[str, Any]:
    """Search a kin's long-term memories (its own and its team's shared ones) by words and meaning,
    ranked by relevance, importance and recency. Answers {results: [{id, content, category, subject,
    importance, shared, score, ...}]}. Use it before answering from memory."""
    return await _run(ctx, tools.memory_search, kin_id=kin_id, query=query, limit=limit, category=category)


@mcp_server.tool()
async def memory_add(
    kin_id: KinId,
    content: Annotated[str, Field(min_length=1, max_length=MEMORY_CONTENT_MAX_CHARS,
                                  description="One self-contained statement, e.g. 'Maria prefers short answers.'")],
    category: Annotated[MemoryCategory, Field(description="fact (about people or the world), preference (how "
                                                          "someone likes things), decision (what was agreed), "
                                                          "knowledge (how to do something).")],
    ctx: Context,
    subject: Subject = None,
    importance: Importance = None,
    shared: Annotated[bool | None, Field(description="true: the memory belongs to the kin's whole team.")] = None,
    reason: Reason = None,
) -> dict[str, Any]:
    """Store a long-term memory for a kin. When an active memory already says the same thing, that one
    is updated instead (created: false). Every change is kept in the memory's change log. Answers
    {created, memory}."""
    return await _run(ctx, tools.memory_add, kin_id=kin_id, content=content, category=category, subject=subject,
                      importance=importance, shared=shared, reason=reason)


@mcp_server.tool()
async def memory_update(
    memory_id: MemoryId,
    ctx: Context,
    content: Annotated[str | None, Field(min_length=1, max_length=MEMORY_CONTENT_MAX_CHARS,
                                         description="The new statement.")] = None,
    category: Annotated[MemoryCategory | None, Field(description="The new category.")] = None,
    subject: Subject = None,
    importance: Importance = None,
    reason: Reason = None,
) -> dict[str, Any]:
    """Change an active memory: give its id and only the fields that change (at least one of content,
    category, subject, importance). The change log keeps the old version. Answers {memory}."""
    return await _run(ctx, tools.memory_update, memory_id=memory_id, content=content, category=category,
                      subject=subject, importance=importance, reason=reason)


@mcp_server.tool()
async def memory_delete(memory_id: MemoryId, ctx: Context, reason: Reason = None) -> dict[str, Any]:
    """Delete a memory that is wrong or no longer true. It is marked deleted (never served again) and
    stays readable with its history; deleting it again changes nothing. Answers {memory}."""
    return await _run(ctx, tools.memory_delete, memory_id=memory_id, reason=reason)


@mcp_server.tool()
async def history_search(
    query: Query,
    ctx: Context,
    session_id: Annotated[int | None, Field(ge=1, description="Search this session's messages.")] = None,
    kin_id: Annotated[int | None, Field(ge=1, description="Search the messages of all this kin's sessions.")] = None,
    limit: Limit = None,
) -> dict[str, Any]:
    """Full-text search of chat messages, including those compacted out of the prompt: give exactly one
    of session_id or kin_id. Answers {results: [{id, session, external_id, sender, role, platform,
    created_at, content, score}]}, best first."""
    return await _run(ctx, tools.history_search, query=query, session_id=session_id, kin_id=kin_id, limit=limit)


@mcp_server.tool()
async def fact_log(
    kin_id: KinId,
    statement: Annotated[str, Field(min_length=1, max_length=STATEMENT_MAX_CHARS,
                                    description="One learning, e.g. 'The staging database is read-only on "
                                                "Fridays.'")],
    ctx: Context,
    category: Annotated[FactCategory | None, Field(description="Default: fact.")] = None,
) -> dict[str, Any]:
    """Log a learning in a kin's fact ledger. It stays pending until the next consolidation folds it
    into the kin's experience document. Answers {fact}."""
    return await _run(ctx, tools.fact_log, kin_id=kin_id, statement=statement, category=category)


@mcp_server.tool()
async def experience_read(
    kin_id: KinId,
    ctx: Context,
    version: Annotated[int | None, Field(ge=1, description="A version number; default: the current one.")] = None,
    section: Annotated[
        Annotated[int, Field(ge=0, le=1000)] | Annotated[str, Field(min_length=1, max_length=200)] | None,
        Field(description="A section number (2 or '2'; 0 is the title part) or heading text ('Defensive "
                          "Safeguards'); default: the whole document."),
    ] = None,
) -> dict[str, Any]:
    """Read a kin's experience document (markdown): the whole document, a past version, or one section.
    Answers {version, markdown, word_count, run, created_at} (and {section} when one was asked for)."""
    section = None if section is None else str(section)
    return await _run(ctx, tools.experience_read, kin_id=kin_id, version=version, section=section)


@mcp_server.tool()
async def session_list(
    kin_id: KinId,
    ctx: Context,
    archived: Annotated[bool | None, Field(description="true: only archived sessions; false: only open "
                                                       "ones; default: all.")] = None,
    limit: Annotated[int | None, Field(ge=1, le=tools.SESSION_LIST_MAX,
                                       description=f"How many at most (default {tools.SESSION_LIST_DEFAULT}).")] = None,
    before_id: Annotated[int | None, Field(ge=1, description="Only sessions older than this one (to page on: "
                                                             "the last id of the previous answer).")] = None,
) -> dict[str, Any]:
    """List a kin's chat sessions, newest first. Answers {sessions: [{id, title, description,
    working_memory, summary, message_count, workflow, archived, last_activity_at, ...}], more}; when
    more is true, call again with before_id set to the last session's id."""
    return await _run(ctx, tools.session_list, kin_id=kin_id, archived=archived, limit=limit, before_id=before_id)


@mcp_server.tool()
async def session_read(session_id: SessionId, ctx: Context) -> dict[str, Any]:
    """Read one chat session: its title, description, working memory, newest compaction summary,
    message count, workflow and whether it is archived. Answers {session}. history_search finds its
    messages."""
    return await _run(ctx, tools.session_read, session_id=session_id)


@mcp_server.tool()
async def prompt_preview(
    session_id: SessionId,
    ctx: Context,
    message: Annotated[str | None, Field(max_length=settings.MESSAGE_MAX_CHARS,
                                         description="The message to preview the prompt for.")] = None,
    sender: Sender = None,
    platform: Annotated[Platform | None, Field(description="Default: api.")] = None,
) -> dict[str, Any]:
    """Exactly what the kin's model would be sent if `message` were posted to the session now: the
    system prompt's sections with token counts, the selected history, the tools and the totals.
    Changes nothing."""
    return await _run(ctx, tools.prompt_preview, session_id=session_id, message=message, sender=sender,
                      platform=platform)


@mcp_server.tool()
async def lineage_read(
    workflow_id: WorkflowId,
    node_id: Annotated[str, Field(min_length=1, max_length=200, description="The node's id within the workflow.")],
    ctx: Context,
    max_chars: Annotated[int | None, Field(ge=100, le=LINEAGE_MAX_CHARS_LIMIT,
                                           description="Length budget of the narrative (default 2000).")] = None,
) -> dict[str, Any]:
    """How a workflow node's records were produced, as a narrative: its upstream steps in order, with
    record counts, branches at joins, and a warning when upstream settings changed since. Answers
    {workflow_id, node_id, stale, narrative}."""
    return await _run(ctx, tools.lineage_read, workflow_id=workflow_id, node_id=node_id, max_chars=max_chars)


@mcp_server.tool()
async def message_post(
    session_id: SessionId,
    content: Annotated[str, Field(min_length=1, max_length=settings.MESSAGE_MAX_CHARS,
                                  description="The message (or a command: /checkpoint, /new).")],
    ctx: Context,
    sender: Sender = None,
    platform: Annotated[Platform | None, Field(description="Default: api.")] = None,
) -> dict[str, Any]:
    """Post a chat message to a session and wait for the kin's reply (one chat turn, rate-limited like
    the API's). Answers {message, reply, turn} (after /new also new_session_id and new_session); the
    reply's text is reply.content."""
    return await _run(ctx, tools.message_post, session_id=session_id, content=content, sender=sender,
                      platform=platform)


@mcp_server.tool()
async def workflow_node_types(ctx: Context) -> dict[str, Any]:
    """Every node type a workflow may use: {node_types: [{name, title, description, inputs {min, max},
    outputs, config_schema}]}; config_schema is the JSON Schema of the node's `config`."""
    return await _run(ctx, tools.workflow_node_types)


@mcp_server.tool()
async def workflow_save(
    document: Annotated[dict[str, Any], Field(description=(
        "The workflow document {name, description, nodes: [{id, type, label, config, position}], edges: "
        "[{source, target}]}, as GET /api/v1/workflows/{id}/?export=1 gives it; node configs follow "
        "workflow_node_types."))],
    ctx: Context,
    workflow_id: Annotated[int | None, Field(ge=1, description="Replace this workflow; omit to create one.")] = None,
) -> dict[str, Any]:
    """Create a workflow, or replace one's graph (nodes keep their results by id; a changed config makes
    them stale). The same checks as the API: every problem is named (unknown types, bad parameters,
    cycles, unsafe URLs) and nothing is saved unless all pass. Answers the workflow with node states."""
    return await _run(ctx, tools.workflow_save, document=document, workflow_id=workflow_id)


@mcp_server.tool()
async def workflow_run(workflow_id: WorkflowId, ctx: Context) -> dict[str, Any]:
    """Start a run of a workflow (rate-limited like the API's). Answers {run}: its id and status; the
    nodes' states and counts are in the workflow (the API's GET /workflows/{id}/)."""
    return await _run(ctx, tools.workflow_run, workflow_id=workflow_id)


# --- resources -----------------------------------------------------------------------------------
# The same reads as the tools, by URI, for clients that attach context rather than call tools.


@mcp_server.resource(
    "kinsite://kins/{kin_id}/experience", name="experience", title="Experience document", mime_type="text/markdown",
    description="A kin's current experience document (markdown), consolidated from its fact ledger.",
)
async def experience_resource(kin_id: int, ctx: Context) -> str:
    body = await _run(ctx, tools.experience_read, error=ResourceError, kin_id=kin_id)
    return body["markdown"]


@mcp_server.resource(
    "kinsite://kins/{kin_id}/memories", name="memories", title="Memories", mime_type="application/json",
    description=f"A kin's active memories, its own and its team's shared ones, newest first (at most "
                f"{tools.RESOURCE_MEMORIES_MAX}; `truncated` says when there are more: use memory_search).",
)
async def memories_resource(kin_id: int, ctx: Context) -> str:
    return json.dumps(await _run(ctx, tools.memories_read, error=ResourceError, kin_id=kin_id))
