from django.urls import path

from memories.api import views

urlpatterns = [
    path("kins/<int:kin_id>/memories/", views.KinMemoryListView.as_view(), name="kin-memories"),
    path("kins/<int:kin_id>/memories/search/", views.KinMemorySearchView.as_view(), name="kin-memory-search"),
    path("memories/<int:memory_id>/", views.MemoryDetailView.as_view(), name="memory-detail"),
    path("memories/<int:memory_id>/history/", views.MemoryHistoryView.as_view(), name="memory-history"),
]
