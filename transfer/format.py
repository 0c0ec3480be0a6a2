"""The kin document: one JSON file that carries a kin from one installation to another
(a move, or a backup). This module is its definition and its validator; the export
(transfer.selectors) and the import (transfer.services) both follow the tables below.

Format "kinsite.kin", version 1. Top-level keys, all required:

    format              "kinsite.kin"
    version             1
    exported_at         ISO 8601 time of the export (informational)
    includes_sessions   true when sessions, events, turns and summaries were exported (?sessions=1)
    kin                 the kin's identity and settings: name, role, character, expertise, model,
                        history_token_budget, spawn_reason, overrides, created_at, updated_at
    prompt_templates    the kin's own prompt templates (introspection, consolidation, compaction)
    memories            the kin's memories, every status (active, superseded, deleted)
    memory_changes      the immutable change log of those memories (before/after, actor, reason)
    facts               the kin's fact ledger
    consolidation_runs  the consolidations that were applied (they made the experience versions)
    experience_versions every version of the kin's experience document
    sessions            the kin's sessions (empty unless includes_sessions)
    events              every event of those sessions: messages, tool calls and results,
                        commands, introspection and compaction markers
    turns               the chat turns of those sessions (the dashboard groups tool steps by them)
    summaries           the compaction summaries of those sessions

Every row has an "id", unique in its list; references between rows are those ids ("memory":
12 in a memory change is the memory whose "id" is 12). The import gives every row a new id
and rewrites each reference, also the ids the application stores inside an event's "data"
(EVENT_DATA_REFS, and memories[].id). Times are ISO 8601 with an offset.

Left out, as they belong to the installation rather than to the kin:
- memory vectors: the importing installation embeds with its own model (memories.reembed;
  until then memory search is full-text only);
- the kin's parent and a session's workflow (rows of the source team): left empty, the
  spawn reason stays;
- the team's shared memories and templates, API tokens, users (a change's actor stays as
  text), the LLM call log, introspection and compaction runs, unapplied consolidation runs,
  activity and admin audit. Their ids inside an event's data (EVENT_DATA_DROPPED) are null.

Texts that name a writer (kinsite.actors: a memory's or fact's "source_ref", a change's
"actor") and the "kin" and "superseded_by" of change snapshots name rows by id too. The
import rewrites those the document carries (the kin, its memories, and with sessions its
messages "event:345" and turns "turn:17"); the rest ("token:ks_ab12", "user:maria",
"introspection_run:12") name the source installation and stay verbatim. Older documents
may carry a memory's source_ref as a bare token prefix (source "api") or "create_demo",
read as "token:<prefix>" and "command:create_demo".

A turn still pending or running is imported as failed, so the importing installation never
runs it again. document_errors reads the whole document before anything is written and
names each problem by its JSON path ("memories[3].importance").
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from dataclasses import dataclass, field

from django.core.exceptions import ValidationError
from django.db import models
from django.utils.dateparse import parse_date, parse_datetime

from consolidation.models import ConsolidationRun, ExperienceVersion, Fact
from kinsite.actors import WRITER_KINDS, writer_ref_parse
from kinsite.models import Kin, PromptTemplate
from kinsite.prompt_templates import template_validate
from kinsite.services import TOKEN_PREFIX
from memories.models import Memory, MemoryChange
from sessions_app.api.serializers import KinSerializer, imported_sender_problem, imported_time_problem
from sessions_app.models import Event, Session, Summary, Turn

FORMAT = "kinsite.kin"
VERSION = 1
# Problems listed in one 400 answer; the first is named in its message.
MAX_ERRORS = 20


@dataclass(frozen=True)
class Section:
    """One top-level list of the document: rows of `model` with `fields` copied as they are
    and `refs` (document key → the section its ids point into, and whether it may be null).
    `id_lists` are JSON lists of ids of another section (a consolidation's fact ids)."""

    key: str
    model: type[models.Model]
    fields: tuple[str, ...]
    refs: dict[str, tuple[str, bool]] = field(default_factory=dict)
    id_lists: dict[str, str] = field(default_factory=dict)


KIN_FIELDS = ("name", "role", "character", "expertise", "model", "history_token_budget", "spawn_reason",
              "overrides", "created_at", "updated_at")

# In import order: every reference that is not null-able points to a section before it.
SECTIONS = (
    Section("prompt_templates", PromptTemplate, ("kind", "name", "body", "is_active", "created_at", "updated_at")),
    Section(
        "memories", Memory,
        ("category", "content", "subject", "importance", "status", "source", "source_ref", "retrieval_count",
         "last_retrieved_at", "created_at", "updated_at"),
        refs={"superseded_by": ("memories", True)},
    ),
    Section("memory_changes", MemoryChange, ("action", "before", "after", "actor", "reason", "created_at"),
            refs={"memory": ("memories", False)}),
    Section(
        "sessions", Session,
        ("title", "description", "working_memory", "created_at", "updated_at", "last_activity_at",
         "introspection_pending", "turns_since_introspection", "archived_at"),
    ),
    Section("events", Event,
            ("kind", "role", "content", "sender", "platform", "external_id", "token_count", "data", "created_at"),
            refs={"session": ("sessions", False)}),
    Section(
        "turns", Turn,
        ("status", "is_async", "error", "tool_calls", "prompt_tokens", "tokens_in", "tokens_out", "attempts",
         "created_at", "started_at", "finished_at"),
        refs={"session": ("sessions", False), "user_message": ("events", True), "reply": ("events", True)},
    ),
    Section(
        "summaries", Summary,
        ("content", "first_at", "last_at", "message_count", "token_count", "created_at"),
        refs={"session": ("sessions", False), "first_event": ("events", False), "last_event": ("events", False),
              "previous": ("summaries", True), "seen_through": ("events", True)},
    ),
    Section(
        "facts", Fact,
        ("statement", "category", "source", "source_ref", "status", "is_consolidated", "created_at"),
        refs={"memory": ("memories", True), "consolidated_by_run": ("consolidation_runs", True),
              "superseded_by_run": ("consolidation_runs", True)},
    ),
    Section(
        "consolidation_runs", ConsolidationRun,
        ("trigger", "status", "night", "template_source", "max_words", "summary_of_changes", "word_count",
         "tokens_in", "tokens_out", "duration_ms", "created_at", "started_at", "finished_at"),
        refs={"template": ("prompt_templates", True), "experience_version": ("experience_versions", True)},
        id_lists={"processed_fact_ids": "facts", "superseded_fact_ids": "facts"},
    ),
    Section("experience_versions", ExperienceVersion, ("version", "markdown", "word_count", "created_at"),
            refs={"run": ("consolidation_runs", True)}),
)
SECTION_BY_KEY = {section.key: section for section in SECTIONS}
SESSION_SECTIONS = ("sessions", "events", "turns", "summaries")
TOP_LEVEL_KEYS = ("format", "version", "exported_at", "includes_sessions", "kin", *SECTION_BY_KEY)

# Ids the application keeps inside an event's data, and the section each points into.
EVENT_DATA_REFS = {
    "reply_to": "events",
    "first_event_id": "events",
    "last_event_id": "events",
    "command_event_id": "events",
    "turn": "turns",
    "previous_session_id": "sessions",
    "new_session_id": "sessions",
}
# Ids of rows that are not exported (introspection runs): always null in a document.
EVENT_DATA_DROPPED = ("run", "introspection_run_id")


# A token's stored prefix: TOKEN_PREFIX and the first characters of a URL-safe secret.
_BARE_TOKEN_PREFIX = re.compile(rf"{TOKEN_PREFIX}[A-Za-z0-9_-]{{1,13}}")


def source_ref_current(source: str, text: str) -> str:
    """A memory's or a fact's source_ref in the one writer format, older shapes read as the
    module docstring says; ValueError for any other text."""
    if not text or writer_ref_parse(text) is not None:
        return text
    if text == "create_demo":
        return "command:create_demo"
    if source == "api" and _BARE_TOKEN_PREFIX.fullmatch(text):
        return f"token:{text}"
    raise ValueError(f"must be empty or '<kind>:<value>' with a kind of {', '.join(WRITER_KINDS)}")


def document_digest(document: dict) -> str:
    """SHA-256 of the document's canonical JSON: the key of the import record."""
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


# --- values ----------------------------------------------------------------------------------


def dump_value(value):
    """A model value as JSON: times as ISO 8601 (with their offset), the rest as they are."""
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    return value


def load_value(model_field: models.Field, value):
    """A document value as the model field's Python value, or ValueError saying what is wrong.
    Types are checked strictly (no "5" for 5): Django's to_python would coerce them."""
    if value is None:
        if model_field.null:
            return None
        raise ValueError("must not be null")
    if isinstance(model_field, models.BooleanField):
        if not isinstance(value, bool):
            raise ValueError("must be true or false")
    elif isinstance(model_field, models.DateTimeField):
        parsed = parse_datetime(value) if isinstance(value, str) else None
        if parsed is None or parsed.tzinfo is None:
            raise ValueError("must be an ISO 8601 time with an offset, e.g. 2026-03-02T09:15:00+00:00")
        # Every time a kin document carries is of something that happened (the API's rule).
        problem = imported_time_problem(parsed)
        if problem:
            raise ValueError(problem)
        value = parsed
    elif isinstance(model_field, models.DateField):
        parsed = parse_date(value) if isinstance(value, str) else None
        if parsed is None:
            raise ValueError("must be an ISO 8601 date, e.g. 2026-03-02")
        value = parsed
    elif isinstance(model_field, models.IntegerField):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError("must be an integer")
    elif isinstance(model_field, models.JSONField):
        expected = type(model_field.get_default())
        if not isinstance(value, expected):
            raise ValueError(f"must be a JSON {'object' if expected is dict else 'array'}")
    elif isinstance(model_field, (models.CharField, models.TextField)) and not isinstance(value, str):
        raise ValueError("must be a string")
    # Lengths, choices, blank and the model's validators (importance 1-10, integer ranges).
    try:
        model_field.clean(value, None)
    except ValidationError as exc:
        raise ValueError(" ".join(str(message) for message in exc.messages)) from None
    return value


def python_value(model_field: models.Field, value):
    """A value load_value has accepted, as the model field's Python value (times parsed)."""
    if value is None:
        return None
    if isinstance(model_field, models.DateTimeField):
        return parse_datetime(value)
    if isinstance(model_field, models.DateField):
        return parse_date(value)
    return value


# --- validation ------------------------------------------------------------------------------


class _Errors(list):
    def add(self, path: str, message: str) -> None:
        if len(self) < MAX_ERRORS:
            self.append({"path": path, "message": message})


def _check_keys(errors: _Errors, path: str, row: dict, expected: tuple[str, ...]) -> bool:
    missing = [key for key in expected if key not in row]
    unknown = sorted(set(row) - set(expected))
    for key in missing:
        errors.add(f"{path}.{key}", "is missing")
    for key in unknown:
        errors.add(f"{path}.{key}", "is not a key of this format version")
    return not missing and not unknown


def document_header_errors(document) -> list[dict]:
    """The checks that tell a kin document of this version from anything else; run first,
    so another format is named as such rather than as a hundred missing keys."""
    errors = _Errors()
    if not isinstance(document, dict):
        errors.add("$", "The document must be a JSON object.")
        return errors
    if document.get("format") != FORMAT:
        errors.add("format", f"must be {FORMAT!r}: this is not a Kinsite kin document")
    elif document.get("version") != VERSION:
        errors.add("version", f"version {document.get('version')!r} is not supported; this installation "
                              f"reads version {VERSION}")
    return errors


def document_errors(document) -> list[dict]:
    """Every problem of the document (up to MAX_ERRORS), each {"path", "message"}; [] when it
    can be imported as it is. Reads nothing from the database."""
    errors = _Errors(document_header_errors(document))
    if errors:
        return errors
    if not _check_keys(errors, "$", document, TOP_LEVEL_KEYS):
        return errors
    if not isinstance(document["includes_sessions"], bool):
        errors.add("includes_sessions", "must be true or false")
    if not isinstance(document["exported_at"], str) or parse_datetime(document["exported_at"]) is None:
        errors.add("exported_at", "must be an ISO 8601 time")
    _kin_errors(errors, document["kin"])
    ids: dict[str, dict[int, dict]] = {}
    for section in SECTIONS:
        ids[section.key] = _section_rows(errors, section, document[section.key])
    if document["includes_sessions"] is False:
        for key in SESSION_SECTIONS:
            if document[key]:
                errors.add(key, "must be empty when includes_sessions is false")
    if errors:
        return errors
    for section in SECTIONS:
        _reference_errors(errors, section, ids)
    if not errors:  # the cross-row checks follow references, so only once they all resolve
        _consistency_errors(errors, ids)
    return errors


def _kin_errors(errors: _Errors, kin) -> None:
    if not isinstance(kin, dict):
        errors.add("kin", "must be a JSON object")
        return
    if not _check_keys(errors, "kin", kin, ("id", *KIN_FIELDS)):
        return
    _id_error(errors, "kin.id", kin["id"])
    typed = True
    for name in KIN_FIELDS:
        try:
            load_value(Kin._meta.get_field(name), kin[name])
        except ValueError as exc:
            errors.add(f"kin.{name}", str(exc))
            typed = False
    if typed:
        # The kin's own rules (one-line names, bounded texts, known overrides) are the API's.
        serializer = KinSerializer(data=kin_editable(kin))
        if not serializer.is_valid():
            for name, messages in serializer.errors.items():
                for message in messages if isinstance(messages, list) else [messages]:
                    errors.add(f"kin.{name}", str(message))


def kin_editable(kin: dict) -> dict:
    """The kin's fields a client may set (KinSerializer's), from its document object."""
    return {name: kin[name] for name in KIN_FIELDS if name not in ("created_at", "updated_at")}


def _id_error(errors: _Errors, path: str, value) -> bool:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        errors.add(path, "must be a positive integer id")
        return True
    return False


def _section_rows(errors: _Errors, section: Section, rows) -> dict[int, dict]:
    """The section's rows by id, after checking each row's keys and values."""
    by_id: dict[int, dict] = {}
    if not isinstance(rows, list):
        errors.add(section.key, "must be a JSON array")
        return by_id
    expected = ("id", *section.fields, *section.refs, *section.id_lists)
    for index, row in enumerate(rows):
        path = f"{section.key}[{index}]"
        if not isinstance(row, dict):
            errors.add(path, "must be a JSON object")
            continue
        if not _check_keys(errors, path, row, expected):
            continue
        if not _id_error(errors, f"{path}.id", row["id"]):
            if row["id"] in by_id:
                errors.add(f"{path}.id", f"id {row['id']} appears twice in {section.key}")
            by_id[row["id"]] = row
        for name in section.fields:
            try:
                load_value(section.model._meta.get_field(name), row[name])
            except ValueError as exc:
                errors.add(f"{path}.{name}", str(exc))
        kind_known = row.get("kind") in PromptTemplate.Kind.values and isinstance(row.get("body"), str)
        if section.key == "prompt_templates" and kind_known:
            for problem in template_validate(row["kind"], row["body"]):
                errors.add(f"{path}.body", problem)
        if section.key in ("memories", "facts") and isinstance(row["source_ref"], str):
            try:
                source_ref_current(row["source"], row["source_ref"])
            except ValueError as exc:
                errors.add(f"{path}.source_ref", str(exc))
        if section.key == "events" and isinstance(row["data"], dict):
            _event_data_shape_errors(errors, f"{path}.data", row["data"])
        if section.key == "events" and isinstance(row["sender"], str):
            problem = imported_sender_problem(row["sender"])  # the message import's rule
            if problem:
                errors.add(f"{path}.sender", problem)
    return by_id


def _event_data_shape_errors(errors: _Errors, path: str, data: dict) -> None:
    for key in EVENT_DATA_REFS:
        value = data.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            errors.add(f"{path}.{key}", "must be an id (an integer) or null")
    for key in EVENT_DATA_DROPPED:
        if data.get(key) is not None:
            errors.add(f"{path}.{key}", "must be null: the rows it named are not part of a kin document")
    memories = data.get("memories")
    if memories is not None and (not isinstance(memories, list) or not all(
        isinstance(item, dict) and (item.get("id") is None or type(item.get("id")) is int) for item in memories
    )):
        errors.add(f"{path}.memories", "must be a list of objects whose id is a memory id or null")


def _reference_errors(errors: _Errors, section: Section, ids: dict[str, dict[int, dict]]) -> None:
    for index, row in enumerate(_rows_in_order(ids[section.key])):
        path = f"{section.key}[{index}]"
        for name, (target, nullable) in section.refs.items():
            value = row[name]
            if value is None:
                if not nullable:
                    errors.add(f"{path}.{name}", "must not be null")
            elif isinstance(value, bool) or not isinstance(value, int) or value not in ids[target]:
                errors.add(f"{path}.{name}", f"{value!r} is not the id of a row in {target}")
        for name, target in section.id_lists.items():
            values = row[name]
            if not isinstance(values, list) or any(
                isinstance(value, bool) or not isinstance(value, int) or value not in ids[target] for value in values
            ):
                errors.add(f"{path}.{name}", f"must be a list of ids of rows in {target}")
        if section.key == "events":
            data = row["data"]
            for key, target in EVENT_DATA_REFS.items():
                if data.get(key) is not None and data[key] not in ids[target]:
                    errors.add(f"{path}.data.{key}", f"{data[key]!r} is not the id of a row in {target}")
            for position, item in enumerate(data.get("memories") or []):
                if item.get("id") is not None and item["id"] not in ids["memories"]:
                    errors.add(f"{path}.data.memories[{position}].id",
                               f"{item['id']!r} is not the id of a row in memories")


def _rows_in_order(by_id: dict[int, dict]) -> list[dict]:
    # Rows were put in by_id in document order, so positions match the document's indexes
    # (a duplicate id is refused before references are checked).
    return list(by_id.values())


def _consistency_errors(errors: _Errors, ids: dict[str, dict[int, dict]]) -> None:
    """What the database's constraints or the application assume across rows."""
    events = ids["events"]
    for index, summary in enumerate(_rows_in_order(ids["summaries"])):
        for name in ("first_event", "last_event"):
            if events[summary[name]]["session"] != summary["session"]:
                errors.add(f"summaries[{index}].{name}", "must be an event of the summary's session")
    for index, turn in enumerate(_rows_in_order(ids["turns"])):
        for name in ("user_message", "reply"):
            if turn[name] is not None and events[turn[name]]["session"] != turn["session"]:
                errors.add(f"turns[{index}].{name}", "must be an event of the turn's session")
    seen_external: set[tuple[int, str]] = set()
    for index, event in enumerate(_rows_in_order(events)):
        if event["external_id"] is not None:
            key = (event["session"], event["external_id"])
            if key in seen_external:
                errors.add(f"events[{index}].external_id", "appears twice in one session")
            seen_external.add(key)
    seen_versions: set[int] = set()
    for index, version in enumerate(_rows_in_order(ids["experience_versions"])):
        if version["version"] in seen_versions:
            errors.add(f"experience_versions[{index}].version", "appears twice")
        seen_versions.add(version["version"])
    active_kinds: set[str] = set()
    for index, template in enumerate(_rows_in_order(ids["prompt_templates"])):
        if template["is_active"]:
            if template["kind"] in active_kinds:
                errors.add(f"prompt_templates[{index}].is_active", "a second active template of this kind")
            active_kinds.add(template["kind"])
    nights: set[str] = set()
    for index, run in enumerate(_rows_in_order(ids["consolidation_runs"])):
        if run["trigger"] == ConsolidationRun.Trigger.NIGHTLY and run["night"] is not None:
            if run["night"] in nights:
                errors.add(f"consolidation_runs[{index}].night", "a second nightly run for this night")
            nights.add(run["night"])
