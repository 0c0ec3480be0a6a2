"""The import: a kin document (transfer.format) written as a new kin of a team, every row
with a new id and every reference rewritten, in one transaction; the same document again
answers the kin it made the first time."""
from __future__ import annotations

import logging
import re
from typing import NamedTuple

from django.db import IntegrityError, models, transaction

from consolidation.models import Fact
from kinsite.dbstats import analyze_after_commit
from kinsite.errors import InvalidInput
from kinsite.models import Kin, Team
from memories.models import Memory, MemoryChange, MemoryTermCount
from sessions_app.api.serializers import KinSerializer
from sessions_app.models import Event, Turn
from transfer.format import (
    EVENT_DATA_REFS,
    SECTIONS,
    VERSION,
    Section,
    document_digest,
    document_errors,
    kin_editable,
    python_value,
    source_ref_current,
)
from transfer.models import KinImport

logger = logging.getLogger(__name__)

BATCH_SIZE = 500
IN_FLIGHT_TURN = (Turn.Status.PENDING, Turn.Status.RUNNING)
IN_FLIGHT_ERROR = "The turn was still in progress when its kin was exported; it is not run again after the import."


class DocumentInvalid(InvalidInput):
    code = "invalid_document"


class ImportResult(NamedTuple):
    kin: Kin
    created: bool  # False: this team had imported the same document before; `kin` is that kin


def kin_document_check(document) -> None:
    """Raise DocumentInvalid (400) naming every problem of `document` by its JSON path."""
    errors = document_errors(document)
    if errors:
        first = errors[0]
        more = f" (and {len(errors) - 1} more problems; see details)" if len(errors) > 1 else ""
        raise DocumentInvalid(
            f"The kin document is invalid: {first['path']}: {first['message']}{more}. Nothing was imported.",
            details={"errors": errors},
        )


def kin_import(*, team: Team, document) -> ImportResult:
    """Import `document` into `team` as a new kin; the kin made before when this team already
    imported the same document (by digest). Checks the whole document first (DocumentInvalid),
    so a bad one writes nothing; the writes are one transaction."""
    kin_document_check(document)
    digest = document_digest(document)
    previous = _previous_import(team=team, digest=digest)
    if previous is not None:
        return ImportResult(previous.kin, False)
    try:
        with transaction.atomic():
            kin = _write(team=team, document=document)
            KinImport.objects.create(team=team, kin=kin, digest=digest, format_version=VERSION,
                                     source_kin_id=document["kin"]["id"])
            transaction.on_commit(_reembed_soon)
            analyze_after_commit(Event, "sessions_app_searchposting", Memory, MemoryTermCount, MemoryChange, Fact)
    except IntegrityError as exc:
        # Two imports of one document at once: the unique (team, digest) lets one through,
        # and the other answers the kin the first made.
        previous = _previous_import(team=team, digest=digest)
        if previous is not None:
            return ImportResult(previous.kin, False)
        raise DocumentInvalid(f"The kin document conflicts with a database constraint: {exc}. Nothing was imported.",
                              details={"errors": [{"path": "$", "message": str(exc)}]}) from exc
    logger.info("Imported kin %s into team %s from document %s", kin.pk, team.slug, digest[:12])
    return ImportResult(kin, True)


def _previous_import(*, team: Team, digest: str) -> KinImport | None:
    return KinImport.objects.select_related("kin").filter(team=team, digest=digest).first()


def _reembed_soon() -> None:
    """Start re-embedding now rather than at the next beat check, when an embedding model is
    configured: the imported memories have no vectors (transfer.format says why)."""
    from memories.reembed import reembed_check

    try:
        reembed_check()
    except Exception:  # the beat check starts it later; the import itself has committed
        logger.warning("Could not start re-embedding after a kin import", exc_info=True)


def _time_fields(model: type[models.Model], names: tuple[str, ...]) -> list[str]:
    """The fields among `names` that Django stamps with now on insert (auto_now, auto_now_add):
    bulk_create overwrites them, so the import puts the document's times back afterwards."""
    return [
        name for name in names
        if getattr(model._meta.get_field(name), "auto_now", False)
        or getattr(model._meta.get_field(name), "auto_now_add", False)
    ]


def _write(*, team: Team, document: dict) -> Kin:
    """Rows are written section by section in SECTIONS order with bulk_create (the document
    is the kin's history as it was, not a replay of its writes); references to rows written
    later are filled in by one bulk_update per section at the end. Triggers (SQLite) and
    generated columns (PostgreSQL) keep the full-text indexes and message counts."""
    kin_row = document["kin"]
    serializer = KinSerializer(data=kin_editable(kin_row))
    serializer.is_valid(raise_exception=True)  # checked already; this gives the cleaned values
    kin = Kin.objects.create(team=team, **serializer.validated_data)
    kin_times = {name: python_value(Kin._meta.get_field(name), kin_row[name]) for name in ("created_at", "updated_at")}
    Kin.objects.filter(pk=kin.pk).update(**kin_times)
    for name, value in kin_times.items():
        setattr(kin, name, value)

    new_ids: dict[str, dict[int, int]] = {}
    written: dict[str, list[tuple[dict, models.Model]]] = {}
    for section in SECTIONS:
        pairs = [(row, _new_row(section, row, kin=kin, new_ids=new_ids)) for row in document[section.key]]
        section.model.objects.bulk_create([obj for _row, obj in pairs], batch_size=BATCH_SIZE)
        new_ids[section.key] = {row["id"]: obj.pk for row, obj in pairs}
        written[section.key] = pairs

    for section in SECTIONS:
        _fill_in_later_references(section, written[section.key], new_ids)
    _rewrite_event_data(written["events"], new_ids)
    _rewrite_session_refs(written, new_ids)
    return kin


def _new_row(section: Section, row: dict, *, kin: Kin, new_ids: dict[str, dict[int, int]]) -> models.Model:
    model = section.model
    values = {name: python_value(model._meta.get_field(name), row[name]) for name in section.fields}
    field_names = {f.name for f in model._meta.get_fields()}
    if "kin" in field_names and "kin" not in section.refs:
        values["kin"] = kin
    if "team" in field_names:
        values["team"] = kin.team
    for name, (target, _nullable) in section.refs.items():
        # Targets written already are mapped now; the rest in _fill_in_later_references.
        old = row[name]
        values[f"{name}_id"] = new_ids[target][old] if old is not None and target in new_ids else None
    for name, target in section.id_lists.items():
        values[name] = [new_ids[target][old] for old in row[name]]
    if section.key in ("memories", "facts"):
        values["source_ref"] = _kin_ref_rewritten(source_ref_current(values["source"], values["source_ref"]), kin)
    if section.key == "memory_changes":
        values["actor"] = _kin_ref_rewritten(values["actor"], kin)
        values["before"] = _snapshot_rewritten(values["before"], kin=kin, memory_ids=new_ids["memories"])
        values["after"] = _snapshot_rewritten(values["after"], kin=kin, memory_ids=new_ids["memories"])
    if section.key == "turns" and values["status"] in IN_FLIGHT_TURN:
        # A turn in flight at export time must not become work here: the sweeps would run a
        # pending turn again (a model call) in the importing installation.
        values.update(status=Turn.Status.FAILED, error=IN_FLIGHT_ERROR,
                      finished_at=values["finished_at"] or values["started_at"] or values["created_at"])
    return model(**values)


# "kin:4", "event:345", "turn:17" inside a writer text (an actor may name two: "kin:4 turn:17").
_ROW_REF = re.compile(r"\b(kin|event|turn):(\d+)\b")
_ROW_REF_SECTIONS = {"event": "events", "turn": "turns"}


def _kin_ref_rewritten(text: str, kin: Kin) -> str:
    """`text` naming the new kin where it named the document's. Only a kin's own rows name
    a kin, so any kin:<id> in them is this one (its id in the source installation)."""
    return _ROW_REF.sub(lambda m: f"kin:{kin.pk}" if m.group(1) == "kin" else m.group(0), text)


def _snapshot_rewritten(snapshot: dict, *, kin: Kin, memory_ids: dict[int, int]) -> dict:
    """A change's before/after with its kin and superseded_by as the new ids (a shared
    memory's kin is null and stays so; a memory the document does not carry keeps its id)."""
    snapshot = dict(snapshot)
    if isinstance(snapshot.get("kin"), int):
        snapshot["kin"] = kin.pk
    if snapshot.get("superseded_by") in memory_ids:
        snapshot["superseded_by"] = memory_ids[snapshot["superseded_by"]]
    return snapshot


def _rewrite_session_refs(written: dict[str, list[tuple[dict, models.Model]]],
                          new_ids: dict[str, dict[int, int]]) -> None:
    """Writer texts naming a message or a turn the document carries ("event:345" on a memory a
    turn wrote, "kin:4 turn:17" on its change) name the new row; written after the sessions."""
    if not new_ids["events"] and not new_ids["turns"]:
        return

    def rewritten(text: str) -> str:
        def one(match: re.Match) -> str:
            ids = new_ids.get(_ROW_REF_SECTIONS.get(match.group(1), ""), {})
            old = int(match.group(2))
            return f"{match.group(1)}:{ids[old]}" if old in ids else match.group(0)
        return _ROW_REF.sub(one, text)

    for model, key, name in ((Memory, "memories", "source_ref"), (Fact, "facts", "source_ref"),
                             (MemoryChange, "memory_changes", "actor")):
        changed = []
        for _row, obj in written[key]:
            text = rewritten(getattr(obj, name))
            if text != getattr(obj, name):
                setattr(obj, name, text[:200])
                changed.append(obj)
        model.objects.bulk_update(changed, [name], batch_size=BATCH_SIZE)


def _fill_in_later_references(section: Section, pairs: list[tuple[dict, models.Model]],
                              new_ids: dict[str, dict[int, int]]) -> None:
    later = [name for name, (target, _nullable) in section.refs.items() if target in _targets_after(section)]
    times = _time_fields(section.model, section.fields)
    if not pairs or not (later or times):
        return
    for row, obj in pairs:
        for name in later:
            target = section.refs[name][0]
            setattr(obj, f"{name}_id", new_ids[target][row[name]] if row[name] is not None else None)
        for name in times:
            setattr(obj, name, python_value(section.model._meta.get_field(name), row[name]))
    # bulk_update writes the attributes as they are (no auto_now), unlike save().
    section.model.objects.bulk_update([obj for _row, obj in pairs], [*(f"{n}_id" for n in later), *times],
                                      batch_size=BATCH_SIZE)


def _targets_after(section: Section) -> set[str]:
    """The sections written at or after `section` (itself included: self-references)."""
    keys = [s.key for s in SECTIONS]
    return set(keys[keys.index(section.key):])


def _rewrite_event_data(pairs: list[tuple[dict, models.Model]], new_ids: dict[str, dict[int, int]]) -> None:
    """The ids inside events' data (a command's reply_to, an introspection end's cursor
    last_event_id, a tool step's turn...) are the document's until here."""
    changed = []
    for row, obj in pairs:
        data = row["data"]
        if not any(data.get(key) is not None for key in EVENT_DATA_REFS) and not data.get("memories"):
            continue
        data = dict(data)
        for key, target in EVENT_DATA_REFS.items():
            if data.get(key) is not None:
                data[key] = new_ids[target][data[key]]
        if isinstance(data.get("memories"), list):
            data["memories"] = [
                {**item, "id": new_ids["memories"][item["id"]] if item.get("id") is not None else None}
                for item in data["memories"]
            ]
        obj.data = data
        changed.append(obj)
    Event.objects.bulk_update(changed, ["data"], batch_size=BATCH_SIZE)
