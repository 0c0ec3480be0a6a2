"""Writes for kins, sessions and the event store."""
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from kinsite.models import Team
from kinsite.tokencount import count_tokens
from sessions_app.models import Event, Kin, Session

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


def session_create(*, kin: Kin, title: str = "") -> Session:
    return Session.objects.create(kin=kin, title=title)


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
    """Store messages without replies. An `external_id` already in the session
    (or repeated within the batch) is skipped, so re-importing changes nothing."""
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
    return ImportResult(created=len(rows), skipped=len(items) - len(rows))
