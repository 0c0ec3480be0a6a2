from django.urls import path
from rest_framework.routers import SimpleRouter

from sessions_app.api import views

router = SimpleRouter()
router.register("kins", views.KinViewSet, basename="kin")
router.register("sessions", views.SessionViewSet, basename="session")

urlpatterns = [
    path("kins/<int:kin_id>/sessions/", views.KinSessionListView.as_view(), name="kin-sessions"),
    path("kins/<int:kin_id>/history/search/", views.KinHistorySearchView.as_view(), name="kin-history-search"),
    path("sessions/<int:session_id>/messages/", views.SessionMessageListView.as_view(), name="session-messages"),
    path(
        "sessions/<int:session_id>/messages/import/",
        views.SessionMessageImportView.as_view(),
        name="session-messages-import",
    ),
    path(
        "sessions/<int:session_id>/history/search/",
        views.SessionHistorySearchView.as_view(),
        name="session-history-search",
    ),
    path("sessions/<int:session_id>/prompt/", views.SessionPromptPreviewView.as_view(), name="session-prompt"),
    path("sessions/<int:session_id>/checkpoint/", views.SessionCheckpointView.as_view(), name="session-checkpoint"),
    path(
        "sessions/<int:session_id>/introspections/",
        views.SessionIntrospectionListView.as_view(),
        name="session-introspections",
    ),
    path("turns/<int:turn_id>/", views.TurnDetailView.as_view(), name="turn-detail"),
    path("turns/<int:turn_id>/events/", views.TurnEventsView.as_view(), name="turn-events"),
    path("turns/<int:turn_id>/retry/", views.TurnRetryView.as_view(), name="turn-retry"),
    *router.urls,
]
