from django.apps import AppConfig


class KinsiteConfig(AppConfig):
    name = "kinsite"
    verbose_name = "Teams and kins"

    def ready(self):
        from kinsite.api import schema  # noqa: F401  (registers the OpenAPI auth extension)
