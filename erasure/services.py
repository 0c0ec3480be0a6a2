"""Erasing a person: every copy of their text a team's kins hold, found, listed (a dry run) or
removed in one transaction, with a receipt (erasure.models.Erasure) that stays. Which text is
about them is erasure.matching's; what each store loses (events and the summaries covering
them, memories with their vectors and change log, facts, experience versions, lines redacted
elsewhere) is described in docs/deployment.md, "Erasing a person".

While a job runs on what would be erased (a turn, an introspection or compaction of an
affected session, a consolidation of an affected kin), the erasure is refused (409): the job
read the text before and would write what it derived after. Later jobs read what is left.
"""
from __future__ import annotations

import json
import logging
from collections import defaultdict
from dataclasses import dataclass, field

from django.db import transaction
from django.db.models import Q, TextField
from django.db.models.functions import Cast
from django.utils import timezone

from consolidation.models import ConsolidationRun, ExperienceVersion, Fact
from consolidation.prompt import word_count
from erasure.matching import Person, excerpt
from erasure.models import Erasure
from kinsite.errors import Conflict
from kinsite.models import Kin, LLMCall, Team
from memories.models import Memory, MemoryChange
from sessions_app.models import CompactionRun, Event, IntrospectionRun, Session, Summary, Turn
from sessions_app.turns.events import turn_events_forget

logger = logging.getLogger(__name__)

# The stores an erasure reaches, in the order a receipt lists them.
STORES = (
    "messages", "summaries", "memories", "memory_changes", "facts", "experience_versions", "sessions",
    "turns", "introspection_runs", "compaction_runs", "consolidation_runs", "llm_calls",
)
DELETE, REDACT, NEW_VERSION, FAIL = "delete", "redact", "new version", "fail"


class ErasureBusy(Conflict):
    code = "erasure_busy"


@dataclass(frozen=True)
class Finding:
    store: str
    id: int
    action: str
    excerpt: str


@dataclass
class ErasurePlan:
    team: Team
    kin: Kin | None
    person: Person
    findings: list[Finding] = field(default_factory=list)
    # What applying needs besides the findings: the rows to change, by store.
    rows: dict[str, list] = field(default_factory=lambda: defaultdict(list))
    busy: list[str] = field(default_factory=list)

    def add(self, store: str, row, action: str, text: str) -> None:
        self.findings.append(Finding(store=store, id=row.pk, action=action, excerpt=excerpt(text)))
        self.rows[store].append(row)

    @property
    def counts(self) -> dict[str, int]:
        counts = dict.fromkeys(STORES, 0)
        for finding in self.findings:
            counts[finding.store] += 1
        return counts

    @property
    def items(self) -> dict[str, list[int]]:
        items = {store: [] for store in STORES}
        for finding in self.findings:
            items[finding.store].append(finding.id)
        return items


def _text_filter(person: Person, *fields: str, json_fields: tuple[str, ...] = ()) -> Q:
    """A superset of the rows naming the person, for the database to find: the names as
    written, in any case (the exact check, erasure.matching, runs on what it returns). JSON
    is searched as its text; SQLite stores non-ASCII characters there as \\u escapes."""
    q = Q()
    for name in person.names:
        for name_field in fields:
            q |= Q(**{f"{name_field}__icontains": name})
        for json_field in json_fields:
            q |= Q(**{f"{json_field}_text__icontains": name})
            escaped = _json_escaped(name)
            if escaped != name:
                q |= Q(**{f"{json_field}_text__icontains": escaped})
    return q


def _json_escaped(name: str) -> str:
    return json.dumps(name)[1:-1]


def _as_text(*json_fields: str) -> dict:
    return {f"{name}_text": Cast(name, TextField()) for name in json_fields}


def erasure_plan(*, team: Team, kin: Kin | None, person: Person) -> ErasurePlan:
    """What erasing `person` from `kin` (None: every kin of the team, and the team's shared
    memories) would delete or redact, store by store. Reads only."""
    plan = ErasurePlan(team=team, kin=kin, person=person)
    kins = Kin.objects.filter(team=team) if kin is None else Kin.objects.filter(pk=kin.pk)
    sessions = Session.objects.filter(kin__in=kins)

    # Events, and the summaries that cover them.
    found = _text_filter(person, "content", "sender", json_fields=("data",))
    if person.sender.strip():
        found |= Q(sender__iexact=person.sender.strip())
    events = (Event.objects.filter(session__in=sessions).annotate(**_as_text("data")).filter(found)
              .only("id", "session_id", "kind", "sender", "content", "data", "created_at").order_by("id"))
    erased_events: dict[int, list[Event]] = defaultdict(list)  # session id -> its erased events
    for event in events:
        if (person.is_sender(event.sender) or person.mentioned_in(event.content)
                or person.mentioned_in(event.sender) or person.mentioned_in_value(event.data)):
            plan.add("messages", event, DELETE, f"{event.sender}: {event.content}" if event.sender else event.content)
            erased_events[event.session_id].append(event)
    # A turn whose message goes takes what it derived from it: its reply and its tool steps.
    lost_turns = list(Turn.objects.filter(session__in=sessions, user_message_id__in=[
        finding.id for finding in plan.findings]).values_list("pk", "reply_id"))
    derived = Event.objects.filter(
        Q(pk__in=[reply for _turn, reply in lost_turns if reply])
        | Q(session__in=sessions, kind__in=(Event.Kind.TOOL_CALL, Event.Kind.TOOL_RESULT),
            data__turn__in=[turn for turn, _reply in lost_turns])
    ).exclude(pk__in=[finding.id for finding in plan.findings]).only("id", "session_id", "sender", "content",
                                                                     "created_at")
    for event in derived.order_by("id"):
        plan.add("messages", event, DELETE, f"{event.sender}: {event.content}" if event.sender else event.content)
        erased_events[event.session_id].append(event)
    erased_event_ids = {event.pk for events in erased_events.values() for event in events}
    summaries = Summary.objects.filter(session__in=sessions).filter(
        Q(session_id__in=list(erased_events)) | _text_filter(person, "content"))
    for summary in summaries.order_by("id"):
        # Covered: within its time range (a message imported into it later counts too, the
        # next compaction would fold it in) or its range of ids.
        through = max(summary.seen_through_id or 0, summary.last_event_id)
        covers = any(summary.first_at <= event.created_at <= summary.last_at
                     or summary.first_event_id <= event.pk <= through
                     for event in erased_events.get(summary.session_id, ()))
        if covers or person.mentioned_in(summary.content):
            plan.add("summaries", summary, DELETE, summary.content)

    # Memories and their change log; facts.
    memories = Memory.objects.filter(team=team) if kin is None else Memory.objects.filter(kin=kin)
    event_refs = [f"event:{pk}" for pk in sorted(erased_event_ids)]
    deleted_memories = set()
    for memory in memories.filter(_text_filter(person, "content", "subject") | Q(source_ref__in=event_refs)):
        if (person.mentioned_in(memory.content) or person.mentioned_in(memory.subject)
                or memory.source_ref in event_refs):
            plan.add("memories", memory, DELETE, memory.content)
            deleted_memories.add(memory.pk)
    changes = (MemoryChange.objects.filter(memory__in=memories).exclude(memory_id__in=deleted_memories)
               .annotate(**_as_text("before", "after"))
               .filter(_text_filter(person, "reason", json_fields=("before", "after"))))
    for change in changes.order_by("id"):
        if (person.mentioned_in(change.reason) or person.mentioned_in_value(change.before)
                or person.mentioned_in_value(change.after)):
            plan.add("memory_changes", change, REDACT, change.reason or str(change.after))
    facts = Fact.objects.filter(kin__in=kins).filter(
        _text_filter(person, "statement") | Q(source_ref__in=event_refs) | Q(memory_id__in=deleted_memories))
    for fact in facts.order_by("id"):
        if (person.mentioned_in(fact.statement) or fact.source_ref in event_refs
                or fact.memory_id in deleted_memories):
            plan.add("facts", fact, DELETE, fact.statement)

    # Experience: a new version where the current one names them; every version redacted.
    current = {}
    for version in ExperienceVersion.objects.filter(kin__in=kins).order_by("kin_id", "-version"):
        current.setdefault(version.kin_id, version.pk)
    for version in (ExperienceVersion.objects.filter(kin__in=kins).filter(_text_filter(person, "markdown"))
                    .order_by("kin_id", "version")):
        if person.mentioned_in(version.markdown):
            action = NEW_VERSION if current[version.kin_id] == version.pk else REDACT
            plan.add("experience_versions", version, action, version.markdown)

    # Redacted lines elsewhere.
    for session in sessions.filter(_text_filter(person, "title", "description", "working_memory")).order_by("id"):
        if any(person.mentioned_in(text) for text in (session.title, session.description, session.working_memory)):
            plan.add("sessions", session, REDACT, session.working_memory or session.description or session.title)
    turns = Turn.objects.filter(session__in=sessions).filter(
        Q(user_message_id__in=erased_event_ids) | Q(reply_id__in=erased_event_ids)
        | _text_filter(person, "error", "retry_reason"))
    for turn in turns.order_by("id"):
        lost_message = turn.user_message_id in erased_event_ids
        lost = lost_message or turn.reply_id in erased_event_ids
        if not lost and not (person.mentioned_in(turn.error) or person.mentioned_in(turn.retry_reason)):
            continue
        if turn.status == Turn.Status.RUNNING and lost:
            plan.busy.append(f"turn {turn.pk}")
        action = FAIL if lost_message and turn.status == Turn.Status.PENDING else REDACT
        plan.add("turns", turn, action, turn.error or f"turn {turn.pk}")
    runs = (IntrospectionRun.objects.filter(session__in=sessions).annotate(**_as_text("tool_calls"))
            .filter(_text_filter(person, "summary", "error", json_fields=("tool_calls",))))
    for run in runs.order_by("id"):
        if (any(person.mentioned_in(text) for text in (run.summary, run.error))
                or person.mentioned_in_value(run.tool_calls)):
            plan.add("introspection_runs", run, REDACT, run.summary or run.error)
    compactions = CompactionRun.objects.filter(session__in=sessions).filter(_text_filter(person, "error"))
    for run in compactions.order_by("id"):
        if person.mentioned_in(run.error):
            plan.add("compaction_runs", run, REDACT, run.error)
    runs = (ConsolidationRun.objects.filter(kin__in=kins)
            .annotate(**_as_text("raw_answers", "validation_errors"))
            .filter(_text_filter(person, "rendered_prompt", "summary_of_changes", "error",
                                 json_fields=("raw_answers", "validation_errors"))))
    for run in runs.order_by("id"):
        if (any(person.mentioned_in(text) for text in (run.rendered_prompt, run.summary_of_changes, run.error))
                or person.mentioned_in_value(run.raw_answers) or person.mentioned_in_value(run.validation_errors)):
            plan.add("consolidation_runs", run, REDACT, run.summary_of_changes or run.error or "rendered prompt")
    calls = LLMCall.objects.filter(team=team) if kin is None else LLMCall.objects.filter(kin=kin)
    for call in calls.filter(_text_filter(person, "error")).order_by("id"):
        if person.mentioned_in(call.error):
            plan.add("llm_calls", call, REDACT, call.error)

    # Jobs running on what would go (see the module's docstring).
    touched_sessions = set(erased_events) | {row.pk for row in plan.rows["sessions"]}
    for run in IntrospectionRun.objects.filter(session_id__in=touched_sessions, status=IntrospectionRun.Status.RUNNING):
        plan.busy.append(f"introspection run {run.pk}")
    for run in CompactionRun.objects.filter(session_id__in=touched_sessions, status=CompactionRun.Status.RUNNING):
        plan.busy.append(f"compaction run {run.pk}")
    touched_kins = ({fact.kin_id for fact in plan.rows["facts"]}
                    | {version.kin_id for version in plan.rows["experience_versions"]})
    for run in ConsolidationRun.objects.filter(kin_id__in=touched_kins, status=ConsolidationRun.Status.RUNNING):
        plan.busy.append(f"consolidation run {run.pk}")
    return plan


@transaction.atomic
def erasure_run(*, team: Team, kin: Kin | None, person: Person, actor: str, actor_user=None) -> Erasure:
    """Erase `person` (see the module's docstring) and keep the receipt. All or nothing."""
    # Concurrent erasures of one team queue behind each other (the team row's lock), so the
    # second finds what the first left.
    Team.objects.select_for_update().filter(pk=team.pk).first()
    plan = erasure_plan(team=team, kin=kin, person=person)
    if plan.busy:
        raise ErasureBusy(
            "Jobs are running on what this erasure would remove; they would write back what they read. "
            "Try again when they have finished (usually within a minute).",
            details={"running": plan.busy},
        )
    rows = plan.rows
    # Summaries first: they hold their covered events (PROTECT).
    Summary.objects.filter(pk__in=[row.pk for row in rows["summaries"]]).delete()
    erased_event_ids = {row.pk for row in rows["messages"]}
    for turn in rows["turns"]:
        # Field by field, not save(): a worker may have claimed a turn since the plan read it.
        Turn.objects.filter(pk=turn.pk).update(error=person.lines_redacted(turn.error),
                                               retry_reason=person.lines_redacted(turn.retry_reason))
        if turn.user_message_id in erased_event_ids:
            Turn.objects.filter(pk=turn.pk, status=Turn.Status.PENDING).update(
                status=Turn.Status.FAILED, finished_at=timezone.now(), error="Its message was erased before it ran.")
    streams = list(rows["turns"])
    Event.objects.filter(pk__in=erased_event_ids).delete()
    Memory.objects.filter(pk__in=[row.pk for row in rows["memories"]]).delete()
    for change in rows["memory_changes"]:
        MemoryChange.objects.filter(pk=change.pk).update(
            reason=person.lines_redacted(change.reason),
            before=person.value_redacted(change.before),
            after=person.value_redacted(change.after),
        )
    Fact.objects.filter(pk__in=[row.pk for row in rows["facts"]]).delete()
    new_versions = []
    replaced = {f.id for f in plan.findings if f.store == "experience_versions" and f.action == NEW_VERSION}
    for version in rows["experience_versions"]:
        if version.pk in replaced:
            markdown = person.lines_without(version.markdown)
            new_versions.append(ExperienceVersion.objects.create(
                kin_id=version.kin_id, version=version.version + 1, markdown=markdown,
                word_count=word_count(markdown),
            ))
        ExperienceVersion.objects.filter(pk=version.pk).update(markdown=person.lines_redacted(version.markdown))
    for session in rows["sessions"]:
        Session.objects.filter(pk=session.pk).update(
            title=person.lines_redacted(session.title)[:200],
            description=person.lines_redacted(session.description),
            working_memory=person.lines_redacted(session.working_memory),
        )
    for run in rows["introspection_runs"]:
        IntrospectionRun.objects.filter(pk=run.pk).update(
            summary=person.lines_redacted(run.summary), error=person.lines_redacted(run.error),
            tool_calls=person.value_redacted(run.tool_calls),
        )
    for run in rows["compaction_runs"]:
        CompactionRun.objects.filter(pk=run.pk).update(error=person.lines_redacted(run.error))
    for run in rows["consolidation_runs"]:
        ConsolidationRun.objects.filter(pk=run.pk).update(
            rendered_prompt=person.lines_redacted(run.rendered_prompt),
            summary_of_changes=person.lines_redacted(run.summary_of_changes),
            error=person.lines_redacted(run.error),
            raw_answers=person.value_redacted(run.raw_answers),
            validation_errors=person.value_redacted(run.validation_errors),
        )
    for call in rows["llm_calls"]:
        LLMCall.objects.filter(pk=call.pk).update(error=person.lines_redacted(call.error))

    items = plan.items
    items["experience_new_versions"] = [version.pk for version in new_versions]
    receipt = Erasure.objects.create(
        team=team, kin=kin, kin_label=f"#{kin.pk} {kin.name}" if kin else "", sender=person.sender.strip(),
        subject=person.subject.strip(), counts=plan.counts, items=items, actor=actor, actor_user=actor_user,
    )
    transaction.on_commit(lambda: _forget_streams(streams))
    logger.info("Erasure %s of team %s: %s", receipt.pk, team.pk, receipt.counts)
    return receipt


def _forget_streams(turns: list[Turn]) -> None:
    for turn in turns:
        turn_events_forget(turn)
