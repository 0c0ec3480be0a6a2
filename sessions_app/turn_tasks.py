"""The Celery task of chat turns: run an async turn by id (sessions_app.turns). The sweeps
that take over turns whose task was lost, or that a process stopped running, are
kinsite.tasks' (every kind of job, TURN_JOBS among them)."""
from celery import shared_task


# No autoretry: a model failure is recorded on the turn (the client polls it and may post
# again), and a killed worker's turn is picked up again by acks_late (turn_run is idempotent).
@shared_task
def run_turn_task(turn_id: int) -> None:
    from sessions_app.turns import turn_run

    turn_run(turn_id=turn_id)
