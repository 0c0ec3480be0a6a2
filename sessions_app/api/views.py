"""API views for kins, sessions, messages, imports and history search."""
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.generics import ListAPIView
from rest_framework.response import Response
from rest_framework.views import APIView

from kinsite.api.auth import request_team
from kinsite.api.pagination import ChronologicalCursorPagination
from sessions_app import selectors, services
from sessions_app.models import Event, Kin, Session
from sessions_app.api.serializers import (
    HistoryHitSerializer,
    HistorySearchQuerySerializer,
    ImportResultSerializer,
    ImportSerializer,
    KinSerializer,
    MessageSerializer,
    SessionSerializer,
)


class KinViewSet(viewsets.ModelViewSet):
    serializer_class = KinSerializer
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Kin.objects.none()
        return selectors.kin_list(team=request_team(self.request))

    def get_serializer(self, *args, **kwargs):
        if getattr(self, "swagger_fake_view", False):
            return super().get_serializer(*args, **kwargs)
        return super().get_serializer(*args, team=request_team(self.request), **kwargs)

    def perform_create(self, serializer):
        serializer.instance = services.kin_create(team=request_team(self.request), **serializer.validated_data)

    def perform_update(self, serializer):
        serializer.instance = services.kin_update(kin=serializer.instance, **serializer.validated_data)

    def perform_destroy(self, instance):
        services.kin_delete(kin=instance)


class KinSessionCreateView(APIView):
    @extend_schema(request=SessionSerializer, responses={201: SessionSerializer})
    def post(self, request, kin_id):
        kin = selectors.kin_get(team=request_team(request), kin_id=kin_id)
        serializer = SessionSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        session = services.session_create(kin=kin, **serializer.validated_data)
        return Response(SessionSerializer(session).data, status=status.HTTP_201_CREATED)


class SessionViewSet(mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = SessionSerializer

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Session.objects.none()
        return selectors.session_list(team=request_team(self.request))


class SessionMessageListView(ListAPIView):
    """History of a session, oldest first."""

    serializer_class = MessageSerializer
    pagination_class = ChronologicalCursorPagination

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Event.objects.none()
        session = selectors.session_get(team=request_team(self.request), session_id=self.kwargs["session_id"])
        return selectors.message_list(session=session)


class SessionMessageImportView(APIView):
    @extend_schema(request=ImportSerializer, responses={201: ImportResultSerializer})
    def post(self, request, session_id):
        session = selectors.session_get(team=request_team(request), session_id=session_id)
        # A bare JSON list is accepted as well as {"messages": [...]}.
        data = {"messages": request.data} if isinstance(request.data, list) else request.data
        serializer = ImportSerializer(data=data)
        serializer.is_valid(raise_exception=True)
        items = [services.ImportItem(**item) for item in serializer.validated_data["messages"]]
        result = services.messages_import(session=session, items=items)
        return Response(ImportResultSerializer(result).data, status=status.HTTP_201_CREATED)


SEARCH_PARAMETERS = [
    OpenApiParameter("q", str, required=True, description="Search text (plain words; operators are ignored)."),
    OpenApiParameter("limit", int, required=False),
]


class _HistorySearchView(APIView):
    def search(self, request, **scope):
        params = HistorySearchQuerySerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        hits = selectors.history_search(
            query=params.validated_data["q"], limit=params.validated_data["limit"], **scope
        )
        return Response({"results": HistoryHitSerializer(hits, many=True).data})


class SessionHistorySearchView(_HistorySearchView):
    @extend_schema(parameters=SEARCH_PARAMETERS, responses={200: HistoryHitSerializer(many=True)})
    def get(self, request, session_id):
        session = selectors.session_get(team=request_team(request), session_id=session_id)
        return self.search(request, session=session)


class KinHistorySearchView(_HistorySearchView):
    @extend_schema(parameters=SEARCH_PARAMETERS, responses={200: HistoryHitSerializer(many=True)})
    def get(self, request, kin_id):
        kin = selectors.kin_get(team=request_team(request), kin_id=kin_id)
        return self.search(request, kin=kin)
