"""The Celery tasks of chat turns: run an async turn by id (sessions_app.turns), and the
sweeps that take over the turns that would otherwise wait for ever: those whose task never
reached the broker or was lost with it, and those left running by a process that stopped."""
from celery import shared_task


# No autoretry: a model failure is recorded on the turn (the client polls it and may post
# again), and a killed worker's turn is picked up again by acks_late (turn_run is idempotent).
@shared_task
def run_turn_task(turn_id: int) -> None:
    from sessions_app.turns import turn_run

    turn_run(turn_id=turn_id)


@shared_task
def requeue_pending_turns_task() -> int:
    """Every minute (beat): queue again the async turns left pending without a task."""
    from sessions_app.turns import turns_requeue

    return len(turns_requeue())


@shared_task
def recover_stalled_turns_task() -> int:
    """Every minute (beat): take over the turns left running by a process that stopped."""
    from sessions_app.turns import turns_recover_stalled

    stalled = turns_recover_stalled()
    return len(stalled.requeued) + len(stalled.failed)
