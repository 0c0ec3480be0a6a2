"""Dashboard URLs: login/logout (un-namespaced, as settings name them) and the
pages under the "dashboard" namespace. A new page adds one path to `pages`."""
from django.contrib.auth import views as auth_views
from django.urls import include, path

from consolidation import views as consolidation_views
from erasure import views as erasure_views
from kinsite import views
from memories import views as memory_views
from sessions_app.views import (
    activity as activity_views,
    kins as kin_views,
    lifecycle as lifecycle_views,
    sessions as session_views,
)
from transfer import views as transfer_views
from workflows import views as workflow_views

pages = [
    path("", views.home, name="home"),
    path("kins/", kin_views.kin_list, name="kins"),
    path("kins/new/", kin_views.kin_create, name="kin_create"),
    path("kins/import/", transfer_views.kin_import_form, name="kin_import"),
    path("kins/<int:kin_id>/", kin_views.kin_detail, name="kin_detail"),
    path("kins/<int:kin_id>/activity/", activity_views.kin_activity, name="kin_activity"),
    path("kins/<int:kin_id>/edit/", kin_views.kin_edit, name="kin_edit"),
    path("kins/<int:kin_id>/export/", transfer_views.kin_export_download, name="kin_export"),
    path("kins/<int:kin_id>/sessions/new/", lifecycle_views.session_create, name="session_create"),
    path("kins/<int:kin_id>/memories/", memory_views.memory_list, name="memory_list"),
    path("kins/<int:kin_id>/memories/add/", memory_views.memory_add, name="memory_add"),
    path("kins/<int:kin_id>/memories/<int:memory_id>/", memory_views.memory_detail, name="memory_detail"),
    path("kins/<int:kin_id>/memories/<int:memory_id>/edit/", memory_views.memory_edit, name="memory_edit"),
    path("kins/<int:kin_id>/memories/<int:memory_id>/delete/", memory_views.memory_delete, name="memory_delete"),
    path("kins/<int:kin_id>/experience/", consolidation_views.experience, name="experience"),
    path(
        "kins/<int:kin_id>/experience/consolidate/",
        consolidation_views.experience_consolidate,
        name="experience_consolidate",
    ),
    path("kins/<int:kin_id>/facts/", consolidation_views.fact_list, name="fact_list"),
    path("sessions/<int:session_id>/", session_views.session_detail, name="session_detail"),
    path("sessions/<int:session_id>/post/", session_views.session_post, name="session_post"),
    path("sessions/<int:session_id>/stream/", session_views.session_post_stream, name="session_post_stream"),
    path("sessions/<int:session_id>/turns/<int:turn_id>/retry/", session_views.session_turn_retry,
         name="session_turn_retry"),
    path("sessions/<int:session_id>/turns/<int:turn_id>/", session_views.session_turn_entries,
         name="session_turn_entries"),
    path("sessions/<int:session_id>/preview/", session_views.session_prompt_preview, name="session_prompt_preview"),
    path("sessions/<int:session_id>/introspection/", session_views.session_introspection,
         name="session_introspection"),
    path("sessions/<int:session_id>/checkpoint/", session_views.session_checkpoint, name="session_checkpoint"),
    path("sessions/<int:session_id>/rename/", lifecycle_views.session_rename, name="session_rename"),
    path("sessions/<int:session_id>/archive/", lifecycle_views.session_archive, name="session_archive"),
    path("sessions/<int:session_id>/unarchive/", lifecycle_views.session_unarchive, name="session_unarchive"),
    path("workflows/", workflow_views.workflow_list, name="workflows"),
    path("workflows/<int:workflow_id>/", workflow_views.workflow_detail, name="workflow_detail"),
    path("workflows/<int:workflow_id>/run/", workflow_views.workflow_run, name="workflow_run"),
    # Client ids are free text (they may hold "/"), so they come last, as a path.
    path("workflows/<int:workflow_id>/nodes/<path:client_id>/", workflow_views.node_inspector,
         name="workflow_node"),
    path("workflows/<int:workflow_id>/lineage/<str:fmt>/<path:client_id>/", workflow_views.node_lineage_download,
         name="workflow_node_export"),
    path("activity/", activity_views.team_activity, name="activity"),
    path("model-calls/<int:model_call_id>/", views.model_call_detail, name="model_call_detail"),
    path("help/model/", views.model_help, name="model_help"),
    path("tokens/", views.token_list, name="tokens"),
    path("erasures/", erasure_views.erasure_page, name="erasures"),
    path("tokens/<int:token_id>/revoke/", views.token_revoke, name="token_revoke"),
]

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    # Django's LogoutView only accepts POST; base.html posts a small form with the CSRF token.
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", include((pages, "dashboard"))),
]
