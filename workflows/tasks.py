"""Celery tasks of workflows: a run's task claims it and runs its first wave; each wave's
task sends the next one's."""
from celery import shared_task

from workflows.executor import workflow_run_claim, workflow_run_wave


@shared_task
def run_workflow_task(run_id: int) -> None:
    """The run's task (workflows.jobs.WORKFLOW_RUN_JOBS, sent by kinsite.jobs.job_send): a
    redelivered copy finds the run claimed and does nothing."""
    wave = workflow_run_claim(run_id=run_id)
    if wave is not None:
        run_wave_task(run_id, wave)


# No autoretry: a failing node is recorded on its rows and fails its downstream nodes only. A
# killed worker's task is delivered again (acks_late) and runs only the nodes no live claim
# holds; a run left running is the stalled sweep's (workflows.jobs).
@shared_task
def run_wave_task(run_id: int, wave: int) -> None:
    next_wave = workflow_run_wave(run_id=run_id, wave=wave)
    if next_wave is not None:
        # The wave's writes are committed here (the task is not in a transaction), so the next
        # wave's worker sees them. In eager mode this runs the rest of the run right now.
        run_wave_task.delay(run_id, next_wave)
