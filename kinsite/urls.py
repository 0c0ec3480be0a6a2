"""Top-level URLs: the API under /api/v1/, /healthz, the admin, the dashboard."""
from django.contrib import admin
from django.urls import include, path

from kinsite.health import healthz

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("api/v1/", include("kinsite.api.urls")),
    path("admin/", admin.site.urls),
    path("", include("kinsite.dashboard_urls")),
]

handler404 = "kinsite.api.errors.json_404"
handler500 = "kinsite.api.errors.json_500"
