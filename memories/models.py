"""Long-term memories of a kin (or shared by its team) and their immutable change log."""
from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from kinsite.models import Job, job_sweep_indexes


class Memory(models.Model):
    class Category(models.TextChoices):
        FACT = "fact"
        PREFERENCE = "preference"
        DECISION = "decision"
        KNOWLEDGE = "knowledge"

    class Status(models.TextChoices):
        ACTIVE = "active"
        SUPERSEDED = "superseded"
        DELETED = "deleted"

    class Source(models.TextChoices):
        INTROSPECTION = "introspection"
        TURN = "turn"
        TOOL = "tool"
        API = "api", "API"
        DASHBOARD = "dashboard"
        ADMIN = "admin"
        CONSOLIDATION = "consolidation"
        MCP = "mcp", "MCP"  # an agent's client through the MCP server (agent_mcp)

    team = models.ForeignKey("kinsite.Team", on_delete=models.CASCADE, related_name="memories")
    # Empty: shared by every kin of the team.
    kin = models.ForeignKey("kinsite.Kin", null=True, blank=True, on_delete=models.CASCADE, related_name="memories")
    category = models.CharField(max_length=12, choices=Category.choices, default=Category.FACT)
    content = models.TextField()
    subject = models.CharField(max_length=200, blank=True)
    importance = models.PositiveSmallIntegerField(default=5, validators=[MinValueValidator(1), MaxValueValidator(10)])
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.ACTIVE)
    # Who wrote it: the kind of writer, and which one ("introspection_run:12",
    # "event:345", "token:ks_ab12cd", "user:maria").
    source = models.CharField(max_length=16, choices=Source.choices, default=Source.API)
    source_ref = models.CharField("source reference", max_length=200, blank=True)
    superseded_by = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="supersedes"
    )
    retrieval_count = models.PositiveIntegerField(default=0)
    last_retrieved_at = models.DateTimeField(null=True, blank=True)
    # The model that made the memory's vector (its MemoryVector row), "" when it has none:
    # kept here, small and indexed, for the re-embedding check and the vector scan's filter.
    embedding_model = models.CharField(max_length=200, blank=True, editable=False)
    # The scope's vector generation at this row's last vector-relevant change, set by
    # triggers only (see MemoryVectorScope): the caches fetch the rows changed since theirs.
    vector_seq = models.BigIntegerField(default=0, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at", "-id"]
        verbose_name_plural = "memories"
        indexes = [
            models.Index(fields=["team", "kin", "status"], name="memory_scope_status"),
            models.Index(fields=["team", "status", "subject"], name="memory_subject"),
            models.Index(fields=["team", "kin", "vector_seq"], name="memory_vector_seq"),
            # The re-embedding check: active memories whose vector another model made.
            models.Index(fields=["embedding_model"], condition=Q(status="active"), name="memory_active_embed_model"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(importance__gte=1, importance__lte=10), name="memory_importance_1_10"),
        ]

    def __str__(self):
        return self.content[:80]


class MemoryVector(models.Model):
    """A memory's embedding (float32, little-endian), made by the memory's embedding_model.
    A table of its own so the memories heap every full-text search reads stays narrow
    (inline, vectors made it almost five times as large). Every write here, by any path,
    marks the memory's vector_seq through a trigger (migration 0008), so the caches see it."""

    memory = models.OneToOneField(Memory, primary_key=True, on_delete=models.CASCADE, related_name="vector")
    vector = models.BinaryField()

    def __str__(self):
        return f"vector of memory {self.memory_id}"


class MemoryVectorScope(models.Model):
    """The vector generation of one memory scope: a kin's own memories (kin_key = the kin's
    id) or its team's shared ones (kin_key = 0). Triggers (migrations 0006, 0008) bump
    `generation` in the transaction of every insert and every change of a memory's vector,
    model, status, kin or team, and stamp the memory's vector_seq with it; a memory leaving
    the scope bumps `epoch`, which makes the caches reload it. Plain ids, no foreign keys:
    triggers write these rows, and an orphan (its kin deleted) costs nothing."""

    team_id = models.BigIntegerField()
    kin_key = models.BigIntegerField()
    generation = models.BigIntegerField(default=0)
    epoch = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["team_id", "kin_key"], name="memoryvectorscope_scope"),
        ]

    def __str__(self):
        return f"team {self.team_id} kin {self.kin_key or 'shared'}: generation {self.generation}"


class MemoryTermCount(models.Model):
    """Full-text statistics of one memory scope (kin_key as in MemoryVectorScope) for BM25:
    per lexeme of the scope's active memories, how many hold it (`documents`); on the row
    of lexeme '' (never a real lexeme), the active memory count and total tsvector length.
    PostgreSQL only: triggers (migration 0012) keep them in every write's transaction, so a
    search reads its query's few rows whatever the scope's size; zero counts are removed.
    Plain ids, as for MemoryVectorScope. Read by memories.search.postgres.scope_stats."""

    team_id = models.BigIntegerField()
    kin_key = models.BigIntegerField()
    lexeme = models.TextField()
    documents = models.BigIntegerField(default=0)
    total_length = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["team_id", "kin_key", "lexeme"], name="memorytermcount_scope_lexeme"),
        ]

    def __str__(self):
        return f"team {self.team_id} kin {self.kin_key or 'shared'}: {self.lexeme or '(all)'} {self.documents}"


class MemoryChange(models.Model):
    """One add, update, delete or supersede of a memory: never edited, never deleted."""

    class Action(models.TextChoices):
        ADD = "add"
        UPDATE = "update"
        DELETE = "delete"
        SUPERSEDE = "supersede"

    memory = models.ForeignKey(Memory, on_delete=models.CASCADE, related_name="changes")
    action = models.CharField(max_length=10, choices=Action.choices)
    # Snapshots of the memory's editable fields; `before` is empty for an add.
    before = models.JSONField(default=dict, blank=True)
    after = models.JSONField(default=dict, blank=True)
    # Who made the change, as text that survives the actor's deletion
    # ("user:maria", "token:ks_ab12cd", "introspection_run:12", "kin:4 turn:17": kinsite.actors).
    actor = models.CharField(max_length=200)
    actor_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    reason = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["memory", "created_at"], name="memorychange_memory_time")]

    def __str__(self):
        return f"{self.action} memory {self.memory_id} by {self.actor}"


class EmbeddingRun(Job):
    """Re-embedding the active memories whose vector another model made (or that have none)
    with `model`, the configured embedding model: a job of kinsite.jobs, worked in slices of
    batches by ascending memory id, so it resumes from `cursor` after any stop."""

    model = models.CharField(max_length=200)
    # Memories to re-embed when the run was created, and how many it has gone past so far.
    total = models.PositiveIntegerField(default=0)
    done = models.PositiveIntegerField(default=0)
    # The id of the last memory the run went past; the next slice starts after it.
    cursor = models.BigIntegerField(default=0)
    # Starts since the run last moved its cursor: a worker that dies on the same batch again
    # and again fails the run instead of looping (the stalled sweep reads it).
    attempts = models.PositiveSmallIntegerField(default=0)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            *job_sweep_indexes("embedding_run"),
            models.Index(fields=["model", "created_at"], name="embedding_run_model"),
        ]
        constraints = [
            # One run at a time per model: the beat check and the command may race to start one.
            models.UniqueConstraint(fields=["model"], condition=Q(status__in=["pending", "running"]),
                                    name="embedding_run_one_active_per_model"),
        ]

    def __str__(self):
        return f"Re-embedding with {self.model} ({self.status}, {self.done} of {self.total})"
