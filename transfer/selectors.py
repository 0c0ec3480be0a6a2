"""The export: a kin's rows read into one kin document (transfer.format describes it)."""
from __future__ import annotations

from django.utils import timezone

from consolidation.models import ConsolidationRun
from kinsite.models import Kin
from memories.models import MemoryChange
from sessions_app.models import Event, Summary, Turn
from transfer.format import (
    EVENT_DATA_DROPPED,
    EVENT_DATA_REFS,
    FORMAT,
    KIN_FIELDS,
    SECTIONS,
    SESSION_SECTIONS,
    VERSION,
    Section,
    dump_value,
)


def _querysets(kin: Kin) -> dict:
    """Each section's rows of the kin, in id order (so a document is the same every time)."""
    return {
        "prompt_templates": kin.prompt_templates.all(),
        "memories": kin.memories.all(),
        "memory_changes": MemoryChange.objects.filter(memory__kin=kin),
        "sessions": kin.sessions.all(),
        "events": Event.objects.filter(session__kin=kin),
        "turns": Turn.objects.filter(session__kin=kin),
        "summaries": Summary.objects.filter(session__kin=kin),
        "facts": kin.facts.all(),
        # Only applied runs: they made the experience versions and consolidated the facts;
        # the others are the installation's audit of attempts (transfer.format).
        "consolidation_runs": kin.consolidation_runs.filter(status=ConsolidationRun.Status.APPLIED),
        "experience_versions": kin.experience_versions.all(),
    }


def kin_export_document(*, kin: Kin, include_sessions: bool = False) -> dict:
    """The kin document of `kin` (its team's check is the caller's); sessions, their events,
    turns and summaries only with `include_sessions`, since they are most of the size."""
    querysets = _querysets(kin)
    rows: dict[str, list[dict]] = {}
    for section in SECTIONS:
        if section.key in SESSION_SECTIONS and not include_sessions:
            rows[section.key] = []
            continue
        rows[section.key] = [_row(section, obj) for obj in querysets[section.key].order_by("pk").iterator(2000)]
    _drop_outside_references(rows)
    return {
        "format": FORMAT,
        "version": VERSION,
        "exported_at": timezone.now().isoformat(),
        "includes_sessions": include_sessions,
        "kin": {"id": kin.pk, **{name: dump_value(getattr(kin, name)) for name in KIN_FIELDS}},
        **rows,
    }


def _row(section: Section, obj) -> dict:
    row = {"id": obj.pk}
    for name in section.fields:
        row[name] = dump_value(getattr(obj, name))
    for name in section.refs:
        # seen_through is a plain id column (seen_through_id), the others foreign keys.
        row[name] = getattr(obj, f"{name}_id")
    for name in section.id_lists:
        row[name] = list(getattr(obj, name) or [])
    return row


def _drop_outside_references(rows: dict[str, list[dict]]) -> None:
    """References to rows the document does not hold become null (a memory superseded by a
    team-shared one, a run's template of the team, an event id inside data of a session not
    exported), so every reference a document carries resolves inside it."""
    ids = {key: {row["id"] for row in section_rows} for key, section_rows in rows.items()}
    for section in SECTIONS:
        for row in rows[section.key]:
            for name, (target, _nullable) in section.refs.items():
                if row[name] is not None and row[name] not in ids[target]:
                    row[name] = None
            for name, target in section.id_lists.items():
                row[name] = [value for value in row[name] if value in ids[target]]
    for event in rows["events"]:
        data = event["data"]
        if not data:
            continue
        data = dict(data)
        for key, target in EVENT_DATA_REFS.items():
            if key in data and data[key] is not None and data[key] not in ids[target]:
                data[key] = None
        for key in EVENT_DATA_DROPPED:
            if key in data:
                data[key] = None
        if isinstance(data.get("memories"), list):
            data["memories"] = [
                {**item, "id": item.get("id") if item.get("id") in ids["memories"] else None}
                if isinstance(item, dict) else item
                for item in data["memories"]
            ]
        event["data"] = data
