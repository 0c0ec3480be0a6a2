"""memories' dashboard pages: a kin's memories, one memory, adding, editing and deleting
one. The project URLconf (kinsite/urls.py) puts them under the "dashboard" namespace."""
from django.urls import path

from memories import views

urlpatterns = [
    path("kins/<int:kin_id>/memories/", views.memory_list, name="memory_list"),
    path("kins/<int:kin_id>/memories/add/", views.memory_add, name="memory_add"),
    path("kins/<int:kin_id>/memories/<int:memory_id>/", views.memory_detail, name="memory_detail"),
    path("kins/<int:kin_id>/memories/<int:memory_id>/edit/", views.memory_edit, name="memory_edit"),
    path("kins/<int:kin_id>/memories/<int:memory_id>/delete/", views.memory_delete, name="memory_delete"),
]
