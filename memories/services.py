"""Every write to memories. Each add, update, delete and supersede leaves exactly
one MemoryChange row (before, after, actor, reason) in the same transaction."""
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from kinsite.actors import Actor, writer_ref_check  # Actor re-exported: memories.services.Actor is what callers import
from kinsite.errors import Conflict
from kinsite.models import Kin, Team
from memories.embeddings import Embedding, memory_embed
from memories.models import Memory, MemoryChange, MemoryVector
from memories.search.selectors import MemoryHit, memory_find_duplicate

# The fields a change row snapshots, and the ones callers may edit.
SNAPSHOT_FIELDS = ("kin_id", "category", "content", "subject", "importance", "status", "superseded_by_id")
EDITABLE_FIELDS = ("category", "content", "subject", "importance")


@dataclass(frozen=True)
class MemoryAddResult:
    memory: Memory
    created: bool  # False: a near-duplicate active memory was updated instead


def _snapshot(memory: Memory) -> dict:
    return {
        field.removesuffix("_id") if field.endswith("_id") else field: getattr(memory, field)
        for field in SNAPSHOT_FIELDS
    }


def _record(*, memory: Memory, action: str, before: dict, actor: Actor, reason: str) -> MemoryChange:
    return MemoryChange.objects.create(
        memory=memory,
        action=action,
        before=before,
        after=_snapshot(memory),
        actor=actor.label[:200],
        actor_user=actor.user,
        reason=reason,
    )


def memory_add(
    *,
    team: Team,
    kin: Kin | None,
    content: str,
    actor: Actor,
    category: str = Memory.Category.FACT,
    subject: str = "",
    importance: int = 5,
    source: str = Memory.Source.API,
    source_ref: str = "",
    reason: str = "",
) -> MemoryAddResult:
    """Add a memory for `kin` (None: shared by the team). When an active memory in
    the same scope says the same thing, that one is updated instead (newer wording
    wins, the higher importance is kept) and no new row is made."""
    # The embedder is called before the transaction: no row lock is held during a
    # network call, and a failing embedder only costs the vector (memory_embed logs it).
    embedding = memory_embed(team=team, kin=kin, text=content, purpose="memory_embed")
    with transaction.atomic():
        duplicate = memory_find_duplicate(
            team=team, kin=kin, content=content, subject=subject, embedding=embedding
        )
        if duplicate is not None:
            fields = {"content": content, "category": category, "importance": max(importance, duplicate.importance)}
            if subject:
                fields["subject"] = subject
            why = reason or "added again"
            memory = _update(
                memory=duplicate, actor=actor, reason=f"Duplicate of an existing memory; merged ({why}).",
                fields=fields, embedding=embedding,
            )
            return MemoryAddResult(memory=memory, created=False)
        memory = Memory.objects.create(
            team=team,
            kin=kin,
            category=category,
            content=content,
            subject=subject,
            importance=importance,
            source=source,
            source_ref=writer_ref_check(source_ref),
            embedding_model=embedding.model if embedding else "",
        )
        if embedding is not None:
            memory_vector_set(memory_id=memory.pk, vector=embedding.as_bytes())
        _record(memory=memory, action=MemoryChange.Action.ADD, before={}, actor=actor, reason=reason)
    return MemoryAddResult(memory=memory, created=True)


def memory_check_editable(*, memory: Memory) -> None:
    """Only active memories are edited: a deleted or superseded one keeps what it said (its
    callers, the API and the MCP server, check before memory_update; 409 when it is not)."""
    if memory.status != Memory.Status.ACTIVE:
        raise Conflict(f"This memory is {memory.status}; only active memories can be edited.")


def memory_update(*, memory: Memory, actor: Actor, reason: str = "", **fields) -> Memory:
    unknown = set(fields) - set(EDITABLE_FIELDS)
    if unknown:
        raise TypeError(f"memory_update got fields it cannot edit: {sorted(unknown)}")
    embedding = None
    if "content" in fields and fields["content"] != memory.content:
        embedding = memory_embed(team=memory.team, kin=memory.kin, text=fields["content"], purpose="memory_embed")
    return _update(memory=memory, actor=actor, reason=reason, fields=fields, embedding=embedding)


@transaction.atomic
def _update(*, memory: Memory, actor: Actor, reason: str, fields: dict,
            embedding: Embedding | None) -> Memory:
    memory = Memory.objects.select_for_update().get(pk=memory.pk)
    before = _snapshot(memory)
    content_changed = "content" in fields and fields["content"] != memory.content
    for name, value in fields.items():
        setattr(memory, name, value)
    if embedding is not None:
        memory.embedding_model = embedding.model
    elif content_changed:
        # The old vector describes the old text: better none than a wrong one.
        memory.embedding_model = ""
    memory.save()
    if embedding is not None or content_changed:
        memory_vector_set(memory_id=memory.pk, vector=embedding.as_bytes() if embedding is not None else None)
    _record(memory=memory, action=MemoryChange.Action.UPDATE, before=before, actor=actor, reason=reason)
    return memory


@transaction.atomic
def memory_delete(*, memory: Memory, actor: Actor, reason: str = "") -> Memory:
    """Deleting is a status change: the row and its history stay."""
    memory = Memory.objects.select_for_update().get(pk=memory.pk)
    before = _snapshot(memory)
    memory.status = Memory.Status.DELETED
    memory.save(update_fields=["status", "updated_at"])
    _record(memory=memory, action=MemoryChange.Action.DELETE, before=before, actor=actor, reason=reason)
    return memory


@transaction.atomic
def memory_supersede(*, memory: Memory, actor: Actor, reason: str, superseded_by: Memory | None = None) -> Memory:
    """Mark a memory as replaced by newer knowledge (consolidation, or a newer memory)."""
    memory = Memory.objects.select_for_update().get(pk=memory.pk)
    before = _snapshot(memory)
    memory.status = Memory.Status.SUPERSEDED
    memory.superseded_by = superseded_by
    memory.save(update_fields=["status", "superseded_by", "updated_at"])
    _record(memory=memory, action=MemoryChange.Action.SUPERSEDE, before=before, actor=actor, reason=reason)
    return memory


def memory_vector_set(*, memory_id: int, vector: bytes | None) -> None:
    """Store a memory's vector (float32, little-endian: Embedding.as_bytes), or with None
    remove it; one query. The one writer of MemoryVector rows: callers set the memory's
    embedding_model with it in the same transaction, as search filters vectors by that model."""
    if vector is None:
        MemoryVector.objects.filter(memory_id=memory_id).delete()
        return
    MemoryVector.objects.bulk_create([MemoryVector(memory_id=memory_id, vector=vector)], update_conflicts=True,
                                     unique_fields=["memory"], update_fields=["vector"])


def memories_mark_retrieved(*, memory_ids: list[int], now: datetime | None = None) -> datetime:
    """Count one retrieval for each memory served to a prompt or a recall (one UPDATE;
    not a change of the memory, so no change row and updated_at stays). Returns the time
    recorded as their last retrieval (`now`, by default the current time)."""
    now = now or timezone.now()
    if memory_ids:
        Memory.objects.filter(pk__in=memory_ids).update(retrieval_count=F("retrieval_count") + 1,
                                                        last_retrieved_at=now)
    return now


def memory_hits_mark_retrieved(*, hits: list[MemoryHit]) -> None:
    """Count one retrieval for each memory a recall served (memories_mark_retrieved); the
    hits' memories then carry the counts as stored."""
    retrieved_at = memories_mark_retrieved(memory_ids=[hit.memory.pk for hit in hits])
    for hit in hits:
        hit.memory.retrieval_count += 1
        hit.memory.last_retrieved_at = retrieved_at
