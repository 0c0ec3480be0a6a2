"""API: erasing a person (POST /api/v1/erasures/, a dry run or the erasure with its receipt)
and the team's receipts. Only a token of a team owner or admin may erase or read receipts."""
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.exceptions import PermissionDenied
from rest_framework.generics import ListAPIView, RetrieveAPIView
from rest_framework.response import Response

from erasure import selectors, services
from erasure.api.serializers import ErasureDryRunSerializer, ErasureRequestSerializer, ErasureSerializer
from erasure.matching import Person
from erasure.models import Erasure
from kinsite.actors import token_ref
from kinsite.api.auth import request_team
from kinsite.api.pagination import DefaultCursorPagination
from kinsite.api.throttles import TokenRateThrottle
from kinsite.selectors import kin_get

# A dry run lists at most this many findings with excerpts (counts and items hold them all).
FOUND_SHOWN = 500


class NewestFirstCursorPagination(DefaultCursorPagination):
    ordering = ("-id",)


def _require_eraser(request) -> None:
    team = request_team(request)
    if not selectors.can_erase(team=team, user=request.user.user):
        raise PermissionDenied("Only a token of a team owner or admin can erase or read erasures.")


def dry_run_body(plan) -> dict:
    return {
        "dry_run": True, "sender": plan.person.sender, "subject": plan.person.subject,
        "kin_id": plan.kin.pk if plan.kin else None, "counts": plan.counts,
        "total": len(plan.findings), "items": plan.items,
        "found": [vars(finding) for finding in plan.findings[:FOUND_SHOWN]],
        "found_truncated": len(plan.findings) > FOUND_SHOWN, "running": plan.busy,
    }


class ErasureListView(ListAPIView):
    serializer_class = ErasureSerializer
    pagination_class = NewestFirstCursorPagination
    throttle_classes = [TokenRateThrottle]
    throttle_scope = "jobs"

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Erasure.objects.none()
        _require_eraser(self.request)
        return selectors.erasure_list(team=request_team(self.request))

    @extend_schema(summary="The team's erasure receipts, newest first", responses={
        200: ErasureSerializer(many=True),
        403: OpenApiResponse(description="The token's user is not an owner or admin of its team."),
    })
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    @extend_schema(
        summary="Erase a person, or list what would go (dry_run)",
        description=(
            "Finds every copy of a person's text in the team's kins (or one kin): messages they sent, and "
            "any text naming them (sender or subject, whole words, any case). With dry_run, answers what "
            "would be deleted or redacted, with excerpts, and changes nothing. Without, erases it in one "
            "transaction and answers the receipt (201), which the team keeps. 409 while a job is running "
            "on what would go."
        ),
        request=ErasureRequestSerializer,
        responses={
            201: ErasureSerializer,
            200: OpenApiResponse(ErasureDryRunSerializer, description="A dry run."),
            403: OpenApiResponse(description="The token's user is not an owner or admin of its team."),
            404: OpenApiResponse(description="kin_id names no kin of the token's team."),
            409: OpenApiResponse(description="Jobs are running on what would go (details.running names them)."),
        },
    )
    def post(self, request):
        _require_eraser(request)
        team = request_team(request)
        params = ErasureRequestSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        data = params.validated_data
        kin = kin_get(team=team, kin_id=data["kin_id"]) if data["kin_id"] else None
        person = Person(sender=data["sender"], subject=data["subject"])
        if data["dry_run"]:
            return Response(dry_run_body(services.erasure_plan(team=team, kin=kin, person=person)))
        receipt = services.erasure_run(team=team, kin=kin, person=person, actor=token_ref(request.user.token),
                                       actor_user=request.user.user)
        return Response(ErasureSerializer(receipt).data, status=status.HTTP_201_CREATED)


class ErasureDetailView(RetrieveAPIView):
    serializer_class = ErasureSerializer

    def get_object(self):
        _require_eraser(self.request)
        return selectors.erasure_get(team=request_team(self.request), erasure_id=self.kwargs["erasure_id"])

    @extend_schema(summary="One erasure receipt", responses={
        200: ErasureSerializer,
        403: OpenApiResponse(description="The token's user is not an owner or admin of its team."),
    })
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)
