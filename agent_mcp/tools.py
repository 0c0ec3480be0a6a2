"""What each MCP tool does, as plain synchronous Django code: the caller's token principal and
the arguments in, a JSON-able dict out. As in the API, every row is reached through the
caller's team (another team's id answers NotFound), arguments go through the API's own
serializers, and work through the same selectors and services.
"""
from __future__ import annotations

from typing import Any

from django.http import Http404
from rest_framework import serializers as drf_serializers

from consolidation import selectors as consolidation_selectors
from consolidation.api.serializers import (
    ExperienceQuerySerializer,
    ExperienceSerializer,
    FactCreateSerializer,
    FactSerializer,
)
from consolidation.models import Fact
from consolidation.services import fact_record
from kinsite.actors import Actor, token_ref
from kinsite.api.auth import TokenPrincipal
from kinsite.api.throttles import token_throttle_check
from kinsite.errors import InvalidInput, NotFound
from kinsite.models import Kin
from kinsite.selectors import kin_get
from memories import services as memory_services
from memories.api.serializers import (
    MemoryCreateSerializer,
    MemoryHitSerializer,
    MemorySearchQuerySerializer,
    MemorySerializer,
    MemoryUpdateSerializer,
)
from memories.models import Memory
from memories.search import selectors as memory_search_module
from memories.selectors import memory_get, memory_list
from sessions_app import selectors as session_selectors
from sessions_app.api.serializers import (
    HistoryHitSerializer,
    HistorySearchQuerySerializer,
    MessagePostSerializer,
    PromptPreviewQuerySerializer,
    PromptPreviewSerializer,
    SessionSerializer,
    turn_posted_body,
)
from sessions_app.models import Session
from sessions_app.turns import services as turns
from sessions_app.turns.preview import prompt_preview as session_prompt_preview
from workflows import services as workflow_services
from workflows.api.serializers import LineageQuerySerializer, WorkflowRunSerializer, workflow_detail_current
from workflows.models import Workflow, WorkflowRun
from workflows.nodes.registry import node_types_described
from workflows.selectors import node_get, node_lineage, node_lineage_export, workflow_get

# --- the caller's rows ------------------------------------------------------------------------
# Http404 becomes a message naming what was asked for, and nothing more (as the API's 404).


def _kin(caller: TokenPrincipal, kin_id: int) -> Kin:
    try:
        return kin_get(team=caller.team, kin_id=kin_id)
    except Http404:
        raise NotFound(f"Kin {kin_id} not found.") from None


def _session(caller: TokenPrincipal, session_id: int) -> Session:
    try:
        return session_selectors.session_get(team=caller.team, session_id=session_id)
    except Http404:
        raise NotFound(f"Session {session_id} not found.") from None


def _memory(caller: TokenPrincipal, memory_id: int) -> Memory:
    try:
        return memory_get(team=caller.team, memory_id=memory_id)
    except Http404:
        raise NotFound(f"Memory {memory_id} not found.") from None


def _workflow(caller: TokenPrincipal, workflow_id: int) -> Workflow:
    try:
        return workflow_get(team=caller.team, workflow_id=workflow_id)
    except Http404:
        raise NotFound(f"Workflow {workflow_id} not found.") from None


def _valid(serializer_class, data: dict[str, Any]) -> dict[str, Any]:
    """The arguments as the API's serializer accepts them. None means "not given" (an MCP
    client sends optional arguments as null as often as it leaves them out)."""
    serializer = serializer_class(data={name: value for name, value in data.items() if value is not None})
    if not serializer.is_valid():
        raise drf_serializers.ValidationError(serializer.errors)
    return serializer.validated_data


def _actor(caller: TokenPrincipal) -> Actor:
    # As the API's (memories.api.views), marked as coming through MCP in the change log.
    return Actor(label=f"mcp {token_ref(caller.token)}", user=caller.token.user)


def _source_ref(caller: TokenPrincipal) -> str:
    return token_ref(caller.token)


# --- memories ---------------------------------------------------------------------------------


def memory_search(caller: TokenPrincipal, *, kin_id: int, query: str, limit: int | None = None,
                  category: str | None = None) -> dict[str, Any]:
    kin = _kin(caller, kin_id)
    params = _valid(MemorySearchQuerySerializer, {"q": query, "limit": limit})
    hits = memory_search_module.memory_search(
        team=caller.team, kin=kin, query=params["q"], limit=params["limit"], category=category or ""
    )
    # An agent recalling through MCP uses what it finds, as a kin's memory_recall does:
    # counted as retrieved (the API's search, a browsing tool, counts nothing).
    memory_services.memory_hits_mark_retrieved(hits=hits)
    return {"results": MemoryHitSerializer(hits, many=True).data}


def memory_add(caller: TokenPrincipal, *, kin_id: int, content: str, category: str, subject: str | None = None,
               importance: int | None = None, shared: bool | None = None, reason: str | None = None) -> dict[str, Any]:
    kin = _kin(caller, kin_id)
    data = _valid(MemoryCreateSerializer, {
        "content": content, "category": category, "subject": subject, "importance": importance,
        "shared": shared, "reason": reason,
    })
    result = memory_services.memory_add(
        team=caller.team,
        kin=None if data["shared"] else kin,
        content=data["content"],
        category=data["category"],
        subject=data["subject"],
        importance=data["importance"],
        source=Memory.Source.MCP,
        source_ref=_source_ref(caller),
        reason=data["reason"],
        actor=_actor(caller),
    )
    return {"created": result.created, "memory": MemorySerializer(result.memory).data}


def memory_update(caller: TokenPrincipal, *, memory_id: int, content: str | None = None, category: str | None = None,
                  subject: str | None = None, importance: int | None = None,
                  reason: str | None = None) -> dict[str, Any]:
    memory = _memory(caller, memory_id)
    fields = dict(_valid(MemoryUpdateSerializer, {
        "content": content, "category": category, "subject": subject, "importance": importance, "reason": reason,
    }))
    memory_services.memory_check_editable(memory=memory)
    reason = fields.pop("reason")
    memory = memory_services.memory_update(memory=memory, actor=_actor(caller), reason=reason, **fields)
    return {"memory": MemorySerializer(memory).data}


def memory_delete(caller: TokenPrincipal, *, memory_id: int, reason: str | None = None) -> dict[str, Any]:
    memory = _memory(caller, memory_id)
    # As the API's DELETE: deleting a deleted memory changes nothing (no second change row).
    if memory.status != Memory.Status.DELETED:
        memory = memory_services.memory_delete(
            memory=memory, actor=_actor(caller), reason=(reason or "").strip() or "Deleted through MCP."
        )
    return {"memory": MemorySerializer(memory).data}


# Past this many, the memories resource says it was cut (memory_search is the way in).
RESOURCE_MEMORIES_MAX = 500


def memories_read(caller: TokenPrincipal, *, kin_id: int) -> dict[str, Any]:
    """A kin's active memories, its own and the team-shared ones, newest first (a resource)."""
    kin = _kin(caller, kin_id)
    memories = list(memory_list(team=caller.team, kin=kin, status=Memory.Status.ACTIVE)
                    .order_by("-updated_at", "-id")[:RESOURCE_MEMORIES_MAX + 1])
    return {
        "kin_id": kin.pk,
        "memories": MemorySerializer(memories[:RESOURCE_MEMORIES_MAX], many=True).data,
        "truncated": len(memories) > RESOURCE_MEMORIES_MAX,
    }


# --- history, facts, experience ---------------------------------------------------------------


def history_search(caller: TokenPrincipal, *, query: str, session_id: int | None = None, kin_id: int | None = None,
                   limit: int | None = None) -> dict[str, Any]:
    if (session_id is None) == (kin_id is None):
        raise InvalidInput("Give exactly one of session_id (search one session) or kin_id (all its sessions).")
    scope = {"session": _session(caller, session_id)} if session_id is not None else {"kin": _kin(caller, kin_id)}
    params = _valid(HistorySearchQuerySerializer, {"q": query, "limit": limit})
    hits = session_selectors.history_search(query=params["q"], limit=params["limit"], **scope)
    return {"results": HistoryHitSerializer(hits, many=True).data}


def fact_log(caller: TokenPrincipal, *, kin_id: int, statement: str, category: str | None = None) -> dict[str, Any]:
    kin = _kin(caller, kin_id)
    data = _valid(FactCreateSerializer, {"statement": statement, "category": category})
    fact = fact_record(
        kin=kin, statement=data["statement"], category=data["category"],
        source=Fact.Source.MCP, source_ref=_source_ref(caller),
    )
    return {"fact": FactSerializer(fact).data}


def experience_read(caller: TokenPrincipal, *, kin_id: int, version: int | None = None,
                    section: str | None = None) -> dict[str, Any]:
    kin = _kin(caller, kin_id)
    params = _valid(ExperienceQuerySerializer, {"version": version, "section": section})
    experience = consolidation_selectors.experience_get(kin, version=params.get("version"))  # NotFound if none
    body = dict(ExperienceSerializer(experience).data)
    if params.get("section"):
        text = consolidation_selectors.experience_section(experience.markdown, params["section"])
        if text is None:
            raise NotFound(f"Version {experience.version} has no section {params['section']!r}.")
        body.update(section=params["section"], markdown=text)
    return body


# --- sessions and workflows -------------------------------------------------------------------

SESSION_LIST_DEFAULT = 20
SESSION_LIST_MAX = 100


def session_list(caller: TokenPrincipal, *, kin_id: int, archived: bool | None = None, limit: int | None = None,
                 before_id: int | None = None) -> dict[str, Any]:
    """A kin's sessions, newest first, as GET /kins/{id}/sessions/ lists them; `before_id`
    pages on, `more` says whether there are older ones."""
    kin = _kin(caller, kin_id)
    limit = limit or SESSION_LIST_DEFAULT
    if not 1 <= limit <= SESSION_LIST_MAX:
        raise InvalidInput(f"limit must be between 1 and {SESSION_LIST_MAX}.")
    sessions = session_selectors.session_list_described(team=caller.team, kin=kin, archived=archived)
    if before_id is not None:
        sessions = sessions.filter(pk__lt=before_id)
    page = list(sessions.order_by("-id")[:limit + 1])
    return {"sessions": SessionSerializer(page[:limit], many=True).data, "more": len(page) > limit}


def session_read(caller: TokenPrincipal, *, session_id: int) -> dict[str, Any]:
    """One session as GET /sessions/{id}/ shows it: title, description, working memory, summary."""
    try:
        session = session_selectors.session_get_described(team=caller.team, session_id=session_id)
    except Http404:
        raise NotFound(f"Session {session_id} not found.") from None
    return {"session": SessionSerializer(session).data}



def prompt_preview(caller: TokenPrincipal, *, session_id: int, message: str | None = None, sender: str | None = None,
                   platform: str | None = None) -> dict[str, Any]:
    session = _session(caller, session_id)
    params = _valid(PromptPreviewQuerySerializer, {"message": message, "sender": sender, "platform": platform})
    body = session_prompt_preview(
        session=session, message=params["message"], sender=params["sender"], platform=params["platform"]
    )
    return PromptPreviewSerializer(body).data


def lineage_read(caller: TokenPrincipal, *, workflow_id: int, node_id: str,
                 max_chars: int | None = None) -> dict[str, Any]:
    workflow = _workflow(caller, workflow_id)
    # A NUL names no node (PostgreSQL text cannot hold one, and the query would fail).
    try:
        if "\x00" in node_id:
            raise Http404
        node_get(workflow=workflow, client_id=node_id)
    except Http404:
        raise NotFound(f"Workflow {workflow_id} has no node {node_id!r}.") from None
    params = _valid(LineageQuerySerializer, {"max_chars": max_chars})
    graph = node_lineage(workflow=workflow, client_id=node_id)
    # The namespace only names the workflow in PROV and OpenLineage, not in the narrative.
    narrative = node_lineage_export(workflow=workflow, graph=graph, fmt="narrative", namespace="",
                                    max_chars=params["max_chars"])
    return {"workflow_id": workflow.pk, "node_id": node_id, "stale": graph.stale, "narrative": narrative}


def workflow_node_types(caller: TokenPrincipal) -> dict[str, Any]:
    return {"node_types": node_types_described()}


def workflow_save(caller: TokenPrincipal, *, document: Any, workflow_id: int | None = None) -> dict[str, Any]:
    """Creates a workflow from `document`, or replaces workflow `workflow_id`'s: the API's
    POST /workflows/ and PUT /workflows/{id}/, with their validation."""
    workflow = None if workflow_id is None else _workflow(caller, workflow_id)
    clean = workflow_services.document_clean(document)
    if workflow is None:
        workflow = workflow_services.workflow_create(team=caller.team, document=clean)
    else:
        workflow = workflow_services.workflow_update(workflow=workflow, document=clean)
    return workflow_detail_current(workflow)


def workflow_run(caller: TokenPrincipal, *, workflow_id: int) -> dict[str, Any]:
    # The token's "workflow_runs" allowance, as POST /workflows/{id}/run/ counts it.
    token_throttle_check(principal=caller, scope="workflow_runs")
    workflow = _workflow(caller, workflow_id)
    run = workflow_services.workflow_run_start(workflow=workflow)
    return {"run": WorkflowRunSerializer(WorkflowRun.objects.get(pk=run.pk)).data}


def message_post(caller: TokenPrincipal, *, session_id: int, content: str, sender: str | None = None,
                 platform: str | None = None) -> dict[str, Any]:
    # The token's "chat" allowance, checked first as DRF does: every attempt counts, refused or not.
    token_throttle_check(principal=caller, scope="chat")
    session = _session(caller, session_id)
    data = _valid(MessagePostSerializer, {"content": content, "sender": sender, "platform": platform})
    turn = turns.turn_post(session=session, **data)
    return turn_posted_body(turn, as_run=True)
