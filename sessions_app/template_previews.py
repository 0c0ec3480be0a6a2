"""The admin's template previews for the jobs of sessions_app (compaction, introspection):
the chosen session of a kin (its most recently active one by default), rendered by the
job's own prompt code with the unsaved template text. Registered in SessionsAppConfig.ready()."""
from kinsite.errors import InvalidInput
from kinsite.models import Kin
from kinsite.prompt_templates import TemplatePreview, TemplatePreviewer, template_preview_of
from sessions_app.compaction import compaction_preview
from sessions_app.introspection.converse import introspection_preview
from sessions_app.models import Session

SESSIONS_OFFERED = 50


def preview_sessions(kin: Kin) -> list[tuple[int, str]]:
    """The kin's sessions to preview with, most recently active first: (id, label)."""
    sessions = Session.objects.filter(kin=kin).order_by("-last_activity_at", "-id")[:SESSIONS_OFFERED]
    return [(session.pk, f"{session} (#{session.pk}, active {session.last_activity_at:%Y-%m-%d %H:%M})")
            for session in sessions]


def _session(kin: Kin, session_id: int | None) -> Session:
    sessions = Session.objects.filter(kin=kin).select_related("kin__team")
    if session_id is None:
        session = sessions.order_by("-last_activity_at", "-id").first()
        if session is None:
            raise InvalidInput(f"{kin.name} has no session to preview with.")
        return session
    session = sessions.filter(pk=session_id).first()
    if session is None:
        # Whether the id exists elsewhere is not said: it may be another team's.
        raise InvalidInput(f"Session {session_id} is not a session of {kin.name}: choose one of its sessions, "
                           "or none for its most recently active one.")
    return session


def _notes(session: Session, notes: list[str]) -> list[str]:
    return [f"Session: {session} (#{session.pk}).", *notes]


def compaction_template_preview(*, body: str, kin: Kin, session_id: int | None) -> TemplatePreview:
    session = _session(kin, session_id)
    messages, notes = compaction_preview(session=session, template_body=body)
    return template_preview_of(messages, _notes(session, notes))


def introspection_template_preview(*, body: str, kin: Kin, session_id: int | None) -> TemplatePreview:
    session = _session(kin, session_id)
    messages, notes = introspection_preview(session=session, template_body=body)
    return template_preview_of(messages, _notes(session, notes))


PREVIEWERS = {
    "compaction": TemplatePreviewer(render=compaction_template_preview, sessions=preview_sessions),
    "introspection": TemplatePreviewer(render=introspection_template_preview, sessions=preview_sessions),
}
