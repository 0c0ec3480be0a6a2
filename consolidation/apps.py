from django.apps import AppConfig


class ConsolidationConfig(AppConfig):
    name = "consolidation"
    verbose_name = "Facts and experience"

    def ready(self):
        # Requested consolidation runs: kinsite.jobs' sweeps send again a lost task and fail
        # a run left running.
        from consolidation.services import CONSOLIDATION_JOBS
        from kinsite.jobs import job_kinds_register

        job_kinds_register(CONSOLIDATION_JOBS)

        # The admin previews consolidation templates with a kin's real facts and document.
        from consolidation.services import consolidation_template_preview
        from kinsite.prompt_templates import TemplatePreviewer, template_previewers_register

        template_previewers_register({"consolidation": TemplatePreviewer(render=consolidation_template_preview)})
