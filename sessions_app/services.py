"""Writes for kins, sessions and the event store."""
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from kinsite.dbstats import analyze_after_commit
from kinsite.errors import Conflict
from kinsite.models import Kin, Team
from kinsite.tokencount import count_tokens
from sessions_app.compaction import compaction_request, latest_summary
from sessions_app.models import Event, Session

KIN_EDITABLE_FIELDS = (
    "name",
    "role",
    "character",
    "expertise",
    "model",
    "history_token_budget",
    "parent",
    "spawn_reason",
    "overrides",
)


def kin_create(*, team: Team, name: str, **fields) -> Kin:
    unknown = set(fields) - set(KIN_EDITABLE_FIELDS)
    if unknown:
        raise TypeError(f"kin_create got unknown fields: {sorted(unknown)}")
    return Kin.objects.create(team=team, name=name, **fields)


def kin_update(*, kin: Kin, **fields) -> Kin:
    unknown = set(fields) - set(KIN_EDITABLE_FIELDS)
    if unknown:
        raise TypeError(f"kin_update got unknown fields: {sorted(unknown)}")
    for name, value in fields.items():
        setattr(kin, name, value)
    kin.save()
    return kin


def kin_delete(*, kin: Kin) -> None:
    kin.delete()


def session_create(*, kin: Kin, title: str = "", workflow=None) -> Session:
    """A new session; with `workflow` (one of the kin's team) its prompt carries CURRENT CANVAS."""
    return Session.objects.create(kin=kin, title=title, workflow=workflow)


class SessionArchived(Conflict):
    """A post or an import to an archived session: nothing is stored (409)."""

    code = "session_archived"


def session_check_open(*, session: Session) -> None:
    """Raise SessionArchived when `session` is archived. Callers pass the row they just read
    (one query fewer per turn); archiving between that read and the write lets one late
    post in, which is harmless."""
    if session.archived_at is not None:
        raise SessionArchived(
            f"Session {session.pk} is archived, so nothing can be posted to it. Unarchive it first: the "
            "Unarchive button on its dashboard page (team owners and admins), or "
            f'PATCH /api/v1/sessions/{session.pk}/ with {{"archived": false}}.',
            details={"session": session.pk, "archived_at": session.archived_at.isoformat()},
        )


def session_rename(*, session: Session, title: str | None = None, description: str | None = None) -> Session:
    """Set the title and/or the description (None: unchanged). Introspection keeps the
    description up to date; a person may correct it, and the next run reads the correction."""
    changed = {name: value for name, value in (("title", title), ("description", description)) if value is not None}
    for name, value in changed.items():
        setattr(session, name, value)
    if changed:
        session.save(update_fields=[*changed, "updated_at"])
    return session


def session_archive(*, session: Session) -> Session:
    """Archive `session` (hidden from its kin's list, read-only); already archived: unchanged."""
    if session.archived_at is None:
        session.archived_at = timezone.now()
        session.save(update_fields=["archived_at", "updated_at"])
    return session


def session_unarchive(*, session: Session) -> Session:
    if session.archived_at is not None:
        session.archived_at = None
        session.save(update_fields=["archived_at", "updated_at"])
    return session


@transaction.atomic
def session_update(*, session: Session, title: str | None = None, description: str | None = None,
                   archived: bool | None = None) -> Session:
    """Rename and/or archive or unarchive in one step (the API's PATCH); None: unchanged."""
    session_rename(session=session, title=title, description=description)
    if archived is True:
        session_archive(session=session)
    elif archived is False:
        session_unarchive(session=session)
    return session


def session_continue(*, session: Session, title: str = "", command: Event | None = None) -> Session:
    """The `/new` command: a new session for the same kin, opened by a system event that
    names the session it continues and its participants (people who posted there)."""
    new_session = session_create(kin=session.kin, title=title, workflow=session.workflow)
    participants = [
        {"name": sender, "platform": platform}
        for sender, platform in Event.objects.filter(session=session, kind=Event.Kind.MESSAGE, role=Event.Role.USER)
        .exclude(sender="")
        .values_list("sender", "platform")
        .distinct()
        .order_by("sender", "platform")
    ]
    names = ", ".join(sorted({person["name"] for person in participants})) or "nobody yet"
    text = f"Continues session {session.pk} of {session.kin.name} (participants: {names})."
    Event.objects.create(
        session=new_session, kind=Event.Kind.COMMAND, role=Event.Role.SYSTEM, content=text,
        token_count=count_tokens(text),
        data={"command": "new", "previous_session_id": session.pk, "participants": participants,
              "command_event_id": command.pk if command is not None else None},
    )
    return new_session


@dataclass(frozen=True)
class ImportItem:
    content: str
    sender: str = ""
    platform: str = Event.Platform.API
    role: str = Event.Role.USER
    created_at: datetime | None = None
    external_id: str | None = None


@dataclass(frozen=True)
class ImportResult:
    created: int
    skipped: int


@transaction.atomic
def messages_import(*, session: Session, items: list[ImportItem]) -> ImportResult:
    """Store messages without replies. An `external_id` already in the session (or repeated in
    the batch) is skipped, so re-importing changes nothing. Messages dated before the compaction
    boundary are folded into the summary by a compaction requested here."""
    session_check_open(session=session)
    wanted_ids = {item.external_id for item in items if item.external_id}
    seen = set(
        Event.objects.filter(session=session, external_id__in=wanted_ids).values_list("external_id", flat=True)
    )
    now = timezone.now()
    rows = []
    for item in items:
        if item.external_id:
            if item.external_id in seen:
                continue
            seen.add(item.external_id)
        rows.append(
            Event(
                session=session,
                kind=Event.Kind.MESSAGE,
                role=item.role,
                content=item.content,
                sender=item.sender,
                platform=item.platform,
                external_id=item.external_id or None,
                token_count=count_tokens(item.content),
                created_at=item.created_at or now,
            )
        )
    # ignore_conflicts covers a concurrent import of the same ids: the unique
    # constraint decides, and the loser's duplicates are dropped silently.
    Event.objects.bulk_create(rows, ignore_conflicts=True, batch_size=500)
    if rows:
        newest = max(row.created_at for row in rows)
        if newest > session.last_activity_at:
            Session.objects.filter(pk=session.pk).update(last_activity_at=newest)
        # Old messages do not make the session look active, but are still introspected.
        Session.objects.filter(pk=session.pk).update(introspection_pending=True)
        summary = latest_summary(session)
        if summary is not None and min(row.created_at for row in rows) < summary.last_event.created_at:
            # Dated inside summarised time: only a new summary brings them into the prompt.
            compaction_request(session=session)
        analyze_after_commit(Event, "sessions_app_searchposting")
    return ImportResult(created=len(rows), skipped=len(items) - len(rows))
