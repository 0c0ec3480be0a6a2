from django.apps import AppConfig


class MemoriesConfig(AppConfig):
    name = "memories"

    def ready(self):
        # Re-embedding runs: kinsite.jobs' sweeps send again a lost task and take over a run
        # left running; /healthz shows the embedding model and the run's progress.
        from kinsite.health import health_sections_register
        from kinsite.jobs import job_kinds_register
        from memories.reembed import REEMBED_JOBS, reembed_progress

        job_kinds_register(REEMBED_JOBS)
        health_sections_register("vectors", reembed_progress)
