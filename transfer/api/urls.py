from django.urls import path

from transfer.api import views

urlpatterns = [
    # Before sessions_app's kins router, whose kins/{pk}/ would otherwise take kins/import/.
    path("kins/import/", views.KinImportView.as_view(), name="kin-import"),
    path("kins/<int:kin_id>/export/", views.KinExportView.as_view(), name="kin-export"),
]
