"""workflows' dashboard pages: the workflows, one workflow and running it, a node's inspector
and its lineage download. The project URLconf (kinsite/urls.py) puts them under the
"dashboard" namespace."""
from django.urls import path

from workflows import views

urlpatterns = [
    path("workflows/", views.workflow_list, name="workflows"),
    path("workflows/<int:workflow_id>/", views.workflow_detail, name="workflow_detail"),
    path("workflows/<int:workflow_id>/run/", views.workflow_run, name="workflow_run"),
    path("workflows/<int:workflow_id>/duplicate/", views.workflow_duplicate, name="workflow_duplicate"),
    path("workflows/<int:workflow_id>/archive/", views.workflow_archive, name="workflow_archive"),
    # Client ids are free text (they may hold "/"), so they come last, as a path.
    path("workflows/<int:workflow_id>/nodes/<path:client_id>/", views.node_inspector, name="workflow_node"),
    path("workflows/<int:workflow_id>/lineage/<str:fmt>/<path:client_id>/", views.node_lineage_download,
         name="workflow_node_export"),
]
