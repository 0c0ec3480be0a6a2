"""kinsite's part of API v1: the schema and its browsable docs. Each app's endpoints are in
its own api/urls.py; the project URLconf (kinsite/urls.py) puts them all under /api/v1/."""
from django.urls import path
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
]
