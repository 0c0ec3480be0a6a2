from django.apps import AppConfig


class SessionsAppConfig(AppConfig):
    name = "sessions_app"
    verbose_name = "Sessions"

    def ready(self):
        # The kinds of background job whose lost or stalled work kinsite.jobs' sweeps take over.
        from kinsite.jobs import job_kinds_register
        from sessions_app.compaction import COMPACTION_JOBS
        from sessions_app.introspection.jobs import INTROSPECTION_JOBS
        from sessions_app.turns.jobs import TURN_JOBS

        job_kinds_register(TURN_JOBS, INTROSPECTION_JOBS, COMPACTION_JOBS)

        # The admin previews compaction and introspection templates with a session's real data.
        from kinsite.prompt_templates import template_previewers_register
        from sessions_app.template_previews import PREVIEWERS

        template_previewers_register(PREVIEWERS)
