from django.apps import AppConfig


class KinsiteConfig(AppConfig):
    name = "kinsite"
    verbose_name = "Teams and kins"

    def ready(self):
        from django.contrib.auth import get_user_model
        from django.db.models.signals import post_delete, post_save

        from kinsite import tokencache
        from kinsite.api import schema  # noqa: F401  (registers the OpenAPI auth extension)
        from kinsite.models import ApiToken, Team

        # Cached API tokens carry their team and user: any change to those rows forgets them.
        for model in (ApiToken, Team, get_user_model()):
            for signal in (post_save, post_delete):
                signal.connect(tokencache.tokens_forget_all, sender=model,
                               dispatch_uid=f"tokencache-{signal is post_save}-{model._meta.label}")
