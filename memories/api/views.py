"""API views for a kin's memories, one memory, its change log and memory search.
Reads come from memories.selectors and memories.search (scoped to the token's team);
writes go through memories.services with the token as the actor."""
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import status
from rest_framework.generics import ListAPIView
from rest_framework.response import Response
from rest_framework.views import APIView

from kinsite.actors import token_ref
from kinsite.api.auth import request_team
from kinsite.api.pagination import ChronologicalCursorPagination, DefaultCursorPagination
from kinsite.selectors import kin_get, kin_ref
from memories import selectors, services
from memories.api.serializers import (
    LIST_STATUS_ALL,
    MemoryAddResponseSerializer,
    MemoryChangeSerializer,
    MemoryCreateSerializer,
    MemoryHitSerializer,
    MemoryListQuerySerializer,
    MemorySearchQuerySerializer,
    MemorySerializer,
    MemoryUpdateSerializer,
)
from memories.models import Memory, MemoryChange
from memories.search.selectors import memory_search


class NewestFirstCursorPagination(DefaultCursorPagination):
    # By id, not updated_at: an edit while a client pages through must not move rows between pages.
    ordering = ("-id",)


def _actor(request) -> services.Actor:
    token = request.user.token
    return services.Actor(label=token_ref(token), user=token.user)


LIST_PARAMETERS = [
    OpenApiParameter("category", str, enum=Memory.Category.values, required=False),
    OpenApiParameter(
        "status", str, enum=[*Memory.Status.values, LIST_STATUS_ALL], required=False, description="Default: active."
    ),
    OpenApiParameter("subject", str, required=False, description="Exact subject, case-insensitive."),
    OpenApiParameter(
        "scope",
        str,
        enum=["all", "kin", "shared"],
        required=False,
        description="all (default): the kin's own and the team-shared; kin: its own only; shared: team-shared only.",
    ),
]


class KinMemoryListView(ListAPIView):
    """A kin's memories, newest first; POST adds one."""

    serializer_class = MemorySerializer
    pagination_class = NewestFirstCursorPagination

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Memory.objects.none()
        team = request_team(self.request)
        kin = kin_get(team=team, kin_id=self.kwargs["kin_id"])
        params = MemoryListQuerySerializer(data=self.request.query_params)
        params.is_valid(raise_exception=True)
        filters = params.validated_data
        memory_status = "" if filters["status"] == LIST_STATUS_ALL else filters["status"]
        return selectors.memory_list(
            team=team,
            kin=None if filters["scope"] == "shared" else kin,
            include_shared=filters["scope"] == "all",
            category=filters.get("category", ""),
            status=memory_status,
            subject=filters["subject"],
        )

    @extend_schema(parameters=LIST_PARAMETERS)
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    @extend_schema(
        request=MemoryCreateSerializer,
        responses={201: MemoryAddResponseSerializer, 200: MemoryAddResponseSerializer},
        description="201 with `created: true` for a new memory. 200 with `created: false` when an active "
        "memory in the same scope already said the same thing: that memory was updated instead.",
    )
    def post(self, request, kin_id):
        team = request_team(request)
        kin = kin_get(team=team, kin_id=kin_id)
        serializer = MemoryCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        token = request.user.token
        result = services.memory_add(
            team=team,
            kin=None if data["shared"] else kin,
            content=data["content"],
            category=data["category"],
            subject=data["subject"],
            importance=data["importance"],
            source=Memory.Source.API,
            source_ref=token_ref(token),
            reason=data["reason"],
            actor=_actor(request),
        )
        body = {**MemorySerializer(result.memory).data, "created": result.created}
        return Response(body, status=status.HTTP_201_CREATED if result.created else status.HTTP_200_OK)


class MemoryDetailView(APIView):
    @extend_schema(responses={200: MemorySerializer})
    def get(self, request, memory_id):
        memory = selectors.memory_get(team=request_team(request), memory_id=memory_id)
        return Response(MemorySerializer(memory).data)

    @extend_schema(request=MemoryUpdateSerializer, responses={200: MemorySerializer})
    def patch(self, request, memory_id):
        memory = selectors.memory_get(team=request_team(request), memory_id=memory_id)
        serializer = MemoryUpdateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        services.memory_check_editable(memory=memory)
        fields = dict(serializer.validated_data)
        reason = fields.pop("reason")
        memory = services.memory_update(memory=memory, actor=_actor(request), reason=reason, **fields)
        return Response(MemorySerializer(memory).data)

    @extend_schema(
        responses={204: None},
        description="Marks the memory deleted; it stays readable, with its history. Deleting it again changes nothing.",
    )
    def delete(self, request, memory_id):
        memory = selectors.memory_get(team=request_team(request), memory_id=memory_id)
        if memory.status != Memory.Status.DELETED:
            services.memory_delete(memory=memory, actor=_actor(request), reason="Deleted through the API.")
        return Response(status=status.HTTP_204_NO_CONTENT)


class MemoryHistoryView(ListAPIView):
    """The memory's change rows, oldest first."""

    serializer_class = MemoryChangeSerializer
    pagination_class = ChronologicalCursorPagination

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return MemoryChange.objects.none()
        memory = selectors.memory_get(team=request_team(self.request), memory_id=self.kwargs["memory_id"])
        return selectors.memory_history(memory=memory)


class KinMemorySearchView(APIView):
    @extend_schema(
        parameters=[
            OpenApiParameter("q", str, required=True, description="Search text (plain words; operators are ignored)."),
            OpenApiParameter("limit", int, required=False),
        ],
        responses={200: inline_serializer("MemorySearchResults", {"results": MemoryHitSerializer(many=True)})},
    )
    def get(self, request, kin_id):
        team = request_team(request)
        kin = kin_ref(team=team, kin_id=kin_id)
        params = MemorySearchQuerySerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        hits = memory_search(
            team=team, kin=kin, query=params.validated_data["q"], limit=params.validated_data["limit"]
        )
        return Response({"results": MemoryHitSerializer(hits, many=True).data})
