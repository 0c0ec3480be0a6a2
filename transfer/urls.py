"""transfer's dashboard pages: importing a kin and downloading a kin's export. The project
URLconf (kinsite/urls.py) puts them under the "dashboard" namespace."""
from django.urls import path

from transfer import views

urlpatterns = [
    path("kins/import/", views.kin_import_form, name="kin_import"),
    path("kins/<int:kin_id>/export/", views.kin_export_download, name="kin_export"),
]
