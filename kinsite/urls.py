"""The project URLconf, assembling every app's URLs: the API under /api/v1/, /mcp/, /healthz,
the admin, login/logout and the dashboard (one "dashboard" namespace). A new page or endpoint
goes in its app's urls.py; only a new app adds a line here."""
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.templatetags.static import static
from django.urls import include, path, re_path
from django.views.generic import RedirectView

from consolidation import urls as consolidation_urls
from erasure import urls as erasure_urls
from kinsite import dashboard_urls as kinsite_urls
from kinsite.health import healthz
from memories import urls as memories_urls
from sessions_app import urls as sessions_app_urls
from transfer import urls as transfer_urls
from workflows import urls as workflows_urls

api_v1 = [
    path("", include("kinsite.api.urls")),  # the schema and its browsable docs
    # Before sessions_app's: its kins/import/ must win over the kins router's kins/{pk}/.
    path("", include("transfer.api.urls")),
    path("", include("sessions_app.api.urls")),
    path("", include("memories.api.urls")),
    path("", include("consolidation.api.urls")),
    path("", include("workflows.api.urls")),
    path("", include("erasure.api.urls")),
]

# One list, one namespace: every page is reversed as "dashboard:<name>", whichever app has it.
dashboard_pages = [
    *kinsite_urls.urlpatterns,
    *sessions_app_urls.urlpatterns,
    *transfer_urls.urlpatterns,
    *memories_urls.urlpatterns,
    *consolidation_urls.urlpatterns,
    *workflows_urls.urlpatterns,
    *erasure_urls.urlpatterns,
]

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    # Browsers and crawlers ask for /favicon.ico whatever the pages link; they follow a redirect to the SVG.
    path("favicon.ico", RedirectView.as_view(url=static("kinsite/favicon.svg")), name="favicon"),
    path("api/v1/", include(api_v1)),
    # /mcp as well as /mcp/: clients are configured with either, and a POST cannot follow
    # APPEND_SLASH's redirect.
    re_path(r"^mcp/?", include("agent_mcp.urls")),
    # Old links to the kin admin, from before the model moved to kinsite.
    re_path(r"^admin/sessions_app/kin/(?P<rest>.*)$",
            RedirectView.as_view(url="/admin/kinsite/kin/%(rest)s", query_string=True)),
    path("admin/", admin.site.urls),
    # Un-namespaced, as settings name them (LOGIN_URL).
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    # Django's LogoutView only accepts POST; base.html posts a small form with the CSRF token.
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", include((dashboard_pages, "dashboard"))),
]

handler404 = "kinsite.api.errors.json_404"
handler500 = "kinsite.api.errors.json_500"
