"""Kins' sessions and each session's event store. The Kin model is kinsite's, so every app
may depend on it."""
from django.db import models
from django.db.models import Q
from django.utils import timezone

from kinsite.models import Job, job_status_field, job_sweep_indexes


class Session(models.Model):
    kin = models.ForeignKey("kinsite.Kin", on_delete=models.CASCADE, related_name="sessions")
    title = models.CharField(max_length=200, blank=True)
    description = models.TextField(blank=True)
    working_memory = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    last_activity_at = models.DateTimeField(default=timezone.now)
    # A session attached to a workflow gets CURRENT CANVAS in its prompt.
    workflow = models.ForeignKey(
        "workflows.Workflow", null=True, blank=True, on_delete=models.SET_NULL, related_name="sessions"
    )
    # True while the session has events introspection has not seen yet; the idle
    # scan reads only these rows (partial index), whatever the number of sessions.
    introspection_pending = models.BooleanField(default=False)
    # Completed turns since the last introspection (the turn_interval trigger).
    turns_since_introspection = models.PositiveIntegerField(default=0)
    # Set: archived, read-only (turn_post and messages_import refuse: 409 session_archived).
    archived_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(
                fields=["last_activity_at"],
                condition=Q(introspection_pending=True),
                name="session_introspection_due",
            )
        ]

    def __str__(self):
        return self.title or f"Session {self.pk}"


# The kinds of event a prompt's history (and so compaction) is made of; the rest is
# bookkeeping. One tuple for the readers and the index event_history_tokens, whose
# condition must match their filter.
HISTORY_KINDS = ("message", "tool_call", "tool_result")


class Event(models.Model):
    """One entry in a session's event store. Messages are events of kind
    `message`; nothing here is ever deleted (compaction only marks ranges)."""

    class Kind(models.TextChoices):
        MESSAGE = "message"
        TOOL_CALL = "tool_call", "Tool call"
        TOOL_RESULT = "tool_result", "Tool result"
        COMMAND = "command"
        INTROSPECTION_START = "introspection_start", "Introspection start"
        INTROSPECTION_END = "introspection_end", "Introspection end"
        COMPACTION = "compaction"

    class Role(models.TextChoices):
        USER = "user"
        ASSISTANT = "assistant"
        SYSTEM = "system"
        TOOL = "tool"

    class Platform(models.TextChoices):
        WEB = "web"
        TELEGRAM = "telegram"
        DISCORD = "discord"
        SLACK = "slack"
        WHATSAPP = "whatsapp", "WhatsApp"
        API = "api", "API"

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=24, choices=Kind.choices, default=Kind.MESSAGE)
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.USER)
    content = models.TextField(blank=True)
    sender = models.CharField(max_length=200, blank=True)
    platform = models.CharField(max_length=16, choices=Platform.choices, default=Platform.API)
    # The client's own id for the message; unique per session, so imports are idempotent.
    # NULL, not "": the per-session unique constraint must not join messages that have none.
    external_id = models.CharField("external ID", max_length=200, null=True, blank=True)  # noqa: DJ001
    # tiktoken count of `content`, computed when the row is written.
    token_count = models.PositiveIntegerField(default=0)
    # Kind-specific structure: tool name and arguments, command name, covered ranges…
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [
            models.Index(fields=["session", "created_at", "id"], name="event_session_time"),
            # The prompt's history cut (prompt.reads._history_entries) reads token counts
            # from the index alone, no table rows.
            models.Index(
                fields=["session", "created_at", "id", "token_count"],
                condition=Q(kind__in=HISTORY_KINDS),
                name="event_history_tokens",
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["session", "external_id"],
                condition=Q(external_id__isnull=False),
                name="event_unique_external_id",
            )
        ]

    def __str__(self):
        return f"{self.kind} #{self.pk}"


class MessageCount(models.Model):
    """A session's message count and newest message time per (role, sender, platform), so the
    prompt reads a few rows instead of every message. Kept by database triggers (migration
    0008), so every write or removal (a turn, an import's skipped duplicates, a cascade)
    counts exactly once; Python never writes these rows."""

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="message_counts")
    role = models.CharField(max_length=10, choices=Event.Role.choices)
    sender = models.CharField(max_length=200, blank=True)
    platform = models.CharField(max_length=16, choices=Event.Platform.choices)
    message_count = models.PositiveIntegerField(default=0)
    last_at = models.DateTimeField()

    class Meta:
        ordering = ["session", "-last_at"]
        constraints = [
            models.UniqueConstraint(fields=["session", "role", "sender", "platform"], name="message_count_unique")
        ]

    def __str__(self):
        return f"{self.message_count} {self.role} messages of {self.sender or 'nobody'} in session {self.session_id}"


class Turn(Job):
    """One chat turn: the user's message in, the kin's reply out, and what happened
    between (status, error, tool calls, tokens). Async posts are polled through it."""

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="turns")
    user_message = models.ForeignKey(Event, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    reply = models.ForeignKey(Event, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    is_async = models.BooleanField("async", default=False)
    tool_calls = models.PositiveSmallIntegerField(default=0)
    prompt_tokens = models.PositiveIntegerField(default=0)
    tokens_in = models.PositiveIntegerField(default=0)
    tokens_out = models.PositiveIntegerField(default=0)
    # Starts: a sync turn once when posted, and once more at each claim by a session lock
    # holder; after TURN_MAX_ATTEMPTS (turns.jobs) it is failed instead.
    attempts = models.PositiveSmallIntegerField(default=0)
    # Times our own service (Redis, the broker, the session lock) stopped the turn and put it
    # back to pending; past settings.TURN_AUTO_RETRIES it is failed. A model failure is not
    # counted: it fails the turn at once.
    auto_retries = models.PositiveSmallIntegerField(default=0)
    retry_reason = models.TextField(blank=True)  # why it was last put back, kept once it is done
    retried_at = models.DateTimeField(null=True, blank=True)  # when it was last put back

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [
            models.Index(fields=["session", "status"], name="turn_session_status"),
            *job_sweep_indexes("turn"),
            # The activity pages read turns newest first (sessions_app.activity).
            models.Index(fields=["created_at", "id"], name="turn_newest"),
        ]

    def __str__(self):
        return f"Turn {self.pk} ({self.status})"


class Summary(models.Model):
    """A compaction summary of the session from first_event to last_event (inclusive). The
    newest one replaces the messages it covers in the prompt; the raw messages stay."""

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="summaries")
    content = models.TextField()
    first_event = models.ForeignKey(Event, on_delete=models.PROTECT, related_name="+")
    last_event = models.ForeignKey(Event, on_delete=models.PROTECT, related_name="+")
    first_at = models.DateTimeField()
    last_at = models.DateTimeField()
    message_count = models.PositiveIntegerField()
    token_count = models.PositiveIntegerField(default=0)
    # The summary this one merged (compactions chain).
    previous = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # The newest event id the compaction had read: it covers the history up to last_event with
    # ids up to this; an older-dated event with a newer id was imported later and the next
    # compaction folds it in. Null (a row written by hand): last_event_id.
    seen_through_id = models.BigIntegerField("seen through ID", null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
        verbose_name_plural = "summaries"
        indexes = [models.Index(fields=["session", "-created_at"], name="summary_session_newest")]

    def __str__(self):
        return f"Summary {self.pk} of session {self.session_id}"


class CompactionRun(Job):
    """One requested compaction of a session (sessions_app.compaction): the row its task
    claims, so a lost task is sent again and a redelivered one does nothing (kinsite.jobs)."""

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        DONE = "done"  # summary: the one it wrote; none when there was nothing to do
        FAILED = "failed"
        SKIPPED = "skipped"  # could not run (no model configured): error says why, nothing written

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="compaction_runs")
    status = job_status_field(Status)
    summary = models.ForeignKey(Summary, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # Starts: one per claim (a Celery retry, a rerun after its worker stopped); see COMPACTION_MAX_ATTEMPTS.
    attempts = models.PositiveSmallIntegerField(default=0)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            *job_sweep_indexes("compaction_run"),
            # The activity pages read runs newest first (sessions_app.activity).
            models.Index(fields=["created_at", "id"], name="compaction_run_newest"),
        ]

    def __str__(self):
        return f"Compaction {self.pk} of session {self.session_id} ({self.status})"


class IntrospectionRun(Job):
    """One introspection of a session: what triggered it, which events it read,
    what it did and how it ended. An audit row: written by the service only."""

    class Trigger(models.TextChoices):
        CHECKPOINT = "checkpoint"
        NEW = "new"
        TURNS = "turns"
        IDLE = "idle"
        MANUAL = "manual"

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"
        SKIPPED = "skipped"  # nothing new since the cursor

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="introspection_runs")
    trigger = models.CharField(max_length=12, choices=Trigger.choices)
    status = job_status_field(Status)
    start_event = models.ForeignKey(Event, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    end_event = models.ForeignKey(Event, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # The events read: after the previous cursor up to and including this one.
    first_event_id = models.BigIntegerField("first event ID", null=True, blank=True)
    last_event_id = models.BigIntegerField("last event ID", null=True, blank=True)
    event_count = models.PositiveIntegerField(default=0)
    # [{"name", "arguments", "result"}] in call order.
    tool_calls = models.JSONField(default=list, blank=True)
    memories_touched = models.JSONField(default=list, blank=True)
    summary = models.TextField(blank=True)
    template_source = models.CharField(max_length=10, blank=True)
    tokens_in = models.PositiveIntegerField(default=0)
    tokens_out = models.PositiveIntegerField(default=0)
    duration_ms = models.PositiveIntegerField("duration (ms)", default=0)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            # The stalled-run sweep reads running runs through the constraint's partial unique index.
            *job_sweep_indexes("introspection_run", running=False),
            # The activity pages read runs newest first (sessions_app.activity).
            models.Index(fields=["created_at", "id"], name="introspection_run_newest"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["session"], condition=Q(status="running"), name="introspection_one_running_per_session"
            )
        ]

    def __str__(self):
        return f"Introspection {self.pk} of session {self.session_id} ({self.status})"
