"""API views for workflows: list/create, read/replace/delete, run, and a node's
lineage. Reads come from workflows.selectors (scoped to the token's team); writes go
through workflows.services."""

from django.db.models import Count
from django.http import Http404
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers as drf_serializers, status
from rest_framework.generics import ListAPIView
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from kinsite.api.auth import request_team
from kinsite.api.throttles import TokenRateThrottle
from workflows import selectors, services
from workflows.api.serializers import (
    LineageQuerySerializer,
    WorkflowArchiveSerializer,
    WorkflowDocumentSerializer,
    WorkflowListQuerySerializer,
    WorkflowRunSerializer,
    WorkflowSummarySerializer,
    workflow_detail_current,
)
from workflows.models import Workflow, WorkflowRun
from workflows.nodes.registry import node_types_described
from workflows.selectors import node_lineage, node_lineage_export


def _detail_response(workflow: Workflow, *, status_code: int = status.HTTP_200_OK) -> Response:
    return Response(workflow_detail_current(workflow), status=status_code)


class NodeTypeListView(APIView):
    """Every node type a workflow may use, with its config's JSON Schema: the same for every
    team, generated from the registered node plug-ins, so a new type is listed as it is added."""

    @extend_schema(responses={200: inline_serializer("NodeTypeList", {
        "next": drf_serializers.CharField(allow_null=True),
        "previous": drf_serializers.CharField(allow_null=True),
        "results": drf_serializers.ListField(child=drf_serializers.DictField(), help_text=(
            "{name, title, description, inputs: {min, max (null: any number)}, outputs, config_schema "
            "(JSON Schema 2020-12; x-widget names the editor that fits a field)}")),
    })})
    def get(self, request):
        # A list of a dozen fixed entries: one page, in the shape of the API's other lists.
        return Response({"next": None, "previous": None, "results": node_types_described()})


class WorkflowListView(ListAPIView):
    """The team's workflows, oldest first (all unless ?archived= says which); POST imports one
    from its JSON document."""

    serializer_class = WorkflowSummarySerializer

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Workflow.objects.none()
        params = WorkflowListQuerySerializer(data=self.request.query_params.dict())
        params.is_valid(raise_exception=True)
        return selectors.workflow_list(team=request_team(self.request), archived=params.validated_data.get(
            "archived")).annotate(node_count=Count("nodes"))

    @extend_schema(parameters=[WorkflowListQuerySerializer])
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    @extend_schema(
        request=WorkflowDocumentSerializer,
        responses={201: OpenApiResponse(description="The workflow: the document plus node states.")},
    )
    def post(self, request):
        document = services.document_clean(request.data)
        workflow = services.workflow_create(team=request_team(request), document=document)
        return _detail_response(workflow, status_code=status.HTTP_201_CREATED)


class WorkflowDetailView(APIView):
    @extend_schema(
        parameters=[OpenApiParameter("export", str, required=False, description="1: only the JSON document.")],
        responses={200: OpenApiResponse(description="The document, each node's state and description, the last run.")},
    )
    def get(self, request, workflow_id):
        workflow = selectors.workflow_get(team=request_team(request), workflow_id=workflow_id)
        if request.query_params.get("export", "").lower() in ("1", "true", "yes"):
            return Response(services.workflow_export(workflow=workflow))
        return _detail_response(workflow)

    @extend_schema(request=WorkflowDocumentSerializer, responses={
        200: OpenApiResponse(description="The workflow."),
        409: OpenApiResponse(description="A run of this workflow is still going; nothing was changed."),
    })
    def put(self, request, workflow_id):
        workflow = selectors.workflow_get(team=request_team(request), workflow_id=workflow_id)
        document = services.document_clean(request.data)
        workflow = services.workflow_update(workflow=workflow, document=document)
        return _detail_response(workflow)

    @extend_schema(request=WorkflowArchiveSerializer, responses={200: OpenApiResponse(description="The workflow.")})
    def patch(self, request, workflow_id):
        workflow = selectors.workflow_get(team=request_team(request), workflow_id=workflow_id)
        serializer = WorkflowArchiveSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        services.workflow_archive(workflow=workflow, archived=serializer.validated_data["archived"])
        return _detail_response(workflow)

    @extend_schema(responses={204: None})
    def delete(self, request, workflow_id):
        workflow = selectors.workflow_get(team=request_team(request), workflow_id=workflow_id)
        services.workflow_delete(workflow=workflow)
        return Response(status=status.HTTP_204_NO_CONTENT)


class WorkflowDuplicateView(APIView):
    @extend_schema(request=None, responses={201: OpenApiResponse(
        description="The copy: same nodes, settings and edges, named 'Copy of …', never run.")})
    def post(self, request, workflow_id):
        workflow = selectors.workflow_get(team=request_team(request), workflow_id=workflow_id)
        return _detail_response(services.workflow_duplicate(workflow=workflow), status_code=status.HTTP_201_CREATED)


class WorkflowRunView(APIView):
    # A run may make a model call per record of each LLM node: limited per token like chat posts.
    throttle_classes = [TokenRateThrottle]
    throttle_scope = "workflow_runs"

    @extend_schema(
        request=None,
        responses={
            202: inline_serializer("WorkflowRunStarted", {"run": WorkflowRunSerializer()}),
            400: OpenApiResponse(description="Unknown node types, or nodes with the wrong number of inputs."),
            409: OpenApiResponse(description="A run of this workflow is still going."),
        },
        description="Starts a run: {run}. With eager Celery (the embedded default) the run has finished "
        "by the time this answers; otherwise poll GET /workflows/{id}/.",
    )
    def post(self, request, workflow_id):
        workflow = selectors.workflow_get(team=request_team(request), workflow_id=workflow_id)
        run = services.workflow_run_start(workflow=workflow)
        run = WorkflowRun.objects.get(pk=run.pk)
        return Response({"run": WorkflowRunSerializer(run).data}, status=status.HTTP_202_ACCEPTED)


class _IgnoreFormatParameter:
    """api_settings, except that ?format= does not pick a renderer (here it picks the lineage format)."""

    URL_FORMAT_OVERRIDE = None

    def __getattr__(self, name):
        return getattr(api_settings, name)


class LineageContentNegotiation(DefaultContentNegotiation):
    settings = _IgnoreFormatParameter()


class NodeLineageView(APIView):
    content_negotiation_class = LineageContentNegotiation

    @extend_schema(
        parameters=[LineageQuerySerializer],
        responses={200: OpenApiResponse(description="{node_id, format, stale, lineage}: lineage is the graph "
                                                    "(json), the text (narrative), PROV-JSON (prov) or "
                                                    "OpenLineage run events (openlineage).")},
    )
    def get(self, request, workflow_id, node_id):
        workflow = selectors.workflow_get(team=request_team(request), workflow_id=workflow_id)
        if "\x00" in node_id:
            # No node has such an id (PostgreSQL text cannot hold NUL, and the query would fail).
            raise Http404
        selectors.node_get(workflow=workflow, client_id=node_id)
        params = LineageQuerySerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        fmt, max_chars = params.validated_data["format"], params.validated_data["max_chars"]
        graph = node_lineage(workflow=workflow, client_id=node_id)
        # The workflow's API address names it in PROV and OpenLineage (a URI, as both expect).
        namespace = request.build_absolute_uri(f"/api/v1/workflows/{workflow.pk}/")
        payload = node_lineage_export(workflow=workflow, graph=graph, fmt=fmt, namespace=namespace,
                                      max_chars=max_chars)
        return Response(
            {"node_id": node_id, "format": fmt, "stale": graph.stale, "lineage": payload}
        )
