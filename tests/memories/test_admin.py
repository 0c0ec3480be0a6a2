"""Memories in Django admin: edits go through the services (one change row each),
nothing is added or hard-deleted there, and the change log is read-only."""
import pytest
from django.urls import reverse

from kinsite.llm.providers import provider_override
from memories.models import Memory, MemoryChange, MemoryVector
from memories.services import Actor, memory_add
from tests.factories import UserFactory
from tests.support.scripted_model import ScriptedProvider

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client(client):
    client.force_login(UserFactory(is_staff=True, is_superuser=True, username="root-admin"))
    return client


@pytest.fixture
def memory(kin):
    return memory_add(team=kin.team, kin=kin, content="Invoices go out on the first Monday",
                      actor=Actor("test"), category="fact").memory


def change_form_data(memory, **overrides):
    data = {"category": memory.category, "content": memory.content, "subject": memory.subject,
            "importance": memory.importance, "changes-TOTAL_FORMS": 0, "changes-INITIAL_FORMS": 0}
    data.update(overrides)
    return data


def test_admin_edit_writes_one_change_row_with_the_admin_as_actor(staff_client, memory):
    url = reverse("admin:memories_memory_change", args=[memory.pk])
    response = staff_client.post(url, change_form_data(memory, importance=9))
    assert response.status_code == 302
    memory.refresh_from_db()
    assert memory.importance == 9
    change = MemoryChange.objects.filter(memory=memory).order_by("id").last()
    assert (change.action, change.actor) == ("update", "user:root-admin")
    assert (change.before["importance"], change.after["importance"]) == (5, 9)
    assert MemoryChange.objects.filter(memory=memory).count() == 2  # the add, then this edit


def test_admin_save_without_changes_writes_no_change_row(staff_client, memory):
    staff_client.post(reverse("admin:memories_memory_change", args=[memory.pk]), change_form_data(memory))
    assert MemoryChange.objects.filter(memory=memory).count() == 1


def test_admin_cannot_add_or_hard_delete_memories(staff_client, memory):
    assert staff_client.get(reverse("admin:memories_memory_add")).status_code == 403
    response = staff_client.post(reverse("admin:memories_memory_delete", args=[memory.pk]), {"post": "yes"})
    assert response.status_code == 403
    assert Memory.objects.filter(pk=memory.pk).exists()


def test_mark_deleted_action_is_a_status_change_with_history(staff_client, memory):
    staff_client.post(
        reverse("admin:memories_memory_changelist"), {"action": "mark_deleted", "_selected_action": [memory.pk]}
    )
    memory.refresh_from_db()
    assert memory.status == "deleted"
    assert list(MemoryChange.objects.filter(memory=memory).values_list("action", flat=True)) == ["add", "delete"]


def test_change_log_is_read_only(staff_client, memory):
    change = MemoryChange.objects.get(memory=memory)
    assert staff_client.get(reverse("admin:memories_memorychange_add")).status_code == 403
    staff_client.post(reverse("admin:memories_memorychange_delete", args=[change.pk]), {"post": "yes"})
    assert MemoryChange.objects.filter(pk=change.pk).exists()


def test_vectors_page_shows_model_and_size_read_only(staff_client, kin):
    with provider_override(ScriptedProvider()):
        memory = memory_add(team=kin.team, kin=kin, content="Invoices go out on the first Monday",
                            actor=Actor("test")).memory
    page = staff_client.get(reverse("admin:memories_memoryvector_changelist")).content.decode()
    assert "Invoices go out on the first Monday" in page
    assert "scripted-embedding" in page and ">64<" in page  # the scripted provider's 64 dimensions
    assert staff_client.get(reverse("admin:memories_memoryvector_change", args=[memory.pk])).status_code == 200
    delete_url = reverse("admin:memories_memoryvector_delete", args=[memory.pk])
    assert staff_client.post(delete_url, {"post": "yes"}).status_code == 403
    assert MemoryVector.objects.filter(memory=memory).exists()


@pytest.mark.parametrize(("embeddings", "says"), [
    ("local", "New vectors: <code>local:all-MiniLM-L6-v2</code> (<code>EMBEDDINGS=local</code>)"),
    ("off", "New vectors: none, search uses words only (<code>EMBEDDINGS=off</code>)"),
])
def test_the_memory_list_says_which_model_makes_new_vectors_and_filters_by_model(
        staff_client, settings, kin, memory, embeddings, says):
    with provider_override(ScriptedProvider()):  # the suite's EMBEDDINGS=endpoint: a scripted vector
        embedded = memory_add(team=kin.team, kin=kin, content="Reports are due on Fridays",
                              actor=Actor("test")).memory
    assert (embedded.embedding_model, memory.embedding_model) == ("scripted-embedding", "")
    settings.EMBEDDINGS = embeddings
    url = reverse("admin:memories_memory_changelist")

    body = staff_client.get(url).content.decode()

    assert says in body
    by_model = staff_client.get(url, {"embedding_model": "scripted-embedding"}).content.decode()
    assert "Reports are due on Fridays" in by_model and memory.content not in by_model
    without = staff_client.get(url, {"embedding_model": ""}).content.decode()
    assert memory.content in without and "Reports are due on Fridays" not in without
