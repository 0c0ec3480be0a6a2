"""The memory browser through Django's test client: list and filters, the htmx
search partial, add, edit, delete with a confirmation, history, other teams'
ids → 404, escaping of memory text."""
import pytest
from django.urls import reverse

from memories import services
from memories.models import Memory, MemoryChange
from tests.factories import KinFactory

pytestmark = pytest.mark.django_db

XSS = '<script>alert("x")</script>'


def add_memory(team, kin, content, **fields) -> Memory:
    return services.memory_add(team=team, kin=kin, content=content, actor=services.Actor("test"), **fields).memory


def url(name, *args):
    return reverse(f"dashboard:{name}", args=args)


@pytest.fixture
def logged_in(client, user, team):
    client.force_login(user)
    return client


@pytest.fixture
def memories(team, kin):
    return {
        "fact": add_memory(team, kin, "The warehouse is in Leeds.", category="fact"),
        "pref": add_memory(team, kin, "Maria likes short answers.", category="preference", subject="Maria"),
        "shared": add_memory(team, None, "The team deploys on Tuesdays.", category="decision"),
        "other_kin": add_memory(team, KinFactory(team=team), "Belongs to another kin.", category="fact"),
    }


def test_anonymous_users_are_sent_to_login(client, kin):
    response = client.get(url("memory_list", kin.pk))

    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_kin_page_links_to_its_memories(logged_in, kin):
    response = logged_in.get(url("kin_detail", kin.pk))

    assert url("memory_list", kin.pk) in response.content.decode()


def test_list_shows_the_kins_and_shared_memories(logged_in, kin, memories):
    response = logged_in.get(url("memory_list", kin.pk))

    assert response.status_code == 200
    body = response.content.decode()
    assert "The warehouse is in Leeds." in body
    assert "Maria likes short answers." in body
    assert "The team deploys on Tuesdays." in body and "shared" in body
    assert "Belongs to another kin." not in body
    assert '<form class="search memory-filters" method="get"' in body  # works without JavaScript


def test_list_filters_by_category_and_status(logged_in, kin, memories):
    services.memory_delete(memory=memories["fact"], actor=services.Actor("test"))

    by_category = logged_in.get(url("memory_list", kin.pk), {"category": "preference"}).content.decode()
    deleted = logged_in.get(url("memory_list", kin.pk), {"status": "deleted"}).content.decode()
    active = logged_in.get(url("memory_list", kin.pk)).content.decode()

    assert "Maria likes short answers." in by_category and "The warehouse is in Leeds." not in by_category
    assert "The warehouse is in Leeds." in deleted and "Maria likes short answers." not in deleted
    assert "The warehouse is in Leeds." not in active


def test_unknown_filter_values_are_ignored(logged_in, kin, memories):
    response = logged_in.get(url("memory_list", kin.pk), {"category": "gossip", "status": "<b>"})

    assert response.status_code == 200
    assert "The warehouse is in Leeds." in response.content.decode()


def test_search_answers_a_partial_for_htmx_and_a_full_page_without(logged_in, kin, memories):
    partial = logged_in.get(url("memory_list", kin.pk), {"q": "warehouse"}, HTTP_HX_REQUEST="true")
    full = logged_in.get(url("memory_list", kin.pk), {"q": "warehouse"})

    partial_body = partial.content.decode()
    assert partial.status_code == 200
    assert partial_body.lstrip().startswith('<div id="memory-results">')
    assert "<html" not in partial_body
    assert "The warehouse is in Leeds." in partial_body
    assert "Maria likes short answers." not in partial_body
    assert "HX-Request" in partial["Vary"]
    assert "<html" in full.content.decode() and "The warehouse is in Leeds." in full.content.decode()


@pytest.mark.parametrize("q", ['"unbalanced', "AND OR (", "x" * 6_000, "日本語 🚀", "*"])
def test_odd_search_input_renders(logged_in, kin, memories, q):
    response = logged_in.get(url("memory_list", kin.pk), {"q": q})

    assert response.status_code == 200


def test_add_creates_a_memory_with_the_user_as_actor(logged_in, kin, user):
    response = logged_in.post(
        url("memory_add", kin.pk),
        {"content": "Reports go out on Fridays.", "category": "decision", "subject": "reports", "importance": 6},
    )

    memory = Memory.objects.get(content="Reports go out on Fridays.")
    assert response.status_code == 302
    assert response["Location"].startswith(url("memory_detail", kin.pk, memory.pk))
    assert (memory.kin, memory.category, memory.importance, memory.source) == (kin, "decision", 6, "dashboard")
    change = memory.changes.get()
    assert (change.action, change.actor, change.actor_user) == ("add", f"user:{user.username}", user)


def test_add_with_invalid_input_shows_errors_and_adds_nothing(logged_in, kin):
    response = logged_in.post(url("memory_add", kin.pk), {"content": "  ", "category": "gossip", "importance": 11})

    assert response.status_code == 400
    assert Memory.objects.count() == 0


def test_edit_form_is_prefilled_and_saving_records_a_change(logged_in, kin, memories, user):
    memory = memories["pref"]
    form = logged_in.get(url("memory_edit", kin.pk, memory.pk))
    assert form.status_code == 200
    assert "Maria likes short answers." in form.content.decode()

    response = logged_in.post(
        url("memory_edit", kin.pk, memory.pk),
        {"content": "Maria likes very short answers.", "category": "preference", "subject": "Maria", "importance": 9},
    )

    assert response.status_code == 302
    assert response["Location"] == url("memory_detail", kin.pk, memory.pk)
    memory.refresh_from_db()
    assert (memory.content, memory.importance) == ("Maria likes very short answers.", 9)
    change = memory.changes.order_by("id").last()
    assert (change.action, change.actor, change.actor_user) == ("update", f"user:{user.username}", user)
    assert change.before["content"] == "Maria likes short answers."


def test_saving_an_unchanged_form_records_nothing(logged_in, kin, memories):
    memory = memories["fact"]

    logged_in.post(
        url("memory_edit", kin.pk, memory.pk),
        {
            "content": memory.content, "category": memory.category, "subject": memory.subject,
            "importance": memory.importance,
        },
    )

    assert memory.changes.count() == 1


def test_edit_with_invalid_input_changes_nothing(logged_in, kin, memories):
    memory = memories["fact"]

    response = logged_in.post(
        url("memory_edit", kin.pk, memory.pk), {"content": "", "category": "fact", "importance": 0}
    )

    assert response.status_code == 400
    memory.refresh_from_db()
    assert memory.content == "The warehouse is in Leeds."
    assert memory.changes.count() == 1


def test_delete_asks_for_confirmation_then_marks_deleted_and_keeps_history(logged_in, kin, memories, user):
    memory = memories["fact"]

    confirm = logged_in.get(url("memory_delete", kin.pk, memory.pk))
    memory.refresh_from_db()
    assert confirm.status_code == 200 and memory.status == "active"
    assert 'method="post"' in confirm.content.decode()

    response = logged_in.post(url("memory_delete", kin.pk, memory.pk))

    assert response.status_code == 302
    memory.refresh_from_db()
    assert memory.status == "deleted"
    assert list(memory.changes.values_list("action", flat=True)) == ["add", "delete"]
    history = logged_in.get(url("memory_detail", kin.pk, memory.pk)).content.decode()
    assert "The warehouse is in Leeds." in history and f"user:{user.username}" in history


def test_deleted_memory_cannot_be_edited(logged_in, kin, memories):
    memory = memories["fact"]
    services.memory_delete(memory=memory, actor=services.Actor("test"))

    response = logged_in.post(
        url("memory_edit", kin.pk, memory.pk), {"content": "Back", "category": "fact", "importance": 5}
    )

    assert response.status_code == 409
    memory.refresh_from_db()
    assert memory.content == "The warehouse is in Leeds."


def test_history_shows_each_change_oldest_first(logged_in, kin, memories):
    memory = memories["pref"]
    services.memory_update(
        memory=memory, actor=services.Actor("user:someone"), reason="More precise.",
        content="Maria likes terse answers.",
    )

    response = logged_in.get(url("memory_detail", kin.pk, memory.pk))

    body = response.content.decode()
    assert response.status_code == 200
    assert body.index('class="action">Add<') < body.index('class="action">Update<')
    assert "More precise." in body and "user:someone" in body
    assert "Maria likes short answers." in body and "Maria likes terse answers." in body


def test_other_teams_ids_answer_404(logged_in, team, kin, other_team):
    foreign_kin = KinFactory(team=other_team)
    foreign = add_memory(other_team, foreign_kin, "Foreign memory.")
    own = add_memory(team, kin, "Own memory.")
    other_kins_memory = add_memory(team, KinFactory(team=team), "Another kin's memory.")

    for target in [
        url("memory_list", foreign_kin.pk),
        url("memory_add", foreign_kin.pk),
        url("memory_detail", kin.pk, foreign.pk),
        url("memory_edit", kin.pk, foreign.pk),
        url("memory_delete", kin.pk, foreign.pk),
        url("memory_detail", foreign_kin.pk, own.pk),
        url("memory_detail", kin.pk, other_kins_memory.pk),  # not this kin's and not shared
    ]:
        assert logged_in.get(target).status_code == 404, target
    for target in [url("memory_edit", kin.pk, foreign.pk), url("memory_delete", kin.pk, foreign.pk)]:
        assert logged_in.post(target, {"content": "hijack", "category": "fact", "importance": 5}).status_code == 404
    foreign.refresh_from_db()
    assert (foreign.content, foreign.status) == ("Foreign memory.", "active")
    assert MemoryChange.objects.filter(memory=foreign).count() == 1


def test_memory_text_is_escaped_everywhere(logged_in, team, kin):
    memory = add_memory(team, kin, f"Remember {XSS}", subject=XSS)
    services.memory_update(memory=memory, actor=services.Actor(f"user:{XSS}"), reason=XSS, content=f"Still {XSS}")

    for target in [
        url("memory_list", kin.pk),
        url("memory_list", kin.pk) + "?q=still",
        url("memory_detail", kin.pk, memory.pk),
        url("memory_edit", kin.pk, memory.pk),
        url("memory_delete", kin.pk, memory.pk),
    ]:
        body = logged_in.get(target).content.decode()
        assert XSS not in body, target
    assert "&lt;script&gt;" in logged_in.get(url("memory_detail", kin.pk, memory.pk)).content.decode()


def test_search_query_is_escaped(logged_in, kin):
    body = logged_in.get(url("memory_list", kin.pk), {"q": XSS}).content.decode()

    assert XSS not in body
    assert "&lt;script&gt;" in body


def test_change_fields_lists_what_a_change_altered_in_a_fixed_order():
    from memories.views import change_fields

    added = change_fields({}, {"subject": "", "kin": 3, "content": "A", "superseded_by": None})
    updated = change_fields(
        {"content": "A", "importance": 5, "subject": "x"}, {"importance": 7, "subject": "x", "content": "B"}
    )

    assert [(c.field, c.after) for c in added] == [("content", "A"), ("kin", 3)]
    assert [(c.field, c.before, c.after) for c in updated] == [("content", "A", "B"), ("importance", 5, 7)]


# --- the status filter holds with a search query ---------------------------------------------


@pytest.fixture
def retired(team, kin, memories):
    """The warehouse fact superseded by a newer one, and a deleted note that also mentions it."""
    actor = services.Actor("test")
    newer = add_memory(team, kin, "The warehouse moved to York.", category="fact")
    services.memory_supersede(memory=memories["fact"], actor=actor, reason="moved", superseded_by=newer)
    note = add_memory(team, kin, "Warehouse keys are with Sam.", category="knowledge")
    services.memory_delete(memory=note, actor=actor)
    return {"superseded": memories["fact"], "newer": newer, "deleted": note}


def results(client, kin, **params) -> str:
    return client.get(url("memory_list", kin.pk), params, HTTP_HX_REQUEST="true").content.decode()


def test_search_with_a_status_filter_shows_only_memories_of_that_status(logged_in, kin, retired):
    superseded = results(logged_in, kin, q="warehouse", status="superseded")
    deleted = results(logged_in, kin, q="warehouse", status="deleted")

    assert "The warehouse is in Leeds." in superseded
    assert "The warehouse moved to York." not in superseded and "Warehouse keys" not in superseded
    assert "Warehouse keys are with Sam." in deleted
    assert "The warehouse is in Leeds." not in deleted and "moved to York" not in deleted


def test_search_over_all_statuses_finds_every_memory_holding_the_words(logged_in, kin, retired):
    body = results(logged_in, kin, q="WAREHOUSE", status="all")

    for content in ("The warehouse is in Leeds.", "The warehouse moved to York.", "Warehouse keys are with Sam."):
        assert content in body
    assert "Maria likes short answers." not in body
    # Every word must be there: "keys" narrows it to one memory.
    narrowed = results(logged_in, kin, q="warehouse keys", status="all")
    assert "Warehouse keys are with Sam." in narrowed and "Leeds" not in narrowed


def test_search_of_active_memories_stays_ranked_and_skips_retired_ones(logged_in, kin, retired):
    response = logged_in.get(url("memory_list", kin.pk), {"q": "warehouse", "status": "active"})

    assert response.context["hits"] is not None
    body = response.content.decode()
    assert "The warehouse moved to York." in body
    assert "The warehouse is in Leeds." not in body and "Warehouse keys" not in body


def test_search_with_a_status_filter_keeps_the_category_filter(logged_in, kin, retired):
    body = results(logged_in, kin, q="warehouse", status="all", category="knowledge")

    assert "Warehouse keys are with Sam." in body and "Leeds" not in body and "York" not in body


def test_search_with_a_status_filter_pages_keep_the_query(logged_in, team, kin, monkeypatch):
    monkeypatch.setattr("memories.views.MEMORIES_PER_PAGE", 2)
    for n in range(3):
        memory = add_memory(team, kin, f"Harbour crane number {n} is broken.", category="fact")
        services.memory_delete(memory=memory, actor=services.Actor("test"))

    body = results(logged_in, kin, q="crane", status="deleted")

    assert "Page 1 of 2" in body
    assert "?q=crane&amp;category=&amp;status=deleted&amp;page=2" in body


def test_empty_search_with_a_status_filter_says_what_to_try(logged_in, kin, retired):
    body = results(logged_in, kin, q="submarine", status="superseded")

    assert "No superseded memory holds every word of “submarine”." in body
