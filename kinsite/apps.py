from django.apps import AppConfig


class KinsiteConfig(AppConfig):
    name = "kinsite"
    verbose_name = "Kinsite core"
