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
