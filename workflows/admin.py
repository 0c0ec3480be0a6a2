"""Admin for workflows (editable: nodes and edges inline) and their runs and results (read-only)."""
from django.contrib import admin

from kinsite.admin_mixins import ReadOnlyAdminMixin, TeamScopedAdminMixin
from workflows.models import Edge, Node, NodeResult, NodeRun, Workflow, WorkflowRun


class NodeInline(TeamScopedAdminMixin, admin.TabularInline):
    model = Node
    extra = 0
    fields = ["client_id", "type", "label", "status", "records_in", "records_out", "results_version"]
    readonly_fields = ["status", "records_in", "records_out", "results_version"]


@admin.register(Workflow)
class WorkflowAdmin(TeamScopedAdminMixin, admin.ModelAdmin):
    list_display = ["id", "name", "team", "updated_at", "archived_at"]
    list_filter = ["team", ("archived_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "description"]
    inlines = [NodeInline]


@admin.register(Node)
class NodeAdmin(TeamScopedAdminMixin, admin.ModelAdmin):
    list_display = ["id", "client_id", "type", "label", "workflow", "status", "records_in", "records_out"]
    list_filter = ["type", "status"]
    search_fields = ["client_id", "label"]
    readonly_fields = ["status", "records_in", "records_out", "results_version", "config_fingerprint", "last_run_at"]
    list_select_related = ["workflow"]


@admin.register(Edge)
class EdgeAdmin(TeamScopedAdminMixin, admin.ModelAdmin):
    list_display = ["id", "workflow", "source", "target", "kind"]
    list_select_related = ["workflow", "source", "target"]
    raw_id_fields = ["source", "target"]


@admin.register(NodeResult)
class NodeResultAdmin(TeamScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["id", "node", "version", "created_at"]
    list_select_related = ["node"]


@admin.register(WorkflowRun)
class WorkflowRunAdmin(TeamScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["id", "workflow", "status", "created_at", "finished_at"]
    list_filter = ["status"]


@admin.register(NodeRun)
class NodeRunAdmin(TeamScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["id", "run", "node", "wave", "status", "records_in", "records_out"]
    list_filter = ["status"]
