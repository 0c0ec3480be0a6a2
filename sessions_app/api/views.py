"""API views for kins, sessions, messages, imports, history search, chat turns and the prompt preview."""
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.exceptions import NotAcceptable
from rest_framework.generics import ListAPIView
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from kinsite.api.auth import request_team
from kinsite.api.pagination import ChronologicalCursorPagination, DefaultCursorPagination
from kinsite.api.renderers import EventStreamMixin, EventStreamRenderer
from kinsite.api.throttles import TokenRateThrottle
from kinsite.models import Kin
from kinsite.selectors import kin_get, kin_list, kin_ref
from sessions_app import selectors, services
from sessions_app.api.serializers import (
    HistoryHitSerializer,
    HistorySearchQuerySerializer,
    ImportResultSerializer,
    ImportSerializer,
    IntrospectionRunSerializer,
    KinSerializer,
    MessagePostSerializer,
    MessageSerializer,
    PromptPreviewQuerySerializer,
    PromptPreviewSerializer,
    SessionListQuerySerializer,
    SessionSerializer,
    SessionUpdateSerializer,
    TurnSerializer,
    turn_posted_body,
)
from sessions_app.introspection import services as introspection
from sessions_app.models import Event, IntrospectionRun, Session, Turn
from sessions_app.turns import services as turns
from sessions_app.turns.preview import prompt_preview
from sessions_app.turns.stream import turn_event_stream, turn_post_streamed

# Response envelopes, named once so the schema has one component each.
TURN_POSTED = inline_serializer("TurnPosted", {
    "message": MessageSerializer(),
    "reply": MessageSerializer(allow_null=True),
    "turn": TurnSerializer(),
    "new_session_id": serializers.IntegerField(required=False, help_text="After /new: the session to continue in."),
    "new_session": SessionSerializer(required=False),
})
TURN_QUEUED = inline_serializer("TurnQueued", {"turn": TurnSerializer()})
HISTORY_SEARCH_RESULTS = inline_serializer("HistorySearchResults", {"results": HistoryHitSerializer(many=True)})
CHECKPOINT_QUEUED = inline_serializer("CheckpointQueued", {"run": IntrospectionRunSerializer()})
TURN_EVENTS_DESCRIPTION = (
    "Server-sent events: `message` (the stored user message) first; then `delta` {text}, `tool_call` "
    "{id, name, arguments} and `tool_result` {id, name, content} as the turn runs (and `reset` {attempt} "
    "when the turn runs again from the start after its process stopped: drop the text and tool events "
    "received so far); then exactly one of "
    "`done` (the 201 answer's JSON: message, reply, turn, and new_session_id/new_session after /new) or "
    "`error` ({error: {code, message, details}}; details.turn, details.message, details.stored true). "
    "Each event has an id; send the last one back as Last-Event-ID to resume after it. Comment lines "
    "(`: keep-alive`) keep an idle stream open."
)
# One event of such a stream, as its `id:`, `event:` and `data:` lines (OpenAPI 3.0 has a
# text/event-stream schema describe each event, not the whole body).
TURN_STREAM_EVENT = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "description": "The event's id, to send back as Last-Event-ID."},
        "event": {"type": "string", "enum": ["message", "delta", "tool_call", "tool_result", "reset", "done", "error"]},
        "data": {"type": "string", "description": "The event's JSON object, on one line (see above)."},
    },
    "required": ["id", "event", "data"],
}


def message_body(message: Event) -> dict:
    return MessageSerializer(message).data


def _follow_turn(request, turn: Turn):
    return turn_event_stream(request, turn, done_body=turn_posted_body, message_body=message_body,
                             last_event_id=request.headers.get("Last-Event-ID"))


class KinViewSet(viewsets.ModelViewSet):
    serializer_class = KinSerializer
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Kin.objects.none()
        return kin_list(team=request_team(self.request))

    def get_serializer(self, *args, **kwargs):
        if getattr(self, "swagger_fake_view", False):
            return super().get_serializer(*args, **kwargs)
        return super().get_serializer(*args, team=request_team(self.request), **kwargs)

    def perform_create(self, serializer):
        serializer.instance = services.kin_create(team=request_team(self.request), **serializer.validated_data)

    def perform_update(self, serializer):
        serializer.instance = services.kin_update(kin=serializer.instance, **serializer.validated_data)

    def perform_destroy(self, instance):
        services.kin_delete(kin=instance)


class NewestFirstCursorPagination(DefaultCursorPagination):
    # By id, not last activity: a chat turn while a client pages through must not move rows between pages.
    ordering = ("-id",)


class KinSessionListView(ListAPIView):
    """GET: the kin's sessions, newest first (all of them unless ?archived= says which).
    POST: a new session."""

    serializer_class = SessionSerializer
    pagination_class = NewestFirstCursorPagination

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Session.objects.none()
        kin = kin_ref(team=request_team(self.request), kin_id=self.kwargs["kin_id"])
        params = SessionListQuerySerializer(data=self.request.query_params.dict())
        params.is_valid(raise_exception=True)
        return selectors.session_list_described(team=request_team(self.request), kin=kin,
                                                archived=params.validated_data.get("archived"))

    @extend_schema(parameters=[SessionListQuerySerializer])
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    @extend_schema(request=SessionSerializer, responses={201: SessionSerializer})
    def post(self, request, kin_id):
        kin = kin_get(team=request_team(request), kin_id=kin_id)
        serializer = SessionSerializer(data=request.data, team=kin.team)
        serializer.is_valid(raise_exception=True)
        session = services.session_create(kin=kin, **serializer.validated_data)
        return Response(SessionSerializer(session).data, status=status.HTTP_201_CREATED)


class SessionViewSet(mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """GET: one session. PATCH: rename it (title, description) and/or archive or unarchive it."""

    serializer_class = SessionSerializer
    http_method_names = ["get", "patch", "head", "options"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Session.objects.none()
        return selectors.session_list_described(team=request_team(self.request))

    @extend_schema(request=SessionUpdateSerializer, responses={200: SessionSerializer})
    def partial_update(self, request, pk=None):
        session = self.get_object()
        serializer = SessionUpdateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        services.session_update(session=session, **serializer.validated_data)
        return Response(SessionSerializer(self.get_object()).data)


class SessionMessageListView(EventStreamMixin, ListAPIView):
    """GET: history of a session, oldest first. POST: a chat turn; with
    `Accept: text/event-stream`, the same turn as server-sent events (turns/stream.py)."""

    serializer_class = MessageSerializer
    pagination_class = ChronologicalCursorPagination
    throttle_classes = [TokenRateThrottle]  # POST only (the chat turn); reads are not limited
    throttle_scope = "chat"

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Event.objects.none()
        session = selectors.session_get(team=request_team(self.request), session_id=self.kwargs["session_id"])
        return selectors.message_list(session=session)

    @extend_schema(
        request=MessagePostSerializer,
        parameters=[OpenApiParameter("async", str, required=False, description="1: answer 202 with a turn to poll.")],
        responses={
            201: OpenApiResponse(TURN_POSTED, description="The turn ran: the stored message, the reply, the turn."),
            (200, EventStreamRenderer.media_type): OpenApiResponse(
                TURN_STREAM_EVENT,
                description="Accept: text/event-stream (or ?format=sse): the turn as it runs. "
                            + TURN_EVENTS_DESCRIPTION,
            ),
            202: OpenApiResponse(TURN_QUEUED, description="?async=1: the queued turn, to poll at /turns/{id}/."),
            502: OpenApiResponse(description="The model failed; the message is stored and the turn says why."),
            503: OpenApiResponse(description="Redis is unreachable (Retry-After). Sync: nothing is stored "
                                             "(details.stored false) unless Redis went away mid-turn. ?async=1: "
                                             "the message and its pending turn are stored (details.turn) and run "
                                             "once the queue is back."),
        },
    )
    def post(self, request, session_id):
        # Which session, and whether it is open: the turn reads it whole, with its kin, under the session lock.
        session = selectors.session_ref(team=request_team(request), session_id=session_id)
        serializer = MessagePostSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        is_async = request.query_params.get("async", "").lower() in ("1", "true", "yes")
        if is_async:
            # Follow it with GET /turns/{id}/events/ if you want its events.
            turn = turns.turn_post(session=session, is_async=True, **serializer.validated_data)
            turn = Turn.objects.select_related("user_message", "reply").get(pk=turn.pk)
            return Response({"turn": TurnSerializer(turn).data}, status=status.HTTP_202_ACCEPTED)
        if self.wants_event_stream(request):
            turn = turn_post_streamed(session=session, **serializer.validated_data)
            return _follow_turn(request, turn)
        turn = turns.turn_post(session=session, **serializer.validated_data)
        return Response(turn_posted_body(turn, as_run=True), status=status.HTTP_201_CREATED)


class TurnDetailView(APIView):
    @extend_schema(responses={200: TurnSerializer})
    def get(self, request, turn_id):
        turn = get_object_or_404(
            Turn.objects.select_related("user_message", "reply"),
            session__kin__team=request_team(request),
            pk=turn_id,
        )
        return Response(TurnSerializer(turn).data)


class TurnRetryView(APIView):
    """POST: run a failed turn again with the message it stored (no second user message).
    Always queued, as ?async=1 posts are: 202 with the turn, to poll at /turns/{id}/ (with
    eager Celery, the embedded default, it has run by then). Idempotent: a turn already
    pending or running comes back unchanged. Rate-limited with the chat posts (API_RATE_CHAT)."""

    throttle_classes = [TokenRateThrottle]
    throttle_scope = "chat"

    @extend_schema(
        request=None,
        responses={
            202: OpenApiResponse(TURN_QUEUED, description="The turn, queued again (or, with eager Celery, run); "
                                                          "a turn already pending or running comes back as it is."),
            409: OpenApiResponse(description="The turn did not fail (it has its reply: turn_not_failed), its "
                                             "message was deleted, or the session is archived. Nothing changes."),
            503: OpenApiResponse(description="Redis is unreachable: the turn is pending again and runs once the "
                                             "queue is back (details.turn)."),
        },
    )
    def post(self, request, turn_id):
        turn = get_object_or_404(Turn.objects.select_related("session"), session__kin__team=request_team(request),
                                 pk=turn_id)
        turn = turns.turn_retry(turn=turn)
        return Response({"turn": TurnSerializer(turn).data}, status=status.HTTP_202_ACCEPTED)


class TurnEventsView(EventStreamMixin, APIView):
    """GET: follow a turn as server-sent events (a running ?async=1 turn, or any other)."""

    # The stream for any client that takes it (no Accept, */*, text/event-stream); JSON is
    # here for the errors, and for the 406 a client asking for JSON only gets.
    renderer_classes = [EventStreamRenderer, JSONRenderer]
    # A read, limited all the same: each request holds a stream open (API_RATE_EVENTS).
    throttle_classes = [TokenRateThrottle]
    throttle_scope = "events"
    throttle_reads = True

    @extend_schema(
        parameters=[OpenApiParameter("Last-Event-ID", str, OpenApiParameter.HEADER, required=False,
                                     description="Resume after this event.")],
        responses={
            (200, EventStreamRenderer.media_type): OpenApiResponse(
                TURN_STREAM_EVENT,
                description="The turn's events; a finished turn answers `message` and `done` (or `error`) "
                            "at once. " + TURN_EVENTS_DESCRIPTION,
            ),
            406: OpenApiResponse(description="?format=json, or an Accept header without text/event-stream: "
                                             "this endpoint only streams. GET /turns/{id}/ is the turn as JSON."),
        },
    )
    def get(self, request, turn_id):
        turn = get_object_or_404(Turn, session__kin__team=request_team(request), pk=turn_id)
        if not self.wants_event_stream(request):
            raise NotAcceptable(
                f"This endpoint answers server-sent events only (Accept: text/event-stream, or ?format=sse); "
                f"GET /api/v1/turns/{turn.pk}/ gives the turn as JSON."
            )
        return _follow_turn(request, turn)


class SessionPromptPreviewView(APIView):
    """Exactly what a turn would send for `message`: sections, the selected history, totals.
    Reading it changes nothing (memories served here do not count as retrieved)."""

    @extend_schema(parameters=[PromptPreviewQuerySerializer], responses={200: PromptPreviewSerializer})
    def get(self, request, session_id):
        session = selectors.session_get(team=request_team(request), session_id=session_id)
        params = PromptPreviewQuerySerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        body = prompt_preview(
            session=session,
            message=params.validated_data["message"],
            sender=params.validated_data["sender"],
            platform=params.validated_data["platform"],
        )
        return Response(PromptPreviewSerializer(body).data)


class SessionMessageImportView(APIView):
    @extend_schema(request=ImportSerializer, responses={201: ImportResultSerializer})
    def post(self, request, session_id):
        session = selectors.session_get(team=request_team(request), session_id=session_id)
        # A bare JSON list is accepted as well as {"messages": [...]}.
        data = {"messages": request.data} if isinstance(request.data, list) else request.data
        serializer = ImportSerializer(data=data)
        serializer.is_valid(raise_exception=True)
        items = [services.ImportItem(**item) for item in serializer.validated_data["messages"]]
        result = services.messages_import(session=session, items=items)
        return Response(ImportResultSerializer(result).data, status=status.HTTP_201_CREATED)


SEARCH_PARAMETERS = [
    OpenApiParameter("q", str, required=True, description="Search text (plain words; operators are ignored)."),
    OpenApiParameter("limit", int, required=False),
]


class _HistorySearchView(APIView):
    def search(self, request, **scope):
        params = HistorySearchQuerySerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        hits = selectors.history_search(
            query=params.validated_data["q"], limit=params.validated_data["limit"], **scope
        )
        return Response({"results": HistoryHitSerializer(hits, many=True).data})


class SessionHistorySearchView(_HistorySearchView):
    @extend_schema(parameters=SEARCH_PARAMETERS, responses={200: HISTORY_SEARCH_RESULTS})
    def get(self, request, session_id):
        session = selectors.session_ref(team=request_team(request), session_id=session_id)
        return self.search(request, session=session)


class KinHistorySearchView(_HistorySearchView):
    @extend_schema(parameters=SEARCH_PARAMETERS, responses={200: HISTORY_SEARCH_RESULTS})
    def get(self, request, kin_id):
        kin = kin_ref(team=request_team(request), kin_id=kin_id)
        return self.search(request, kin=kin)


class SessionCheckpointView(APIView):
    """POST: introspect the session now. Answers 202 with the queued run (an
    already queued run is reused); poll GET /sessions/{id}/introspections/ for its outcome."""

    throttle_classes = [TokenRateThrottle]
    throttle_scope = "jobs"

    @extend_schema(
        request=None,
        responses={
            202: OpenApiResponse(CHECKPOINT_QUEUED, description="The queued (or, with eager Celery, finished) run."),
            409: OpenApiResponse(description="Introspection is disabled for the session's kin."),
        },
    )
    def post(self, request, session_id):
        session = selectors.session_get(team=request_team(request), session_id=session_id)
        run = introspection.introspection_request(session=session, trigger=IntrospectionRun.Trigger.CHECKPOINT)
        run.refresh_from_db()  # eager Celery (the embedded default) has run it already
        return Response({"run": IntrospectionRunSerializer(run).data}, status=status.HTTP_202_ACCEPTED)


class SessionIntrospectionListView(ListAPIView):
    """The session's introspection runs, newest first: trigger, event range, tool calls,
    memories touched, summary, tokens, duration, status and error."""

    serializer_class = IntrospectionRunSerializer
    pagination_class = NewestFirstCursorPagination

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return IntrospectionRun.objects.none()
        session = selectors.session_get(team=request_team(self.request), session_id=self.kwargs["session_id"])
        return IntrospectionRun.objects.filter(session=session)
