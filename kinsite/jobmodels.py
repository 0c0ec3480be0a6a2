"""The abstract model every background run shares (turns, introspection, compaction,
consolidation, re-embedding and workflow runs): the fields kinsite.jobs claims, sends and
sweeps by, and the partial indexes its sweeps read."""
from django.db import models
from django.db.models import Q


class Job(models.Model):
    """A background run: pending → running → an end state (`failed` among them). A kind with
    other end states declares its own Status and `status` with the same column."""

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True


def job_status_field(status: type[models.TextChoices]) -> models.CharField:
    """`status` for a kind with its own Status choices: the same column as Job's."""
    return models.CharField(max_length=10, choices=status.choices, default=status.PENDING)


def job_sweep_indexes(prefix: str, *, running: bool = True) -> list[models.Index]:
    """The partial indexes kinsite.jobs' sweeps (every minute) read, whatever the table's size:
    `<prefix>_pending` (the requeue sweep, pending jobs by id) and `<prefix>_running` (the
    stalled sweep, running jobs oldest start first). `running=False` for a kind whose partial
    unique constraint on running rows serves the stalled sweep already."""
    indexes = [models.Index(fields=["id"], condition=Q(status="pending"), name=f"{prefix}_pending")]
    if running:
        indexes.append(models.Index(fields=["started_at"], condition=Q(status="running"), name=f"{prefix}_running"))
    return indexes
