"""OpenAPI schema additions for drf-spectacular: Bearer auth, and the API's error shape
documented on every operation for each error status it can answer."""
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from rest_framework import serializers

from kinsite.api.renderers import EventStreamRenderer
from kinsite.api.throttles import is_throttled


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "kinsite.api.auth.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "A team API token: `Authorization: Bearer ks_…`"}


class ErrorSerializer(serializers.Serializer):
    code = serializers.CharField(help_text="Machine-readable, e.g. not_found, invalid, conflict, upstream_error.")
    message = serializers.CharField(help_text="For people.")
    details = serializers.JSONField(help_text="Per-field problems for 400s; other context otherwise; {} when none.")


class ErrorResponseSerializer(serializers.Serializer):
    """Every API error: {"error": {"code", "message", "details"}}."""

    error = ErrorSerializer()


# What each error status means wherever the generic reason fits; views give their own
# description (e.g. "A run of this workflow is still going.") with @extend_schema.
ERROR_DESCRIPTIONS = {
    "400": "Invalid request: the body or a query parameter failed validation (details says which).",
    "401": "Missing, malformed or revoked bearer token.",
    "404": "No such object in the token's team.",
    "429": "Rate limit exceeded for this token; Retry-After says when to try again.",
}


class KinsiteAutoSchema(AutoSchema):
    """drf-spectacular's AutoSchema plus the error responses each operation can give (401, and
    400, 404 and 429 where they apply), each with the ErrorResponse body, so a client (and
    schemathesis) can rely on the documented status codes."""

    def get_operation(self, path, path_regex, path_prefix, method, registry):
        operation = super().get_operation(path, path_regex, path_prefix, method, registry)
        if operation is None:
            return None
        responses = operation["responses"]
        parameters = operation.get("parameters", [])
        codes = []
        if operation.get("security"):
            codes.append("401")
        if "requestBody" in operation or any(p["in"] == "query" for p in parameters):
            codes.append("400")
        if any(p["in"] == "path" for p in parameters):
            codes.append("404")
        if is_throttled(self.view, self.method):
            codes.append("429")
        for code in codes:
            responses.setdefault(code, {"description": ERROR_DESCRIPTIONS[code]})
        for code, response in responses.items():
            if code.startswith(("4", "5")) and "content" not in response:
                description = response.get("description") or ERROR_DESCRIPTIONS.get(code, "")
                response.update(self._get_response_for_code(ErrorResponseSerializer, code), description=description)
        operation["responses"] = dict(sorted(responses.items()))
        return operation

    def map_renderers(self, attribute):
        """The media types of the automatic responses, without text/event-stream: a view
        answers and declares its stream itself, and its other answers are JSON."""
        found = super().map_renderers(attribute)
        if attribute == "media_type":
            return [media_type for media_type in found if media_type != EventStreamRenderer.media_type]
        return found
