"""Serializers for kins, sessions, messages, imports, history search, chat turns and the prompt preview."""
import datetime

from django.conf import settings
from django.utils import timezone
from rest_framework import serializers

from kinsite.api.representation import datetime_value
from kinsite.models import Kin
from kinsite.prompt_safety import one_line_problem
from sessions_app.introspection.tools import DESCRIPTION_MAX_CHARS
from sessions_app.models import Event, IntrospectionRun, Session, Summary, Turn
from sessions_app.overrides import HISTORY_TOKEN_BUDGET_RANGE, OVERRIDE_RULES, OVERRIDES_MAX_BYTES, overrides_errors
from workflows.models import Workflow

# Identity texts go into every prompt of the kin: generous, but bounded (the model's
# TextFields are not).
KIN_TEXT_MAX_CHARS = 10_000
SENDER_MAX_CHARS = Event._meta.get_field("sender").max_length
OVERRIDES_HELP = (
    f"Per-kin settings, by section ({', '.join(OVERRIDE_RULES)}), "
    'e.g. {"introspection": {"turn_interval": 3}}. '
    f"At most {OVERRIDES_MAX_BYTES:,} bytes as compact JSON; an unknown section is refused, except one the kin "
    "already holds, kept with its stored value."
)


def _one_line(value: str) -> None:
    problem = one_line_problem(value)
    if problem:
        raise serializers.ValidationError(problem)


def imported_time_problem(value: datetime.datetime) -> str | None:
    """Why an imported time cannot be stored, or None: imports carry what already happened, so
    a time further ahead than IMPORT_MAX_FUTURE_SECONDS (clock skew) is a broken source, and it
    would sort after every message to come. Also the kin import's rule (transfer.format)."""
    limit = timezone.now() + datetime.timedelta(seconds=settings.IMPORT_MAX_FUTURE_SECONDS)
    if value > limit:
        return (f"must not be in the future (at most {settings.IMPORT_MAX_FUTURE_SECONDS} seconds ahead of "
                f"this server's clock, {timezone.now().isoformat(timespec='seconds')})")
    return None


def imported_sender_problem(value: str) -> str | None:
    """Why a sender given with an imported message cannot be stored, or None: one line, and not
    only whitespace. Also the kin import's rule (transfer.format), where "" is how a message
    without a sender is stored and exported."""
    if value and not value.strip():
        return "must not be blank: name the sender, or leave the field out"
    return one_line_problem(value)


class KinSerializer(serializers.ModelSerializer):
    """Also the dashboard's kin form's rules (sessions_app.forms runs it)."""

    parent = serializers.PrimaryKeyRelatedField(queryset=Kin.objects.none(), required=False, allow_null=True)
    history_token_budget = serializers.IntegerField(
        required=False, allow_null=True,
        min_value=HISTORY_TOKEN_BUDGET_RANGE.low, max_value=HISTORY_TOKEN_BUDGET_RANGE.high,
    )
    character = serializers.CharField(required=False, allow_blank=True, max_length=KIN_TEXT_MAX_CHARS)
    expertise = serializers.CharField(required=False, allow_blank=True, max_length=KIN_TEXT_MAX_CHARS)
    spawn_reason = serializers.CharField(required=False, allow_blank=True, max_length=KIN_TEXT_MAX_CHARS)

    class Meta:
        model = Kin
        fields = [
            "id",
            "name",
            "role",
            "character",
            "expertise",
            "model",
            "history_token_budget",
            "parent",
            "spawn_reason",
            "overrides",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["id", "created_at", "updated_at"]
        # One line each: a line break in a name could start a line of its own where a person
        # reads it (the prompt collapses them anyway, but the stored text should not need it).
        extra_kwargs = {"name": {"validators": [_one_line]}, "role": {"validators": [_one_line]},
                        "model": {"validators": [_one_line]}, "overrides": {"help_text": OVERRIDES_HELP}}

    def __init__(self, *args, team=None, **kwargs):
        super().__init__(*args, **kwargs)
        if team is not None:
            # A parent must be a kin of the caller's team; others look like unknown ids.
            self.fields["parent"].queryset = Kin.objects.filter(team=team)

    def validate_name(self, value):
        if not value.strip():
            raise serializers.ValidationError("Name must not be blank.")
        return value.strip()

    def validate_overrides(self, value):
        errors = overrides_errors(value, stored=self.instance.overrides if self.instance is not None else None)
        if errors:
            raise serializers.ValidationError(errors)
        return value

    def validate(self, attrs):
        parent = attrs.get("parent")
        if parent is not None and self.instance is not None:
            # Walk up from the new parent; meeting this kin means the change would close a loop.
            ancestor, seen = parent, set()
            while ancestor is not None and ancestor.pk not in seen:
                if ancestor.pk == self.instance.pk:
                    raise serializers.ValidationError({"parent": "A kin cannot be its own parent or ancestor."})
                seen.add(ancestor.pk)
                ancestor = ancestor.parent
        return attrs


class SessionSerializer(serializers.ModelSerializer):
    """Also the dashboard's session forms' rules (sessions_app.forms runs it). `archived_at`:
    set while the session is archived (posting to it answers 409 session_archived)."""

    kin = serializers.PrimaryKeyRelatedField(read_only=True)
    message_count = serializers.SerializerMethodField()
    summary = serializers.SerializerMethodField(
        help_text="The newest compaction summary (what the prompt carries instead of the oldest messages); "
                  "null until the session is first compacted.",
    )
    archived = serializers.SerializerMethodField(help_text="True while archived: readable, nothing can be posted.")
    workflow = serializers.PrimaryKeyRelatedField(
        queryset=Workflow.objects.none(), required=False, allow_null=True,
        help_text="A workflow of the team: each turn's prompt then carries its CURRENT CANVAS.",
    )

    class Meta:
        model = Session
        fields = [
            "id",
            "kin",
            "title",
            "description",
            "working_memory",
            "message_count",
            "workflow",
            "created_at",
            "updated_at",
            "last_activity_at",
            "archived_at",
            "archived",
            "summary",
        ]
        read_only_fields = [
            "id",
            "kin",
            "description",
            "working_memory",
            "created_at",
            "updated_at",
            "last_activity_at",
            "archived_at",
        ]
        extra_kwargs = {"title": {"validators": [_one_line]}}

    def __init__(self, *args, team=None, **kwargs):
        super().__init__(*args, **kwargs)
        if team is not None:
            # Another team's workflow looks like an unknown id.
            self.fields["workflow"].queryset = Workflow.objects.filter(team=team)

    # A session from selectors.session_list_described carries both counts already (a page of
    # sessions in one query); any other (just created, after /new) is read here.
    def get_message_count(self, session) -> int:
        if hasattr(session, "message_count"):
            return session.message_count
        return session.events.filter(kind=Event.Kind.MESSAGE).count()

    def get_summary(self, session) -> str | None:
        if hasattr(session, "summary_text"):
            return session.summary_text
        summary = Summary.objects.filter(session=session).order_by("-created_at", "-id").values("content").first()
        return None if summary is None else summary["content"]

    def get_archived(self, session) -> bool:
        return session.archived_at is not None


class SessionListQuerySerializer(serializers.Serializer):
    # Give it the query as a plain dict: from a QueryDict, DRF reads a missing boolean as false.
    archived = serializers.BooleanField(
        required=False, help_text="true: only archived sessions; false: only open ones; not given: all.",
    )


class SessionUpdateSerializer(serializers.Serializer):
    """PATCH /sessions/{id}/: rename and/or archive. Anything else in the body is refused
    (a 400 that changes nothing), so a client that thinks it set a field learns it did not."""

    title = serializers.CharField(required=False, allow_blank=True,
                                  max_length=Session._meta.get_field("title").max_length, validators=[_one_line])
    description = serializers.CharField(required=False, allow_blank=True, max_length=DESCRIPTION_MAX_CHARS,
                                        validators=[_one_line])
    archived = serializers.BooleanField(required=False, help_text="true: archive; false: unarchive.")

    def validate(self, attrs):
        given = self.initial_data if isinstance(self.initial_data, dict) else {}
        problems = {}
        for name in given:
            if name in self.fields:
                continue
            if name in SessionSerializer.Meta.fields:
                problems[name] = ["Read-only: a PATCH changes only title, description and archived."]
            else:
                problems[name] = ["Unknown field: a PATCH changes only title, description and archived."]
        if problems:
            raise serializers.ValidationError(problems)
        if not attrs:
            raise serializers.ValidationError("Give at least one of title, description, archived.")
        return attrs


def message_body(event: Event) -> dict:
    """MessageSerializer's body, written out (kinsite/api/representation.py says why)."""
    return {
        "id": event.pk,
        "session": event.session_id,
        "role": str(event.role),
        "content": str(event.content),
        "sender": str(event.sender),
        "platform": str(event.platform),
        "external_id": None if event.external_id is None else str(event.external_id),
        "token_count": int(event.token_count),
        "created_at": datetime_value(event.created_at),
    }


class MessageSerializer(serializers.ModelSerializer):
    class Meta:
        model = Event
        fields = ["id", "session", "role", "content", "sender", "platform", "external_id", "token_count", "created_at"]
        read_only_fields = fields

    def to_representation(self, event):
        return message_body(event)


def _content_field():
    return serializers.CharField(max_length=settings.MESSAGE_MAX_CHARS, allow_blank=False, trim_whitespace=False)


def _sender_field():
    """A sender's name: one line (it is shown in prompts, where a line break could forge a
    heading or a role turn), surrounding whitespace trimmed, at most Event.sender's length."""
    return serializers.CharField(max_length=SENDER_MAX_CHARS, required=False, allow_blank=True, default="",
                                 validators=[_one_line])


class ImportMessageSerializer(serializers.Serializer):
    content = _content_field()
    # Left out, a message has no sender (as a chat post without one); given, it names someone.
    sender = serializers.CharField(max_length=SENDER_MAX_CHARS, required=False, default="", validators=[_one_line],
                                   error_messages={"blank": "Must not be blank: name the sender, or leave the "
                                                            "field out."})
    platform = serializers.ChoiceField(choices=Event.Platform.choices, required=False, default=Event.Platform.API)
    role = serializers.ChoiceField(
        choices=[Event.Role.USER, Event.Role.ASSISTANT], required=False, default=Event.Role.USER
    )
    created_at = serializers.DateTimeField(required=False, allow_null=True, default=None)
    external_id = serializers.CharField(max_length=200, required=False, allow_null=True, allow_blank=False,
                                        default=None)

    def validate_content(self, value):
        if not value.strip():
            raise serializers.ValidationError("Message content must not be blank.")
        return value

    def validate_created_at(self, value):
        problem = value and imported_time_problem(value)
        if problem:
            raise serializers.ValidationError(f"{problem[:1].upper()}{problem[1:]}.")
        return value


class ImportSerializer(serializers.Serializer):
    messages = ImportMessageSerializer(many=True, allow_empty=False, max_length=settings.IMPORT_MAX_MESSAGES)


class ImportResultSerializer(serializers.Serializer):
    created = serializers.IntegerField()
    skipped = serializers.IntegerField()


class HistorySearchQuerySerializer(serializers.Serializer):
    q = serializers.CharField(max_length=settings.SEARCH_MAX_QUERY_CHARS, allow_blank=True, trim_whitespace=True)
    limit = serializers.IntegerField(
        required=False, min_value=1, max_value=settings.SEARCH_MAX_LIMIT, default=settings.SEARCH_DEFAULT_LIMIT
    )


class HistoryHitSerializer(serializers.ModelSerializer):
    score = serializers.FloatField()

    class Meta:
        model = Event
        fields = ["id", "session", "external_id", "sender", "role", "platform", "created_at", "content", "score"]
        read_only_fields = fields

    def to_representation(self, event):
        # The declared fields, written out (kinsite/api/representation.py says why).
        return {
            "id": event.pk,
            "session": event.session_id,
            "external_id": None if event.external_id is None else str(event.external_id),
            "sender": str(event.sender),
            "role": str(event.role),
            "platform": str(event.platform),
            "created_at": datetime_value(event.created_at),
            "content": str(event.content),
            "score": float(event.score),
        }


# --- chat turns and the prompt preview ------------------------------------------------------


class MessagePostSerializer(serializers.Serializer):
    content = _content_field()
    sender = _sender_field()
    platform = serializers.ChoiceField(choices=Event.Platform.choices, required=False, default=Event.Platform.API)

    def validate_content(self, value):
        if not value.strip():
            raise serializers.ValidationError("Message content must not be blank.")
        return value


class TurnSerializer(serializers.ModelSerializer):
    # A plain string in the schema: as an enum, "status" would collide with Memory's status enum.
    status = serializers.CharField(
        read_only=True,
        help_text="pending, running, done or failed. pending with auto_retries > 0: waiting to run again after our "
                  "own service (Redis, the task queue, the session lock) stopped it before its reply; retry_reason "
                  "says why.",
    )
    # Null until stored: no reply yet (pending, failed); a deleted message leaves none.
    message = MessageSerializer(source="user_message", read_only=True, allow_null=True)
    reply = MessageSerializer(read_only=True, allow_null=True)
    command = serializers.SerializerMethodField()
    new_session_id = serializers.SerializerMethodField()
    tool_call_limit_reached = serializers.SerializerMethodField()

    class Meta:
        model = Turn
        fields = [
            "id",
            "session",
            "status",
            "is_async",
            "error",
            "message",
            "reply",
            "command",
            "new_session_id",
            "tool_calls",
            "tool_call_limit_reached",
            "attempts",
            "auto_retries",
            "retry_reason",
            "retried_at",
            "prompt_tokens",
            "tokens_in",
            "tokens_out",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields

    def _event_data(self, turn, field_name) -> dict:
        event = getattr(turn, field_name)
        return (event.data or {}) if event is not None else {}

    def get_command(self, turn) -> str | None:
        return self._event_data(turn, "user_message").get("command")

    def get_new_session_id(self, turn) -> int | None:
        return self._event_data(turn, "reply").get("new_session_id")

    def get_tool_call_limit_reached(self, turn) -> bool:
        return bool(self._event_data(turn, "reply").get("tool_call_limit_reached"))

    def to_representation(self, turn):
        # The declared fields, written out (kinsite/api/representation.py says why).
        message, reply = turn.user_message, turn.reply
        return {
            "id": turn.pk,
            "session": turn.session_id,
            "status": str(turn.status),
            "is_async": bool(turn.is_async),
            "error": str(turn.error),
            "message": None if message is None else message_body(message),
            "reply": None if reply is None else message_body(reply),
            "command": self.get_command(turn),
            "new_session_id": self.get_new_session_id(turn),
            "tool_calls": int(turn.tool_calls),
            "tool_call_limit_reached": self.get_tool_call_limit_reached(turn),
            "attempts": int(turn.attempts),
            "auto_retries": int(turn.auto_retries),
            "retry_reason": str(turn.retry_reason),
            "retried_at": datetime_value(turn.retried_at),
            "prompt_tokens": int(turn.prompt_tokens),
            "tokens_in": int(turn.tokens_in),
            "tokens_out": int(turn.tokens_out),
            "created_at": datetime_value(turn.created_at),
            "started_at": datetime_value(turn.started_at),
            "finished_at": datetime_value(turn.finished_at),
        }


class PromptPreviewQuerySerializer(serializers.Serializer):
    message = serializers.CharField(
        max_length=settings.MESSAGE_MAX_CHARS, required=False, allow_blank=True, default="", trim_whitespace=False
    )
    sender = _sender_field()
    platform = serializers.ChoiceField(choices=Event.Platform.choices, required=False, default=Event.Platform.API)


class PromptSectionSerializer(serializers.Serializer):
    id = serializers.CharField()
    title = serializers.CharField()
    text = serializers.CharField()
    tokens = serializers.IntegerField()


class PromptHistoryItemSerializer(serializers.Serializer):
    """One selected history item; `id` and `created_at` are null for the previewed message
    (not stored), `sent` is the message exactly as the model receives it."""

    id = serializers.IntegerField(allow_null=True)
    kind = serializers.CharField()
    role = serializers.CharField()
    sender = serializers.CharField()
    platform = serializers.CharField()
    created_at = serializers.DateTimeField(allow_null=True)
    content = serializers.CharField(allow_blank=True)
    tokens = serializers.IntegerField()
    sent = serializers.DictField()


class PromptTotalsSerializer(serializers.Serializer):
    system_tokens = serializers.IntegerField()
    history_tokens = serializers.IntegerField()
    total_tokens = serializers.IntegerField()
    budget = serializers.IntegerField()


class PromptPreviewSerializer(serializers.Serializer):
    sections = PromptSectionSerializer(many=True)
    system_prompt = serializers.CharField()
    history = PromptHistoryItemSerializer(many=True)
    tools = serializers.ListField(child=serializers.CharField())
    totals = PromptTotalsSerializer()


# --- introspection ----------------------------------------------------------------------------


class IntrospectionRunSerializer(serializers.ModelSerializer):
    # Plain strings in the schema: as enums, "status" would collide with other status enums.
    status = serializers.CharField(read_only=True, help_text="pending, running, done, failed or skipped.")
    trigger = serializers.CharField(read_only=True, help_text="checkpoint, new, turns, idle or manual.")
    tool_calls = serializers.JSONField(read_only=True, help_text="[{name, arguments, result, applied?}] in call order.")
    memories_touched = serializers.JSONField(read_only=True, help_text="[{id, action}] of the memories it changed.")

    class Meta:
        model = IntrospectionRun
        fields = [
            "id",
            "session",
            "trigger",
            "status",
            "start_event",
            "end_event",
            "first_event_id",
            "last_event_id",
            "event_count",
            "tool_calls",
            "memories_touched",
            "summary",
            "template_source",
            "tokens_in",
            "tokens_out",
            "duration_ms",
            "error",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields


# --- response bodies shared by the API and the MCP server ----------------------------------


def turn_posted_body(turn: Turn, *, as_run: bool = False) -> dict:
    """What a sync post answers (201) and a streamed one sends as its `done` event: the stored
    message, the reply and the turn (after /new, also the session to continue in). The turn
    is read again unless `as_run`: the object turn_post ran and returned, which carries its
    message and reply and holds every field as it stored them (one read less per chat turn)."""
    if not as_run:
        turn = Turn.objects.select_related("user_message", "reply").get(pk=turn.pk)
    data = TurnSerializer(turn).data
    body = {"message": data["message"], "reply": data["reply"], "turn": data}
    if data["new_session_id"] is not None:
        body["new_session_id"] = data["new_session_id"]
        body["new_session"] = SessionSerializer(Session.objects.get(pk=data["new_session_id"])).data
    return body
