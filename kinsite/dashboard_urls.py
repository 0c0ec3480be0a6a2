"""kinsite's own dashboard pages: home, a model call, the model help page and API tokens.
The project URLconf (kinsite/urls.py) puts them, with every app's pages, under the
"dashboard" namespace."""
from django.urls import path

from kinsite import views

urlpatterns = [
    path("", views.home, name="home"),
    path("model-calls/<int:model_call_id>/", views.model_call_detail, name="model_call_detail"),
    path("help/model/", views.model_help, name="model_help"),
    path("tokens/", views.token_list, name="tokens"),
    path("tokens/<int:token_id>/revoke/", views.token_revoke, name="token_revoke"),
]
