from django.urls import path

from workflows.api import views

urlpatterns = [
    path("workflow-node-types/", views.NodeTypeListView.as_view(), name="workflow-node-types"),
    path("workflows/", views.WorkflowListView.as_view(), name="workflow-list"),
    path("workflows/<int:workflow_id>/", views.WorkflowDetailView.as_view(), name="workflow-detail"),
    path("workflows/<int:workflow_id>/run/", views.WorkflowRunView.as_view(), name="workflow-run"),
    path("workflows/<int:workflow_id>/duplicate/", views.WorkflowDuplicateView.as_view(), name="workflow-duplicate"),
    path(
        # Node ids may hold "/" (workflows.services.node_id_problem), so the id is a path.
        "workflows/<int:workflow_id>/nodes/<path:node_id>/lineage/",
        views.NodeLineageView.as_view(),
        name="workflow-node-lineage",
    ),
]
