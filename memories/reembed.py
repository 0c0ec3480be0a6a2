"""Re-embedding: when LLM_EMBEDDING_MODEL changes, the active memories whose vector another
model made, or that have none, get one of the new model in the background. Search compares
only vectors of the current model, so results never mix models; meanwhile they lack the rest.

Beat's reembed_check starts one EmbeddingRun per model; its task (reembed_run) embeds
batches by ascending id from the run's cursor, writes each batch with the cursor in one
transaction, and before Celery's soft limit goes back to pending and sends itself again. A
killed worker's run is taken over by the stalled sweep of kinsite.jobs."""
from __future__ import annotations

import logging
import time
from datetime import timedelta
from itertools import groupby

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Count, Q
from django.utils import timezone

from kinsite.cachelock import cache_lock
from kinsite.jobs import JobKind, cache_key_free, job_claim, job_send_on_commit
from kinsite.models import Kin, Team
from memories import ranking, selectors, vectorindex
from memories.embeddings import embed_texts, embedding_model_current
from memories.models import EmbeddingRun, Memory
from memories.services import memory_vector_set

logger = logging.getLogger(__name__)

Status = EmbeddingRun.Status
LOCK_KEY = "kinsite:embedding-run:{run_id}"
PURPOSE = "memory_reembed"
# Texts per embedding call (the gateway takes a list); one transaction writes them.
BATCH_SIZE = 64
# A failed run is not started again for its model before this, so an embedding endpoint
# that is down costs one failed run per half hour, not one per beat.
RETRY_FAILED_AFTER = timedelta(minutes=30)
# A slice ends this long before Celery's soft time limit, with time to write its last batch.
SLICE_MARGIN_SECONDS = 60
# Starts without moving the cursor after which a stalled run is failed rather than run again.
MAX_ATTEMPTS = 3


def memories_to_reembed(model: str):
    """Active memories without a vector of `model`. A memory without a vector has
    embedding_model "" (the two are written together), which sorts before any model. Two
    ranges rather than "<>", which no index serves: PostgreSQL reads them from the partial
    index memory_active_embed_model, so the beat check does not scan every active memory."""
    return Memory.objects.filter(status=Memory.Status.ACTIVE).filter(
        Q(embedding_model__lt=model) | Q(embedding_model__gt=model)
    )


def reembed_run_active(model: str | None = None) -> EmbeddingRun | None:
    """The pending or running run for `model` (the current embedding model by default)."""
    model = embedding_model_current() if model is None else model
    if not model:
        return None
    return EmbeddingRun.objects.filter(model=model, status__in=[Status.PENDING, Status.RUNNING]).first()


def reembed_check() -> EmbeddingRun | None:
    """Beat's check: start a run for the current embedding model when some active memory
    lacks a vector of it and no run for it is going; the new run, else None. A run that
    failed recently for the model is not followed by another one until RETRY_FAILED_AFTER."""
    model = embedding_model_current()
    if not model or reembed_run_active(model) is not None:
        return None
    recent_failure = EmbeddingRun.objects.filter(
        model=model, status=Status.FAILED, finished_at__gte=timezone.now() - RETRY_FAILED_AFTER
    ).exists()
    if recent_failure or not memories_to_reembed(model).exists():
        return None
    return reembed_start(model=model)


def reembed_start(*, model: str) -> EmbeddingRun:
    """A pending run for `model`, its task sent after commit; the one already going if any
    (one run per model, a unique constraint, so a racing check finds the other's run)."""
    running = reembed_run_active(model)
    if running is not None:
        return running
    try:
        with transaction.atomic():
            run = EmbeddingRun.objects.create(model=model, total=memories_to_reembed(model).count())
            job_send_on_commit(REEMBED_JOBS, run.pk)
    except IntegrityError:
        return reembed_run_active(model)
    logger.info("Re-embedding %d memories with %s (run %s)", run.total, model, run.pk)
    return run


def reembed_run(*, run_id: int) -> EmbeddingRun | None:
    """The run's task: claim it and embed batches from its cursor until it is done, fails,
    or its slice of time ends (then it is pending again and its task is sent again); the
    run, None when it is gone. Idempotent: a run that is not pending is left alone, and a
    second delivery while the first works finds the run's lock taken."""
    with cache_lock(LOCK_KEY.format(run_id=run_id), owner=f"embedding-run:{run_id}") as holder:
        if holder is not None or not job_claim(REEMBED_JOBS, run_id):
            return EmbeddingRun.objects.filter(pk=run_id).first()
        run = EmbeddingRun.objects.get(pk=run_id)
        deadline = time.monotonic() + max(settings.CELERY_TASK_SOFT_TIME_LIMIT - SLICE_MARGIN_SECONDS, 0)
        try:
            finished = _work(run, deadline=deadline)
        except SoftTimeLimitExceeded:
            finished = False  # the batch in hand is lost, the ones written stay; the next slice goes on
        except Exception as exc:
            logger.warning("Re-embedding run %s failed", run.pk, exc_info=True)
            _close(run, status=Status.FAILED, error=f"{type(exc).__name__}: {exc}"[:2000])
            return run
        if finished:
            _close(run, status=Status.DONE)
            logger.info("Re-embedding run %s with %s is done", run.pk, run.model)
            return run
        EmbeddingRun.objects.filter(pk=run.pk, status=Status.RUNNING).update(status=Status.PENDING, started_at=None)
    # Outside the lock: eager Celery runs the next slice right here, and it takes the lock.
    job_send_on_commit(REEMBED_JOBS, run.pk)
    return run


def _work(run: EmbeddingRun, *, deadline: float) -> bool:
    """Embed and write batches until none is left (True) or the deadline passes (False; at
    least one batch per slice). Raises when the model changed or an embedding call fails."""
    while True:
        current = embedding_model_current()
        if current != run.model:
            raise RuntimeError(f"The embedding model changed to {current or 'none'!r}; a run for it takes over.")
        batch = list(
            memories_to_reembed(run.model).filter(id__gt=run.cursor).order_by("id")
            .values_list("id", "team_id", "content")[:BATCH_SIZE]
        )
        if not batch:
            return True
        # One call per team in the batch, so each team's LLMCall rows count its own texts.
        teams = Team.objects.in_bulk({team_id for _, team_id, _ in batch})
        vectors = {}
        for team_id, rows in groupby(sorted(batch, key=lambda row: (row[1], row[0])), key=lambda row: row[1]):
            rows = list(rows)
            embedded = embed_texts([content for _, _, content in rows], team=teams[team_id], purpose=PURPOSE)
            if len(embedded) != len(rows):
                raise RuntimeError(f"The embedding endpoint returned {len(embedded)} vectors for {len(rows)} texts.")
            for (memory_id, _, content), vector in zip(rows, embedded, strict=True):
                vectors[memory_id] = (content, vector)
        _write(run, batch_last=batch[-1][0], count=len(batch), vectors=vectors)
        if time.monotonic() >= deadline:
            return False


@transaction.atomic
def _write(run: EmbeddingRun, *, batch_last: int, count: int, vectors: dict) -> None:
    """One batch: the vectors, then the cursor and count, in one transaction. A memory whose
    content changed since it was read, or that got a vector of the model meanwhile (a write
    embeds with the current model), keeps what it has: `.update()` also leaves updated_at
    alone, so re-embedding does not make memories look recent to ranking."""
    for memory_id, (content, vector) in vectors.items():
        if not vector:
            continue  # the endpoint had no vector for it: it stays for the next run
        updated = memories_to_reembed(run.model).filter(pk=memory_id, content=content).update(
            embedding_model=run.model
        )
        if updated:  # (the UPDATE holds the memory's row lock until commit: no write slips in between)
            memory_vector_set(memory_id=memory_id, vector=ranking.vector_to_bytes([float(x) for x in vector]))
    run.cursor, run.done = batch_last, run.done + count
    EmbeddingRun.objects.filter(pk=run.pk, status=Status.RUNNING).update(cursor=run.cursor, done=run.done, attempts=0)


def _close(run: EmbeddingRun, *, status: str, error: str = "") -> None:
    run.status, run.error, run.finished_at = status, error, timezone.now()
    EmbeddingRun.objects.filter(pk=run.pk, status=Status.RUNNING).update(
        status=status, error=error, finished_at=run.finished_at
    )


def _stalled_run_error(run: EmbeddingRun) -> str | None:
    """A stalled run, its lock free, runs again from its cursor (each batch was written with
    it), unless it started MAX_ATTEMPTS times without moving it."""
    if run.attempts < MAX_ATTEMPTS:
        return None
    return (f"Interrupted: the worker running it stopped {run.attempts} times without finishing a batch, so it is "
            f"not run again. The batches written stay; the next check starts a new run for the rest.")


REEMBED_JOBS = JobKind(
    name="embedding-run", label="re-embedding runs", model="memories.EmbeddingRun",
    task="memories.tasks.reembed_run_task",
    free=lambda run: cache_key_free(LOCK_KEY.format(run_id=run.pk)), give_up=_stalled_run_error,
    reads=("attempts",), counts_attempts=True,
)


def reembed_progress() -> dict:
    """What /healthz shows: the current embedding model, its re-embedding run's progress
    ({"run", "status", "done", "total"}) or None, and vectorindex.vector_index_report."""
    model = embedding_model_current()
    run = reembed_run_active(model)
    progress = None
    if run is not None:
        progress = {"run": run.pk, "status": run.status, "done": min(run.done, run.total), "total": run.total}
    return {"model": model or None, "reembedding": progress, **vectorindex.vector_index_report(model)}


def vector_index_check() -> str | None:
    """Beat's check, pgvector mode only: build the current model's HNSW index when it is
    missing or a build died, once the model has vectors and no re-embedding run for it is
    going (the build would compete with the run for the machine). What the build did, or
    None when there was nothing to do. Blocks for the whole build."""
    model = embedding_model_current()
    if not model or vectorindex.vector_mode() != vectorindex.MODE_PGVECTOR or reembed_run_active(model):
        return None
    dims = vectorindex.current_model_dims(model)
    if dims is None:
        return None
    state, _ = vectorindex.hnsw_index_state(dims)
    if state in (vectorindex.READY, vectorindex.BUILDING):
        return None
    return vectorindex.hnsw_index_build(dims)


def reembed_kin_progress(*, team: Team, kin: Kin) -> dict | None:
    """The dashboard's notice while a run re-embeds with the current model: {"model", "done",
    "total"} over the kin's active memories (its own and the shared ones; the run spans every
    team), None when no run is going."""
    run = reembed_run_active()
    if run is None:
        return None
    counts = selectors.memory_list(team=team, kin=kin, status=Memory.Status.ACTIVE).aggregate(
        total=Count("id"), done=Count("id", filter=Q(vector__isnull=False, embedding_model=run.model))
    )
    return {"model": run.model, **counts}
