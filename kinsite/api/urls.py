"""API v1: each app's api/urls.py, plus the schema and its browsable docs."""
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

urlpatterns = [
    path("schema/", SpectacularAPIView.as_view(authentication_classes=[], permission_classes=[]), name="schema"),
    path(
        "schema/docs/",
        SpectacularSwaggerView.as_view(url_name="schema", authentication_classes=[], permission_classes=[]),
        name="schema-docs",
    ),
    path(
        "schema/redoc/",
        SpectacularRedocView.as_view(url_name="schema", authentication_classes=[], permission_classes=[]),
        name="schema-redoc",
    ),
    # First: its kins/import/ must win over the kins router's kins/{pk}/.
    path("", include("transfer.api.urls")),
    path("", include("sessions_app.api.urls")),
    path("", include("memories.api.urls")),
    path("", include("consolidation.api.urls")),
    path("", include("workflows.api.urls")),
    path("", include("erasure.api.urls")),
]
