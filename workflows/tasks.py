"""Celery tasks of workflows: one task per topological wave of a run."""
from celery import shared_task

from workflows.executor import workflow_run_wave


# No autoretry: a failing node is recorded on its rows and fails its downstream nodes only.
# A killed worker's task is delivered again (acks_late) and only runs the nodes no one has
# claimed (or whose claim outlived the task time limit).
@shared_task
def run_wave_task(run_id: int, wave: int) -> None:
    next_wave = workflow_run_wave(run_id=run_id, wave=wave)
    if next_wave is not None:
        # The wave's writes are committed here (the task is not in a transaction), so the next
        # wave's worker sees them. In eager mode this runs the rest of the run right now.
        run_wave_task.delay(run_id, next_wave)
