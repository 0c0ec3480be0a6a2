"""Content negotiation for endpoints that can answer with server-sent events."""
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.response import Response


class EventStreamRenderer(BaseRenderer):
    """Lets DRF accept `Accept: text/event-stream`. The view answers such a request with a
    StreamingHttpResponse of its own; this renderer never renders a body itself (see
    EventStreamMixin for the JSON error answers)."""

    media_type = "text/event-stream"
    format = "sse"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        raise NotImplementedError("event streams are answered by the view (EventStreamMixin)")


class EventStreamMixin:
    """For views that answer text/event-stream: JSON and event streams are accepted, and
    every answer that is not the stream itself (validation errors, 404, 429, 503, and the
    usual JSON answers) is JSON, whatever the client accepted."""

    renderer_classes = [JSONRenderer, EventStreamRenderer]

    def wants_event_stream(self, request) -> bool:
        return isinstance(getattr(request, "accepted_renderer", None), EventStreamRenderer)

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        if isinstance(response, Response) and isinstance(response.accepted_renderer, EventStreamRenderer):
            response.accepted_renderer = JSONRenderer()
            response.accepted_media_type = JSONRenderer.media_type
        return response
