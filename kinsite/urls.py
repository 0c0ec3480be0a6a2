"""Top-level URLs: the API under /api/v1/, the MCP server at /mcp/, /healthz, the admin, the dashboard."""
from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path, re_path
from django.views.generic import RedirectView

from kinsite.health import healthz

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    # Browsers and crawlers ask for /favicon.ico whatever the pages link; they follow a redirect to the SVG.
    path("favicon.ico", RedirectView.as_view(url=static("kinsite/favicon.svg")), name="favicon"),
    path("api/v1/", include("kinsite.api.urls")),
    # The MCP server (agent_mcp): the same Bearer tokens and team scoping as the API.
    # /mcp as well as /mcp/: clients are configured with either, and a POST cannot follow
    # APPEND_SLASH's redirect.
    re_path(r"^mcp/?", include("agent_mcp.urls")),
    # The kin admin moved with the model from sessions_app to kinsite (issue 15); old links lead there.
    re_path(r"^admin/sessions_app/kin/(?P<rest>.*)$",
            RedirectView.as_view(url="/admin/kinsite/kin/%(rest)s", query_string=True)),
    path("admin/", admin.site.urls),
    path("", include("kinsite.dashboard_urls")),
]

handler404 = "kinsite.api.errors.json_404"
handler500 = "kinsite.api.errors.json_500"
