from django.urls import path

from consolidation.api import views

urlpatterns = [
    path("kins/<int:kin_id>/facts/", views.KinFactListView.as_view(), name="kin-facts"),
    path("kins/<int:kin_id>/consolidate/", views.KinConsolidateView.as_view(), name="kin-consolidate"),
    path("kins/<int:kin_id>/consolidations/", views.KinConsolidationListView.as_view(), name="kin-consolidations"),
    path("kins/<int:kin_id>/experience/", views.KinExperienceView.as_view(), name="kin-experience"),
]
