"""API: a kin's export as one kin document, and the import of such a document as a new kin
of the token's team (the format is transfer.format's)."""
from django.utils.text import slugify
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from kinsite.api.auth import request_team
from kinsite.selectors import kin_get
from sessions_app.api.serializers import OVERRIDES_HELP, KinSerializer
from transfer import format as kin_format
from transfer.parsing import KinDocumentParser
from transfer.selectors import kin_export_document
from transfer.services import kin_import

# The document as OpenAPI sees it: the header and the kin are described field by field (with
# the models' limits); each list's rows are objects whose keys transfer.format defines.
KIN_DOCUMENT_KIN = inline_serializer(
    "KinDocumentKin",
    {
        "id": serializers.IntegerField(min_value=1, help_text="The kin's id where it was exported."),
        "name": serializers.CharField(max_length=100),
        "role": serializers.CharField(max_length=200, allow_blank=True),
        "character": serializers.CharField(max_length=10_000, allow_blank=True),
        "expertise": serializers.CharField(max_length=10_000, allow_blank=True),
        "model": serializers.CharField(max_length=200, allow_blank=True),
        "history_token_budget": serializers.IntegerField(min_value=1_000, max_value=2_000_000, allow_null=True),
        "spawn_reason": serializers.CharField(max_length=10_000, allow_blank=True),
        "overrides": serializers.DictField(help_text=OVERRIDES_HELP),
        "created_at": serializers.DateTimeField(),
        "updated_at": serializers.DateTimeField(),
    },
)
KIN_DOCUMENT = inline_serializer(
    "KinDocument",
    {
        "format": serializers.ChoiceField(choices=[kin_format.FORMAT]),
        "version": serializers.ChoiceField(choices=[kin_format.VERSION], help_text="The format version."),
        "exported_at": serializers.DateTimeField(),
        "includes_sessions": serializers.BooleanField(),
        "kin": KIN_DOCUMENT_KIN,
        **{
            section.key: serializers.ListField(child=serializers.DictField(), help_text=f"Rows of {section.key}.")
            for section in kin_format.SECTIONS
        },
    },
)

def document_filename(kin) -> str:
    return f"kin-{kin.pk}-{slugify(kin.name) or 'kin'}.kin.json"


class ExportQuerySerializer(serializers.Serializer):
    sessions = serializers.BooleanField(required=False, default=False)


class KinExportView(APIView):
    @extend_schema(
        summary="Export a kin as one kin document",
        description=kin_format.__doc__,
        parameters=[OpenApiParameter("sessions", bool, required=False,
                                     description="1: include the sessions, their events, turns and summaries.")],
        responses={200: KIN_DOCUMENT},
    )
    def get(self, request, kin_id):
        kin = kin_get(team=request_team(request), kin_id=kin_id)
        params = ExportQuerySerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        document = kin_export_document(kin=kin, include_sessions=params.validated_data["sessions"])
        response = Response(document)
        response["Content-Disposition"] = f'attachment; filename="{document_filename(kin)}"'
        return response


class KinImportView(APIView):
    parser_classes = [KinDocumentParser]

    @extend_schema(
        summary="Import a kin document as a new kin of the team",
        description=(
            "Creates a new kin (every row with a new id) from a document made by the export, in one "
            "transaction: a bad or truncated document answers 400 naming each problem by its JSON path "
            "(details.errors) and creates nothing; over TRANSFER_MAX_DOCUMENT_BYTES answers 413. "
            "Importing the same document again answers 200 with the kin made the first time."
        ),
        request=KIN_DOCUMENT,
        responses={
            201: OpenApiResponse(KinSerializer, description="The new kin."),
            200: OpenApiResponse(KinSerializer, description="This document was imported before: that kin."),
        },
    )
    def post(self, request):
        result = kin_import(team=request_team(request), document=request.data)
        return Response(KinSerializer(result.kin).data,
                        status=status.HTTP_201_CREATED if result.created else status.HTTP_200_OK)
