"""erasure's dashboard page: erasing a person (with its preview) and the team's receipts.
The project URLconf (kinsite/urls.py) puts it under the "dashboard" namespace."""
from django.urls import path

from erasure import views

urlpatterns = [
    path("erasures/", views.erasure_page, name="erasures"),
]
