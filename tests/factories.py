"""factory-boy factories for the rows tests need."""
import factory
from django.contrib.auth import get_user_model

from consolidation.models import ConsolidationRun, ExperienceVersion, Fact
from kinsite.models import Kin, LLMCall, Membership, PromptTemplate, Team
from kinsite.prompt_template_kinds import template_default
from kinsite.tokencount import count_tokens
from memories.models import Memory, MemoryChange
from sessions_app.models import CompactionRun, Event, IntrospectionRun, Session, Summary, Turn
from workflows.models import Edge, Node, NodeResult, NodeRun, Workflow, WorkflowRun


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.PostGenerationMethodCall("set_password", "pass-word-123")

    @factory.post_generation
    def saved(obj, create, extracted, **kwargs):
        if create:
            obj.save()


class TeamFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Team

    name = factory.Sequence(lambda n: f"Team {n}")
    slug = factory.Sequence(lambda n: f"team-{n}")


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    team = factory.SubFactory(TeamFactory)
    user = factory.SubFactory(UserFactory)
    role = Membership.Role.MEMBER


class KinFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Kin

    team = factory.SubFactory(TeamFactory)
    name = factory.Sequence(lambda n: f"Kin {n}")
    role = "Assistant"


class SessionFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Session

    kin = factory.SubFactory(KinFactory)
    title = factory.Sequence(lambda n: f"Session {n}")


class MessageFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Event

    session = factory.SubFactory(SessionFactory)
    kind = Event.Kind.MESSAGE
    role = Event.Role.USER
    sender = "Maria"
    platform = Event.Platform.API
    content = factory.Sequence(lambda n: f"message number {n}")
    token_count = factory.LazyAttribute(lambda o: count_tokens(o.content))



class ToolCallFactory(factory.django.DjangoModelFactory):
    """The kin's tool call event: no text, the calls are in data."""

    class Meta:
        model = Event

    session = factory.SubFactory(SessionFactory)
    kind = Event.Kind.TOOL_CALL
    role = Event.Role.ASSISTANT
    data = factory.LazyFunction(lambda: {"tool_calls": [{"id": "call_1", "name": "memory_recall", "arguments": "{}"}]})


class ToolResultFactory(factory.django.DjangoModelFactory):
    """A tool's answer to a call (data names the call)."""

    class Meta:
        model = Event

    session = factory.SubFactory(SessionFactory)
    kind = Event.Kind.TOOL_RESULT
    role = Event.Role.TOOL
    content = "[]"
    token_count = factory.LazyAttribute(lambda o: count_tokens(o.content))
    data = factory.LazyFunction(lambda: {"tool_call_id": "call_1"})

class MemoryFactory(factory.django.DjangoModelFactory):
    """A memory row written directly (no change row, no duplicate check): use
    memories.services when the test is about writes."""

    class Meta:
        model = Memory

    kin = factory.SubFactory(KinFactory)
    team = factory.LazyAttribute(lambda o: o.kin.team if o.kin is not None else TeamFactory())
    category = Memory.Category.FACT
    content = factory.Sequence(lambda n: f"memory number {n}")
    importance = 5


class MemoryChangeFactory(factory.django.DjangoModelFactory):
    """A change row written directly; memories.services writes them with the memory."""

    class Meta:
        model = MemoryChange

    memory = factory.SubFactory(MemoryFactory)
    action = MemoryChange.Action.ADD
    after = factory.LazyAttribute(lambda o: {"content": o.memory.content})
    actor = "test"


class TurnFactory(factory.django.DjangoModelFactory):
    """A turn row (pending unless told), its user message in the same session."""

    class Meta:
        model = Turn

    session = factory.SubFactory(SessionFactory)
    user_message = factory.SubFactory(MessageFactory, session=factory.SelfAttribute("..session"))


class SummaryFactory(factory.django.DjangoModelFactory):
    """A compaction summary of one message of its session, unless told which events it covers."""

    class Meta:
        model = Summary

    session = factory.SubFactory(SessionFactory)
    content = factory.Sequence(lambda n: f"summary number {n}")
    first_event = factory.SubFactory(MessageFactory, session=factory.SelfAttribute("..session"))
    last_event = factory.SelfAttribute("first_event")
    first_at = factory.LazyAttribute(lambda o: o.first_event.created_at)
    last_at = factory.LazyAttribute(lambda o: o.last_event.created_at)
    message_count = 1


class IntrospectionRunFactory(factory.django.DjangoModelFactory):
    """An introspection audit row (pending unless told); the service writes real ones."""

    class Meta:
        model = IntrospectionRun

    session = factory.SubFactory(SessionFactory)
    trigger = IntrospectionRun.Trigger.MANUAL


class CompactionRunFactory(factory.django.DjangoModelFactory):
    """A requested compaction's row (pending unless told); sessions_app.compaction writes real ones."""

    class Meta:
        model = CompactionRun

    session = factory.SubFactory(SessionFactory)


class FactFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Fact

    kin = factory.SubFactory(KinFactory)
    statement = factory.Sequence(lambda n: f"fact number {n}")
    source = Fact.Source.API


class ConsolidationRunFactory(factory.django.DjangoModelFactory):
    """A consolidation audit row (pending unless told); the service writes real ones."""

    class Meta:
        model = ConsolidationRun

    kin = factory.SubFactory(KinFactory)
    trigger = ConsolidationRun.Trigger.API


class ExperienceVersionFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ExperienceVersion

    kin = factory.SubFactory(KinFactory)
    version = factory.Sequence(lambda n: n + 1)
    markdown = factory.Sequence(lambda n: f"# Master AI Experience\n- learning number {n}")


class PromptTemplateFactory(factory.django.DjangoModelFactory):
    """The team's template of `kind` (the kin's when kin is given), the built-in body unless told."""

    class Meta:
        model = PromptTemplate

    team = factory.LazyAttribute(lambda o: o.kin.team if o.kin is not None else TeamFactory())
    kin = None
    kind = PromptTemplate.Kind.CONSOLIDATION
    name = factory.Sequence(lambda n: f"Template {n}")
    body = factory.LazyAttribute(lambda o: template_default(o.kind))


class LLMCallFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = LLMCall

    team = factory.LazyAttribute(lambda o: o.kin.team if o.kin is not None else TeamFactory())
    kin = None
    purpose = "kin_turn"
    provider = "scripted"
    model = "m"
    status = LLMCall.Status.OK


class WorkflowFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Workflow

    team = factory.SubFactory(TeamFactory)
    name = factory.Sequence(lambda n: f"Workflow {n}")


class NodeFactory(factory.django.DjangoModelFactory):
    """A node written directly (no config check): workflows.services when the test is about edits."""

    class Meta:
        model = Node

    workflow = factory.SubFactory(WorkflowFactory)
    client_id = factory.Sequence(lambda n: f"node-{n}")
    type = "inline_records"
    label = factory.SelfAttribute("client_id")


class EdgeFactory(factory.django.DjangoModelFactory):
    """A data edge between two nodes of its workflow."""

    class Meta:
        model = Edge

    workflow = factory.SubFactory(WorkflowFactory)
    source = factory.SubFactory(NodeFactory, workflow=factory.SelfAttribute("..workflow"))
    target = factory.SubFactory(NodeFactory, workflow=factory.SelfAttribute("..workflow"), type="table_output")


class NodeResultFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = NodeResult

    node = factory.SubFactory(NodeFactory)
    version = factory.Sequence(lambda n: n + 1)
    records = factory.LazyFunction(list)
    config_fingerprint = ""


class WorkflowRunFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = WorkflowRun

    workflow = factory.SubFactory(WorkflowFactory)


class NodeRunFactory(factory.django.DjangoModelFactory):
    """A node's part of a run, the node in the run's workflow."""

    class Meta:
        model = NodeRun

    run = factory.SubFactory(WorkflowRunFactory)
    node = factory.SubFactory(NodeFactory, workflow=factory.SelfAttribute("..run.workflow"))
