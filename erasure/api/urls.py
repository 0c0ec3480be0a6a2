from django.urls import path

from erasure.api import views

urlpatterns = [
    path("erasures/", views.ErasureListView.as_view(), name="erasure-list"),
    path("erasures/<int:erasure_id>/", views.ErasureDetailView.as_view(), name="erasure-detail"),
]
