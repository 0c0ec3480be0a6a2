"""sessions_app's dashboard pages: the kins, a session's page and what it posts, starting and
managing sessions, the activity pages. The project URLconf (kinsite/urls.py) puts them under
the "dashboard" namespace."""
from django.urls import path

from sessions_app.views import activity, kins, lifecycle, sessions

urlpatterns = [
    path("kins/", kins.kin_list, name="kins"),
    path("kins/new/", kins.kin_create, name="kin_create"),
    path("kins/<int:kin_id>/", kins.kin_detail, name="kin_detail"),
    path("kins/<int:kin_id>/edit/", kins.kin_edit, name="kin_edit"),
    path("kins/<int:kin_id>/activity/", activity.kin_activity, name="kin_activity"),
    path("kins/<int:kin_id>/sessions/new/", lifecycle.session_create, name="session_create"),
    path("sessions/<int:session_id>/", sessions.session_detail, name="session_detail"),
    path("sessions/<int:session_id>/post/", sessions.session_post, name="session_post"),
    path("sessions/<int:session_id>/stream/", sessions.session_post_stream, name="session_post_stream"),
    path("sessions/<int:session_id>/turns/<int:turn_id>/retry/", sessions.session_turn_retry,
         name="session_turn_retry"),
    path("sessions/<int:session_id>/turns/<int:turn_id>/", sessions.session_turn_entries,
         name="session_turn_entries"),
    path("sessions/<int:session_id>/preview/", sessions.session_prompt_preview, name="session_prompt_preview"),
    path("sessions/<int:session_id>/introspection/", sessions.session_introspection,
         name="session_introspection"),
    path("sessions/<int:session_id>/checkpoint/", sessions.session_checkpoint, name="session_checkpoint"),
    path("sessions/<int:session_id>/rename/", lifecycle.session_rename, name="session_rename"),
    path("sessions/<int:session_id>/archive/", lifecycle.session_archive, name="session_archive"),
    path("sessions/<int:session_id>/unarchive/", lifecycle.session_unarchive, name="session_unarchive"),
    path("activity/", activity.team_activity, name="activity"),
]
