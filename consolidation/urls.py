"""consolidation's dashboard pages: a kin's experience (and consolidating it now) and its
facts. The project URLconf (kinsite/urls.py) puts them under the "dashboard" namespace."""
from django.urls import path

from consolidation import views

urlpatterns = [
    path("kins/<int:kin_id>/experience/", views.experience, name="experience"),
    path("kins/<int:kin_id>/experience/consolidate/", views.experience_consolidate, name="experience_consolidate"),
    path("kins/<int:kin_id>/facts/", views.fact_list, name="fact_list"),
]
