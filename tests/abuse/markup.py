"""A team whose every stored text holds markup: the world of test_stored_markup.py and of
its browser test. Rows are written as the services would shape them (a turn with tool
calls and their results, an introspection run, a consolidation run, experience versions,
a workflow with results and a run), and then every free-text column of every project
table is overwritten with "m<N> <payload>", so a new text column is covered too. Each
marker m<N> names one value, so a test can tell where that value is shown."""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field

from django.core.validators import MaxLengthValidator, ProhibitNullCharactersValidator
from django.db import models
from django.utils import timezone
from django.utils.html import escape

from consolidation.models import ConsolidationRun, Fact
from kinsite.models import LLMCall, PromptTemplate
from kinsite.services import api_token_issue
from memories.models import Memory, MemoryChange
from sessions_app.models import Event, IntrospectionRun, Turn
from tests.abuse.support import project_models
from tests.factories import (
    ConsolidationRunFactory,
    EdgeFactory,
    ExperienceVersionFactory,
    FactFactory,
    IntrospectionRunFactory,
    KinFactory,
    LLMCallFactory,
    MemoryChangeFactory,
    MemoryFactory,
    NodeFactory,
    NodeResultFactory,
    NodeRunFactory,
    PromptTemplateFactory,
    SessionFactory,
    SummaryFactory,
    TurnFactory,
    WorkflowFactory,
    WorkflowRunFactory,
)
from workflows.models import Node, NodeRun, WorkflowRun

# Script and an event handler; executed, either sets window.__pwned.
HTML_PAYLOAD = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=1">'
# Django template syntax: rendered as a template, it would print the password hash, the
# debug dump and "pwned_by_template" instead of itself.
TEMPLATE_PAYLOAD = '{% debug %}{{ request.user.password }}{{ "pwn"|add:"ed_by_template" }}'

# Shown raw, any of these would be live markup (or a template's output).
FORBIDDEN = {
    HTML_PAYLOAD: ["<script>window.__pwned", "<img src=x", 'onerror="window.__pwned'],
    TEMPLATE_PAYLOAD: ["pwned_by_template"],
}
# The part of each payload without quotes: the same whether shown as text or inside
# JSON (tool arguments, records), where quotes get a backslash.
PROBE = {HTML_PAYLOAD: "<script>window.__pwned=1</script>", TEMPLATE_PAYLOAD: "{% debug %}{{ request.user.password }}"}

# Text columns the generic fill leaves alone: secrets and keys that are not text for people,
# and Django's permission rows (hundreds of them, written by migrations, not by users).
NOT_FILLED = {("auth.User", "password"), ("kinsite.ApiToken", "digest")}
NOT_FILLED_MODELS = {"auth.Permission"}
PLAIN_VALIDATORS = (MaxLengthValidator, ProhibitNullCharactersValidator)


@dataclass
class MarkupWorld:
    payload: str
    user: object
    kin: object
    session: object
    memory: object
    workflow: object
    node: object
    token: object
    run: object  # the consolidation run with the payload in all its texts
    model_call: object = None
    turn: object = None  # the failed chat turn (its Retry and its entries' routes)
    # marker → (model label, field) of the value that carries it
    markers: dict[str, tuple[str, str]] = field(default_factory=dict)
    _counter: itertools.count = field(default_factory=lambda: itertools.count(1))

    @property
    def ids(self) -> dict[str, object]:
        return {"kin": self.kin.pk, "session": self.session.pk, "memory": self.memory.pk,
                "workflow": self.workflow.pk, "node": self.node.client_id, "token": self.token.pk,
                "model_call": self.model_call.pk, "turn": self.turn.pk}

    def text(self, where: tuple[str, str], max_length: int | None = None) -> str:
        marker = f"m{next(self._counter)}"
        self.markers[marker] = where
        value = f"{marker} {self.payload}"
        return value[:max_length] if max_length else value

    def shown(self, marker: str) -> str:
        """How the value of `marker` reads in an escaped page (its quote-free head)."""
        return escape(f"{marker} {PROBE[self.payload]}")

    def markers_of(self, label: str, name: str) -> list[str]:
        return [marker for marker, where in self.markers.items() if where == (label, name)]


def _fillable(model, model_field) -> bool:
    if not isinstance(model_field, (models.CharField, models.TextField)) or model_field.primary_key:
        return False
    if model_field.choices or (model._meta.label, model_field.name) in NOT_FILLED:
        return False
    return all(isinstance(validator, PLAIN_VALIDATORS) for validator in model_field.validators)


def fill_every_text_column(world: MarkupWorld) -> None:
    """Every free-text column of every row of the project's tables gets its own marked payload."""
    for model in project_models():
        if model._meta.label in NOT_FILLED_MODELS:
            continue
        text_fields = [f for f in model._meta.concrete_fields if _fillable(model, f)]
        if not text_fields:
            continue
        for pk in model.objects.values_list("pk", flat=True):
            values = {f.name: world.text((model._meta.label, f.name), f.max_length) for f in text_fields}
            model.objects.filter(pk=pk).update(**values)


def build_markup_world(*, team, user, payload: str) -> MarkupWorld:
    """Rows of every kind the dashboard or the admin shows, for `team`, all text marked."""
    now = timezone.now()
    parent = KinFactory(team=team, name="parent")
    kin = KinFactory(team=team, name="kin", parent=parent, overrides={"note": "x"})
    workflow = WorkflowFactory(team=team, name="workflow")
    session = SessionFactory(kin=kin, title="session", workflow=workflow)
    token, _ = api_token_issue(team=team, name="token", user=user)
    world = MarkupWorld(payload=payload, user=user, kin=kin, session=session, memory=None, workflow=workflow,
                        node=None, token=token, run=None)
    text = world.text

    # A chat turn that called a tool, and a failed one.
    question = Event.objects.create(session=session, content="q", sender="s", external_id="e1")
    turn = TurnFactory(session=session, user_message=question, status=Turn.Status.DONE)
    call = Event.objects.create(
        session=session, kind=Event.Kind.TOOL_CALL, role=Event.Role.ASSISTANT,
        data={"turn": turn.pk, "tool_calls": [{"id": "call_1", "name": text(("Event.data", "tool name")),
                                                "arguments": json.dumps({"content": text(("Event.data",
                                                                                          "tool arguments"))})}]},
    )
    Event.objects.create(session=session, kind=Event.Kind.TOOL_RESULT, role=Event.Role.TOOL, content="r",
                         data={"turn": turn.pk, "tool_call_id": "call_1"})
    reply = Event.objects.create(session=session, role=Event.Role.ASSISTANT, content="a", sender="k",
                                 data={"turn": turn.pk})
    Turn.objects.filter(pk=turn.pk).update(reply=reply, tool_calls=1)
    failed_question = Event.objects.create(session=session, content="q2", sender="s")
    world.turn = TurnFactory(session=session, user_message=failed_question, status=Turn.Status.FAILED, error="e")
    Event.objects.create(session=session, kind=Event.Kind.COMMAND, content="/checkpoint", sender="s",
                         data={"command": "checkpoint"})
    SummaryFactory(session=session, content="summary", first_event=question, last_event=call,
                   first_at=now, last_at=now, message_count=2)

    memory = MemoryFactory(team=team, kin=kin, content="m", subject="s", category=Memory.Category.FACT)
    MemoryFactory(team=team, kin=None, content="shared", category=Memory.Category.KNOWLEDGE)
    MemoryChangeFactory(memory=memory, action=MemoryChange.Action.ADD, actor="a", reason="r",
                        after={"content": text(("MemoryChange.after", "content")), "subject": "s"})
    MemoryChangeFactory(memory=memory, action=MemoryChange.Action.UPDATE, actor="a",
                        before={"content": "old"},
                        after={"content": text(("MemoryChange.after", "content"))})
    world.memory = memory

    IntrospectionRunFactory(
        session=session, trigger=IntrospectionRun.Trigger.CHECKPOINT, status=IntrospectionRun.Status.DONE,
        summary="s", error="e", finished_at=now,
        tool_calls=[{"name": text(("IntrospectionRun.tool_calls", "name")),
                     "arguments": {"content": text(("IntrospectionRun.tool_calls", "arguments"))},
                     "result": text(("IntrospectionRun.tool_calls", "result")),
                     "applied": text(("IntrospectionRun.tool_calls", "applied"))}],
        memories_touched=[{"id": memory.pk, "action": text(("IntrospectionRun.memories_touched", "action"))}],
    )

    FactFactory(kin=kin, statement="f", source=Fact.Source.API)
    run = ConsolidationRunFactory(
        kin=kin, trigger=ConsolidationRun.Trigger.API, status=ConsolidationRun.Status.FAILED, summary_of_changes="s",
        error="e", rendered_prompt="p", raw_answers=[text(("ConsolidationRun.raw_answers", "item"))],
        validation_errors=[text(("ConsolidationRun.validation_errors", "item"))],
        processed_fact_ids=[text(("ConsolidationRun.processed_fact_ids", "item"))], finished_at=now,
    )
    world.run = run
    ExperienceVersionFactory(kin=kin, version=1, markdown="# Master AI Experience\n- first", run=run)
    ExperienceVersionFactory(kin=kin, version=2, markdown="# Master AI Experience\n- second", run=run)
    PromptTemplateFactory(team=team, kin=kin, kind=PromptTemplate.Kind.CONSOLIDATION, name="t", body="b")
    world.model_call = LLMCallFactory(team=team, kin=kin, purpose="chat", provider="p", model="m",
                                      status=LLMCall.Status.ERROR, error="e")

    node = NodeFactory(
        workflow=workflow, client_id="records", type="inline_records", label="records",
        config={"records": [{"note": text(("Node.config", "records"))}]}, status=Node.Status.FAILED,
        records_out=1, results_version=1, error="e", last_run_at=now,
    )
    table = NodeFactory(workflow=workflow, client_id="table", type="table_output", label="table",
                        config={"columns": ["note"]})
    EdgeFactory(workflow=workflow, source=node, target=table, source_handle="out", target_handle="in")
    NodeResultFactory(node=node, version=1, config_fingerprint="f",
                      records=[{"note": text(("NodeResult.records", "value")),
                                text(("NodeResult.records", "key"), 60): "x"}])
    workflow_run = WorkflowRunFactory(workflow=workflow, status=WorkflowRun.Status.FAILED, error="e",
                                      finished_at=now)
    NodeRunFactory(run=workflow_run, node=node, status=NodeRun.Status.FAILED, lineage_narrative="n",
                   error="e")
    world.node = node

    fill_every_text_column(world)
    for row in (kin, session, memory, workflow, node, token, run):
        row.refresh_from_db()
    world.user.refresh_from_db()
    return world
