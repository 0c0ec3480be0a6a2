"""Serializers for workflows: the summary in lists, the full view (the JSON document plus
each node's run state and description), runs, and the lineage query. The document itself
is validated by workflows.services.document_clean (it needs graph checks a field-by-field
serializer cannot express)."""
from rest_framework import serializers

from workflows.models import Node, NodeRun, Workflow, WorkflowRun
from workflows.nodes.base import config_fingerprint
from workflows.nodes.registry import describe
from workflows.selectors import workflow_last_run
from workflows.services import DESCRIPTION_MAX_CHARS, workflow_export

LINEAGE_FORMATS = ["json", "narrative", "prov", "openlineage"]
LINEAGE_MAX_CHARS_LIMIT = 100_000


class WorkflowSummarySerializer(serializers.ModelSerializer):
    node_count = serializers.IntegerField(read_only=True)

    class Meta:
        model = Workflow
        fields = ["id", "name", "description", "node_count", "created_at", "updated_at", "archived_at"]
        read_only_fields = fields


class NodeRunSerializer(serializers.ModelSerializer):
    node_id = serializers.CharField(source="node.client_id", read_only=True)

    class Meta:
        model = NodeRun
        fields = [
            "node_id", "wave", "status", "records_in", "records_out", "config_fingerprint", "lineage_narrative",
            "error", "started_at", "finished_at",
        ]
        read_only_fields = fields


class WorkflowRunSerializer(serializers.ModelSerializer):
    workflow_id = serializers.IntegerField(read_only=True)
    node_runs = serializers.SerializerMethodField()

    class Meta:
        model = WorkflowRun
        fields = ["id", "workflow_id", "status", "error", "created_at", "started_at", "finished_at", "node_runs"]
        read_only_fields = fields

    def get_node_runs(self, run) -> list[dict]:
        return NodeRunSerializer(run.node_runs.select_related("node").order_by("wave", "id"), many=True).data


def node_state(node: Node) -> dict:
    return {
        "status": node.status,
        "records_in": node.records_in,
        "records_out": node.records_out,
        "results_version": node.results_version,
        "config_fingerprint": node.config_fingerprint,
        "current_fingerprint": config_fingerprint(node.type, node.config),
        "error": node.error,
        "last_run_at": node.last_run_at.isoformat().replace("+00:00", "Z") if node.last_run_at else None,
        "description": describe(
            node.type, node.config, label=node.label, records_in=node.records_in, records_out=node.records_out
        ),
    }


def workflow_detail_current(workflow: Workflow) -> dict:
    """workflow_detail of the workflow as stored now (a run or an edit may have changed it)."""
    workflow = Workflow.objects.get(pk=workflow.pk)
    return workflow_detail(workflow, last_run=workflow_last_run(workflow=workflow))


def workflow_detail(workflow: Workflow, *, last_run: WorkflowRun | None) -> dict:
    """The export document, each node with its state added, plus the last run."""
    document = workflow_export(workflow=workflow)
    nodes = {node.client_id: node for node in workflow.nodes.all()}
    for item in document["nodes"]:
        item.update(node_state(nodes[item["id"]]))
    return {
        "id": workflow.pk,
        **document,
        "created_at": serializers.DateTimeField().to_representation(workflow.created_at),
        "updated_at": serializers.DateTimeField().to_representation(workflow.updated_at),
        "archived_at": serializers.DateTimeField().to_representation(workflow.archived_at)
        if workflow.archived_at else None,
        "last_run": WorkflowRunSerializer(last_run).data if last_run is not None else None,
    }


class WorkflowDocumentSerializer(serializers.Serializer):
    """For the schema only: the shape POST and PUT take."""

    name = serializers.CharField(max_length=200)
    description = serializers.CharField(required=False, allow_blank=True, max_length=DESCRIPTION_MAX_CHARS)
    nodes = serializers.ListField(
        child=serializers.DictField(), help_text="[{id, type, label, config, position}]; id is the client's id."
    )
    edges = serializers.ListField(
        child=serializers.DictField(),
        help_text="[{source, target, source_handle, target_handle, kind}]; kind: data (default) or control.",
    )


class WorkflowListQuerySerializer(serializers.Serializer):
    # Give it the query as a plain dict: from a QueryDict, DRF reads a missing boolean as false.
    archived = serializers.BooleanField(
        required=False, help_text="true: only archived workflows; false: only the others; not given: all.")


class WorkflowArchiveSerializer(serializers.Serializer):
    """PATCH /workflows/{id}/: archive or unarchive (the graph is replaced with PUT). Any other
    key is refused, so a client that thinks it changed something learns it did not."""

    archived = serializers.BooleanField(help_text="true: archive; false: unarchive.")

    def validate(self, attrs):
        given = self.initial_data if isinstance(self.initial_data, dict) else {}
        unknown = sorted(set(given) - {"archived"})
        if unknown:
            raise serializers.ValidationError(
                {name: ["A PATCH changes only archived; PUT replaces the document."] for name in unknown})
        return attrs


class LineageQuerySerializer(serializers.Serializer):
    format = serializers.ChoiceField(choices=LINEAGE_FORMATS, required=False, default="json")
    max_chars = serializers.IntegerField(required=False, default=2000, min_value=100, max_value=LINEAGE_MAX_CHARS_LIMIT)
