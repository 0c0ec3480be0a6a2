"""Celery tasks of memories: each loads its row by id and calls one service (imported
inside the function, as sessions_app/tasks.py explains)."""
from celery import shared_task


@shared_task
def reembed_check_task() -> int | None:
    """Every 5 minutes (beat): start re-embedding with the current embedding model when some
    active memory lacks a vector of it; the new run's id, if one started."""
    from memories.reembed import reembed_check

    run = reembed_check()
    return run.pk if run is not None else None


# No retry: a failed run records its error and keeps every vector it had; the check starts a
# new run later. A killed worker's run is taken over by the stalled sweep (kinsite.jobs).
@shared_task
def reembed_run_task(run_id: int) -> None:
    from memories.reembed import reembed_run

    reembed_run(run_id=run_id)


# An index build runs for minutes (CREATE INDEX CONCURRENTLY), past the global limits. A copy
# delivered again meanwhile (acks_late, visibility timeout) finds the build's lock taken and returns.
@shared_task(soft_time_limit=6 * 3600, time_limit=6 * 3600 + 60)
def vector_index_check_task() -> str | None:
    """Every 15 minutes (beat), pgvector mode only: build the HNSW index of the current
    model's vectors when it is missing and re-embedding is done."""
    from memories.reembed import vector_index_check

    return vector_index_check()
