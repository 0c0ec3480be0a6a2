"""The Celery task of an async chat turn: load the turn by id and run it (sessions_app.turns)."""
from celery import shared_task


# No autoretry: a model failure is recorded on the turn (the client polls it and may post
# again), and a killed worker's turn is picked up again by acks_late (turn_run is idempotent).
@shared_task
def run_turn_task(turn_id: int) -> None:
    from sessions_app.turns import turn_run

    turn_run(turn_id=turn_id)
