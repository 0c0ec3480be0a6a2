"""Tells drf-spectacular how the API authenticates, so the schema and the docs show Bearer auth."""
from drf_spectacular.extensions import OpenApiAuthenticationExtension


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "kinsite.api.auth.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "A team API token: `Authorization: Bearer ks_…`"}
