"""Re-embedding memories when the embedding model changes (memories.reembed): the beat check
starts one run per model, the run re-embeds every active memory in batches from its cursor,
resumes after a stop (its time slice, Celery's soft limit, a killed worker), fails keeping
the old vectors, and leaves memories written meanwhile alone; search meanwhile uses only
vectors of the current model; admin, the dashboard and /healthz show the progress.
Tasks run eagerly; a run's next slice is sent on commit, so a test that captures the
commit callbacks without running them steps through the slices one by one."""
from datetime import timedelta
from io import StringIO

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from kinsite.celery import app
from kinsite.jobs import jobs_recover_stalled, jobs_requeue
from kinsite.llm.providers import provider_override
from kinsite.llm.types import LLMError
from kinsite.models import LLMCall
from memories import reembed, services
from memories.models import EmbeddingRun, Memory, MemoryVector
from memories.ranking import vector_to_bytes
from memories.reembed import REEMBED_JOBS, reembed_check, reembed_run, reembed_start
from memories.search.selectors import memory_search
from tests.factories import KinFactory, MembershipFactory, MemoryFactory, UserFactory
from tests.support.clock import age
from tests.support.scripted_model import ScriptedProvider, hashed_bag_of_words

pytestmark = pytest.mark.usefixtures("private_cache")

XSS = '<script>alert("x")</script>'
TEXTS = [
    "Maria prefers espresso after lunch",
    "The warehouse is in Leeds",
    "Tom owns the quarterly budget report",
    "The staging server runs in Frankfurt",
    "Aisha reviews every pull request before lunch",
]


class ModelEmbedder(ScriptedProvider):
    """An embedder whose model can be switched, as LLM_EMBEDDING_MODEL is. Every model gives
    the same vectors, so a vector of another model would match if search ever compared it.
    `fail_at` and `before`: what the embedding call of that number (1-based) raises instead
    of answering, or does first."""

    def __init__(self, model="embed-a"):
        super().__init__()
        self.embedding_model = model
        self.fail_at: dict[int, BaseException] = {}
        self.before: dict[int, object] = {}

    def vector(self, text):
        return hashed_bag_of_words(text)

    def embed_result(self, texts, *, model=None):
        result = super().embed_result(texts, model=model)
        number = len(self.embed_calls)
        if number in self.before:
            self.before.pop(number)()
        if number in self.fail_at:
            raise self.fail_at.pop(number)
        result.model = self.embedding_model
        return result


@pytest.fixture
def embedder():
    provider = ModelEmbedder()
    with provider_override(provider):
        yield provider


@pytest.fixture
def small_batches(monkeypatch):
    monkeypatch.setattr(reembed, "BATCH_SIZE", 2)


@pytest.fixture
def one_batch_per_slice(settings):
    """A slice ends after its first batch (it ends SLICE_MARGIN_SECONDS before the soft limit)."""
    settings.CELERY_TASK_SOFT_TIME_LIMIT = 0


def add(team, kin, content):
    return services.memory_add(team=team, kin=kin, content=content, actor=services.Actor("test")).memory


@pytest.fixture
def memories_of_a(team, kin, embedder):
    """Five active memories embedded with model A, and a deleted one (not searched, not re-embedded)."""
    rows = [add(team, kin, text) for text in TEXTS]
    deleted = add(team, kin, "An old address nobody uses")
    services.memory_delete(memory=deleted, actor=services.Actor("test"))
    assert {m.embedding_model for m in Memory.objects.all()} == {"embed-a"}
    embedder.embed_calls.clear()  # the calls of the test count from 1
    return rows


def models_by_content():
    return dict(Memory.objects.filter(status="active").values_list("content", "embedding_model"))


def test_a_new_model_re_embeds_every_active_memory_in_batches(
    team, kin, embedder, memories_of_a, small_batches, django_capture_on_commit_callbacks
):
    without_vector = MemoryFactory(team=team, kin=kin, content="Invoices go out on Mondays")  # its call failed
    updated_at = dict(Memory.objects.values_list("id", "updated_at"))
    embedder.embedding_model = "embed-b"
    embedder.embed_calls.clear()

    with django_capture_on_commit_callbacks(execute=True):
        run = reembed_check()

    run.refresh_from_db()
    assert (run.model, run.status, run.total, run.done, run.error) == ("embed-b", "done", 6, 6, "")
    assert run.cursor == without_vector.pk and run.finished_at is not None
    for memory in Memory.objects.filter(status="active"):
        assert memory.embedding_model == "embed-b"
        assert bytes(memory.vector.vector) == vector_to_bytes(embedder.vector(memory.content))
    assert Memory.objects.get(status="deleted").embedding_model == "embed-a"
    # Re-embedding is not an edit: ranking's recency does not move.
    assert dict(Memory.objects.values_list("id", "updated_at")) == updated_at
    assert [len(texts) for texts in embedder.embed_calls] == [2, 2, 2]
    assert LLMCall.objects.filter(purpose="memory_reembed", team=team, kind="embedding").count() == 3
    assert reembed_check() is None  # nothing left for the model


def test_the_check_starts_nothing_without_an_embedder_or_when_all_vectors_match(team, kin, memories_of_a):
    assert reembed_check() is None  # every active memory has a vector of embed-a
    with provider_override(ScriptedProvider()) as provider:
        provider.supports_embeddings = False
        assert reembed_check() is None
    assert not EmbeddingRun.objects.exists()


def test_one_run_per_model(embedder, memories_of_a, django_capture_on_commit_callbacks):
    embedder.embedding_model = "embed-b"
    with django_capture_on_commit_callbacks(execute=False) as sent:
        first = reembed_check()
        assert reembed_check() is None
        assert reembed_start(model="embed-b") == first
    assert EmbeddingRun.objects.count() == 1 and len(sent) == 1


def test_a_run_steps_through_slices_from_its_cursor_and_search_meanwhile_uses_the_new_model_only(
    team, kin, memories_of_a, small_batches, one_batch_per_slice, django_capture_on_commit_callbacks
):
    with provider_override(ModelEmbedder("embed-b")) as embedder:
        with django_capture_on_commit_callbacks(execute=False) as sent:
            run = reembed_check()
        assert run.status == "pending" and len(sent) == 1
        ids = [m.pk for m in memories_of_a]

        with django_capture_on_commit_callbacks(execute=False) as sent:
            reembed_run(run_id=run.pk)  # the first slice: one batch, then pending again, its task sent again
        run.refresh_from_db()
        assert (run.status, run.cursor, run.done, run.total, run.attempts) == ("pending", ids[1], 2, 5, 0)
        assert len(sent) == 1
        assert models_by_content() == {**dict.fromkeys(TEXTS, "embed-a"), TEXTS[0]: "embed-b", TEXTS[1]: "embed-b"}

        # Search compares the query's vector (embed-b) with embed-b vectors only (both models
        # give the same vectors, so an embed-a vector would match if it were compared).
        hits = {hit.memory.content: hit for hit in memory_search(team=team, kin=kin, query="lunch", limit=10)}
        assert hits[TEXTS[0]].components["vector"] > 0
        assert hits[TEXTS[4]].components["vector"] == 0  # embed-a yet: text match only

        embedder.embed_calls.clear()
        for _ in range(3):
            with django_capture_on_commit_callbacks(execute=False):
                reembed_run(run_id=run.pk)
        run.refresh_from_db()
        assert (run.status, run.done, run.cursor) == ("done", 5, ids[4])
        assert embedder.embed_calls == [TEXTS[2:4], TEXTS[4:5]]  # nothing embedded twice
        assert set(models_by_content().values()) == {"embed-b"}
        hits = {hit.memory.content: hit for hit in memory_search(team=team, kin=kin, query="lunch", limit=10)}
        assert hits[TEXTS[4]].components["vector"] > 0


def test_the_soft_time_limit_ends_the_slice_and_the_next_one_resumes_from_the_cursor(
    embedder, memories_of_a, small_batches, django_capture_on_commit_callbacks
):
    embedder.embedding_model = "embed-b"
    embedder.embed_calls.clear()
    embedder.fail_at[2] = SoftTimeLimitExceeded()  # Celery's soft limit, in the second batch

    with django_capture_on_commit_callbacks(execute=True):
        run = reembed_check()

    run.refresh_from_db()
    assert (run.status, run.done, run.total) == ("done", 5, 5)
    assert set(models_by_content().values()) == {"embed-b"}
    # The lost batch is embedded again, the written one is not.
    assert embedder.embed_calls == [TEXTS[0:2], TEXTS[2:4], TEXTS[2:4], TEXTS[4:5]]


def test_a_failed_run_records_the_error_and_keeps_the_old_vectors(
    embedder, memories_of_a, small_batches, django_capture_on_commit_callbacks
):
    before = {memory_id: bytes(vector) for memory_id, vector in MemoryVector.objects.values_list("memory_id", "vector")}
    embedder.embedding_model = "embed-b"
    embedder.fail_at[2] = LLMError("embedding endpoint down")

    with django_capture_on_commit_callbacks(execute=True):
        run = reembed_check()

    run.refresh_from_db()
    assert run.status == "failed" and "embedding endpoint down" in run.error and run.finished_at is not None
    assert (run.done, run.cursor) == (2, memories_of_a[1].pk)
    assert models_by_content() == {**dict.fromkeys(TEXTS, "embed-a"), TEXTS[0]: "embed-b", TEXTS[1]: "embed-b"}
    for memory in memories_of_a[2:]:
        memory.refresh_from_db()
        assert bytes(memory.vector.vector) == before[memory.pk]  # nothing lost

    assert reembed_check() is None  # not again straight away: the endpoint may still be down
    age(EmbeddingRun.objects.filter(pk=run.pk), "finished_at", timedelta(minutes=31))
    with django_capture_on_commit_callbacks(execute=True):
        retry = reembed_check()
    retry.refresh_from_db()
    assert retry.pk != run.pk and (retry.status, retry.total) == ("done", 3)
    assert set(models_by_content().values()) == {"embed-b"}


def test_a_memory_changed_meanwhile_keeps_its_newer_vector(
    team, kin, embedder, memories_of_a, small_batches, django_capture_on_commit_callbacks
):
    embedder.embedding_model = "embed-b"
    changed = memories_of_a[2]

    embedder.embed_calls.clear()
    # The run's second batch holds the old text; the edit (embedded with embed-b) lands while
    # that batch is embedded.
    embedder.before[2] = lambda: services.memory_update(
        memory=changed, actor=services.Actor("test"), content="Tom owns the yearly budget"
    )

    with django_capture_on_commit_callbacks(execute=True):
        run = reembed_start(model="embed-b")

    run.refresh_from_db()
    assert run.status == "done"
    changed.refresh_from_db()
    assert changed.content == "Tom owns the yearly budget" and changed.embedding_model == "embed-b"
    assert bytes(changed.vector.vector) == vector_to_bytes(embedder.vector("Tom owns the yearly budget"))


def test_a_run_whose_model_changed_again_fails_and_the_new_model_gets_its_own(
    embedder, memories_of_a, django_capture_on_commit_callbacks
):
    embedder.embedding_model = "embed-b"
    with django_capture_on_commit_callbacks(execute=False):
        run_b = reembed_check()
    embedder.embedding_model = "embed-c"
    with django_capture_on_commit_callbacks(execute=True):
        reembed_run(run_id=run_b.pk)
        run_c = reembed_check()
    run_b.refresh_from_db()
    run_c.refresh_from_db()
    assert run_b.status == "failed" and "embed-c" in run_b.error
    assert (run_c.model, run_c.status) == ("embed-c", "done")
    assert set(models_by_content().values()) == {"embed-c"}


@pytest.mark.usefixtures("empty_cache")
def test_a_killed_workers_run_is_taken_over_by_the_stalled_sweep_and_resumes(
    embedder, memories_of_a, small_batches, one_batch_per_slice, django_capture_on_commit_callbacks
):
    embedder.embedding_model = "embed-b"
    with django_capture_on_commit_callbacks(execute=False):
        run = reembed_check()
        reembed_run(run_id=run.pk)  # one batch written
    # The worker's next slice claimed the run and was killed; its lock expired with it.
    EmbeddingRun.objects.filter(pk=run.pk).update(status="running", started_at=timezone.now(), attempts=1)
    assert jobs_recover_stalled(REEMBED_JOBS).requeued == []  # not stalled yet
    age(EmbeddingRun.objects.filter(pk=run.pk), "started_at", timedelta(minutes=10))
    embedder.embed_calls.clear()

    with django_capture_on_commit_callbacks(execute=True):
        assert jobs_recover_stalled(REEMBED_JOBS).requeued == [run.pk]

    run.refresh_from_db()
    assert (run.status, run.done) == ("done", 5)
    assert embedder.embed_calls == [TEXTS[2:4], TEXTS[4:5]]


@pytest.mark.usefixtures("empty_cache")
def test_a_run_that_keeps_dying_on_a_batch_is_failed_and_a_lost_task_is_sent_again(
    embedder, memories_of_a, django_capture_on_commit_callbacks
):
    embedder.embedding_model = "embed-b"
    with django_capture_on_commit_callbacks(execute=False):
        run = reembed_check()
    EmbeddingRun.objects.filter(pk=run.pk).update(status="running", attempts=3,
                                                  started_at=timezone.now() - timedelta(minutes=10))
    assert jobs_recover_stalled(REEMBED_JOBS).failed == [run.pk]
    run.refresh_from_db()
    assert run.status == "failed" and "3 times" in run.error

    with django_capture_on_commit_callbacks(execute=False):
        lost = reembed_start(model="embed-b")  # its task never reached the broker
    age(EmbeddingRun.objects.filter(pk=lost.pk), "created_at", timedelta(minutes=2))
    with django_capture_on_commit_callbacks(execute=True):
        assert jobs_requeue(REEMBED_JOBS) == [lost.pk]
    lost.refresh_from_db()
    assert lost.status == "done"


def test_through_settings_and_the_http_gateway(settings, fake_llm, team, kin, django_capture_on_commit_callbacks):
    settings.LLM_BASE_URL, settings.LLM_EMBEDDING_MODEL = fake_llm.base_url, "embed-a"
    for text in TEXTS:
        add(team, kin, text)
    settings.LLM_EMBEDDING_MODEL = "embed-b"

    with django_capture_on_commit_callbacks(execute=True):
        run = reembed_check()

    run.refresh_from_db()
    assert (run.status, run.done) == ("done", 5)
    assert set(models_by_content().values()) == {"embed-b"}
    reembedding = [body for body in fake_llm.requests_to("embeddings") if body["model"] == "embed-b"]
    assert [body["input"] for body in reembedding] == [TEXTS]  # one batched call


def test_the_check_runs_every_5_minutes_in_beat():
    [entry] = [e for e in app.conf.beat_schedule.values() if e["task"] == "memories.tasks.reembed_check_task"]
    assert entry["schedule"].minute == set(range(0, 60, 5))


# --- progress: admin, dashboard, /healthz, the command -----------------------------------------


def test_admin_lists_runs_read_only_with_progress_and_a_status_filter(client, db):
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    EmbeddingRun.objects.create(model=XSS, status="running", total=5, done=2)
    EmbeddingRun.objects.create(model="embed-old", status="failed", total=9, done=9, error="endpoint down")

    response = client.get(reverse("admin:memories_embeddingrun_changelist"))
    body = response.content.decode()
    assert response.status_code == 200
    assert "2 of 5 (40%)" in body and "9 of 9 (100%)" in body
    assert XSS not in body and "&lt;script&gt;" in body

    failed = client.get(reverse("admin:memories_embeddingrun_changelist") + "?status__exact=failed").content.decode()
    assert "embed-old" in failed and "&lt;script&gt;" not in failed
    run = EmbeddingRun.objects.get(model="embed-old")
    assert client.get(reverse("admin:memories_embeddingrun_add")).status_code == 403
    assert client.post(reverse("admin:memories_embeddingrun_delete", args=[run.pk]), {"post": "yes"}).status_code == 403


def test_staff_who_are_not_superusers_see_no_runs(client, team):
    # Runs span every team's memories (team sizes, model names): no team owns them.
    EmbeddingRun.objects.create(model="embed-secret", status="running", total=5, done=2)
    staff = UserFactory(is_staff=True)
    staff.user_permissions.set(Permission.objects.all())
    MembershipFactory(team=team, user=staff, role="admin")
    client.force_login(staff)
    response = client.get(reverse("admin:memories_embeddingrun_changelist"))
    assert response.status_code in (200, 403) and "embed-secret" not in response.content.decode()


def test_dashboard_shows_the_progress_for_the_kins_memories_while_a_run_goes(
    client, user, team, kin, memories_of_a, embedder, django_capture_on_commit_callbacks
):
    client.force_login(user)
    url = reverse("dashboard:memory_list", args=[kin.pk])
    assert "Re-embedding" not in client.get(url).content.decode()
    add(team, KinFactory(team=team), "Another kin's memory")  # not this kin's: not counted

    embedder.embedding_model = XSS
    with django_capture_on_commit_callbacks(execute=False):
        run = reembed_check()
    Memory.objects.filter(pk=memories_of_a[0].pk).update(embedding_model=XSS)
    body = client.get(url).content.decode()
    assert "Re-embedding memories with &lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;: 1 of 5." in body
    assert XSS not in body

    EmbeddingRun.objects.filter(pk=run.pk).update(status="done")
    assert "Re-embedding" not in client.get(url).content.decode()


def healthz_progress(client) -> dict:
    """The re-embedding part of /healthz's vectors section (tests/memories/test_pgvector.py
    checks the mode and index part)."""
    vectors = client.get("/healthz").json()["vectors"]
    return {"model": vectors["model"], "reembedding": vectors["reembedding"]}


def test_healthz_shows_the_model_and_the_progress(client, embedder, memories_of_a, django_capture_on_commit_callbacks):
    assert healthz_progress(client) == {"model": "embed-a", "reembedding": None}
    embedder.embedding_model = "embed-b"
    with django_capture_on_commit_callbacks(execute=False):
        run = reembed_check()
    assert healthz_progress(client) == {
        "model": "embed-b", "reembedding": {"run": run.pk, "status": "pending", "done": 0, "total": 5},
    }


@pytest.mark.django_db
def test_healthz_without_an_embedder(client):
    assert healthz_progress(client) == {"model": None, "reembedding": None}


def test_the_command_shows_the_status_and_starts_a_run(embedder, memories_of_a, django_capture_on_commit_callbacks):
    embedder.embedding_model = "embed-b"
    out = StringIO()
    call_command("reembed_memories", stdout=out)
    assert "Active memories without a vector of it: 5" in out.getvalue()
    assert not EmbeddingRun.objects.exists()

    out = StringIO()
    with django_capture_on_commit_callbacks(execute=True):
        call_command("reembed_memories", "--start", stdout=out)
    assert "Started run" in out.getvalue()
    out = StringIO()
    call_command("reembed_memories", stdout=out)
    assert "without a vector of it: 0" in out.getvalue() and "done, 5 of 5" in out.getvalue()


@pytest.mark.postgres
def test_the_check_reads_the_partial_index_instead_of_every_active_memory(team, kin):
    from django.db import connection

    Memory.objects.bulk_create(
        [Memory(team=team, kin=kin, content=f"memory {i}", embedding_model="embed-b") for i in range(3000)]
        + [Memory(team=team, kin=kin, content="left behind", embedding_model="embed-a")]
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE memories_memory")
    plan = reembed.memories_to_reembed("embed-b").order_by().explain()
    assert "Index Cond" in plan and "memory_active_embed_model" in plan, plan
