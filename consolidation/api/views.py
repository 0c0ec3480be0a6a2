"""API views for a kin's fact ledger, on-demand consolidation, the consolidation audit
and the experience document. Reads come from consolidation.selectors
through the kin of the token's team (another team's kin answers 404); writes go
through consolidation.services."""
import json

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.generics import ListAPIView
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from consolidation import selectors, services
from consolidation.api.serializers import (
    ConsolidateSerializer,
    ConsolidationListQuerySerializer,
    ConsolidationRunDetailSerializer,
    ConsolidationRunSerializer,
    ExperienceQuerySerializer,
    ExperienceSerializer,
    FactCreateSerializer,
    FactListQuerySerializer,
    FactSerializer,
)
from consolidation.models import ConsolidationRun, Fact
from kinsite.actors import token_ref
from kinsite.api.auth import request_team
from kinsite.api.errors import error_body
from kinsite.api.pagination import DefaultCursorPagination
from kinsite.api.throttles import TokenRateThrottle
from kinsite.errors import NotFound
from kinsite.selectors import kin_get


class NewestFirstCursorPagination(DefaultCursorPagination):
    ordering = ("-id",)


# --- facts -----------------------------------------------------------------------------------


class KinFactListView(ListAPIView):
    """A kin's facts, newest first; POST logs one (it is pending until the next consolidation)."""

    serializer_class = FactSerializer
    pagination_class = NewestFirstCursorPagination

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Fact.objects.none()
        team = request_team(self.request)
        kin = kin_get(team=team, kin_id=self.kwargs["kin_id"])
        params = FactListQuerySerializer(data=self.request.query_params)
        params.is_valid(raise_exception=True)
        return selectors.fact_list(
            team=team, kin=kin, status=params.validated_data.get("status"), pending=params.validated_data["pending"]
        )

    @extend_schema(
        parameters=[
            OpenApiParameter("status", str, enum=Fact.Status.values, required=False),
            OpenApiParameter(
                "pending", bool, required=False, description="true: only pending facts (active, not consolidated)."
            ),
        ]
    )
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    @extend_schema(request=FactCreateSerializer, responses={201: FactSerializer})
    def post(self, request, kin_id):
        kin = kin_get(team=request_team(request), kin_id=kin_id)
        serializer = FactCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        fact = services.fact_record(
            kin=kin,
            statement=serializer.validated_data["statement"],
            category=serializer.validated_data["category"],
            source=Fact.Source.API,
            source_ref=token_ref(request.user.token),
        )
        return Response(FactSerializer(fact).data, status=status.HTTP_201_CREATED)


# --- consolidation ---------------------------------------------------------------------------


class KinConsolidateView(APIView):
    throttle_classes = [TokenRateThrottle]
    throttle_scope = "jobs"

    @extend_schema(
        request=ConsolidateSerializer,
        responses={
            200: ConsolidationRunDetailSerializer,
            400: OpenApiResponse(
                description="Invalid body; an invalid template lists each problem in details.template."
            ),
            409: OpenApiResponse(description="nothing_to_consolidate: the kin has no pending facts (no run, no "
                                 "model call); consolidation_busy: another consolidation of the kin is running."),
            502: OpenApiResponse(description="The model call failed; the run is recorded as failed (details.run)."),
            503: OpenApiResponse(description="model_not_configured: no language model is configured (LLM_BASE_URL "
                                 "is empty); nothing is recorded. `prepare` still renders."),
        },
        description="Consolidates the kin's pending facts now, synchronously, and answers with the run. "
        "200 whatever the run's status (prepared, applied or rejected: read `status`); "
        "409 when there is nothing to consolidate (prepare still renders); 502 when the model failed; "
        "503 when no model is configured.",
    )
    def post(self, request, kin_id):
        kin = kin_get(team=request_team(request), kin_id=kin_id)
        serializer = ConsolidateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        run = services.consolidation_run(
            kin=kin,
            trigger=ConsolidationRun.Trigger.API,
            template_body=data.get("template"),
            max_words=data.get("max_words"),
            prepare=data["prepare"],
        )
        body = ConsolidationRunDetailSerializer(run).data
        if run.status == ConsolidationRun.Status.FAILED:
            message = f"The consolidation failed: {run.error or 'the model call failed.'}"
            return Response(error_body("upstream_error", message, {"run": body}), status=status.HTTP_502_BAD_GATEWAY)
        return Response(body)


class KinConsolidationListView(ListAPIView):
    """The kin's consolidation runs, newest first. `?full=true` adds each run's rendered
    prompt and raw model answers (left out by default: they are the bulk of a run)."""

    pagination_class = NewestFirstCursorPagination

    def _full(self) -> bool:
        params = ConsolidationListQuerySerializer(data=self.request.query_params)
        params.is_valid(raise_exception=True)
        return params.validated_data["full"]

    def get_serializer_class(self):
        if getattr(self, "swagger_fake_view", False) or not self._full():
            return ConsolidationRunSerializer
        return ConsolidationRunDetailSerializer

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return ConsolidationRun.objects.none()
        kin = kin_get(team=request_team(self.request), kin_id=self.kwargs["kin_id"])
        runs = selectors.consolidation_runs(kin).select_related("experience_version")
        if not self._full():
            runs = runs.defer("rendered_prompt", "raw_answers")
        return runs

    @extend_schema(
        parameters=[ConsolidationListQuerySerializer],
        # The summary; with ?full=true each run also has rendered_prompt and raw_answers.
        responses={200: ConsolidationRunSerializer(many=True)},
    )
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)


# --- experience ------------------------------------------------------------------------------


class MarkdownRenderer(BaseRenderer):
    """`Accept: text/markdown` (or `?format=md`) answers the document itself. Errors are
    still the JSON error shape, with a JSON content type."""

    media_type = "text/markdown"
    format = "md"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        if isinstance(data, dict) and "markdown" in data and "error" not in data:
            return data["markdown"].encode(self.charset)
        response = (renderer_context or {}).get("response")
        if response is not None:
            response["Content-Type"] = "application/json"
        return json.dumps(data).encode(self.charset)


class KinExperienceView(APIView):
    renderer_classes = [JSONRenderer, MarkdownRenderer]

    @extend_schema(
        parameters=[ExperienceQuerySerializer],
        responses={
            200: ExperienceSerializer,
            404: OpenApiResponse(description="No document yet, or no such version or section."),
        },
        description="The experience document as markdown, whole or one section, current or any version. "
        "JSON by default; `Accept: text/markdown` answers the markdown alone.",
    )
    def get(self, request, kin_id):
        kin = kin_get(team=request_team(request), kin_id=kin_id)
        params = ExperienceQuerySerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        version_number = params.validated_data.get("version")
        version = selectors.experience_get(kin, version=version_number)  # NotFound (404) when missing
        body = ExperienceSerializer(version).data
        section = params.validated_data.get("section")
        if section:
            text = selectors.experience_section(version.markdown, section)
            if text is None:
                raise NotFound(f"Version {version.version} has no section {section!r}.")
            body.update(section=section, markdown=text)
        return Response(body)
