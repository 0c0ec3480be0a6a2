from django.apps import AppConfig


class WorkflowsConfig(AppConfig):
    name = "workflows"

    def ready(self):
        # Workflow runs: kinsite.jobs' sweeps send again a lost task and take over a run left
        # running.
        from kinsite.jobs import job_kinds_register
        from workflows.jobs import WORKFLOW_RUN_JOBS

        job_kinds_register(WORKFLOW_RUN_JOBS)
